//! Issue 28: the faults users meet on ordinary machines — long paths at the limits, descriptor
//! pressure, a full or read-only disk, a cleaner deleting a lock file under its holder.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(20);

/// Names in `dir`, sorted (hidden ones too).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A directory inside `root` whose path is `len` bytes long (components of at most 200).
fn deep_dir(root: &Path, len: usize) -> PathBuf {
    let mut p = root.to_path_buf();
    while p.as_os_str().len() < len {
        let left = len - p.as_os_str().len() - 1;
        p.push("d".repeat(left.min(200)));
    }
    fs::create_dir_all(&p).unwrap();
    assert_eq!(p.as_os_str().len(), len);
    p
}

/// Item 2: a lock whose path is close to `PATH_MAX` (its record longer than 4 KiB before the
/// fix). Each lock-directory backend takes it, holds it against a second contender, says
/// who holds it, and releases it: nothing is left but the token state. On main, link exited
/// 75 (it could not read back its own record) and left its lock file behind; mkdir and
/// symlink exited 74 (ENAMETOOLONG: the record did not fit in a symbolic link).
#[test]
fn long_paths_lock_and_release_on_every_lock_directory_backend() {
    let sb = Sandbox::new("");
    for scheme in ["link", "mkdir", "symlink"] {
        let name = format!("{scheme}.lock");
        // The whole path: 4,095 bytes, the longest accepted.
        let dir = deep_dir(&sb.join(scheme), 4095 - name.len() - 1);
        let addr = format!("{scheme}:{}/{name}", dir.display());
        let o = sb.output(["--wait", "0", "run", &addr, "--", "true"]);
        assert_eq!(code(o.status), 0, "{scheme}: {}", stderr(&o));
        assert_eq!(
            names(&dir),
            [format!(".{name}.state")],
            "{scheme}: left behind"
        );

        let mut h = sb.hold(["--wait", "0", &addr]);
        h.ok();
        let busy = sb.output(["--wait", "0", "run", &addr, "--", "true"]);
        assert_eq!(code(busy.status), 75, "{scheme}: {}", stderr(&busy));
        let st = sb.output(["status", &addr]);
        assert_eq!(code(st.status), 1, "{scheme}: {}", stderr(&st));
        assert!(
            stdout(&st).contains(&format!("pid={}", h.pid()))
                || stdout(&st).contains(&format!("pid {}", h.pid())),
            "{scheme}: status does not name the holder: {}",
            stdout(&st)
        );
        // Killed: its lock is judged dead by proof of death, and the next one takes it.
        kill9(h.pid());
        let _ = h.wait_exit(T);
        let mut next = sb.hold(["--wait", "5s", &addr]);
        assert!(
            next.ok().contains(" prev=crashed"),
            "{scheme}: {}",
            next.ok()
        );
        next.close_stdout();
        assert!(next.wait_exit(T).success());
        assert_eq!(
            names(&dir),
            [format!(".{name}.state")],
            "{scheme}: left behind"
        );
    }
}

/// `locksmith ARGS...` with at most `n` open descriptors (`ulimit -n`, as a user's shell
/// under pressure would set it).
fn with_fds(sb: &Sandbox, n: u32, args: &[&str]) -> std::process::Output {
    let mut c = std::process::Command::new("bash");
    c.arg("-c")
        .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
        .arg(bin())
        .arg("--profiles")
        .arg(&sb.profiles)
        .args(args)
        .env_remove("LOCKSMITH_PROFILES")
        .env_remove("LOCKSMITH_LOG")
        .stdin(std::process::Stdio::null());
    output_within(c, T)
}

/// What may stay beside a free lock `name`: its token state, its waiters' queue and their
/// waiting room.
fn only_state_left(dir: &Path, name: &str, what: &str) {
    let left: Vec<String> = names(dir)
        .into_iter()
        .filter(|n| n.contains(name))
        .filter(|n| {
            ![".state", ".queue", ".waiting"]
                .iter()
                .any(|kept| *n == format!(".{name}{kept}"))
        })
        .collect();
    assert!(left.is_empty(), "{what}: left behind: {left:?}");
}

