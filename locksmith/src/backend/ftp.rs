//! `backend = "ftp"`: the lock is the directory at `path` on an FTP server, existing exactly
//! while held (seed 000: `MKD` is atomic on vsftpd, pure-ftpd and libunftp).
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PATH/                                   the lock: exists exactly while held
//! PATH/owner~1~NONCE~SEQ~HOST~PID~PPID~START~BOOT~PIDNS~SINCE~PROFILE/
//!                                         empty directory; its *name* is the owner record
//! PARENT/NAME.tomb.NONCE/                 a released or broken lock on its way out
//! PARENT/NAME.state/state~1~TOKEN~CLEAN/   fencing-token state (see `issue_token`)
//! PARENT/NAME.readers/reader~1~.../        shared holders (see `shared.rs`)
//! ```
//! The owner record lives in the marker's *name*, so `NLST PATH` alone reads it: no `RETR`,
//! no `MLST`/`MDTM` (which vsftpd and pure-ftpd lack on directories), no clock on the server.
//! The marker is a directory made by `MKD`, so taking a free lock is two commands on the
//! control connection and no data connection at all (no `STOR`, no transfer type).
//! Only `MKD`, `RMD`, `RNFR`/`RNTO`, `NLST`, `CWD` and `PWD` are used (`DELE` for tidying
//! foreign litter, `LIST` of the parent only to explain a refused `MKD`), which vsftpd,
//! pure-ftpd and libunftp all have.
//!
//! # A refused `MKD`
//! `550` means exists, missing parent, permission or a file in the way, depending on the
//! server (libunftp even says "File not found" for exists). locksmith never reads the text:
//! it lists `PATH` (a lock → busy, judged below), then `CWD`s the parent (missing → config),
//! then tries an `MKD` beside the lock (refused → denied) and looks for a plain file named
//! like the lock in `LIST PARENT` (→ config); otherwise the lock came and went: try again.
//!
//! # Liveness without clock agreement
//! Every heartbeat the holder renames its marker to the next `SEQ` (`RNFR`/`RNTO`; the
//! command also resets the server's idle timer). A waiter on another host breaks the lock
//! only after seeing the directory's listing unchanged for `stale_after` on its own monotonic
//! clock. A waiter on the same host (equal boot id and pid namespace) decides by proof of
//! death at once, as for `mkdir`.
//!
//! # Removal is a claim
//! Whoever `RMD`s the exact marker name — the holder releasing, or a breaker — has the sole
//! right to remove that acquisition: a live holder renames its marker every heartbeat, so a
//! breaker acting on an old observation fails, and no breaker can remove a successor's lock
//! (its marker has another nonce). The claimant then frees the name: `RMD PATH` (empty now),
//! or if something else sits inside, renames `PATH` to a tombstone beside it and tidies that
//! (`DELE` its contents, `RMD`). Later lockers tidy tombstones left by a crash mid-way.
//!
//! # Connection
//! One control connection serves the whole acquisition (log in once: some servers hash
//! passwords slowly). Connect and read timeouts are 10 s while acquiring; while holding, a
//! whole heartbeat (reconnect and login included) must finish within `stale_after`/4 (at most
//! 10 s), so the caller's heartbeat policy can declare the lock lost before a waiter could
//! legally break in. A dropped connection is re-established by the next heartbeat, whose
//! rename proves our marker is still there (gone → `LOST`). Release reconnects if needed.
//! Data connections (`NLST`) get the same connect and read timeouts (a passive stream
//! builder), and connect to the control connection's address whatever `PASV` names.
//!
//! # FTPS
//! `tls = "explicit"`: `AUTH TLS` before login, `PROT P` for data, rustls with ring;
//! certificates are verified against `ca_file` or the system CA bundle. `tls = "implicit"`
//! (port 990 unless given): TLS from the first byte, then `PBSZ 0`/`PROT P` after login.
//!
//! # Limits
//! A lock directory without a marker (a locker killed between its two `MKD`s, or a foreign
//! tool's `MKD`) is broken after `stale_after` of an unchanged listing, by `RMD` alone: it
//! fails if a new holder's marker appeared meanwhile, so no window. A non-empty directory
//! without a marker is broken only by `break --force`.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use suppaftp::FtpError;
use suppaftp::RustlsConnector;

use super::owner::{Parsed, Record, State};
use super::wake::Wakeups;
use super::{Attempt, Backend, BreakOutcome, Grant, Holder, WaitHint};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::profile::{FtpConfig, Profile, Tls, fmt_duration};
use crate::watch::{Event, Watcher};

mod marker;
mod shared;

use marker::{is_marker, marker_name, parse_marker, parse_state, state_name};

/// The control connection type: plain until `AUTH TLS` (rustls with ring) upgrades it.
type Conn = suppaftp::RustlsFtpStream;

/// Read/connect timeout while acquiring (a slow login is no danger then).
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of the read timeout while holding.
const HOLD_TIMEOUT_MAX: Duration = Duration::from_secs(10);

/// Our acquisition.
struct Ours {
    rec: Record,
    seq: u64,
    /// The marker's current name (inside the lock directory).
    marker: String,
    /// The `RMD` of our marker was sent for release; its reply may have been lost.
    claim_sent: bool,
}

/// The outcome of one FTP command, as locksmith needs to tell them apart.
enum Reply {
    /// The server answered with this (negative) code; the raw reply is kept for messages.
    Refused(u32, String),
    /// The connection is unusable: I/O error, timeout, garbage, or a 421.
    Broken(String),
}

