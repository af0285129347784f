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
//! writer is not starved by a stream of readers. At a `--wait` deadline it asks who holds the
//! lock on a session of its own: busy (75) only on an answer, unavailable (69) on none.
//!
//! **Every request is bounded** (`Postgres::within`: the driver has no timeout of its own) by
//! the request bound, `stale_after` within 2–10 s, and within a wait by its deadline (at least
//! `LAST_BOUND`): a server that stops answering ends a try, a release or `status`, never
//! hangs the helper.
//!
//! **The server's clock and ours:** the server, not a waiter, decides when a lost holder's
//! lock is free — when it gives up on the holder's connection. Every session tells the server
//! when to do that (`SET tcp_user_timeout` = `stale_after`, plus TCP keepalives probing every
//! second), so a holder cut off from the server loses the lock `stale_after` after the server
//! last heard from it, whatever the server's defaults (hours), and never before: the kernel
//! aborts a connection only once nothing has arrived from the peer for the user timeout.
//!
//! **Heartbeat:** an empty query every heartbeat period, bounded by the deadline of the holder's
//! lease (`backend::lock::Lease`: an unconfirmed one declares `LOST`, and `run` stops CMD, before the
//! earliest moment the server could free the lock). A failed one means the session is gone:
//! `LOST`, 74. A heartbeat begun past that point (the process was stopped) gets half a period:
//! if the server kept our session, the lock is still ours.
//!
//! **Fencing tokens:** a row per lock in `SCHEMA.tokens (lock, token, clean)`, created on first
//! use and only written while holding the lock exclusively: the holder takes token + 1 and sets
//! `clean = false`, and sets `clean = true` when it releases; a holder that finds
//! `clean = false` says `prev=crashed`. Readers report the current token (the write epoch).
//! Without the right to create the table, there are no tokens (the lock still works).

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use postgres::error::SqlState;
use postgres::{CancelToken, Client, Config, NoTls};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::address::Address;
use super::lock::{
    Attempt, Backend, Beats, Break, BreakOutcome, Grant, Holder, Named, Tried, WaitHint,
    request_by,
};
use super::wake::Blocking;
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::settings::{Fields, Hidden, KeyDoc, Password, fmt_duration, pgpass_password};
use crate::watch::Watcher;

pub mod probe;

mod pool;

/// The process's idle sessions ([`pool`]).
static POOL: std::sync::Mutex<pool::Pool<PoolKey>> = std::sync::Mutex::new(pool::Pool::new());

/// What makes two of our sessions interchangeable ([`Postgres::pool_key`]).
type PoolKey = (PgConfig, Duration, Duration);

/// The pool's operations, its lock held for each (a poisoned lock: nothing kept).
fn pooled<T>(f: impl FnOnce(&mut pool::Pool<PoolKey>) -> T) -> Option<T> {
    POOL.lock().ok().map(|mut p| f(&mut p))
}

/// Settings of the `postgres` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgConfig {
    /// A `postgresql://` URL (or key=value string); `None`: the separate keys below.
    pub url: Option<Hidden>,
    pub host: String,
    pub port: u16,
    pub dbname: Option<String>,
    pub user: Option<String>,
    pub password: Password,
    /// The lock's name, hashed to the 64-bit advisory key on the server.
    pub lock: String,
    /// Schema of the fencing-token table (an identifier, created on first use).
    pub schema: String,
    pub sslmode: SslMode,
    /// CA certificates (PEM) that verify the server; `None`: the system's CA bundle.
    pub ca_file: Option<PathBuf>,
    /// A slot of a lock with several (SPEC §3b): the lock's own name, whose row of the
    /// token table every slot issues from. `None`: the lock itself.
    pub slot_of: Option<String>,
}

impl PgConfig {
    /// Slot `k` of the lock: the advisory lock `LOCK.slot-K`, issuing tokens from the lock's
    /// row (docs/LAYOUT.md).
    pub fn slot(&self, k: u32) -> PgConfig {
        PgConfig {
            lock: format!("{}.slot-{k}", self.lock),
            slot_of: Some(self.lock.clone()),
            ..self.clone()
        }
    }

    /// The lock's fair queue: the advisory lock `LOCK.line`, whose slots its waiters hold
    /// (docs/LAYOUT.md).
    pub fn queue(&self) -> PgConfig {
        PgConfig {
            lock: format!("{}.line", self.lock),
            slot_of: None,
            ..self.clone()
        }
    }

    /// The row of the token table this lock issues from.
    fn token_lock(&self) -> &str {
        self.slot_of.as_deref().unwrap_or(&self.lock)
    }
}

/// `sslmode` of the postgres backend, in libpq's words. Unlike libpq, every mode that uses
/// TLS verifies the server's certificate chain (against `ca_file` or the system CAs):
/// `require` and `verify-ca` behave as libpq's do when a root certificate is configured,
/// `verify-full` also checks the host name, `prefer` uses TLS when the server offers it (and
/// then verifies as `require`), `disable` (the default) never uses TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The keys [`config`] takes (besides the common and password keys).
pub static KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "url",
        example: "\"postgresql://locker@db.example.com/app\"",
        doc: "a libpq connection string or URL (or give host, port, dbname, user)",
    },
    KeyDoc {
        key: "host",
        example: "\"db.example.com\"",
        doc: "the server, or a Unix socket directory (instead of url)",
    },
    KeyDoc {
        key: "port",
        example: "5432",
        doc: "[default: 5432]",
    },
    KeyDoc {
        key: "dbname",
        example: "\"app\"",
        doc: "the database [default: libpq's, the user's name]",
    },
    KeyDoc {
        key: "user",
        example: "\"locker\"",
        doc: "the role [default: libpq's, the login name]",
    },
    KeyDoc {
        key: "sslmode",
        example: "\"verify-full\"",
        doc: "disable | prefer | require | verify-ca | verify-full, as libpq [default: disable]",
    },
    KeyDoc {
        key: "ca_file",
        example: "\"/etc/locksmith/ca.pem\"",
        doc: "PEM file of the CA(s) that sign the server's certificate (needs sslmode require or stricter)",
    },
    KeyDoc {
        key: "lock",
        example: "\"nightly\"",
        doc: "the lock's name, hashed to the 64-bit advisory key [default: the profile's name]",
    },
    KeyDoc {
        key: "schema",
        example: "\"locksmith\"",
        doc: "where the fencing-token counter lives, created on first use [default: locksmith]",
    },
];

