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

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::address::Address;
use super::lock::{Attempt, Backend, BreakOutcome, Grant, Holder, Named, WaitHint};
use super::owner::{Parsed, Record};
use super::stale::{Evidence, Holders, Judge};
use super::wake::Wakeups;
use crate::error::{Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::settings::{Fields, KeyDoc, Password, netrc_entry};
use crate::watch::Watcher;

mod marker;
pub mod probe;
mod session;
mod shared;
mod tokens;

use session::{ACQUIRE_TIMEOUT, Look, Session};

use marker::{is_marker, marker_name, parse_marker};

/// Transport security of the FTP control and data connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tls {
    None,
    /// `AUTH TLS` on the plain port.
    Explicit,
    /// TLS from the first byte (port 990 by convention).
    Implicit,
}

/// Settings of the `ftp` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FtpConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Password,
    pub tls: Tls,
    /// PEM file of the CA(s) that sign the server's certificate (a private CA).
    pub ca_file: Option<PathBuf>,
    /// The lock directory, relative to the login directory (or absolute on the server).
    pub path: String,
}

/// The keys [`config`] takes (besides the common and password keys).
pub static KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "host",
        example: "\"ftp.example.com\"",
        doc: "the FTP server (required)",
    },
    KeyDoc {
        key: "port",
        example: "21",
        doc: "[default: 21, or 990 with tls = \"implicit\"]",
    },
    KeyDoc {
        key: "user",
        example: "\"phoneacc\"",
        doc: "the login (required in a profile; an address defaults to ~/.netrc's, else anonymous)",
    },
    KeyDoc {
        key: "tls",
        example: "\"explicit\"",
        doc: "none | explicit (AUTH TLS) | implicit (FTPS); certificates are verified [default: none]",
    },
    KeyDoc {
        key: "ca_file",
        example: "\"/etc/locksmith/ca.pem\"",
        doc: "PEM file of the CA(s) that sign the server's certificate, for a private CA (needs tls)",
    },
    KeyDoc {
        key: "path",
        example: "\"phone_lock\"",
        doc: "the lock directory on the server, relative to the login directory (required); its parent must exist",
    },
];

/// The keys of `backend = "ftp"`. From an address, `user` defaults to the `.netrc` login
/// for the host, else `anonymous`, and the password to `$LOCKSMITH_PASSWORD`, else the
/// `.netrc` entry's (SPEC §3a).
pub fn config(f: &mut Fields) -> Result<FtpConfig> {
    let host = f
        .string("host")?
        .ok_or_else(|| f.error("missing required key `host`"))?;
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(f.error(&format!("`host` = {host:?} is not a host name or address")));
    }
    let port = f.port("port")?;
    let user = f.string("user")?;
    let password = f.password()?;
    let (user, password) = match (f.origin().address.clone(), user) {
        (None, None) => return Err(f.error("missing required key `user`")),
        (None, Some(user)) => (user, password),
        (Some(env), user) => {
            let netrc = env.netrc().filter(|_| {
                user.is_none() || (password == Password::None && !env.locksmith_password)
            });
            let entry = match &netrc {
                Some(file) => netrc_entry(file, &host, user.as_deref())?,
                None => None,
            };
            let login = entry.as_ref().and_then(|e| e.login.clone());
            let user = user.or(login).unwrap_or_else(|| "anonymous".into());
            let password = match (password, netrc) {
                (Password::None, _) if env.locksmith_password => {
                    Password::Env("LOCKSMITH_PASSWORD".into())
                }
                (Password::None, Some(file)) if entry.is_some_and(|e| e.password.is_some()) => {
                    Password::Netrc {
                        file,
                        host: host.clone(),
                    }
                }
                (p, _) => p,
            };
            (user, password)
        }
    };
    let tls = match f.string("tls")?.as_deref() {
        None | Some("none") => Tls::None,
        Some("explicit") => Tls::Explicit,
        Some("implicit") => Tls::Implicit,
        Some(other) => {
            return Err(f.error(&format!(
                "`tls` = \"{other}\" (expected none, explicit or implicit)"
            )));
        }
    };
    let ca_file = f.path("ca_file")?;
    if ca_file.is_some() && tls == Tls::None {
        return Err(f.error("`ca_file` needs `tls` = \"explicit\" or \"implicit\""));
    }
    // Implicit FTPS listens on its own port (990), unless the profile names one.
    let port = match port {
        Some(p) => p,
        None if tls == Tls::Implicit => 990,
        None => 21,
    };
    let path = f
        .string("path")?
        .ok_or_else(|| f.error("missing required key `path`"))?;
    let bad = path.is_empty()
        || path.ends_with('/')
        || path.contains(['\r', '\n', '\0', '~'])
        || path
            .split('/')
            .skip(usize::from(path.starts_with('/')))
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(f.error(&format!(
            "`path` = {path:?} must name a directory on the server, like \"phone_lock\" or \"locks/phone\" (no empty, `.` or `..` components, no `~`)"
        )));
    }
    Ok(FtpConfig {
        host,
        port,
        user,
        password,
        tls,
        ca_file,
        path,
    })
}