impl Reply {
    fn of(e: FtpError) -> Reply {
        match e {
            FtpError::UnexpectedResponse(r) => {
                let text = String::from_utf8_lossy(&r.body).trim().to_string();
                let mut code = r.status.code();
                if code == 0 {
                    // A code outside suppaftp's table: the raw line starts with it.
                    code = text.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
                }
                if code == 421 || code == 0 {
                    Reply::Broken(text)
                } else {
                    Reply::Refused(code, text)
                }
            }
            FtpError::ConnectionError(io) if io.kind() == std::io::ErrorKind::WouldBlock => {
                Reply::Broken("timed out waiting for the server".into())
            }
            other => Reply::Broken(other.to_string()),
        }
    }
}

/// What a look at the lock path found.
enum Look {
    Gone,
    /// The lock directory and the names inside it (sorted).
    Dir(Vec<String>),
}

pub struct Ftp {
    cfg: FtpConfig,
    profile: String,
    stale_after: Duration,
    heartbeat: Duration,
    poll: Duration,
    conn: Option<Conn>,
    /// The login directory (`PWD` right after login): `CWD` checks return there.
    home: String,
    /// Read timeout of the control and data connections, in milliseconds (shared with the
    /// passive-connection builder).
    timeout_ms: Arc<AtomicU64>,
    ours: Option<Ours>,
    /// What a waiter last saw of a holder it cannot judge at once, and since when.
    observed: Option<(Vec<String>, Instant)>,
    /// The pidfd of a same-host holder (no directory events over FTP).
    wake: Wakeups,
    prev_crashed: bool,
    /// While heartbeating: every command must be answered by then (a heartbeat that hangs
    /// would keep the caller from declaring the lock lost in time).
    deadline: Option<Instant>,
    /// The last refusal of `MKD`, for the message if it cannot be explained otherwise.
    last_mkd: Option<String>,
    /// A shared (reader) lock was asked for (see `shared.rs`).
    shared: bool,
    sh: shared::State,
}

impl Ftp {
    pub fn new(cfg: FtpConfig, profile: &Profile) -> Ftp {
        Ftp {
            profile: profile.name.clone(),
            stale_after: profile.common.stale_after,
            heartbeat: profile.common.heartbeat(),
            poll: profile.common.poll,
            cfg,
            conn: None,
            home: String::new(),
            timeout_ms: Arc::new(AtomicU64::new(ACQUIRE_TIMEOUT.as_millis() as u64)),
            ours: None,
            observed: None,
            wake: Wakeups::default(),
            prev_crashed: false,
            deadline: None,
            last_mkd: None,
            shared: profile.common.shared,
            sh: shared::State::default(),
        }
    }

    /// `ftp://user@host:port/path` for messages (never the password).
    fn url(&self) -> String {
        format!(
            "ftp://{}@{}:{}/{}",
            self.cfg.user,
            self.cfg.host,
            self.cfg.port,
            self.cfg.path.trim_start_matches('/')
        )
    }

    fn hold_timeout(&self) -> Duration {
        (self.stale_after / 4).clamp(Duration::from_millis(50), HOLD_TIMEOUT_MAX)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    fn set_timeout(&mut self, t: Duration) {
        self.timeout_ms
            .store(t.as_millis().max(1) as u64, Ordering::Relaxed);
        if let Some(c) = &self.conn {
            let _ = c.get_ref().set_read_timeout(Some(t));
            let _ = c.get_ref().set_write_timeout(Some(t));
        }
    }

    /// The timeout for the next operation: the configured one, or what is left before the
    /// heartbeat's deadline (an error once it has passed).
    fn op_timeout(&mut self) -> Result<Duration> {
        let t = self.timeout();
        let Some(d) = self.deadline else {
            return Ok(t);
        };
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.conn = None; // a command may be half-answered: start afresh next time
            return Err(err!(
                Unavailable,
                "FTP server {}:{} did not answer within {}",
                self.cfg.host,
                self.cfg.port,
                fmt_duration(self.hold_timeout())
            ));
        }
        Ok(t.min(left).max(Duration::from_millis(1)))
    }

    /// The parent directory of the lock on the server (`None`: the login directory).
    fn parent(&self) -> Option<&str> {
        self.cfg.path.rsplit_once('/').map(|(p, _)| p)
    }

    fn name(&self) -> &str {
        self.cfg
            .path
            .rsplit_once('/')
            .map_or(self.cfg.path.as_str(), |(_, n)| n)
    }

    fn inside(&self, entry: &str) -> String {
        format!("{}/{entry}", self.cfg.path)
    }

    fn tomb(&self, nonce: &str) -> String {
        let t = format!("{}.tomb.{nonce}", self.name());
        match self.parent() {
            Some(p) => format!("{p}/{t}"),
            None => t,
        }
    }

