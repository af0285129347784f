//! `backend = "postgres"`: a session-level advisory lock on a PostgreSQL server.
//!
//! The lock is `pg_advisory_lock(key)` (`pg_advisory_lock_shared` for readers) held by our
//! session: the server releases it the moment the session ends, so a killed locksmith frees
//! the lock as soon as the server sees its connection close — no heartbeat needs to go stale.
//!
//! **Key:** `hashtextextended(lock, 0)`, computed by the server. It is the 64-bit hash
//! PostgreSQL itself uses for hash partitioning, so it is stable across platforms and
//! versions (≥ 11), and any client — `psql`, a script — can take the same lock with
//! `SELECT pg_advisory_lock(hashtextextended('nightly', 0))` without reimplementing a hash.
//!
//! **Waiting** blocks in the server (`pg_advisory_lock`) on a helper thread that owns the
//! connection; the main thread polls the thread's wake-up beside every release cause, and a
//! waiter that gives up cancels the query (a cancel request on a new connection) before it
//! exits. PostgreSQL queues a new request behind a *waiting* conflicting one, so a waiting
//! writer is not starved by a stream of readers.
//!
//! **Keepalive:** TCP keepalives plus a `SELECT 1` every heartbeat period; a failed one means
//! the server has ended the session and freed the lock: `LOST`, 74.
//!
//! **Fencing tokens:** a row per lock in `SCHEMA.tokens (lock, token, clean)`, created on first
//! use and only written while holding the lock exclusively: the holder takes token + 1 and sets
//! `clean = false`, and sets `clean = true` when it releases; a holder that finds
//! `clean = false` says `prev=crashed`. Readers report the current token (the write epoch).
//! Without the right to create the table, there are no tokens (the lock still works).

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::str::FromStr;
use std::thread::JoinHandle;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{CancelToken, Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::{Attempt, Backend, BreakOutcome, Grant, Holder, WaitHint};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::profile::{PgConfig, Profile, SslMode};
use crate::protocol::Mode;
use crate::watch::Watcher;

/// Whether a connection string holds a password (then the profiles file must be private).
pub fn url_has_password(url: &str) -> std::result::Result<bool, String> {
    Config::from_str(url)
        .map(|c| c.get_password().is_some())
        .map_err(|e| e.to_string())
}

/// The `sslmode` a connection string names, if it names one (disable, prefer or require).
pub fn url_ssl_mode(url: &str) -> Option<SslMode> {
    if !url.contains("sslmode") {
        return None;
    }
    Config::from_str(url).ok().map(|c| match c.get_ssl_mode() {
        postgres::config::SslMode::Disable => SslMode::Disable,
        postgres::config::SslMode::Prefer => SslMode::Prefer,
        _ => SslMode::Require,
    })
}

pub struct Postgres {
    cfg: PgConfig,
    profile: String,
    mode: Mode,
    stale_after: Duration,
    heartbeat: Duration,
    client: Option<Client>,
    tls: Option<MakeRustlsConnect>,
    waiter: Option<Waiter>,
    /// Our exclusive acquisition's token, to mark its clean release.
    token: Option<i64>,
    held: bool,
}

/// A thread blocked in `pg_advisory_lock` on our connection; one byte when done.
struct Waiter {
    rx: UnixStream,
    cancel: CancelToken,
    thread: JoinHandle<(Client, std::result::Result<(), postgres::Error>)>,
}

const KEY: &str = "hashtextextended($1, 0)";

impl Postgres {
    pub fn new(cfg: PgConfig, profile: &Profile) -> Postgres {
        Postgres {
            cfg,
            profile: profile.name.clone(),
            mode: if profile.common.shared {
                Mode::Shared
            } else {
                Mode::Exclusive
            },
            stale_after: profile.common.stale_after,
            heartbeat: profile.common.heartbeat(),
            client: None,
            tls: None,
            waiter: None,
            token: None,
            held: false,
        }
    }

    fn server(&self) -> String {
        match &self.cfg.url {
            Some(_) => format!("the PostgreSQL server of profile `{}`", self.profile),
            None => format!("PostgreSQL at {}:{}", self.cfg.host, self.cfg.port),
        }
    }

    /// Maps a driver error to the SPEC's kinds, naming the server (never the password).
    fn error(&self, what: &str, e: &postgres::Error) -> Error {
        let server = self.server();
        if let Some(db) = e.as_db_error() {
            let code = db.code();
            let kind = if *code == SqlState::INVALID_PASSWORD
                || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
                || *code == SqlState::INSUFFICIENT_PRIVILEGE
            {
                Kind::Denied
            } else if *code == SqlState::INVALID_CATALOG_NAME {
                Kind::Config
            } else if *code == SqlState::ADMIN_SHUTDOWN || *code == SqlState::CRASH_SHUTDOWN {
                Kind::Lost
            } else {
                Kind::Io
            };
            return Error::new(kind, format!("{what} ({server}): {}", db.message()));
        }
        let kind = if self.held {
            Kind::Lost
        } else {
            Kind::Unavailable
        };
        // The error's causes too: "error performing TLS handshake" alone does not say why.
        let mut msg = e.to_string();
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            msg = format!("{msg}: {c}");
            cause = c.source();
        }
        let hint = if self.cfg.sslmode != SslMode::Disable && msg.contains("TLS") {
            crate::tls::hint(self.cfg.ca_file.as_deref())
        } else {
            ""
        };
        Error::new(kind, format!("{what} ({server}): {msg}{hint}"))
    }

    fn config(&self) -> Result<Config> {
        let mut c = match &self.cfg.url {
            Some(u) => Config::from_str(&u.0)
                .map_err(|e| err!(Config, "profile `{}`: bad `url`: {e}", self.profile))?,
            None => {
                let mut c = Config::new();
                c.host(&self.cfg.host).port(self.cfg.port);
                if let Some(d) = &self.cfg.dbname {
                    c.dbname(d);
                }
                c
            }
        };
        if let Some(u) = &self.cfg.user {
            c.user(u);
        }
        if c.get_user().is_none() {
            c.user(
                &nix::unistd::User::from_uid(nix::unistd::getuid())
                    .ok()
                    .flatten()
                    .map_or_else(|| "postgres".to_string(), |u| u.name),
            );
        }
        if !matches!(self.cfg.password, crate::profile::Password::None) {
            let user = c.get_user().unwrap_or_default().to_string();
            c.password(self.cfg.password.resolve(&user)?);
        }
        let me = crate::host::this();
        // Shown by `status` (pg_stat_activity.application_name, at most 63 bytes).
        let mut app = format!(
            "locksmith pid={} ppid={} host={}",
            std::process::id(),
            nix::unistd::getppid().as_raw(),
            me.hostname
        );
        app.truncate(63);
        c.application_name(&app)
            .ssl_mode(match self.cfg.sslmode {
                SslMode::Disable => postgres::config::SslMode::Disable,
                SslMode::Prefer => postgres::config::SslMode::Prefer,
                _ => postgres::config::SslMode::Require,
            })
            .connect_timeout(self.stale_after.min(Duration::from_secs(30)))
            .keepalives(true)
            .keepalives_idle(self.heartbeat.max(Duration::from_secs(1)))
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3)
            .tcp_user_timeout(self.stale_after);
        Ok(c)
    }

    /// The TLS connector for `sslmode`, made once (reading `ca_file`); `None`: plain TCP.
    fn tls(&mut self) -> Result<Option<MakeRustlsConnect>> {
        if self.cfg.sslmode == SslMode::Disable {
            return Ok(None);
        }
        if self.tls.is_none() {
            let check_name = self.cfg.sslmode == SslMode::VerifyFull;
            let config = crate::tls::client_config(self.cfg.ca_file.as_deref(), check_name)?;
            self.tls = Some(MakeRustlsConnect::new(config));
        }
        Ok(self.tls.clone())
    }

    fn client(&mut self) -> Result<&mut Client> {
        if self.client.is_none() {
            let config = self.config()?;
            let c = match self.tls()? {
                None => config.connect(NoTls),
                Some(tls) => config.connect(tls),
            }
            .map_err(|e| self.error("cannot connect", &e))?;
            self.client = Some(c);
        }
        Ok(self.client.as_mut().expect("connected above"))
    }

    fn lock_fn(&self, try_: bool) -> String {
        let f = match (try_, self.mode) {
            (true, Mode::Exclusive) => "pg_try_advisory_lock",
            (true, Mode::Shared) => "pg_try_advisory_lock_shared",
            (false, Mode::Exclusive) => "pg_advisory_lock",
            (false, Mode::Shared) => "pg_advisory_lock_shared",
        };
        format!("SELECT {f}({KEY})")
    }

    /// Holding: the fencing token and whether the previous exclusive holder released cleanly.
    fn grant(&mut self) -> Grant {
        self.held = true;
        let schema = self.cfg.schema.clone();
        let lock = self.cfg.lock.clone();
        let shared = self.mode == Mode::Shared;
        let Ok(client) = self.client() else {
            return Grant::default();
        };
        if shared {
            let q = format!("SELECT token FROM {schema}.tokens WHERE lock = $1");
            return match client.query_opt(&q, &[&lock]) {
                Ok(row) => Grant {
                    token: row.map(|r| r.get::<_, i64>(0) as u64),
                    prev_crashed: false,
                },
                Err(e) => {
                    debug!("no fencing token: {e}");
                    Grant::default()
                }
            };
        }
        let upsert = format!(
            "WITH prev AS (SELECT clean FROM {schema}.tokens WHERE lock = $1) \
             INSERT INTO {schema}.tokens AS t (lock, token, clean) VALUES ($1, 1, false) \
             ON CONFLICT (lock) DO UPDATE SET token = t.token + 1, clean = false \
             RETURNING t.token, (SELECT clean FROM prev)"
        );
        let create = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {schema}.tokens \
             (lock text PRIMARY KEY, token bigint NOT NULL, clean boolean NOT NULL)"
        );
        for attempt in 0..3 {
            match client.query_one(&upsert, &[&lock]) {
                Ok(row) => {
                    let token: i64 = row.get(0);
                    let clean: Option<bool> = row.get(1);
                    self.token = Some(token);
                    return Grant {
                        token: Some(token as u64),
                        prev_crashed: clean == Some(false),
                    };
                }
                Err(e)
                    if attempt < 2
                        && matches!(
                            e.code(),
                            Some(&SqlState::UNDEFINED_TABLE | &SqlState::INVALID_SCHEMA_NAME)
                        ) =>
                {
                    // First use. Two first users of different locks may race to create it.
                    if let Err(e) = client.batch_execute(&create) {
                        debug!("cannot create the fencing-token table: {e}");
                    }
                }
                Err(e) => {
                    debug!("no fencing token: {e}");
                    return Grant::default();
                }
            }
        }
        Grant::default()
    }

    /// Holders per `pg_locks` (granted advisory locks on our key).
    fn holders(&mut self) -> Result<Vec<(i32, Holder)>> {
        let lock = self.cfg.lock.clone();
        let schema = self.cfg.schema.clone();
        let q = format!(
            "WITH k AS (SELECT {KEY} AS k) \
             SELECT a.pid, host(a.client_addr), a.application_name, \
                    to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                    l.mode \
             FROM k, pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.classid::int8 = ((k.k >> 32) & 4294967295) \
               AND l.objid::int8 = (k.k & 4294967295) \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        );
        let rows = {
            let client = self.client()?;
            client.query(&q, &[&lock])
        }
        .map_err(|e| self.error("cannot read pg_locks", &e))?;
        let token = {
            let client = self.client()?;
            client
                .query_opt(
                    &format!("SELECT token FROM {schema}.tokens WHERE lock = $1"),
                    &[&lock],
                )
                .ok()
                .flatten()
                .map(|r| r.get::<_, i64>(0) as u64)
        };
        Ok(rows
            .into_iter()
            .map(|r| {
                let backend_pid: i32 = r.get(0);
                let addr: Option<String> = r.get(1);
                let app: Option<String> = r.get(2);
                let since: Option<String> = r.get(3);
                let mode: String = r.get(4);
                let word = |k: &str| {
                    app.as_deref().and_then(|a| {
                        a.split_whitespace()
                            .find_map(|w| w.strip_prefix(k).map(str::to_string))
                    })
                };
                let ours = app.as_deref().is_some_and(|a| a.starts_with("locksmith "));
                let shared = mode == "ShareLock";
                (
                    backend_pid,
                    Holder {
                        host: word("host=").or(addr).or(Some("local socket".into())),
                        pid: if ours {
                            word("pid=").and_then(|p| p.parse().ok())
                        } else {
                            None
                        },
                        ppid: word("ppid=").and_then(|p| p.parse().ok()),
                        since,
                        token: if shared { None } else { token },
                        mode: Some(if shared {
                            Mode::Shared
                        } else {
                            Mode::Exclusive
                        }),
                        // The server holds it for a live session.
                        alive: Some(true),
                        foreign: (!ours).then(|| {
                            format!(
                                "session pid {backend_pid} ({})",
                                app.clone().unwrap_or_default()
                            )
                        }),
                    },
                )
            })
            .collect())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // A waiter that gives up: cancel its query so the server does not grant the lock to
        // a session about to close.
        if let Some(w) = &self.waiter {
            let _ = match &self.tls {
                None => w.cancel.cancel_query(NoTls),
                Some(tls) => w.cancel.cancel_query(tls.clone()),
            };
        }
    }
}

impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn try_acquire(&mut self) -> Result<Attempt> {
        if let Some(w) = &self.waiter {
            let mut buf = [0u8; 1];
            match std::io::Read::read(&mut &w.rx, &mut buf) {
                Ok(1) => {
                    let w = self.waiter.take().expect("checked above");
                    let (client, r) = w
                        .thread
                        .join()
                        .map_err(|_| err!(Io, "the PostgreSQL waiter thread failed"))?;
                    self.client = Some(client);
                    if let Err(e) = r {
                        return Err(self.error("cannot take the advisory lock", &e));
                    }
                    return Ok(Attempt::Acquired(self.grant()));
                }
                _ => return Ok(Attempt::Busy(Vec::new())),
            }
        }
        let q = self.lock_fn(true);
        let lock = self.cfg.lock.clone();
        let got = {
            let client = self.client()?;
            client.query_one(&q, &[&lock]).map(|r| r.get::<_, bool>(0))
        }
        .map_err(|e| self.error("cannot take the advisory lock", &e))?;
        if got {
            return Ok(Attempt::Acquired(self.grant()));
        }
        let holders = self
            .holders()
            .map(|h| h.into_iter().map(|(_, h)| h).collect());
        Ok(Attempt::Busy(holders.unwrap_or_default()))
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        if self.waiter.is_some() {
            return Ok(WaitHint { poll: false });
        }
        let q = self.lock_fn(false);
        let lock = self.cfg.lock.clone();
        self.client()?;
        let mut client = self.client.take().expect("connected above");
        let cancel = client.cancel_token();
        let (rx, mut tx) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
        rx.set_nonblocking(true)
            .map_err(|e| Error::io("socketpair", e))?;
        let thread = std::thread::Builder::new()
            .name("pg-wait".into())
            .spawn(move || {
                let r = client.execute(&q, &[&lock]).map(|_| ());
                let _ = tx.write_all(b"!");
                (client, r)
            })
            .map_err(|e| Error::io("cannot start the PostgreSQL waiter thread", e))?;
        self.waiter = Some(Waiter { rx, cancel, thread });
        Ok(WaitHint { poll: false })
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.waiter.iter().map(|w| w.rx.as_fd()).collect()
    }

    fn heartbeat_period(&self) -> Option<Duration> {
        Some(self.heartbeat)
    }

    fn heartbeat(&mut self) -> Result<()> {
        let r = match self.client.as_mut() {
            Some(c) => c.simple_query("SELECT 1").map(|_| ()),
            None => return Err(err!(Lost, "not holding")),
        };
        r.map_err(|e| {
            let server = self.server();
            err!(
                Lost,
                "lost the session holding lock `{}` ({server}): {e}; the server has released it",
                self.cfg.lock
            )
        })
    }

    fn release(&mut self) -> Result<()> {
        if !self.held {
            return Ok(());
        }
        self.held = false;
        let schema = self.cfg.schema.clone();
        let lock = self.cfg.lock.clone();
        let unlock = match self.mode {
            Mode::Exclusive => format!("SELECT pg_advisory_unlock({KEY})"),
            Mode::Shared => format!("SELECT pg_advisory_unlock_shared({KEY})"),
        };
        let token = self.token.take();
        let server = self.server();
        let Some(client) = self.client.as_mut() else {
            return Ok(());
        };
        if let Some(t) = token
            && let Err(e) = client.execute(
                &format!("UPDATE {schema}.tokens SET clean = true WHERE lock = $1 AND token = $2"),
                &[&lock, &t],
            )
        {
            info!("{e}; the next holder will see prev=crashed");
        }
        let r = client
            .query_one(&unlock, &[&lock])
            .map(|r| r.get::<_, bool>(0));
        self.client = None;
        match r {
            Ok(true) => Ok(()),
            Ok(false) => Err(err!(
                Lost,
                "lock `{lock}` ({server}) was no longer held by our session"
            )),
            Err(e) => Err(err!(
                Lost,
                "lost the session holding lock `{lock}` ({server}): {e}; the server has released it"
            )),
        }
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(self.holders()?.into_iter().map(|(_, h)| h).collect())
    }

    fn break_lock(
        &mut self,
        force: bool,
        token: Option<u64>,
        _watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        let holders = self.holders()?;
        if holders.is_empty() {
            return Ok(BreakOutcome::Free);
        }
        if let Some(t) = token
            && !holders.iter().any(|(_, h)| h.token == Some(t))
        {
            return Err(err!(
                Busy,
                "lock `{}` is not held by acquisition {t}; nothing broken",
                self.cfg.lock
            ));
        }
        if !force {
            return Err(err!(
                Busy,
                "lock `{}` is held by {}, a live session (the server frees it when the session ends); use --force to terminate the session",
                self.cfg.lock,
                super::describe(&holders.into_iter().map(|(_, h)| h).collect::<Vec<_>>())
            ));
        }
        let mut first = None;
        for (pid, h) in holders {
            let r = {
                let client = self.client()?;
                client.query_one("SELECT pg_terminate_backend($1)", &[&pid])
            };
            r.map_err(|e| self.error("cannot terminate the holding session", &e))?;
            info!("terminated the session of {h} (server pid {pid})");
            first.get_or_insert(h);
        }
        Ok(BreakOutcome::Broken(first.unwrap_or_default()))
    }
}
