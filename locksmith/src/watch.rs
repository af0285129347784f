//! What ends a hold or a wait: the stdout pipe losing its readers, the parent process dying,
//! stdin hanging up (`--watch-stdin`), a signal, or a backend event. One `poll(2)` covers
//! them all, so release is event-driven and a holder without heartbeat never wakes.

use std::fmt;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, IntoRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::Signal;

use crate::error::{Error, Result};
use crate::log::{debug, trace};
use crate::{protocol, sys};

/// Why the helper must stop holding (or stop waiting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Every reader of stdout closed it.
    PipeClosed,
    /// The original parent process exited.
    ParentDied,
    /// `--watch-stdin`: stdin reached end-of-file.
    StdinClosed,
    /// SIGTERM, SIGINT or SIGHUP.
    Signal(Signal),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::PipeClosed => f.write_str("the stdout pipe was closed"),
            Cause::ParentDied => f.write_str("the parent process exited"),
            Cause::StdinClosed => f.write_str("stdin was closed"),
            Cause::Signal(s) => write!(f, "{s} received"),
        }
    }
}

/// What `Watcher::wait` saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    Release(Cause),
    /// One of the extra descriptors passed to `wait` became ready.
    Ready,
    Timeout,
}

/// Which causes to watch.
#[derive(Clone, Copy, Debug, Default)]
pub struct WatchOpts {
    /// Watch stdout for its readers going away (hold mode).
    pub stdout: bool,
    /// Watch stdin for hang-up (`--watch-stdin`).
    pub stdin: bool,
    /// Watch the original parent process.
    pub parent: bool,
}

const SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP];

pub struct Watcher {
    stdout: bool,
    stdin: bool,
    parent: Option<Parent>,
    /// One self-pipe for every signal watched: its handler writes the signal's number.
    signals: std::fs::File,
}

struct Parent {
    pid: i32,
    /// `None` where `pidfd_open` is unavailable (Linux < 5.3): then `getppid()` is checked
    /// at least every 100 ms instead.
    pidfd: Option<OwnedFd>,
}

/// Fallback re-check period where there is no pidfd.
const PARENT_RECHECK: Duration = Duration::from_millis(100);