/// The keys of `backend = "postgres"`. `lock` defaults to the profile's name (an address on
/// the command line has none: it must say `?lock=NAME`). From an address, the password
/// defaults to `$LOCKSMITH_PASSWORD`, else `$PGPASSWORD`, else the `.pgpass` line (libpq's
/// conventions, SPEC §3a).
pub fn config(f: &mut Fields) -> Result<PgConfig> {
    let url = f.string("url")?;
    let host = f.string("host")?;
    let port = f.port("port")?;
    let dbname = f.string("dbname")?;
    let user = f.string("user")?;
    let password = f.password()?;
    let sslmode = match f.string("sslmode")?.as_deref() {
        None => None,
        Some("disable") => Some(SslMode::Disable),
        Some("prefer") => Some(SslMode::Prefer),
        Some("require") => Some(SslMode::Require),
        Some("verify-ca") => Some(SslMode::VerifyCa),
        Some("verify-full") => Some(SslMode::VerifyFull),
        Some(other) => {
            return Err(f.error(&format!(
                "`sslmode` = \"{other}\" (expected disable, prefer, require, verify-ca or verify-full)"
            )));
        }
    };
    let ca_file = f.path("ca_file")?;
    let lock = match (f.string("lock")?, &f.origin().profile) {
        (Some(lock), _) => lock,
        (None, Some(profile)) => profile.clone(),
        (None, None) => {
            return Err(f.error(
                "a postgres address needs `?lock=NAME`: it has no profile name to default to",
            ));
        }
    };
    if lock.is_empty() {
        return Err(f.error("`lock` is empty"));
    }
    let schema = f.string("schema")?.unwrap_or_else(|| "locksmith".into());
    let ident = schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !ident {
        return Err(f.error(&format!(
            "`schema` = {schema:?} must be a lower-case SQL identifier like \"locksmith\""
        )));
    }
    let url = match (url, &host) {
        (Some(_), Some(_)) => return Err(f.error("give either `url` or `host`, not both")),
        (None, None) => return Err(f.error("missing required key `url` (or `host`)")),
        (Some(u), None) => {
            if port.is_some() || dbname.is_some() || user.is_some() {
                return Err(f.error(
                    "with `url`, put port, dbname and user in the URL, not in separate keys",
                ));
            }
            let has_password = url_has_password(&u).map_err(|why| {
                f.error(&format!(
                    "`url` is not a PostgreSQL connection string: {why}"
                ))
            })?;
            if has_password {
                f.holds_secret()?;
                if password != Password::None {
                    return Err(
                        f.error("the `url` holds a password already; drop the other password key")
                    );
                }
            }
            Some(Hidden(u))
        }
        (None, Some(_)) => None,
    };
    // A connection string may carry its own `sslmode` (disable, prefer or require).
    let in_url = url.as_ref().and_then(|u| url_ssl_mode(&u.0));
    let sslmode = match (sslmode, in_url) {
        (Some(a), Some(b)) if a != b => {
            return Err(f.error(&format!(
                "`sslmode` = \"{}\" but the `url` says sslmode={}; give it once",
                a.name(),
                b.name()
            )));
        }
        (Some(m), _) | (None, Some(m)) => m,
        (None, None) => SslMode::Disable,
    };
    if ca_file.is_some() && sslmode == SslMode::Disable {
        return Err(
            f.error("`ca_file` needs `sslmode` = \"require\", \"verify-ca\" or \"verify-full\"")
        );
    }
    let host = host.unwrap_or_default();
    let port = port.unwrap_or(5432);
    let password = match (password, f.origin().address.clone()) {
        (Password::None, Some(env)) if url.is_none() => {
            if env.locksmith_password {
                Password::Env("LOCKSMITH_PASSWORD".into())
            } else if env.pgpassword {
                Password::Env("PGPASSWORD".into())
            } else {
                match env.pgpass().filter(|f| f.exists()) {
                    Some(file) => {
                        // libpq's defaults: the login name, and a database named like the user.
                        let login = user.clone().unwrap_or_else(|| env.login());
                        let db = dbname.clone().unwrap_or_else(|| login.clone());
                        match pgpass_password(&file, &host, port, &db, &login)? {
                            Some(_) => Password::Pgpass {
                                file,
                                host: host.clone(),
                                port,
                                dbname: db,
                            },
                            None => Password::None,
                        }
                    }
                    None => Password::None,
                }
            }
        }
        (p, _) => p,
    };
    Ok(PgConfig {
        url,
        host,
        port,
        dbname,
        user,
        password,
        lock,
        schema,
        sslmode,
        ca_file,
        slot_of: None,
    })
}

