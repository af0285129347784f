//! Fencing tokens of the file backends: the directory `.NAME.state` beside the lock holds one
//! entry whose *name* is the state, `state~1~TOKEN~CLEAN` (a symbolic link; an empty
//! directory where the filesystem has no symbolic links, as on SMB, and as the FTP backend
//! keeps the same names). A holder issues the next token by renaming
//! that exact name to `state~1~TOKEN+1~0`: a compare-and-swap the server decides. A taker
//! that stalled past `stale_after` (and was broken) and whose rename lands late renames a
//! name that is gone: it fails, and the state never goes back.
//!
//! (A state that is one file renamed *over* `.NAME.state` would let such a write landing
//! late replace a newer state, and the holders after it be issued tokens a second time:
//! `crash::late_state_write_of_a_stalled_taker_never_reissues_a_token`.)
//!
//! On a network filesystem a listing may come from the mount's cache (sshfs: 20 s by
//! default). A create and remove of a private name inside `.NAME.state` through the same
//! mount makes the client drop its cached listing (sshfs, NFS); a stale listing anyway only
//! makes the rename fail, and the holder read again.

use std::ffi::{OsStr, OsString};
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, renameat};
use nix::sys::stat::{Mode as FileMode, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use crate::backend::faults::{self, Stall};
use crate::backend::owner::{self, State};
use crate::error::{Error, Result, err};
use crate::log::debug;

/// The target of every entry: the name is the record.
const TEXT: &str = "locksmith-state";

/// Where a lock's state lives, and how to create it.
pub struct StateAt<'a> {
    /// The lock's parent directory.
    pub dir: BorrowedFd<'a>,
    /// `.NAME.state`.
    pub name: &'a OsStr,
    /// Its path, for messages.
    pub shown: &'a Path,
    /// On a network or FUSE filesystem: listings are made fresh first.
    pub remote: bool,
    /// `file_mode` (the directory gets `x` where it has `r`; unset: the parent's bits) and
    /// `group` of the profile.
    pub mode: Option<u32>,
    pub group: Option<u32>,
    /// The number of slots the issuer asks for (SPEC §3b), recorded with each token.
    pub slots: u32,
    /// Asked before a token is issued over another recorded number of slots.
    pub agree: Option<&'a crate::backend::lock::Agree>,
}

/// What a read of the state found.
enum Found {
    /// No state yet: no token was ever issued.
    Nothing,
    /// The directory, with the highest entry in it (`None`: no entry, see [`read`]).
    Dir(Option<State>),
}