    /// The control connection, logged in; connects if there is none.
    fn conn(&mut self) -> Result<&mut Conn> {
        if self.conn.is_none() {
            let c = self.connect()?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    fn connect(&mut self) -> Result<Conn> {
        let t = self.op_timeout()?;
        // The secret first: a missing variable or unsafe file is a config error, whatever
        // the network does.
        let password = self.cfg.password.resolve(&self.cfg.user)?;
        let (host, port) = (self.cfg.host.as_str(), self.cfg.port);
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| err!(Unavailable, "cannot resolve FTP server {host}: {e}"))?
            .collect();
        let set = |s: &TcpStream, t: Duration| {
            s.set_read_timeout(Some(t))
                .and_then(|()| s.set_write_timeout(Some(t)))
        };
        let unavailable = |what: &str, e: FtpError| -> Error {
            let why = match Reply::of(e) {
                Reply::Refused(_, text) | Reply::Broken(text) => text,
            };
            err!(Unavailable, "FTP server {host}:{port}: {what}: {why}")
        };
        let mut ftp = if self.cfg.tls == Tls::Implicit {
            self.connect_implicit(&addrs, t)?
        } else {
            let mut last = None;
            let mut stream = None;
            for addr in &addrs {
                match TcpStream::connect_timeout(addr, t) {
                    Ok(s) => {
                        stream = Some(s);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            let Some(stream) = stream else {
                let why = last.map_or("no address".to_string(), |e| e.to_string());
                return Err(err!(
                    Unavailable,
                    "cannot connect to FTP server {host}:{port}: {why}"
                ));
            };
            set(&stream, t).map_err(|e| err!(Unavailable, "cannot set socket timeouts: {e}"))?;
            let _ = stream.set_nodelay(true);
            Conn::connect_with_stream(stream).map_err(|e| unavailable("no greeting", e))?
        };
        let timeout_ms = Arc::clone(&self.timeout_ms);
        ftp = ftp.passive_stream_builder(move |addr| {
            let t = Duration::from_millis(timeout_ms.load(Ordering::Relaxed));
            let s = TcpStream::connect_timeout(&addr, t).map_err(FtpError::ConnectionError)?;
            set(&s, t).map_err(FtpError::ConnectionError)?;
            Ok(s)
        });
        // Connect data channels to the server we talk to, whatever address PASV names.
        ftp.set_passive_nat_workaround(true);
        if self.cfg.tls == Tls::Explicit {
            let connector = RustlsConnector::from(self.tls_config()?);
            let hint = crate::tls::hint(self.cfg.ca_file.as_deref());
            ftp = ftp.into_secure(connector, host).map_err(|e| match e {
                FtpError::UnexpectedResponse(_) => match Reply::of(e) {
                    Reply::Refused(code, text) => err!(
                        Unavailable,
                        "FTP server {host}:{port} refused TLS (AUTH TLS): {text} (code {code})"
                    ),
                    Reply::Broken(why) => {
                        err!(
                            Unavailable,
                            "TLS with FTP server {host}:{port} failed: {why}"
                        )
                    }
                },
                // rustls completes the handshake on first use: a bad certificate shows up
                // as an I/O error of the first command after AUTH TLS.
                other => err!(
                    Unavailable,
                    "TLS with FTP server {host}:{port} failed: {other}{hint}"
                ),
            })?;
        }
        match ftp.login(self.cfg.user.as_str(), password.as_str()) {
            Ok(()) => {}
            Err(e) => {
                return Err(match Reply::of(e) {
                    Reply::Refused(code @ (530 | 532), text) => err!(
                        Denied,
                        "FTP server {host}:{port} refused the login of user {}: {} (code {code})",
                        self.cfg.user,
                        text
                    ),
                    Reply::Refused(_, text) | Reply::Broken(text) => err!(
                        Unavailable,
                        "FTP server {host}:{port}: login of user {} failed: {text}",
                        self.cfg.user
                    ),
                });
            }
        }
        drop(password);
        if self.cfg.tls == Tls::Implicit {
            // Data connections in TLS too (suppaftp wraps them; the server must expect it).
            for c in ["PBSZ 0", "PROT P"] {
                ftp.custom_command(c, &[suppaftp::Status::CommandOk])
                    .map_err(|e| unavailable(c, e))?;
            }
        }
        self.home = ftp.pwd().map_err(|e| unavailable("PWD", e))?;
        debug!("logged in to {}", self.url());
        Ok(ftp)
    }

    /// Implicit FTPS: TLS from the first byte. suppaftp connects without timeouts here, so
    /// the connect, handshake and greeting run on a thread we wait for at most `t`; one
    /// that hangs is left behind (it ends with its socket's own timeouts or the process).
    fn connect_implicit(&self, addrs: &[SocketAddr], t: Duration) -> Result<Conn> {
        let (host, port) = (self.cfg.host.clone(), self.cfg.port);
        let config = self.tls_config()?;
        let hint = crate::tls::hint(self.cfg.ca_file.as_deref());
        let mut last = "no address".to_string();
        for &addr in addrs {
            let (tx, rx) = std::sync::mpsc::channel();
            let (connector, domain) = (RustlsConnector::from(config.clone()), host.clone());
            std::thread::spawn(move || {
                let _ = tx.send(Conn::connect_secure_implicit(addr, connector, &domain));
            });
            match rx.recv_timeout(t) {
                Ok(Ok(ftp)) => {
                    let s = ftp.get_ref();
                    s.set_read_timeout(Some(t))
                        .and_then(|()| s.set_write_timeout(Some(t)))
                        .map_err(|e| err!(Unavailable, "cannot set socket timeouts: {e}"))?;
                    let _ = s.set_nodelay(true);
                    drop(s);
                    return Ok(ftp);
                }
                // rustls reports a rejected certificate on first use: reading the greeting.
                Ok(Err(FtpError::ConnectionError(e)))
                    if e.kind() != std::io::ErrorKind::InvalidData =>
                {
                    last = e.to_string()
                }
                Ok(Err(FtpError::ConnectionError(e))) => {
                    return Err(err!(
                        Unavailable,
                        "TLS with FTP server {host}:{port} (implicit) failed: {e}{hint}"
                    ));
                }
                Ok(Err(FtpError::SecureError(e))) => {
                    return Err(err!(
                        Unavailable,
                        "TLS with FTP server {host}:{port} (implicit) failed: {e}{hint}"
                    ));
                }
                Ok(Err(e)) => {
                    let why = match Reply::of(e) {
                        Reply::Refused(_, text) | Reply::Broken(text) => text,
                    };
                    return Err(err!(
                        Unavailable,
                        "FTP server {host}:{port} (implicit TLS): no greeting: {why}{hint}"
                    ));
                }
                Err(_) => {
                    last = format!(
                        "no TLS greeting within {} (is it an implicit-FTPS port?)",
                        fmt_duration(t)
                    )
                }
            }
        }
        Err(err!(
            Unavailable,
            "cannot connect to FTP server {host}:{port} (implicit TLS): {last}"
        ))
    }

    /// The TLS settings: certificates verified against `ca_file`, or else the system's CAs.
    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        crate::tls::client_config(self.cfg.ca_file.as_deref(), true).map(Arc::new)
    }

    /// Runs one command on the (re)connected control connection; a broken connection is
    /// dropped (the next command reconnects) and reported as `Unavailable`.
    fn cmd<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Conn) -> suppaftp::FtpResult<T>,
    ) -> Result<std::result::Result<T, (u32, String)>> {
        let url = self.url();
        if self.deadline.is_some() {
            let t = self.op_timeout()?;
            self.set_timeout(t);
        }
        let conn = self.conn()?;
        match f(conn) {
            Ok(v) => Ok(Ok(v)),
            Err(e) => match Reply::of(e) {
                Reply::Refused(code, text) => Ok(Err((code, text))),
                Reply::Broken(why) => {
                    self.conn = None;
                    Err(err!(
                        Unavailable,
                        "FTP connection for {url} failed during {what}: {why}"
                    ))
                }
            },
        }
    }

    /// Whether `dir` is a directory we can enter (`CWD`, then back home).
    fn is_dir(&mut self, dir: &str) -> Result<bool> {
        let d = dir.to_string();
        if self.cmd("CWD", |c| c.cwd(d.as_str()))?.is_err() {
            return Ok(false);
        }
        let home = self.home.clone();
        if let Err((_, text)) = self.cmd("CWD", |c| c.cwd(home.as_str()))? {
            self.conn = None; // relative paths would now be wrong
            return Err(err!(
                Io,
                "FTP server: cannot return to the login directory {home}: {text}"
            ));
        }
        Ok(true)
    }

    /// Lists the lock directory, without changing anything.
    fn look(&mut self) -> Result<Look> {
        let path = self.cfg.path.clone();
        let mut names: Vec<String> = match self.cmd("NLST", |c| c.nlst(Some(path.as_str())))? {
            Ok(lines) => lines
                .iter()
                .map(|l| l.rsplit('/').next().unwrap_or(l).to_string())
                .filter(|n| !n.is_empty() && n != "." && n != "..")
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        if names.iter().any(|n| is_marker(n)) {
            return Ok(Look::Dir(names));
        }
        // Empty, missing, or not a directory: NLST does not tell these apart everywhere.
        if self.is_dir(&path)? {
            Ok(Look::Dir(names))
        } else {
            Ok(Look::Gone)
        }
    }

    /// `MKD`, then the owner marker inside. `Ok(false)`: refused (exists, or see below).
    fn create(&mut self) -> Result<bool> {
        let path = self.cfg.path.clone();
        if let Err((code, text)) = self.cmd("MKD", |c| c.mkdir(path.as_str()))? {
            debug!("MKD {path}: {text} (code {code})");
            self.last_mkd = Some(text);
            return Ok(false);
        }
        let rec = Record::ours(&self.profile);
        let marker = marker_name(&rec, 0);
        let target = self.inside(&marker);
        match self.cmd("MKD", |c| c.mkdir(target.as_str())) {
            Ok(Ok(())) => {}
            Ok(Err((code, text))) => {
                // Refused right after our `MKD PATH`: look before concluding anything. Gone,
                // or holding a marker: not ours any more (removed by someone, perhaps taken
                // since) — try again as a locker would. Still there and empty: we may not
                // write inside it; remove it (an empty lock directory is nobody's lock).
                match self.look()? {
                    Look::Dir(names) if names.is_empty() => {
                        let _ = self.cmd("RMD", |c| c.rmdir(path.as_str()));
                        return Err(err!(
                            Denied,
                            "cannot create owner marker in {}: {text} (code {code})",
                            self.url()
                        ));
                    }
                    _ => {
                        debug!("MKD {target}: {text} (code {code}); the lock changed hands");
                        return Ok(false);
                    }
                }
            }
            Err(e) => {
                // The connection broke: leave nothing behind (the directory is ours, and
                // empty unless our marker made it).
                let _ = self.cmd("RMD", |c| c.rmdir(target.as_str()));
                let _ = self.cmd("RMD", |c| c.rmdir(path.as_str()));
                return Err(e);
            }
        }
        self.ours = Some(Ours {
            rec,
            seq: 0,
            marker,
            claim_sent: false,
        });
        Ok(true)
    }

    /// `MKD PATH` was refused although nothing is there: permission, or a file in the way?
    /// `None`: neither (the lock came and went meanwhile).
    fn diagnose_refusal(&mut self) -> Result<Option<Error>> {
        let mkd = self.last_mkd.clone().unwrap_or_else(|| "refused".into());
        // Named like a tombstone, so a crash right here leaves litter that gets tidied.
        let probe = self.tomb(&crate::host::nonce());
        match self.cmd("MKD", |c| c.mkdir(probe.as_str()))? {
            Ok(()) => {
                let _ = self.cmd("RMD", |c| c.rmdir(probe.as_str()))?;
            }
            Err((code, text)) => {
                return Ok(Some(err!(
                    Denied,
                    "cannot create lock directory {}: {mkd}; nor anything beside it: {text} (code {code}): permission denied",
                    self.url()
                )));
            }
        }
        // A file in the way? `LIST PARENT` shows it as an `ls -l` line of type `-` (vsftpd,
        // pure-ftpd, libunftp); a lock directory never looks like that, however it comes
        // and goes meanwhile. Other listing formats are simply not diagnosed.
        let (parent, name) = (self.parent().map(str::to_string), self.name().to_string());
        if let Ok(lines) = self.cmd("LIST", |c| c.list(parent.as_deref()))? {
            let file = lines.iter().any(|l| {
                l.starts_with('-') && l.split_whitespace().last().is_some_and(|n| n == name)
            });
            if file {
                return Ok(Some(err!(
                    Config,
                    "cannot create lock directory {}: a file is in the way",
                    self.url()
                )));
            }
        }
        Ok(None)
    }

    /// True when `names` stayed the same for `stale_after` of our own observation.
    fn silent_for_stale(&mut self, names: &[String]) -> bool {
        match &self.observed {
            Some((seen, since)) if seen == names => since.elapsed() >= self.stale_after,
            _ => {
                self.observed = Some((names.to_vec(), Instant::now()));
                false
            }
        }
    }

    /// Claims one acquisition by deleting its marker, then frees the name.
    /// `Ok(false)`: the marker was not there under that name (renamed by a live holder's
    /// heartbeat, or claimed by someone else first).
    fn claim_and_remove(&mut self, marker: &str) -> Result<bool> {
        let target = self.inside(marker);
        if !self.remove_marker(&target)? {
            debug!("{target} is gone: not ours to remove");
            return Ok(false);
        }
        let nonce = parse_marker(marker)
            .map(|(rec, _)| rec.nonce)
            .unwrap_or_else(crate::host::nonce);
        self.free_name(&nonce)?;
        Ok(true)
    }

    /// Removes a marker by its exact name: `RMD` (ours are directories), else `DELE` (a
    /// file left by something else). `Ok(false)`: not there under that name.
    fn remove_marker(&mut self, target: &str) -> Result<bool> {
        let t = target.to_string();
        if self.cmd("RMD", |c| c.rmdir(t.as_str()))?.is_ok() {
            return Ok(true);
        }
        Ok(self.cmd("DELE", |c| c.rm(t.as_str()))?.is_ok())
    }

    /// Frees the name after a claim: `RMD` if the directory is empty (the usual case: the
    /// claim removed the only entry), else rename it to a tombstone (frees the name whatever
    /// sits inside) and tidy that; tidying may fail without leaving the lock held.
    fn free_name(&mut self, nonce: &str) -> Result<()> {
        let (path, tomb) = (self.cfg.path.clone(), self.tomb(nonce));
        let rmd_err = match self.cmd("RMD", |c| c.rmdir(path.as_str()))? {
            Ok(()) => return Ok(()),
            Err((_, text)) => text,
        };
        match self.cmd("RNFR/RNTO", |c| c.rename(path.as_str(), tomb.as_str()))? {
            Ok(()) => {
                self.tidy(&tomb);
                Ok(())
            }
            Err((code, text)) => match self.look()? {
                Look::Gone => Ok(()), // freed by someone else meanwhile
                Look::Dir(_) => Err(err!(
                    Io,
                    "cannot remove lock directory {}: RMD: {rmd_err}; rename: {text} (code {code})",
                    self.url()
                )),
            },
        }
    }

    /// Removes a tombstone and what it holds; failures only leave litter.
    fn tidy(&mut self, tomb: &str) {
        let t = tomb.to_string();
        let names = match self.cmd("NLST", |c| c.nlst(Some(t.as_str()))) {
            Ok(Ok(lines)) => lines,
            _ => Vec::new(),
        };
        for n in names {
            let base = n.rsplit('/').next().unwrap_or(&n);
            if base.is_empty() || base == "." || base == ".." {
                continue;
            }
            let f = format!("{t}/{base}");
            let _ = self.remove_marker(&f);
        }
        match self.cmd("RMD", |c| c.rmdir(t.as_str())) {
            Ok(Ok(())) => {}
            Ok(Err((_, text))) => debug!("left tombstone {t} behind: {text}"),
            Err(e) => debug!("left tombstone {t} behind: {e}"),
        }
    }

    /// Tidies tombstones that crashed releasers or breakers left beside the lock.
    fn tidy_leftovers(&mut self) {
        let parent = self.parent().map(str::to_string);
        let prefix = format!("{}.tomb.", self.name());
        let listed = self.cmd("NLST", |c| c.nlst(parent.as_deref()));
        let Ok(Ok(lines)) = listed else {
            return;
        };
        for l in lines {
            let base = l.rsplit('/').next().unwrap_or(&l);
            if let Some(nonce) = base.strip_prefix(&prefix) {
                let tomb = self.tomb(nonce);
                debug!("tidying leftover tombstone {tomb}");
                self.tidy(&tomb);
            }
        }
    }

    /// Breaks a lock directory without a marker. `RMD` fails if a holder's marker (or
    /// anything) appeared meanwhile, so a successor is never removed; only `force` renames a
    /// non-empty one away. `Ok(false)`: not removed.
    fn remove_ownerless(&mut self, force: bool) -> Result<bool> {
        let path = self.cfg.path.clone();
        if let Err((code, text)) = self.cmd("RMD", |c| c.rmdir(path.as_str()))? {
            if !force {
                debug!("RMD {path}: {text} (code {code}): not empty, or gone");
                return Ok(false);
            }
            let nonce = crate::host::nonce();
            self.free_name(&nonce)?;
        }
        Ok(true)
    }

    /// Decides about an existing lock: `Some(holders)` busy, `None` it was just broken.
    fn judge(&mut self, names: Vec<String>) -> Result<Option<Vec<Holder>>> {
        let Some(marker) = names.iter().find(|n| is_marker(n)).cloned() else {
            if self.silent_for_stale(&names) {
                info!(
                    "breaking lock {} without owner marker, unchanged for {}",
                    self.url(),
                    fmt_duration(self.stale_after)
                );
                if !self.remove_ownerless(false)? {
                    return Ok(Some(Vec::new()));
                }
                self.observed = None;
                return Ok(None);
            }
            return Ok(Some(Vec::new()));
        };
        let Some((rec, _)) = parse_marker(&marker) else {
            return Ok(Some(vec![Parsed::Foreign(marker).holder()]));
        };
        let mut holder = rec.holder();
        if rec.same_host() {
            if self.wake.holder_alive(rec.pid, rec.start) {
                return Ok(Some(vec![holder]));
            }
            info!(
                "breaking lock {} of dead holder {holder} (same host: proof of death)",
                self.url()
            );
        } else {
            if !self.silent_for_stale(&names) {
                return Ok(Some(vec![holder]));
            }
            holder.alive = Some(false);
            info!(
                "breaking lock {} of {holder}: no heartbeat for {}",
                self.url(),
                fmt_duration(self.stale_after)
            );
        }
        self.observed = None;
        if self.claim_and_remove(&marker)? {
            self.prev_crashed = true;
        }
        Ok(None)
    }

    /// Our marker's current name on the server, found by our nonce (`None`: it is gone).
    fn find_ours(&mut self) -> Result<Option<(String, u64)>> {
        let Some(nonce) = self.ours.as_ref().map(|o| o.rec.nonce.clone()) else {
            return Ok(None);
        };
        let Look::Dir(names) = self.look()? else {
            return Ok(None);
        };
        Ok(names.into_iter().find_map(|n| {
            let (rec, seq) = parse_marker(&n)?;
            (rec.nonce == nonce).then_some((n, seq))
        }))
    }

    /// [`Self::find_ours`], and when it says gone, once more on a fresh session: a server
    /// under load has answered a listing without entries that were there (libunftp), and
    /// a false "gone" would make a live holder give its lock up.
    fn find_ours_twice(&mut self) -> Result<Option<(String, u64)>> {
        if let Some(found) = self.find_ours()? {
            return Ok(Some(found));
        }
        self.quit();
        self.find_ours()
    }

    /// One heartbeat: rename our marker to the next sequence number.
    fn beat(&mut self) -> Result<()> {
        let Some(ours) = &self.ours else {
            return Err(err!(Lost, "not holding"));
        };
        let next = marker_name(&ours.rec, ours.seq + 1);
        let (from, to) = (self.inside(&ours.marker), self.inside(&next));
        match self.cmd("heartbeat (RNFR/RNTO)", |c| {
            c.rename(from.as_str(), to.as_str())
        })? {
            Ok(()) => {
                let ours = self.ours.as_mut().expect("checked above");
                ours.seq += 1;
                ours.marker = next;
                Ok(())
            }
            Err((code, text)) => match self.find_ours_twice()? {
                // Our marker moved (a rename whose reply was lost): adopt it, retry soon.
                Some((name, seq)) => {
                    let ours = self.ours.as_mut().expect("checked above");
                    ours.marker = name;
                    ours.seq = seq;
                    Err(err!(
                        Unavailable,
                        "heartbeat of {} refused: {text} (code {code})",
                        self.url()
                    ))
                }
                None => Err(err!(
                    Lost,
                    "lock {} was broken: our owner marker is gone",
                    self.url()
                )),
            },
        }
    }

    /// One round of attempts on the current connection.
    fn try_once(&mut self) -> Result<Attempt> {
        let mut holders = Vec::new();
        let mut gone = 0;
        for _ in 0..4 {
            if self.create()? {
                self.observed = None;
                self.wake.forget_holder();
                self.set_timeout(self.hold_timeout());
                // Tombstones are left only by a release or break cut short: look for them
                // after a break, and now and then (a listing costs a data connection).
                if self.prev_crashed || fastrand::u8(..16) == 0 {
                    self.tidy_leftovers();
                }
                return Ok(Attempt::Acquired(Grant {
                    token: None,
                    prev_crashed: std::mem::take(&mut self.prev_crashed),
                }));
            }
            // 550 is ambiguous (exists, missing parent, permission, a file in the way):
            // decide by looking, never by the reply's text.
            match self.look()? {
                Look::Dir(names) => match self.judge(names)? {
                    Some(h) => {
                        holders = h;
                        break;
                    }
                    None => continue,
                },
                Look::Gone => {
                    if let Some(parent) = self.parent().map(str::to_string)
                        && !self.is_dir(&parent)?
                        && {
                            // Confirm on a fresh session, a moment later, before calling it a
                            // config error (libunftp was seen to refuse a CWD spuriously under
                            // races and heavy load).
                            self.conn = None;
                            std::thread::sleep(self.poll.min(Duration::from_secs(1)));
                            !self.is_dir(&parent)?
                        }
                    {
                        return Err(err!(
                            Config,
                            "cannot create lock directory {}: the parent directory {parent} does not exist on the server (locksmith never creates parent directories)",
                            self.url()
                        ));
                    }
                    // Usually released between our MKD and our look; if it keeps
                    // happening, find out whether something else refuses us.
                    gone += 1;
                    if gone >= 2
                        && let Some(e) = self.diagnose_refusal()?
                    {
                        return Err(e);
                    }
                }
            }
        }
        Ok(Attempt::Busy(holders))
    }

    /// `PARENT/NAME.state`: the fencing-token state, beside the lock.
    fn state_dir(&self) -> String {
        let n = format!("{}.state", self.name());
        match self.parent() {
            Some(p) => format!("{p}/{n}"),
            None => n,
        }
    }

    /// The state entry (`state~1~TOKEN~CLEAN`): its name, the last token issued and whether
    /// that acquisition ended in a clean release. `None`: no token issued yet. Several
    /// entries (never made by locksmith) count by the highest token.
    fn read_state(&mut self) -> Result<Option<(String, State)>> {
        let dir = self.state_dir();
        // `STAT DIR` lists on the control connection (`ls -l` lines: vsftpd, pure-ftpd),
        // saving the data connection of `NLST`, which some servers answer slowly. A reply
        // without a state entry (an unsupported `STAT`, or none yet) is checked by `NLST`.
        let stat = format!("STAT {dir}");
        let listed = self.cmd("STAT", |c| {
            c.custom_command(
                stat.as_str(),
                // Not 211: suppaftp then takes "211-" for FEAT's opener and would stop
                // reading after the first line, leaving the rest of the reply behind.
                &[suppaftp::Status::Directory, suppaftp::Status::File],
            )
        })?;
        if let Ok(r) = &listed {
            debug!("STAT {dir}: {:?}", String::from_utf8_lossy(&r.body));
        }
        let mut names: Vec<String> = match listed {
            Ok(r) => String::from_utf8_lossy(&r.body)
                .split_whitespace()
                .filter(|w| parse_state(w).is_some())
                .map(str::to_string)
                .collect(),
            Err(_) => Vec::new(),
        };
        if names.is_empty() {
            names = self.entries(&dir)?;
        }
        let mut best: Option<(String, State)> = None;
        for n in names {
            if let Some(st) = parse_state(&n)
                && best.as_ref().is_none_or(|(_, b)| st.token > b.token)
            {
                best = Some((n, st));
            }
        }
        Ok(best)
    }

    /// Issues the next fencing token, holding the gate: renames the state entry to TOKEN+1,
    /// marked not clean until our release. Returns the token and whether the previous
    /// acquisition ended uncleanly. The rename of the exact old name is a compare-and-swap
    /// (a holder broken as stale and still running cannot interleave a stale write).
    fn issue_token(&mut self) -> Result<(u64, bool)> {
        let dir = self.state_dir();
        for _ in 0..4 {
            match self.read_state()? {
                Some((name, st)) => {
                    let next = state_name(st.token + 1, false);
                    let (from, to) = (format!("{dir}/{name}"), format!("{dir}/{next}"));
                    match self.cmd("RNFR/RNTO", |c| c.rename(from.as_str(), to.as_str()))? {
                        Ok(()) => return Ok((st.token + 1, !st.clean)),
                        Err((code, text)) => {
                            debug!("state {from} → {to}: {text} (code {code}); reading again");
                        }
                    }
                }
                None => {
                    // A new state directory only when `MKD` says it was missing: an empty
                    // listing alone (a server's hiccup) must never restart the tokens at 1.
                    let made = self.cmd("MKD", |c| c.mkdir(dir.as_str()))?.is_ok();
                    if made || self.entries(&dir)?.is_empty() && self.is_dir(&dir)? {
                        let first = format!("{dir}/{}", state_name(1, false));
                        if self.cmd("MKD", |c| c.mkdir(first.as_str()))?.is_ok() {
                            return Ok((1, false));
                        }
                    }
                }
            }
        }
        Err(err!(
            Io,
            "cannot issue a fencing token for {}: the state in {dir} keeps changing or cannot be written",
            self.url()
        ))
    }

    /// Marks our acquisition's state entry clean (before the release removes our marker).
    /// A failure only makes the next holder say `prev=crashed`.
    fn mark_clean(&mut self, token: u64) {
        let dir = self.state_dir();
        let (from, to) = (
            format!("{dir}/{}", state_name(token, false)),
            format!("{dir}/{}", state_name(token, true)),
        );
        match self.cmd("RNFR/RNTO", |c| c.rename(from.as_str(), to.as_str())) {
            Ok(Ok(())) => {}
            Ok(Err((_, text))) => debug!("state {from} not marked clean: {text}"),
            Err(e) => debug!("state {from} not marked clean: {e}"),
        }
    }

    /// With the lock just taken exclusively: issue the token and put it into our marker
    /// (the rename doubles as a first heartbeat).
    fn stamp_token(&mut self, grant: &mut Grant) -> Result<()> {
        let (token, dirty) = self.issue_token()?;
        if let Some(o) = self.ours.as_mut() {
            o.rec.token = Some(token);
        }
        self.beat()?;
        grant.token = Some(token);
        grant.prev_crashed |= dirty;
        Ok(())
    }

    /// Tries for the gate — the exclusive lock directory — reconnecting a few times.
    fn try_gate(&mut self) -> Result<Attempt> {
        self.set_timeout(ACQUIRE_TIMEOUT);
        // A connection that worked and then broke (server restart, a dropped session) is
        // re-established a few times; a server that cannot be reached at all is an error.
        let mut retries = 0;
        loop {
            let had_conn = self.conn.is_some();
            match self.try_once() {
                Err(e) if e.kind() == Kind::Unavailable && had_conn && retries < 3 => {
                    retries += 1;
                    debug!("{e}; reconnecting");
                    std::thread::sleep(self.poll.min(Duration::from_secs(1)));
                }
                other => return other,
            }
        }
    }

    /// Releases (see `Backend::release`): remove our marker (the claim), then the name.
    fn release_once(&mut self) -> Result<()> {
        let Some(ours) = self.ours.as_mut() else {
            return Ok(());
        };
        let marker = ours.marker.clone();
        let claim_was_sent = ours.claim_sent;
        ours.claim_sent = true;
        let nonce = ours.rec.nonce.clone();
        let token = ours.rec.token;
        let target = self.inside(&marker);
        if let Some(t) = token
            && !claim_was_sent
        {
            self.mark_clean(t);
        }
        // An error here keeps `ours`: the caller retries until stale_after.
        if !self.remove_marker(&target)? {
            match self.find_ours()? {
                Some((name, seq)) => {
                    let ours = self.ours.as_mut().expect("checked above");
                    ours.marker = name;
                    ours.seq = seq;
                    ours.claim_sent = false;
                    return Err(err!(
                        Io,
                        "cannot release lock {}: the server refused to remove our owner marker",
                        self.url()
                    ));
                }
                None => {
                    self.ours = None;
                    if claim_was_sent {
                        // Our RMD went through but its reply was lost. The name is not
                        // freed here: the directory we see may already be a newcomer's,
                        // between its `MKD PATH` and its marker. Ours, left ownerless, is
                        // broken after `stale_after` like any lock without a marker.
                        debug!(
                            "our marker's removal went through unanswered; leaving {} to stale_after",
                            self.url()
                        );
                        return Ok(());
                    }
                    return Err(err!(
                        Lost,
                        "lock {} was broken while held: our owner marker is gone",
                        self.url()
                    ));
                }
            }
        }
        self.free_name(&nonce)?;
        self.ours = None;
        Ok(())
    }

    /// Ends the session politely (a dropped connection would do, but servers log it).
    fn quit(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = c.quit();
        }
    }
}

impl Backend for Ftp {
    fn name(&self) -> &'static str {
        "ftp"
    }