/// `postgres://` or `postgresql://[USER@]HOST[:PORT]/DB`, libpq's URL syntax (its
/// parameters are the backend's keys: `?lock=NAME&sslmode=require`).
pub fn address(a: &Address) -> std::result::Result<toml::Table, String> {
    let mut t = super::address::one_host_keys(a, "a postgres")?;
    let db = a.path.strip_prefix('/').unwrap_or(&a.path);
    if !db.is_empty() {
        t.insert("dbname".into(), db.to_string().into());
    }
    Ok(t)
}

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
    /// The lock's number of slots (SPEC §3b), recorded with each token.
    slots: u32,
    /// What to ask before issuing over another recorded number of slots.
    agree: Option<super::lock::Agree>,
    /// The server pid of our session (`pg_backend_pid()`, read when it was opened).
    session: Option<i32>,
    /// Sessions of ours given up after a request got no answer (issue 27): the next try
    /// ends them on the server before it tries the lock ([`Postgres::end_lost_sessions`]).
    lost: Vec<i32>,
    /// While waiting with a deadline: it bounds every request of a try
    /// ([`Postgres::within`]).
    by: Option<Instant>,
    /// Counted among the backends still looking or waiting ([`pool`]): until it takes its
    /// lock, or drops.
    looking: bool,
    /// Our session holds no advisory lock of ours: it never took one, or gave it back. Only
    /// such a session is kept for another backend when this one drops ([`pool`]).
    holds_nothing: bool,
}

/// A thread blocked in `pg_advisory_lock` on our connection, and how to cancel its query.
struct Waiter {
    call: Blocking<(Client, std::result::Result<(), postgres::Error>)>,
    cancel: CancelToken,
    /// The server pid of its session.
    session: Option<i32>,
}

const KEY: &str = "hashtextextended($1, 0)";

/// What [`Postgres::holder_of`] reads of a holder: its session (`a`, pg_stat_activity) and
/// its lock (`l`, pg_locks).
const HOLDER_COLUMNS: &str = "a.pid, host(a.client_addr), a.application_name, \
    to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
    l.mode, \
    CASE WHEN a.state = 'idle' \
         THEN (EXTRACT(EPOCH FROM clock_timestamp() - a.state_change) * 1000)::int8 \
         ELSE 0 END";

impl Postgres {
    pub fn new(cfg: PgConfig, profile: &Named) -> Postgres {
        Postgres {
            cfg,
            profile: profile.name.to_string(),
            mode: profile.common.mode(),
            stale_after: profile.common.stale_after,
            heartbeat: profile.common.heartbeat(),
            client: None,
            tls: None,
            waiter: None,
            token: None,
            slots: profile.common.slots,
            agree: None,
            session: None,
            lost: Vec::new(),
            by: None,
            looking: pooled(pool::Pool::looking).is_some(),
            holds_nothing: true,
        }
    }

    /// What makes two of our sessions interchangeable: the same server, role, database and
    /// TLS, and the same settings told at connect (the lock, its row and schema aside).
    fn pool_key(&self) -> PoolKey {
        let cfg = PgConfig {
            lock: String::new(),
            slot_of: None,
            schema: String::new(),
            ..self.cfg.clone()
        };
        (cfg, self.stale_after, self.heartbeat)
    }

    /// No longer looking or waiting: it holds its lock (or drops). The last one gone, the
    /// idle sessions are closed ([`pool`]).
    fn stop_looking(&mut self) {
        if std::mem::take(&mut self.looking) {
            // Closed outside the pool's lock.
            drop(pooled(pool::Pool::done_looking));
        }
    }

