//! Fault injection: workers take the mkdir lock in a loop through `locksmith run` while a
//! killer SIGKILLs random locksmith processes at random moments (waiting, holding, releasing).
//! Afterwards: nobody was ever inside the critical section beside a live holder, and the
//! fencing tokens the holders saw strictly increase in the order they held the lock.
//!
//! To study a failure, `SOAK_LOG_DIR=DIR` runs the helpers with `-vv` and keeps, per worker,
//! every run's helper pid, start and end (ms since the soak began), exit and stderr
//! (`DIR/PROFILE.wN.log`), the killer's kills (`DIR/PROFILE.kills`), and the critical
//! sections' own trace (`DIR/PROFILE.trace`: token, shell pid, helper pid, /proc/uptime at
//! entry and exit; at entry also the helper's state and thread count).

use std::fs;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;

/// The critical section. The marker holds the holder's pid; finding a marker whose pid is
/// still running is an overlap. A killed predecessor gets 100 ms to finish dying (its
/// parent-death SIGKILL is in flight when the lock becomes breakable). Where the lock's
/// record can be read with a shell builtin (`$HELD`: mkdir's `NAME/beat`, link's `NAME`),
/// CMD also checks after writing its token that the record still names its helper: a CMD
/// that runs on after its lock was broken (its helper judged dead too early) is an overlap
/// even when no other CMD happens to be inside at that moment.
const CRITICAL: &str = r#"
m="$D/inside"
dead() { local s=; read -r _ _ s _ 2>/dev/null < /proc/$1/stat; [ -z "$s" ] || [ "$s" = Z ] || [ "$s" = X ]; }
if ! (set -C; echo $$ > "$m") 2>/dev/null; then
  p=$(cat "$m" 2>/dev/null)
  i=0
  while [ -n "$p" ] && ! dead "$p" && [ $i -lt 50 ]; do sleep 0.002; i=$((i+1)); done
  if [ -n "$p" ] && ! dead "$p"; then echo "overlap $$ $p" >> "$D/overlaps"; fi
  echo $$ > "$m"
fi
if [ -n "$SOAK_TRACE" ]; then
  read -r t _ < /proc/uptime
  s=; n=; read -r _ _ s _ 2>/dev/null < /proc/$PPID/stat
  while read -r k v; do [ "$k" = Threads: ] && n=$v; done 2>/dev/null < /proc/$PPID/status
  echo "in $LOCKSMITH_TOKEN $$ $PPID $t helper-state=$s threads=$n" >> "$SOAK_TRACE"
fi
echo "$LOCKSMITH_TOKEN" >> "$D/tokens"
if [ -n "$HELD" ]; then
  r=; read -r r 2>/dev/null < "$HELD"
  case " $r " in *" pid=$PPID "*) ;; *) echo "outlived its lock: token $LOCKSMITH_TOKEN cmd $$ helper $PPID; the lock says: $r" >> "$D/overlaps";; esac
fi
i=0; while [ $i -lt 20 ]; do i=$((i+1)); done
rm -f "$m"
[ -z "$SOAK_TRACE" ] || { read -r t _ < /proc/uptime; echo "out $LOCKSMITH_TOKEN $$ $PPID $t" >> "$SOAK_TRACE"; }
"#;

#[test]
fn random_kill9_never_double_holds_and_tokens_increase_mkdir() {
    soak("fast");
}

#[test]
fn random_kill9_never_double_holds_and_tokens_increase_link() {
    soak("lfast");
}

#[test]
fn random_kill9_never_double_holds_and_tokens_increase_symlink() {
    soak("sfast");
}

fn soak(profile: &str) {
    let _heavy = heavy();
    let sb = Sandbox::standard();
    let held = |p: &str| match p {
        "fast" => Some(sb.join("fast.lock/beat")),
        "lfast" => Some(sb.join("lfast.lock")),
        _ => None,
    };
    soak_in(&sb, &[profile], 250, 250 / 10 + 1, 5..45, &held);
}

