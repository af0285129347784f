//! The process harness: child processes with a deadline on every wait, line readers, and
//! `/proc` readings.
//!
//! Two handles on a child, for two kinds of caller. [`Proc`] (the bench): every blocking wait
//! or read is armed on the watchdog, which SIGKILLs the child past its deadline, and fails
//! with a `Result` naming what timed out; a line's instant is taken where its read returned.
//! [`Held`] (the tests): stdout read with `poll(2)` timeouts, stderr collected by a thread,
//! and a parent's ending on drop (pipe closed, SIGTERM, SIGKILL after 5 s); a missed deadline
//! panics. Neither needs `unsafe`. SIGKILL to a child whose `wait` is blocked in another call
//! goes by pid ([`kill9`]); that pid is still ours, since the process is not reaped until that
//! call returns.

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::process::{
    Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Output, Stdio,
};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The bench's errors: one line saying what went wrong, for a loud failure.
pub type Result<T> = std::result::Result<T, String>;

/// SIGKILL by pid (`kill(2)`); a pid that is gone is no error.
pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

struct Armed {
    what: String,
    deadline: Instant,
    pids: Vec<u32>,
    fired: bool,
}

fn armed() -> &'static Mutex<Option<Armed>> {
    static ARMED: OnceLock<Mutex<Option<Armed>>> = OnceLock::new();
    ARMED.get_or_init(|| Mutex::new(None))
}

/// Starts the watchdog thread: it wakes every 100 ms (never touching the timed path: arming
/// is a mutex store, no notification) and SIGKILLs the armed pids once their deadline passes,
/// which ends the blocked wait or read that was armed.
pub fn start_watchdog() {
    thread::Builder::new()
        .name("watchdog".into())
        .spawn(|| {
            loop {
                thread::sleep(Duration::from_millis(100));
                let mut g = armed().lock().unwrap_or_else(|e| e.into_inner());
                if let Some(a) = g.as_mut()
                    && !a.fired
                    && Instant::now() >= a.deadline
                {
                    a.fired = true;
                    for &p in &a.pids {
                        kill9(p as i32);
                    }
                }
            }
        })
        .expect("cannot start the watchdog thread");
}

/// Runs a blocking `f` (a wait or a read on a child) with a deadline: past it, the watchdog
/// SIGKILLs `pids`, which unblocks `f`, and this returns an error naming `what`.
pub fn guarded<T>(what: &str, timeout: Duration, pids: &[u32], f: impl FnOnce() -> T) -> Result<T> {
    *armed().lock().unwrap_or_else(|e| e.into_inner()) = Some(Armed {
        what: what.to_string(),
        deadline: Instant::now() + timeout,
        pids: pids.to_vec(),
        fired: false,
    });
    let r = f();
    let a = armed().lock().unwrap_or_else(|e| e.into_inner()).take();
    match a {
        Some(a) if a.fired => Err(format!(
            "timed out after {timeout:?} {} (killed pid {:?})",
            a.what, a.pids
        )),
        _ => Ok(r),
    }
}

/// A child that is always reaped: dropping it SIGKILLs and waits for it if still running.
pub struct Proc {
    pub name: String,
    child: Child,
}

