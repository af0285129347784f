//! `locksmith verify` on a PostgreSQL lock: what the backend relies on, tried on the server
//! with the backend's own sessions (its connection settings, TLS and keepalives; issue 12).
//!
//! The probes lock `LOCK.verify.<nonce>`, never the lock itself, and release every advisory
//! lock they take; their sessions are closed at the end (nothing stays on the server).
//!
//! What is measured, and why the backend needs it (see `postgres.rs`):
//! - the connection as configured (TLS as `sslmode` says: whether the session really is);
//! - `pg_try_advisory_lock` refused to a second session while a first holds it (exclusive
//!   and shared requests), granted once released; shared requests of two sessions together,
//!   an exclusive one refused meanwhile;
//! - the lock freed when the holding session closes (the crash safety: a killed locksmith's
//!   lock goes with its connection), and how fast;
//! - what bounds the server's detection of a holder cut off without a word: the session's
//!   `tcp_user_timeout` and keepalives as the server took them (the backend sets them from
//!   `stale_after`), so how long the server may keep a dead holder's lock;
//! - `idle_session_timeout`: a server that ends sessions idle for less than the holder's
//!   heartbeat period would free a lock while its holder still holds it;
//! - for information: `statement_timeout` / `lock_timeout` (they end waits in the server),
//!   the fencing-token table, an empty query's round trip (the heartbeat).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{KEY, PgConfig, Postgres, SslMode};
use crate::backend::address::Address;
use crate::backend::lock::{Backend, Named, Registered};
use crate::backend::verify::{self, Found, Probing, Property, Reliance, Report, figure, median};
use crate::error::{Result, err};
use crate::settings::fmt_duration;
use crate::settings::{Fields, KeyDoc, Password};

/// How long the probes wait for a released lock to show as free.
const FREED_WITHIN: Duration = Duration::from_secs(5);

/// Probes the server of lock `cfg` (profile `p`). `Err` where nothing could be probed: the
/// connection (69, 77, 78 as for taking the lock) or a query the server refused.
pub fn verify(p: &Named, cfg: &PgConfig) -> Result<Report> {
    verify::run(Site::open(p, cfg)?)
}

/// `verify`'s probing session on a PostgreSQL server: two sessions of the backend's own on
/// the probe lock `LOCK.verify.<nonce>`, and the settings the server took.
struct Site {
    p: Named,
    cfg: PgConfig,
    server: String,
    a: Postgres,
    b: Postgres,
    /// The `connect` line.
    connect: String,
    /// The session's settings as the server took them (`pg_settings`: raw numbers).
    set: HashMap<String, String>,
    /// Connected by a local socket (else TCP).
    unix: bool,
    /// How long the server may keep a silently cut-off holder's lock (`None`: until its
    /// socket closes, or unknown).
    bound: Option<Duration>,
}

impl Site {
    /// Connects both sessions, and reads what the server is and took.
    fn open(p: &Named, cfg: &PgConfig) -> Result<Site> {
        let mut probe_cfg = cfg.clone();
        probe_cfg.lock = format!("{}.verify.{}", cfg.lock, crate::host::nonce());
        let mut a = Postgres::new(probe_cfg.clone(), p);
        let server = a.server();
        let t0 = Instant::now();
        a.client()?;
        let connect = t0.elapsed();
        let set = settings(&mut a)?;
        let (version, ssl, unix) = {
            let row = query(
                &mut a,
                "SELECT current_setting('server_version'), \
                        coalesce((SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()), false), \
                        inet_client_addr() IS NULL",
            )?;
            (
                row.get::<_, String>(0),
                row.get::<_, bool>(1),
                row.get::<_, bool>(2),
            )
        };
        let tls = match (ssl, cfg.sslmode) {
            (true, m) => format!("TLS (sslmode {}), certificate verified", m.name()),
            (false, SslMode::Disable) => "no TLS (sslmode disable)".to_string(),
            (false, m) => format!("no TLS (sslmode {}: the server offers none)", m.name()),
        };
        let connect = format!(
            "PostgreSQL {version}, {}, {tls}, in {}",
            if unix { "a local socket" } else { "TCP" },
            figure(connect)
        );
        let mut b = Postgres::new(probe_cfg, p);
        b.client()?;
        Ok(Site {
            p: p.clone(),
            cfg: cfg.clone(),
            server,
            a,
            b,
            connect,
            set,
            unix,
            bound: None,
        })
    }

