//! The seed's counter race (seed 003): N processes × M read-modify-write increments under
//! the lock must end at exactly N×M, with an O_EXCL marker proving nobody overlapped. The
//! same harness without the lock must lose updates, or the race test proves nothing.
//! `race_workers` runs it with a profile and a wrapper per worker (netfs.rs: workers on two
//! mounts, one in another pid namespace).

use std::fs;
use std::process::Command;

use crate::support::*;

pub const PROCS: usize = 4;
pub const INCREMENTS: usize = 200;

/// Read, widen the window, write back; `set -C` makes `>` use O_EXCL for the marker.
const CRITICAL: &str = r#"
if ! (set -C; : > "$D/inside") 2>/dev/null; then echo overlap >> "$D/overlaps"; fi
n=$(cat "$D/counter")
if [ -n "$LOCKSMITH_TOKEN" ]; then echo "$LOCKSMITH_TOKEN" >> "$D/tokens"; fi
i=0; while [ $i -lt 30 ]; do i=$((i+1)); done
echo $((n+1)) > "$D/counter"
rm -f "$D/inside"
"#;

/// Runs PROCS workers of INCREMENTS each; `locked` wraps each increment in `locksmith run`.
/// Returns (final count, overlaps seen).
fn race(sb: &Sandbox, profile: Option<&str>) -> (usize, usize) {
    race_env(sb, profile, &[])
}

pub fn race_env(sb: &Sandbox, profile: Option<&str>, env: &[(&str, &str)]) -> (usize, usize) {
    let workers: Vec<Worker> = (0..PROCS).map(|_| Worker::new(profile)).collect();
    let r = race_workers(sb, &workers, INCREMENTS, env);
    assert!(
        r.failures.is_empty(),
        "increments failed: {:#?}",
        r.failures
    );
    assert!(
        r.token_regressions.is_empty(),
        "fencing tokens went backwards: {:?}",
        r.token_regressions
    );
    (r.count, r.overlaps)
}

/// One racing process: the profile each of its increments locks (`None`: no lock at all) and
/// a wrapper to run locksmith through (e.g. `unshare --pid --fork --kill-child`: another pid
/// namespace, so "another host" for SPEC §6).
#[derive(Clone, Copy)]
pub struct Worker<'a> {
    pub profile: Option<&'a str>,
    pub prefix: &'a [&'a str],
}