impl StateAt<'_> {
    /// Who owns `.NAME.state`, for messages.
    fn uid(&self) -> u32 {
        fstatat(self.dir, self.name, AtFlags::AT_SYMLINK_NOFOLLOW).map_or(u32::MAX, |st| st.st_uid)
    }

    pub(super) fn entry(&self, st: State) -> PathBuf {
        Path::new(self.name).join(owner::state_entry(st))
    }

    /// Lists `.NAME.state` (made fresh first on a network filesystem).
    fn find(&self) -> Result<Found> {
        let flags = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
        if self.remote {
            // Our own create and remove inside: the client drops its cached listing.
            let probe = Path::new(self.name).join(format!("probe.{}", crate::host::nonce()));
            if mkdirat(self.dir, &probe, FileMode::from_bits_truncate(0o700)).is_ok() {
                let _ = unlinkat(self.dir, &probe, UnlinkatFlags::RemoveDir);
            }
        }
        let mut best: Option<State> = None;
        let listed = crate::files::each_name(self.dir, self.name, flags, |name| {
            let st = std::str::from_utf8(name.to_bytes())
                .ok()
                .and_then(owner::parse_state_entry);
            if let Some(st) = st
                && best.is_none_or(|b| st.token > b.token)
            {
                best = Some(st);
            }
            std::ops::ControlFlow::Continue(())
        });
        match listed {
            Ok(()) => {}
            Err(Errno::ENOENT) => return Ok(Found::Nothing),
            // Not a directory: something in the way (never opened, never read as "no state").
            Err(Errno::ENOTDIR) | Err(Errno::ELOOP) => {
                return match fstatat(self.dir, self.name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(st) => Err(crate::files::in_the_way(
                        "lock state",
                        self.shown,
                        st.st_mode,
                        st.st_uid,
                        "the directory locksmith keeps there",
                    )),
                    // Gone between the two looks: none yet, or being started by another.
                    Err(Errno::ENOENT) => Ok(Found::Nothing),
                    Err(e) => Err(Error::path("cannot read lock state", self.shown, e.into())),
                };
            }
            Err(e) => return Err(Error::path("cannot read lock state", self.shown, e.into())),
        }
        if let Some(st) = best
            && st.token == u64::MAX
        {
            let says = format!("token {}", st.token);
            return Err(owner::no_token_after(self.shown, self.uid(), &says));
        }
        Ok(Found::Dir(best))
    }

    /// Starts the directory holding `first` (absent state: token 0, clean): made under a
    /// private name, then renamed into place, which fails once anyone's directory is there
    /// (it is never empty). `Ok(false)`: someone else's directory is there.
    pub(super) fn start(&self, first: State) -> Result<bool> {
        let mut tmp = OsString::from(self.name);
        tmp.push(format!(".{}", crate::host::nonce()));
        let tmp = PathBuf::from(tmp);
        let entry = tmp.join(owner::state_entry(first));
        let fail = |e: Errno| Error::path("cannot create lock state", self.shown, e.into());
        // Whoever may write the parent may issue tokens: the parent's bits (umask aside), or
        // `file_mode`'s.
        let mode = super::config::dir_mode(self.mode, self.dir).map_err(fail)?;
        mkdirat(self.dir, &tmp, mode).map_err(fail)?;
        let r = (|| -> Result<bool> {
            let fd = nix::fcntl::openat(
                self.dir,
                &tmp,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                FileMode::empty(),
            )
            .map_err(fail)?;
            nix::sys::stat::fchmod(&fd, mode).map_err(fail)?;
            if let Some(g) = self.group {
                nix::unistd::fchown(&fd, None, Some(nix::unistd::Gid::from_raw(g)))
                    .map_err(fail)?;
            }
            // Where the filesystem keeps no symbolic links (SMB), the entry is an empty
            // directory, as the FTP backend keeps it: renamed onto a free name, a directory
            // replaces nothing (a file renamed over one there is unlink-then-rename).
            match symlinkat(TEXT, self.dir, &entry) {
                Err(e) if super::record::call_missing(e) => {
                    mkdirat(self.dir, &entry, mode).map_err(fail)?
                }
                r => r.map_err(fail)?,
            }
            match rename_noreplace(self.dir, &tmp, self.name) {
                Ok(()) => Ok(true),
                Err(Errno::EEXIST)
                | Err(Errno::ENOTEMPTY)
                | Err(Errno::ENOTDIR)
                | Err(Errno::EISDIR) => Ok(false),
                Err(e) => Err(fail(e)),
            }
        })();
        if !matches!(r, Ok(true)) {
            if unlinkat(self.dir, &entry, UnlinkatFlags::NoRemoveDir).is_err() {
                let _ = unlinkat(self.dir, &entry, UnlinkatFlags::RemoveDir);
            }
            let _ = unlinkat(self.dir, &tmp, UnlinkatFlags::RemoveDir);
        }
        r
    }

    /// Renames the entry of `from` to `to`: `Ok(false)` when `from`'s entry is not there
    /// (someone moved the state on, or it is not started yet).
    pub(super) fn swap(&self, from: State, to: State) -> Result<bool> {
        // A holder that stalls while taking the lock (a network filesystem stalling on this
        // write): the process's first token.
        if !to.clean {
            faults::stall(Stall::Taking);
        }
        match renameat(self.dir, &self.entry(from), self.dir, &self.entry(to)) {
            Ok(()) => Ok(true),
            // GlusterFS answers ESTALE (and even ENOENT) while names in the directory change:
            // no answer; the caller reads again.
            Err(Errno::ENOENT) | Err(Errno::ESTALE) => Ok(false),
            Err(e) => Err(Error::path("cannot write lock state", self.shown, e.into())),
        }
    }
}

