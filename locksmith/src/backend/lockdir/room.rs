//! A lock directory's waiting room on a local filesystem, `.NAME.waiting` (SPEC §3b;
//! `backend/waiting.rs` says what it is for, docs/LAYOUT.md how it is laid out; on a network
//! filesystem the room is `netroom.rs`'s).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::stat::Mode as FileMode;

use super::config::FsConfig;
use crate::backend::room::{Keeper, Place};
use crate::error::{Error, Result};
use crate::log::debug;

/// A lock's waiting room: the file `.NAME.waiting` beside a lock-directory lock, whose byte N
/// a waiter of N slots holds an OFD read lock on (docs/LAYOUT.md).
#[derive(Clone, Debug)]
pub struct DirRoom {
    /// The room's file (`path`), made with the lock's `file_mode` and `group`.
    cfg: FsConfig,
}

/// A place: the room's file, its byte N locked; the kernel gives it back when the file closes
/// or the process dies.
impl Place for File {}

impl DirRoom {
    pub fn new(cfg: FsConfig) -> DirRoom {
        DirRoom { cfg }
    }
}

impl Keeper for DirRoom {
    /// The room's file, opened (made if need be), with an OFD read lock on byte `n`.
    fn join(&self, n: u32, _by: Option<Instant>) -> Result<Option<Box<dyn Place>>> {
        let path = &self.cfg.path;
        let mode = FileMode::from_bits_truncate(self.cfg.file_mode.unwrap_or(0o666));
        let flags = OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW;
        let (file, st) = crate::files::open_regular(path, "waiting room", flags, mode)?;
        self.cfg.fix_owner(&file, &st);
        let fl = range(libc::F_RDLCK, n, 1);
        fcntl(file.as_fd(), FcntlArg::F_OFD_SETLK(&fl))
            .map_err(|e| Error::path("cannot wait in waiting room", path, e.into()))?;
        Ok(Some(Box::new(file)))
    }

    /// As the kernel answers: `F_OFD_GETLK` over every byte but `n` (a place of ours, held on
    /// byte `n`, is not among them). None, something else at its name, a file we may not
    /// open: nobody.
    fn other_than(&self, n: u32, lock: &str, _by: Option<Instant>) -> Option<u32> {
        // Opened first: a lock that never had a waiter costs one failed open(2), asked at
        // every issue.
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW;
        let opened = crate::files::open_regular_if_there(
            &self.cfg.path,
            "waiting room",
            flags,
            FileMode::empty(),
        );
        let file = match opened {
            Ok(Some((file, _))) => file,
            Ok(_) => return None,
            Err(e) => {
                debug!("lock {lock}: its waiting room: {e}; looked at as empty");
                return None;
            }
        };
        // Bytes 0..n, then n+1 to the end (a length of 0).
        for (start, len) in [(0, n), (n + 1, 0)] {
            let mut fl = range(libc::F_WRLCK, start, len);
            match fcntl(file.as_fd(), FcntlArg::F_OFD_GETLK(&mut fl)) {
                Ok(_) if fl.l_type != libc::F_UNLCK as libc::c_short => {
                    return Some(u32::try_from(fl.l_start).unwrap_or(u32::MAX));
                }
                Ok(_) => {}
                Err(e) => {
                    debug!(
                        "lock {lock}: its waiting room (descriptor {}): {e}; looked at as empty",
                        file.as_raw_fd()
                    );
                    return None;
                }
            }
        }
        None
    }

    /// One failed open(2) on a lock that never had a waiter.
    fn cheap(&self) -> bool {
        true
    }
}

/// A byte range of the room for `fcntl(2)`.
fn range(kind: libc::c_int, start: u32, len: u32) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: libc::off_t::from(start),
        l_len: libc::off_t::from(len),
        // 0 for OFD locks.
        l_pid: 0,
    }
}
