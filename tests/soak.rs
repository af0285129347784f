//! Fault injection: workers take the mkdir lock in a loop through `locksmith run` while a
//! killer SIGKILLs random locksmith processes at random moments (waiting, holding, releasing).
//! Afterwards: nobody was ever inside the critical section beside a live holder, and the
//! fencing tokens the holders saw strictly increase in the order they held the lock.

use std::fs;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::*;

/// The critical section. The marker holds the holder's pid; finding a marker whose pid is
/// still running is an overlap. A killed predecessor gets 100 ms to finish dying (its
/// parent-death SIGKILL is in flight when the lock becomes breakable).
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
echo "$LOCKSMITH_TOKEN" >> "$D/tokens"
i=0; while [ $i -lt 20 ]; do i=$((i+1)); done
rm -f "$m"
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
    let d = sb.path().join("soak");
    fs::create_dir(&d).unwrap();
    let live: Arc<Mutex<Vec<i32>>> = Arc::default();
    let done = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let mut c = sb.cmd([
                "-q", "--wait", "60s", "run", profile, "--", "sh", "-c", CRITICAL,
            ]);
            c.env("D", &d).stdout(Stdio::null()).stderr(Stdio::piped());
            let live = live.clone();
            std::thread::spawn(move || {
                for _ in 0..250 {
                    let child = c.spawn().unwrap();
                    let pid = child.id() as i32;
                    live.lock().unwrap().push(pid);
                    let out = child.wait_with_output().unwrap();
                    live.lock().unwrap().retain(|p| *p != pid);
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
        std::thread::spawn(move || {
            let mut kills = 0;
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5 + fastrand::u64(..40)));
                let victim = {
                    let l = live.lock().unwrap();
                    (!l.is_empty()).then(|| l[fastrand::usize(..l.len())])
                };
                if let Some(pid) = victim {
                    kill9(pid);
                    kills += 1;
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

    let overlaps = fs::read_to_string(d.join("overlaps")).unwrap_or_default();
    assert!(overlaps.is_empty(), "two live holders at once:\n{overlaps}");
    let tokens: Vec<u64> = fs::read_to_string(d.join("tokens"))
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(
        tokens.len() > 50,
        "too few acquisitions got through: {}",
        tokens.len()
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
    // Whatever state the last kill left, the lock is recoverable (at once by proof of death; after stale_after if a kill hit the microseconds between claim and rename).
    // The profile's stale_after is the default 60 s: wait past it.
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
