//! Faults the tests inject into a real helper process, in one place. They exist only in a
//! build with the `test-hooks` cargo feature, which nothing but the test build turns on (the
//! package's dev-dependency on itself): in the shipped binary every hook is a no-op and no
//! switch name is in it.

/// A stall, once per process: the helper sleeps where a network filesystem would stall.
#[derive(Clone, Copy, Debug)]
pub enum Stall {
    /// Just after a holder took its fencing token, before it can use it.
    Taken,
    /// The first heartbeat after taking the lock.
    Beat,
    /// While taking the lock: the token state's write.
    Taking,
    /// Between making the directory that becomes the lock (mkdir: NAME itself, or on SMB the
    /// `.new` published by rename) and writing its records.
    Making,
    /// mkdir: the private `.NAME.<nonce>.new` complete (records inside), before its publish
    /// by rename; link: the would-be lock file `.NAME.<nonce>.tmp` written, before its
    /// `link(2)`.
    Publishing,
    /// symlink: a leaving reader removed its group, before it frees NAME.
    Leaving,
}

/// A switch that turns another code path on.
#[derive(Clone, Copy, Debug)]
pub enum Switch {
    /// mkdir behaves as on NFS (no `RENAME_NOREPLACE`), so the tests cover the path NFS users
    /// take on a machine that cannot mount NFS.
    MkdirPlain,
    /// symlink's shared locks use seed 004's scheme (a group named `seed`), the racy one the
    /// tests show failing.
    SymlinkSeedScheme,
}

/// Stalls here if the test asked for it (`LOCKSMITH_TEST_STALL_*_MS`), once per process.
#[cfg(feature = "test-hooks")]
pub fn stall(at: Stall) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: [AtomicBool; 6] = [const { AtomicBool::new(false) }; 6];
    let (i, var) = match at {
        Stall::Taken => (0, "LOCKSMITH_TEST_STALL_TAKEN_MS"),
        Stall::Beat => (1, "LOCKSMITH_TEST_STALL_BEAT_MS"),
        Stall::Taking => (2, "LOCKSMITH_TEST_STALL_TAKING_MS"),
        Stall::Making => (3, "LOCKSMITH_TEST_STALL_MAKING_MS"),
        Stall::Publishing => (4, "LOCKSMITH_TEST_STALL_PUBLISHING_MS"),
        Stall::Leaving => (5, "LOCKSMITH_TEST_STALL_LEAVING_MS"),
    };
    if let Some(ms) = std::env::var_os(var).and_then(|v| v.to_str()?.parse::<u64>().ok())
        && !DONE[i].swap(true, Ordering::Relaxed)
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// A build without the tests' hooks: never stalls.
#[cfg(not(feature = "test-hooks"))]
#[inline]
pub fn stall(_at: Stall) {}

/// Whether the test turned `s` on (`LOCKSMITH_MKDIR_PLAIN=1`, `LOCKSMITH_SYMLINK_SEED_SCHEME=1`).
#[cfg(feature = "test-hooks")]
pub fn on(s: Switch) -> bool {
    let var = match s {
        Switch::MkdirPlain => "LOCKSMITH_MKDIR_PLAIN",
        Switch::SymlinkSeedScheme => "LOCKSMITH_SYMLINK_SEED_SCHEME",
    };
    std::env::var_os(var).is_some_and(|v| v == "1")
}

/// A build without the tests' hooks: every switch is off.
#[cfg(not(feature = "test-hooks"))]
#[inline]
pub fn on(_s: Switch) -> bool {
    false
}
