//! One FTP session: the control connection (connect, log in, TLS, timeouts, reconnect on
//! the next command) and the commands every part of the backend needs: look at a directory,
//! remove an exact marker (the claim), free the lock's name.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use suppaftp::FtpError;
use suppaftp::RustlsConnector;

use super::marker::{is_marker, parse_marker};
use super::config::{FtpConfig, Tls};
use crate::error::{Error, Result, err};
use crate::settings::Password;
use crate::log::debug;
use crate::settings::fmt_duration;

/// The control connection type: plain until `AUTH TLS` (rustls with ring) upgrades it.
pub(super) type Conn = suppaftp::RustlsFtpStream;

/// Read/connect timeout while acquiring (a slow login is no danger then).
pub(super) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of the read timeout while holding.
pub(super) const HOLD_TIMEOUT_MAX: Duration = Duration::from_secs(10);

/// The outcome of one FTP command, as locksmith needs to tell them apart.
pub(super) enum Reply {
    /// The server answered with this (negative) code; the raw reply is kept for messages.
    Refused(u32, String),
    /// The connection is unusable: I/O error, timeout, garbage, or a 421.
    Broken(String),
}

impl Reply {
    pub(super) fn of(e: FtpError) -> Reply {
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
pub(super) enum Look {
    Gone,
    /// The lock directory and the names inside it (sorted).
    Dir(Vec<String>),
}

/// The session: its settings, its connection (if any) and its timeouts.
pub(super) struct Session {
    pub(super) cfg: FtpConfig,
    stale_after: Duration,
    pub(super) conn: Option<Conn>,
    /// The login directory (`PWD` right after login): `CWD` checks return there.
    home: String,
    /// Read timeout of the control and data connections, in milliseconds (shared with the
    /// passive-connection builder).
    timeout_ms: Arc<AtomicU64>,
    /// While heartbeating: every command must be answered by then (a heartbeat that hangs
    /// would keep the caller from declaring the lock lost in time).
    pub(super) deadline: Option<Instant>,
    /// The last refusal of `MKD`, for the message if it cannot be explained otherwise.
    pub(super) last_mkd: Option<String>,
    /// The lock's number of slots (SPEC §3b), recorded with each token.
    pub(super) slots: u32,
    /// What to ask before issuing over another recorded number of slots.
    pub(super) agree: Option<crate::backend::lock::Agree>,
    /// The state entry a token issue of ours renames to (or makes), its token and whether the
    /// state before it was dirty, while our gate marker stands: a rename whose reply was lost
    /// is found as ours by the next issue (issue 27). Cleared when a new gate is made.
    pub(super) issued: Option<(String, u64, bool)>,
}

impl Session {
    pub(super) fn new(cfg: FtpConfig, stale_after: Duration, slots: u32) -> Session {
        Session {
            slots,
            agree: None,
            cfg,
            stale_after,
            conn: None,
            home: String::new(),
            timeout_ms: Arc::new(AtomicU64::new(ACQUIRE_TIMEOUT.as_millis() as u64)),
            deadline: None,
            last_mkd: None,
            issued: None,
        }
    }

    /// `ftp://user@host:port/path` for messages (never the password).
    pub(super) fn url(&self) -> String {
        url_of(&self.cfg)
    }

    pub(super) fn hold_timeout(&self) -> Duration {
        (self.stale_after / 4).clamp(Duration::from_millis(50), HOLD_TIMEOUT_MAX)
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    pub(super) fn set_timeout(&mut self, t: Duration) {
        self.timeout_ms
            .store(t.as_millis().max(1) as u64, Ordering::Relaxed);
        if let Some(c) = &self.conn {
            let _ = c.get_ref().set_read_timeout(Some(t));
            let _ = c.get_ref().set_write_timeout(Some(t));
        }
    }

    /// The timeout for the next operation: the configured one, or what is left before the
    /// heartbeat's deadline (an error once it has passed).
    pub(super) fn op_timeout(&mut self) -> Result<Duration> {
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
    pub(super) fn parent(&self) -> Option<&str> {
        self.cfg.path.rsplit_once('/').map(|(p, _)| p)
    }

    pub(super) fn name(&self) -> &str {
        self.cfg
            .path
            .rsplit_once('/')
            .map_or(self.cfg.path.as_str(), |(_, n)| n)
    }

    pub(super) fn inside(&self, entry: &str) -> String {
        format!("{}/{entry}", self.cfg.path)
    }

    pub(super) fn tomb(&self, nonce: &str) -> String {
        self.beside(&format!(".tomb.{nonce}"))
    }

    /// `PARENT/NAME<suffix>`: a name beside the lock.
    fn beside(&self, suffix: &str) -> String {
        let n = format!("{}{suffix}", self.name());
        match self.parent() {
            Some(p) => format!("{p}/{n}"),
            None => n,
        }
    }

    /// The control connection, logged in; connects if there is none.
    pub(super) fn conn(&mut self) -> Result<&mut Conn> {
        if self.conn.is_none() {
            let c = self.connect()?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    pub(super) fn connect(&mut self) -> Result<Conn> {
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
                        "FTP server {host}:{port} refused the login of user {}: {} (code {code}){}",
                        self.cfg.user,
                        text,
                        no_password_hint(&self.cfg)
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
    pub(super) fn connect_implicit(&self, addrs: &[SocketAddr], t: Duration) -> Result<Conn> {
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
    pub(super) fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>> {
        crate::tls::client_config(self.cfg.ca_file.as_deref(), true).map(Arc::new)
    }

    /// Runs one command on the (re)connected control connection; a broken connection is
    /// dropped (the next command reconnects) and reported as `Unavailable`.
    pub(super) fn cmd<T>(
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
    pub(super) fn is_dir(&mut self, dir: &str) -> Result<bool> {
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
    pub(super) fn look(&mut self) -> Result<Look> {
        let path = self.cfg.path.clone();
        let names = self.entries(&path)?;
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

    /// `MKD PATH` was refused although nothing is there: permission, or a file in the way?
    /// `None`: neither (the lock came and went meanwhile).
    pub(super) fn diagnose_refusal(&mut self) -> Result<Option<Error>> {
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

    /// Claims one acquisition by deleting its marker, then frees the name.
    /// `Ok(false)`: the marker was not there under that name (renamed by a live holder's
    /// heartbeat, or claimed by someone else first).
    pub(super) fn claim_and_remove(&mut self, marker: &str) -> Result<bool> {
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
    pub(super) fn remove_marker(&mut self, target: &str) -> Result<bool> {
        let t = target.to_string();
        if self.cmd("RMD", |c| c.rmdir(t.as_str()))?.is_ok() {
            return Ok(true);
        }
        Ok(self.cmd("DELE", |c| c.rm(t.as_str()))?.is_ok())
    }

    /// Frees the name after a claim: `RMD` if the directory is empty (the usual case: the
    /// claim removed the only entry), else rename it to a tombstone (frees the name whatever
    /// sits inside) and tidy that; tidying may fail without leaving the lock held.
    pub(super) fn free_name(&mut self, nonce: &str) -> Result<()> {
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
    pub(super) fn tidy(&mut self, tomb: &str) {
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

    /// Whether `PARENT/NAME<suffix>` is in its parent's listing; `None`: the server refused
    /// to list the parent.
    pub(super) fn listed_beside(&mut self, suffix: &str) -> Result<Option<bool>> {
        let name = format!("{}{suffix}", self.name());
        Ok(self.names_beside()?.map(|names| names.contains(&name)))
    }

    /// The names in the lock's parent directory (base names, by one `NLST`); `None`: the
    /// server refused to list it.
    pub(super) fn names_beside(&mut self) -> Result<Option<Vec<String>>> {
        let parent = self.parent().map(str::to_string);
        let Ok(lines) = self.cmd("NLST", |c| c.nlst(parent.as_deref()))? else {
            return Ok(None);
        };
        Ok(Some(
            lines
                .iter()
                .map(|l| l.rsplit('/').next().unwrap_or(l).to_string())
                .collect(),
        ))
    }

    /// Tidies tombstones that crashed releasers or breakers left beside the lock.
    pub(super) fn tidy_leftovers(&mut self) {
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
    pub(super) fn remove_ownerless(&mut self, force: bool) -> Result<bool> {
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

    /// `PARENT/NAME.state`: the fencing-token state, beside the lock (a slot's: the lock's).
    pub(super) fn state_dir(&self) -> String {
        match &self.cfg.slot_of {
            Some(lock) => format!("{lock}.state"),
            None => self.beside(".state"),
        }
    }

    /// Runs `f` with every command (connect and login included) answered by `deadline` (or
    /// an earlier one set); the session's timeout and deadline are as they were after.
    pub(super) fn bounded<T>(&mut self, deadline: Instant, f: impl FnOnce(&mut Session) -> T) -> T {
        let (timeout, before) = (self.timeout(), self.deadline);
        self.deadline = Some(before.map_or(deadline, |b| b.min(deadline)));
        let r = f(self);
        self.deadline = before;
        self.set_timeout(timeout);
        r
    }

    /// Ends the session politely (a dropped connection would do, but servers log it).
    pub(super) fn quit(&mut self) {
        if let Some(mut c) = self.conn.take() {
            let _ = c.quit();
        }
    }

    /// `PARENT/NAME.readers`.
    pub(super) fn readers_dir(&self) -> String {
        self.beside(".readers")
    }

    /// The entries of `dir` (base names, sorted); a missing directory lists as empty.
    pub(super) fn entries(&mut self, dir: &str) -> Result<Vec<String>> {
        Ok(self.listing(dir)?.unwrap_or_default())
    }

    /// The names in `dir`, sorted; `None`: the server refused to list it (no such directory,
    /// as most servers say it).
    pub(super) fn listing(&mut self, dir: &str) -> Result<Option<Vec<String>>> {
        let d = dir.to_string();
        let Ok(lines) = self.cmd("NLST", |c| c.nlst(Some(d.as_str())))? else {
            return Ok(None);
        };
        let mut names: Vec<String> = lines
            .iter()
            .map(|l| l.rsplit('/').next().unwrap_or(l).to_string())
            .filter(|n| !n.is_empty() && n != "." && n != "..")
            .collect();
        names.sort();
        Ok(Some(names))
    }
}

/// `ftp://user@host:port/path` for messages (never the password).
pub(super) fn url_of(cfg: &FtpConfig) -> String {
    let (scheme, query) = match cfg.tls {
        Tls::None => ("ftp", ""),
        Tls::Explicit => ("ftps", ""),
        Tls::Implicit => ("ftps", "?tls=implicit"),
    };
    format!(
        "{scheme}://{}@{}:{}/{}{query}",
        cfg.user,
        cfg.host,
        cfg.port,
        cfg.path.trim_start_matches('/')
    )
}

/// What a refused login adds when no password was found anywhere (issue 25): where locksmith
/// looks for one. Empty when a password was given, or for an anonymous login.
fn no_password_hint(cfg: &FtpConfig) -> String {
    if cfg.password != Password::None || matches!(cfg.user.as_str(), "anonymous" | "ftp") {
        return String::new();
    }
    format!(
        "; no password was found for {}: give one by `password_env` or `password_file` (in an \
         address `?password_env=VAR`, `?password_file=PATH`), or, for an address, \
         $LOCKSMITH_PASSWORD or a ~/.netrc entry for machine {}",
        cfg.user, cfg.host
    )
}