    /// Runs `f` (requests to the server: every one we send goes through here) on a thread of
    /// its own and waits for it until the request bound (`stale_after`, 2–10 s), not past the
    /// wait's deadline ([`request_by`]; `--wait forever` and a release get the whole bound):
    /// the driver has no timeout of its own, and a server that accepts the connection but
    /// does not answer (paused, or its answers lost) would hold the helper until it closes the
    /// session (`authentication_timeout`, a minute) or for ever. No answer by then:
    /// `Unavailable`, and the thread is left to end with the session (dropping it closes the
    /// session, which frees anything a late answer took; [`Postgres::give_up_session`]).
    fn within<T: Send + 'static>(
        &self,
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let bound = self
            .stale_after
            .clamp(Duration::from_secs(2), Duration::from_secs(10));
        let sent = Instant::now();
        let deadline = request_by(bound, self.by);
        let call = Blocking::spawn("pg-request", None, f)
            .map_err(|e| Error::io("cannot start a PostgreSQL request thread", e))?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = PollTimeout::try_from(left.as_micros().div_ceil(1000)).unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(call.fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(Error::io("poll", e.into())),
                Ok(_) => {}
            }
            if call.returned() {
                return call
                    .join()
                    .ok_or_else(|| err!(Io, "a PostgreSQL request thread failed"));
            }
            if left.is_zero() {
                return Err(err!(
                    Unavailable,
                    "{what} ({}): no answer within {}",
                    self.server(),
                    fmt_duration(Instant::now().saturating_duration_since(sent))
                ));
            }
        }
    }

    /// Runs `f` on our session (opened first if need be), bounded as [`Postgres::within`]:
    /// `Err` only if the server did not answer (the session then goes with the thread) or
    /// the session could not be opened; what the server answered is `f`'s to judge.
    fn ask<T: Send + 'static>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Client) -> T + Send + 'static,
    ) -> Result<T> {
        self.client()?;
        let mut c = self.client.take().expect("connected above");
        let (c, r) = self.within(what, move || {
            let r = f(&mut c);
            (c, r)
        })?;
        self.client = Some(c);
        Ok(r)
    }

    /// **A request of a try that got no answer** (issue 27): the session is given up, and
    /// the wait goes on ([`Attempt::Unanswered`]). An advisory lock is its session's: no
    /// other session can adopt it, so a request that may have landed (a
    /// `pg_try_advisory_lock` that took it, a `pg_advisory_lock` granted while its answer
    /// was lost) leaves the lock with a session we no longer talk to. Dropping the session
    /// frees it where the server sees the connection close (a broken connection, a server
    /// restart: nothing is left); where it does not (a half-open connection, the network
    /// cut), the server would keep it until its keepalive gives up (`stale_after`, told at
    /// connect) — so the next try first ends our own lost sessions by their server pid
    /// (`pg_terminate_backend`, allowed for a session of the same role), checked against our
    /// `application_name` (a reused server pid is not ours). Recognising the old session's
    /// lock as ours instead would need that session back, which is what did not answer.
    /// Never two holders: the new session takes the lock only once the old one has let go.
    fn give_up_session(&mut self) {
        self.client = None;
        // The thread blocked on the old session ends with it (detached).
        let waiter = self.waiter.take().and_then(|w| w.session);
        self.lost.extend(self.session.take().into_iter().chain(waiter));
    }

    /// Ends our sessions given up after a lost answer ([`Postgres::give_up_session`]).
    fn end_lost_sessions(&mut self) -> Result<()> {
        if self.lost.is_empty() {
            return Ok(());
        }
        let pids = self.lost.clone();
        let app = app_name(None);
        let r = self.ask("cannot end a session of ours that did not answer", move |c| {
            c.query(
                "SELECT pid FROM pg_stat_activity WHERE pid = ANY($1) AND application_name = $2 \
                 AND pid <> pg_backend_pid() AND pg_terminate_backend(pid)",
                &[&pids, &app],
            )
        })?;
        let rows = r.map_err(|e| self.error("cannot end a session of ours that did not answer", &e))?;
        for row in rows {
            let pid: i32 = row.get(0);
            info!("ended a session of ours whose answer was lost (server pid {pid}): it may have held the lock");
        }
        self.lost.clear();
        Ok(())
    }

    /// What every session tells the server: give up on this connection once nothing has
    /// arrived from us for `stale_after` (TCP_USER_TIMEOUT, which also bounds keepalive
    /// probing), probing an idle connection every second — and, while a query runs (a
    /// waiter blocked in `pg_advisory_lock`), check every second that we are still there.
    /// Keepalive settings are whole seconds; `count` makes idle + count × interval reach
    /// `stale_after` too, for a server where the user timeout cannot be set.
    /// The first is for every server; the others are skipped by servers that predate them.
    fn session_settings(&self) -> (String, [String; 2]) {
        let s = self.stale_after.as_millis().max(1);
        let secs = s.div_ceil(1000) as u64;
        let idle = (secs / 2).max(1);
        let count = secs.saturating_sub(idle).max(1);
        (
            format!(
                "SET tcp_keepalives_idle = {idle}; SET tcp_keepalives_interval = 1; \
                 SET tcp_keepalives_count = {count}"
            ),
            [
                format!("SET tcp_user_timeout = {s}"),
                "SET client_connection_check_interval = 1000".to_string(),
            ],
        )
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
        let kind = Kind::Unavailable;
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
        // The server asked for a password and none was configured: the driver says so only
        // in words (its error kind is private). Authentication, not reachability: 77.
        if msg.contains("password missing") {
            return Error::new(
                Kind::Denied,
                format!(
                    "{what} ({server}): the server asks for a password and none was given \
                     (password_env / password_file; for an address also $LOCKSMITH_PASSWORD, \
                     $PGPASSWORD or ~/.pgpass)"
                ),
            );
        }
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
        if !matches!(self.cfg.password, Password::None) {
            let user = c.get_user().unwrap_or_default().to_string();
            c.password(self.cfg.password.resolve(&user)?);
        }
        c.application_name(&app_name(None))
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

    /// Our session, opened if need be: connected, told when to give up on us
    /// ([`Postgres::session_settings`]) and asked its server pid (to end it should a request
    /// of it go unanswered) — all in one bounded call ([`Postgres::within`]: the driver's
    /// `connect_timeout` covers the socket, not the server's answers). A server without
    /// `tcp_user_timeout` (< 12) or `client_connection_check_interval` (< 14) gets what it
    /// knows, and the holder's guarantee then rests on the keepalive settings alone (said at
    /// `-v`).
    fn client(&mut self) -> Result<&mut Client> {
        // The TLS connector made before any session is taken, whatever it is: a waiter's
        // cancel request needs it ([`Drop`]).
        if self.client.is_none() {
            self.tls()?;
        }
        // An idle session of another backend of ours first, told to hold nothing and to
        // show no token (a place's number is read from its holder's application_name).
        while self.client.is_none()
            && let Some((c, pid)) = pooled(|p| p.take(&self.pool_key())).flatten()
        {
            let app = app_name(None);
            let reset = self.within("cannot reuse a session", move || {
                let mut c = c;
                let r = c.query_one(
                    "SELECT pg_advisory_unlock_all(), set_config('application_name', $1, false)",
                    &[&app],
                );
                (c, r)
            });
            match reset {
                Ok((c, Ok(_))) => {
                    self.client = Some(c);
                    self.session = pid;
                }
                Ok((_, Err(e))) => debug!("not reusing a PostgreSQL session: {e}"),
                // No answer: the server's, not the session's; this try has none either.
                Err(e) => return Err(e),
            }
        }
        if self.client.is_none() {
            let config = self.config()?;
            let tls = self.tls()?;
            let (keepalives, newer) = self.session_settings();
            type Opened = std::result::Result<(Client, Option<i32>), (&'static str, postgres::Error)>;
            let open = move || -> Opened {
                let mut c = match tls {
                    None => config.connect(NoTls),
                    Some(tls) => config.connect(tls),
                }
                .map_err(|e| ("cannot connect", e))?;
                c.batch_execute(&keepalives)
                    .map_err(|e| ("cannot set the session's keepalives", e))?;
                for set in &newer {
                    if let Err(e) = c.batch_execute(set) {
                        if e.code() == Some(&SqlState::UNDEFINED_OBJECT) {
                            info!("this server does not know `{set}`: {e}");
                        } else {
                            return Err(("cannot set the session's timeouts", e));
                        }
                    }
                }
                let pid = c
                    .simple_query("SELECT pg_backend_pid()")
                    .ok()
                    .and_then(|rows| {
                        rows.into_iter().find_map(|m| match m {
                            postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
                            _ => None,
                        })
                    });
                Ok((c, pid))
            };
            let (c, pid) = self
                .within("cannot connect", open)?
                .map_err(|(what, e)| self.error(what, &e))?;
            self.client = Some(c);
            self.session = pid;
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
    /// `Err` only when the lock's number of slots disagrees with ours (SPEC §3b).
    fn grant(&mut self) -> Result<Grant> {
        let schema = self.cfg.schema.clone();
        let lock = self.cfg.token_lock().to_string();
        let n = self.slots as i32;
        let several = self.slots > 1;
        let mode = self.mode;
        let agree = self.agree.clone();
        let limit = self.stale_after;
        let (grant, token) = self.ask("cannot issue a fencing token", move |c| {
            let (grant, token) = tokens(c, &schema, &lock, n, several, mode, agree.as_ref())?;
            // The holder's own token where others can read it (a slot's, a fair queue
            // place's: the table keeps only the last one issued).
            if let Some(t) = grant.as_ref().and_then(|g| g.token)
                && mode == Mode::Exclusive
            {
                let q = "SELECT set_config('application_name', $1, false)";
                if let Err(e) = c.execute(q, &[&app_name(Some(t))]) {
                    debug!("cannot show the token in application_name: {e}");
                }
            }
            // No token query answered: confirm the session by itself (a waiter's grant
            // may come long after its last request).
            let valid = match grant {
                None => c.is_valid(limit),
                Some(_) => Ok(()),
            };
            Ok::<_, Error>((grant, token, valid))
        })?
        .and_then(|(grant, token, valid)| match valid {
            Ok(()) => Ok((grant, token)),
            Err(e) => Err(self.error("cannot confirm the session that took the lock", &e)),
        })?;
        if token.is_some() {
            self.token = token;
        }
        Ok(grant.unwrap_or_default())
    }
}

/// The token query of [`Postgres::grant`] on `client`: the grant (`None` if the server
/// answered none of it) and the token issued to an exclusive holder. The row records the
/// number of slots of the holder it was issued to: one statement when it is ours (the usual
/// case), else a transaction that locks the row, asks the lock
/// ([`Agree`](super::lock::Agree)) and records ours.
fn tokens(
    client: &mut Client,
    schema: &str,
    lock: &str,
    n: i32,
    several: bool,
    mode: Mode,
    agree: Option<&super::lock::Agree>,
) -> Result<(Option<Grant>, Option<i64>)> {
    {
        let shared = mode == Mode::Shared;
        if shared {
            // The number of slots through `to_jsonb`: a table from before slots has no such
            // column (it records 1).
            let q = format!(
                "SELECT token, COALESCE((to_jsonb(t)->>'slots')::int, 1) \
                 FROM {schema}.tokens t WHERE lock = $1"
            );
            let grant = match client.query_opt(&q, &[&lock]) {
                Ok(row) => Some(Grant {
                    token: row.as_ref().map(|r| r.get::<_, i64>(0) as u64),
                    prev_crashed: false,
                    recorded_slots: Some(row.map_or(1, |r| r.get::<_, i32>(1).max(1) as u32)),
                    ..Grant::default()
                }),
                Err(e) => {
                    debug!("no fencing token: {e}");
                    e.as_db_error().map(|_| Grant::default())
                }
            };
            return Ok((grant, None));
        }
        // Slots carry the clean mark over (their holders release in any order).
        let clean = if several { "t.clean" } else { "false" };
        let ours = format!(
            "WITH prev AS (SELECT clean FROM {schema}.tokens WHERE lock = $1) \
             UPDATE {schema}.tokens AS t SET token = t.token + 1, clean = {clean} \
             WHERE lock = $1 AND slots = $2 RETURNING t.token, (SELECT clean FROM prev)"
        );
        let create = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {schema}.tokens \
             (lock text PRIMARY KEY, token bigint NOT NULL, clean boolean NOT NULL, \
              slots integer NOT NULL DEFAULT 1); \
             ALTER TABLE {schema}.tokens ADD COLUMN IF NOT EXISTS slots integer NOT NULL DEFAULT 1"
        );
        let granted = |token: i64, clean: Option<bool>| Grant {
            token: Some(token as u64),
            prev_crashed: !several && clean == Some(false),
            ..Grant::default()
        };
        for attempt in 0..3 {
            let e = match client.query_opt(&ours, &[&lock, &n]) {
                Ok(Some(row)) => {
                    let token: i64 = row.get(0);
                    return Ok((Some(granted(token, row.get(1))), Some(token)));
                }
                // No row yet, or another number of slots recorded.
                Ok(None) => match issue_over(client, schema, lock, n, clean, agree) {
                    Ok(Some((token, prev))) => {
                        return Ok((Some(granted(token, prev)), Some(token)));
                    }
                    Ok(None) => continue,
                    Err(Refused::Agree(e)) => return Err(e),
                    Err(Refused::Db(e)) => e,
                },
                Err(e) => e,
            };
            if attempt < 2
                && matches!(
                    e.code(),
                    Some(
                        &SqlState::UNDEFINED_TABLE
                            | &SqlState::INVALID_SCHEMA_NAME
                            | &SqlState::UNDEFINED_COLUMN
                    )
                )
            {
                // First use (or a table of an older locksmith, without `slots`). Two first
                // users of different locks may race to create it.
                if let Err(e) = client.batch_execute(&create) {
                    debug!("cannot create the fencing-token table: {e}");
                }
                continue;
            }
            debug!("no fencing token: {e}");
            // The server answered (an error of its own): the session is confirmed.
            return Ok((e.as_db_error().map(|_| Grant::default()), None));
        }
        Ok((Some(Grant::default()), None))
    }
}

impl Postgres {

    /// Holders per `pg_locks` (granted advisory locks on our key). A locksmith session the
    /// server has not heard from for `stale_after` (its own clock: the time since the session
    /// last went idle) is not called alive: its holder heartbeats every period, and declares
    /// LOST before that much silence.
    fn holders(&mut self) -> Result<Vec<(i32, Holder)>> {
        let lock = self.cfg.lock.clone();
        let token_lock = self.cfg.token_lock().to_string();
        let schema = self.cfg.schema.clone();
        let q = format!(
            "WITH k AS (SELECT {KEY} AS k) \
             SELECT {HOLDER_COLUMNS} \
             FROM k, pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.classid::int8 = ((k.k >> 32) & 4294967295) \
               AND l.objid::int8 = (k.k & 4294967295) \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        );
        let (rows, token) = self.ask("cannot read pg_locks", move |c| {
            let rows = c.query(&q, &[&lock]);
            let token = rows.is_ok().then(|| {
                c.query_opt(
                    &format!("SELECT token FROM {schema}.tokens WHERE lock = $1"),
                    &[&token_lock],
                )
                .ok()
                .flatten()
                .map(|r| r.get::<_, i64>(0) as u64)
            });
            (rows, token.flatten())
        })?;
        let rows = rows.map_err(|e| self.error("cannot read pg_locks", &e))?;
        Ok(rows.iter().map(|r| self.holder_of_at(r, 0, token)).collect())
    }

    /// The row's [`HOLDER_COLUMNS`] from column `at` on, as a holder, with its session's
    /// server pid; `token`: the last issued, for the lock's one exclusive holder where its
    /// own is not said.
    fn holder_of_at(&self, r: &postgres::Row, at: usize, token: Option<u64>) -> (i32, Holder) {
        let backend_pid: i32 = r.get(at);
        let addr: Option<String> = r.get(at + 1);
        let app: Option<String> = r.get(at + 2);
        let since: Option<String> = r.get(at + 3);
        let mode: String = r.get(at + 4);
        let silent_ms: Option<i64> = r.get(at + 5);
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
                // The holder's own (its application_name), else the last issued:
                // that of the lock's one holder, not of one slot among several.
                token: match word("token=").and_then(|t| t.parse().ok()) {
                    Some(t) if ours && !shared => Some(t),
                    _ if shared || self.cfg.slot_of.is_some() => None,
                    _ => token,
                },
                mode: Some(if shared {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                }),
                // The server holds it for a live session; a silent locksmith may
                // be cut off (the server frees it at `stale_after`).
                alive: if ours
                    && silent_ms.unwrap_or(0) as u128 > self.stale_after.as_millis()
                {
                    None
                } else {
                    Some(true)
                },
                foreign: (!ours).then(|| {
                    format!(
                        "session pid {backend_pid} ({})",
                        app.clone().unwrap_or_default()
                    )
                }),
                slot: None,
            },
        )
    }

    /// One try: `pg_try_advisory_lock`, or the waiter thread's answer.
    fn attempt(&mut self) -> Result<Tried> {
        if let Some(w) = &self.waiter {
            if !w.call.returned() {
                // The wait's deadline: busy only if the server says so now (on a session of
                // its own; the waiter's is blocked). One that stopped answering while we
                // waited is unavailable (69), not busy.
                if self.by.is_some_and(|by| Instant::now() >= by) {
                    return self.busy();
                }
                return Ok(Tried::Busy(Vec::new()));
            }
            let w = self.waiter.take().expect("checked above");
            let (client, r) = w
                .call
                .join()
                .ok_or_else(|| err!(Io, "the PostgreSQL waiter thread failed"))?;
            // The session that read holders meanwhile held nothing: kept for another backend.
            if let Some(reader) = self.client.take() {
                let (key, session) = (self.pool_key(), self.session.take());
                drop(pooled(|p| p.put(key, reader, session)));
            }
            // Granted (or in an unknown state): never kept from here on, unless released.
            self.holds_nothing = false;
            self.client = Some(client);
            self.session = w.session;
            if let Err(e) = r {
                return Err(self.error("cannot take the advisory lock", &e));
            }
            return Ok(Tried::Took(self.grant()?));
        }
        self.end_lost_sessions()?;
        let q = self.lock_fn(true);
        let lock = self.cfg.lock.clone();
        // Bounded: the session goes with the thread if no answer comes in time.
        let got = self
            .ask("cannot take the advisory lock", move |c| {
                c.query_one(&q, &[&lock]).map(|r| r.get::<_, bool>(0))
            })?
            .map_err(|e| self.error("cannot take the advisory lock", &e))?;
        if got {
            // Ours from here on, whatever `grant` says: this session is never kept for
            // another backend unless released.
            self.holds_nothing = false;
            return Ok(Tried::Took(self.grant()?));
        }
        self.busy()
    }

    /// Busy, with the holders the server names; a server that does not answer is no answer
    /// (`Unavailable`), one that refuses to say (an error of its own) names nobody.
    fn busy(&mut self) -> Result<Tried> {
        match self.holders() {
            Ok(h) => Ok(Tried::Busy(h.into_iter().map(|(_, h)| h).collect())),
            Err(e) if e.kind() == Kind::Unavailable => Err(e),
            Err(e) => {
                debug!("{}", e.message());
                Ok(Tried::Busy(Vec::new()))
            }
        }
    }
}

/// Why [`issue_over`] issued nothing.
enum Refused {
    /// The lock's number of slots disagrees with ours.
    Agree(Error),
    Db(postgres::Error),
}

impl From<postgres::Error> for Refused {
    fn from(e: postgres::Error) -> Refused {
        Refused::Db(e)
    }
}

/// Issues the next token of `lock`'s row when it records another number of slots than `n`,
/// or is not there yet: in a transaction that locks the row (issuers of every slot wait on
/// it), asking `agree` first when another number is recorded. `Ok(None)`: a first row made
/// by another at the same moment; try again.
fn issue_over(
    client: &mut Client,
    schema: &str,
    lock: &str,
    n: i32,
    clean: &str,
    agree: Option<&super::lock::Agree>,
) -> std::result::Result<Option<(i64, Option<bool>)>, Refused> {
    let mut tx = client.transaction()?;
    let row = tx.query_opt(
        &format!("SELECT clean, slots FROM {schema}.tokens WHERE lock = $1 FOR UPDATE"),
        &[&lock],
    )?;
    let Some(row) = row else {
        let made = tx.query_opt(
            &format!(
                "INSERT INTO {schema}.tokens (lock, token, clean, slots) VALUES ($1, 1, false, $2) \
                 ON CONFLICT (lock) DO NOTHING RETURNING token"
            ),
            &[&lock, &n],
        )?;
        tx.commit()?;
        return Ok(made.map(|r| (r.get(0), None)));
    };
    let (prev, before): (bool, i32) = (row.get(0), row.get(1));
    if before != n
        && let Some(agree) = agree
    {
        // The transaction ends (and the row is let go) when it is dropped.
        agree(before.max(1) as u32).map_err(Refused::Agree)?;
    }
    let token: i64 = tx
        .query_one(
            &format!(
                "UPDATE {schema}.tokens AS t SET token = t.token + 1, clean = {clean}, slots = $2 \
                 WHERE lock = $1 RETURNING t.token"
            ),
            &[&lock, &n],
        )?
        .get(0);
    tx.commit()?;
    Ok(Some((token, Some(prev))))
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
        self.stop_looking();
        // A session that only looked (beside a waiter thread, the one that read holders),
        // or whose lock was given back: kept while other backends of ours look or wait
        // ([`pool`]). No request here: a waiter that gives up on a server that stopped
        // answering exits at once, as before.
        if (self.waiter.is_some() || self.holds_nothing)
            && let Some(c) = self.client.take()
        {
            let (key, session) = (self.pool_key(), self.session.take());
            drop(pooled(|p| p.put(key, c, session)));
        }
    }
}