/// Item 3: every lock-directory backend under descriptor pressure, at every limit from one
/// where nothing can be opened to one where all succeeds, taking a free lock and waiting on a
/// held one: it succeeds, or fails with 74 in one ERROR line naming the call's path, and
/// leaves nothing of the lock behind. On main, mkdir at 13 descriptors left an empty
/// `.NAME.<nonce>.new/` and named `PARENT/beat.<nonce>`, a path where nothing was made.
#[test]
fn descriptor_pressure_leaves_nothing_behind() {
    let sb = Sandbox::new("");
    for scheme in ["mkdir", "link", "symlink"] {
        let name = format!("{scheme}.lock");
        let addr = format!("{scheme}:{}", sb.join(&name).display());
        let mut failed_inside = false;
        let (mut ok, mut refused) = (0, 0);
        // 4: descriptors 0–2 and one more (the loader needs one to map the libraries): the
        // first pipe locksmith makes fails. (8 took every link lock once locksmith needed
        // fewer descriptors: one signal pipe, no mount table read.)
        for n in 4..=24 {
            let what = format!("{scheme} with {n} descriptors");
            let o = with_fds(&sb, n, &["--wait", "0", "run", &addr, "--", "true"]);
            let err = stderr(&o);
            match code(o.status) {
                0 => ok += 1,
                74 => {
                    refused += 1;
                    let errors: Vec<&str> =
                        err.lines().filter(|l| l.starts_with("ERROR ")).collect();
                    assert_eq!(errors.len(), 1, "{what}: {err}");
                    assert!(errors[0].starts_with("ERROR io: "), "{what}: {err}");
                    assert!(errors[0].contains("Too many open files"), "{what}: {err}");
                    // A path named is the one the failing call was about: beside the lock.
                    assert!(
                        !errors[0].contains('/')
                            || errors[0].contains(&format!("{}/", sb.path().display()))
                                && errors[0].contains(&name),
                        "{what}: the message names another path: {err}"
                    );
                    failed_inside |= errors[0].contains(".new/beat");
                }
                c => panic!("{what}: exit {c}: {err}"),
            }
            only_state_left(sb.path(), &name, &what);

            // Waiting on a held lock under the same pressure: busy or 74, nothing left.
            let holder = sb.hold(["--wait", "0", &addr]);
            holder.ok();
            let o = with_fds(&sb, n, &["--wait", "300ms", "run", &addr, "--", "true"]);
            assert!(
                matches!(code(o.status), 74 | 75),
                "{what}, waiting: exit {}: {}",
                code(o.status),
                stderr(&o)
            );
            drop(holder);
            only_state_left(sb.path(), &name, &format!("{what}, waiting"));
        }
        assert!(
            ok > 0 && refused > 0,
            "{scheme}: {ok} took it, {refused} refused"
        );
        if scheme == "mkdir" {
            assert!(
                failed_inside,
                "mkdir: no limit made the heartbeat record's creation fail"
            );
        }
    }
}

