//! What wakes a waiter early, shared by the backends that poll: inotify on the lock's
//! directory (instant handoff on a local filesystem; NFS and FTP deliver no such events, so
//! the backoff timer stays on) and a pidfd of a holder on this host (instant proof of death).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

use crate::error::{Error, Result};
use crate::log::debug;
use crate::sys;

#[derive(Default)]
pub struct Wakeups {
    inotify: Option<Inotify>,
    holder: Option<(i32, OwnedFd)>,
}

impl Wakeups {
    /// Watches `dir` for entries being removed or renamed away (`IN_DELETE`,
    /// `IN_MOVED_FROM`), once. Where inotify cannot watch it, polling alone remains.
    pub fn watch_dir(&mut self, dir: &Path) -> Result<()> {
        if self.inotify.is_some() {
            return Ok(());
        }
        let ino = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(|e| Error::io("inotify_init", e.into()))?;
        match ino.add_watch(dir, AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM) {
            Ok(_) => self.inotify = Some(ino),
            Err(e) => debug!("no inotify on {}: {e}", dir.display()),
        }
        Ok(())
    }

    /// Drops pending directory events. Call it *before* trying, so that a release after
    /// the try leaves a fresh event and the wait that may follow cannot miss it.
    pub fn drain(&self) {
        if let Some(ino) = &self.inotify {
            let _ = ino.read_events();
        }
    }

    /// Watches the holder `pid` (same host) for its death. The caller re-checks liveness
    /// afterwards: the pid may have died and been reused before the pidfd existed.
    fn watch_holder(&mut self, pid: i32) {
        if self.holder.as_ref().is_some_and(|(p, _)| *p == pid) {
            return;
        }
        self.holder = sys::pidfd_open(pid).ok().map(|fd| (pid, fd));
    }

    /// Proof of death for a same-host holder, watching it while it lives: alive → watched
    /// and re-checked (the pid may have died and been reused before the pidfd existed).
    pub fn holder_alive(&mut self, pid: i32, start: u64) -> bool {
        if !crate::host::alive(pid, start) {
            return false;
        }
        self.watch_holder(pid);
        crate::host::alive(pid, start)
    }

    /// Whether the watched holder has exited (its pidfd is readable).
    pub fn holder_exited(&self) -> bool {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let Some((_, fd)) = &self.holder else {
            return false;
        };
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).is_ok_and(|n| n > 0)
    }

    pub fn forget_holder(&mut self) {
        self.holder = None;
    }

    pub fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v = Vec::with_capacity(2);
        if let Some(i) = &self.inotify {
            v.push(i.as_fd());
        }
        if let Some((_, fd)) = &self.holder {
            v.push(fd.as_fd());
        }
        v
    }
}
