//! One measured run of each scenario, for locksmith and for its flock(1) equivalent.
//!
//! Every scenario starts from a free lock and ends with every process it started reaped
//! (or, for a holder orphaned by its parent's SIGKILL, seen to exit) and the lock free.
//! Any surprise is an error: the bench fails loudly rather than report a wrong number.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::io::BufReader;
use std::path::PathBuf;
use std::process::{ChildStderr, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::stats::Samples;
use testkit::proc::{self, Lines, Proc, Result, read_first_line};

/// argv[1] of the bench's own re-exec as the parent of a holding locksmith.
pub const HOLD_PARENT: &str = "__hold-parent";

/// The deadline of every wait and read: a broken locksmith fails the bench, never hangs it.
const T: Duration = Duration::from_secs(10);

/// After a waiter is seen blocked, let it settle into its wait (poll / flock(2)) before
/// the holder releases, so that a handoff never races the waiter's own retry.
const SETTLE: Duration = Duration::from_millis(20);

/// The deadline of a herd's waits: the whole herd must be served by then.
const HERD_T: Duration = Duration::from_secs(300);

/// What flock(1) prints (with `--verbose`) once it holds the lock.
const FLOCK_GOT: &str = "getting lock took";

pub struct Ctx {
    locksmith: PathBuf,
    dir: PathBuf,
    profiles: PathBuf,
    me: PathBuf,
    /// flock(1)'s lock file in the timed scenarios.
    ref_lock: PathBuf,
    /// The served directory of the sshfs section (its locks' truth, past every cache).
    netfs_server: Option<PathBuf>,
    notes: RefCell<BTreeMap<String, usize>>,
}

/// A holder watched over the window.
pub struct HoldRow {
    pub name: String,
    pub switches: u64,
    pub threads: u32,
}

pub struct Holding {
    pub window: Duration,
    pub rows: Vec<HoldRow>,
    pub reference_rss_kib: u64,
    pub reference_dirty_kib: u64,
}

/// Timing of the `mx`, `lx`, `sx` profiles, whose holders the bench kills in another pid
/// namespace: no proof of death there, the waiter must see the heartbeat stop for
/// `stale_after`. SPEC §6's window for the takeover: [stale_after − heartbeat, stale_after +
/// max_poll + heartbeat] = [1.0 s, 2.1 s] (heartbeat = stale_after / 3 = 500 ms).
const OTHER_NS: &str =
    "stale_after = \"1500ms\"\nkeepalive = \"500ms\"\npoll = \"20ms\"\nmax_poll = \"100ms\"\n";

/// How long a holder in the sshfs section may wait (untimed) before it holds: mount `a`
/// keeps sshfs's default 20 s cache, which may still show a name mount `b` removed.
const NET_WAIT: Duration = Duration::from_secs(30);

/// SPEC §6's takeover window for the `OTHER_NS` profiles, in ms.
pub const OTHER_NS_WINDOW_MS: (f64, f64) = (1000.0, 2100.0);

impl Ctx {
    /// Writes the profiles file into `dir` and checks that locksmith accepts it.
    /// `extra`: more profile sections appended (the network sections' servers).
    pub fn new(locksmith: PathBuf, dir: PathBuf, extra: &str) -> Result<Ctx> {
        let profiles = dir.join("profiles.toml");
        let d = dir.display();
        let text = format!(
            "# written by locksmith-bench; every lock lives in this private directory\n\
             [profile.f]\nbackend = \"flock\"\npath = \"{d}/f.lock\"\n\n\
             [profile.m]\nbackend = \"mkdir\"\npath = \"{d}/m.lock\"\n\n\
             [profile.ml]\nbackend = \"mkdir\"\npath = \"{d}/ml.lock\"\nlocal = true\n\n\
             [profile.l]\nbackend = \"link\"\npath = \"{d}/l.lock\"\n\n\
             [profile.s]\nbackend = \"symlink\"\npath = \"{d}/s.lock\"\n\n\
             [profile.mx]\nbackend = \"mkdir\"\npath = \"{d}/mx.lock\"\n{OTHER_NS}\n\
             [profile.lx]\nbackend = \"link\"\npath = \"{d}/lx.lock\"\n{OTHER_NS}\n\
             [profile.sx]\nbackend = \"symlink\"\npath = \"{d}/sx.lock\"\n{OTHER_NS}\n{extra}"
        );
        fs::write(&profiles, text)
            .map_err(|e| format!("cannot write {}: {e}", profiles.display()))?;
        let me = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
        let ctx = Ctx {
            ref_lock: dir.join("ref.lock"),
            locksmith,
            dir,
            profiles,
            me,
            netfs_server: None,
            notes: RefCell::new(BTreeMap::new()),
        };
        let mut check = ctx.locksmith_cmd(&["profiles"]);
        check.stdout(Stdio::piped()).stderr(Stdio::piped());
        let out = check
            .output()
            .map_err(|e| format!("cannot run {}: {e}", ctx.locksmith.display()))?;
        let listed = String::from_utf8_lossy(&out.stdout);
        if !out.status.success()
            || ["f", "m", "ml", "l", "s"]
                .iter()
                .any(|p| !listed.contains(p))
        {
            return Err(format!(
                "locksmith rejects the bench's profiles ({}): {}{}",
                out.status,
                listed.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(ctx)
    }

    /// The sshfs section's served directory: its profiles' locks (`nm-a` → `nm.lock`) are
    /// checked free there after each scenario.
    pub fn with_netfs_server(mut self, dir: PathBuf) -> Ctx {
        self.netfs_server = Some(dir);
        self
    }

    /// Something worth telling the reader, counted.
    fn note(&self, what: String) {
        *self.notes.borrow_mut().entry(what).or_insert(0) += 1;
    }

    pub fn take_notes(&self) -> Vec<String> {
        std::mem::take(&mut *self.notes.borrow_mut())
            .into_iter()
            .map(|(k, n)| if n > 1 { format!("{k} ({n}×)") } else { k })
            .collect()
    }

    /// What is left in the lock directory once everything has exited: only the profiles
    /// file and the flock semaphore files (never unlinked, by design) are expected.
    pub fn leftovers(&self) -> Vec<String> {
        let expected = [
            "profiles.toml",
            "f.lock",
            "ref.lock",
            "ref-hold.lock",
            "filelock.lock",
        ];
        let mut extra: Vec<String> = fs::read_dir(&self.dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    // Fencing-token state, flock's writer gate and the waiters' queue stay
                    // beside their locks.
                    .filter(|n| {
                        !expected.contains(&n.as_str())
                            && !(n.starts_with('.')
                                && (n.ends_with(".state")
                                    || n.ends_with(".gate")
                                    || n.ends_with(".queue")))
                            && !n.starts_with("race-")
                            && !n.starts_with("herd-")
                    })
                    .collect()
            })
            .unwrap_or_default();
        extra.sort();
        if extra.is_empty() {
            Vec::new()
        } else {
            vec![format!(
                "left in the lock directory after every holder exited: {}",
                extra.join(", ")
            )]
        }
    }

    fn locksmith_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.locksmith);
        c.arg("--profiles")
            .arg(&self.profiles)
            .args(args)
            .env_remove("LOCKSMITH_LOG")
            .env_remove("LOCKSMITH_PROFILES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    fn plain_cmd(prog: &str, args: &[&str]) -> Command {
        let mut c = Command::new(prog);
        c.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        c
    }

    fn ref_lock(&self) -> String {
        self.ref_lock.to_string_lossy().into_owned()
    }

    /// Spawns `cmd` and waits for exit 0: the time from just before the spawn to the reap.
    fn cycle(&self, name: &str, cmd: &mut Command) -> Result<Duration> {
        let t0 = Instant::now();
        let mut p = Proc::spawn(name, cmd)?;
        let t1 = p.wait_ok(T)?;
        Ok(t1 - t0)
    }

    // ---- 1. full cycle ---------------------------------------------------------------------

    pub fn cycle_locksmith(&self, profile: &str) -> Result<Duration> {
        self.cycle_locksmith_set(&[profile])
    }

    /// The same with several locks at once (SPEC §3b): `run P1 P2 ... -- true`.
    pub fn cycle_locksmith_set(&self, profiles: &[&str]) -> Result<Duration> {
        let mut args = vec!["--wait", "10s", "run"];
        args.extend_from_slice(profiles);
        args.extend(["--", "true"]);
        let mut c = self.locksmith_cmd(&args);
        self.cycle(&format!("locksmith run {}", profiles.join(" ")), &mut c)
    }

    /// The seed's counter race: `n` contenders × `k` read-modify-write increments of a
    /// counter file, each under the lock (`locksmith run P` or `flock F`). Returns the wall
    /// time per increment, after checking the count is exactly n×k (a lost update is an error).
    pub fn race(&self, profile: Option<&str>, n: usize, k: usize) -> Result<Duration> {
        const CRITICAL: &str = "n=$(cat \"$D/counter\"); echo $((n+1)) > \"$D/counter\"";
        let d = self
            .dir
            .join(format!("race-{}", profile.unwrap_or("flock1")));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        std::fs::write(d.join("counter"), "0\n").map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        std::thread::scope(|scope| -> Result<()> {
            let workers: Vec<_> = (0..n)
                .map(|_| {
                    let mut c = match profile {
                        Some(p) => self.locksmith_cmd(&[
                            "-q", "--wait", "60s", "run", p, "--", "sh", "-c", CRITICAL,
                        ]),
                        None => Self::plain_cmd(
                            "flock",
                            &["-w", "60", &self.ref_lock(), "sh", "-c", CRITICAL],
                        ),
                    };
                    c.env("D", &d);
                    scope.spawn(move || -> Result<()> {
                        for _ in 0..k {
                            Proc::spawn("race increment", &mut c)?.wait_ok(T)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for w in workers {
                w.join()
                    .map_err(|_| "a race worker panicked".to_string())??;
            }
            Ok(())
        })?;
        let took = t0.elapsed();
        let count: usize = std::fs::read_to_string(d.join("counter"))
            .map_err(|e| e.to_string())?
            .trim()
            .parse()
            .map_err(|e| format!("counter: {e}"))?;
        if count != n * k {
            return Err(format!(
                "counter race with {n} contenders: {count}, not {} (lost updates!)",
                n * k
            ));
        }
        Ok(took / (n * k) as u32)
    }

    /// Semaphore throughput (SPEC §3b): `n` contenders, each running `k` times
    /// `locksmith --slots S run P -- true` (S = `slots`, 1 being the plain lock). Returns the
    /// wall time per grant; every run must exit 0.
    pub fn slots(&self, profile: &str, slots: u32, n: usize, k: usize) -> Result<Duration> {
        let slots = slots.to_string();
        let t0 = Instant::now();
        std::thread::scope(|scope| -> Result<()> {
            let workers: Vec<_> = (0..n)
                .map(|_| {
                    let mut c = self.locksmith_cmd(&[
                        "-q", "--slots", &slots, "--wait", "60s", "run", profile, "--", "true",
                    ]);
                    scope.spawn(move || -> Result<()> {
                        for _ in 0..k {
                            Proc::spawn("slots grant", &mut c)?.wait_ok(T)?;
                        }
                        Ok(())
                    })
                })
                .collect();
            for w in workers {
                w.join()
                    .map_err(|_| "a slots worker panicked".to_string())??;
            }
            Ok(())
        })?;
        Ok(t0.elapsed() / (n * k) as u32)
    }

    /// Fair queues (SPEC §3b): `n` contenders, each running `k` times `locksmith [--fair] run P
    /// -- sleep 0.005`. Returns the 50th and 99th percentiles of the time one run took (its
    /// wait, the 5 ms held, and start and exit); every run must exit 0.
    pub fn fair(
        &self,
        profile: &str,
        fair: bool,
        n: usize,
        k: usize,
    ) -> Result<(Duration, Duration)> {
        let mut args = vec![
            "-q", "--wait", "60s", "run", profile, "--", "sleep", "0.005",
        ];
        if fair {
            args.insert(1, "--fair");
        }
        let mut took = std::thread::scope(|scope| -> Result<Vec<Duration>> {
            let workers: Vec<_> = (0..n)
                .map(|_| {
                    let mut c = self.locksmith_cmd(&args);
                    scope.spawn(move || -> Result<Vec<Duration>> {
                        let mut v = Vec::with_capacity(k);
                        for _ in 0..k {
                            let t0 = Instant::now();
                            Proc::spawn("fair run", &mut c)?.wait_ok(T)?;
                            v.push(t0.elapsed());
                        }
                        Ok(v)
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(n * k);
            for w in workers {
                all.extend(
                    w.join()
                        .map_err(|_| "a fair worker panicked".to_string())??,
                );
            }
            Ok(all)
        })?;
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q).round() as usize];
        Ok((at(0.5), at(0.99)))
    }

    /// The herd (issue 15): a holder holds; `n` waiters are started, each to run one
    /// increment of a counter under the lock (`locksmith --wait 10m run P -- sh -c CRITICAL`,
    /// or `flock -w 600 F sh -c CRITICAL` for `profile = None`), and seen waiting (locksmith:
    /// its notice on stderr; flock(1): its request queued in /proc/locks), then `SETTLE`.
    /// Timed from the holder's release (its pipe closed) to the reap of the last waiter: the
    /// last one has held and let go. The counter must then be exactly `n`, every waiter must
    /// have exited 0. With `measure`, each waiter's private memory (KiB) and open descriptors,
    /// read while they all wait, are returned too.
    pub fn herd(
        &self,
        profile: Option<&str>,
        n: usize,
        measure: bool,
    ) -> Result<(Duration, Vec<(u64, usize)>)> {
        self.herd_of(profile, n, measure, false)
    }

    /// [`herd`](Self::herd) with every waiter in the lock's fair queue (`--fair`): a line of
    /// `n` behind the holder (SPEC §3b; issue 26).
    pub fn fair_line(&self, profile: &str, n: usize) -> Result<Duration> {
        Ok(self.herd_of(Some(profile), n, false, true)?.0)
    }

    fn herd_of(
        &self,
        profile: Option<&str>,
        n: usize,
        measure: bool,
        fair: bool,
    ) -> Result<(Duration, Vec<(u64, usize)>)> {
        const CRITICAL: &str = "n=$(cat \"$D/counter\"); echo $((n+1)) > \"$D/counter\"";
        let name = profile.unwrap_or("flock1");
        let d = self.dir.join(format!("herd-{name}"));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        fs::write(d.join("counter"), "0\n").map_err(|e| e.to_string())?;
        let errs = d.join("stderr");
        let errs_file = fs::File::create(&errs).map_err(|e| format!("{}: {e}", errs.display()))?;
        // The holder, and how it lets go: its stdout pipe (locksmith) or cat's stdin (flock).
        let (mut holder, release): (Proc, Box<dyn std::any::Any>) = match profile {
            Some(p) => {
                let (a, out) = self.locksmith_holder(p)?;
                (a, Box::new(out))
            }
            None => {
                let mut h = self.flock1_holder(&self.ref_lock(), &["cat"], Stdio::piped())?;
                let stdin = h.stdin();
                (h, Box::new(stdin))
            }
        };
        let mut waiters = Vec::with_capacity(n);
        for _ in 0..n {
            let mut c = match profile {
                Some(p) => {
                    let mut args = vec!["--wait", "10m", "run", p, "--", "sh", "-c", CRITICAL];
                    if fair {
                        args.insert(0, "--fair");
                    }
                    let mut c = self.locksmith_cmd(&args);
                    c.stderr(errs_file.try_clone().map_err(|e| e.to_string())?);
                    c
                }
                None => Self::plain_cmd(
                    "flock",
                    &["-w", "600", &self.ref_lock(), "sh", "-c", CRITICAL],
                ),
            };
            c.env("D", &d);
            waiters.push(Proc::spawn(format!("herd waiter ({name})"), &mut c)?);
        }
        let pids: Vec<u32> = waiters.iter().map(Proc::pid).collect();
        match profile {
            Some(p) => {
                let needle = format!("waiting for lock `{p}`");
                proc::poll_until(
                    &format!("for {n} waiters' notices"),
                    HERD_T,
                    Duration::from_millis(5),
                    || {
                        fs::read_to_string(&errs)
                            .unwrap_or_default()
                            .matches(&needle)
                            .count()
                            >= n
                    },
                )?;
            }
            None => proc::poll_until(
                &format!("for {n} flock(1) requests in /proc/locks"),
                HERD_T,
                Duration::from_millis(5),
                || proc::blocked_in_flock_count(&pids) >= n,
            )?,
        }
        thread::sleep(SETTLE);
        let used = if measure {
            pids.iter()
                .filter_map(|&p| Some((proc::private_kib(p)?, proc::open_fds(p)?)))
                .collect()
        } else {
            Vec::new()
        };
        let t0 = Instant::now();
        drop(release);
        let mut last = t0;
        for w in &mut waiters {
            last = last.max(w.wait_ok(HERD_T)?);
        }
        holder.wait_ok(T)?;
        let count: usize = fs::read_to_string(d.join("counter"))
            .map_err(|e| e.to_string())?
            .trim()
            .parse()
            .map_err(|e| format!("counter: {e}"))?;
        if count != n {
            return Err(format!(
                "herd of {n} on {name}: counter {count}, not {n} (lost updates!)"
            ));
        }
        if let Some(p) = profile {
            self.check_free(p)?;
            let said = fs::read_to_string(&errs).unwrap_or_default();
            // Waiters share the file: a line may be split where another's write came
            // between its pieces; fragments with no text are not worth a note.
            let worth = |l: &&str| {
                let t = l.trim().trim_start_matches("locksmith:").trim();
                !t.is_empty() && !l.contains("waiting for lock")
            };
            for l in said.lines().filter(worth) {
                self.note(format!(
                    "herd waiter (locksmith {p}) said on stderr: {}",
                    digits_masked(l)
                ));
            }
        }
        let _ = fs::remove_dir_all(&d);
        Ok((last - t0, used))
    }

    pub fn cycle_flock1(&self) -> Result<Duration> {
        self.cycle_flock1_at(&self.ref_lock())
    }

    /// `flock F true` on the lock file `lock`.
    pub fn cycle_flock1_at(&self, lock: &str) -> Result<Duration> {
        let mut c = Self::plain_cmd("flock", &["-w", "10", lock, "true"]);
        self.cycle("flock F true", &mut c)
    }

    /// `locksmith F true`: flock(1)'s form (SPEC §3c) on flock(1)'s own lock file — the same
    /// lock with nothing beside it (no token state, no removal watch, no profiles file): the
    /// cycle of `run` less what its fencing token and watch add.
    pub fn cycle_locksmith_flock_form(&self) -> Result<Duration> {
        let mut c = Command::new(&self.locksmith);
        c.args(["-w", "10", &self.ref_lock(), "true"])
            .env_remove("LOCKSMITH_LOG")
            .env_remove("LOCKSMITH_PROFILES")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.cycle("locksmith F true", &mut c)
    }

    /// `flock --version`: start-up and exit of flock(1), nothing locked.
    pub fn startup_flock1(&self) -> Result<Duration> {
        self.cycle(
            "flock --version",
            &mut Self::plain_cmd("flock", &["--version"]),
        )
    }

    /// `locksmith --version`: start-up and exit of the helper, nothing locked.
    pub fn startup_locksmith(&self) -> Result<Duration> {
        let mut c = Command::new(&self.locksmith);
        c.arg("--version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.cycle("locksmith --version", &mut c)
    }

    pub fn cycle_true(&self) -> Result<Duration> {
        self.cycle("true", &mut Self::plain_cmd("true", &[]))
    }

    /// lockfile-progs has no "run CMD under the lock": create, run, remove.
    pub fn cycle_lockfile_progs(&self) -> Result<Duration> {
        let lock = self.dir.join("lockfile-progs.lock");
        let lock = lock.to_string_lossy();
        let t0 = Instant::now();
        Proc::spawn(
            "lockfile-create",
            &mut Self::plain_cmd("lockfile-create", &["--retry", "0", "--lock-name", &lock]),
        )?
        .wait_ok(T)?;
        Proc::spawn("true", &mut Self::plain_cmd("true", &[]))?.wait_ok(T)?;
        let t1 = Proc::spawn(
            "lockfile-remove",
            &mut Self::plain_cmd("lockfile-remove", &["--lock-name", &lock]),
        )?
        .wait_ok(T)?;
        Ok(t1 - t0)
    }

    /// dotlockfile: lock, run, unlock (the form every version has).
    pub fn cycle_dotlockfile(&self) -> Result<Duration> {
        let lock = self.dir.join("dotlockfile.lock");
        let lock = lock.to_string_lossy();
        let t0 = Instant::now();
        Proc::spawn(
            "dotlockfile -l",
            &mut Self::plain_cmd("dotlockfile", &["-l", "-r", "0", &lock]),
        )?
        .wait_ok(T)?;
        Proc::spawn("true", &mut Self::plain_cmd("true", &[]))?.wait_ok(T)?;
        let t1 = Proc::spawn(
            "dotlockfile -u",
            &mut Self::plain_cmd("dotlockfile", &["-u", &lock]),
        )?
        .wait_ok(T)?;
        Ok(t1 - t0)
    }

    // ---- 2. spawn → OK -----------------------------------------------------------------------

    /// From just before spawning `locksmith P` (stdout piped) to reading its OK line; then
    /// (untimed) its RSS and private dirty memory (KiB), close the pipe and reap it.
    pub fn spawn_ok_locksmith(
        &self,
        profile: &str,
        mem_kib: Option<(&mut Samples, &mut Samples)>,
    ) -> Result<Duration> {
        let mut c = self.locksmith_cmd(&["--wait", "0", profile]);
        c.stdout(Stdio::piped());
        let t0 = Instant::now();
        let mut p = Proc::spawn(format!("locksmith {profile}"), &mut c)?;
        let mut out = BufReader::new(p.stdout());
        let (line, t1) = read_first_line(&mut out, "reading the OK line", T, p.pid())?;
        expect_ok(&line, profile)?;
        if let Some((rss, dirty)) = mem_kib {
            if let Some(kib) = proc::vm_rss_kib(p.pid()) {
                rss.push(kib as f64);
            }
            if let Some(kib) = proc::private_dirty_kib(p.pid()) {
                dirty.push(kib as f64);
            }
        }
        drop(out);
        p.wait_ok(T)?;
        self.check_free(profile)?;
        Ok(t1 - t0)
    }

    /// Spawn → OK of a shared (reader) lock, another reader already holding it: the
    /// reader's path through the backend (joining a shared group, registering).
    pub fn spawn_ok_shared(&self, profile: &str) -> Result<Duration> {
        let mut first = self.locksmith_cmd(&["--wait", "0", "--shared", profile]);
        first.stdout(Stdio::piped());
        let mut a = Proc::spawn(format!("first reader {profile}"), &mut first)?;
        let mut a_out = BufReader::new(a.stdout());
        let (line, _) = read_first_line(&mut a_out, "reading the first reader's OK", T, a.pid())?;
        expect_ok(&line, profile)?;
        let mut c = self.locksmith_cmd(&["--wait", "0", "--shared", profile]);
        c.stdout(Stdio::piped());
        let t0 = Instant::now();
        let mut p = Proc::spawn(format!("reader {profile}"), &mut c)?;
        let mut out = BufReader::new(p.stdout());
        let (line, t1) = read_first_line(&mut out, "reading the reader's OK", T, p.pid())?;
        expect_ok(&line, profile)?;
        drop(out);
        p.wait_ok(T)?;
        drop(a_out);
        a.wait_ok(T)?;
        self.check_free(profile)?;
        Ok(t1 - t0)
    }

    /// flock(1)'s nearest equivalent: `flock F echo OK` (the lock taken, echo forked and
    /// run under it), from spawn to reading "OK".
    pub fn spawn_ok_flock1(&self) -> Result<Duration> {
        let mut c = Self::plain_cmd("flock", &["-w", "10", &self.ref_lock(), "echo", "OK"]);
        c.stdout(Stdio::piped());
        let t0 = Instant::now();
        let mut p = Proc::spawn("flock F echo OK", &mut c)?;
        let mut out = BufReader::new(p.stdout());
        let (line, t1) = read_first_line(&mut out, "reading flock(1)'s OK", T, p.pid())?;
        if line != "OK" {
            return Err(format!("flock F echo OK printed {line:?}"));
        }
        drop(out);
        p.wait_ok(T)?;
        Ok(t1 - t0)
    }

    // ---- 3./4. handoff and crash release ----------------------------------------------------

    /// A locksmith holder `A` whose stdout the bench reads: returns it with its pipe (the
    /// pipe's read end is the lock, in effect: closing it releases).
    fn locksmith_holder(&self, profile: &str) -> Result<(Proc, BufReader<ChildStdout>)> {
        self.locksmith_holder_within(profile, Duration::ZERO)
    }

    /// [`Ctx::locksmith_holder`] with `--wait` `wait` (untimed: a mount's cache may still
    /// show the name another mount removed).
    fn locksmith_holder_within(
        &self,
        profile: &str,
        wait: Duration,
    ) -> Result<(Proc, BufReader<ChildStdout>)> {
        let wait_arg = format!("{}ms", wait.as_millis());
        let mut c = self.locksmith_cmd(&["--wait", &wait_arg, profile]);
        c.stdout(Stdio::piped());
        let mut a = Proc::spawn(format!("holder locksmith {profile}"), &mut c)?;
        let mut out = BufReader::new(a.stdout());
        let (line, _) = read_first_line(&mut out, "reading the holder's OK", T + wait, a.pid())?;
        expect_ok(&line, profile)?;
        Ok((a, out))
    }

    /// A locksmith waiter `B` (hold mode, `--wait 10s`), seen blocked: it has said on stderr
    /// that it waits, (for flock) its flock(2) request is queued in /proc/locks, it has not
    /// said OK, and it has had `SETTLE` to sit down in its wait.
    fn locksmith_waiter(&self, profile: &str) -> Result<Waiter> {
        let mut c = self.locksmith_cmd(&["--wait", "10s", profile]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut b = Proc::spawn(format!("waiter locksmith {profile}"), &mut c)?;
        let mut err = Lines::start(b.stderr(), false);
        let mut out = Lines::start(b.stdout(), true);
        let pid = b.pid();
        if let Err(e) = err.until("waiting for the waiter's notice", T, &[pid], |l| {
            l.contains("waiting for lock")
        }) {
            let said = out.try_next().unwrap_or_default();
            return Err(format!("{e}; waiter's stdout: {said:?}"));
        }
        if profile == "f" || profile.starts_with("nf") {
            proc::poll_until(
                "for the waiter's flock(2) request in /proc/locks",
                T,
                Duration::from_millis(1),
                || proc::blocked_in_flock(pid),
            )?;
        }
        thread::sleep(SETTLE);
        if let Some(l) = out.try_next() {
            return Err(format!(
                "the waiter said {l:?} while the holder still holds the lock"
            ));
        }
        if !b.running() {
            return Err("the waiter exited while it should wait".into());
        }
        Ok(Waiter {
            proc: b,
            out,
            err,
            profile: profile.to_string(),
        })
    }

    /// Reads the waiter's OK (the instant its read returned), then releases and reaps it,
    /// and records anything unexpected it said on stderr.
    fn finish_waiter(&self, mut w: Waiter, why: &str) -> Result<(Instant, String)> {
        let pid = w.proc.pid();
        let (t1, line) = w
            .out
            .next(&format!("for the waiter's OK after {why}"), T, &[pid])?
            .ok_or_else(|| format!("the waiter closed stdout without a line after {why}"))?;
        expect_ok(&line, &w.profile)?;
        drop(w.out.into_pipe()); // releases the waiter's lock
        w.proc.wait_ok(T)?;
        while let Ok(Some((_, l))) = w.err.next("draining the waiter's stderr", T, &[]) {
            if !l.contains("waiting for lock") {
                self.note(format!(
                    "waiter (locksmith {}) said on stderr: {}",
                    w.profile,
                    digits_masked(&l)
                ));
            }
        }
        Ok((t1, line))
    }

    /// Handoff: A holds, B waits; the bench closes A's stdout pipe (A's release) and times
    /// until B's OK line is read.
    pub fn handoff_locksmith(&self, profile: &str) -> Result<Duration> {
        self.handoff_across(profile, profile)
    }

    /// Handoff from a holder of profile `pa` to a waiter of `pb`: the same lock through two
    /// sshfs mounts in the sshfs section (the holder may wait for its mount's cache first,
    /// untimed), else `pa == pb`.
    pub fn handoff_across(&self, pa: &str, pb: &str) -> Result<Duration> {
        let (mut a, a_out) = if pa == pb {
            self.locksmith_holder(pa)?
        } else {
            self.locksmith_holder_within(pa, NET_WAIT)?
        };
        let w = self.locksmith_waiter(pb)?;
        let t0 = Instant::now();
        drop(a_out);
        let (t1, line) = self.finish_waiter(w, "the holder's pipe closed")?;
        a.wait_ok(T)?;
        if line.contains("prev=crashed") {
            self.note(format!(
                "locksmith {pb}: `prev=crashed` in the OK line after a clean release (pipe close)"
            ));
        }
        self.check_free(pb)?;
        Ok(t1 - t0)
    }

    /// Takeover after the *helper itself* is SIGKILLed while a waiter blocks: on this host
    /// flock is freed by the kernel, mkdir and link by proof of death (the waiter watches
    /// the holder's pidfd); the killed holder stays an unreaped zombie until the waiter holds.
    pub fn helper_kill_locksmith(&self, profile: &str) -> Result<Duration> {
        let (a, a_out) = self.locksmith_holder(profile)?;
        self.kill_holder(profile, a, a_out, "the holder itself was")
    }

    /// Takeover after the helper is SIGKILLed in another pid namespace (as if on another
    /// host): the holder runs under `unshare --pid --fork --kill-child` and the bench kills
    /// `unshare`, which takes the namespace down. No proof of death reaches the waiter, so
    /// mkdir/link/symlink wait out `stale_after`; flock is still freed by the kernel.
    pub fn helper_kill_other_ns(&self, profile: &str) -> Result<Duration> {
        self.helper_kill_other_ns_across(profile, profile)
    }

    /// [`Ctx::helper_kill_other_ns`] with the holder on profile `pa` and the waiter on `pb`
    /// (the sshfs section: one lock through two mounts; the holder may wait, untimed, for its
    /// mount's cache to let go of the name the last round's waiter removed).
    pub fn helper_kill_other_ns_across(&self, pa: &str, pb: &str) -> Result<Duration> {
        let wait = if pa == pb { Duration::ZERO } else { NET_WAIT };
        let mut c = Command::new("unshare");
        c.args([
            "--pid",
            "--fork",
            "--kill-child",
            "sh",
            "-c",
            r#""$@"; :"#,
            "sh",
        ])
        .arg(&self.locksmith)
        .arg("--profiles")
        .arg(&self.profiles)
        .args(["--wait", &format!("{}ms", wait.as_millis()), pa])
        .env_remove("LOCKSMITH_LOG")
        .env_remove("LOCKSMITH_PROFILES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut a = Proc::spawn(format!("holder locksmith {pa} in a pid namespace"), &mut c)?;
        let mut a_out = BufReader::new(a.stdout());
        let (line, _) = read_first_line(&mut a_out, "reading the holder's OK", T + wait, a.pid())?;
        expect_ok(&line, pa)?;
        self.kill_holder(pb, a, a_out, "the holder's pid namespace was")
    }

    /// With `a` holding: a waiter of `profile` blocks, `a` is SIGKILLed; the time until the
    /// waiter's OK.
    fn kill_holder(
        &self,
        profile: &str,
        mut a: Proc,
        a_out: BufReader<ChildStdout>,
        who: &str,
    ) -> Result<Duration> {
        let w = self.locksmith_waiter(profile)?;
        let t0 = Instant::now();
        a.kill()?;
        let (t1, line) = self.finish_waiter(w, &format!("{who} SIGKILLed"))?;
        drop(a_out);
        a.wait(T)?;
        if !line.contains("prev=crashed") {
            self.note(format!(
                "locksmith {profile}: no `prev=crashed` after {who} killed"
            ));
        }
        self.check_free(profile)?;
        Ok(t1 - t0)
    }

    /// Whether `unshare --pid --fork` works here (root, or user namespaces allowed).
    pub fn can_unshare_pid() -> bool {
        Command::new("unshare")
            .args(["--pid", "--fork", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Crash release: A's parent (the bench re-executed as `__hold-parent`, reading A's
    /// stdout) is SIGKILLed; time until B's OK line is read.
    pub fn crash_locksmith(&self, profile: &str) -> Result<Duration> {
        let mut c = Command::new(&self.me);
        c.arg(crate::scenarios::HOLD_PARENT)
            .arg(&self.locksmith)
            .arg("--profiles")
            .arg(&self.profiles)
            .args(["--wait", "0", profile])
            .env_remove("LOCKSMITH_LOG")
            .env_remove("LOCKSMITH_PROFILES")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut parent = Proc::spawn(format!("parent of locksmith {profile}"), &mut c)?;
        let keep_stdin = parent.stdin();
        let mut p_out = BufReader::new(parent.stdout());
        let (line, _) = read_first_line(&mut p_out, "reading the holder's OK", T, parent.pid())?;
        expect_ok(&line, profile)?;
        let (pid_line, _) =
            read_first_line(&mut p_out, "reading the holder's pid", T, parent.pid())?;
        let a_pid: u32 = pid_line
            .strip_prefix("pid ")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("the parent said {pid_line:?}, not `pid N`"))?;
        let w = self.locksmith_waiter(profile)?;
        let t0 = Instant::now();
        parent.kill()?;
        let (t1, line) = self.finish_waiter(w, "the holder's parent was killed")?;
        parent.wait(T)?;
        drop(keep_stdin);
        proc::poll_until(
            "for the orphaned holder to exit after its parent died",
            T,
            Duration::from_millis(1),
            || proc::exited(a_pid),
        )?;
        if line.contains("prev=crashed") {
            self.note(format!(
                "locksmith {profile}: `prev=crashed` in the OK line after a parent death (SPEC §6: a normal release)"
            ));
        }
        self.check_free(profile)?;
        Ok(t1 - t0)
    }

    /// flock(1) holder `flock -F F CMD...`: with `-F` flock(1) execs CMD instead of forking,
    /// so the holder is one process (CMD), as locksmith's holder is one process. Returns once
    /// /proc/locks shows it holding.
    fn flock1_holder(&self, lock: &str, cmd: &[&str], stdin: Stdio) -> Result<Proc> {
        let mut args = vec!["-F", "-w", "10", lock];
        args.extend_from_slice(cmd);
        let mut c = Self::plain_cmd("flock", &args);
        c.stdin(stdin);
        let h = Proc::spawn(format!("holder flock -F F {}", cmd.join(" ")), &mut c)?;
        let pid = h.pid();
        proc::poll_until(
            "for the flock(1) holder to hold",
            T,
            Duration::from_millis(1),
            || proc::holds_flock(pid),
        )?;
        Ok(h)
    }

    /// A flock(1) waiter, seen queued in /proc/locks. `Flock1Wait::Cmd`: `flock F echo OK`,
    /// done when echo's OK is read (CMD runs under the lock: what a flock(1) user's work
    /// sees). `Flock1Wait::Taken`: `flock --verbose F true` on a line-buffered stdout
    /// (stdbuf: flock(1) prints with stdio, which would keep the message buffered), done
    /// when "getting lock took" is read: the moment flock(2) returned, before any fork.
    fn flock1_waiter(&self, lock: &str, how: Flock1Wait) -> Result<(Proc, Lines<ChildStdout>)> {
        let mut c = match how {
            Flock1Wait::Cmd => Self::plain_cmd("flock", &["-w", "10", lock, "echo", "OK"]),
            Flock1Wait::Taken => Self::plain_cmd(
                "stdbuf",
                &["-oL", "flock", "--verbose", "-w", "10", lock, "true"],
            ),
        };
        c.stdout(Stdio::piped());
        let mut w = Proc::spawn(format!("flock(1) waiter ({how:?})"), &mut c)?;
        let mut out = Lines::start(w.stdout(), false);
        let pid = w.pid();
        proc::poll_until(
            "for flock(1)'s request in /proc/locks",
            T,
            Duration::from_millis(1),
            || proc::blocked_in_flock(pid),
        )?;
        thread::sleep(SETTLE);
        if let Some(l) = out.try_next() {
            return Err(format!("flock(1) waiter said {l:?} while the holder holds"));
        }
        Ok((w, out))
    }

    fn flock1_finish(
        &self,
        how: Flock1Wait,
        w: &mut Proc,
        out: &mut Lines<ChildStdout>,
    ) -> Result<Instant> {
        let (t1, _) = out.until("for flock(1)'s waiter", T, &[w.pid()], |l| match how {
            Flock1Wait::Cmd => l == "OK",
            Flock1Wait::Taken => l.contains(FLOCK_GOT),
        })?;
        w.wait_ok(T)?;
        Ok(t1)
    }

    /// flock(1) handoff: the holder is `flock -F F cat` reading a pipe from the bench;
    /// closing that pipe ends cat, the lock holder: the same "parent closes a pipe"
    /// release as locksmith's.
    pub fn handoff_flock1(&self, how: Flock1Wait) -> Result<Duration> {
        self.handoff_flock1_at(&self.ref_lock(), how)
    }

    /// [`Ctx::handoff_flock1`] on the lock file `lock` (the sshfs section: on a mount).
    pub fn handoff_flock1_at(&self, lock: &str, how: Flock1Wait) -> Result<Duration> {
        let mut h = self.flock1_holder(lock, &["cat"], Stdio::piped())?;
        let h_in = h.stdin();
        let (mut w, mut w_out) = self.flock1_waiter(lock, how)?;
        let t0 = Instant::now();
        drop(h_in);
        let t1 = self.flock1_finish(how, &mut w, &mut w_out)?;
        h.wait_ok(T)?;
        Ok(t1 - t0)
    }

    /// flock(1) crash release: SIGKILL of the whole holder (`flock -F F sleep`: one process
    /// holds the lock; the fair equivalent of kill -9 on the holder's process group).
    pub fn crash_flock1(&self, how: Flock1Wait) -> Result<Duration> {
        let lock = self.ref_lock();
        let mut h = self.flock1_holder(&lock, &["sleep", "100"], Stdio::null())?;
        let (mut w, mut w_out) = self.flock1_waiter(&lock, how)?;
        let t0 = Instant::now();
        h.kill()?;
        let t1 = self.flock1_finish(how, &mut w, &mut w_out)?;
        h.wait(T)?;
        Ok(t1 - t0)
    }

    /// After a scenario, the lock must be free (a mkdir lock's directory, a link lock's file gone).
    fn check_free(&self, profile: &str) -> Result<()> {
        if let (Some(server), Some((lock, _))) = (&self.netfs_server, profile.split_once('-'))
            && lock != "nf"
        {
            let path = server.join(format!("{lock}.lock"));
            if fs::symlink_metadata(&path).is_ok() {
                return Err(format!(
                    "{} still exists on the sshfs server after every holder exited",
                    path.display()
                ));
            }
            return Ok(());
        }
        if profile.starts_with('m') || profile.starts_with('l') || profile.starts_with('s') {
            let path = self.dir.join(format!("{profile}.lock"));
            if fs::symlink_metadata(&path).is_ok() {
                return Err(format!(
                    "{} still exists after every holder exited",
                    path.display()
                ));
            }
        }
        Ok(())
    }

    // ---- rivals: lockfile-progs, dotlockfile (dot-lock files: they poll), Python filelock ---

    fn python_filelock(&self, what: &str) -> Command {
        let lock = self.dir.join("filelock.lock");
        // Holds until stdin closes (or the process dies: the kernel frees its flock).
        let script = "import sys, filelock\n\
             l = filelock.FileLock(sys.argv[1])\n\
             l.acquire()\n\
             print('OK', flush=True)\n\
             sys.stdin.read()\n\
             l.release()\n";
        let mut c = Self::plain_cmd("python3", &["-c", script, &lock.to_string_lossy()]);
        c.stdin(Stdio::piped()).stdout(Stdio::piped());
        let _ = what;
        c
    }

    /// Python filelock's cycle: interpreter start, import, lock, unlock.
    pub fn cycle_filelock(&self) -> Result<Duration> {
        let mut c = self.python_filelock("cycle");
        let t0 = Instant::now();
        let mut p = Proc::spawn("python filelock", &mut c)?;
        let mut out = BufReader::new(p.stdout());
        let (line, _) = read_first_line(&mut out, "filelock's OK", T, p.pid())?;
        if line != "OK" {
            return Err(format!("filelock said {line:?}"));
        }
        drop(p.stdin());
        let t1 = p.wait_ok(T)?;
        Ok(t1 - t0)
    }

    /// A rival waiter that prints OK once it holds; given `settle` to sit down in its wait
    /// (these tools poll: nothing to observe but time).
    fn rival_waiter(&self, name: &str, mut c: Command) -> Result<(Proc, Lines<ChildStdout>)> {
        c.stdout(Stdio::piped());
        let mut w = Proc::spawn(format!("{name} waiter"), &mut c)?;
        let mut out = Lines::start(w.stdout(), false);
        thread::sleep(Duration::from_millis(150));
        if let Some(l) = out.try_next() {
            return Err(format!("{name} waiter said {l:?} while the holder holds"));
        }
        if !w.running() {
            return Err(format!("{name} waiter exited while it should wait"));
        }
        Ok((w, out))
    }

    /// Handoff for a polling rival: the holder's lock is removed by its own command
    /// (`lockfile-remove`, `dotlockfile -u`) or by closing its stdin (filelock); timed from
    /// just before that release to the waiter's OK.
    pub fn handoff_rival(&self, rival: Rival) -> Result<Duration> {
        let lock = self.dir.join(format!("{}.rival", rival.name()));
        let l = lock.to_string_lossy().into_owned();
        let waiter = |c: &str| Self::plain_cmd("sh", &["-c", c, "sh", &l]);
        match rival {
            Rival::LockfileProgs | Rival::Dotlockfile => {
                let (take, take_retry, release): (Vec<&str>, &str, Vec<&str>) =
                    if rival == Rival::LockfileProgs {
                        (
                            vec!["lockfile-create", "--retry", "0", "--lock-name", &l],
                            "lockfile-create --retry 20 --lock-name \"$1\" && echo OK",
                            vec!["lockfile-remove", "--lock-name", &l],
                        )
                    } else {
                        (
                            vec!["dotlockfile", "-l", "-r", "0", &l],
                            "dotlockfile -l -r 20 \"$1\" && echo OK",
                            vec!["dotlockfile", "-u", &l],
                        )
                    };
                Proc::spawn("rival take", &mut Self::plain_cmd(take[0], &take[1..]))?.wait_ok(T)?;
                let (mut w, mut out) = self.rival_waiter(rival.name(), waiter(take_retry))?;
                let t0 = Instant::now();
                Proc::spawn(
                    "rival release",
                    &mut Self::plain_cmd(release[0], &release[1..]),
                )?
                .wait_ok(T)?;
                let (t1, _) = out.until(
                    "for the rival waiter's OK",
                    Duration::from_secs(60),
                    &[w.pid()],
                    |l| l == "OK",
                )?;
                w.wait_ok(T)?;
                Proc::spawn(
                    "rival release",
                    &mut Self::plain_cmd(release[0], &release[1..]),
                )?
                .wait_ok(T)?;
                Ok(t1 - t0)
            }
            Rival::Filelock => {
                let mut h = Proc::spawn("filelock holder", &mut self.python_filelock("holder"))?;
                let h_in = h.stdin();
                let mut h_out = BufReader::new(h.stdout());
                let (line, _) = read_first_line(&mut h_out, "filelock holder's OK", T, h.pid())?;
                if line != "OK" {
                    return Err(format!("filelock holder said {line:?}"));
                }
                let mut c = self.python_filelock("waiter");
                c.stdin(Stdio::piped());
                let (mut w, mut out) = self.rival_waiter("filelock", c)?;
                let w_in = w.stdin();
                let t0 = Instant::now();
                drop(h_in);
                let (t1, _) = out.until("for filelock's waiter", T, &[w.pid()], |l| l == "OK")?;
                drop(w_in);
                w.wait_ok(T)?;
                h.wait_ok(T)?;
                Ok(t1 - t0)
            }
        }
    }

    /// Crash release for Python filelock (flock(2) underneath: the kernel frees it at the
    /// holder's death; the waiter notices at its next poll).
    pub fn crash_filelock(&self) -> Result<Duration> {
        let mut h = Proc::spawn("filelock holder", &mut self.python_filelock("holder"))?;
        let _h_in = h.stdin();
        let mut h_out = BufReader::new(h.stdout());
        let (line, _) = read_first_line(&mut h_out, "filelock holder's OK", T, h.pid())?;
        if line != "OK" {
            return Err(format!("filelock holder said {line:?}"));
        }
        let mut c = self.python_filelock("waiter");
        c.stdin(Stdio::piped());
        let (mut w, mut out) = self.rival_waiter("filelock", c)?;
        let w_in = w.stdin();
        let t0 = Instant::now();
        h.kill()?;
        let (t1, _) = out.until("for filelock's waiter", T, &[w.pid()], |l| l == "OK")?;
        drop(w_in);
        w.wait_ok(T)?;
        h.wait(T)?;
        Ok(t1 - t0)
    }

    // ---- 5. RSS and wakeups while holding -----------------------------------------------------

    /// Holders for f, m, ml and a flock(1) holder, all at once; context switches summed over
    /// every thread before and after `window`.
    pub fn holding(&self, window: Duration) -> Result<Holding> {
        eprintln!(
            "locksmith-bench: holding for {:.0} s to count wakeups",
            window.as_secs_f64()
        );
        let mut holders = Vec::new();
        for (profile, name) in [
            ("f", "locksmith f (flock)"),
            ("m", "locksmith m (mkdir, heartbeat)"),
            ("ml", "locksmith ml (mkdir, local = true)"),
            ("l", "locksmith l (link, heartbeat)"),
            ("s", "locksmith s (symlink, heartbeat)"),
        ] {
            let (p, out) = self.locksmith_holder(profile)?;
            holders.push((name.to_string(), p, Some(out)));
        }
        let hold_lock = self.dir.join("ref-hold.lock");
        let mut c = Self::plain_cmd("flock", &["-w", "10", &hold_lock.to_string_lossy(), "cat"]);
        c.stdin(Stdio::piped());
        let mut r = Proc::spawn("flock F cat", &mut c)?;
        let r_in = r.stdin();
        let r_pid = r.pid();
        proc::poll_until("for flock(1) to hold", T, Duration::from_millis(1), || {
            proc::holds_flock(r_pid)
        })?;
        holders.push(("flock(1) process of `flock F cat`".into(), r, None));

        thread::sleep(Duration::from_millis(300)); // let start-up activity end
        let before: Vec<_> = holders
            .iter()
            .map(|(n, p, _)| proc::switches(p.pid()).map_err(|e| format!("{n}: {e}")))
            .collect::<Result<_>>()?;
        thread::sleep(window);
        let mut rows = Vec::new();
        let mut reference_rss_kib = 0;
        let mut reference_dirty_kib = 0;
        for ((name, p, _), b) in holders.iter_mut().zip(before) {
            let a = proc::switches(p.pid()).map_err(|e| format!("{name}: {e}"))?;
            if !p.running() {
                return Err(format!("{name} exited while holding"));
            }
            if name.starts_with("flock(1)") {
                reference_rss_kib = proc::vm_rss_kib(p.pid()).unwrap_or(0);
                reference_dirty_kib = proc::private_dirty_kib(p.pid()).unwrap_or(0);
            }
            rows.push(HoldRow {
                name: name.clone(),
                switches: a.total().saturating_sub(b.total()),
                threads: a.threads,
            });
        }
        drop(r_in);
        for (_, p, out) in &mut holders {
            drop(out.take());
            p.wait_ok(T)?;
        }
        for profile in ["m", "ml", "l", "s"] {
            self.check_free(profile)?;
        }
        Ok(Holding {
            window,
            rows,
            reference_rss_kib,
            reference_dirty_kib,
        })
    }
}

/// The rivals measured beside flock(1) when installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rival {
    LockfileProgs,
    Dotlockfile,
    Filelock,
}

impl Rival {
    pub fn name(self) -> &'static str {
        match self {
            Rival::LockfileProgs => "lockfile-progs",
            Rival::Dotlockfile => "dotlockfile",
            Rival::Filelock => "python-filelock",
        }
    }
}

/// When a flock(1) waiter counts as holding (see `Ctx::flock1_waiter`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flock1Wait {
    Cmd,
    Taken,
}

/// A blocked locksmith waiter and its pipes.
struct Waiter {
    proc: Proc,
    out: Lines<ChildStdout>,
    err: Lines<ChildStderr>,
    profile: String,
}

fn expect_ok(line: &str, profile: &str) -> Result<()> {
    if line.starts_with(&format!("OK {profile} ")) || line == format!("OK {profile}") {
        Ok(())
    } else {
        Err(format!("expected `OK {profile} ...`, got {line:?}"))
    }
}

/// Numbers masked, so that one kind of message is counted once in the notes.
fn digits_masked(s: &str) -> String {
    let mut out = String::new();
    let mut in_num = false;
    for c in s.chars() {
        if c.is_ascii_digit() {
            if !in_num {
                out.push('N');
            }
            in_num = true;
        } else {
            in_num = false;
            out.push(c);
        }
    }
    out
}
