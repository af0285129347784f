//! Starting `run`'s command. Every `unsafe` block here carries a `// SAFETY:` line.
//!
//! CMD must die with locksmith on every backend but flock (a `kill -9` of locksmith frees
//! the lock, so CMD may not run on without it): the child asks for `PR_SET_PDEATHSIG` before
//! its `execve`. std can only do that in a `pre_exec` hook, which makes it `fork`: copying
//! the page tables of a 4 MiB process and taking its copy-on-write faults cost about 0.2 ms
//! of every `run` (`run mkdir:… -- true`: 2.55 ms against 1.98 with std's vfork-based
//! `posix_spawn`, issue 29). So the child is started here as glibc's `posix_spawn` starts
//! it: `clone(CLONE_VM | CLONE_VFORK)` on a stack of its own, locksmith suspended until the
//! child has exec'd or failed, every signal blocked across the window (but glibc's two
//! internal ones, whose handlers act only on signals sent by the process itself) and every
//! handler reset to its default in the child before it unblocks them (a handler must never
//! run on the child's stack in locksmith's memory). Everything the child needs (argv, the
//! environment, the paths to try) is built beforehand: between `clone` and `execve` it only
//! makes system calls; of locksmith's memory it writes only slot 1 of the `/bin/sh` argv,
//! its `execve` error, and `errno` (the thread's, shared).
//!
//! What CMD gets is what std's `Command::spawn` gave it here — the command's program,
//! arguments and environment changes are read back from the [`Command`]; its other settings
//! (current directory, stdio, `arg0`, `process_group`, ids) are not, and `run` sets none: the
//! standard descriptors and every descriptor without `FD_CLOEXEC` inherited, locksmith's
//! environment in its order with the changes applied, an empty signal mask, `SIGPIPE` and
//! `SIGCHLD` at their defaults (std ignores SIGPIPE in locksmith; a SIGCHLD ignored by
//! locksmith's parent would have the kernel reap CMD before locksmith sees its status — as
//! flock(1), which resets it too), and `execvp(3)`'s search: `PATH` of CMD's environment
//! (`/bin:/usr/bin` without one), `EACCES` remembered while later directories are tried, and a
//! file without a `#!` line (`ENOEXEC`) run by `/bin/sh`, as flock(1) runs it.
#![allow(unsafe_code)]

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};

/// The child's stack: it makes system calls only (glibc's `posix_spawn` gives 32 KiB plus
/// the arguments).
const STACK: usize = 64 * 1024;

/// A started command.
pub struct Child {
    pid: i32,
    status: Option<ExitStatus>,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid as u32
    }

    /// Its status if it has ended (reaped once; asked again, the same status).
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Waits for it to end.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        Ok(self
            .reap(0)?
            .expect("waitpid without WNOHANG returns a status"))
    }

    fn reap(&mut self, flags: i32) -> io::Result<Option<ExitStatus>> {
        if let Some(s) = self.status {
            return Ok(Some(s));
        }
        loop {
            let mut raw = 0;
            // SAFETY: `raw` is a valid place for the status; `pid` is our own child.
            match unsafe { libc::waitpid(self.pid, &mut raw, flags) } {
                0 => return Ok(None),
                -1 => {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::EINTR) {
                        return Err(e);
                    }
                }
                _ => {
                    let s = ExitStatus::from_raw(raw);
                    self.status = Some(s);
                    return Ok(Some(s));
                }
            }
        }
    }
}