/// `ftp://[USER@]HOST[:PORT]/PATH` (`ftps://`: explicit TLS): PATH relative to the login
/// directory, `/%2F...` for an absolute one, as curl reads it.
pub fn address(a: &Address) -> std::result::Result<toml::Table, String> {
    let mut t = super::address::one_host_keys(a, "an ftp")?;
    if a.scheme == "ftps" {
        // Explicit TLS, unless the query asks for implicit TLS.
        match a.query_value("tls") {
            None => {
                t.insert("tls".into(), "explicit".into());
            }
            Some("none") => return Err("ftps:// is FTP over TLS: `tls=none` contradicts it".into()),
            Some(_) => {}
        }
    }
    let path = a.path.strip_prefix('/').unwrap_or(&a.path);
    if path.is_empty() {
        return Err("an ftp address needs the lock directory's PATH after HOST/".into());
    }
    t.insert("path".into(), path.to_string().into());
    Ok(t)
}

/// Our acquisition.
struct Ours {
    rec: Record,
    seq: u64,
    /// The marker's current name (inside the lock directory).
    marker: String,
    /// The `RMD` of our marker was sent for release; its reply may have been lost.
    claim_sent: bool,
}

pub struct Ftp {
    s: Session,
    profile: String,
    heartbeat: Duration,
    poll: Duration,
    ours: Option<Ours>,
    /// SPEC §6's rule (`stale.rs`), for the gate's holder and for readers alike.
    judge: Judge,
    /// The pidfd of a same-host holder (no directory events over FTP).
    wake: Wakeups,
    /// A shared (reader) lock was asked for (see `shared.rs`).
    shared: bool,
    sh: shared::State,
}

impl Ftp {
    pub fn new(cfg: FtpConfig, profile: &Named) -> Ftp {
        let judge = Judge::new(profile, PathBuf::from(session::url_of(&cfg)), false);
        Ftp {
            s: Session::new(cfg, profile.common.stale_after),
            profile: profile.name.to_string(),
            heartbeat: profile.common.heartbeat(),
            poll: profile.common.poll,
            ours: None,
            judge,
            wake: Wakeups::default(),
            shared: profile.common.shared,
            sh: shared::State::default(),
        }
    }

