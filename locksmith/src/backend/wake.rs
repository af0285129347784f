//! What wakes a waiter early, shared by the backends that poll: inotify on the lock's
//! directory (instant handoff on a local filesystem; NFS and FTP deliver no such events, so
//! the backoff timer stays on) and a pidfd of a holder on this host (instant proof of death).
//!
//! # The waiters' queue (issue 15)
//! A directory event wakes every process watching the directory. With many waiters on one
//! lock, each release woke all of them and a third raced to create the lock (100 mkdir
//! waiters: ~117 wakeups and ~43 lost creation races per handoff, 2.3 s to serve the herd),
//! and each waiter held an inotify instance, a per-user resource (128 by default) shared by
//! every program of that user. So exclusive waiters on a local filesystem first queue on a
//! `flock(2)` of `.NAME.queue` beside the lock, blocked in the kernel on a helper thread: only
//! the waiter at the front of the queue watches the directory (one inotify instance per lock,
//! one wakeup per handoff), and it leaves the queue the moment it holds the lock, which wakes
//! the next one.
//!
//! The queue only decides who watches: every waiter still tries on its backoff timer, so a
//! queue that is stuck (its front waiter stopped, a `flock` on it by anything else) makes
//! waiters poll, never wait forever, and mutual exclusion never depends on it. Where the
//! queue cannot be used (a network filesystem, a file that cannot be opened) every waiter
//! watches the directory, as before; where inotify cannot be had (its limits reached), the
//! waiter polls with backoff and says so at `-v`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use nix::fcntl::OFlag;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use nix::sys::stat::Mode as FileMode;

use crate::log::{debug, trace};
use crate::sys;

/// A blocking call on a thread of its own, for a waiter's `poll`: the thread makes the call,
/// then writes one byte to a pipe whose other end ([`fd`](Self::fd)) the waiter polls
/// beside everything else. Written once for every waiter that blocks in the kernel or on a
/// server: `flock(2)` (the flock backend, the waiters' queue), `pg_advisory_lock`.
pub struct Blocking<T> {
    rx: File,
    thread: JoinHandle<T>,
    /// Its byte was read: the call has returned (asked again, still true).
    returned: AtomicBool,
}

