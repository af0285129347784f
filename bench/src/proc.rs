//! Child processes with a deadline on every wait, line readers, and `/proc` readings.
//!
//! std only: nothing here needs `unsafe`. The one signal std cannot send to a `Child` it
//! does not hold (SIGKILL to a child whose `wait` is blocked in another call) goes through
//! kill(1); that pid is still ours, since the process is not reaped until that call returns.

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The bench's errors: one line saying what went wrong, for a loud failure.
pub type Result<T> = std::result::Result<T, String>;

/// SIGKILL by pid, through kill(1) (std has no `kill(2)` for a pid).
pub fn kill_pid(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
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
                        kill_pid(p);
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
                    kill_pid(p);
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