/// `renameat2(RENAME_NOREPLACE)` where the filesystem has it, else `renameat` (which, for a
/// directory, fails onto a non-empty one).
fn rename_noreplace(dir: BorrowedFd<'_>, from: &Path, to: &OsStr) -> nix::Result<()> {
    match nix::fcntl::renameat2(
        dir,
        from,
        dir,
        to,
        nix::fcntl::RenameFlags::RENAME_NOREPLACE,
    ) {
        Err(Errno::EINVAL) | Err(Errno::ENOSYS) => renameat(dir, from, dir, to),
        r => r,
    }
}

/// The state: the last token issued and whether that acquisition ended cleanly; `None` if no
/// token was ever issued. Something locksmith did not write at `.NAME.state` is a config
/// error naming it (tokens are never issued from it, never silently restarted).
pub fn read(at: &StateAt<'_>) -> Result<Option<State>> {
    // A reader listing while a holder renames the entry may see neither name: read again
    // before calling the directory empty.
    let mut pause = Duration::from_millis(1);
    for _ in 0..4 {
        match at.find()? {
            Found::Nothing => return Ok(None),
            Found::Dir(Some(st)) => return Ok(Some(st)),
            Found::Dir(None) => {}
        }
        std::thread::sleep(pause);
        pause *= 4;
    }
    Err(err!(
        Config,
        "lock state {} is a directory owned by {} with no state locksmith wrote in it: \
         this locksmith cannot issue a fencing token from it; remove it, and keep locks in a \
         directory only their users can write",
        at.shown.display(),
        crate::files::owner_name(at.uid())
    ))
}

/// What issuing a token gave: the token, and whether the acquisition before it ended
/// uncleanly (a lock of one slot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Issued {
    pub token: u64,
    pub prev_crashed: bool,
    /// The state was missing (a lock's first use, or a cleaner removed it) and this token
    /// starts it again from the clock ([`floor`]): above every earlier token only while the
    /// wall clock was not set back meanwhile (the OK line says `token_from=clock`).
    pub from_clock: bool,
}

impl StateAt<'_> {
    /// The state after `from` that issues `token`: marked not clean until our release — but
    /// a slot of several leaves the mark as it was (its holders release in any order, so
    /// none can say the last acquisition ended cleanly; `prev=crashed` is each slot's own).
    fn next(&self, from: State, token: u64) -> (State, Issued) {
        let several = self.slots > 1;
        let to = State {
            token,
            clean: several && from.clean,
            slots: self.slots,
        };
        let issued = Issued {
            token,
            prev_crashed: !several && !from.clean,
            from_clock: false,
        };
        (to, issued)
    }

    /// Before issuing over `from`, which records another number of slots than ours: the
    /// lock's say ([`Agree`](crate::backend::lock::Agree), SPEC §3b). The state is then
    /// moved on from exactly `from`, so a contender of the other number that issued since
    /// makes our rename fail, and we read and ask again: of two contenders that disagree,
    /// the second to issue finds the first's lock taken.
    ///
    /// Asked at every issue, over our own number too (`recorded`: `None` where the state
    /// records nothing yet, or is taken to record ours — ours stands): a lock with a
    /// waiting room looks there for a waiter of another number (`waiting.rs`; `Room::looks`
    /// says when: not over our own number on a network filesystem, whose room a look would
    /// read on the server at every acquisition).
    fn agree(&self, recorded: Option<u32>) -> Result<()> {
        let ours = self.slots.max(1);
        let before = recorded.unwrap_or(ours);
        match self.agree {
            Some(agree) => agree(before),
            None => Ok(()),
        }
    }
}

/// The absent state: clean, one slot; its token is the [`floor`] when it was read.
const FIRST: State = State {
    token: 0,
    clean: true,
    slots: 1,
};

