//! A lock directory's waiting room on a network filesystem (SPEC §3b; `backend/waiting.rs`
//! says what a room is for, docs/LAYOUT.md how this one is laid out): the directory
//! `.NAME.waiting.d/` beside the lock, holding an empty directory per waiter named
//! `place~N~TAG~PID~START~NONCE~T` ([`stamped_stem`]: who keeps it, and when it last renamed
//! it) — as `ftp`'s room, for the same reasons: byte-range locks (the local room's,
//! `room.rs`) are what these backends are used to keep out of (a lock manager that may not be
//! there, or lose them), and the filesystem's clock is no one's to trust.
//!
//! - A waiter makes its place after its first busy try (`waiting.rs`), renames it to a new T
//!   every heartbeat period, and removes it when it stops waiting, or — having taken the
//!   lock — on a thread beside its OK line that its release waits for. A name it may have
//!   left (a call whose answer was unclear: GlusterFS and NFS answer `ENOENT` or `ESTALE` for
//!   a rename that landed) is forgotten only once an `rmdir` of it says it is gone. A directory, as the
//!   mkdir lock's: `mkdir(2)` is the one call every network filesystem here makes atomic
//!   (SMB has no links).
//! - The room itself stays, as the local room's file does: a mount that cached its name
//!   (sshfs's, 20 s by default) would show a removed room as there, and no place could be
//!   made in it through that mount until the cache let go.
//! - A place lives while its T is within twice `stale_after` of the looker's clock and its
//!   maker is not proven dead on this host ([`judge_stamped`]); a joiner first removes up to
//!   [`TIDIED`](crate::backend::room::TIDIED) places that do not (`rmdir` of the exact name: a live waiter's rename since
//!   makes it fail, whatever a stale listing showed). Tidying is best effort: it fails
//!   nothing.
//! - The lock's own server, locking its local directory, keeps the local room
//!   (`.NAME.waiting`, `room.rs`), which its clients' rooms do not see: a lock shared between
//!   a server and its clients keeps waiters' numbers among the clients only.
//! - A contender looks (a `readdir` of the room) only where the lock records another number
//!   than its own (`cheap` is false: a look is a round trip to the server).
//! - **Another user** who may write the lock's directory may make the room, put places in it
//!   (keeping the lock's number from changing while nobody holds it: the refusal says which
//!   number it claims) or remove ours (losing our number): a courtesy to waiters, never
//!   exclusion. Nothing here follows a symbolic link or opens a file: at `.NAME.waiting.d`
//!   only a directory is used; a place name taken by something else is a failed `mkdir(2)`.

