//! The soak (issue 5): for a set time, three contenders per backend take the lock in a loop
//! — half through `run`, half as a bash parent holding the pipe — while a killer SIGKILLs
//! random parents and random locksmiths, FTP servers restart and have their sessions cut, the
//! etcd member and the Redis server stall.
//! The backends take turns, each with its own lock, checker and counter.
//!
//! Per backend it reports acquisitions, kills, violations (two live holders inside at once:
//! must be 0), the counter (every completed increment counted exactly once), locks stuck
//! longer than `stale_after` (no holder for longer while contenders wait: must be 0), the
//! longest takeover after a holder was killed, and checks that fencing tokens strictly
//! increase in the order holders entered.
//!
//! The longest gap between holders can exceed `stale_after` on FTP: a contender killed
//! between `MKD PATH` and `MKD PATH/marker` leaves a lock without an owner record, which
//! waiters break only after watching it unchanged for `stale_after` — and the killer keeps
//! cutting their watches short. That is not a stuck lock: no contender waited that long.
//!
//! `LOCKSMITH_SOAK_SECS` sets the duration: 60 under `CI=true`, 15 otherwise. A long run:
//! `LOCKSMITH_SOAK_SECS=3600 cargo test --release -p locksmith-helper --test integration faults -- --nocapture`

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::ftp_server::{FtpServer, TestFtp};
use crate::postgres::PgSandbox;
use crate::support::*;

/// The critical section, run by bash (`$EPOCHREALTIME`, builtins only on the common path).
/// `T` is the fencing token. A marker made with O_EXCL holds the holder's pid: finding a
/// marker whose pid still runs is an overlap. A killed predecessor gets 100 ms to finish
/// dying (with `run`, CMD's parent-death SIGKILL may still be in flight when the lock is
/// taken over). Dead means gone, a zombie (Z) or being reaped (X): a soak once caught a
/// killed holder between Z and gone and counted it alive. The counter is overwritten in place (fixed width, one write), so a kill at
/// any instant leaves either the old or the new value.
const BODY: &str = r#"
m="$D/inside"
dead() { local s=; read -r _ _ s _ 2>/dev/null < /proc/$1/stat; [ -z "$s" ] || [ "$s" = Z ] || [ "$s" = X ]; }
set -C
if ! { echo $$ > "$m"; } 2>/dev/null; then
  read -r p < "$m"
  i=0
  while [ -n "$p" ] && ! dead "$p" && [ $i -lt 50 ]; do sleep 0.002; i=$((i+1)); done
  if [ -n "$p" ] && ! dead "$p"; then
    echo "overlap $$ $p (its stat: $(cat /proc/$p/stat 2>/dev/null | cut -d' ' -f1-7); its parent: $(cat /proc/$(cut -d' ' -f4 /proc/$p/stat 2>/dev/null)/cmdline 2>/dev/null | tr '\0' ' '))" >> "$D/overlaps"
  fi
  echo $$ >| "$m"
