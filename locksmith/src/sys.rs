//! The few system calls that neither std nor nix wraps safely. Every `unsafe` block here
//! carries a `// SAFETY:` line; the rest of the crate stays `unsafe`-free.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `pidfd_open(2)`: a descriptor that becomes readable when process `pid` exits.
///
/// # References
/// - <https://man7.org/linux/man-pages/man2/pidfd_open.2.html>
pub fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with integer arguments; it returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `fcntl(F_NOTIFY)` (dnotify): `SIGIO` for this process whenever a name in the directory
/// `dir` is removed or renamed, until `dir` is closed. The caller handles `SIGIO` first (its
/// default action ends the process). Chosen over inotify for a holder's watch: closing an
/// inotify instance waits for an SRCU grace period (8–15 ms measured), which every `run`
/// would pay at its end; dnotify's group is the kernel's own (issue 28).
///
/// # References
/// - <https://man7.org/linux/man-pages/man2/fcntl.2.html> ("File and directory change
///   notification")
pub fn dir_notify(dir: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // <linux/fcntl.h> (the libc crate lacks them): DN_DELETE, DN_RENAME, DN_MULTISHOT.
    const DN_DELETE: u32 = 0x0000_0008;
    const DN_RENAME: u32 = 0x0000_0010;
    const DN_MULTISHOT: u32 = 0x8000_0000;
    let events = (DN_DELETE | DN_RENAME | DN_MULTISHOT) as libc::c_int;
    // SAFETY: fcntl on a descriptor we borrow, with an integer argument; no memory passed.
    if unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_NOTIFY, events) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What std's start-up does that locksmith relies on, for an executable with its own C
/// `main` (`main.rs`): descriptors 0, 1 and 2 that are not open are opened on `/dev/null` —
/// else the first file locksmith opens (a lock file) could become its stdout and receive the
/// OK line — and SIGPIPE is ignored, so that a write to a pipe nobody reads is `EPIPE`, not
/// death with the lock held. (Commands still start with SIGPIPE's default action: std resets
/// it in every child it spawns.) Aborts if a closed descriptor cannot be opened, as std does.
pub fn init_process() {
    // SAFETY: poll, fcntl, open and signal on plain values and a local array; nothing else
    // runs yet (no thread, no handler).
    unsafe {
        let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        });
        let closed: [bool; 3] = loop {
            if libc::poll(fds.as_mut_ptr(), 3, 0) >= 0 {
                break fds.map(|p| p.revents & libc::POLLNVAL != 0);
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // poll itself unusable (an rlimit of 0 descriptors, say): ask each one.
                _ => {
                    break [0, 1, 2].map(|fd| {
                        libc::fcntl(fd, libc::F_GETFD) == -1
                            && io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
                    });
                }
            }
        };
        // In order: open(2) returns the lowest free descriptor, the one being filled.
        for closed in closed {
            if closed && libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) == -1 {
                libc::abort();
            }
        }
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// A self-pipe for `poll`: `pipe2(2)`, both ends non-blocking and close-on-exec — a third of
/// a socket pair's cost (no sockets, no credentials to take and free; issue 29).
pub fn self_pipe() -> io::Result<(std::fs::File, OwnedFd)> {
    let (rx, tx) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
    Ok((std::fs::File::from(rx), tx))
}

/// Installs a handler for `sig` that writes the signal's number, one byte, to the
/// [`self_pipe`] end `fd`. `fd` must stay open for as long as the handler is registered (for
/// the rest of the process, unless the returned id is unregistered): it may run at any time.
/// A full pipe drops the byte; those already in it still wake the poll. A pipe whose reading
/// end is gone answers `EPIPE` (`SIGPIPE` is ignored: [`init_process`], and std's start-up).
pub fn signal_to_pipe(sig: libc::c_int, fd: RawFd) -> io::Result<signal_hook::SigId> {
    let number = sig as u8;
    // SAFETY: the action calls only write(2), which is async-signal-safe (the registry saves
    // errno around it), on a non-blocking descriptor the caller keeps open while registered.
    unsafe {
        signal_hook::low_level::register(sig, move || {
            libc::write(fd, (&raw const number).cast(), 1);
        })
    }
}