/// Starts `command` (its program, arguments and environment changes), in a process group of
/// its own when `own_group`, and dying with locksmith when `die_with_parent`
/// (`PR_SET_PDEATHSIG`, re-checked against `getppid()`). A descriptor CMD must inherit has
/// its `FD_CLOEXEC` cleared by the caller.
pub fn spawn(command: &Command, own_group: bool, die_with_parent: bool) -> io::Result<Child> {
    debug_assert!(command.get_current_dir().is_none(), "not passed on");
    let plan = Plan::new(command)?;
    default_sigchld();
    let mut args = ChildArgs {
        paths: plan.paths.iter().map(|p| p.as_ptr()).collect(),
        argv: pointers(&plan.argv),
        sh_argv: std::iter::once(SH.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .chain(plan.argv.iter().skip(1).map(|a| a.as_ptr()))
            .chain(std::iter::once(std::ptr::null()))
            .collect(),
        envp: pointers(&plan.envp),
        own_group,
        last_signal: libc::SIGRTMAX(),
        parent: if die_with_parent {
            std::process::id() as libc::pid_t
        } else {
            0
        },
        error: AtomicI32::new(0),
        closing: crate::sys::parked_fds(),
    };
    let mut stack = vec![0u8; STACK];
    // The stack grows down from its end, 16-byte aligned as the ABI wants.
    let top = {
        let end = stack.as_mut_ptr() as usize + STACK;
        (end & !15) as *mut libc::c_void
    };
    let mut all: libc::sigset_t = unsafe_zeroed();
    let mut before: libc::sigset_t = unsafe_zeroed();
    // SAFETY: valid sigset pointers; blocks every signal in this thread until the child is
    // gone from locksmith's memory (after `clone` returns), then restores the mask.
    let pid = unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut before);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut args as *mut ChildArgs).cast(),
        );
        let e = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &before, std::ptr::null_mut());
        if pid < 0 {
            return Err(e);
        }
        pid
    };
    drop(stack);
    let mut child = Child { pid, status: None };
    match args.error.load(Ordering::SeqCst) {
        0 => Ok(child),
        errno => {
            // It exited (127) without running anything: reaped here.
            let _ = child.wait();
            Err(io::Error::from_raw_os_error(errno))
        }
    }
}

const SH: &std::ffi::CStr = c"/bin/sh";

/// SIGCHLD back to its default if locksmith's parent left it ignored: an ignored SIGCHLD has
/// the kernel reap children at once, and CMD's status would be lost (`waitpid`: ECHILD).
/// A handler, were one installed, is left alone.
fn default_sigchld() {
    // SAFETY: reads and, if ignored, sets the disposition of SIGCHLD; valid pointers.
    unsafe {
        let mut old: libc::sigaction = unsafe_zeroed();
        if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
        {
            libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        }
    }
}