impl Backend for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    /// A try whose request got no answer gives its session up and comes back with the
    /// backend ([`Postgres::give_up_session`] argues why that is safe).
    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let tried = self.attempt();
        if tried.as_ref().is_err_and(|e| e.kind() == Kind::Unavailable) {
            self.give_up_session();
        }
        if matches!(tried, Ok(Tried::Took(_))) {
            self.by = None;
            self.stop_looking();
        }
        Tried::or_unanswered(tried, self)
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.by = by;
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        if self.waiter.is_some() {
            return Ok(WaitHint { poll: false, catches_release: false });
        }
        let q = self.lock_fn(false);
        let lock = self.cfg.lock.clone();
        self.client()?;
        let mut client = self.client.take().expect("connected above");
        let cancel = client.cancel_token();
        let call = Blocking::spawn("pg-wait", None, move || {
            let r = client.execute(&q, &[&lock]).map(|_| ());
            (client, r)
        })
        .map_err(|e| Error::io("cannot start the PostgreSQL waiter thread", e))?;
        let session = self.session.take();
        self.waiter = Some(Waiter {
            call,
            cancel,
            session,
        });
        Ok(WaitHint { poll: false, catches_release: false })
    }

    fn agree_on_slots(&mut self, agree: super::lock::Agree) {
        self.agree = Some(agree);
    }

    /// The row's `slots` (no table or row yet: 1; a table from before slots has no such
    /// column, read through `to_jsonb` so that it counts as 1 too).
    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        let schema = self.cfg.schema.clone();
        let lock = self.cfg.token_lock().to_string();
        let q = format!(
            "SELECT COALESCE((to_jsonb(t)->>'slots')::int, 1) FROM {schema}.tokens t WHERE lock = $1"
        );
        let r = self.ask("cannot read the lock's number of slots", move |c| {
            c.query_opt(&q, &[&lock])
        })?;
        match r {
            Ok(row) => Ok(Some(row.map_or(1, |r| r.get::<_, i32>(0).max(1) as u32))),
            Err(e)
                if e.as_db_error().is_some_and(|d| {
                    matches!(*d.code(), SqlState::UNDEFINED_TABLE | SqlState::INVALID_SCHEMA_NAME)
                }) =>
            {
                Ok(Some(1))
            }
            Err(e) if e.as_db_error().is_some() => {
                debug!("cannot read the lock's number of slots: {e}");
                Ok(None)
            }
            Err(e) => Err(self.error("cannot read the lock's number of slots", &e)),
        }
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.waiter.iter().map(|w| w.call.fd()).collect()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(self.holders()?.into_iter().map(|(_, h)| h).collect())
    }

    /// One query: the slots `LOCK.slot-K` (K < n) whose advisory lock is granted now — a fair
    /// line's places (`fair.rs`), which were otherwise read one session each (a fair run
    /// that met nobody opened 66 sessions, 230 ms against 10 ms for a plain run).
    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        let q = "SELECT DISTINCT s FROM generate_series(0, $2 - 1) s, pg_locks l \
                 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
                   AND l.classid::int8 = ((hashtextextended($1 || '.slot-' || s, 0) >> 32) & 4294967295) \
                   AND l.objid::int8 = (hashtextextended($1 || '.slot-' || s, 0) & 4294967295) \
                   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
                 ORDER BY s";
        let lock = self.cfg.lock.clone();
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        let rows = self
            .ask("cannot read pg_locks", move |c| c.query(q, &[&lock, &n]))?
            .map_err(|e| self.error("cannot read pg_locks", &e))?;
        Ok(Some(rows.iter().map(|r| r.get::<_, i32>(0) as u32).collect()))
    }

    /// One query, as [`slots_present`](Self::slots_present): who holds each of the slots
    /// `LOCK.slot-K` (K < n), as `status` of each would say — a fair line read by a waiter
    /// entering it, which was a session and a query per place ahead (8 contenders `--fair`:
    /// ~30 ms each on loopback, issue 26).
    fn slots_holders(&mut self, n: u32) -> Result<Option<Vec<Holder>>> {
        let q = format!(
            "SELECT s, {HOLDER_COLUMNS} \
             FROM generate_series(0, $2 - 1) s, pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 \
               AND l.classid::int8 = ((hashtextextended($1 || '.slot-' || s, 0) >> 32) & 4294967295) \
               AND l.objid::int8 = (hashtextextended($1 || '.slot-' || s, 0) & 4294967295) \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             ORDER BY s"
        );
        let lock = self.cfg.lock.clone();
        let n = i32::try_from(n).unwrap_or(i32::MAX);
        let rows = self
            .ask("cannot read pg_locks", move |c| c.query(&q, &[&lock, &n]))?
            .map_err(|e| self.error("cannot read pg_locks", &e))?;
        Ok(Some(
            rows.iter()
                .map(|r| {
                    let (_, mut h) = self.holder_of_at(r, 1, None);
                    h.slot = Some(r.get::<_, i32>(0) as u32);
                    h
                })
                .collect(),
        ))
    }

    fn break_lock(&mut self, how: Break, _: &mut Watcher) -> Result<BreakOutcome> {
        let holders = self.holders()?;
        // A locksmith session silent for stale_after is breakable without --force.
        super::stale::break_server_held(
            &format!("`{}`", self.cfg.lock),
            holders,
            how,
            |h| h.alive.is_none(),
            [
                "a live session (the server frees it when the session ends)",
                "terminate the session",
            ],
            |pid, h| {
                let r = self.ask("cannot terminate the holding session", move |c| {
                    c.query_one("SELECT pg_terminate_backend($1)", &[&pid])
                })?;
                r.map_err(|e| self.error("cannot terminate the holding session", &e))?;
                info!("terminated the session of {h} (server pid {pid})");
                Ok(())
            },
        )
    }
}