impl Proc {
    /// Spawns `cmd` (its stdio as configured by the caller).
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> Result<Proc> {
        let name = name.into();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot spawn {name}: {e}"))?;
        Ok(Proc { name, child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn stdout(&mut self) -> ChildStdout {
        self.child.stdout.take().expect("stdout was piped")
    }

    pub fn stderr(&mut self) -> ChildStderr {
        self.child.stderr.take().expect("stderr was piped")
    }

    pub fn stdin(&mut self) -> ChildStdin {
        self.child.stdin.take().expect("stdin was piped")
    }

    /// Waits for the exit, at most `timeout`; returns the status and when the wait returned.
    pub fn wait(&mut self, timeout: Duration) -> Result<(ExitStatus, Instant)> {
        let pid = self.pid();
        let what = format!("waiting for {} (pid {pid}) to exit", self.name);
        let child = &mut self.child;
        let r = guarded(&what, timeout, &[pid], || {
            let r = child.wait();
            (r, Instant::now())
        })?;
        match r {
            (Ok(st), t) => Ok((st, t)),
            (Err(e), _) => Err(format!("{what}: {e}")),
        }
    }

    /// Waits and insists on exit status 0.
    pub fn wait_ok(&mut self, timeout: Duration) -> Result<Instant> {
        let (st, t) = self.wait(timeout)?;
        if st.success() {
            Ok(t)
        } else {
            Err(format!(
                "{} (pid {}) exited with {st}",
                self.name,
                self.pid()
            ))
        }
    }

    /// SIGKILL now (the crash being measured); the process is reaped by `wait` or drop.
    pub fn kill(&mut self) -> Result<()> {
        self.child
            .kill()
            .map_err(|e| format!("cannot kill {}: {e}", self.name))
    }

    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Reads the first line of a child's pipe in the calling thread, with a deadline (past
/// it, `pid` is killed). Returns the line and the instant the read returned.
pub fn read_first_line<R: Read>(
    reader: &mut BufReader<R>,
    what: &str,
    timeout: Duration,
    pid: u32,
) -> Result<(String, Instant)> {
    let mut line = String::new();
    let (r, t) = guarded(what, timeout, &[pid], || {
        let r = reader.read_line(&mut line);
        (r, Instant::now())
    })?;
    match r {
        Ok(0) => Err(format!("{what}: end of file before any line")),
        Ok(_) => Ok((line.trim_end().to_string(), t)),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

/// A thread reading a child's pipe line by line; each line arrives with the instant its
/// read returned (taken in the reading thread, so a late receiver does not skew it).
pub struct Lines<R: Read + Send + 'static> {
    rx: Receiver<(Instant, String)>,
    handle: Option<JoinHandle<BufReader<R>>>,
    /// Every line received so far, for error messages.
    pub seen: Vec<String>,
}

impl<R: Read + Send + 'static> Lines<R> {
    /// `first_only`: stop after one line and hand the pipe back (see `into_pipe`), so the
    /// caller decides when it closes; else read to end of file.
    pub fn start(pipe: R, first_only: bool) -> Lines<R> {
        let (tx, rx) = mpsc::channel();
        let handle = thread::Builder::new()
            .name("lines".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let mut r = BufReader::new(pipe);
                loop {
                    let mut line = String::new();
                    match r.read_line(&mut line) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {
                            let t = Instant::now();
                            if tx.send((t, line.trim_end().to_string())).is_err() || first_only {
                                break;
                            }
                        }
                    }
                }
                r
            })
            .expect("cannot start a reader thread");
        Lines {
            rx,
            handle: Some(handle),
            seen: Vec::new(),
        }
    }

    /// The next line within `timeout`: `Ok(None)` at end of file. Past the deadline `kill`
    /// is SIGKILLed (unblocking the reader) and this fails naming `what`.
    pub fn next(
        &mut self,
        what: &str,
        timeout: Duration,
        kill: &[u32],
    ) -> Result<Option<(Instant, String)>> {
        match self.rx.recv_timeout(timeout) {
            Ok((t, l)) => {
                self.seen.push(l.clone());
                Ok(Some((t, l)))
            }
            Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(RecvTimeoutError::Timeout) => {
                for &p in kill {
                    kill9(p as i32);
                }
                Err(format!(
                    "timed out after {timeout:?} {what} (killed pid {kill:?}); lines so far: {:?}",
                    self.seen
                ))
            }
        }
    }

    /// Reads lines until one satisfies `want`, within `timeout` overall.
    pub fn until(
        &mut self,
        what: &str,
        timeout: Duration,
        kill: &[u32],
        want: impl Fn(&str) -> bool,
    ) -> Result<(Instant, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(what, left, kill)? {
                Some((t, l)) if want(&l) => return Ok((t, l)),
                Some(_) => {}
                None => {
                    return Err(format!("{what}: end of file; lines seen: {:?}", self.seen));
                }
            }
        }
    }

    /// A line already received, if any (never blocks).
    pub fn try_next(&mut self) -> Option<String> {
        let l = self.rx.try_recv().ok().map(|(_, l)| l)?;
        self.seen.push(l.clone());
        Some(l)
    }

    /// The pipe back (after a `first_only` reader stopped; closing it is the caller's).
    pub fn into_pipe(mut self) -> Option<BufReader<R>> {
        self.handle.take().and_then(|h| h.join().ok())
    }
}

/// Polls a condition every `step` until it holds, at most `timeout`.
pub fn poll_until(
    what: &str,
    timeout: Duration,
    step: Duration,
    mut cond: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} {what}"));
        }
        thread::sleep(step);
    }
}

/// Polls `cond` every 2 ms until it holds or `t` passes; returns how long it took, and panics
/// past `t` (the tests' [`poll_until`]). (Observing an effect with a deadline, not sleeping in
/// place of synchronisation.)
pub fn eventually(t: Duration, what: &str, cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    let waiting = format!("waiting for: {what}");
    if let Err(e) = poll_until(&waiting, t, Duration::from_millis(2), cond) {
        panic!("{e}");
    }
    start.elapsed()
}

/// `Private_Dirty` of a process in KiB (`/proc/PID/smaps_rollup`): the memory only it uses
/// and that cannot be dropped and read back (its heap, stacks, written data). The rest of
/// its RSS is file pages (the binary, libc) in the page cache, shared with every process
/// that maps them.
pub fn private_dirty_kib(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    status_field(&s, "Private_Dirty:")
}

