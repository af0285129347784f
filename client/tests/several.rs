//! `netlock` against the real `locksmith` helper taking several locks at once (issue 26
//! part 4, SPEC §3b): `NetLock::builder(a).also(b)` runs `hold a b`, holds both until the
//! guard goes, gives the tokens in the order named, and holds nothing when one is busy.
//!
//! The helper is found as in `address_query.rs` (`$LOCKSMITH_BIN`, else cargo's
//! `target/<profile>/locksmith`; build it with `cargo build -p locksmith-helper`). Whether a
//! lock is free is asked of the helper itself: `locksmith status LOCK` exits 0 for a free
//! lock.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use netlock::{ErrorKind, NetLock};

mod common;
use common::{TempDir, helper};

/// Every blocking call is bounded, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(20);

fn builder(helper: &Path, tag: &str) -> netlock::Builder {
    NetLock::builder(tag).helper(helper).wait(WAIT)
}

/// Whether `lock` is free now, by `locksmith status LOCK` (exit 0: free).
fn free(helper: &Path, lock: &str) -> bool {
    let out = Command::new(helper)
        .args(["status", lock])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!(
            "status {lock}: exit {other:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// An `mkdir:` address and a plain path (a `flock` file) in `dir`: two backends.
fn two_locks(dir: &Path) -> (String, String) {
    (
        format!("mkdir:{}/m", dir.display()),
        format!("{}/f.lock", dir.display()),
    )
}

#[test]
fn two_locks_of_two_backends_are_held_together_and_released_by_unlock() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("several-unlock");
    let (m, f) = two_locks(&tmp.0);
    let set = builder(&helper, &m).also(&f).lock().unwrap();
    assert!(set.is_held());
    set.check().unwrap();
    assert_eq!(set.tags(), [m.as_str(), f.as_str()]);
    assert_eq!(set.backends(), ["mkdir", "flock"]);
    // A first token is wherever the lock's counter starts (the clock's microseconds on the
    // file backends of newer helpers: issue 28), so only their presence is checked.
    let tokens = set.tokens();
    assert!(tokens[0].is_some(), "{}", set.status_line());
    assert!(tokens[1].is_some(), "{}", set.status_line());
    assert_eq!(set.token(), None, "one token cannot stand for the set");
    assert_eq!(set.profile(), m);
    assert!(tmp.0.join("m").is_dir(), "the mkdir lock exists while held");
    assert!(!free(&helper, &m) && !free(&helper, &f), "both held");
    // Each is busy for anyone else, alone or in a set.
    assert!(
        builder(&helper, &f)
            .wait(Duration::ZERO)
            .try_lock()
            .unwrap()
            .is_none()
    );
    assert!(
        builder(&helper, &m)
            .wait(Duration::ZERO)
            .try_lock()
            .unwrap()
            .is_none()
    );
    set.unlock().unwrap();
    assert!(
        free(&helper, &m) && free(&helper, &f),
        "unlock returned before every lock was gone"
    );
    assert!(!tmp.0.join("m").exists());
}

#[test]
fn dropping_the_guard_releases_every_lock_and_reaps_the_helper() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("several-drop");
    let (m, f) = two_locks(&tmp.0);
    let set = builder(&helper, &f).also(&m).lock().unwrap();
    let pid = set.helper_pid();
    assert!(!free(&helper, &m) && !free(&helper, &f));
    drop(set);
    assert!(
        free(&helper, &m) && free(&helper, &f),
        "drop left a lock held"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the helper was left behind"
    );
}

#[test]
fn tokens_come_in_the_order_named() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("several-order");
    let (m, f) = two_locks(&tmp.0);
    // m alone twice (its first token is wherever its counter starts: a clock floor on newer
    // helpers), so the two locks' tokens differ from here on.
    let first = builder(&helper, &m).lock().unwrap();
    let m1 = first.token().expect("a mkdir token");
    assert_eq!(first.tokens(), [Some(m1)]);
    first.unlock().unwrap();
    let one = builder(&helper, &m).lock().unwrap();
    assert_eq!(one.token(), Some(m1 + 1));
    assert_eq!(one.tokens(), [Some(m1 + 1)]);
    one.unlock().unwrap();
    let set = builder(&helper, &m).also(&f).lock().unwrap();
    let f1 = set.tokens()[1].expect("a flock token");
    assert_eq!(
        set.tokens(),
        [Some(m1 + 2), Some(f1)],
        "{}",
        set.status_line()
    );
    assert_eq!(set.backends(), ["mkdir", "flock"]);
    set.unlock().unwrap();
    // Named the other way round: the same locks (taken in the helper's own order), the
    // tokens in the order named here.
    let set = builder(&helper, &f).also(&m).lock().unwrap();
    assert_eq!(
        set.tokens(),
        [Some(f1 + 1), Some(m1 + 3)],
        "{}",
        set.status_line()
    );
    assert_eq!(set.backends(), ["flock", "mkdir"]);
    assert_eq!(set.profile(), f);
    set.unlock().unwrap();
}