/// Where a missing token state starts: the microseconds since the Unix epoch (the first token
/// of a new lock is `floor() + 1`). The state beside a lock goes when a cleaner
/// (systemd-tmpfiles on /tmp) removes it while nobody holds the lock, and with it every memory
/// of the tokens issued; the clock is what survives. No acquisition takes less than a
/// microsecond, so a state started again later starts above every token the lost one issued —
/// as long as the wall clock has not been set back by more than that time (the documented
/// limit; issue 28). 0 for a clock before 1970. The rule of every file backend (flock, mkdir,
/// link, symlink); FTP and S3 keep their states on a server no cleaner touches, and start at 0
/// — but S3 restarts a state a killed swap cut short from here (or the server's clock, if later).
pub fn floor() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2))
}

/// The token the next acquisition takes after reading `state` ([`read`]): one above it, or
/// above the [`floor`] where there is no state. What a locker's records carry before it takes
/// the name, then takes exactly ([`issue_exactly`]).
pub fn next_token(state: Option<State>) -> u64 {
    // find refuses u64::MAX: no overflow here.
    state.map_or_else(|| floor() + 1, |s| s.token + 1)
}

/// How far below the [`floor`] a token read as "no state" may be when [`issue_exactly`] starts
/// the state from it: at most `stale_after` ([`issue_exactly`] says why).
pub fn read_is_fresh(prev: u64, stale_after: Duration) -> bool {
    let late = u64::try_from(stale_after.as_micros()).unwrap_or(u64::MAX);
    floor().saturating_sub(prev) <= late
}

/// Issues the next token, holding the lock: the state moved from TOKEN to TOKEN+1, marked
/// not clean until our release; a missing state starts at the [`floor`] (the first token is
/// `floor() + 1`). A state that keeps moving while we hold the lock (we were broken and others
/// took it) is an error: we are not the holder — unless the lock has several slots, whose
/// holders all issue from this one state, and a move only means another slot's holder
/// issued first (each failed rename is someone else's success).
pub fn issue(at: &StateAt<'_>) -> Result<Issued> {
    let rounds = if at.slots > 1 { 200 } else { 8 };
    let mut pause = Duration::from_millis(2);
    for round in 0..rounds {
        if round > 0 {
            if at.slots > 1 {
                // Contention between slots: a short jittered pause, not a doubling one.
                std::thread::sleep(Duration::from_micros(fastrand::u64(100..2_000)));
            } else {
                std::thread::sleep(pause);
                pause *= 2;
            }
        }
        let mut fresh = false;
        let from = match at.find()? {
            Found::Dir(Some(st)) => {
                at.agree(Some(st.slots()))?;
                st
            }
            // Empty: read again (a config error if it stays so).
            Found::Dir(None) => {
                read(at)?;
                continue;
            }
            Found::Nothing => {
                // Asked before the state is started: a refusal leaves nothing.
                at.agree(None)?;
                let first = State {
                    token: floor(),
                    ..FIRST
                };
                if !at.start(first)? {
                    continue;
                }
                fresh = true;
                first
            }
        };
        // find refuses u64::MAX: no overflow here.
        let (to, issued) = at.next(from, from.token + 1);
        if at.swap(from, to)? {
            return Ok(Issued {
                from_clock: fresh,
                ..issued
            });
        }
        debug!(
            "lock state {} moved on from token {}: reading it again",
            at.shown.display(),
            from.token
        );
    }
    // Lost, not Io: a holder is never admitted on it (flock admits a holder without a token
    // only where no token can be written at all). Others kept issuing while we held: we were
    // broken, or contenders of another number of slots hold — admitted, ours would run beside
    // them, as the counter is what keeps different numbers apart (SPEC §3b).
    Err(err!(
        Lost,
        "cannot issue a fencing token for {}: its state keeps changing while we hold the lock (another holder issues from it)",
        at.shown.display()
    ))
}