/// `Private_Clean` + `Private_Dirty` of a process in KiB: what it adds beside every other
/// process running the same binary (its share of the binary and libc is not counted).
pub fn private_kib(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    Some(status_field(&s, "Private_Clean:")? + status_field(&s, "Private_Dirty:")?)
}

/// The number of descriptors a process has open.
pub fn open_fds(pid: u32) -> Option<usize> {
    Some(fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// `VmRSS` of a process in KiB.
pub fn vm_rss_kib(pid: u32) -> Option<u64> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&s, "VmRSS:")
}

fn status_field(status: &str, key: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// Context switches summed over every thread of a process.
#[derive(Clone, Copy, Debug, Default)]
pub struct Switches {
    pub voluntary: u64,
    pub nonvoluntary: u64,
    pub threads: u32,
}

impl Switches {
    pub fn total(&self) -> u64 {
        self.voluntary + self.nonvoluntary
    }
}

/// Reads `/proc/PID/task/*/status`.
pub fn switches(pid: u32) -> io::Result<Switches> {
    let mut s = Switches::default();
    for entry in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = entry?.path().join("status");
        let Ok(text) = fs::read_to_string(&path) else {
            continue; // the thread ended meanwhile
        };
        s.voluntary += status_field(&text, "voluntary_ctxt_switches:").unwrap_or(0);
        s.nonvoluntary += status_field(&text, "nonvoluntary_ctxt_switches:").unwrap_or(0);
        s.threads += 1;
    }
    Ok(s)
}

/// The state letter of `/proc/PID/stat` (`None`: no such process).
pub fn proc_state(pid: u32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// Gone or a zombie: it has exited (a zombie's locks and descriptors are already closed).
pub fn exited(pid: u32) -> bool {
    matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    !exited(pid as u32)
}

/// Whether `pid` has a blocked (`->`) flock(2) request in `/proc/locks`.
pub fn blocked_in_flock(pid: u32) -> bool {
    let Ok(text) = fs::read_to_string("/proc/locks") else {
        return false;
    };
    let pid = pid.to_string();
    text.lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.get(1) == Some(&"->") && w.get(2) == Some(&"FLOCK") && w.get(5) == Some(&pid.as_str())
    })
}

/// How many of `pids` have a blocked (`->`) flock(2) request in `/proc/locks` (one read).
pub fn blocked_in_flock_count(pids: &[u32]) -> usize {
    let Ok(text) = fs::read_to_string("/proc/locks") else {
        return 0;
    };
    let pids: std::collections::HashSet<u32> = pids.iter().copied().collect();
    text.lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.get(1) == Some(&"->")
                && w.get(2) == Some(&"FLOCK")
                && w.get(5)
                    .and_then(|p| p.parse().ok())
                    .is_some_and(|p| pids.contains(&p))
        })
        .count()
}

/// Whether `pid` holds a granted flock(2) lock per `/proc/locks`.
pub fn holds_flock(pid: u32) -> bool {
    let Ok(text) = fs::read_to_string("/proc/locks") else {
        return false;
    };
    let pid = pid.to_string();
    text.lines().any(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        w.get(1) == Some(&"FLOCK") && w.get(4) == Some(&pid.as_str())
    })
}

/// The first line of a command's output (for version strings), if it runs.
pub fn first_line_of(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_string)
}