/// The soak with 4 workers taking turns over `profiles` (worker w takes `profiles[w % n]`:
/// the same lock through different mounts, say), `runs` each; `held` names the file whose
/// record says who holds the lock (read by CMD with a shell builtin), if any. The killer
/// strikes every `gap` ms (drawn at random from the range). At least `floor` acquisitions
/// must get through (a liveness floor; the safety checks do not depend on it).
pub fn soak_in(
    sb: &Sandbox,
    profiles: &[&str],
    runs: usize,
    floor: usize,
    gap: std::ops::Range<u64>,
    held: &dyn Fn(&str) -> Option<std::path::PathBuf>,
) {
    let profile = profiles[0];
    let d = sb.path().join("soak");
    fs::create_dir(&d).unwrap();
    let live: Arc<Mutex<Vec<i32>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let log_dir = std::env::var_os("SOAK_LOG_DIR").map(std::path::PathBuf::from);
    let t0 = Instant::now();
    let ms = move || t0.elapsed().as_millis();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let profile = profiles[w % profiles.len()];
            let quiet = if log_dir.is_some() { "-vv" } else { "-q" };
            let mut c = sb.cmd([
                quiet, "--wait", "60s", "run", profile, "--", "sh", "-c", CRITICAL,
            ]);
            c.env("D", &d).stdout(Stdio::null()).stderr(Stdio::piped());
            if let Some(h) = held(profile) {
                c.env("HELD", h);
            }
            let mut log = log_dir.as_ref().map(|dir| {
                c.env("SOAK_TRACE", dir.join(format!("{profile}.trace")));
                fs::File::create(dir.join(format!("{profile}.w{w}.log"))).unwrap()
            });
            let live = live.clone();
            std::thread::spawn(move || {
                for k in 0..runs {
                    let start = ms();
                    let child = c.spawn().unwrap();
                    let pid = child.id() as i32;
                    live.lock().unwrap().push(pid);
                    let out = child.wait_with_output().unwrap();
                    live.lock().unwrap().retain(|p| *p != pid);
                    if let Some(f) = &mut log {
                        use std::io::Write;
                        writeln!(
                            f,
                            "=== run {k} pid {pid} {start}..{} ms exit {}\n{}",
                            ms(),
                            code(out.status),
                            stderr(&out)
                        )
                        .unwrap();
                    }
                    // 0: done; 137: killed by the killer; anything else is a failure.
                    assert!(
                        matches!(code(out.status), 0 | 137),
                        "unexpected exit {}: {}",
                        code(out.status),
                        stderr(&out)
                    );
                }
            })
        })
        .collect();
    let killer = {
        let (live, done) = (live.clone(), done.clone());
        let mut log = log_dir
            .as_ref()
            .map(|dir| fs::File::create(dir.join(format!("{profile}.kills"))).unwrap());
        if let Some(f) = &mut log {
            use std::io::Write;
            let up = fs::read_to_string("/proc/uptime").unwrap_or_default();
            writeln!(f, "uptime {} at {} ms", up.trim(), ms()).unwrap();
        }
        std::thread::spawn(move || {
            let mut kills = 0;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(fastrand::u64(gap.clone())));
                let victim = {
                    let l = live.lock().unwrap();
                    (!l.is_empty()).then(|| l[fastrand::usize(..l.len())])
                };
                if let Some(pid) = victim {
                    kill9(pid);
                    kills += 1;
                    if let Some(f) = &mut log {
                        use std::io::Write;
                        writeln!(f, "kill {pid} at {} ms", ms()).unwrap();
                    }
                }
            }
            kills
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let kills = killer.join().unwrap();

    if let Some(dir) = &log_dir {
        let _ = fs::copy(d.join("tokens"), dir.join(format!("{profile}.tokens")));
        fs::write(dir.join(format!("{profile}.files")), listing(sb.path())).unwrap();
    }
    let overlaps = fs::read_to_string(d.join("overlaps")).unwrap_or_default();
    assert!(overlaps.is_empty(), "two live holders at once:\n{overlaps}");
    let tokens: Vec<u64> = fs::read_to_string(d.join("tokens"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    // A liveness floor only (the safety checks are above): a kill between a lock's making and
    // its records leaves one that waits out stale_after, and on a network filesystem a kill
    // storm can make several in a row (sshfs mkdir: 8 of 160 in one CI run of session 17).
    assert!(
        tokens.len() >= floor,
        "too few acquisitions got through: {} of {} runs (at least {floor} expected)",
        tokens.len(),
        4 * runs
    );
    for w in tokens.windows(2) {
        assert!(
            w[0] < w[1],
            "tokens not strictly increasing: {} then {}",
            w[0],
            w[1]
        );
    }
    assert!(kills > 10, "the killer hardly killed anything ({kills})");
    // Whatever state the last kill left, the lock is recoverable: at once by proof of death
    // (of its holder, or of a breaker killed between its claim and freeing the name). The
    // profiles' stale_after is 1.5 s; the long wait is room for a loaded machine.
    let o = output_within(
        sb.cmd(["--wait", "75s", "run", profile, "--", "true"]),
        Duration::from_secs(90),
    );
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    eprintln!(
        "soak {profile}: {} acquisitions, {kills} kills",
        tokens.len()
    );
}

/// What the soak left in `dir`, for `SOAK_LOG_DIR`: every entry below it (symbolic links with
/// their targets, small files with their content).
fn listing(dir: &std::path::Path) -> String {
    let mut out = String::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = fs::read_dir(&d) else { continue };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let Ok(md) = fs::symlink_metadata(&p) else {
                continue;
            };
            let shown = p.strip_prefix(dir).unwrap_or(&p).display().to_string();
            if md.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap_or_default();
                out += &format!("{shown} -> {}\n", t.display());
            } else if md.is_dir() {
                out += &format!("{shown}/\n");
                todo.push(p);
            } else if md.len() < 512 {
                let text = fs::read_to_string(&p).unwrap_or_default();
                out += &format!("{shown}: {}\n", text.trim_end());
            } else {
                out += &format!("{shown} ({} bytes)\n", md.len());
            }
        }
    }
    out
}
