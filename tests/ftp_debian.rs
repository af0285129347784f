//! The FTP suite of `ftp.rs` against real Debian servers, each started privately on free
//! ports of 127.0.0.1 with its root in a temporary directory:
//! - pure-ftpd (Debian package `pure-ftpd`): a virtual user in a private PureDB whose hash is
//!   SHA-512 crypt (`openssl passwd -6`; pure-pw's default argon2id costs ~3 s per login);
//! - vsftpd, the least capable common server (no MLST, no MFMT, MDTM only on files). Debian's
//!   FTP servers conflict, so it is not installed: `.ci/run` unpacks its .deb with
//!   `dpkg -x` and names the binary in `LOCKSMITH_VSFTPD` (else `target/debian-ftp/vsftpd/`
//!   of the workspace, else `vsftpd` on the PATH). It logs in a local user
//!   (`locksmithftp`, created here if missing) through PAM.
//!
//! Both need root (chroot, PAM, switching users). Without a server (or root) a test prints
//! `SKIP:` and passes; under `CI=true` it fails.

use crate::support::{free_port, missing, on_path};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::ftp_server::{PASSWORD, TestFtp};

/// The local user vsftpd logs in (its shell must be in /etc/shells for PAM's pam_shells).
const VSFTPD_USER: &str = "locksmithftp";
/// pure-ftpd's virtual user; it acts as nobody:nogroup.
const PURE_USER: &str = "locker";
const NOBODY: (u32, u32) = (65534, 65534);

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Server {
    PureFtpd,
    Vsftpd,
}

/// A running Debian FTP server; stopped (its sessions too) when dropped.
pub struct DebianFtp {
    server: Server,
    bin: PathBuf,
    port: u16,
    pasv: (u16, u16),
    owner: (u32, u32),
    /// Config, user database, log; `root/` inside is the FTP user's login directory.
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// vsftpd's `idle_session_timeout` in seconds (its default: 300).
    idle_secs: Option<u64>,
    /// Explicit FTPS required, with `tls/leaf.pem` and `tls/leaf.key` in `dir`.
    tls: bool,
    /// With `tls`: implicit FTPS (TLS from the first byte; vsftpd only).
    implicit: bool,
    /// The address it listens on (loopback, or the server namespace's of a [`Net`]).
    pub host: String,
    /// Its [`Net`]'s server namespace (pure-ftpd only).
    ns: Option<String>,
}

/// `SKIP:` outside CI, a failure under `CI=true`.
fn skip(why: &str) -> Option<DebianFtp> {
    missing(why, ".ci/run installs the FTP servers");
    None
}

/// On `PATH`, or in the system directories a user's `PATH` may lack (`/usr/sbin`, `/sbin`).
fn which(name: &str) -> Option<PathBuf> {
    on_path(name).or_else(|| {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .map(|d| Path::new(d).join(name))
            .into_iter()
            .find(|p| p.is_file())
    })
}

fn vsftpd_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LOCKSMITH_VSFTPD") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let unpacked =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debian-ftp/vsftpd/usr/sbin/vsftpd");
    if unpacked.is_file() {
        return Some(unpacked);
    }
    which("vsftpd")
}

/// Creates vsftpd's local user once per test run (and sets its password every time we
/// start: a user left by an earlier run may have another one).
fn vsftpd_user() -> Result<(u32, u32), String> {
    static USER: OnceLock<Result<(u32, u32), String>> = OnceLock::new();
    USER.get_or_init(|| {
        let run = |c: &mut Command| -> Result<(), String> {
            let o = c.output().map_err(|e| format!("{c:?}: {e}"))?;
            if o.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{c:?}: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ))
            }
        };
        if nix::unistd::User::from_name(VSFTPD_USER)
            .ok()
            .flatten()
            .is_none()
        {
            let _ = run(Command::new("useradd").args([
                "--system",
                "--no-create-home",
                "--home-dir",
                "/",
                "--shell",
                "/bin/sh",
                VSFTPD_USER,
            ]));
        }
        let Some(u) = nix::unistd::User::from_name(VSFTPD_USER).ok().flatten() else {
            return Err(format!("cannot create the local user {VSFTPD_USER}"));
        };
        let mut c = Command::new("chpasswd");
        c.stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("chpasswd: {e}"))?;
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{VSFTPD_USER}:{PASSWORD}\n").as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        if !o.status.success() {
            return Err(format!(
                "chpasswd: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok((u.uid.as_raw(), u.gid.as_raw()))
    })
    .clone()
}