impl<T: Send + 'static> Blocking<T> {
    /// Starts `call` on a thread named `name` (`stack`: its stack size, where the default
    /// 2 MiB of address space is too much for a call that only blocks).
    pub fn spawn(
        name: &str,
        stack: Option<usize>,
        call: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<Blocking<T>> {
        let (rx, tx) = sys::self_pipe()?;
        let mut tx = File::from(tx);
        let mut builder = std::thread::Builder::new().name(name.into());
        if let Some(size) = stack {
            builder = builder.stack_size(size);
        }
        let thread = builder.spawn(move || {
            let answer = call();
            // Nobody waiting any more: the write fails, and the answer is dropped here.
            let _ = tx.write_all(b"!");
            answer
        })?;
        Ok(Blocking {
            rx,
            thread,
            returned: AtomicBool::new(false),
        })
    }

    /// Readable once the call has returned.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    /// Whether the call has returned, without blocking. Once true, [`join`](Self::join).
    pub fn returned(&self) -> bool {
        let mut b = [0u8; 1];
        if self.returned.load(Ordering::Relaxed) || matches!((&self.rx).read(&mut b), Ok(1)) {
            self.returned.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// The call's answer (`None`: the thread panicked).
    pub fn join(self) -> Option<T> {
        self.thread.join().ok()
    }
}

#[derive(Default)]
pub struct Wakeups {
    /// The directory to watch for releases, once asked to ([`watch_dir`](Self::watch_dir)).
    dir: Option<PathBuf>,
    /// Which entries of `dir` going away may be a release of our lock ([`woken`](Self::woken)).
    releases: Option<Releases>,
    inotify: Option<Inotify>,
    /// The watch on `dir` in `inotify`.
    wd: Option<WatchDescriptor>,
    /// inotify was tried and could not be had (said once; tried again at the next wait).
    unwatched: bool,
    queue: Queue,
    holder: Option<(i32, OwnedFd)>,
}

/// Which entries of the watched directory going away may be a release of the lock
/// waited for (the lock directory's layout says: `LockDir::releases`). Every other entry's
/// removal — another lock's release, a contender's failed try tidying its temporary name —
/// wakes the waiter only to be read and dropped, never to try.
pub type Releases = Box<dyn Fn(&std::ffi::OsStr) -> bool + Send>;

/// The waiters' queue file of a lock: `PARENT/.NAME.queue`, made with the profile's
/// `file_mode` (default `0666` less the umask, as a flock file) and `group`.
pub struct QueueAt {
    pub path: PathBuf,
    pub mode: Option<u32>,
    pub group: Option<u32>,
}

/// Where this waiter stands in the waiters' queue.
#[derive(Default)]
enum Queue {
    /// Not asked to wait yet.
    #[default]
    Out,
    /// No queue (shared mode, a network filesystem, or the file cannot be used): watch.
    Off,
    /// Blocked behind other waiters; the thread answers one byte when we are at the front.
    Behind(Turn),
    /// At the front: holding `flock(LOCK_EX)` on the queue file, watching the directory.
    Front {
        /// Holds the queue's lock while open.
        _file: Arc<File>,
    },
}

/// A thread blocked in `flock(2)` on the queue file (shared with it); its answer: whether it
/// holds the queue's lock. If we stop waiting first, the last reference to the file is the
/// thread's, dropped when the call returns: the lock passes on to the next waiter.
struct Turn {
    file: Arc<File>,
    call: Blocking<bool>,
}

impl Wakeups {
    /// Watches `dir` for entries being removed or renamed away (`IN_DELETE`,
    /// `IN_MOVED_FROM`) — at once, or, given `queue` (the queue file beside the lock, for
    /// an exclusive waiter on a local filesystem), once this waiter is at the front of the
    /// queue; `releases` names the entries whose removal may be a release. Call it after
    /// every busy attempt; it never fails: where nothing can watch, the backoff timer remains.
    pub fn watch_dir(
        &mut self,
        dir: &Path,
        queue: Option<QueueAt>,
        releases: impl FnOnce() -> Releases,
    ) {
        if self.dir.is_none() {
            self.dir = Some(dir.to_path_buf());
            self.releases = Some(releases());
        }
        if let Queue::Out = self.queue {
            self.queue = match queue.and_then(|q| join(&q)) {
                Some(q) => q,
                None => Queue::Off,
            };
            if let Queue::Behind(_) = self.queue {
                self.holder = None;
            }
        }
        if matches!(self.queue, Queue::Off | Queue::Front { .. }) {
            self.watch();
        }
    }

    /// `inotify_init1(2)` and `inotify_add_watch(2)` on the directory, once it works.
    /// Failing (the per-user limit on instances or watches reached, no inotify), the waiter
    /// polls, and tries again at its next wait: the instances of waiters served before it
    /// come free (a fair line of 300 waiters, 128 instances per user here).
    fn watch(&mut self) {
        if self.inotify.is_some() {
            return;
        }
        let Some(dir) = &self.dir else {
            return;
        };
        let r = Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK)
            .map_err(|e| ("inotify_init", e))
            .and_then(|ino| {
                ino.add_watch(
                    dir.as_path(),
                    AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM,
                )
                .map(|wd| (ino, wd))
                .map_err(|e| ("inotify_add_watch", e))
            });
        match r {
            Ok((ino, wd)) => {
                self.inotify = Some(ino);
                self.wd = Some(wd);
            }
            Err((call, e)) if !self.unwatched => {
                debug!(
                    "cannot watch {} for releases ({call}: {}): polling with backoff",
                    dir.display(),
                    std::io::Error::from(e)
                );
                self.unwatched = true;
            }
            Err(_) => {}
        }
    }

    /// Drops pending directory events, and moves to the front of the queue if our turn came
    /// (watching from then on). Call it *before* trying, so that a release after the try
    /// leaves a fresh event and the wait that may follow cannot miss it.
    pub fn drain(&mut self) {
        if let Queue::Behind(turn) = &self.queue
            && turn.call.returned()
        {
            let Queue::Behind(turn) = std::mem::take(&mut self.queue) else {
                unreachable!("matched above")
            };
            self.queue = if turn.call.join() == Some(true) {
                trace!("at the front of the waiters' queue");
                Queue::Front { _file: turn.file }
            } else {
                Queue::Off
            };
            self.watch();
        }
        if let Some(ino) = &self.inotify {
            let _ = ino.read_events();
        }
    }

    /// After a wake-up: whether it is worth trying now. Reads the directory's events and
    /// drops them unless one may be a release of our lock (or the kernel's event queue
    /// overflowed); our turn in the waiters' queue and a watched holder's exit are always
    /// worth a try. Without this, each waiter watching a busy directory — every waiter of a
    /// long fair line is at the front of its own place's queue — woke for every entry any
    /// contender removed, and each of its tries removed one more (a failed mkdir removes its
    /// `.new`): 100 fair mkdir waiters were served in 2.56 s, 0.95 s with this (issue 26).
    pub fn woken(&mut self) -> bool {
        if let Queue::Behind(turn) = &self.queue
            && turn.call.returned()
        {
            // `drain`, before the try, moves us to the front.
            return true;
        }
        if self.holder_exited() {
            return true;
        }
        let (Some(ino), Some(releases)) = (&self.inotify, &self.releases) else {
            return true;
        };
        match ino.read_events() {
            Ok(events) => events.iter().any(|e| {
                e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW)
                    || e.name.as_deref().is_none_or(releases)
            }),
            // Nothing to read: woken by something else (or by nothing).
            Err(nix::errno::Errno::EAGAIN) => false,
            Err(_) => true,
        }
    }

    /// We hold the lock (or stopped waiting): leave the queue, which lets the next waiter
    /// watch, and stop watching the directory and any holder.
    pub fn done(&mut self) {
        self.queue = Queue::Out;
        self.holder = None;
        // Closing an inotify instance waits for an SRCU grace period (10–20 ms measured
        // here): not on the way from taking the lock to the OK line or the command. Its watch
        // goes now (the kernel frees the mark asynchronously: no events while we hold); the
        // instance is closed once the command runs (`sys::park_slow_close` says why).
        if let Some(ino) = self.inotify.take() {
            if let Some(wd) = self.wd.take() {
                let _ = ino.rm_watch(wd);
            }
            sys::park_slow_close(ino.into());
        }
    }

    /// Watches the holder `pid` (same host) for its death. The caller re-checks liveness
    /// afterwards: the pid may have died and been reused before the pidfd existed.
    ///
    /// Not while behind other waiters in the queue: every process watching a holder's pidfd
    /// wakes when it exits, and a holder exits right after each release in run mode. The
    /// waiter at the front watches it (and the others try on their timers).
    fn watch_holder(&mut self, pid: i32) {
        if let Queue::Behind(_) = self.queue {
            self.holder = None;
            return;
        }
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
        if let Queue::Behind(turn) = &self.queue {
            v.push(turn.call.fd());
        }
        if let Some(i) = &self.inotify {
            v.push(i.as_fd());
        }
        if let Some((_, fd)) = &self.holder {
            v.push(fd.as_fd());
        }
        v
    }
}