/// Descriptors whose last close is slow, parked until no child can inherit them
/// ([`park_slow_close`]).
static PARKED: std::sync::Mutex<Vec<OwnedFd>> = std::sync::Mutex::new(Vec::new());

/// Parks `fd` (an inotify instance) until [`close_parked`]. Closing the last reference to an
/// inotify instance waits for the kernel's fsnotify SRCU grace period (10–20 ms here). Closed
/// on a thread right away, it would still be open in a command spawned meanwhile (the thread
/// may not have run yet when `posix_spawn` copies the descriptor table), and then the command's
/// `execve` closes the last reference and waits — and with it locksmith, which `vfork` holds
/// until the exec is done: a 10–30 ms stall between taking a lock and running CMD, measured on
/// every contended handoff of the lock-directory backends (issue 29).
pub fn park_slow_close(fd: OwnedFd) {
    if let Ok(mut parked) = PARKED.lock() {
        parked.push(fd);
    }
}

/// The parked descriptors' numbers, for a child to close before its `execve`
/// ([`crate::spawn::spawn`]): its copies then go while locksmith, suspended by `vfork`, still
/// holds its own, so the child's close is never the last and never waits. An `FD_CLOEXEC`
/// copy would go only after `vfork` let locksmith go on (the kernel closes it as the exec
/// ends, lazily): [`close_parked`]'s thread could close first, and the command waited for the
/// grace period before its first instruction — in 208 of 600 contended handoffs of two
/// `run mkdir … -- true` loops, 270 µs on average and up to milliseconds (issue 29).
pub fn parked_fds() -> Vec<RawFd> {
    PARKED
        .lock()
        .map(|p| p.iter().map(AsRawFd::as_raw_fd).collect())
        .unwrap_or_default()
}

/// Closes the parked descriptors on a thread of their own: call it once CMD runs (the spawn
/// has returned: the child has exec'd and dropped its copies) or once nothing will be spawned.
/// Without a thread (none can start), they are closed here.
pub fn close_parked() {
    let fds = match PARKED.lock() {
        Ok(mut parked) if !parked.is_empty() => std::mem::take(&mut *parked),
        _ => return,
    };
    let _ = std::thread::Builder::new()
        .name("slow-close".into())
        .stack_size(16 * 1024)
        .spawn(move || drop(fds));
}

/// `clock_gettime(CLOCK_BOOTTIME)`: monotonic time that keeps counting through suspend,
/// so a holder that slept notices how long it was away.
pub fn boottime() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is available on Linux >= 2.6.39");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// `signal(2)`: SIGTERM, SIGINT and SIGHUP back to their default action (terminate). Called
/// when nothing is held any more and only a last line is left to write: if the parent does
/// not read its pipe, that write may block, and a signal must still end the process.
pub fn default_termination_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: installs the default disposition; no handler code runs.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

/// What [`lock_fd`] does to a descriptor: flock(1)'s `-s`, `-x` and `-u`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockOp {
    Shared,
    Exclusive,
    Unlock,
}

/// The `SIGALRM` handler of [`lock_fd`]: it only interrupts the blocked call.
extern "C" fn interrupt(_: libc::c_int) {}