use std::ffi::{CString, OsStr, OsString};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{OFlag, open, openat, renameat};
use nix::sys::stat::{Mode as FileMode, fchmod, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::config::{FsConfig, dir_mode};
use super::record::unstale;
use crate::backend::lock::Named;
use crate::backend::room::{
    Keeper, Place, judge_stamped, other_number, stamped, stamped_stem, tidy,
};
use crate::error::{Error, Result};
use crate::log::{debug, info};

/// The room of a lock on a network filesystem.
#[derive(Clone, Debug)]
pub struct NetRoom {
    /// The lock's directory (opened once per join or look).
    parent: PathBuf,
    /// `.NAME.waiting.d`.
    name: OsString,
    /// The room as messages name it.
    shown: PathBuf,
    /// The lock's `file_mode` and `group`: the room is made as a state directory is
    /// ([`dir_mode`]), so that whoever may take the lock may wait; places are made with the
    /// same mode (less the umask).
    file_mode: Option<u32>,
    group: Option<u32>,
    stale_after: Duration,
    heartbeat: Duration,
    /// This acquisition's nonce, in its place's name.
    acquisition: String,
}

impl NetRoom {
    /// The room of the lock `cfg` (the lock's own settings, not a slot's).
    pub fn new(cfg: &FsConfig, named: &Named) -> NetRoom {
        let name = cfg.waiting_dir();
        let parent = cfg
            .path
            .parent()
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        NetRoom {
            shown: parent.join(&name),
            parent,
            name,
            file_mode: cfg.file_mode,
            group: cfg.group,
            stale_after: named.common.stale_after,
            heartbeat: named.common.heartbeat(),
            acquisition: named.acquisition.clone(),
        }
    }

    fn fail(&self, what: &str, e: Errno) -> Error {
        Error::path(what, &self.shown, e.into())
    }

    /// The lock's directory.
    fn open_parent(&self) -> Result<OwnedFd> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        unstale(|| open(&self.parent, flags, FileMode::empty()))
            .map_err(|e| Error::path("cannot open", &self.parent, e.into()))
    }

    /// The room, if it is there (a directory; nothing else at its name is followed or
    /// opened: a symbolic link is `ELOOP`, a FIFO or file `ENOTDIR`).
    fn open_room(&self, parent: BorrowedFd<'_>) -> nix::Result<OwnedFd> {
        let flags = OFlag::O_RDONLY
            | OFlag::O_DIRECTORY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        unstale(|| openat(parent, self.name.as_os_str(), flags, FileMode::empty()))
    }

    /// The room, made if it is missing (it stays once made: opened first, one call where it
    /// is there — every heartbeat's rename goes through here).
    fn room(&self, parent: BorrowedFd<'_>) -> Result<OwnedFd> {
        match self.open_room(parent) {
            Err(Errno::ENOENT) => {}
            r => return r.map_err(|e| self.fail("cannot open waiting room", e)),
        }
        let mode = dir_mode(self.file_mode, parent)
            .map_err(|e| Error::path("cannot stat", &self.parent, e.into()))?;
        let made = match unstale(|| mkdirat(parent, self.name.as_os_str(), mode)) {
            Ok(()) => true,
            // A racer made it meanwhile.
            Err(Errno::EEXIST) => false,
            Err(e) => return Err(self.fail("cannot make waiting room", e)),
        };
        let room = self
            .open_room(parent)
            .map_err(|e| self.fail("cannot open waiting room", e))?;
        if made {
            // Past the umask, as the state directory is; best effort.
            let _ = fchmod(room.as_fd(), mode);
            if let Some(g) = self.group {
                let gid = Some(nix::unistd::Gid::from_raw(g));
                let _ = nix::unistd::fchown(room.as_fd(), None, gid);
            }
        }
        Ok(room)
    }

    /// The places in `room`: each name with its number of slots and whether it lives.
    fn places(&self, room: BorrowedFd<'_>) -> Result<Vec<(OsString, u32, bool)>> {
        let mut found = Vec::new();
        let listed = unstale(|| {
            found.clear();
            crate::files::each_name(room, ".", OFlag::O_NOFOLLOW, |name| {
                let name = OsStr::from_bytes(name.to_bytes());
                let judged = name
                    .to_str()
                    .and_then(|s| judge_stamped(s, self.stale_after));
                if let Some((n, live)) = judged {
                    found.push((name.to_os_string(), n, live));
                }
                ControlFlow::Continue(())
            })
        });
        listed.map_err(|e| self.fail("cannot list waiting room", e))?;
        Ok(found)
    }

    /// Removes up to [`TIDIED`](crate::backend::room::TIDIED) places that do not live ([`tidy`]).
    fn tidy(&self, room: BorrowedFd<'_>) -> Result<()> {
        tidy(self.places(room)?, |name| {
            let path = self.shown.join(name);
            match unstale(|| unlinkat(room, name.as_os_str(), UnlinkatFlags::RemoveDir)) {
                Ok(()) => {
                    info!("removed a dead waiter's place {}", path.display());
                    Ok(true)
                }
                Err(e) => {
                    debug!("{}: {e}", path.display());
                    Ok(false)
                }
            }
        })
    }
}

impl Keeper for NetRoom {
    /// Tidies (best effort), then makes our place.
    fn join(&self, n: u32, _by: Option<Instant>) -> Result<Option<Box<dyn Place>>> {
        let parent = self.open_parent()?;
        if let Err(e) = self
            .room(parent.as_fd())
            .and_then(|room| self.tidy(room.as_fd()))
        {
            debug!("{e}; dead waiters' places are left to the next waiter");
        }
        let mut place = NetPlace {
            room: self.clone(),
            parent,
            stem: stamped_stem(n, &self.acquisition),
            names: Vec::new(),
            written: Instant::now(),
        };
        place.write()?;
        Ok(Some(Box::new(place)))
    }