fi
set +C
echo "enter $EPOCHREALTIME $$ $PPID $T" >> "$D/log"
read -r n < "$D/counter"
printf '%012d\n' $((10#$n + 1)) 1<> "$D/counter"
i=0; while [ $i -lt 50 ]; do i=$((i+1)); done
rm -f "$m"
echo "leave $EPOCHREALTIME $$" >> "$D/log"
"#;

/// Hold mode with a bash parent: the parent itself runs the critical section, so killing it
/// both ends the work and (by pidfd and the closed pipe) releases the lock.
const PARENT: &str = r#"
exec 3< <(exec "$LS" -q --profiles "$PROFILES" --wait 60s "$P")
read -r ok <&3 || exit 3
case "$ok" in OK*) ;; *) echo "$ok" >&2; exit 3;; esac
T=""
case "$ok" in *token=*) T=${ok#*token=}; T=${T%% *};; esac
"#;

fn soak_secs() -> u64 {
    std::env::var("LOCKSMITH_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var("CI").as_deref() == Ok("true") {
            60
        } else {
            15
        })
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Server-side faults for one backend, run every few seconds while the soak lasts.
type Chaos = Box<dyn FnMut(u32) -> &'static str + Send>;

struct Target {
    name: &'static str,
    sb: Sandbox,
    profile: &'static str,
    stale_after: Duration,
    /// Exit codes a contender may end with besides 0 and SIGKILL: a server restart can
    /// refuse a connection (69), cut a hold short (74), or end a parent's wait (3).
    tolerated: &'static [i32],
    /// Whether the backend hands out fencing tokens (checked strictly increasing).
    tokens: bool,
    /// The killer's pause between kills, in ms (a range): a network lock takes a login
    /// before it can be held, so its contenders must live long enough to get there.
    kill_every: (u64, u64),
    chaos: Option<Chaos>,
}

struct Report {
    acquisitions: usize,
    kills: usize,
    faults: usize,
    tolerated_exits: usize,
    counter: u64,
    leaves: usize,
    max_takeover: f64,
    max_gap: f64,
}

#[test]
fn soak_every_backend_with_kills_restarts_and_cuts() {
    let _heavy = heavy();
    let secs = soak_secs();
    let stale = Duration::from_millis(1500);
    let mut all: Vec<Target> = [
        ("flock", "f"),
        ("mkdir", "fast"),
        ("link", "lfast"),
        ("symlink", "sfast"),
    ]
    .into_iter()
    .map(|(name, profile)| Target {
        name,
        sb: Sandbox::standard(),
        profile,
        stale_after: stale,
        tolerated: &[],
        tokens: true,
        kill_every: (10, 70),
        chaos: None,
    })
    .collect();
    // The embedded FTP server restarts every few seconds (every session cut, the port
    // refusing connections for a moment).
    {
        let srv = Arc::new(Mutex::new(FtpServer::start()));
        let sb = crate::ftp::sandbox(&*srv.lock().unwrap());
        let s = srv.clone();
        all.push(Target {
            name: "ftp (libunftp)",
            sb,
            profile: "race",
            stale_after: stale,
            tolerated: &[3, 69, 74],
            tokens: true,
            kill_every: (100, 400),
            chaos: Some(Box::new(move |_| {
                s.lock().unwrap().restart();
                "restart"
            })),
        });
    }
    // pure-ftpd: its session processes killed (connections cut, server up), and restarts.
    if let Some(srv) = crate::ftp_debian::DebianFtp::start(crate::ftp_debian::Server::PureFtpd) {
        let sb = crate::ftp::sandbox(&srv);
        let srv = Arc::new(Mutex::new(srv));
        all.push(Target {
            name: "ftp (pure-ftpd)",
            sb,
            profile: "race",
            stale_after: stale,
            tolerated: &[3, 69, 74],
            tokens: true,
            kill_every: (100, 400),
            chaos: Some(Box::new(move |round| {
                let mut s = srv.lock().unwrap();
                if round % 3 == 2 {
                    s.restart();
                    "restart"
                } else {
                    s.cut_sessions();
                    "cut"
                }
            })),
        });
    }
    let pg = NotStarted::or_skip(crate::postgres::Pg::start());
    if let Some(pg) = &pg {
        all.push(Target {
            name: "postgres",
            sb: pg.sandbox(),
            profile: "pgfast",
            stale_after: Duration::from_secs(3),
            tolerated: &[],
            tokens: true,
            kill_every: (100, 400),
            chaos: None,
        });
    }
    // etcd: the member stalls for half a second now and then (SIGSTOP/SIGCONT): requests and
    // lease keepalives in flight wait, time runs on for the leases.
    let etcd = crate::etcd::Etcd::start();
    if let Some(e) = &etcd {
        let pid = nix::unistd::Pid::from_raw(e.pid());
        all.push(Target {
            name: "etcd",
            sb: e.sandbox(),
            profile: "efast",
            stale_after: Duration::from_secs(3),
            tolerated: &[3, 69, 74],
            tokens: true,
            kill_every: (100, 400),
            chaos: Some(Box::new(move |_| {
                use nix::sys::signal::{Signal, kill};
                let _ = kill(pid, Signal::SIGSTOP);
                std::thread::sleep(Duration::from_millis(500));
                let _ = kill(pid, Signal::SIGCONT);
                "stall"
            })),
        });
    }
    // redis: the server stalls for half a second now and then (SIGSTOP/SIGCONT): scripts and
    // heartbeats in flight wait, the keys' expiries run on.
    let redis = crate::redis::start();
    if let Some(r) = &redis {
        let pid = nix::unistd::Pid::from_raw(r.pid());
        all.push(Target {
            name: "redis",
            sb: crate::redis::sandbox(r),
            profile: "rfast",
            stale_after: Duration::from_secs(2),
            tolerated: &[3, 69, 74],
            tokens: true,
            kill_every: (100, 400),
            chaos: Some(Box::new(move |_| {
                use nix::sys::signal::{Signal, kill};
                let _ = kill(pid, Signal::SIGSTOP);
                std::thread::sleep(Duration::from_millis(500));
                let _ = kill(pid, Signal::SIGCONT);
                "stall"
            })),
        });
    }

    // LOCKSMITH_SOAK_ONLY=ftp (a substring of the names below) soaks a subset.
    if let Ok(only) = std::env::var("LOCKSMITH_SOAK_ONLY") {
        all.retain(|t| t.name.contains(only.as_str()));
    }
    // One backend after another, each for its share of the time: on two cores, backends
    // soaked at once would mostly measure each other's process spawning.
    let share = Duration::from_secs(secs) / all.len().max(1) as u32;
    let reports: Vec<(String, Report)> = all
        .into_iter()
        .map(|t| (t.name.to_string(), soak_one(t, Instant::now() + share)))
        .collect();
    for (name, r) in &reports {
        eprintln!(
            "soak {}s {name}: {} acquisitions, {} kills, {} server faults, {} tolerated \
             error exits, 0 violations, counter {} (completed {}), 0 stuck, longest takeover \
             after a kill {:.1} ms, longest gap between holders {:.1} ms",
            share.as_secs(),
            r.acquisitions,
            r.kills,
            r.faults,
            r.tolerated_exits,
            r.counter,
            r.leaves,
            r.max_takeover * 1e3,
            r.max_gap * 1e3
        );
    }
    drop(pg);
    drop(etcd);
    drop(redis);
}

fn soak_one(mut t: Target, deadline: Instant) -> Report {
    let d = t.sb.path().join("soak");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("counter"), format!("{:012}\n", 0)).unwrap();
    let live: Arc<Mutex<Vec<i32>>> = Arc::default();
    let kills: Arc<Mutex<Vec<(i32, f64)>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let tolerated_exits = Arc::new(Mutex::new(0usize));
    let lives: Arc<Mutex<Vec<(f64, f64)>>> = Arc::default();
    let run_body = format!("T=$LOCKSMITH_TOKEN\n{BODY}");
    let parent_body = format!("{PARENT}{BODY}");

    let workers: Vec<_> = (0..3)
        .map(|w| {
            let run = {
                let mut c = t.sb.cmd([
                    "-q", "--wait", "60s", "run", t.profile, "--", "bash", "-c", &run_body,
                ]);
                c.env("D", &d).stdout(Stdio::null()).stderr(Stdio::piped());
                c
            };
            let parent = {
                let mut c = std::process::Command::new("bash");
                c.args(["-c", &parent_body])
                    .env("D", &d)
                    .env("LS", bin())
                    .env("PROFILES", t.sb.join("profiles.toml"))
                    .env("P", t.profile)
                    .env_remove("LOCKSMITH_LOG")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                c
            };
            let (live, tolerated, exits) = (live.clone(), t.tolerated, tolerated_exits.clone());
            let lives = lives.clone();
            let name = t.name;
            std::thread::spawn(move || {
                let mut cmds = [run, parent];
                let mut i = w;
                while Instant::now() < deadline {
                    let c = &mut cmds[i % 2];
                    i += 1;
                    let start = now();
                    let child = c.spawn().unwrap();
                    let pid = child.id() as i32;
                    live.lock().unwrap().push(pid);
                    let out = child.wait_with_output().unwrap();
                    live.lock().unwrap().retain(|p| *p != pid);
                    lives.lock().unwrap().push((start, now()));
                    let rc = code(out.status);
                    if tolerated.contains(&rc) {
                        *exits.lock().unwrap() += 1;
                        continue;
                    }
                    assert!(
                        matches!(rc, 0 | 137),
                        "{name}: unexpected exit {rc}: {}",
                        stderr(&out)
                    );
                }
            })
        })
        .collect();
    let killer = {
        let (live, kills, done) = (live.clone(), kills.clone(), done.clone());
        let (lo, hi) = t.kill_every;
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(lo..hi)));
                let l = live.lock().unwrap();
                if l.is_empty() {
                    continue;
                }
                let pid = l[fastrand::usize(..l.len())];
                // Under the lock of `live`: the worker cannot reap pid (and its number be
                // reused) before the kill lands.
                kill9(pid);
                kills.lock().unwrap().push((pid, now()));
            }
        })
    };
    let mut faults = 0;
    if let Some(chaos) = t.chaos.as_mut() {
        let mut round = 0;
        loop {
            let pause = Duration::from_millis(1500 + fastrand::u64(..2000));
            if Instant::now() + pause >= deadline {
                break;
            }
            std::thread::sleep(pause);
            let what = chaos(round);
            debug_assert!(!what.is_empty());
            round += 1;
            faults += 1;
        }
    }
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    killer.join().unwrap();

    let name = t.name;
    let overlaps = fs::read_to_string(d.join("overlaps")).unwrap_or_default();
    if !overlaps.is_empty() {
        // Keep the evidence (log, counter) for a post-mortem.
        let keep = std::env::temp_dir().join(format!(
            "locksmith-soak-failed-{}-{}",
            t.name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            std::process::id()
        ));
        let _ = std::process::Command::new("cp")
            .arg("-a")
            .arg(&d)
            .arg(&keep)
            .status();
        eprintln!("soak: evidence kept in {}", keep.display());
    }
    assert!(
        overlaps.is_empty(),
        "{name}: two live holders at once:\n{overlaps}"
    );
    let log = fs::read_to_string(d.join("log")).unwrap_or_default();
    let report = judge(
        name,
        &log,
        &kills.lock().unwrap(),
        &lives.lock().unwrap(),
        &t,
        &d,
    );
    // Whatever state the last kill left, the lock can be taken: at once by proof of death,
    // at the latest after stale_after.
    let o = t.sb.output([
        "--wait",
        &format!("{}ms", t.stale_after.as_millis() + 5000),
        "run",
        t.profile,
        "--",
        "true",
    ]);
    assert_eq!(code(o.status), 0, "{name}: {}", stderr(&o));
    let tolerated_exits = *tolerated_exits.lock().unwrap();
    Report {
        kills: kills.lock().unwrap().len(),
        faults,
        tolerated_exits,
        ..report
    }
}