    /// A setting the server took, as a number.
    fn num(&self, name: &str) -> Option<i64> {
        self.set.get(name).and_then(|v| v.parse::<i64>().ok())
    }

    /// Runs `steps` (which session, which function, the answer it must give) in order: `ok`,
    /// or the first wrong answer.
    fn steps(&mut self, steps: &[Step], ok: &str) -> Result<Found> {
        let mut wrong = None;
        for (i, (first, f, want)) in steps.iter().enumerate() {
            let got = call(if *first { &mut self.a } else { &mut self.b }, f)?;
            if got != *want && wrong.is_none() {
                wrong = Some(format!(
                    "step {} ({} session: {f}) answered {got}, {want} expected",
                    i + 1,
                    if *first { "first" } else { "second" }
                ));
            }
        }
        Ok(wrong.map_or_else(|| Found::Holds(ok.to_string()), Found::Breaks))
    }

    /// The lock goes with the session that holds it (as the kernel closes a killed
    /// locksmith's connection).
    fn freed_on_close(&mut self) -> Result<Found> {
        if !call(&mut self.a, "pg_try_advisory_lock")? {
            return Err(err!(
                Io,
                "probe: the first session could not take the probe lock again"
            ));
        }
        self.a.client = None;
        let t0 = Instant::now();
        let freed = loop {
            if call(&mut self.b, "pg_try_advisory_lock")? {
                break Some(t0.elapsed());
            }
            if t0.elapsed() > FREED_WITHIN {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        Ok(match freed {
            Some(d) => {
                call(&mut self.b, "pg_advisory_unlock")?;
                Found::Holds(format!(
                    "the lock was free {} after its session closed",
                    figure(d)
                ))
            }
            None => Found::Breaks(format!(
                "the lock was still held {} after its session closed",
                fmt_duration(FREED_WITHIN)
            )),
        })
    }

    /// The heartbeat: an empty query, answered in time.
    fn heartbeat(&mut self) -> Result<Found> {
        let period = self.p.common.heartbeat();
        let mut rtts = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let b = &mut self.b;
            b.client()?
                .is_valid(Duration::from_secs(10))
                .map_err(|e| b.error("heartbeat", &e))?;
            rtts.push(t.elapsed());
        }
        let rtt = median(rtts);
        let budget = self.p.common.stale_after.saturating_sub(period * 2);
        let detail = format!(
            "an empty query answered in {} (median of 5); one every {} must be answered within {}",
            figure(rtt),
            fmt_duration(period),
            fmt_duration(budget)
        );
        Ok(if rtt < budget {
            Found::Holds(detail)
        } else {
            Found::Breaks(detail)
        })
    }

    /// How long the server may keep the lock of a holder cut off without a word.
    fn dead_holder_detection(&mut self) -> Result<Found> {
        if self.unix {
            return Ok(Found::Holds(
                "a local socket: the server sees the connection close when the holder's process dies".into(),
            ));
        }
        let stale_after = self.p.common.stale_after;
        let ut = self.num("tcp_user_timeout").unwrap_or(0);
        let (idle, iv, count) = (
            self.num("tcp_keepalives_idle").unwrap_or(0),
            self.num("tcp_keepalives_interval").unwrap_or(0),
            self.num("tcp_keepalives_count").unwrap_or(0),
        );
        let settings = format!(
            "tcp_user_timeout {}, keepalives idle {idle}s interval {iv}s count {count}",
            if ut > 0 {
                fmt_duration(Duration::from_millis(ut as u64))
            } else {
                "0 (off)".into()
            }
        );
        self.bound = detection(ut, idle, iv, count);
        let limit = stale_after + self.p.common.max_poll + self.p.common.heartbeat();
        Ok(match self.bound {
            Some(d) if d <= limit => Found::Holds(format!(
                "the server ends a silently cut-off session within {} of its last word ({settings}, set by the backend from stale_after {})",
                fmt_duration(d),
                fmt_duration(stale_after)
            )),
            Some(d) => Found::Breaks(format!(
                "the server keeps a silently cut-off holder's session, and its lock, up to {} ({settings}), past stale_after {} + max_poll + a heartbeat: the session's settings did not take (a pooler in between?); set the server's tcp_keepalives_idle + tcp_keepalives_interval × tcp_keepalives_count below stale_after",
                fmt_duration(d),
                fmt_duration(stale_after)
            )),
            None => Found::Breaks(format!(
                "the session's keepalive settings did not take ({settings}): the server keeps a silently cut-off holder's session, and its lock, until the operating system gives up (hours by default); set the server's tcp_keepalives_idle, tcp_keepalives_interval and tcp_keepalives_count so that idle + interval × count is below stale_after ({})",
                fmt_duration(stale_after)
            )),
        })
    }

    /// A server that ends idle sessions would free a held lock between two heartbeats.
    fn idle_session_timeout(&self) -> Found {
        let period = self.p.common.heartbeat();
        let idle_timeout = self.num("idle_session_timeout").unwrap_or(0);
        if idle_timeout <= 0 {
            return Found::Holds(
                if self.set.contains_key("idle_session_timeout") {
                    "0 (off)"
                } else {
                    "not known to this server (before 14): sessions are never ended for idling"
                }
                .into(),
            );
        }
        let t = Duration::from_millis(idle_timeout as u64);
        if period * 2 <= t {
            Found::Holds(format!(
                "{}: a heartbeat every {} keeps the holder's session from idling that long",
                fmt_duration(t),
                fmt_duration(period)
            ))
        } else {
            Found::Breaks(format!(
                "the server ends sessions idle for {} (idle_session_timeout), and with them their locks, but a holder idles up to {} between heartbeats: set keepalive to {} or less (or have idle_session_timeout = 0 for this role or database)",
                fmt_duration(t),
                fmt_duration(period),
                fmt_duration(t / 2)
            ))
        }
    }

    /// Timeouts that end a wait in the server (not a safety matter: the wait fails).
    fn wait_timeouts(&self) -> String {
        let waits: Vec<String> = ["statement_timeout", "lock_timeout"]
            .iter()
            .filter_map(|n| {
                let v = self.num(n).filter(|v| *v > 0)?;
                Some(format!(
                    "{n} {}",
                    fmt_duration(Duration::from_millis(v as u64))
                ))
            })
            .collect();
        if waits.is_empty() {
            "statement_timeout and lock_timeout off: a wait in the server lasts as long as `wait` says".to_string()
        } else {
            format!(
                "{}: a wait in the server longer than that ends with an error (not relied on for safety)",
                waits.join(", ")
            )
        }
    }

    /// Whether the fencing-token table can be used (information: the lock works without).
    fn fencing_tokens(&mut self) -> Result<Found> {
        let (pg, cfg) = (&mut self.b, &self.cfg);
        let table = format!("{}.tokens", cfg.schema);
        let row = pg
            .client()?
            .query_one(
                "SELECT CASE WHEN to_regclass($1) IS NULL THEN NULL \
                             ELSE has_table_privilege($1, 'INSERT, UPDATE') END, \
                        has_database_privilege(current_database(), 'CREATE'), \
                        (SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = $2)",
                &[&table, &cfg.schema],
            )
            .map_err(|e| pg.error("cannot read privileges", &e))?;
        let (writable, create_db, create_schema): (Option<bool>, bool, Option<bool>) =
            (row.get(0), row.get(1), row.get(2));
        Ok(Found::Holds(match (writable, create_db, create_schema) {
            (Some(true), ..) => format!("{table} is there and writable: tokens and prev=crashed"),
            (Some(false), ..) => {
                format!("{table} is there but not writable by this user: no fencing tokens")
            }
            (None, _, Some(true)) | (None, true, None) => {
                format!("{table} is made on first use (this user may)")
            }
            (None, ..) => {
                format!("this user may not make {table}: no fencing tokens (the lock works without)")
            }
        }))
    }
}

/// A step of an advisory-lock probe: which session asks (the first, else the second), the
/// function it calls on the probe lock, the answer it must give.
type Step = (bool, &'static str, bool);

/// A second session is refused (exclusive and shared) while the first holds the lock, and
/// gets it once released. A row: first/second session, function, answer.
#[rustfmt::skip]
const EXCLUSIVE: &[Step] = &[
    (true, "pg_try_advisory_lock", true), (false, "pg_try_advisory_lock", false),
    (false, "pg_try_advisory_lock_shared", false), (true, "pg_advisory_unlock", true),
    (false, "pg_try_advisory_lock", true), (false, "pg_advisory_unlock", true),
];

/// Two sessions hold the lock shared; an exclusive request is refused meanwhile.
#[rustfmt::skip]
const SHARED: &[Step] = &[
    (true, "pg_try_advisory_lock_shared", true), (false, "pg_try_advisory_lock_shared", true),
    (false, "pg_try_advisory_lock", false), (true, "pg_advisory_unlock_shared", true),
    (false, "pg_advisory_unlock_shared", true),
];

/// The postgres backend's declaration: what the advisory lock relies on, probed in turn
/// with the backend's own sessions.
impl Probing for Site {
    fn header(&self) -> (String, String) {
        (
            format!(
                "locksmith verify {}: backend postgres, lock `{}` at {}",
                self.p.name, self.cfg.lock, self.server
            ),
            format!("`{}` ({})", self.cfg.lock, self.server),
        )
    }

    fn properties(&self) -> Vec<Property<Site>> {
        vec![
            Property::known("connect", Reliance::Relied, Found::Holds(self.connect.clone())),
            Property::relied("advisory exclusive", |s: &mut Site| {
                s.steps(EXCLUSIVE, "a second session is refused (exclusive and shared) while the first holds it, and gets it once released")
            }),
            Property::relied("advisory shared", |s: &mut Site| {
                s.steps(SHARED, "two sessions hold it shared; an exclusive request is refused meanwhile")
            }),
            Property::relied("freed on session end", Site::freed_on_close),
            Property::relied("heartbeat", Site::heartbeat),
            Property::relied("dead holder detection", Site::dead_holder_detection),
            Property::known("idle_session_timeout", Reliance::Relied, self.idle_session_timeout()),
            Property::stated("wait timeouts", self.wait_timeouts()),
            Property::informs("fencing tokens", Site::fencing_tokens),
            Property::stated(
                "server clock",
                "not read: the server decides from its sessions, not from timestamps",
            ),
        ]
    }

    fn accepts(&mut self, _: &mut Report) -> String {
        let stale_after = self.p.common.stale_after;
        let mut accepts = match self.bound {
            Some(d) => format!(
                "backend postgres keeps SPEC §6 here; with stale_after {} the server frees a silently cut-off holder's lock within {} (its keepalives count whole seconds: at least 2s)",
                fmt_duration(stale_after),
                fmt_duration(d)
            ),
            None => format!(
                "backend postgres keeps SPEC §6 here; any stale_after (now {}): the server frees a dead holder's lock when its socket closes",
                fmt_duration(stale_after)
            ),
        };
        let idle_timeout = self.num("idle_session_timeout").unwrap_or(0);
        if idle_timeout > 0 {
            accepts.push_str(&format!(
                "; keepalive at most {} (idle_session_timeout)",
                fmt_duration(Duration::from_millis(idle_timeout as u64 / 2))
            ));
        }
        accepts
    }
}

/// When the kernel gives up on a silent peer (Linux, `tcp_keepalive_timer`): with a user
/// timeout, at the first keepalive probe after it has passed (probes from `idle`, every
/// `iv`), else after `count` unanswered probes. `None`: no keepalive settings (the system's
/// defaults: hours).
fn detection(ut_ms: i64, idle: i64, iv: i64, count: i64) -> Option<Duration> {
    if idle <= 0 || iv <= 0 {
        return (ut_ms > 0).then(|| Duration::from_millis(ut_ms as u64));
    }
    let ms = if ut_ms > 0 {
        let (idle, iv) = (idle * 1000, iv * 1000);
        let probes = ((ut_ms - idle).max(0) + iv - 1) / iv;
        idle + iv * probes.max(1)
    } else if count > 0 {
        (idle + iv * count) * 1000
    } else {
        return None;
    };
    Some(Duration::from_millis(ms as u64))
}

/// The session's settings as the server took them (`pg_settings`: raw numbers).
fn settings(pg: &mut Postgres) -> Result<HashMap<String, String>> {
    let names = [
        "tcp_user_timeout",
        "tcp_keepalives_idle",
        "tcp_keepalives_interval",
        "tcp_keepalives_count",
        "idle_session_timeout",
        "statement_timeout",
        "lock_timeout",
    ];
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let rows = pg
        .client()?
        .query(
            "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
            &[&names],
        )
        .map_err(|e| pg.error("cannot read the session's settings", &e))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

fn query(pg: &mut Postgres, q: &str) -> Result<postgres::Row> {
    pg.client()?
        .query_one(q, &[])
        .map_err(|e| pg.error("probe query failed", &e))
}

/// `SELECT f(KEY)` on the probe lock: the boolean the function answers.
fn call(pg: &mut Postgres, f: &str) -> Result<bool> {
    let lock = pg.cfg.lock.clone();
    pg.client()?
        .query_one(&format!("SELECT {f}({KEY})"), &[&lock])
        .map(|r| r.get::<_, bool>(0))
        .map_err(|e| pg.error(&format!("probe {f} failed"), &e))
}

/// The registry's view of the backend (`backend/mod.rs`): here, beside its probe, so that the
/// backend's own file never names the probe that uses it.
impl Registered for Postgres {
    type Config = PgConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::KEYS, crate::settings::PASSWORD_KEYS];
    const SHARED: bool = true;
    const SLOTS: bool = true;
    fn parse(f: &mut Fields) -> Result<PgConfig> {
        super::config(f)
    }
    fn slot(cfg: &PgConfig, k: u32) -> PgConfig {
        cfg.slot(k)
    }
    fn queue(cfg: &PgConfig) -> Option<PgConfig> {
        Some(cfg.queue())
    }
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::address(a)
    }
    fn open(cfg: &PgConfig, lock: &Named) -> Box<dyn Backend> {
        Box::new(super::Postgres::new(cfg.clone(), lock))
    }
    fn verify(cfg: &PgConfig, lock: &Named, _peer: Option<&std::path::Path>) -> Result<Report> {
        verify(lock, cfg)
    }
    fn location(c: &PgConfig) -> String {
        let server = match &c.url {
            Some(_) => "the server of the profile's url".to_string(),
            None => format!(
                "{}:{}/{}",
                c.host,
                c.port,
                c.dbname.as_deref().unwrap_or("(the user's database)")
            ),
        };
        format!("advisory lock {:?} on {server}", c.lock)
    }
    fn password(c: &PgConfig) -> Option<&Password> {
        Some(&c.password)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_follows_the_kernels_keepalive_timer() {
        let s = Duration::from_secs;
        // The backend's settings for stale_after 60 s: idle 30, every 1 s, user timeout 60 s.
        assert_eq!(detection(60_000, 30, 1, 30), Some(s(60)));
        // stale_after 1.5 s: idle 1, count 1, user timeout 1.5 s: the second probe.
        assert_eq!(detection(1_500, 1, 1, 1), Some(s(2)));
        // No user timeout: idle + interval × count.
        assert_eq!(detection(0, 10, 2, 3), Some(s(16)));
        // Nothing set: the system's defaults.
        assert_eq!(detection(0, 0, 0, 0), None);
        assert_eq!(detection(5_000, 0, 0, 0), Some(s(5)));
    }
}