/// `mem::zeroed` for the plain C structs used here (a `sigset_t` is an array of words).
fn unsafe_zeroed<T: Copy>() -> T {
    // SAFETY: only used for `sigset_t` and `sigaction`, for which all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// What the child uses, all built before `clone`.
struct Plan {
    /// The files to try, in `execvp(3)`'s order.
    paths: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Plan {
    fn new(command: &Command) -> io::Result<Plan> {
        let program = command.get_program();
        let argv = std::iter::once(program)
            .chain(command.get_args())
            .map(cstring)
            .collect::<io::Result<Vec<_>>>()?;
        // CMD's environment: locksmith's with the command's changes, in order.
        let mut env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        for (k, v) in command.get_envs() {
            if k.is_empty() || k.as_bytes().contains(&b'=') {
                return Err(invalid("an environment variable's name"));
            }
            env.retain(|(key, _)| key != k);
            if let Some(v) = v {
                env.push((k.to_os_string(), v.to_os_string()));
            }
        }
        let path = env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        let envp = env
            .into_iter()
            .map(|(mut k, v)| {
                // What locksmith got is passed on as it came (an odd name included).
                k.push("=");
                k.push(v);
                cstring(&k)
            })
            .collect::<io::Result<Vec<_>>>()?;
        let paths = search(program, path.as_deref())?;
        Ok(Plan { paths, argv, envp })
    }
}

/// `execvp(3)`'s candidates for `program`: itself when it names a path (a `/` in it), else
/// `program` in each directory of `path` (an empty one is the current directory).
fn search(program: &OsStr, path: Option<&OsStr>) -> io::Result<Vec<CString>> {
    let name = program.as_bytes();
    if name.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if name.contains(&b'/') {
        return Ok(vec![cstring(program)?]);
    }
    let path = path.map_or(&b"/bin:/usr/bin"[..], |p| p.as_bytes());
    path.split(|&b| b == b':')
        .map(|dir| {
            let mut full = dir.to_vec();
            if !full.is_empty() {
                full.push(b'/');
            }
            full.extend_from_slice(name);
            cstring(OsStr::from_bytes(&full))
        })
        .collect()
}

fn cstring(s: impl AsRef<OsStr>) -> io::Result<CString> {
    CString::new(s.as_ref().to_os_string().into_vec()).map_err(|_| invalid("a NUL byte"))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("the command has {what} that cannot be passed"),
    )
}

/// NULL-terminated pointers to `strings` (which must outlive them).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The child's view of what [`spawn`] prepared (raw pointers into the [`Plan`]).
struct ChildArgs {
    paths: Vec<*const libc::c_char>,
    argv: Vec<*const libc::c_char>,
    /// `/bin/sh FILE ARGS...` for a file without `#!`; slot 1 (there are at least three) is
    /// set to the file tried.
    sh_argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    own_group: bool,
    /// The highest signal number (`SIGRTMAX`).
    last_signal: libc::c_int,
    /// Locksmith's pid when CMD must die with it, else 0.
    parent: libc::pid_t,
    /// The `execve` error, set by the child before it exits.
    error: AtomicI32,
    /// Descriptors the child closes before its `execve` (`sys::parked_fds`).
    closing: Vec<libc::c_int>,
}

/// The child, between `clone` and `execve`: system calls only, no allocation, no unwinding.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` that `spawn` keeps alive (and does not touch) while
    // this runs: `CLONE_VFORK` suspends it until the `execve` or `_exit` below. Every call
    // is async-signal-safe; every signal is blocked until the handlers are reset.
    unsafe {
        let a = &mut *(arg as *mut ChildArgs);
        fn fail(a: &ChildArgs, errno: i32) -> ! {
            a.error.store(errno.max(1), Ordering::SeqCst);
            // SAFETY: ends the child without running anything of locksmith's.
            unsafe { libc::_exit(127) }
        }
        // A handler of locksmith's must not run here (our stack, its memory): each goes back
        // to its default before the mask is emptied. SIGPIPE too (std ignores it; CMD must
        // not). Signals ignored by locksmith's own parent stay ignored, as with std.
        for sig in 1..=a.last_signal {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = unsafe_zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            if sig == libc::SIGPIPE
                || (old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN)
            {
                let mut dfl: libc::sigaction = unsafe_zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if a.own_group && libc::setpgid(0, 0) != 0 {
            fail(a, *libc::__errno_location());
        }
        if a.parent != 0 {
            let kill = libc::SIGKILL as libc::c_ulong;
            if libc::prctl(libc::PR_SET_PDEATHSIG, kill, 0 as libc::c_ulong, 0, 0) != 0 {
                fail(a, *libc::__errno_location());
            }
            // Locksmith may have died before the prctl took effect.
            if libc::getppid() != a.parent {
                libc::_exit(127);
            }
        }
        for &fd in &a.closing {
            libc::close(fd);
        }
        let mut empty: libc::sigset_t = unsafe_zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // execvp(3): a directory that cannot serve is passed over (EACCES remembered, and
        // said only once every directory was tried); any other error ends the search.
        let mut eacces = false;
        let mut last = libc::ENOENT;
        for &path in &a.paths {
            libc::execve(path, a.argv.as_ptr(), a.envp.as_ptr());
            last = *libc::__errno_location();
            if last == libc::ENOEXEC {
                // No bounds check (no panic path here): `spawn` made at least three slots.
                *a.sh_argv.as_mut_ptr().add(1) = path;
                libc::execve(SH.as_ptr(), a.sh_argv.as_ptr(), a.envp.as_ptr());
                last = *libc::__errno_location();
            }
            match last {
                libc::EACCES => eacces = true,
                libc::ENOENT | libc::ESTALE | libc::ENOTDIR | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => fail(a, last),
            }
        }
        fail(a, if eacces { libc::EACCES } else { last })
    }
}
