//! `netlock` against the real `locksmith` helper with fair queues (issue 26 item 4, SPEC
//! §3b): `Builder::fair(true)` runs `--fair hold ...`; waiters that begin to wait one after
//! another — each seen in line by `locksmith --fair status --json` before the next starts —
//! get the lock in that order once the holder lets go; an address's `?fair=true` (with
//! `&slots=2`) puts plain guards in line the same way.
//!
//! The helper is found as in `slots.rs` (`$LOCKSMITH_BIN`, else cargo's
//! `target/<profile>/locksmith`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use netlock::NetLock;

mod common;
use common::{TempDir, helper};

/// Every blocking call is bounded, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(60);

/// The waiters in `lock`'s fair queue as `locksmith [--fair] status --json LOCK` lists them:
/// their pids (each a guard's helper), in order.
fn line(helper: &Path, fair_flag: bool, lock: &str) -> Vec<u32> {
    let mut cmd = Command::new(helper);
    if fair_flag {
        cmd.arg("--fair");
    }
    let out = cmd
        .args(["status", "--json", lock])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "status --json {lock}: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    v["waiters"]
        .as_array()
        .unwrap_or_else(|| panic!("no \"waiters\" in {v}"))
        .iter()
        .map(|w| {
            let pid = w["pid"].as_u64().unwrap_or_else(|| panic!("no pid: {w}"));
            u32::try_from(pid).unwrap()
        })
        .collect()
}

/// Polls `line` until it has one more waiter than `before`, after `before` (the one that just
/// began to wait): returns the new line.
fn one_more_in_line(helper: &Path, fair_flag: bool, lock: &str, before: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = line(helper, fair_flag, lock);
        if now.len() > before.len() {
            assert_eq!(now.len(), before.len() + 1, "one waiter at a time: {now:?}");
            assert_eq!(&now[..before.len()], before, "the line keeps its order");
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the waiter never showed in line: {now:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `hold` is held; `n` waiters made by `waiter` begin to wait one after another, each seen
/// in line (`status --json`) before the next starts; then `hold` is let go. Each waiter, once
/// it holds the lock, records (its number, its helper's pid) and lets go: the records are in
/// the order they were served. Asserts that order is the order they began to wait, pid for
/// pid, and that the line is empty afterwards.
fn served_in_order(
    helper: &Path,
    fair_flag: bool,
    lock: &str,
    hold: NetLock,
    n: usize,
    waiter: &(dyn Fn() -> netlock::Builder + Sync),
) {
    let served = Mutex::new(Vec::new());
    let mut in_line = Vec::new();
    std::thread::scope(|s| {
        for i in 1..=n {
            let served = &served;
            s.spawn(move || {
                let guard = waiter().wait(WAIT).lock().unwrap();
                served.lock().unwrap().push((i, guard.helper_pid()));
                guard.unlock().unwrap();
            });
            in_line = one_more_in_line(helper, fair_flag, lock, &in_line);
        }
        assert_eq!(in_line.len(), n);
        hold.unlock().unwrap();
    });
    let served = served.into_inner().unwrap();
    let expected: Vec<(usize, u32)> = (1..=n).zip(in_line.iter().copied()).collect();
    assert_eq!(
        served, expected,
        "served (waiter, helper pid) in the order they came"
    );
    assert!(
        line(helper, fair_flag, lock).is_empty(),
        "nobody left in line"
    );
}

fn three_waiters_in_order(helper: &Path, lock: &str) {
    let holder = NetLock::builder(lock)
        .helper(helper)
        .fair(true)
        .wait(WAIT)
        .lock()
        .unwrap();
    served_in_order(helper, true, lock, holder, 3, &|| {
        NetLock::builder(lock).helper(helper).fair(true)
    });
}

#[test]
fn flock_fair_waiters_are_served_in_the_order_they_came() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("fair-flock");
    three_waiters_in_order(&helper, &format!("{}/deploy", tmp.0.display()));
}

#[test]
fn mkdir_fair_waiters_are_served_in_the_order_they_came() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("fair-mkdir");
    three_waiters_in_order(&helper, &format!("mkdir:{}/deploy", tmp.0.display()));
}

/// `?fair=true&slots=2` in the address, nothing on the builder: two holders fill both slots,
/// three plain guards wait in line (listed by a plain `status` of the address), and once one
/// holder lets go they go through its slot one by one, in order.
#[test]
fn an_address_with_fair_and_slots_puts_plain_guards_in_line() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("fair-address");
    let lock = format!("mkdir:{}/x?fair=true&slots=2", tmp.0.display());
    let plain = || NetLock::builder(&lock).helper(&helper);
    let a = plain().wait(WAIT).lock().unwrap();
    let b = plain().wait(WAIT).lock().unwrap();
    assert_eq!(a.profile(), lock);
    assert_eq!((a.slot_count(), b.slot_count()), (Some(2), Some(2)));
    served_in_order(&helper, false, &lock, a, 3, &plain);
    assert!(b.is_held(), "the other slot was held all along");
    b.unlock().unwrap();
}

/// A fair guard whose wait runs out gets `Busy` and leaves the line at once; the one behind
/// it keeps its place and gets the lock when the holder lets go.
#[test]
fn a_fair_waiter_that_gives_up_leaves_the_line() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("fair-give-up");
    let lock = format!("mkdir:{}/x", tmp.0.display());
    let fair = || NetLock::builder(&lock).helper(&helper).fair(true);
    let holder = fair().wait(WAIT).lock().unwrap();
    std::thread::scope(|s| {
        let quitter = s.spawn(|| fair().wait(Duration::from_secs(3)).lock());
        let first = one_more_in_line(&helper, true, &lock, &[]);
        let stayer = s.spawn(|| {
            let guard = fair().wait(WAIT).lock().unwrap();
            guard.helper_pid()
        });
        let both = one_more_in_line(&helper, true, &lock, &first);
        let err = quitter.join().unwrap().unwrap_err();
        assert_eq!(err.kind(), netlock::ErrorKind::Busy, "{err}");
        assert_eq!(err.exit_code(), Some(75));
        assert_eq!(
            line(&helper, true, &lock),
            [both[1]],
            "the one that gave up left the line"
        );
        holder.unlock().unwrap();
        assert_eq!(stayer.join().unwrap(), both[1], "the next in line got it");
    });
    assert!(line(&helper, true, &lock).is_empty());
}