impl<'a> Worker<'a> {
    pub fn new(profile: Option<&'a str>) -> Worker<'a> {
        Worker {
            profile,
            prefix: &[],
        }
    }
}

/// What a race left: the final count, the overlaps seen, and one line per failed increment
/// (a worker stops at its first failure).
pub struct Race {
    pub count: usize,
    pub overlaps: usize,
    pub failures: Vec<String>,
    /// Fencing tokens that did not exceed the one before them, in the order the critical
    /// sections ran (serialised by the lock): each as "previous → this".
    pub token_regressions: Vec<String>,
}

/// What CRITICAL left in `d`: the final count and the overlapping critical sections seen.
pub fn outcome(d: &std::path::Path) -> (usize, usize) {
    let count = fs::read_to_string(d.join("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap_or(0);
    let overlaps = fs::read_to_string(d.join("overlaps")).map_or(0, |s| s.lines().count());
    (count, overlaps)
}

/// Consecutive tokens in `text` (one per line) that did not increase.
fn regressions(text: &str) -> Vec<String> {
    let tokens: Vec<u64> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
    tokens
        .windows(2)
        .filter(|w| w[1] <= w[0])
        .map(|w| format!("{} → {}", w[0], w[1]))
        .collect()
}

/// Runs `workers` at once, each doing `increments` increments, a locked one through
/// `locksmith run PROFILE -- sh -c CRITICAL` (its stderr, the waiting notices, shown only
/// with a failure). To study a failure, `RACE_LOG_DIR=DIR` keeps every increment's stderr in
/// `DIR/wN.log` (worker N), each stamped with its start and end (Unix ms), and runs locksmith
/// at `LOCKSMITH_LOG=$RACE_LOG_LEVEL` (default `debug`: what it decides and why).
pub fn race_workers(
    sb: &Sandbox,
    workers: &[Worker],
    increments: usize,
    env: &[(&str, &str)],
) -> Race {
    let d = sb.path().join("race");
    let _ = fs::remove_dir_all(&d);
    fs::create_dir(&d).unwrap();
    fs::write(d.join("counter"), "0\n").unwrap();
    let threads: Vec<_> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let mut c = match w.profile {
                Some(p) => {
                    let mut c = sb.cmd_via(w.prefix, ["run", p, "--", "sh", "-c", CRITICAL]);
                    c.env("D", &d).envs(env.iter().copied());
                    if std::env::var_os("RACE_LOG_DIR").is_some() {
                        let level = std::env::var("RACE_LOG_LEVEL");
                        c.env("LOCKSMITH_LOG", level.as_deref().unwrap_or("debug"));
                    }
                    c
                }
                None => {
                    let mut c = Command::new("sh");
                    c.args(["-c", CRITICAL]).env("D", &d);
                    c
                }
            };
            let what = match (w.profile, w.prefix.first()) {
                (None, _) => format!("worker {i} (no lock)"),
                (Some(p), None) => format!("worker {i} ({p})"),
                (Some(p), Some(via)) => format!("worker {i} ({p}, via {via})"),
            };
            std::thread::spawn(move || {
                let ms = || {
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                };
                for k in 0..increments {
                    let t0 = ms();
                    let o = c.output().unwrap();
                    if let Ok(dir) = std::env::var("RACE_LOG_DIR") {
                        use std::io::Write;
                        let mut f = fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(format!("{dir}/w{i}.log"))
                            .unwrap();
                        writeln!(
                            f,
                            "=== increment {k} {t0}..{} exit {:?}\n{}",
                            ms(),
                            o.status,
                            stderr(&o)
                        )
                        .unwrap();
                    }
                    if !o.status.success() {
                        return Some(format!(
                            "{what}, increment {k}: exit {}: {}",
                            code(o.status),
                            digest(&stderr(&o))
                        ));
                    }
                }
                None
            })
        })
        .collect();
    let failures = threads
        .into_iter()
        .filter_map(|t| t.join().unwrap())
        .collect();
    let (count, overlaps) = outcome(&d);
    let token_regressions =
        fs::read_to_string(d.join("tokens")).map_or(Vec::new(), |s| regressions(&s));
    Race {
        count,
        overlaps,
        failures,
        token_regressions,
    }
}

#[test]
fn counter_race_is_exact_under_every_local_backend() {
    let sb = Sandbox::standard();
    // Negative control: without a lock the same harness must lose updates or overlap.
    let (count, overlaps) = race(&sb, None);
    assert!(
        count < PROCS * INCREMENTS || overlaps > 0,
        "the harness shows no race without a lock (count {count}, overlaps {overlaps}): it would prove nothing"
    );
    for p in LOCAL {
        let (count, overlaps) = race(&sb, Some(p));
        assert_eq!(overlaps, 0, "{p}: two holders at once");
        assert_eq!(count, PROCS * INCREMENTS, "{p}: lost updates");
    }
    assert!(!sb.join("m.lock").exists());
    let leftovers: Vec<_> = sb
        .listing()
        .into_iter()
        .filter(|n| n.contains("tomb"))
        .collect();
    assert!(leftovers.is_empty(), "tombstones left: {leftovers:?}");
}

/// The mkdir path NFS users take (mkdir, then the owner record), forced by its debug switch.
#[test]
fn counter_race_is_exact_with_plain_mkdir_as_on_nfs() {
    let sb = Sandbox::standard();
    let (count, overlaps) = race_env(&sb, Some("m"), &[("LOCKSMITH_MKDIR_PLAIN", "1")]);
    assert_eq!(overlaps, 0, "two holders at once");
    assert_eq!(count, PROCS * INCREMENTS, "lost updates");
    assert!(!sb.join("m.lock").exists());
}