impl DebianFtp {
    /// Starts `server`, or says `SKIP:` and returns `None` (fails under `CI=true`).
    pub fn start(server: Server) -> Option<DebianFtp> {
        DebianFtp::start_with(server, None, None)
    }

    /// A server that requires explicit FTPS (`AUTH TLS`) with this certificate and key.
    pub fn start_tls(server: Server, leaf: &Path, key: &Path) -> Option<DebianFtp> {
        DebianFtp::start_with(server, None, Some((leaf, key)))
    }

    /// vsftpd speaking implicit FTPS (pure-ftpd has no implicit mode).
    pub fn start_implicit_tls(server: Server, leaf: &Path, key: &Path) -> Option<DebianFtp> {
        assert_eq!(server, Server::Vsftpd, "pure-ftpd has no implicit FTPS");
        let mut s = DebianFtp::start_with(server, None, Some((leaf, key)))?;
        s.implicit = true;
        s.stop();
        s.restart();
        Some(s)
    }

    /// vsftpd closing sessions idle for `secs` seconds (pure-ftpd counts in minutes).
    pub fn start_idle(server: Server, secs: u64) -> Option<DebianFtp> {
        assert_eq!(
            server,
            Server::Vsftpd,
            "pure-ftpd's idle timeout is in minutes"
        );
        DebianFtp::start_with(server, Some(secs), None)
    }

    /// pure-ftpd in the server namespace of `net`, listening on its address.
    pub fn start_in(net: &crate::support::Net) -> Option<DebianFtp> {
        DebianFtp::start_full(Server::PureFtpd, None, None, Some(net))
    }

    fn start_with(
        server: Server,
        idle_secs: Option<u64>,
        tls: Option<(&Path, &Path)>,
    ) -> Option<DebianFtp> {
        DebianFtp::start_full(server, idle_secs, tls, None)
    }

    fn start_full(
        server: Server,
        idle_secs: Option<u64>,
        tls: Option<(&Path, &Path)>,
        net: Option<&crate::support::Net>,
    ) -> Option<DebianFtp> {
        if !nix::unistd::geteuid().is_root() {
            return skip(&format!("{server:?} tests need root"));
        }
        let (bin, owner) = match server {
            Server::PureFtpd => {
                let Some(bin) = which("pure-ftpd") else {
                    return skip("pure-ftpd is not installed (apt-get install pure-ftpd)");
                };
                if which("pure-pw").is_none() || which("openssl").is_none() {
                    return skip("pure-pw or openssl is missing");
                }
                (bin, NOBODY)
            }
            Server::Vsftpd => {
                let Some(bin) = vsftpd_bin() else {
                    return skip(
                        "no vsftpd binary (set LOCKSMITH_VSFTPD, or unpack its .deb into target/debian-ftp/vsftpd)",
                    );
                };
                match vsftpd_user() {
                    Ok(owner) => (bin, owner),
                    Err(e) => return skip(&e),
                }
            }
        };
        let dir = tempfile::Builder::new()
            .prefix("locksmith-debftp-")
            .tempdir_in(testkit::scratch())
            .expect("tempdir");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut s = DebianFtp {
            server,
            bin,
            port: 0,
            pasv: (0, 0),
            owner,
            dir,
            child: None,
            idle_secs,
            tls: tls.is_some(),
            implicit: false,
            host: net
                .map_or("127.0.0.1", |_| crate::support::Net::SERVER)
                .to_string(),
            ns: net.map(crate::support::Net::server_ns),
        };
        if let Some((leaf, key)) = tls {
            let d = s.dir.path().join("tls");
            std::fs::create_dir(&d).unwrap();
            std::fs::copy(leaf, d.join("leaf.pem")).unwrap();
            std::fs::copy(key, d.join("leaf.key")).unwrap();
        }
        s.mkdir_owned("root");
        s.mkdir_owned("root/locks");
        if let Err(e) = s.configure() {
            panic!("{server:?}: {e}");
        }
        // A port found free may be taken before the server binds it: try a few.
        for _ in 0..5 {
            s.port = free_port();
            let base = 20000 + fastrand::u16(..120) * 100;
            s.pasv = (base, base + 99);
            if s.spawn().is_ok() {
                return Some(s);
            }
        }
        panic!("{server:?} did not start: {}", s.log());
    }

