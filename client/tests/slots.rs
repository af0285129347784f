//! `netlock` against the real `locksmith` helper with semaphore slots (issue 26 part 4,
//! SPEC §3b): `Builder::slots(n)` runs `--slots N hold ...`, up to N guards hold one lock at
//! once, each reports its own slot, the next one is busy until a slot is given back, and
//! bad numbers are refused before anything is spawned; 6 holders racing on 2 slots never
//! share a slot, and their 48 increments all land.
//!
//! The helper is found as in `several.rs` (`$LOCKSMITH_BIN`, else cargo's
//! `target/<profile>/locksmith`).

use std::path::Path;
use std::time::Duration;

use netlock::{ErrorKind, NetLock};

mod common;
use common::{TempDir, helper};

/// Every blocking call is bounded, so a regression fails instead of hanging.
const WAIT: Duration = Duration::from_secs(20);

fn builder(helper: &Path, tag: &str) -> netlock::Builder {
    NetLock::builder(tag).helper(helper).wait(WAIT)
}

fn busy(helper: &Path, tag: &str, slots: u32) -> bool {
    builder(helper, tag)
        .slots(slots)
        .wait(Duration::ZERO)
        .try_lock()
        .unwrap()
        .is_none()
}

/// Two guards of a 2-slot lock hold slots 0 and 1 at once; a third is busy; giving one
/// back lets the third in, in the slot freed. Tokens rise across slots.
fn two_slots_then_busy_then_the_freed_slot(helper: &Path, lock: &str) {
    let a = builder(helper, lock).slots(2).lock().unwrap();
    let b = builder(helper, lock).slots(2).lock().unwrap();
    let (sa, sb) = (a.slot().unwrap(), b.slot().unwrap());
    let mut held = [sa, sb];
    held.sort_unstable();
    assert_eq!(held, [0, 1], "{} / {}", a.status_line(), b.status_line());
    assert_eq!((a.slot_count(), b.slot_count()), (Some(2), Some(2)));
    assert_eq!(a.slots(), [Some(sa)]);
    assert!(a.status_line().contains(&format!(" slot={sa} slots=2")));
    assert!(
        b.token().unwrap() > a.token().unwrap(),
        "tokens rise across slots"
    );
    assert!(busy(helper, lock, 2), "a third holder of 2 slots is busy");
    let err = builder(helper, lock)
        .slots(2)
        .wait(Duration::ZERO)
        .lock()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Busy);
    assert_eq!(err.exit_code(), Some(75));

    let b_token = b.token().unwrap();
    a.unlock().unwrap();
    let c = builder(helper, lock).slots(2).lock().unwrap();
    assert_eq!(c.slot(), Some(sa), "the third takes the slot given back");
    assert!(c.token().unwrap() > b_token);
    assert!(b.is_held() && c.is_held());
    drop(b);
    drop(c);
    // Both given back: two more fit again.
    let d = builder(helper, lock).slots(2).try_lock().unwrap().unwrap();
    let e = builder(helper, lock).slots(2).try_lock().unwrap().unwrap();
    assert_ne!(d.slot(), e.slot());
}

#[test]
fn flock_two_holders_of_two_slots_and_no_more() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-flock");
    let lock = format!("{}/gpu", tmp.0.display());
    two_slots_then_busy_then_the_freed_slot(&helper, &lock);
}

#[test]
fn mkdir_two_holders_of_two_slots_and_no_more() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-mkdir");
    let lock = format!("mkdir:{}/gpu", tmp.0.display());
    two_slots_then_busy_then_the_freed_slot(&helper, &lock);
}

#[test]
fn without_slots_there_is_no_slot() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-none");
    let lock = format!("{}/x", tmp.0.display());
    let one = builder(&helper, &lock).lock().unwrap();
    assert_eq!((one.slot(), one.slot_count()), (None, None));
    assert_eq!(one.slots(), [None]);
    assert!(busy(&helper, &lock, 1));
    one.unlock().unwrap();
    // `.slots(1)` is the plain mutex: no slot reported either.
    let one = builder(&helper, &lock).slots(1).lock().unwrap();
    assert_eq!((one.slot(), one.slot_count()), (None, None));
    assert!(
        !one.status_line().contains(" slot="),
        "{}",
        one.status_line()
    );
}

#[test]
fn bad_numbers_are_refused_before_spawning() {
    // A helper that does not exist: a spawn would be a Spawn error, not Usage.
    for n in [0, 1025, u32::MAX] {
        let err = NetLock::builder("/tmp/netlock-never-taken")
            .helper("/nonexistent/locksmith")
            .slots(n)
            .lock()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Usage, "{n}: {err}");
        assert_eq!(err.exit_code(), None, "{n}: nothing ran");
        assert!(err.message().contains("1 to 1024"), "{err}");
    }
}