    fn other_than(&self, n: u32, lock: &str, _by: Option<Instant>) -> Option<u32> {
        let found = self
            .open_parent()
            .and_then(|parent| match self.open_room(parent.as_fd()) {
                Ok(room) => self.places(room.as_fd()),
                Err(Errno::ENOENT) => Ok(Vec::new()),
                Err(e) => Err(self.fail("cannot open waiting room", e)),
            });
        other_number(found, n, lock)
    }

    /// A `readdir` on the server: only where another number is recorded.
    fn cheap(&self) -> bool {
        false
    }
}

/// A waiter's place: its directory in the room.
struct NetPlace {
    room: NetRoom,
    /// The lock's directory, opened when the place was taken.
    parent: OwnedFd,
    /// The name but for its T.
    stem: String,
    /// The place's names that may exist, the one in use last: forgotten only once renamed
    /// away or removed.
    names: Vec<CString>,
    /// When it was last written (tried).
    written: Instant,
}

impl NetPlace {
    /// Makes the place, or renames it to a new T; made again where it is gone (a joiner whose
    /// clock judged it dead, the room removed by someone).
    fn write(&mut self) -> Result<()> {
        self.written = Instant::now();
        let next = CString::new(stamped(&self.stem)).expect("a place's name has no NUL");
        if self.names.last() == Some(&next) {
            return Ok(());
        }
        let room = self.room.room(self.parent.as_fd())?;
        if let Some(old) = self.names.last().cloned() {
            match unstale(|| renameat(room.as_fd(), old.as_c_str(), room.as_fd(), next.as_c_str()))
            {
                Ok(()) => {
                    self.names.retain(|n| *n != old);
                    self.names.push(next);
                    return Ok(());
                }
                // Gone (or so a network filesystem says of a rename that landed): made anew,
                // the old name kept to be removed.
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(self.room.fail("cannot renew a place in waiting room", e)),
            }
        }
        let mode = dir_mode(self.room.file_mode, self.parent.as_fd())
            .map_err(|e| Error::path("cannot stat", &self.room.parent, e.into()))?;
        self.names.push(next.clone());
        match unstale(|| mkdirat(room.as_fd(), next.as_c_str(), mode)) {
            // Ours (the name carries our nonce): a call that landed before.
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(self.room.fail("cannot make a place in waiting room", e)),
        }
    }
}

impl Place for NetPlace {
    fn keep(&mut self, _by: Option<Instant>) -> Result<()> {
        if self.written.elapsed() < self.room.heartbeat {
            return Ok(());
        }
        self.write()
    }

    /// Never less than a quarter period: a place lives for twice `stale_after`.
    fn keep_within(&self) -> Option<Duration> {
        let heartbeat = self.room.heartbeat;
        Some(
            heartbeat
                .saturating_sub(self.written.elapsed())
                .max(heartbeat / 4),
        )
    }

    /// A round trip to the server or two.
    fn leaves_slowly(&self) -> bool {
        true
    }
}

impl Drop for NetPlace {
    /// `rmdir` of each name the place may have, the one in use first (the room stays).
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.names);
        if names.is_empty() {
            return;
        }
        let room = match self.room.open_room(self.parent.as_fd()) {
            Ok(room) => room,
            Err(e) => {
                return debug!(
                    "{}: {e}; our place stays until it is silent",
                    self.room.shown.display()
                );
            }
        };
        for name in names.iter().rev() {
            match unstale(|| unlinkat(room.as_fd(), name.as_c_str(), UnlinkatFlags::RemoveDir)) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => info!(
                    "cannot give back our place {}: {e}; it stays until it is silent",
                    self.room
                        .shown
                        .join(OsStr::from_bytes(name.as_bytes()))
                        .display()
                ),
            }
        }
    }
}
