//! The few system calls that neither std nor nix wraps safely. Every `unsafe` block here
//! carries a `// SAFETY:` line; the rest of the crate stays `unsafe`-free.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
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

/// `clock_gettime(CLOCK_BOOTTIME)`: monotonic time that keeps counting through suspend,
/// so a holder that slept notices how long it was away.
pub fn boottime() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is available on Linux >= 2.6.39");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// Configures a `run` child: optionally die with locksmith (`PR_SET_PDEATHSIG`, re-checked
/// against `getppid()`), optionally a process group of its own, and optionally keep one
/// descriptor open across `exec` (the flock descriptor). Only the parent-death signal needs
/// a `pre_exec` hook; without one std can use the cheaper `posix_spawn`.
pub fn configure_child(
    cmd: &mut std::process::Command,
    die_with_parent: bool,
    own_group: bool,
    inherit: Option<std::os::fd::BorrowedFd<'_>>,
) -> io::Result<()> {
    use nix::fcntl::{F_GETFD, F_SETFD, FdFlag, fcntl};
    use std::os::unix::process::CommandExt;
    if own_group {
        cmd.process_group(0);
    }
    if let Some(fd) = inherit {
        // Cleared in locksmith itself: it execs nothing else, and the command must inherit it.
        let flags = FdFlag::from_bits_truncate(fcntl(fd, F_GETFD)?);
        fcntl(fd, F_SETFD(flags - FdFlag::FD_CLOEXEC))?;
    }
    if !die_with_parent {
        return Ok(());
    }
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid, _exit); it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before the prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(127);
            }
            Ok(())
        });
    }
    Ok(())
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