#[test]
fn another_number_of_slots_is_a_config_error_and_takes_nothing() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-mismatch");
    let lock = format!("{}/x", tmp.0.display());
    let held = builder(&helper, &lock).slots(2).lock().unwrap();
    let err = builder(&helper, &lock)
        .slots(3)
        .wait(Duration::ZERO)
        .lock()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert_eq!(err.exit_code(), Some(78));
    // It took nothing: the second slot is still free.
    let other = builder(&helper, &lock).slots(2).try_lock().unwrap();
    assert!(other.is_some());
    drop(other);
    held.unlock().unwrap();
}

#[test]
fn shared_with_slots_is_a_usage_error() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-shared");
    let lock = format!("{}/x", tmp.0.display());
    let err = builder(&helper, &lock)
        .slots(2)
        .shared(true)
        .lock()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Usage, "{err}");
    assert_eq!(err.exit_code(), Some(64));
}

/// A set of two locks, one a semaphore by its address's `?slots=2`: the slots come back per
/// name, in the order named, and the semaphore still has a slot for someone else while the
/// plain lock is busy.
#[test]
fn a_set_where_one_lock_has_slots() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-set");
    let sem = format!("flock:{}/sem?slots=2", tmp.0.display());
    let plain = format!("mkdir:{}/plain", tmp.0.display());
    let set = builder(&helper, &plain).also(&sem).lock().unwrap();
    let slots = set.slots();
    assert_eq!(slots.len(), 2);
    assert_eq!(slots[0], None, "{}", set.status_line());
    let k = slots[1].expect("the semaphore reports its slot");
    assert!(k < 2);
    assert_eq!(set.slot_counts(), [None, Some(2)]);
    assert_eq!((set.slot(), set.slot_count()), (None, None));
    assert_eq!(set.tokens().len(), 2);
    // The plain lock is busy; the semaphore has one more slot, the other one.
    assert!(busy(&helper, &plain, 1));
    let other = builder(&helper, &sem).try_lock().unwrap().unwrap();
    assert_eq!(other.slot(), Some(1 - k));
    assert!(busy(&helper, &sem, 2));
    drop(other);
    set.unlock().unwrap();
    // All given back.
    let both = builder(&helper, &sem).also(&plain).try_lock().unwrap();
    assert!(both.is_some());
}

/// `.slots(2)` on a set applies to every lock.
#[test]
fn slots_on_a_set_apply_to_every_lock() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-set-all");
    let a = format!("{}/a", tmp.0.display());
    let b = format!("mkdir:{}/b", tmp.0.display());
    let first = builder(&helper, &a).also(&b).slots(2).lock().unwrap();
    let second = builder(&helper, &b).also(&a).slots(2).lock().unwrap();
    assert_eq!(first.slot_counts(), [Some(2), Some(2)]);
    let (f, s) = (first.slots(), second.slots());
    assert!(f.iter().chain(&s).all(Option::is_some));
    assert_ne!(f[0], s[1], "a: two holders, two slots");
    assert_ne!(f[1], s[0], "b: two holders, two slots");
    assert!(busy(&helper, &a, 2) && busy(&helper, &b, 2));
}

/// 6 threads x 8 rounds, each guard its own helper process, on a 2-slot semaphore: each
/// holder marks its slot occupied with an `O_EXCL` file (two holders in one slot would
/// fail) and adds 1 to that slot's counter file, not atomically; the counters add up to
/// exactly 48.
fn race(helper: &Path, lock: &str, dir: &Path) {
    const THREADS: usize = 6;
    const ROUNDS: usize = 8;
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            s.spawn(|| {
                for _ in 0..ROUNDS {
                    let guard = builder(helper, lock).slots(2).lock().unwrap();
                    let k = guard.slot().expect("a 2-slot lock reports its slot");
                    assert!(k < 2, "{}", guard.status_line());
                    let marker = dir.join(format!("slot-{k}.held"));
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&marker)
                        .expect("two holders in one slot");
                    let counter = dir.join(format!("slot-{k}.count"));
                    let value: usize = std::fs::read_to_string(&counter)
                        .map(|v| v.parse().unwrap())
                        .unwrap_or(0);
                    std::fs::write(&counter, (value + 1).to_string()).unwrap();
                    std::fs::remove_file(&marker).unwrap();
                    guard.unlock().unwrap();
                }
            });
        }
    });
    let total: usize = (0..2)
        .map(|k| {
            std::fs::read_to_string(dir.join(format!("slot-{k}.count")))
                .map(|v| v.parse::<usize>().unwrap())
                .unwrap_or(0)
        })
        .sum();
    assert_eq!(total, THREADS * ROUNDS);
}

#[test]
fn flock_race_of_six_holders_on_two_slots() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-race-flock");
    race(&helper, &format!("{}/sem", tmp.0.display()), &tmp.0);
}

#[test]
fn mkdir_race_of_six_holders_on_two_slots() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("slots-race-mkdir");
    race(&helper, &format!("mkdir:{}/sem", tmp.0.display()), &tmp.0);
}
