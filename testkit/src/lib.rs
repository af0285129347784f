//! What the integration tests (`tests/`, a dev-dependency) and the bench (`bench/`) share, so
//! that each is written once.
//!
//! # Layout
//! - [`proc`]: the process harness. [`proc::Proc`] (every wait armed on a watchdog, errors as
//!   values: the bench) and [`proc::Held`] (a line reader with `poll(2)` deadlines and a
//!   parent's ending on drop: the tests), and the `/proc` readings both make.
//! - [`net`]: private networks of namespaces (hosts on a bridge, cuts and heals).
//! - [`postgres`]: a throwaway PostgreSQL cluster.
//! - [`seaweed`]: a throwaway SeaweedFS S3 server.
//! - [`faulty`]: an HTTP proxy before a real server that gives ONE chosen request a fault
//!   (an answer no server gives on demand, or a write whose answer is lost).
//! - [`mute`]: a TCP relay before a real server whose answers can be muted (any protocol: a
//!   write that lands while its answer is lost, a server that does not answer for a while).
//! - [`redis`]: a throwaway Redis server.
//! - [`sshfs`]: one directory served over SFTP and mounted twice (two "hosts").
//! - [`smb`]: one share on a private Samba server, mounted twice with smbnetfs (two "hosts").
//! - this file: [`NotStarted`] (why a fixture did not start, and the tests' reading of it), [`missing`] (the one rule for what a machine lacks), [`free_port`],
//!   [`token_of`].

pub mod faulty;
pub mod fuse;
pub mod mute;
pub mod net;
pub mod postgres;
pub mod proc;
pub mod redis;
pub mod seaweed;
pub mod smb;
pub mod sshfs;

/// Why a fixture (a real server, a mount) did not start.
#[derive(Debug)]
pub enum NotStarted {
    /// Something this machine lacks (a program, a user, a device, root): `why`, and what
    /// provides it (`installed`, e.g. what `.ci/run` installs).
    Missing {
        why: String,
        installed: &'static str,
    },
    /// It is all there, and starting failed: what went wrong.
    Failed(String),
}

impl NotStarted {
    /// The tests' reading of a fixture's start: the fixture, or `None` after [`missing`]'s
    /// rule (a `SKIP:` line outside CI, a failure under CI); a failed start fails the test.
    pub fn or_skip<T>(started: Result<T, NotStarted>) -> Option<T> {
        match started {
            Ok(t) => Some(t),
            Err(NotStarted::Missing { why, installed }) => {
                missing(&why, installed);
                None
            }
            Err(NotStarted::Failed(why)) => panic!("{why}"),
        }
    }
}

/// The bench's note when a section is skipped: what is missing or what failed.
impl std::fmt::Display for NotStarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotStarted::Missing { why, .. } | NotStarted::Failed(why) => f.write_str(why),
        }
    }
}

/// The one rule for what a test needs and this machine lacks (a real server, a tool, root):
/// outside CI a visible `SKIP: why` line, and the caller returns without testing; under
/// `CI=true` (`.ci/run` installs everything, `installed`) the absence fails the test.
pub fn missing(why: &str, installed: &str) {
    assert!(std::env::var("CI").is_err(), "CI=true: {why} ({installed})");
    eprintln!("SKIP: {why}");
}

/// Where the fixtures keep their servers' data (PostgreSQL's and etcd's, Redis', SeaweedFS',
/// the FTP servers' roots, the directory sshfs serves, GlusterFS' brick): a tmpfs, `/dev/shm`,
/// where this machine has one we may write — so that the servers' fsyncs and metadata writes
/// do not queue on the disk's journal behind each other's. In CI one rename in the directory sshfs served waited
/// there for over 4 s while PostgreSQL and etcd tests ran beside it, and its holder, rightly,
/// said LOST (issue 28). `LOCKSMITH_TEST_SCRATCH` names another directory; else the temp dir.
/// (The tests' own lock directories stay in the temp dir: ext4 here, a filesystem users lock on.)
pub fn scratch() -> std::path::PathBuf {
    if let Some(d) = std::env::var_os("LOCKSMITH_TEST_SCRATCH") {
        return d.into();
    }
    let shm = std::path::Path::new("/dev/shm");
    let writable = nix::unistd::access(shm, nix::unistd::AccessFlags::W_OK).is_ok();
    if shm.is_dir() && writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// A loopback port nothing listens on now, and never handed out before in this process:
/// two fixtures starting at once (the tests run in parallel, in one process) never get the
/// same port, which the kernel may give again once let go. (Asked for port 0 with
/// `SO_REUSEADDR`, which std sets, Linux gives only odd ports of the lower half of the
/// ephemeral range: 32769–46881 here, ~7000 ports; should they all have been given, one is
/// given again.)
pub fn free_port() -> u16 {
    let mut port = 0;
    for _ in 0..1000 {
        port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if claim(port) {
            break;
        }
    }
    port
}

/// Marks `port` given to a fixture of this process: `false` if it was given before.
pub fn claim(port: u16) -> bool {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    if given.contains(&port) {
        return false;
    }
    given.push(port);
    true
}

/// An OK line with its fencing token written `token=T` (the file backends' first token is
/// the clock's microseconds: assert the rest of the line with this, the token with
/// [`token_of`]).
pub fn token_hidden(line: &str) -> String {
    let hide = |w: &str| match w.strip_prefix("token=") {
        // One token per lock (`token=T1,T2`); a lock without one leaves its field empty.
        Some(tokens) => {
            let t: Vec<&str> = tokens
                .split(',')
                .map(|t| if t.is_empty() { "" } else { "T" })
                .collect();
            format!("token={}", t.join(","))
        }
        None => w.to_string(),
    };
    let (body, nl) = match line.strip_suffix('\n') {
        Some(b) => (b, "\n"),
        None => (line, ""),
    };
    let words: Vec<String> = body.split(' ').map(hide).collect();
    format!("{}{nl}", words.join(" "))
}

/// The fencing token of an OK line (`token=N`); panics if it has none.
pub fn token_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("token="))
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .parse()
        .unwrap()
}