    fn try_acquire(&mut self) -> Result<Attempt> {
        self.attempt()
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        Ok(WaitHint { poll: true })
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.wake.fds()
    }

    fn heartbeat_period(&self) -> Option<Duration> {
        Some(self.heartbeat)
    }

    fn heartbeat(&mut self, deadline: Instant) -> Result<()> {
        let was_connected = self.conn.is_some();
        self.deadline = Some((Instant::now() + self.hold_timeout()).min(deadline));
        let r = if self.sh.reader.is_some() {
            self.beat_reader()
        } else {
            self.beat()
        };
        self.deadline = None;
        self.set_timeout(self.hold_timeout());
        if r.is_ok() && !was_connected {
            info!("reconnected to {}; the lock is still ours", self.url());
        }
        r
    }

    fn release(&mut self) -> Result<()> {
        if self.sh.reader.is_some() {
            self.release_reader()?;
        } else {
            self.release_once()?;
        }
        self.quit();
        Ok(())
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        // Readers first: the gate is also held for a moment by each reader registering,
        // and the mode shown is the first holder's.
        let mut holders = self.reader_holders()?;
        holders.extend(self.gate_holders()?);
        Ok(holders)
    }

    fn break_lock(
        &mut self,
        force: bool,
        token: Option<u64>,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        let gate = self.break_gate(force, token, watcher)?;
        if let Some(want) = token {
            // A token names one exclusive acquisition: readers are never it.
            if !self.reader_holders()?.is_empty() {
                return Err(err!(
                    Busy,
                    "lock {} is held shared, not by acquisition {want}; nothing broken",
                    self.url()
                ));
            }
            return Ok(gate);
        }
        let readers = self.break_readers(force, watcher)?;
        Ok(match (gate, readers) {
            (BreakOutcome::Broken(h), _) => BreakOutcome::Broken(h),
            (BreakOutcome::Free, Some(h)) => BreakOutcome::Broken(h),
            (BreakOutcome::Free, None) => BreakOutcome::Free,
        })
    }
}