    fn mkdir_owned(&self, rel: &str) {
        let p = self.dir.path().join(rel);
        std::fs::create_dir(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(self.owner.0), Some(self.owner.1)).unwrap();
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// Writes what does not depend on the port: pure-ftpd's user database.
    fn configure(&self) -> Result<(), String> {
        if self.server != Server::PureFtpd {
            return Ok(());
        }
        let mut c = Command::new("openssl");
        c.args(["passwd", "-6", "-stdin"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().map_err(|e| format!("openssl: {e}"))?;
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{PASSWORD}\n").as_bytes())
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let hash = String::from_utf8_lossy(&o.stdout).trim().to_string();
        if !o.status.success() || !hash.starts_with("$6$") {
            return Err(format!(
                "openssl passwd -6: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        // pure-pw's format: user:hash:uid:gid:gecos:home (`/./`: chroot there), then 12
        // empty fields (quotas, ratios, IP and time restrictions).
        let line = format!(
            "{PURE_USER}:{hash}:{}:{}::{}/./::::::::::::\n",
            self.owner.0,
            self.owner.1,
            self.root().display()
        );
        let passwd = self.dir.path().join("pureftpd.passwd");
        std::fs::write(&passwd, line).unwrap();
        let o = Command::new("pure-pw")
            .arg("mkdb")
            .arg(self.dir.path().join("pureftpd.pdb"))
            .arg("-f")
            .arg(&passwd)
            .output()
            .map_err(|e| format!("pure-pw: {e}"))?;
        if !o.status.success() {
            return Err(format!(
                "pure-pw mkdb: {}",
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Ok(())
    }

    /// Starts the server on `self.port` and waits for its greeting.
    fn spawn(&mut self) -> Result<(), ()> {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("log")).unwrap();
        let mut c = crate::support::command_in(self.ns.as_deref(), &self.bin);
        match self.server {
            Server::PureFtpd => {
                c.arg("-S")
                    .arg(format!("{},{}", self.host, self.port))
                    .arg("-l")
                    .arg(format!("puredb:{}", d.join("pureftpd.pdb").display()))
                    .args(["-E", "-A", "-H", "-c", "200", "-C", "200"])
                    .arg("-p")
                    .arg(format!("{}:{}", self.pasv.0, self.pasv.1))
                    .args(["-P", &self.host]);
                if self.tls {
                    // -Y 2: TLS required for the login (data connections follow PROT).
                    c.args(["-Y", "2", "-2"]).arg(format!(
                        "{},{}",
                        d.join("tls/leaf.pem").display(),
                        d.join("tls/leaf.key").display()
                    ));
                }
            }
            Server::Vsftpd => {
                std::fs::create_dir_all(d.join("empty")).unwrap();
                let tls = if self.tls {
                    // suppaftp does not resume the control connection's TLS session on
                    // data connections: vsftpd must not require that.
                    format!(
                        "ssl_enable=YES
rsa_cert_file={}
rsa_private_key_file={}
force_local_logins_ssl=YES
force_local_data_ssl=YES
require_ssl_reuse=NO
ssl_tlsv1=YES
ssl_ciphers=HIGH
implicit_ssl={}
",
                        d.join("tls/leaf.pem").display(),
                        d.join("tls/leaf.key").display(),
                        if self.implicit { "YES" } else { "NO" }
                    )
                } else {
                    String::new()
                };
                let conf = format!(
                    "listen=YES
listen_ipv6=NO
listen_address=127.0.0.1
listen_port={port}
background=NO
seccomp_sandbox=NO
isolate=NO
isolate_network=NO
anonymous_enable=NO
local_enable=YES
write_enable=YES
local_umask=022
local_root={root}
pasv_enable=YES
pasv_min_port={lo}
pasv_max_port={hi}
pasv_address=127.0.0.1
secure_chroot_dir={empty}
pam_service_name=locksmith-test-vsftpd
xferlog_enable=NO
connect_from_port_20=NO
tcp_wrappers=NO
max_clients=0
max_per_ip=0
idle_session_timeout={idle}
{tls}",
                    idle = self.idle_secs.unwrap_or(300),
                    port = self.port,
                    root = self.root().display(),
                    lo = self.pasv.0,
                    hi = self.pasv.1,
                    empty = d.join("empty").display(),
                );
                std::fs::write(d.join("vsftpd.conf"), conf).unwrap();
                c.arg(d.join("vsftpd.conf"));
            }
        }
        use std::os::unix::process::CommandExt;
        c.stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        let mut child = c.spawn().expect("spawn FTP server");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if child.try_wait().unwrap().is_some() {
                return Err(());
            }
            // Implicit FTPS says nothing before a TLS handshake: a connection must do.
            let up = if let Some(ns) = &self.ns {
                greets_in(ns, &self.host, self.port)
            } else if self.implicit {
                TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            } else {
                greets(self.port)
            };
            if up {
                self.child = Some(child);
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the server and every session it forked (vsftpd's sessions `setsid`, pure-ftpd's
    /// are reparented to init, so neither a process group nor the parent links alone find
    /// them all).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id() as i32;
        use nix::sys::signal::{Signal, kill};
        use nix::unistd::Pid;
        // No new sessions while we look.
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        for p in family(pid) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl DebianFtp {
    /// Cuts every open session (control connections drop) while the server keeps listening.
    pub fn cut_sessions(&self) {
        let Some(child) = &self.child else { return };
        let server = child.id() as i32;
        for p in family(server).into_iter().filter(|p| *p != server) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Release when the control connection was cut but the server stays up: the helper must
/// reconnect to remove its lock.
fn release_after_the_control_connection_was_cut(srv: &mut DebianFtp) {
    use crate::support::*;
    let sb = crate::ftp::sandbox(srv);
    let mut a = sb.hold(["-v", "p"]);
    a.ok();
    assert!(srv.path("locks/p").is_dir());
    srv.cut_sessions();
    a.close_stdout();
    assert_eq!(
        code(a.wait_exit(Duration::from_secs(20))),
        0,
        "{}",
        a.stderr_text()
    );
    assert!(
        !srv.path("locks/p").exists(),
        "the lock outlived its release"
    );
    let o = sb.output(["--wait", "0", "run", "p", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}

/// `pid`, its descendants, and everything in its process group.
fn family(pid: i32) -> Vec<i32> {
    let procs: Vec<(i32, i32, i32)> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| {
            let p: i32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let rest: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
            Some((p, rest.get(1)?.parse().ok()?, rest.get(2)?.parse().ok()?))
        })
        .collect();
    let mut out = vec![pid];
    loop {
        let more: Vec<i32> = procs
            .iter()
            .filter(|(p, ppid, pgid)| !out.contains(p) && (out.contains(ppid) || *pgid == pid))
            .map(|(p, _, _)| *p)
            .collect();
        if more.is_empty() {
            return out;
        }
        out.extend(more);
    }
}

/// Whether an FTP server answers on `port` with a `220` greeting.
/// [`greets`] for a server in network namespace `ns` (bash's /dev/tcp from inside it).
fn greets_in(ns: &str, host: &str, port: u16) -> bool {
    crate::support::command_in(Some(ns), "timeout")
        .args(["5", "bash", "-c"])
        .arg(r#"exec 3<>"/dev/tcp/$0/$1" && IFS= read -r l <&3 && [[ $l == 220* ]]"#)
        .arg(host)
        .arg(port.to_string())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn greets(port: u16) -> bool {
    let Ok(s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut r = BufReader::new(s);
    let mut line = String::new();
    // Multi-line greetings (pure-ftpd) end with `220 `.
    for _ in 0..20 {
        line.clear();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return false;
        }
        if line.starts_with("220 ") {
            use std::io::Write;
            let _ = r.get_mut().write_all(b"QUIT\r\n");
            return true;
        }
        if !line.starts_with("220") {
            return false;
        }
    }
    false
}

impl TestFtp for DebianFtp {
    fn name(&self) -> &'static str {
        match self.server {
            Server::PureFtpd => "pure-ftpd",
            Server::Vsftpd => "vsftpd",
        }
    }
    fn port(&self) -> u16 {
        self.port
    }
    fn user(&self) -> &str {
        match self.server {
            Server::PureFtpd => PURE_USER,
            Server::Vsftpd => VSFTPD_USER,
        }
    }
    fn path(&self, p: &str) -> PathBuf {
        self.root().join(p)
    }
    fn restart(&mut self) {
        self.stop();
        // The port may linger a moment after the kill.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.spawn().is_err() {
            assert!(
                Instant::now() < deadline,
                "{:?} did not restart on port {}: {}",
                self.server,
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn owner(&self) -> Option<(u32, u32)> {
        Some(self.owner)
    }
}

impl Drop for DebianFtp {
    fn drop(&mut self) {
        self.stop();
    }
}

mod pure_ftpd {
    use super::{DebianFtp, Server};
    crate::ftp::every_server!(DebianFtp::start(Server::PureFtpd));
    crate::ftp_shared::every_server_shared!(DebianFtp::start(Server::PureFtpd));

    #[test]
    fn release_after_the_control_connection_was_cut() {
        let Some(mut srv) = DebianFtp::start(Server::PureFtpd) else {
            return;
        };
        super::release_after_the_control_connection_was_cut(&mut srv);
    }

    #[test]
    fn ftps_explicit_verifies_the_certificate() {
        crate::ftp::ftps_verifies_the_certificate_on("explicit", |leaf, key| {
            DebianFtp::start_tls(Server::PureFtpd, leaf, key)
        });
    }
}

mod vsftpd {
    use super::{DebianFtp, Server};
    crate::ftp::every_server!(DebianFtp::start(Server::Vsftpd));
    crate::ftp_shared::every_server_shared!(DebianFtp::start(Server::Vsftpd));
    crate::ftp::ftp_suite!(DebianFtp::start_idle(Server::Vsftpd, 1); a_hold_outlives_the_server_idle_timeout);

    #[test]
    fn release_after_the_control_connection_was_cut() {
        let Some(mut srv) = DebianFtp::start(Server::Vsftpd) else {
            return;
        };
        super::release_after_the_control_connection_was_cut(&mut srv);
    }

    #[test]
    fn ftps_explicit_verifies_the_certificate() {
        crate::ftp::ftps_verifies_the_certificate_on("explicit", |leaf, key| {
            DebianFtp::start_tls(Server::Vsftpd, leaf, key)
        });
    }

    #[test]
    fn ftps_implicit_verifies_the_certificate() {
        crate::ftp::ftps_verifies_the_certificate_on("implicit", |leaf, key| {
            DebianFtp::start_implicit_tls(Server::Vsftpd, leaf, key)
        });
    }
}
