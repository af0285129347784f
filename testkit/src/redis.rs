//! A real, throwaway Redis server, for the tests (tests/redis.rs, the partition harness) and
//! the bench: Debian's `redis-server` on a free loopback port (or a namespace's address), its
//! directory in a temp dir, no RDB snapshots, killed and removed on drop.
//!
//! No `redis-server` or `redis-cli` on PATH is [`NotStarted::Missing`] (`.ci/run` installs
//! redis-server and redis-tools); a server that does not answer PING is
//! [`NotStarted::Failed`] with its log.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::net::{Net, command_in};
use crate::proc::on_path;
use crate::{NotStarted, free_port};

pub struct Redis {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
    /// The address it listens on (loopback, or the server namespace's of a [`Net`]).
    pub host: String,
    ns: Option<String>,
    /// With TLS: the CA that verifies it (for redis-cli).
    ca: Option<PathBuf>,
    /// The password redis-cli sends (`--requirepass`).
    password: Option<String>,
}

/// How to start one.
#[derive(Default)]
pub struct Options<'a> {
    /// More of redis-server's flags (`--appendonly yes`, `--requirepass pw`).
    pub args: &'a [&'a str],
    /// TLS only: (CA, leaf chain, leaf key); the port is `--tls-port`, plain TCP is off.
    pub tls: Option<(&'a Path, &'a Path, &'a Path)>,
    /// In the server namespace of this network.
    pub net: Option<&'a Net>,
    /// The password redis-cli must send (give `--requirepass` in `args` too).
    pub password: Option<&'a str>,
}

fn missing(why: &str) -> NotStarted {
    NotStarted::Missing {
        why: why.to_string(),
        installed: ".ci/run installs redis-server and redis-tools",
    }
}

impl Redis {
    /// A fresh server on loopback with Debian's defaults (`appendonly no`).
    pub fn start() -> Result<Redis, NotStarted> {
        Redis::start_with(Options::default())
    }

    /// As [`Redis::start`], as `o` says. A free port taken by someone else before the server
    /// bound it: tried again on another.
    pub fn start_with(o: Options<'_>) -> Result<Redis, NotStarted> {
        let mut tries = 0;
        loop {
            match Redis::start_once(&o) {
                Err(NotStarted::Failed(why)) if why.contains("already in use") && tries < 3 => {
                    tries += 1;
                }
                other => return other,
            }
        }
    }

    fn start_once(o: &Options<'_>) -> Result<Redis, NotStarted> {
        for tool in ["redis-server", "redis-cli"] {
            if on_path(tool).is_none() {
                return Err(missing(&format!(
                    "`{tool}` not found (Debian redis-server / redis-tools)"
                )));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix("locksmith-redis-")
            .tempdir_in(crate::scratch())
            .map_err(|e| NotStarted::Failed(format!("tempdir: {e}")))?;
        let port = free_port();
        let host = o.net.map_or("127.0.0.1", |_| Net::SERVER).to_string();
        let ns = o.net.map(Net::server_ns);
        let mut c = command_in(ns.as_deref(), "redis-server");
        match o.tls {
            None => {
                c.args(["--port", &port.to_string()]);
            }
            Some((ca, leaf, key)) => {
                c.args(["--port", "0", "--tls-port", &port.to_string()])
                    .arg("--tls-cert-file")
                    .arg(leaf)
                    .arg("--tls-key-file")
                    .arg(key)
                    .arg("--tls-ca-cert-file")
                    .arg(ca)
                    .args(["--tls-auth-clients", "no"]);
            }
        }
        if o.net.is_some() {
            // Not loopback: a private test subnet, where protected mode would refuse clients.
            c.args(["--protected-mode", "no"]);
        }
        let log = dir.path().join("redis.log");
        let child = c
            .args(["--bind", &host, "--save", "", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(o.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| NotStarted::Failed(format!("cannot start redis-server: {e}")))?;
        let mut r = Redis {
            child,
            dir,
            port,
            host,
            ns,
            ca: o.tls.map(|(ca, _, _)| ca.to_path_buf()),
            password: o.password.map(str::to_string),
        };
        let t0 = Instant::now();
        loop {
            let answer = r.try_cli(&["PING"]);
            if answer.as_ref().is_ok_and(|s| s.trim() == "PONG") {
                return Ok(r);
            }
            let exited = r.child.try_wait().ok().flatten();
            if exited.is_some() || t0.elapsed() > Duration::from_secs(20) {
                return Err(NotStarted::Failed(format!(
                    "redis-server did not answer PING ({answer:?}; exit {exited:?}): {}",
                    fs::read_to_string(&log).unwrap_or_default()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `redis-cli` against it, the raw output.
    pub fn cli_output(&self, args: &[&str]) -> Output {
        let mut c = command_in(self.ns.as_deref(), "redis-cli");
        c.args(["-h", &self.host, "-p", &self.port.to_string()]);
        if let Some(ca) = &self.ca {
            c.arg("--tls").arg("--cacert").arg(ca);
        }
        c.env_remove("REDISCLI_AUTH");
        if let Some(pw) = &self.password {
            c.env("REDISCLI_AUTH", pw);
        }
        c.args(args).stdin(Stdio::null()).output().unwrap()
    }

    fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        let o = self.cli_output(args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        if o.status.success() && !out.starts_with("ERR") && !out.contains("NOAUTH") {
            Ok(out)
        } else {
            Err(format!("{out}{}", String::from_utf8_lossy(&o.stderr)))
        }
    }

    /// `redis-cli ARGS`, its answer trimmed; a failure panics (the tests).
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|e| panic!("redis-cli {args:?}: {e}"))
            .trim_end()
            .to_string()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The server's directory (its log is `redis.log` there).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `redis-server --version`.
    pub fn version() -> String {
        Command::new("redis-server")
            .arg("--version")
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "redis-server ?".into())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