impl Drop for Ftp {
    fn drop(&mut self) {
        self.abandon_gate();
    }
}

impl Ftp {
    /// The holder of the gate (exclusive), if any.
    fn gate_holders(&mut self) -> Result<Vec<Holder>> {
        let mut holders = match self.look()? {
            Look::Gone => Vec::new(),
            Look::Dir(names) => match names.iter().find(|n| is_marker(n)) {
                Some(m) => match parse_marker(m) {
                    Some((rec, _)) => vec![rec.holder()],
                    None => vec![Parsed::Foreign(m.clone()).holder()],
                },
                None => vec![Holder::default()],
            },
        };
        for h in &mut holders {
            h.mode = Some(crate::protocol::Mode::Exclusive);
        }
        Ok(holders)
    }

    /// `break` of the gate: the exclusive lock directory.
    fn break_gate(
        &mut self,
        force: bool,
        token: Option<u64>,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        let mut announced = false;
        loop {
            let names = match self.look()? {
                Look::Gone => return Ok(BreakOutcome::Free),
                Look::Dir(names) => names,
            };
            let marker = names.iter().find(|n| is_marker(n)).cloned();
            let parsed = marker.as_deref().map(parse_marker);
            let holder = match (&marker, &parsed) {
                (Some(_), Some(Some((rec, _)))) => rec.holder(),
                (Some(m), _) => Parsed::Foreign(m.clone()).holder(),
                (None, _) => Holder::default(),
            };
            if let Some(want) = token
                && holder.token != Some(want)
            {
                let which = holder
                    .token
                    .map_or("an acquisition without a token".to_string(), |t| {
                        format!("acquisition {t}")
                    });
                return Err(err!(
                    Busy,
                    "lock {} is held by {which} ({holder}), not by acquisition {want}; nothing broken",
                    self.url()
                ));
            }
            let decided = match &parsed {
                _ if force => true,
                Some(None) => {
                    return Err(err!(
                        Busy,
                        "lock {} has an owner marker of another format ({holder}); only --force breaks it",
                        self.url()
                    ));
                }
                Some(Some((rec, _))) if rec.same_host() => {
                    if crate::host::alive(rec.pid, rec.start) {
                        return Err(err!(
                            Busy,
                            "lock {} is held by {holder}, which is alive; use --force to break it anyway",
                            self.url()
                        ));
                    }
                    true
                }
                _ => self.silent_for_stale(&names),
            };
            if decided {
                let done = match &marker {
                    Some(m) => self.claim_and_remove(m)?,
                    None => {
                        if !self.remove_ownerless(force)? {
                            return Err(err!(
                                Busy,
                                "lock {} has no owner marker but is not empty (another tool's directory, or a new holder just arrived); only --force breaks it",
                                self.url()
                            ));
                        }
                        true
                    }
                };
                if done {
                    info!("broke lock {} of {holder}", self.url());
                    return Ok(BreakOutcome::Broken(holder));
                }
                continue;
            }
            if !announced {
                info!(
                    "lock {} is held by {holder} on another host; breaking it if it stays silent for {}",
                    self.url(),
                    fmt_duration(self.stale_after)
                );
                announced = true;
            }
            if let Event::Release(cause) = watcher.wait(&[], Some(self.poll))? {
                return Err(Error::new(
                    Kind::Busy,
                    format!("stopped before breaking: {cause}"),
                ));
            }
        }
    }
}