/// Issues exactly `token` (the one our records already name): `Ok(None)` when the state is
/// no longer at `token - 1` (someone took and released the lock since we read it, or — with
/// several slots — another slot's holder issued it). The rename is tried straight away
/// from the names `token - 1` may have (clean first: the usual end of an acquisition; our
/// number of slots first); only when none is there is the directory listed — the state
/// moved on, it records other slots, or it is not started yet.
///
/// A state found missing starts at `token - 1` (what our records carry: the [`floor`] when we
/// read "no state", or the token of a state a cleaner removed since) — but only if that is at
/// most `stale_after` below the floor now ([`read_is_fresh`]); else the name is given back
/// (`Ok(None)`) and the caller reads again, and then starts at the floor. The argument: a
/// token issued by someone else between our read and this start is above our `token - 1`, and
/// would be repeated or undercut if we started from it. For one to be issued there, (a) we
/// were broken while holding the name — we stalled longer than `stale_after`, refused here —
/// or (b) we stalled before taking the name while another took, used and released the lock,
/// and a cleaner then removed the state it had just moved: a cleaner removes by age
/// (systemd-tmpfiles' `age`: minutes to days), not a state moved within `stale_after` (the
/// documented limit: a cleaner whose age is below `stale_after`). Not a tighter bound: an
/// acquisition slower than it (a network filesystem's first one) would give the name back at
/// every try and never take a new lock. Our own clock on both ends: no skew between hosts; one
/// set forward by more than the bound meanwhile costs one more try, one set back leaves
/// `token - 1` above the floor (taken).
pub fn issue_exactly(
    at: &StateAt<'_>,
    token: u64,
    stale_after: Duration,
) -> Result<Option<Issued>> {
    let Some(prev) = token.checked_sub(1) else {
        return Ok(None);
    };
    // Over a state that records our number (the swaps below) or none yet: the lock's say on
    // waiters of another number first, once; over another number, below.
    at.agree(None)?;
    for clean in [true, false] {
        let from = State {
            token: prev,
            clean,
            slots: at.slots,
        };
        let (to, issued) = at.next(from, token);
        if at.swap(from, to)? {
            return Ok(Some(issued));
        }
    }
    let mut fresh = false;
    let from = match at.find()? {
        Found::Nothing => {
            let first = State {
                token: prev,
                ..FIRST
            };
            if !read_is_fresh(prev, stale_after) {
                debug!(
                    "lock state {} is missing and our read of it is old: reading it again",
                    at.shown.display()
                );
                return Ok(None);
            }
            if !at.start(first)? {
                return Ok(None);
            }
            fresh = true;
            first
        }
        // Another number of slots recorded: the lock's say first.
        Found::Dir(Some(st)) if st.token == prev => {
            if st.slots() != at.slots.max(1) {
                at.agree(Some(st.slots()))?;
            }
            st
        }
        Found::Dir(Some(_)) => return Ok(None),
        // Empty: a config error if it stays so, else the state moved on.
        Found::Dir(None) => return read(at).map(|_| None),
    };
    let (to, issued) = at.next(from, token);
    Ok(at.swap(from, to)?.then_some(Issued {
        from_clock: fresh,
        ..issued
    }))
}

/// Marks our acquisition's entry clean (our release, still holding): a rename of exactly
/// our entry, so a state that moved on is left alone. A failure only makes the next holder
/// say `prev=crashed`.
pub fn mark_clean(at: &StateAt<'_>, token: u64) -> Result<()> {
    if at.slots > 1 {
        // Never marked (see StateAt::next).
        return Ok(());
    }
    let (from, to) = (State::one(token, false), State::one(token, true));
    if !at.swap(from, to)? {
        debug!(
            "lock state {} no longer at our token {token}: not marked clean",
            at.shown.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_state_starts_at_the_clock_and_a_present_one_goes_on() {
        let before = floor();
        assert!(next_token(None) > before);
        assert_eq!(next_token(Some(State::one(5, true))), 6);
    }

    #[test]
    fn a_read_of_no_state_is_fresh_for_stale_after() {
        let now = floor();
        assert!(read_is_fresh(now, Duration::from_secs(60)));
        // A clock set back meanwhile: the read is above the floor, taken.
        assert!(read_is_fresh(now + 5_000_000, Duration::from_secs(60)));
        assert!(!read_is_fresh(now - 61_000_000, Duration::from_secs(60)));
        assert!(read_is_fresh(now - 2_000_000, Duration::from_secs(60)));
        assert!(!read_is_fresh(now - 300_000, Duration::from_millis(100)));
        assert!(read_is_fresh(now - 300_000, Duration::from_secs(60)));
    }
}