/// A private size-limited tmpfs (root only): a disk that can be filled and remounted
/// read-only under a lock. Unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// `None` (a SKIP outside CI) where this process may not mount.
    fn new() -> Option<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-tmpfs-")
            .tempdir()
            .unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512k,nr_inodes=200,mode=0755"])
            .arg("locksmith-test")
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            missing("cannot mount a tmpfs here", "needs root and mount(8)");
            return None;
        }
        Some(Tmpfs { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem: blocks and inodes.
    fn fill(&self) {
        let _ = fs::write(self.path().join("filler"), vec![0u8; 1024 * 1024]);
        for i in 0.. {
            if fs::File::create(self.path().join(format!("f{i}"))).is_err() {
                break;
            }
        }
    }

    fn remount(&self, opt: &str) {
        let ok = std::process::Command::new("mount")
            .args(["-o", &format!("remount,{opt}")])
            .arg(self.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "mount -o remount,{opt} failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.path())
            .status();
    }
}

/// Item 4: on a full disk and on a read-only one, a waiter on a held lock waits — on every
/// lock-directory backend alike — and gives up as a waiter does (75) when its `--wait` ends;
/// the holder keeps its lock and releases it. On main, the symlink waiter exited 74 at once
/// ("cannot mark a waiting writer") where mkdir and link waiters waited.
#[test]
fn waiters_on_a_full_or_read_only_disk_wait_on_every_backend() {
    for fault in ["full", "ro"] {
        let Some(fs) = Tmpfs::new() else { return };
        let sb = Sandbox::new("");
        let mut holders = Vec::new();
        let addrs: Vec<String> = ["mkdir", "link", "symlink"]
            .iter()
            .map(|s| format!("{s}:{}/{s}.lock", fs.path().display()))
            .collect();
        for a in &addrs {
            let h = sb.hold(["--wait", "0", a]);
            h.ok();
            holders.push(h);
        }
        // A flock file made before the fault, with no token state beside it yet.
        let flock = format!("flock:{}/f.lock", fs.path().display());
        fs::write(fs.path().join("f.lock"), "").unwrap();
        match fault {
            "full" => fs.fill(),
            _ => fs.remount("ro"),
        }
        // flock still locks it, and says that this acquisition has no fencing token (its
        // state cannot be made), never a token silently dropped (item 4).
        let mut f = sb.hold(["--wait", "0", &flock]);
        assert!(!f.ok().contains("token="), "{fault}: {}", f.ok());
        f.wait_stderr("no fencing token this time", T);
        f.close_stdout();
        assert!(f.wait_exit(T).success(), "{fault}: release of {flock}");
        for a in &addrs {
            let o = sb.output(["--wait", "500ms", "run", a, "--", "true"]);
            assert_eq!(
                code(o.status),
                75,
                "{fault}: a waiter on {a}: {}",
                stderr(&o)
            );
        }
        for (mut h, a) in holders.into_iter().zip(&addrs) {
            assert!(h.exited().is_none(), "{fault}: the holder of {a} ended");
            if fault == "ro" {
                // Its release cannot remove anything: that is the holder's own report.
                drop(h);
                continue;
            }
            h.close_stdout();
            assert!(h.wait_exit(T).success(), "{fault}: release of {a}");
        }
        if fault == "ro" {
            fs.remount("rw");
        }
    }
}

/// Item 4: a name too long for what a backend keeps beside the lock is refused up front as
/// a config error (78 from a profile), nothing made; flock still locks such a name (as
/// flock(1) does) and says on stderr that this acquisition has no fencing token. On main,
/// mkdir, link and symlink exited 74 (ENAMETOOLONG half-way; mkdir left its lock directory
/// behind at 233 bytes) and flock dropped `token=` silently.
#[test]
fn names_too_long_for_the_state_are_config_errors_and_flock_says_it_has_no_token() {
    let sb = Sandbox::new("");
    for len in [232, 240, 249, 255] {
        let name = "n".repeat(len);
        let path = sb.join(&name);
        let mut toml = String::new();
        for b in ["mkdir", "link", "symlink", "flock"] {
            toml += &format!(
                "[profile.{b}]\nbackend = \"{b}\"\npath = \"{}\"\n",
                path.display()
            );
        }
        sb.write_profiles(&toml);
        for b in ["mkdir", "link", "symlink"] {
            let o = sb.output(["--wait", "0", "run", b, "--", "true"]);
            let err = stderr(&o);
            assert_eq!(code(o.status), 78, "{b} {len}: {err}");
            assert!(err.starts_with("ERROR config: "), "{b} {len}: {err}");
            assert!(err.contains("at most 231 bytes"), "{b} {len}: {err}");
            assert_eq!(sb.listing(), ["profiles.toml"], "{b} {len}: left behind");
        }
        let mut h = sb.hold(["--wait", "0", "flock"]);
        assert!(!h.ok().contains("token="), "{}", h.ok());
        h.wait_stderr("no fencing token this time", T);
        h.close_stdout();
        assert!(h.wait_exit(T).success());
        fs::remove_file(&path).unwrap();
    }
    // Under the limit, every backend takes it with a token.
    let name = "n".repeat(231);
    let path = sb.join(&name);
    let mut toml = String::new();
    for b in ["mkdir", "link", "symlink", "flock"] {
        toml += &format!(
            "[profile.{b}]\nbackend = \"{b}\"\npath = \"{}\"\n",
            path.display()
        );
    }
    sb.write_profiles(&toml);
    for b in ["mkdir", "link", "symlink", "flock"] {
        let h = sb.hold(["--wait", "0", b]);
        assert!(token_of(h.ok()) > 0, "{b}: {}", h.ok());
        drop(h);
        let _ = fs::remove_dir_all(sb.join(&format!(".{name}.state")));
    }
}

/// What a cleaner (systemd-tmpfiles on /tmp) does to an old lock: removes the file and the
/// token state beside it.
fn clean_away(path: &Path) {
    fs::remove_file(path).unwrap();
    let state = path.with_file_name(format!(
        ".{}.state",
        path.file_name().unwrap().to_string_lossy()
    ));
    let _ = fs::remove_dir_all(state);
}

/// Item 1, hold mode: a cleaner removes the flock file (and its state) under its holder.
/// The holder says LOST and exits 74 at once; while nothing happens it has no wake-up; the
/// next holder's token is greater than the lost holder's though the state was removed. On
/// main the holder never noticed (no LOST line) and the next token was 1 again.
#[test]
fn a_cleaner_removing_a_held_flock_file_makes_its_holder_lost() {
    let sb = Sandbox::new("");
    let path = sb.join("tmp.lock");
    let addr = format!("flock:{}", path.display());
    let mut h = sb.hold(["--wait", "0", &addr]);
    let first = token_of(h.ok());
    // Idle: no wake-up while nothing happens.
    let pid = h.pid() as u32;
    std::thread::sleep(Duration::from_millis(300)); // start-up activity ends (as the bench)
    let before = testkit::proc::switches(pid).unwrap().total();
    std::thread::sleep(Duration::from_secs(1));
    let idle = testkit::proc::switches(pid).unwrap().total() - before;
    assert_eq!(idle, 0, "context switches in 1 s of holding");

    // Other names coming and going in the same directory are not the lock's.
    let other = sb.join("other");
    fs::write(&other, "x").unwrap();
    fs::rename(&other, sb.join("other2")).unwrap();
    fs::remove_file(sb.join("other2")).unwrap();
    assert_eq!(
        h.read_line(Duration::from_millis(300)),
        None,
        "LOST for another name"
    );
    assert!(h.exited().is_none());

    let removed = std::time::Instant::now();
    clean_away(&path);
    let lost = h.read_line(Duration::from_secs(2));
    let took = removed.elapsed();
    let lost = lost.unwrap_or_else(|| panic!("no LOST line within 2 s: {}", h.stderr_text()));
    assert!(
        lost.starts_with("LOST ") && lost.contains("removed"),
        "{lost:?}"
    );
    assert_eq!(code(h.wait_exit(T)), 74);
    eprintln!("flock holder LOST {took:?} after its file was removed");

    let next = sb.hold(["--wait", "0", &addr]);
    let second = token_of(next.ok());
    assert!(
        second > first,
        "token {second} after {first}: the state was cleaned away"
    );
}

/// Item 1, run mode: CMD is stopped before locksmith exits 74, as the other backends do.
#[test]
fn a_cleaner_removing_a_held_flock_file_stops_the_command() {
    let sb = Sandbox::new("");
    let path = sb.join("run.lock");
    let pidfile = sb.join("cmd.pid");
    let addr = format!("flock:{}", path.display());
    let mut c = sb.cmd([
        "run",
        &addr,
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 30", pidfile.display()),
    ]);
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut run = Held::spawn(c);
    eventually(T, "the command to start", || {
        fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let cmd: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    clean_away(&path);
    let status = run.wait_exit(Duration::from_secs(5));
    assert_eq!(code(status), 74, "{}", run.stderr_text());
    assert!(
        run.stderr_text().contains("ERROR lost: "),
        "{}",
        run.stderr_text()
    );
    assert!(!alive(cmd), "the command outlived its lock");
}

/// Item 1: flock(1)'s forms stay exactly flock(1): invoked as `flock`, a removed file does not
/// end the command, as util-linux's flock(1) does not notice either.
#[test]
fn flock1_forms_ignore_a_cleaner_as_flock1_does() {
    let sb = Sandbox::new("");
    let link = sb.join("flock");
    std::os::unix::fs::symlink(bin(), &link).unwrap();
    let mut tools = vec![link.clone()];
    match on_path("flock") {
        Some(real) => tools.push(real),
        None => missing(
            "util-linux's flock(1) is not installed",
            ".ci/run installs util-linux",
        ),
    }
    for tool in tools {
        let path = sb.join("f1.lock");
        let (started, done) = (sb.join("started"), sb.join("done"));
        let _ = fs::remove_file(&done);
        let mut c = std::process::Command::new(&tool);
        c.arg(&path)
            .arg("sh")
            .arg("-c")
            .arg(format!(
                "touch {}; sleep 1; touch {}",
                started.display(),
                done.display()
            ))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut run = Held::spawn(c);
        eventually(T, "the command to start", || started.exists());
        fs::remove_file(&path).unwrap();
        let status = run.wait_exit(T);
        assert_eq!(code(status), 0, "{}: {}", tool.display(), run.stderr_text());
        assert!(done.exists(), "{}: the command was stopped", tool.display());
        fs::remove_file(&started).unwrap();
    }
}