#[test]
fn the_same_lock_twice() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("several-twice");
    let (m, f) = two_locks(&tmp.0);
    // The same name twice: taken once, its token in both places.
    let set = builder(&helper, &m).also(&f).also(&m).lock().unwrap();
    let (m1, f1) = (
        set.tokens()[0].expect("a mkdir token"),
        set.tokens()[1].expect("a flock token"),
    );
    assert_eq!(set.tokens(), [Some(m1), Some(f1), Some(m1)]);
    assert_eq!(set.backends(), ["mkdir", "flock", "mkdir"]);
    assert_eq!(set.field("locks"), Some("2"));
    set.unlock().unwrap();
    // Only one name, twice: a single lock.
    let one = builder(&helper, &f).also(&f).lock().unwrap();
    assert_eq!(one.field("locks"), None, "{}", one.status_line());
    assert_eq!(one.tokens(), [Some(f1 + 1), Some(f1 + 1)]);
    assert_eq!(one.token(), Some(f1 + 1));
    one.unlock().unwrap();
    // Two names for one lock (a path and its flock: address): the helper takes it once,
    // and which token is whose cannot be told. Refused, and nothing left held.
    let alias = format!("flock:{f}");
    let err = builder(&helper, &f)
        .also(&m)
        .also(&alias)
        .lock()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Usage, "{err}");
    assert!(err.message().contains("name each lock once"), "{err}");
    assert!(
        free(&helper, &m) && free(&helper, &f),
        "a refused set left a lock held"
    );
}

#[test]
fn one_busy_lock_is_a_busy_set_and_nothing_is_held() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("several-busy");
    let (m, f) = two_locks(&tmp.0);
    let third = format!("mkdir:{}/z", tmp.0.display());
    for busy in [&m, &f] {
        let holder = builder(&helper, busy).lock().unwrap();
        // try_lock: None, at once.
        let none = builder(&helper, &third)
            .also(&m)
            .also(&f)
            .wait(Duration::ZERO)
            .try_lock()
            .unwrap();
        assert!(none.is_none(), "{busy} is held: the set must be busy");
        // lock with a short wait: a Busy error naming the holder.
        let err = builder(&helper, &m)
            .also(&f)
            .also(&third)
            .wait(Duration::from_millis(200))
            .lock()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
        assert_eq!(err.exit_code(), Some(75));
        assert!(holder.is_held(), "the holder was disturbed");
        for other in [&m, &f, &third].into_iter().filter(|l| *l != busy) {
            assert!(
                free(&helper, other),
                "{other} left held after the set failed on {busy}"
            );
        }
        holder.unlock().unwrap();
    }
    // All free again: the whole set at once.
    let set = builder(&helper, &m)
        .also(&f)
        .also(&third)
        .try_lock()
        .unwrap();
    assert!(set.is_some(), "the set was not free once the holder let go");
}

#[test]
fn addresses_with_queries_and_spaces_in_a_set() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("several-query");
    let q = format!("mkdir:{}/q?stale_after=30s", tmp.0.display());
    let spaced = format!("mkdir:{}/a b?stale_after=30s&poll=50ms", tmp.0.display());
    let (_, f) = two_locks(&tmp.0);
    for (first, second) in [(&q, &f), (&spaced, &q), (&f, &spaced)] {
        let set = builder(&helper, first).also(second).lock().unwrap();
        assert_eq!(set.profile(), first.replace(' ', "%20"));
        assert_eq!(set.tags(), [first.as_str(), second.as_str()]);
        assert!(
            set.tokens().iter().all(Option::is_some),
            "{}",
            set.status_line()
        );
        assert!(!free(&helper, first) && !free(&helper, second));
        set.unlock().unwrap();
        assert!(free(&helper, first) && free(&helper, second));
    }
    assert!(!tmp.0.join("q").exists() && !tmp.0.join("a b").exists());
}