/// Joins the queue: at the front at once if nobody is in it, else behind, with a thread blocked in
/// `flock(2)`. `None` (no queue, every waiter watches) if the file cannot be opened as a
/// regular file or the thread cannot start; said at `-v`.
fn join(q: &QueueAt) -> Option<Queue> {
    let path = q.path.as_path();
    let flags = OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW;
    let mode = FileMode::from_bits_truncate(q.mode.unwrap_or(0o666));
    let file = match crate::files::open_regular(path, "waiters' queue", flags, mode) {
        Ok((file, st)) => {
            // Ours (we made it): the profile's mode and group, best effort, so that the
            // other users of a shared lock can queue too.
            if st.st_uid == nix::unistd::geteuid().as_raw() {
                if let Some(m) = q.mode
                    && st.st_mode & 0o7777 != m
                {
                    let _ = nix::sys::stat::fchmod(file.as_fd(), FileMode::from_bits_truncate(m));
                }
                if let Some(g) = q.group
                    && st.st_gid != g
                {
                    let gid = Some(nix::unistd::Gid::from_raw(g));
                    let _ = nix::unistd::fchown(file.as_fd(), None, gid);
                }
            }
            file
        }
        Err(e) => {
            debug!("{e}; waiting without the queue");
            return None;
        }
    };
    match file.try_lock() {
        Ok(()) => {
            return Some(Queue::Front {
                _file: Arc::new(file),
            });
        }
        Err(std::fs::TryLockError::WouldBlock) => {}
        Err(std::fs::TryLockError::Error(e)) => {
            debug!("flock {}: {e}; waiting without the queue", path.display());
            return None;
        }
    }
    let r = (|| -> std::io::Result<Queue> {
        let file = Arc::new(file);
        let shared = file.clone();
        // Our waiter gone (it holds the lock, or gave up): the file closes on the thread,
        // passing the queue on.
        let call = Blocking::spawn("queue-wait", Some(64 * 1024), move || shared.lock().is_ok())?;
        Ok(Queue::Behind(Turn { file, call }))
    })();
    r.map_err(|e| {
        debug!(
            "cannot queue at {}: {e}; waiting without the queue",
            path.display()
        )
    })
    .ok()
}
