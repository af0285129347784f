//! The test DSL: a sandbox directory with a profiles file, and handles on real processes.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

// A real network filesystem (sshfs) for the file backends, shared with the bench.
pub use testkit::smb::Smb;
pub use testkit::sshfs::{Sshfs, mounted};
// Private networks of namespaces (issue 13), shared with the PostgreSQL fixture.
pub use testkit::net::{Net, command_in};

// Shared with the bench (testkit/): the process harness, the rule for what a machine lacks.
pub use testkit::proc::{
    Held, alive, code, digest, eventually, kill9, on_path, output_within, stderr, stdout,
};
pub use testkit::{NotStarted, free_port, missing, token_hidden, token_of};

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
    /// Environment every locksmith of this sandbox gets (an S3 store's credentials, which
    /// only the environment or ~/.aws may give).
    pub env: Vec<(String, String)>,
}

impl Sandbox {
    /// A sandbox whose profiles file holds `toml` (paths in it may use `{dir}`).
    pub fn new(toml: &str) -> Sandbox {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-test-")
            .tempdir()
            .expect("tempdir");
        let profiles = dir.path().join("profiles.toml");
        let s = Sandbox {
            dir,
            profiles,
            env: Vec::new(),
        };
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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

/// CLOCK_MONOTONIC now, in seconds: the clock every namespace of one kernel shares.
pub fn monotonic() -> f64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
}

// A second real network filesystem (GlusterFS) for the file backends.
pub mod fs2;
pub use fs2::*;

/// The Python and Perl clients (`clients/`) each take `address` once through the real helper
/// and print its token: the tokens, in that order, each asserted greater than the one before
/// (starting above `after`); `check` runs after each client (the lock left free?). A client
/// whose language is missing is skipped (under CI: fails). `setup` gives the clients their
/// variables (credentials); they run in `dir`.
pub fn token_through_clients(
    address: &str,
    dir: &Path,
    setup: &dyn Fn(&mut Command),
    after: u64,
    check: &dyn Fn(&str),
) -> Vec<u64> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = "import sys, netlock\nl = netlock.lock(sys.argv[1])\nprint(l.token)\nl.unlock()\n";
    let perl = "use NetLock; my $l = NetLock->new($ARGV[0]); print $l->token, \"\\n\"; $l->unlock;";
    let runs: [(&str, Vec<String>); 2] = [
        ("python3", vec!["-c".into(), python.into(), address.into()]),
        (
            "perl",
            vec![
                format!("-I{}", root.join("clients/perl/lib").display()),
                "-e".into(),
                perl.into(),
                address.into(),
            ],
        ),
    ];
    let mut tokens = Vec::new();
    let mut last = after;
    for (prog, args) in runs {
        if on_path(prog).is_none() {
            missing(
                &format!("`{prog}` not found"),
                ".ci/run installs python3 and perl",
            );
            continue;
        }
        let mut c = Command::new(prog);
        c.args(&args)
            .env("PYTHONPATH", root.join("clients/python"))
            .env("LOCKSMITH_BIN", bin())
            .current_dir(dir);
        setup(&mut c);
        let o = output_within(c, Duration::from_secs(60));
        assert!(o.status.success(), "{prog}: {}", stderr(&o));
        let t: u64 = stdout(&o)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{prog}: {}", stdout(&o)));
        assert!(t > last, "{prog}: token {t} after {last}");
        last = t;
        tokens.push(t);
        check(prog);
    }
    tokens
}
