//! The test DSL: a sandbox directory with a profiles file, and handles on real processes.

use std::ffi::OsStr;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

// Real network filesystems (sshfs) for the file backends.
pub mod netfs;
pub use netfs::*;

/// The helper under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_locksmith")
}

/// The local backends' profiles in [`Sandbox::standard`]: flock, mkdir, link, symlink.
pub const LOCAL: [&str; 4] = ["f", "m", "l", "s"];

/// A private directory with a profiles file in it.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub profiles: PathBuf,
}

impl Sandbox {
    /// A sandbox whose profiles file holds `toml` (paths in it may use `{dir}`).
    pub fn new(toml: &str) -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-test-")
            .tempdir()
            .expect("tempdir");
        let profiles = dir.path().join("profiles.toml");
        let s = Sandbox { dir, profiles };
        s.write_profiles(toml);
        s
    }

    /// The usual set: `f` (flock), `m` (mkdir), `l` (link), `s` (symlink), plus `fast`,
    /// `lfast`, `sfast` (mkdir, link, symlink with a short stale_after).
    pub fn standard() -> Sandbox {
        Sandbox::new(
            r#"
[profile.f]
backend = "flock"
path = "{dir}/f.lock"

[profile.m]
backend = "mkdir"
path = "{dir}/m.lock"

[profile.l]
backend = "link"
path = "{dir}/l.lock"

[profile.s]
backend = "symlink"
path = "{dir}/s.lock"

[profile.fast]
backend = "mkdir"
path = "{dir}/fast.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "200ms"
stale_after = "1500ms"

[profile.lfast]
backend = "link"
path = "{dir}/lfast.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "200ms"
stale_after = "1500ms"

[profile.sfast]
backend = "symlink"
path = "{dir}/sfast.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "200ms"
stale_after = "1500ms"
"#,
        )
    }

    pub fn write_profiles(&self, toml: &str) {
        let text = toml.replace("{dir}", &self.path().display().to_string());
        fs::write(&self.profiles, text).expect("write profiles");
        fs::set_permissions(&self.profiles, fs::Permissions::from_mode(0o600)).unwrap();
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, p: &str) -> PathBuf {
        self.path().join(p)
    }

    /// `locksmith --profiles FILE ARGS...`, with a clean environment for locksmith.
    pub fn cmd<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.cmd_via(&[], args)
    }

    /// The same, run through `prefix` (a wrapper program and its arguments, e.g.
    /// [`other_pidns`]); an empty prefix runs locksmith itself.
    pub fn cmd_via<I, S>(&self, prefix: &[&str], args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = match prefix {
            [] => Command::new(bin()),
            [wrapper, opts @ ..] => {
                let mut c = Command::new(wrapper);
                c.args(opts).arg(bin());
                c
            }
        };
        c.env_remove("LOCKSMITH_PROFILES")
            .env_remove("LOCKSMITH_LOG")
            .arg("--profiles")
            .arg(&self.profiles)
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// Runs to completion, capturing output. A hold that succeeds would never end by
    /// itself (it holds until its pipe closes), so it is killed after 60 s and the test fails.
    pub fn output<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        output_within(self.cmd(args), Duration::from_secs(60))
    }

    /// Starts hold mode and waits for its first line.
    pub fn hold<I, S>(&self, args: I) -> Held
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut held = self.spawn_hold(args);
        held.read_line(Duration::from_secs(20));
        held
    }

    /// Starts hold mode without waiting for its line.
    pub fn spawn_hold<I, S>(&self, args: I) -> Held
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut c = self.cmd(args);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        Held::spawn(c)
    }

    /// Names in the sandbox directory (to compare before and after).
    pub fn listing(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
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
            std::thread::spawn(move || {
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
            std::thread::sleep(Duration::from_millis(2));
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
                std::thread::sleep(Duration::from_millis(2));
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

/// Polls `cond` every 2 ms until it holds or `t` passes; returns how long it took.
/// (Observing an effect with a deadline, not sleeping in place of synchronisation.)
pub fn eventually(t: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if cond() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < t,
            "timed out after {t:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(s) => {
            let state = s[s.rfind(')').unwrap() + 2..].chars().next().unwrap();
            state != 'Z' && state != 'X'
        }
    }
}

/// A Perl parent in the seed's style: it spawns `locksmith PROFILE` through a pipe, prints
/// the line it read, then (optionally) forks a grandchild that inherits the pipe, and sleeps
/// until killed. Its first stdout line is locksmith's; with a grandchild the second line is
/// `grandchild PID`.
pub fn perl_parent(sb: &Sandbox, profile: &str, grandchild: bool) -> Held {
    let script = r#"
        my ($bin, $profiles, $name, $gc) = @ARGV;
        $| = 1;
        open(L, "-|", $bin, "--profiles", $profiles, $name) or die "spawn: $!";
        my $l = <L>;
        print $l;
        if ($gc) {
            my $pid = fork();
            if ($pid == 0) { sleep 1000; exit 0; }
            print "grandchild $pid\n";
        }
        sleep 1000;
    "#;
    let mut c = Command::new("perl");
    c.arg("-e")
        .arg(script)
        .arg(bin())
        .arg(&sb.profiles)
        .arg(profile)
        .arg(if grandchild { "1" } else { "0" })
        .env_remove("LOCKSMITH_PROFILES")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut h = Held::spawn(c);
    h.read_line(Duration::from_secs(20));
    h
}

/// SIGKILL.
pub fn kill9(pid: i32) {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

/// `Command::output` with a deadline: past it the process is killed and the test panics.
pub fn output_within(mut c: Command, t: Duration) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().expect("spawn");
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
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
    let errs = std::thread::spawn(move || {
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

/// Taken by the tests that load the machine with many processes (checkers, streams, soaks),
/// so that no two of them run at once on a 2-core machine: their timing bounds are meant for
/// a loaded machine, not a thrashing one.
pub fn heavy() -> std::sync::MutexGuard<'static, ()> {
    static HEAVY: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test CA and a leaf for 127.0.0.1 signed by it (rustls rejects a self-signed CA used as
/// the server certificate; the leaf names no DNS host, so `localhost` fails a name check).
/// Returns (ca.pem, leaf chain, leaf key), or `None` without openssl.
pub fn test_certs(
    dir: &std::path::Path,
) -> Option<(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf)> {
    let sh = r#"
set -e
cd "$1"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=locksmith-test-ca 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key -out leaf.csr -subj /CN=127.0.0.1 2>/dev/null
printf 'basicConstraints=CA:FALSE\nsubjectAltName=IP:127.0.0.1\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n' > leaf.ext
openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem -days 2 -extfile leaf.ext 2>/dev/null
"#;
    let ok = std::process::Command::new("sh")
        .args(["-c", sh, "sh"])
        .arg(dir)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        missing(
            "openssl cannot make test certificates here",
            ".ci/run installs openssl",
        );
        return None;
    }
    Some((
        dir.join("ca.pem"),
        dir.join("leaf.pem"),
        dir.join("leaf.key"),
    ))
}

/// The wrapper that runs a program in a pid namespace of its own ("another host" for SPEC §6:
/// no same-host proof of death reaches it); `None` (a visible SKIP outside CI) without
/// `unshare --pid`. Killing the wrapper takes the namespace down.
pub fn other_pidns() -> Option<&'static [&'static str]> {
    let probe = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        missing(
            "unshare --pid --fork is not available here",
            "needs util-linux and root",
        );
        return None;
    }
    // The namespace's init is a shell, not locksmith (an init ignores default-action signals
    // and sees parent pid 0); `exit $?` keeps it from exec'ing the command and passes its status.
    Some(&[
        "unshare",
        "--pid",
        "--fork",
        "--kill-child",
        "sh",
        "-c",
        r#""$@"; exit $?"#,
        "sh",
    ])
}

/// A holder in a pid namespace of our own: "another host" for SPEC §6 (no proof of death
/// reaches it). Killing the returned process (`unshare`) takes the namespace down.
pub fn other_host_holder(sb: &Sandbox, profile: &str) -> Option<Held> {
    let mut c = sb.cmd_via(other_pidns()?, [profile]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut h = Held::spawn(c);
    h.read_line(Duration::from_secs(20));
    Some(h)
}

/// A test CA with a leaf for 127.0.0.1, and a second, unrelated CA (one that must be refused).
pub struct TestPki {
    pub ca: PathBuf,
    pub leaf: PathBuf,
    pub key: PathBuf,
    pub other_ca: PathBuf,
    _dirs: [tempfile::TempDir; 2],
}

impl TestPki {
    /// `None` (a SKIP) without openssl, outside CI.
    pub fn new() -> Option<TestPki> {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let (ca, leaf, key) = test_certs(dirs[0].path())?;
        let (other_ca, _, _) = test_certs(dirs[1].path())?;
        Some(TestPki {
            ca,
            leaf,
            key,
            other_ca,
            _dirs: dirs,
        })
    }
}

/// A private network of our own (issue 13's partition harness): a server namespace holding a
/// Linux bridge at [`Net::SERVER`] on a private test subnet, and one namespace per "host",
/// attached to the bridge by a veth pair. Servers run in the server namespace bound to its
/// address; each host's processes run in their host's namespace and in a pid namespace of
/// their own (no same-host proof of death between hosts). One kernel, so one CLOCK_MONOTONIC
/// orders events across them all. Everything — processes and namespaces — goes on drop.
pub struct Net {
    /// The namespaces' name stem: `<id>-s` (server), `<id>-<host>`.
    id: String,
    hosts: Vec<char>,
}

impl Net {
    /// The server namespace's address.
    pub const SERVER: &'static str = "10.213.0.1";

    /// A network with hosts `hosts` (their addresses 10.213.0.2, .3, ... in order); `None`
    /// (a SKIP outside CI) without root or `ip`.
    pub fn new(hosts: &[char]) -> Option<Net> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let usable = nix::unistd::geteuid().is_root()
            && Command::new("ip")
                .args(["netns", "list"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if !usable {
            missing(
                "network namespaces need root and `ip` (iproute2)",
                ".ci/run installs iproute2 and runs as root",
            );
            return None;
        }
        let net = Net {
            id: format!(
                "lsm{}n{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            hosts: hosts.to_vec(),
        };
        let s = net.ns('s');
        net.ip(&["netns", "add", &s]);
        net.ip(&["-n", &s, "link", "set", "lo", "up"]);
        net.ip(&["-n", &s, "link", "add", "br0", "type", "bridge"]);
        net.ip(&[
            "-n",
            &s,
            "addr",
            "add",
            &format!("{}/24", Net::SERVER),
            "dev",
            "br0",
        ]);
        net.ip(&["-n", &s, "link", "set", "br0", "up"]);
        for (i, &h) in hosts.iter().enumerate() {
            let ns = net.ns(h);
            let port = Net::port(h);
            net.ip(&["netns", "add", &ns]);
            net.ip(&["-n", &ns, "link", "set", "lo", "up"]);
            net.ip(&[
                "link", "add", &port, "netns", &s, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            net.ip(&["-n", &s, "link", "set", &port, "master", "br0"]);
            net.ip(&["-n", &s, "link", "set", &port, "up"]);
            let addr = format!("10.213.0.{}/24", i + 2);
            net.ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            net.ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        Some(net)
    }

    fn ns(&self, h: char) -> String {
        format!("{}-{h}", self.id)
    }

    /// The server namespace's name (for `ip netns exec`).
    pub fn server_ns(&self) -> String {
        self.ns('s')
    }

    /// Host `h`'s port on the bridge (in the server namespace).
    fn port(h: char) -> String {
        format!("p{h}")
    }

    fn ip(&self, args: &[&str]) {
        let o = Command::new("ip").args(args).output().expect("run ip");
        assert!(o.status.success(), "ip {args:?}: {}", stderr(&o));
    }

    /// `prog` run in the server namespace.
    pub fn in_server(&self, prog: impl AsRef<OsStr>) -> Command {
        command_in(Some(&self.ns('s')), prog)
    }

    /// `prog` run on host `h`: its network namespace, a pid namespace of its own.
    pub fn on_host(&self, h: char, prog: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(h)])
            .args(["unshare", "--pid", "--fork", "--kill-child"])
            .arg(prog);
        c
    }

    /// A silent cut: host `h`'s bridge port stops forwarding (no RST, no ICMP; the host keeps
    /// its carrier).
    pub fn cut_silent(&self, h: char) {
        self.port_state(h, "0");
    }

    /// Host `h`'s bridge port: 0 disabled, 3 forwarding.
    fn port_state(&self, h: char, state: &str) {
        let o = self
            .in_server("bridge")
            .args(["link", "set", "dev", &Net::port(h), "state", state])
            .output()
            .unwrap();
        assert!(o.status.success(), "bridge: {}", stderr(&o));
    }

    /// A hard cut: host `h`'s link goes down.
    pub fn cut_hard(&self, h: char) {
        self.ip(&["-n", &self.ns('s'), "link", "set", &Net::port(h), "down"]);
    }

    /// Undoes either cut: the port forwards again, the host's link has its carrier back, and
    /// neither side remembers an address it could not resolve meanwhile.
    pub fn heal(&self, h: char) {
        self.ip(&["-n", &self.ns('s'), "link", "set", &Net::port(h), "up"]);
        self.port_state(h, "3");
        eventually(Duration::from_secs(10), "the host's link is up", || {
            let o = Command::new("ip")
                .args(["-n", &self.ns(h), "link", "show", "eth0"])
                .output()
                .unwrap();
            let s = stdout(&o);
            s.contains("LOWER_UP") && !s.contains("NO-CARRIER")
        });
        for ns in [self.ns('s'), self.ns(h)] {
            self.ip(&["-n", &ns, "neigh", "flush", "all"]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let all: Vec<String> = std::iter::once('s')
            .chain(self.hosts.iter().copied())
            .map(|h| self.ns(h))
            .collect();
        for ns in &all {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(p) = pid.parse::<i32>() {
                        kill9(p);
                    }
                }
            }
        }
        for ns in &all {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// `prog`, run in network namespace `ns` when there is one (`ip netns exec`).
pub fn command_in(ns: Option<&str>, prog: impl AsRef<OsStr>) -> Command {
    match ns {
        None => Command::new(prog),
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(prog);
            c
        }
    }
}

/// CLOCK_MONOTONIC now, in seconds: the clock every namespace of one kernel shares.
pub fn monotonic() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

// A second real network filesystem (GlusterFS) for the file backends.
/// The one rule for what a test needs and this machine lacks (a real server, a tool, root):
/// outside CI a visible `SKIP: why` line, and the caller returns without testing; under
/// `CI=true` (`.ci/run` installs everything, `installed`) the absence fails the test.
pub fn missing(why: &str, installed: &str) {
    assert!(std::env::var("CI").is_err(), "CI=true: {why} ({installed})");
    eprintln!("SKIP: {why}");
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The fencing token of an OK line (`token=N`); panics if it has none.
pub fn token_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("token="))
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .parse()
        .unwrap()
}

pub mod fs2;
pub use fs2::*;