impl Watcher {
    /// Installs the signal handlers and opens the parent's pidfd. Call it before taking the
    /// lock, so that a signal never kills the helper with the lock half-taken.
    pub fn new(opts: WatchOpts) -> Result<Watcher> {
        let what = "cannot make the pipe that watches for signals";
        let (signals, tx) = sys::self_pipe().map_err(|e| Error::io(what, e))?;
        // The handlers may run at any time from now on, for the whole process: the writing
        // end stays open for as long (one descriptor per watcher made).
        let tx = tx.into_raw_fd();
        for sig in SIGNALS {
            sys::signal_to_pipe(sig as i32, tx)
                .map_err(|e| Error::io(format!("installing a {sig} handler"), e))?;
        }
        let parent = if opts.parent {
            let pid = nix::unistd::getppid().as_raw();
            let pidfd = match sys::pidfd_open(pid) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    debug!("pidfd_open({pid}) failed ({e}); re-checking getppid() instead");
                    None
                }
            };
            Some(Parent { pid, pidfd })
        } else {
            None
        };
        Ok(Watcher {
            stdout: opts.stdout && is_pipe_or_socket(protocol::stdout_for_polling().as_fd()),
            stdin: opts.stdin && is_pipe_or_socket(io::stdin().as_fd()),
            parent,
            signals,
        })
    }

    /// Stops watching the parent (run mode, once CMD runs: like flock(1), the command's
    /// life decides, not the caller's).
    pub fn forget_parent(&mut self) {
        self.parent = None;
    }

    /// Waits until a release cause, one of the `extra` descriptors being readable, or
    /// `timeout`. Release causes win over `Ready` when both happen at once.
    pub fn wait(&mut self, extra: &[BorrowedFd<'_>], timeout: Option<Duration>) -> Result<Event> {
        self.wait_for(extra, timeout, false)
    }

    /// Waits until stdout can take a protocol line without blocking (`POLLOUT`: for a pipe,
    /// a free buffer page, and a line is shorter than `PIPE_BUF`), or a release cause. A
    /// parent that does not read its pipe then cannot hold the helper in `write(2)`, deaf to
    /// signals and to its parent's death (issue 15). `Ready` means: write now.
    pub fn wait_writable(&mut self) -> Result<Event> {
        self.wait_for(&[], None, true)
    }

    /// [`wait_writable`](Self::wait_writable), or `Timeout` after `timeout`.
    pub fn wait_writable_for(&mut self, timeout: Option<Duration>) -> Result<Event> {
        self.wait_for(&[], timeout, true)
    }

    fn wait_for(
        &mut self,
        extra: &[BorrowedFd<'_>],
        timeout: Option<Duration>,
        writable: bool,
    ) -> Result<Event> {
        let start = Instant::now();
        loop {
            if let Some(cause) = self.parent_gone() {
                return Ok(Event::Release(cause));
            }
            let mut slice = timeout.map(|t| t.saturating_sub(start.elapsed()));
            if self.parent.as_ref().is_some_and(|p| p.pidfd.is_none()) {
                slice = Some(slice.map_or(PARENT_RECHECK, |s| s.min(PARENT_RECHECK)));
            }
            let stdin = io::stdin();
            let stdout = protocol::stdout_for_polling();
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(8);
            // Requesting no events still reports POLLERR/POLLHUP: the readers of our stdout
            // pipe are gone (POLLERR) or the writer of stdin is (POLLHUP). We never read stdin.
            let i_stdout = (self.stdout || writable).then(|| {
                let ev = if writable {
                    PollFlags::POLLOUT
                } else {
                    PollFlags::empty()
                };
                push(&mut fds, stdout.as_fd(), ev)
            });
            let i_stdin = self
                .stdin
                .then(|| push(&mut fds, stdin.as_fd(), PollFlags::empty()));
            let i_parent = self
                .parent
                .as_ref()
                .and_then(|p| p.pidfd.as_ref())
                .map(|fd| push(&mut fds, fd.as_fd(), PollFlags::POLLIN));
            let i_sig = push(&mut fds, self.signals.as_fd(), PollFlags::POLLIN);
            let i_extra = fds.len();
            for fd in extra {
                push(&mut fds, *fd, PollFlags::POLLIN);
            }
            let ms = match slice {
                None => PollTimeout::NONE,
                // Round up: a timeout rounded down to 0 ms would spin.
                Some(d) => {
                    PollTimeout::try_from(d.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX)
                }
            };
            match poll(&mut fds, ms) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(e) => return Err(Error::io("poll", e.into())),
            }
            let fired = |i: Option<usize>| {
                i.and_then(|i| fds[i].revents())
                    .is_some_and(|r| !r.is_empty())
            };
            if fired(Some(i_sig)) {
                drop(fds);
                if let Some(sig) = self.pending_signal() {
                    trace!("{sig} received");
                    return Ok(Event::Release(Cause::Signal(sig)));
                }
                continue;
            }
            let out = i_stdout
                .and_then(|i| fds[i].revents())
                .unwrap_or(PollFlags::empty());
            if out.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL) {
                return Ok(Event::Release(Cause::PipeClosed));
            }
            if fired(i_parent) {
                return Ok(Event::Release(Cause::ParentDied));
            }
            if fired(i_stdin) {
                return Ok(Event::Release(Cause::StdinClosed));
            }
            if writable && out.contains(PollFlags::POLLOUT) {
                return Ok(Event::Ready);
            }
            if (i_extra..i_extra + extra.len()).any(|i| fired(Some(i))) {
                return Ok(Event::Ready);
            }
            if timeout.is_some_and(|t| start.elapsed() >= t) {
                return Ok(Event::Timeout);
            }
        }
    }

    /// Takes the next pending signal without blocking: `Some(signal)` for each that arrived,
    /// in the order they arrived.
    pub fn pending_signal(&mut self) -> Option<Signal> {
        let mut number = [0u8; 1];
        while let Ok(1) = self.signals.read(&mut number) {
            if let Some(sig) = SIGNALS.into_iter().find(|s| *s as u8 == number[0]) {
                return Some(sig);
            }
        }
        None
    }

    /// The `getppid()` re-check: the pidfd was opened on the original parent's pid, but that
    /// parent may have died (and we been re-parented) before the pidfd existed.
    fn parent_gone(&self) -> Option<Cause> {
        let p = self.parent.as_ref()?;
        (nix::unistd::getppid().as_raw() != p.pid).then_some(Cause::ParentDied)
    }
}

fn push<'a>(fds: &mut Vec<PollFd<'a>>, fd: BorrowedFd<'a>, ev: PollFlags) -> usize {
    fds.push(PollFd::new(fd, ev));
    fds.len() - 1
}

fn is_pipe_or_socket(fd: BorrowedFd<'_>) -> bool {
    nix::sys::stat::fstat(fd)
        .map(|st| {
            let ft = st.st_mode & libc::S_IFMT;
            ft == libc::S_IFIFO || ft == libc::S_IFSOCK
        })
        .unwrap_or(false)
}