/// Whether `name` is an executable on `PATH`.
pub fn on_path(name: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// A running locksmith in hold mode (or any process whose stdout we read line by line).
/// Its stdout is read directly, with `poll` for timeouts, so that dropping it really
/// closes the pipe's only read end.
pub struct Held {
    pub child: Child,
    stdout: Option<ChildStdout>,
    buf: Vec<u8>,
    pub line: Option<String>,
    pub line_at: Option<Instant>,
    errs: mpsc::Receiver<String>,
    err_seen: Vec<String>,
}

impl Held {
    pub fn spawn(mut c: Command) -> Held {
        let mut child = c.spawn().expect("spawn process");
        let stdout = child.stdout.take();
        let (etx, erx) = mpsc::channel();
        if let Some(err) = child.stderr.take() {
            thread::spawn(move || {
                for l in BufReader::new(err).lines() {
                    let Ok(l) = l else { break };
                    if etx.send(l).is_err() {
                        break;
                    }
                }
            });
        }
        Held {
            child,
            stdout,
            buf: Vec::new(),
            line: None,
            line_at: None,
            errs: erx,
            err_seen: Vec::new(),
        }
    }

    /// Waits up to `t` for the next stdout line; `None` on timeout or end of file.
    pub fn read_line(&mut self, t: Duration) -> Option<String> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let deadline = Instant::now() + t;
        loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                let rest = self.buf.split_off(i + 1);
                let l =
                    String::from_utf8_lossy(&std::mem::replace(&mut self.buf, rest)).into_owned();
                self.line_at = Some(Instant::now());
                self.line = Some(l.clone());
                return Some(l);
            }
            let out = self.stdout.as_mut()?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let ms =
                PollTimeout::try_from(left.as_millis().max(1) as u64).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(out.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => panic!("poll: {e}"),
            }
            let mut chunk = [0u8; 4096];
            match std::io::Read::read(out, &mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The first line, which must be OK.
    pub fn ok(&self) -> &str {
        let l = self.line.as_deref().unwrap_or("<no line>");
        assert!(l.starts_with("OK "), "expected OK, got {l:?}");
        l
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether the process has exited (without blocking).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits up to `t` for the exit; panics if it does not come.
    pub fn wait_exit(&mut self, t: Duration) -> ExitStatus {
        let deadline = Instant::now() + t;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "locksmith did not exit within {t:?}"
            );
            thread::sleep(Duration::from_millis(2));
        }
    }

    /// Closes our read end of its stdout (the parent "closes the pipe").
    pub fn close_stdout(&mut self) {
        self.stdout = None;
    }

    pub fn signal(&self, sig: i32) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::try_from(sig).unwrap(),
        )
        .unwrap();
    }

    /// Waits up to `t` for a stderr line containing `needle` (e.g. the waiting notice).
    pub fn wait_stderr(&mut self, needle: &str, t: Duration) -> String {
        self.stderr_within(needle, t).unwrap_or_else(|| {
            panic!(
                "no stderr line containing {needle:?} within {t:?}; saw {:?}",
                self.err_seen
            )
        })
    }

    /// Waits up to `t` for a stderr line containing `needle`; `None` if none came.
    pub fn stderr_within(&mut self, needle: &str, t: Duration) -> Option<String> {
        if let Some(l) = self.err_seen.iter().find(|l| l.contains(needle)) {
            return Some(l.clone());
        }
        let deadline = Instant::now() + t;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.errs.recv_timeout(left) {
                Ok(l) => {
                    self.err_seen.push(l.clone());
                    if l.contains(needle) {
                        return Some(l);
                    }
                }
                Err(_) => return None,
            }
        }
    }

    /// Everything said on stderr so far (after the process exited: all of it).
    pub fn stderr_text(&mut self) -> String {
        while let Ok(l) = self.errs.recv_timeout(Duration::from_millis(200)) {
            self.err_seen.push(l);
        }
        self.err_seen.join("\n")
    }
}

impl Drop for Held {
    /// Ends it the way a parent would: close the pipe and SIGTERM (a locksmith releases),
    /// SIGKILL only if it is still there after 5 s. Always reaped.
    fn drop(&mut self) {
        self.stdout = None;
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid()),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Exit code, or 128+signal.
pub fn code(s: ExitStatus) -> i32 {
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A long stderr made readable in a failure message: each distinct line once, in order of
/// first appearance, with `[×N]` when it repeats; at most 20 distinct lines.
pub fn digest(text: &str) -> String {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for l in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        match seen.iter_mut().find(|(s, _)| *s == l) {
            Some((_, n)) => *n += 1,
            None => seen.push((l, 1)),
        }
    }
    let more = seen.len().saturating_sub(20);
    let mut out: Vec<String> = seen
        .iter()
        .take(20)
        .map(|&(l, n)| {
            if n > 1 {
                format!("{l} [×{n}]")
            } else {
                l.to_string()
            }
        })
        .collect();
    if more > 0 {
        out.push(format!("… {more} more distinct lines"));
    }
    out.join("\n    ")
}

/// `Command::output` with a deadline: past it the process is killed and the test panics.
pub fn output_within(mut c: Command, t: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel::<()>();
    let watchdog = thread::spawn(move || {
        if rx.recv_timeout(t).is_err() {
            kill9(pid);
            return true;
        }
        false
    });
    let mut out = Vec::new();
    let mut err = Vec::new();
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let errs = thread::spawn(move || {
        let _ = std::io::Read::read_to_end(&mut se, &mut err);
        err
    });
    let _ = std::io::Read::read_to_end(&mut so, &mut out);
    let status = child.wait().unwrap();
    let _ = tx.send(());
    let killed = watchdog.join().unwrap();
    let stderr = errs.join().unwrap();
    assert!(
        !killed,
        "command did not finish within {t:?}: {}",
        String::from_utf8_lossy(&out)
    );
    Output {
        status,
        stdout: out,
        stderr,
    }
}

/// The processes of process group `pg` other than its leader.
pub(crate) fn group_members(pg: i32) -> Vec<i32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != pg)
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // After the command's ")": state, ppid, pgrp.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<i32>().ok())
                    == Some(pg)
            })
        })
        .collect()
}