struct Entry {
    t: f64,
    pid: i32,
    ppid: i32,
    token: Option<u64>,
    left: bool,
}

fn judge(
    name: &str,
    log: &str,
    kills: &[(i32, f64)],
    lives: &[(f64, f64)],
    t: &Target,
    d: &Path,
) -> Report {
    let stale = t.stale_after;
    let mut entries: Vec<Entry> = vec![];
    let mut leaves = 0;
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["enter", t, pid, ppid, rest @ ..] => entries.push(Entry {
                t: t.parse().unwrap(),
                pid: pid.parse().unwrap(),
                ppid: ppid.parse().unwrap(),
                token: rest.first().and_then(|s| s.parse().ok()),
                left: false,
            }),
            ["leave", _, pid] => {
                leaves += 1;
                let pid: i32 = pid.parse().unwrap();
                if let Some(e) = entries.iter_mut().rev().find(|e| e.pid == pid) {
                    e.left = true;
                }
            }
            // A line cut short by a kill mid-append: the holder died there.
            _ => {}
        }
    }
    assert!(
        entries.len() > 20,
        "{name}: too few acquisitions got through: {}",
        entries.len()
    );
    // Appends from successive holders are ordered by the lock itself.
    let counter: u64 = fs::read_to_string(d.join("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        leaves as u64 <= counter && counter <= entries.len() as u64,
        "{name}: counter {counter} outside [{leaves} completed, {} entered]: an increment was lost",
        entries.len()
    );
    let tokens: Vec<u64> = entries.iter().filter_map(|e| e.token).collect();
    let expected = if t.tokens { entries.len() } else { 0 };
    assert_eq!(
        tokens.len(),
        expected,
        "{name}: fencing tokens seen by {} of {} holders",
        tokens.len(),
        entries.len()
    );
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "{name}: tokens not strictly increasing: {} then {}",
            w[0],
            w[1]
        );
    }
    let mut max_gap: f64 = 0.0;
    let mut max_takeover: f64 = 0.0;
    for w in entries.windows(2) {
        max_gap = max_gap.max(w[1].t - w[0].t);
        if !w[0].left
            && let Some(k) = kills
                .iter()
                .filter(|(p, t)| (*p == w[0].pid || *p == w[0].ppid) && *t >= w[0].t)
                .map(|(_, t)| *t)
                .reduce(f64::min)
            && k < w[1].t
        {
            max_takeover = max_takeover.max(w[1].t - k);
        }
    }
    // Stuck: a contender that waited longer than stale_after (plus a second for its login
    // and poll interval) while nobody at all got the lock. A contender killed earlier does
    // not count: its observation of a silent lock ends with it.
    let mut stuck = vec![];
    for &(start, end) in lives {
        let next = entries
            .iter()
            .map(|e| e.t)
            .find(|&t| t > start)
            .unwrap_or(f64::INFINITY);
        let waited = end.min(next) - start;
        if waited > stale.as_secs_f64() + 1.0 {
            stuck.push(format!("waited {waited:.3}s from {start:.3}"));
        }
    }
    assert!(stuck.is_empty(), "{name}: stuck locks: {stuck:?}");
    Report {
        acquisitions: entries.len(),
        kills: 0,
        faults: 0,
        tolerated_exits: 0,
        counter,
        leaves,
        max_takeover,
        max_gap,
    }
}