    /// `MKD`, then the owner marker inside. `Ok(false)`: refused (exists, or see below).
    fn create(&mut self) -> Result<bool> {
        let path = self.s.cfg.path.clone();
        if let Err((code, text)) = self.s.cmd("MKD", |c| c.mkdir(path.as_str()))? {
            debug!("MKD {path}: {text} (code {code})");
            self.s.last_mkd = Some(text);
            return Ok(false);
        }
        let rec = Record::ours(&self.profile);
        let marker = marker_name(&rec, 0);
        let target = self.s.inside(&marker);
        match self.s.cmd("MKD", |c| c.mkdir(target.as_str())) {
            Ok(Ok(())) => {}
            Ok(Err((code, text))) => {
                // Refused right after our `MKD PATH`: look before concluding anything. Gone,
                // or holding a marker: not ours any more (removed by someone, perhaps taken
                // since) — try again as a locker would. Still there and empty: we may not
                // write inside it; remove it (an empty lock directory is nobody's lock).
                match self.s.look()? {
                    Look::Dir(names) if names.is_empty() => {
                        let _ = self.s.cmd("RMD", |c| c.rmdir(path.as_str()));
                        return Err(err!(
                            Denied,
                            "cannot create owner marker in {}: {text} (code {code})",
                            self.s.url()
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
                let _ = self.s.cmd("RMD", |c| c.rmdir(target.as_str()));
                let _ = self.s.cmd("RMD", |c| c.rmdir(path.as_str()));
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

    /// Our marker's current name on the server, found by our nonce (`None`: it is gone).
    fn find_ours(&mut self) -> Result<Option<(String, u64)>> {
        let Some(nonce) = self.ours.as_ref().map(|o| o.rec.nonce.clone()) else {
            return Ok(None);
        };
        let Look::Dir(names) = self.s.look()? else {
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
        self.s.quit();
        self.find_ours()
    }

    /// One heartbeat: rename our marker to the next sequence number.
    fn beat(&mut self) -> Result<()> {
        let Some(ours) = &self.ours else {
            return Err(err!(Lost, "not holding"));
        };
        let next = marker_name(&ours.rec, ours.seq + 1);
        let (from, to) = (self.s.inside(&ours.marker), self.s.inside(&next));
        match self.s.cmd("heartbeat (RNFR/RNTO)", |c| {
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
                        self.s.url()
                    ))
                }
                None => Err(err!(
                    Lost,
                    "lock {} was broken: our owner marker is gone",
                    self.s.url()
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
                self.s.set_timeout(self.s.hold_timeout());
                // Tombstones are left only by a release or break cut short: look for them
                // after a break, and now and then (a listing costs a data connection).
                if self.judge.broke || fastrand::u8(..16) == 0 {
                    self.s.tidy_leftovers();
                }
                return Ok(self.judge.acquired(&mut self.wake, None));
            }
            // 550 is ambiguous (exists, missing parent, permission, a file in the way):
            // decide by looking, never by the reply's text.
            match self.s.look()? {
                Look::Dir(names) => match self.judge.clear_dead(
                    &mut Gate {
                        s: &mut self.s,
                        listed: Some(names),
                    },
                    &mut self.wake,
                )? {
                    Some(h) => {
                        holders = h;
                        break;
                    }
                    None => continue,
                },
                Look::Gone => {
                    if let Some(parent) = self.s.parent().map(str::to_string)
                        && !self.s.is_dir(&parent)?
                        && self.confirm_missing(&parent)?
                    {
                        return Err(err!(
                            Config,
                            "cannot create lock directory {}: the parent directory {parent} does not exist on the server (locksmith never creates parent directories)",
                            self.s.url()
                        ));
                    }
                    // Usually released between our MKD and our look; if it keeps
                    // happening, find out whether something else refuses us.
                    gone += 1;
                    if gone >= 2
                        && let Some(e) = self.s.diagnose_refusal()?
                    {
                        return Err(e);
                    }
                }
            }
        }
        Ok(Attempt::Busy(holders))
    }

    /// With the lock just taken exclusively: issue the token and put it into our marker
    /// (the rename doubles as a first heartbeat).
    fn stamp_token(&mut self, grant: &mut Grant) -> Result<()> {
        let (token, dirty) = self.s.issue_token()?;
        if let Some(o) = self.ours.as_mut() {
            o.rec.token = Some(token);
        }
        self.beat()?;
        grant.token = Some(token);
        grant.prev_crashed |= dirty;
        Ok(())
    }

    /// Tries for the gate — the exclusive lock directory — reconnecting a few times.
    /// Confirms that `dir` is missing on three fresh sessions, a moment apart, before a
    /// config error is called: libunftp was seen to refuse a `CWD` spuriously under races and
    /// heavy load, twice in a row on one CI run.
    fn confirm_missing(&mut self, dir: &str) -> Result<bool> {
        for _ in 0..3 {
            self.s.conn = None;
            std::thread::sleep(self.poll.min(Duration::from_secs(1)));
            if self.s.is_dir(dir)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn try_gate(&mut self) -> Result<Attempt> {
        self.s.set_timeout(ACQUIRE_TIMEOUT);
        // A connection that worked and then broke (server restart, a dropped session) is
        // re-established a few times; a server that cannot be reached at all is an error.
        let mut retries = 0;
        loop {
            let had_conn = self.s.conn.is_some();
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
        let target = self.s.inside(&marker);
        if let Some(t) = token
            && !claim_was_sent
        {
            self.s.mark_clean(t);
        }
        // An error here keeps `ours`: the caller retries until stale_after.
        if !self.s.remove_marker(&target)? {
            match self.find_ours()? {
                Some((name, seq)) => {
                    let ours = self.ours.as_mut().expect("checked above");
                    ours.marker = name;
                    ours.seq = seq;
                    ours.claim_sent = false;
                    return Err(err!(
                        Io,
                        "cannot release lock {}: the server refused to remove our owner marker",
                        self.s.url()
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
                            self.s.url()
                        );
                        return Ok(());
                    }
                    return Err(err!(
                        Lost,
                        "lock {} was broken while held: our owner marker is gone",
                        self.s.url()
                    ));
                }
            }
        }
        self.s.free_name(&nonce)?;
        self.ours = None;
        Ok(())
    }
}

/// The gate — the exclusive lock directory — as the judge (`stale.rs`) sees it: its holder
/// is its owner marker, whose name changes at every heartbeat (the sign is the listing).
struct Gate<'a> {
    s: &'a mut Session,
    /// A listing just read: the first look.
    listed: Option<Vec<String>>,
}

impl Holders for Gate<'_> {
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        let names = match self.listed.take() {
            Some(names) => names,
            None => match self.s.look()? {
                Look::Gone => return Ok(None),
                Look::Dir(names) => names,
            },
        };
        let record = match names.iter().find(|n| is_marker(n)) {
            Some(m) => Some(match parse_marker(m) {
                Some((rec, _)) => Parsed::V1(rec),
                None => Parsed::Foreign(m.clone()),
            }),
            // Empty: a locker between its two `MKD`s, or one that died there.
            None if names.is_empty() => None,
            None => Some(Parsed::Foreign(format!(
                "no owner marker, but {} other entries: another tool's directory",
                names.len()
            ))),
        };
        let key = match &record {
            Some(Parsed::V1(r)) => r.nonce.clone(),
            _ => String::new(),
        };
        Ok(Some(vec![Evidence {
            key: key.into(),
            record,
            sign: names.join("\n").into_bytes(),
            mode: Mode::Exclusive,
        }]))
    }

    /// The claim on the exact marker seen; a directory without one is removed by `RMD`
    /// (which fails if a marker appeared meanwhile), or — another tool's, only with
    /// `--force` — renamed away.
    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let seen = String::from_utf8_lossy(&ev.sign).into_owned();
        match seen.lines().find(|n| is_marker(n)) {
            Some(m) => self.s.claim_and_remove(m),
            None if ev.record.is_none() => self.s.remove_ownerless(false),
            None => self.s.remove_ownerless(true),
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
        let was_connected = self.s.conn.is_some();
        self.s.deadline = Some((Instant::now() + self.s.hold_timeout()).min(deadline));
        let r = if self.sh.reader.is_some() {
            self.beat_reader()
        } else {
            self.beat()
        };
        self.s.deadline = None;
        self.s.set_timeout(self.s.hold_timeout());
        if r.is_ok() && !was_connected {
            info!("reconnected to {}; the lock is still ours", self.s.url());
        }
        r
    }

    fn release(&mut self) -> Result<()> {
        if self.sh.reader.is_some() {
            self.release_reader()?;
        } else {
            self.release_once()?;
        }
        self.s.quit();
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
        let gate = self.judge.break_lock(
            &mut Gate {
                s: &mut self.s,
                listed: None,
            },
            force,
            token,
            watcher,
        )?;
        if let Some(want) = token {
            // A token names one exclusive acquisition: readers are never it.
            if !self.reader_holders()?.is_empty() {
                return Err(err!(
                    Busy,
                    "lock {} is held shared, not by acquisition {want}; nothing broken",
                    self.s.url()
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
        let mut gate = Gate {
            s: &mut self.s,
            listed: None,
        };
        Ok(gate
            .holders()?
            .unwrap_or_default()
            .iter()
            .map(Evidence::holder)
            .collect())
    }
}