impl Beats for Postgres {
    fn period(&self) -> Duration {
        self.heartbeat
    }

    fn beat(&mut self, deadline: Instant) -> Result<()> {
        // The lease's deadline (`run`'s): past it CMD could not be stopped in time.
        let limit = deadline.saturating_duration_since(Instant::now());
        let r = match self.client.as_mut() {
            Some(c) => c.is_valid(limit),
            None => return Err(err!(Lost, "the session holding lock `{}` is gone", self.cfg.lock)),
        };
        let Err(e) = r else {
            return Ok(());
        };
        // The session is unusable: a timed-out request is still in flight. Closing it would
        // wait for that request; the process is about to exit and the kernel closes it.
        if let Some(c) = self.client.take() {
            std::mem::forget(c);
        }
        let server = self.server();
        let text = e.to_string();
        let why = if text.contains("timeout") || text.contains("timed out") {
            format!(
                "no answer within {}; giving it up before the server can free it",
                fmt_duration(limit)
            )
        } else {
            format!("{text}; the server has released it")
        };
        Err(err!(
            Lost,
            "lost the session holding lock `{}` ({server}): {why}",
            self.cfg.lock
        ))
    }

    fn free(&mut self) -> Result<()> {
        let schema = self.cfg.schema.clone();
        let lock = self.cfg.lock.clone();
        let unlock = match self.mode {
            Mode::Exclusive => format!("SELECT pg_advisory_unlock({KEY})"),
            Mode::Shared => format!("SELECT pg_advisory_unlock_shared({KEY})"),
        };
        // Slots leave the clean mark alone (see `tokens`).
        let token = self.token.take().filter(|_| self.slots == 1);
        let server = self.server();
        let Some(mut client) = self.client.take() else {
            return Ok(());
        };
        let name = lock.clone();
        // Bounded (a release must not hang the helper); no answer: the session goes with
        // the thread, and the server frees the lock when it drops it.
        let r = self
            .within("cannot release the advisory lock", move || {
                if let Some(t) = token
                    && let Err(e) = client.execute(
                        &format!(
                            "UPDATE {schema}.tokens SET clean = true WHERE lock = $1 AND token = $2"
                        ),
                        &[&name, &t],
                    )
                {
                    info!("{e}; the next holder will see prev=crashed");
                }
                let r = client
                    .query_one(&unlock, &[&name])
                    .map(|r| r.get::<_, bool>(0));
                (client, r)
            })
            .map_err(|e| {
                err!(
                    Lost,
                    "{}; the server frees the lock when it drops our session",
                    e.message()
                )
            })?;
        let (client, r) = r;
        match r {
            Ok(true) => {
                // Released: the session may serve another backend of ours (a fair
                // waiter's next look; [`pool`]).
                self.client = Some(client);
                self.holds_nothing = true;
                Ok(())
            }
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
}

/// What `status` shows of a session (pg_stat_activity.application_name, at most 63 bytes):
/// `locksmith [token=T] pid=P ppid=Q host=H`, the token first so that a long host name
/// cannot cut it off.
fn app_name(token: Option<u64>) -> String {
    let me = crate::host::this();
    let mut app = format!(
        "locksmith {}pid={} ppid={} host={}",
        token.map_or_else(String::new, |t| format!("token={t} ")),
        std::process::id(),
        nix::unistd::getppid().as_raw(),
        me.hostname
    );
    app.truncate(63);
    app
}
