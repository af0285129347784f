//! Several locks at once (SPEC §3b): `hold A B ...` and `run A B ... -- CMD` take every lock
//! or none, in one canonical order (so callers naming them in different orders never
//! deadlock), under one `--wait` deadline; one lost is the set lost; the OK line and
//! `LOCKSMITH_TOKEN` list each lock in command-line order.

use std::fs;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

const T: Duration = Duration::from_secs(20);

/// Increments `D/count.X` for every lock X named in `$LOCKS`, each behind an O_EXCL marker
/// (`D/inside.X`) that proves nobody else was in X's critical section at the same time.
const CRITICAL: &str = r#"
for x in $LOCKS; do
  if ! (set -C; : > "$D/inside.$x") 2>/dev/null; then echo "$x" >> "$D/overlaps"; fi
done
for x in $LOCKS; do
  n=$(cat "$D/count.$x")
  i=0; while [ $i -lt 20 ]; do i=$((i+1)); done
  echo $((n+1)) > "$D/count.$x"
done
for x in $LOCKS; do rm -f "$D/inside.$x"; done
"#;

/// Three sets racing: each worker takes `takes` (profiles) and increments `touches` (the
/// counters it believes it holds). Returns the counts of a, b and c, and the overlaps seen.
fn race(sb: &Sandbox, workers: &[(&[&str], &str)], increments: usize) -> ([usize; 3], usize) {
    let d = sb.join("several");
    let _ = fs::remove_dir_all(&d);
    fs::create_dir(&d).unwrap();
    for x in ["a", "b", "c"] {
        fs::write(d.join(format!("count.{x}")), "0\n").unwrap();
    }
    let threads: Vec<_> = workers
        .iter()
        .map(|(takes, touches)| {
            let mut args: Vec<&str> = vec!["--wait", "60s", "run"];
            args.extend(takes.iter());
            args.extend(["--", "sh", "-c", CRITICAL]);
            let mut c: Command = sb.cmd(args);
            c.env("D", &d).env("LOCKS", touches);
            let what = format!("{takes:?}");
            std::thread::spawn(move || {
                for k in 0..increments {
                    let o = c.output().unwrap();
                    assert!(
                        o.status.success(),
                        "{what}, increment {k}: exit {}: {}",
                        code(o.status),
                        stderr(&o)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker failed");
    }
    let count = |x: &str| {
        fs::read_to_string(d.join(format!("count.{x}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let overlaps = fs::read_to_string(d.join("overlaps")).map_or(0, |s| s.lines().count());
    ([count("a"), count("b"), count("c")], overlaps)
}

/// Whether `lock` is free now (`status` exits 0 for a free lock).
fn free(sb: &Sandbox, lock: &str) -> bool {
    code(sb.output(["status", lock]).status) == 0
}

#[test]
fn sets_named_in_any_order_never_deadlock_and_count_exactly() {
    let sb = Sandbox::standard();
    const M: usize = 60;
    // Negative control: a worker that holds only a but counts b too (a CMD run with a
    // subset held) must show: b's count comes out short or two sections overlap.
    let (counts, overlaps) = race(
        &sb,
        &[(&["m", "f"], "a b"), (&["f"], "a b"), (&["m"], "a b")],
        M,
    );
    assert!(
        counts != [3 * M, 3 * M, 0] || overlaps > 0,
        "the harness shows no race with a subset held ({counts:?}, overlaps {overlaps}): it would prove nothing"
    );
    let (counts, overlaps) = race(
        &sb,
        &[
            (&["m", "f"], "a b"),
            (&["f", "m"], "a b"),
            (&["f", "s", "m"], "a b c"),
        ],
        M,
    );
    assert_eq!(overlaps, 0, "two holders of one lock at once");
    assert_eq!(counts, [3 * M, 3 * M, M]);
    for x in ["m", "f", "s"] {
        assert!(free(&sb, x), "{x} left held");
    }
}

#[test]
fn all_or_nothing_when_one_is_busy() {
    let sb = Sandbox::standard();
    let holder = sb.hold(["s"]);
    holder.ok();
    let marker = sb.join("ran");
    let touch = format!("touch {}", marker.display());
    // s comes last in the canonical order (by backend name: flock f, mkdir m, symlink s): f
    // and m are taken first, then given back.
    let o = sb.output([
        "--wait", "0", "run", "m", "f", "s", "--", "sh", "-c", &touch,
    ]);
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    assert!(!marker.exists(), "CMD ran with a subset held");
    assert!(free(&sb, "m") && free(&sb, "f"), "a subset left held");
    let mut h = sb.hold(["--wait", "0", "hold", "m", "s"]);
    let line = h.line.clone().unwrap_or_default();
    assert!(line.starts_with("ERROR busy:"), "{line:?}");
    assert_eq!(code(h.wait_exit(T)), 75);
    assert!(free(&sb, "m"), "hold left m held after failing on s");
}

#[test]
fn one_deadline_for_the_whole_set() {
    let sb = Sandbox::standard();
    // m (mkdir) is taken after f (flock): f is held for 1.5 s, m all along. With one
    // deadline of 2 s the set gives up about 2 s after it began — not 2 s after f came free.
    let mut hb = sb.hold(["f"]);
    hb.ok();
    let ha = sb.hold(["m"]);
    ha.ok();
    let began = Instant::now();
    let mut set = sb.spawn_hold(["--wait", "2s", "hold", "m", "f"]);
    std::thread::sleep(Duration::from_millis(1500));
    hb.close_stdout();
    assert_eq!(code(hb.wait_exit(T)), 0);
    assert_eq!(code(set.wait_exit(T)), 75);
    let took = began.elapsed();
    assert!(
        took < Duration::from_millis(3200),
        "gave up after {took:?}: the deadline restarted for the second lock"
    );
    assert!(free(&sb, "f"), "f left held after the set gave up");
    drop(ha);
}

#[test]
fn ok_line_environment_and_the_same_lock_twice() {
    let sb = Sandbox::standard();
    let mut h = sb.hold(["hold", "m", "f"]);
    // Every file backend's first token is the clock's floor (issue 28: its state may be
    // cleaned away), and the line says so, lock by lock.
    let (m_token, f_token) = h
        .ok()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("token="))
        .and_then(|t| t.split_once(','))
        .map(|(m, f)| (m.to_string(), f.to_string()))
        .unwrap_or_default();
    assert!(m_token.parse::<u64>().is_ok_and(|t| t > 1), "{}", h.ok());
    assert!(f_token.parse::<u64>().is_ok_and(|t| t > 1), "{}", h.ok());
    assert_eq!(
        h.ok().trim_end(),
        format!(
            "OK m backend=mkdir,flock mode=exclusive,exclusive token={m_token},{f_token} token_from=clock,clock locks=2"
        )
    );
    assert!(!free(&sb, "m") && !free(&sb, "f"));
    h.close_stdout();
    assert_eq!(code(h.wait_exit(T)), 0);
    assert!(free(&sb, "m") && free(&sb, "f"), "release frees every lock");
    // Command-line order, not the order taken; a lock without tokens leaves its place empty
    // (none here: flock and mkdir both keep them).
    let o = sb.output([
        "run",
        "f",
        "m",
        "--",
        "sh",
        "-c",
        "echo $LOCKSMITH_PROFILE $LOCKSMITH_TOKEN",
    ]);
    let next = |t: &str| t.parse::<u64>().unwrap() + 1;
    assert_eq!(
        stdout(&o),
        format!("f {},{}\n", next(&f_token), next(&m_token)),
        "{}",
        stderr(&o)
    );
    // The same lock named twice, once as a profile and once as an address: taken once.
    let addr = format!("mkdir:{}", sb.join("m.lock").display());
    let mut h = sb.hold(["hold", "m", &addr, "m"]);
    assert_eq!(
        h.ok().trim_end(),
        format!(
            "OK m backend=mkdir mode=exclusive token={}",
            next(&m_token) + 1
        )
    );
    h.close_stdout();
    assert_eq!(code(h.wait_exit(T)), 0);
}

#[test]
fn losing_one_lock_is_losing_the_set() {
    let sb = Sandbox::standard();
    let mut h = sb.hold(["hold", "fast", "f"]);
    h.ok();
    // The mkdir lock removed from outside: its next heartbeat finds it gone.
    fs::remove_dir_all(sb.join("fast.lock")).unwrap();
    let lost = h.read_line(T).unwrap_or_default();
    assert!(lost.starts_with("LOST "), "{lost:?}");
    assert_eq!(code(h.wait_exit(T)), 74);
    assert!(free(&sb, "f"), "the rest of a lost set is given back");
    // Run mode: CMD is stopped and the exit is 74.
    let marker = sb.join("survived");
    let script = format!(
        "rm -rf {}; sleep 5; touch {}",
        sb.join("fast.lock").display(),
        marker.display()
    );
    let began = Instant::now();
    let o = sb.output(["run", "fast", "f", "--", "sh", "-c", &script]);
    assert_eq!(code(o.status), 74, "{}", stderr(&o));
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "CMD was not stopped"
    );
    assert!(!marker.exists());
    assert!(free(&sb, "f"));
}

#[test]
fn bad_sets_are_usage_errors() {
    let sb = Sandbox::standard();
    let o = sb.output(["run", "m", "-v", "--", "true"]);
    assert_eq!(code(o.status), 64, "{}", stderr(&o));
    let o = sb.output(["-F", "run", "f", "m", "--", "true"]);
    assert_eq!(code(o.status), 64, "{}", stderr(&o));
    let o = sb.output(["status", "m", "f"]);
    assert_eq!(code(o.status), 64, "{}", stderr(&o));
    // An unknown profile among the set: its error, nothing taken.
    let o = sb.output(["run", "m", "nosuch", "--", "true"]);
    assert_eq!(code(o.status), 78, "{}", stderr(&o));
    assert!(free(&sb, "m"));
}

#[test]
fn an_unreachable_server_in_a_set_is_its_error_and_nothing_is_held() {
    let sb = Sandbox::standard();
    // flock (b) comes before ftp in the canonical order: it is taken, then given back.
    let ftp = format!("ftp://127.0.0.1:{}/locks/x", free_port());
    let marker = sb.join("ran");
    let touch = format!("touch {}", marker.display());
    let o = sb.output(["--wait", "0", "run", &ftp, "f", "--", "sh", "-c", &touch]);
    assert_eq!(code(o.status), 69, "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("ERROR unavailable: "),
        "{}",
        stderr(&o)
    );
    assert!(!marker.exists(), "CMD ran with a subset held");
    assert!(free(&sb, "f"), "f left held");
}
