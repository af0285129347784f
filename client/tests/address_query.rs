//! `netlock` against the real `locksmith` helper with lock addresses that carry a query
//! (issue 25: the `OK` line's profile field is then `mkdir:/…/x?stale_after=30s`, and the
//! client must take it as the profile, not as a missing one).
//!
//! The helper is `$LOCKSMITH_BIN`, else `locksmith` in cargo's target directory beside this
//! test binary (`target/debug/deps/address_query-…` → `target/debug/locksmith`, wherever
//! `CARGO_TARGET_DIR` puts it); build it with `cargo build -p locksmith-helper`. Without it
//! the tests say so on stderr and pass, except under `CI=true`, where they fail.

use std::path::Path;
use std::time::Duration;

use netlock::NetLock;

mod common;
use common::{TempDir, helper};

fn builder(helper: &Path, address: &str) -> netlock::Builder {
    NetLock::builder(address)
        .helper(helper)
        .wait(Duration::from_secs(20))
}

/// Takes `address` (a mkdir lock on `lock_dir`): held, exclusive, released by unlock.
fn hold_and_release(helper: &Path, address: &str, shown: &str, lock_dir: &Path) {
    let lock = builder(helper, address)
        .lock()
        .unwrap_or_else(|e| panic!("{address}: {e}"));
    assert!(lock.is_held());
    lock.check().unwrap();
    assert_eq!(lock.profile(), shown);
    assert_eq!(lock.backend(), "mkdir");
    assert!(lock.token().is_some(), "{}", lock.status_line());
    assert!(lock_dir.is_dir(), "the lock directory exists while held");
    // Held: a second taker finds it busy.
    assert!(
        NetLock::builder(address)
            .helper(helper)
            .try_lock()
            .unwrap()
            .is_none(),
        "a second holder got a held lock"
    );
    lock.unlock().unwrap();
    assert!(
        !lock_dir.exists(),
        "unlock returned before the lock was gone"
    );
    // Released: it can be taken again at once.
    let again = NetLock::builder(address)
        .helper(helper)
        .try_lock()
        .unwrap()
        .expect("free right after unlock");
    again.unlock().unwrap();
}

#[test]
fn address_with_a_query_is_held_and_released() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("query");
    let address = format!("mkdir:{}/x?stale_after=30s", tmp.0.display());
    hold_and_release(&helper, &address, &address, &tmp.0.join("x"));
}

#[test]
fn address_with_a_space_and_a_query_is_held_and_released() {
    let Some(helper) = helper() else { return };
    let tmp = TempDir::new("space");
    let address = format!("mkdir:{}/a b?stale_after=30s&poll=50ms", tmp.0.display());
    // The OK line writes the space as %20 (SPEC §3a).
    let shown = address.replace(' ', "%20");
    hold_and_release(&helper, &address, &shown, &tmp.0.join("a b"));
}
