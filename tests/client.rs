//! The `netlock` client crate against the real helper (SPEC §7).

use std::process::{Command, Stdio};
use std::time::Duration;

use netlock::{ErrorKind, NetLock};

use crate::support::*;

const T: Duration = Duration::from_secs(10);

fn builder(sb: &Sandbox, tag: &str) -> netlock::Builder {
    NetLock::builder(tag).profiles(&sb.profiles).helper(bin())
}

#[test]
fn lock_then_unlock_returns_once_the_lock_is_gone() {
    let sb = Sandbox::standard();
    let lock = builder(&sb, "m").lock().unwrap();
    assert!(lock.is_held());
    assert_eq!(lock.backend(), "mkdir");
    assert!(
        lock.token().is_some_and(|t| t > 1),
        "the first acquisition of a fresh lock: a token from the clock's floor (issue 28)"
    );
    assert!(sb.join("m.lock").is_dir());
    let o = sb.output(["status", "--json", "m"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["holders"][0]["ppid"],
        std::process::id(),
        "the helper's parent is us"
    );
    let helper = lock.helper_pid() as i32;
    lock.unlock().unwrap();
    assert!(
        !sb.join("m.lock").exists(),
        "unlock returned before the lock was gone"
    );
    assert!(!alive(helper), "the helper was left behind");
}

#[test]
fn try_lock_is_none_when_busy() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let held = builder(&sb, p).lock().unwrap();
        assert!(builder(&sb, p).try_lock().unwrap().is_none(), "{p}");
        let e = builder(&sb, p)
            .wait(Duration::from_millis(200))
            .lock()
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy, "{e}");
        assert!(e.message().contains("is held by host="), "{e}");
        drop(held);
        let again = builder(&sb, p)
            .try_lock()
            .unwrap()
            .expect("free after drop");
        again.unlock().unwrap();
    }
}

#[test]
fn drop_releases_and_reaps() {
    let sb = Sandbox::standard();
    let lock = builder(&sb, "m").lock().unwrap();
    let helper = lock.helper_pid() as i32;
    drop(lock);
    assert!(!sb.join("m.lock").exists());
    assert!(!alive(helper), "zombie or orphan helper");
}

#[test]
fn errors_are_typed_and_carry_the_helpers_message() {
    let sb = Sandbox::standard();
    let e = builder(&sb, "nope").lock().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Config);
    assert!(e.message().contains("unknown profile `nope`"), "{e}");
    let e = NetLock::builder("m")
        .profiles(&sb.profiles)
        .helper("/nonexistent/locksmith")
        .lock()
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Spawn, "{e}");
}

/// A guard made on a worker thread outlives that thread (no PR_SET_PDEATHSIG in hold mode).
#[test]
fn guard_from_a_worker_thread_survives_the_thread() {
    let sb = Sandbox::standard();
    let b = builder(&sb, "m");
    let lock = std::thread::spawn(move || b.lock().unwrap())
        .join()
        .unwrap();
    // The thread that spawned the helper is gone; the lock must still be held.
    let o = sb.output(["--wait", "300ms", "m"]);
    assert_eq!(code(o.status), 75, "lost with its thread: {}", stdout(&o));
    assert!(lock.is_held());
    lock.unlock().unwrap();
}

/// Child role for the test below: takes a NetLock, says so, and waits to be killed.
#[test]
fn child_role_holding_a_netlock() {
    let Ok(profiles) = std::env::var("LOCKSMITH_TEST_CHILD_PROFILES") else {
        return; // only meaningful when re-executed by the test below
    };
    let lock = NetLock::builder("m")
        .profiles(profiles)
        .helper(bin())
        .lock()
        .unwrap();
    #[allow(clippy::print_stdout)] // the child role reports to its parent test on stdout
    {
        println!("CHILD-HOLDS {}", lock.helper_pid());
    }
    std::thread::sleep(Duration::from_secs(1000));
}

/// A process holding a NetLock is SIGKILLed: its helper releases at once.
#[test]
fn sigkilled_owner_frees_the_lock() {
    let sb = Sandbox::standard();
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        "client::child_role_holding_a_netlock",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("LOCKSMITH_TEST_CHILD_PROFILES", &sb.profiles)
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = Held::spawn(c);
    let helper: i32 = loop {
        let l = child.read_line(T).expect("child never said it holds");
        // libtest prints "test NAME ... " before the test's own output on the same line.
        if let Some((_, pid)) = l.trim().split_once("CHILD-HOLDS ") {
            break pid.parse().unwrap();
        }
    };
    assert!(sb.join("m.lock").is_dir());
    let mut w = sb.spawn_hold(["--wait", "20s", "m"]);
    w.wait_stderr("waiting for lock", T);
    kill9(child.pid());
    assert!(w.read_line(T).is_some(), "the lock was not released");
    w.ok();
    eventually(T, "the orphaned helper to exit", || !alive(helper));
}