/// One lock call on `fd`: flock(2), or with `ofd` an open file description lock
/// (`F_OFD_SETLK`/`F_OFD_SETLKW` over the whole file, as `flock --fcntl`).
fn lock_call(fd: RawFd, op: LockOp, block: bool, ofd: bool) -> io::Result<()> {
    let r = if ofd {
        // SAFETY: a zeroed `struct flock` is a valid value; its fields are set below.
        let mut arg: libc::flock = unsafe { std::mem::zeroed() };
        arg.l_type = match op {
            LockOp::Shared => libc::F_RDLCK,
            LockOp::Exclusive => libc::F_WRLCK,
            LockOp::Unlock => libc::F_UNLCK,
        } as libc::c_short;
        arg.l_whence = libc::SEEK_SET as libc::c_short;
        let cmd = if block {
            libc::F_OFD_SETLKW
        } else {
            libc::F_OFD_SETLK
        };
        // SAFETY: `arg` outlives the call; fcntl only reads it for these commands.
        unsafe { libc::fcntl(fd, cmd, &arg) }
    } else {
        let mut how = match op {
            LockOp::Shared => libc::LOCK_SH,
            LockOp::Exclusive => libc::LOCK_EX,
            LockOp::Unlock => libc::LOCK_UN,
        };
        if !block {
            how |= libc::LOCK_NB;
        }
        // SAFETY: plain syscall with integer arguments; a bad `fd` is EBADF, not UB.
        unsafe { libc::flock(fd, how) }
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// flock(1)'s locking of a descriptor the caller may own (`flock -n 4`): `Ok(true)` when
/// locked (or unlocked), `Ok(false)` on a conflict (`timeout` zero: tried once) or when
/// `timeout` passed. Waiting blocks in the kernel, interrupted by `SIGALRM` from an interval
/// timer (first at the deadline, then every 20 ms, so a signal that lands before the call
/// blocks is not the only one); the call is never retried once the deadline has passed,
/// and a lock the kernel grants is kept, whenever it comes.
pub fn lock_fd(fd: RawFd, op: LockOp, ofd: bool, timeout: Option<Duration>) -> io::Result<bool> {
    let conflict =
        |e: &io::Error| matches!(e.raw_os_error(), Some(libc::EWOULDBLOCK | libc::EACCES));
    let Some(timeout) = timeout else {
        loop {
            match lock_call(fd, op, true, ofd) {
                Ok(()) => return Ok(true),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
        }
    };
    if timeout.is_zero() {
        return match lock_call(fd, op, false, ofd) {
            Ok(()) => Ok(true),
            Err(e) if conflict(&e) => Ok(false),
            Err(e) => Err(e),
        };
    }
    let deadline = std::time::Instant::now() + timeout;
    let tv = |d: Duration| libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: a zeroed sigaction is valid; the handler is an `extern "C"` function that
    // touches nothing (async-signal-safe), installed without SA_RESTART so that the
    // blocked call returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = interrupt as *const () as libc::sighandler_t;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    let timer = libc::itimerval {
        it_value: tv(timeout.max(Duration::from_micros(1))),
        it_interval: tv(Duration::from_millis(20)),
    };
    // SAFETY: setitimer reads `timer` and writes nothing (null old value).
    if unsafe { libc::setitimer(libc::ITIMER_REAL, &timer, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let r = loop {
        match lock_call(fd, op, true, ofd) {
            Ok(()) => break Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                if std::time::Instant::now() >= deadline {
                    break Ok(false);
                }
            }
            Err(e) => break Err(e),
        }
    };
    let off = libc::itimerval {
        it_value: tv(Duration::ZERO),
        it_interval: tv(Duration::ZERO),
    };
    // SAFETY: as above. The no-op handler stays: an alarm already pending must not kill us
    // (exec puts the default action back for the command).
    unsafe {
        libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut());
    }
    r
}

/// `fcntl(fd, F_SETFD)`: whether `fd` (a descriptor of the caller's, by number) is closed
/// across exec. An error (EBADF) is the caller's to report.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: plain syscalls with integer arguments.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFD);
        if flags < 0 {
            return Err(io::Error::last_os_error());
        }
        let flags = if on {
            flags | libc::FD_CLOEXEC
        } else {
            flags & !libc::FD_CLOEXEC
        };
        if libc::fcntl(fd, libc::F_SETFD, flags) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The C library's text for an OS error, without Rust's `(os error N)` (flock(1)'s words).
pub fn strerror(e: &io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(at) if e.raw_os_error().is_some() => text[..at].to_string(),
        _ => text,
    }
}
