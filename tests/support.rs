//! The test DSL: a sandbox directory with a profiles file, and handles on real processes.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

// A real network filesystem (sshfs) for the file backends, shared with the bench.
pub use testkit::sshfs::{Sshfs, mounted};

// Shared with the bench (testkit/): the process harness, the rule for what a machine lacks.
pub use testkit::proc::{
    Held, alive, code, digest, eventually, kill9, on_path, output_within, stderr, stdout,
};
pub use testkit::{NotStarted, free_port, missing, token_of};

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
pub mod fs2;
pub use fs2::*;
