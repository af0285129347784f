//! `locksmith verify` on a Redis lock: what the backend relies on, asked of the server with the
//! backend's own connections (its TLS, AUTH and database).
//!
//! The probes lock `KEY.verify.<nonce>`, never the lock itself, and delete every key they
//! make (the probe's token counter and state too).
//!
//! What is measured, and why the backend needs it (see `redis.rs`):
//! - the role (`INFO replication`): a replica cannot take a lock, and replication is
//!   asynchronous — a failover to a replica that had not received the write grants the lock
//!   again, so a primary with replicas can lose an acknowledged lock (78);
//! - durability (`CONFIG GET appendonly appendfsync`): only `appendonly yes` with
//!   `appendfsync always` keeps an acknowledged lock (and the token counter) through a crash
//!   or restart; anything else can grant one lock twice (78, naming the setting);
//! - eviction (`maxmemory`, `maxmemory-policy`): a policy that may evict keys with an expiry
//!   could drop a held lock;
//! - the scripts themselves: a second connection is refused while the first holds the probe
//!   lock, and gets it once released; the key expires `stale_after` after the last heartbeat;
//! - the heartbeat's round trip; the server's clock against ours (`TIME`): the offset for
//!   information (only the server's clock times an expiry), its rate against our monotonic
//!   clock relied on (a server clock running fast expires keys under their holders).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::resp::Value;
use super::{Redis, RedisConfig};
use crate::backend::address::Address;
use crate::backend::lock::{Backend, Named, Registered, Tried};
use crate::backend::verify::{self, Found, Probing, Property, Reliance, Report, figure, median};
use crate::error::Result;
use crate::settings::{Fields, KeyDoc, Password, fmt_duration};

/// Probes the server of lock `cfg` (profile `p`). `Err` where nothing could be probed: the
/// connection (69, 77, 78 as for taking the lock).
pub fn verify(p: &Named, cfg: &RedisConfig) -> Result<Report> {
    verify::run(Site::open(p, cfg)?)
}

/// `verify`'s probing session: two connections of the backend's own on the probe lock, and
/// what the server said about itself.
struct Site {
    p: Named,
    cfg: RedisConfig,
    server: String,
    a: Redis,
    b: Redis,
    connect: String,
    /// `INFO replication` and `INFO server`, as `field:value` lines.
    info: String,
    /// `CONFIG GET` answers (`None`: the server refused CONFIG, e.g. an ACL without it).
    config: Option<Vec<(String, String)>>,
    /// The server's clock when the session opened.
    clock0: Clock,
}

/// One reading of the server's clock (`TIME`): its time in seconds, the moment of ours it
/// stands for (the middle of the round trip), and how far it is ahead of our wall clock.
struct Clock {
    server: f64,
    /// Our monotonic clock when the request was sent and when the answer came.
    sent: Instant,
    answered: Instant,
    offset: f64,
}

fn server_clock(r: &mut Redis) -> Result<Clock> {
    let wall = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    let (before, wall_before) = (Instant::now(), SystemTime::now());
    let v = cmd(r, &["TIME"])?;
    let (answered, wall_after) = (Instant::now(), SystemTime::now());
    let items = v.items();
    let secs = items.first().and_then(Value::int).unwrap_or(0);
    let micros = items.get(1).and_then(Value::int).unwrap_or(0);
    let server = secs as f64 + micros as f64 / 1e6;
    Ok(Clock {
        server,
        sent: before,
        answered,
        offset: server - (wall(wall_before) + wall(wall_after)) / 2.0,
    })
}

/// One command on `r`'s connection; an error reply is an `Err` of its kind.
fn cmd(r: &mut Redis, args: &[&str]) -> Result<Value> {
    let deadline = Instant::now() + r.timeout;
    let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let v = r.conn()?.call(&argv, deadline);
    match v {
        Ok(Value::Error(e)) => Err(r.refused(&format!("probe {}", args[0]), &e)),
        Ok(v) => Ok(v),
        Err(e) => Err(r.unreachable(&format!("probe {}", args[0]), &e)),
    }
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
}

impl Site {
    fn open(p: &Named, cfg: &RedisConfig) -> Result<Site> {
        let mut probe_cfg = cfg.clone();
        probe_cfg.key = format!("{}.verify.{}", cfg.key, crate::host::nonce());
        let mut a = Redis::new(probe_cfg.clone(), p);
        let server = a.server();
        let t0 = Instant::now();
        a.conn()?;
        let took = t0.elapsed();
        let info = [
            cmd(&mut a, &["INFO", "server"])?,
            cmd(&mut a, &["INFO", "replication"])?,
            cmd(&mut a, &["INFO", "cluster"])?,
        ]
        .iter()
        .filter_map(Value::text)
        .collect::<Vec<_>>()
        .join("\n");
        let config = match cmd(
            &mut a,
            &[
                "CONFIG",
                "GET",
                "append*",
                "maxmemory*",
            ],
        ) {
            Ok(v) => Some(
                v.items()
                    .chunks(2)
                    .filter_map(|c| Some((c.first()?.text()?, c.get(1)?.text()?)))
                    .collect(),
            ),
            // Older servers take one pattern per CONFIG GET: ask again.
            Err(_) => {
                let mut all = Vec::new();
                let mut ok = true;
                for pat in ["appendonly", "appendfsync", "maxmemory", "maxmemory-policy"] {
                    match cmd(&mut a, &["CONFIG", "GET", pat]) {
                        Ok(v) => all.extend(
                            v.items()
                                .chunks(2)
                                .filter_map(|c| Some((c.first()?.text()?, c.get(1)?.text()?))),
                        ),
                        Err(_) => ok = false,
                    }
                }
                ok.then_some(all)
            }
        };
        let version = field(&info, "valkey_version")
            .map(|v| format!("Valkey {v}"))
            .or_else(|| field(&info, "redis_version").map(|v| format!("Redis {v}")))
            .unwrap_or_else(|| "an unknown server".into());
        let tls = if cfg.tls {
            "TLS, certificate verified"
        } else {
            "no TLS"
        };
        let auth = match (&cfg.user, &cfg.password) {
            (_, Password::None) => "no AUTH".to_string(),
            (Some(u), _) => format!("AUTH as ACL user {u}"),
            (None, _) => "AUTH (default user)".to_string(),
        };
        let connect = format!(
            "{version}, {tls}, {auth}, database {}, in {}",
            cfg.db,
            figure(took)
        );
        let mut b = Redis::new(probe_cfg, p);
        b.conn()?;
        let c0 = server_clock(&mut b)?;
        Ok(Site {
            p: p.clone(),
            cfg: cfg.clone(),
            server,
            a,
            b,
            connect,
            info,
            config,
            clock0: c0,
        })
    }

    fn setting(&self, name: &str) -> Option<&str> {
        self.config
            .as_ref()?
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A replica (or a cluster node): it refuses the lock's writes, so the probes that take a
    /// lock are skipped.
    fn replica(&self) -> bool {
        matches!(field(&self.info, "role"), Some("slave" | "replica"))
            || field(&self.info, "cluster_enabled") == Some("1")
    }

    /// A replica cannot take a lock; a primary with replicas can lose one on failover.
    fn role(&self) -> Found {
        if field(&self.info, "cluster_enabled") == Some("1") {
            return Found::Breaks(
                "a Redis Cluster node (cluster_enabled:1): the lock's keys live in different hash slots, and a cluster fails over by asynchronous replication; use one standalone server".into(),
            );
        }
        let role = field(&self.info, "role").unwrap_or("unknown");
        let replicas: u64 = field(&self.info, "connected_slaves")
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        match role {
            "master" if replicas == 0 => Found::Holds(
                "primary, no replicas connected: no failover can hand the lock to a server that missed it".into(),
            ),
            "master" => Found::Breaks(format!(
                "primary with {replicas} replica(s) (connected_slaves): replication is asynchronous, so a failover to a replica that had not received a lock's SET grants that lock twice; use one server without replicas for locks"
            )),
            "slave" | "replica" => Found::Breaks(format!(
                "this server is a replica (role:{role}, of {}): locks must be taken on the primary, and a replica may be promoted without the latest writes",
                field(&self.info, "master_host").unwrap_or("an unknown primary")
            )),
            other => Found::Unmeasured(format!("INFO replication says role:{other}")),
        }
    }

    /// Only `appendonly yes` with `appendfsync always` keeps an acknowledged lock.
    fn durability(&self) -> Found {
        let (Some(aof), Some(fsync)) = (self.setting("appendonly"), self.setting("appendfsync"))
        else {
            return Found::Unmeasured(
                "the server refused CONFIG GET (an ACL without it, or a managed service): appendonly and appendfsync not read; locks are only safe with appendonly yes and appendfsync always".into(),
            );
        };
        if aof != "yes" {
            return Found::Breaks(format!(
                "appendonly {aof}: a restart or crash loses every held lock and the fencing-token counter (acknowledged writes are lost), so one lock can be granted twice and tokens repeat; set appendonly yes and appendfsync always"
            ));
        }
        if fsync != "always" {
            return Found::Breaks(format!(
                "appendfsync {fsync}: a crash can lose writes the server already acknowledged (up to a second with everysec), so one lock can be granted twice; set appendfsync always"
            ));
        }
        Found::Holds("appendonly yes, appendfsync always: every acknowledged write is on disk".into())
    }

    /// An eviction policy that may remove keys with an expiry could drop a held lock.
    fn eviction(&self) -> Found {
        let (Some(max), Some(policy)) =
            (self.setting("maxmemory"), self.setting("maxmemory-policy"))
        else {
            return Found::Unmeasured("maxmemory and maxmemory-policy not read (CONFIG GET refused)".into());
        };
        let max: u64 = max.parse().unwrap_or(0);
        if max == 0 || policy == "noeviction" {
            return Found::Holds(format!(
                "maxmemory {max}, maxmemory-policy {policy}: keys are never evicted"
            ));
        }
        Found::Breaks(format!(
            "maxmemory {max} with maxmemory-policy {policy}: under memory pressure the server may evict a held lock's key; set maxmemory-policy noeviction"
        ))
    }

    /// The backend's own scripts: one holder at a time, the next one in after a release.
    fn exclusive(&mut self) -> Result<Found> {
        if self.replica() {
            return Ok(Found::Skipped);
        }
        let mut steps = Vec::new();
        steps.push(matches!(self.a.attempt()?, Tried::Took(_)));
        steps.push(matches!(self.b.attempt()?, Tried::Busy(_)));
        self.a_free()?;
        steps.push(matches!(self.b.attempt()?, Tried::Took(_)));
        self.b_free()?;
        Ok(match steps.iter().position(|ok| !ok) {
            None => Found::Holds(
                "a second connection is refused while the first holds the probe lock, and gets it once released".into(),
            ),
            Some(i) => Found::Breaks(format!(
                "step {} went wrong ({})",
                i + 1,
                ["the first take", "the second refused", "the second after release"][i]
            )),
        })
    }

    fn a_free(&mut self) -> Result<()> {
        use crate::backend::lock::Beats;
        self.a.free()
    }

    fn b_free(&mut self) -> Result<()> {
        use crate::backend::lock::Beats;
        self.b.free()
    }

    /// The key of a holder that stops heartbeating expires, on the server's clock.
    fn expiry(&mut self) -> Result<Found> {
        if self.replica() {
            return Ok(Found::Skipped);
        }
        let key = format!("{}.expiry", self.a.cfg.key);
        let ms = 300u64;
        cmd(&mut self.a, &["SET", &key, "x", "NX", "PX", &ms.to_string()])?;
        let t0 = Instant::now();
        let gone = loop {
            if cmd(&mut self.b, &["EXISTS", &key])?.int() == Some(0) {
                break Some(t0.elapsed());
            }
            if t0.elapsed() > Duration::from_secs(5) {
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let _ = cmd(&mut self.a, &["DEL", &key]);
        let set = Duration::from_millis(ms);
        Ok(match gone {
            Some(d) if d + Duration::from_millis(50) >= set => Found::Holds(format!(
                "a key set to expire in {} was gone after {}",
                fmt_duration(set),
                figure(d)
            )),
            Some(d) => Found::Breaks(format!(
                "a key set to expire in {} was gone after only {}",
                fmt_duration(set),
                figure(d)
            )),
            None => Found::Breaks(format!(
                "a key set to expire in {} was still there after 5s",
                fmt_duration(set)
            )),
        })
    }

    /// The heartbeat: a script round trip, answered in time.
    fn heartbeat(&mut self) -> Result<Found> {
        let period = self.p.common.heartbeat();
        let mut rtts = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            cmd(&mut self.b, &["PING"])?;
            rtts.push(t.elapsed());
        }
        let rtt = median(rtts);
        let budget = self.p.common.stale_after.saturating_sub(period * 2);
        let detail = format!(
            "PING answered in {} (median of 5); a heartbeat every {} must be answered within {}",
            figure(rtt),
            fmt_duration(period),
            fmt_duration(budget)
        );
        Ok(Found::Timed(
            rtt,
            Box::new(if rtt < budget {
                Found::Holds(detail)
            } else {
                Found::Breaks(detail)
            }),
        ))
    }

    /// The server's clock against ours (`TIME`): how far apart (information), and how fast
    /// it ran since the connection was opened, against our monotonic clock. Redis times an
    /// expiry by its clock while the holder times its lease by ours: a server clock that runs
    /// fast (or is stepped forward) by more than the holder's margin — a heartbeat period and
    /// a half of `stale_after` — expires keys before their holders give them up.
    fn clock(&mut self) -> Result<Found> {
        let now = server_clock(&mut self.b)?;
        let c0 = &self.clock0;
        let elapsed = now.server - c0.server;
        // The server read its clock somewhere inside each round trip: the widest span of ours
        // between the two readings gives the slowest rate the answers allow, the narrowest
        // the fastest. Only a rate certainly too fast (the slowest allowed) fails: a loaded
        // machine's slow round trips must not.
        let widest = now.answered.duration_since(c0.sent).as_secs_f64();
        let narrowest = now.sent.duration_since(c0.answered).as_secs_f64();
        let local = (widest + narrowest) / 2.0;
        let rate = if local > 0.0 { elapsed / local } else { 1.0 };
        let slowest = if widest > 0.0 { elapsed / widest } else { 1.0 };
        let period = self.p.common.heartbeat().as_secs_f64();
        let margin = period * 1.5 / self.p.common.stale_after.as_secs_f64();
        let detail = format!(
            "the server's clock is {:.1} ms {} ours (TIME; agreement is not relied on) and ran at {:+.3}% of our monotonic clock's rate over {}; a holder gives its lock up {:.1}% of stale_after early, so a server clock faster than that (or stepped forward: Redis times expiries by its wall clock) would end locks under their holders",
            now.offset.abs() * 1000.0,
            if now.offset >= 0.0 { "ahead of" } else { "behind" },
            (rate - 1.0) * 100.0,
            figure(Duration::from_secs_f64(local)),
            margin * 100.0
        );
        Ok(if slowest - 1.0 < margin {
            Found::Holds(detail)
        } else {
            Found::Breaks(detail)
        })
    }

    /// The probe lock's token counter and state are the probe's own: deleted.
    fn clean(&mut self) -> Vec<String> {
        if self.replica() {
            return Vec::new();
        }
        let keys = self.a.keys();
        let mut argv = vec!["DEL"];
        argv.extend(keys.iter().map(String::as_str));
        match cmd(&mut self.a, &argv) {
            Ok(_) => Vec::new(),
            Err(_) => keys.to_vec(),
        }
    }
}

impl Probing for Site {
    fn header(&self) -> (String, String) {
        (
            format!(
                "locksmith verify {}: backend redis, key `{}` at {}",
                self.p.name, self.cfg.key, self.server
            ),
            format!("`{}` ({})", self.cfg.key, self.server),
        )
    }

    fn properties(&self) -> Vec<Property<Site>> {
        vec![
            Property::known("connect", Reliance::Relied, Found::Holds(self.connect.clone())),
            Property::known("role", Reliance::Relied, self.role()),
            Property::known("durability", Reliance::Relied, self.durability()),
            Property::known("eviction", Reliance::Relied, self.eviction()),
            Property::relied("exclusive", Site::exclusive),
            Property::relied("expiry", Site::expiry),
            Property::relied("heartbeat", Site::heartbeat),
            Property::relied("server clock", Site::clock),
            Property::stated(
                "one server",
                "no Redlock: the lock lives on this one server; fencing tokens (token=) guard the resource against a holder paused past stale_after",
            ),
        ]
    }

    fn clean_up(&mut self) -> Vec<String> {
        self.clean()
    }

    fn accepts(&mut self, _: &mut Report) -> String {
        format!(
            "backend redis keeps SPEC §6 here; the server expires a silent holder's key {} after its last heartbeat",
            fmt_duration(self.p.common.stale_after)
        )
    }
}

/// The registry's view of the backend (`backend/mod.rs`): here, beside its probe.
impl Registered for Redis {
    type Config = RedisConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::KEYS, crate::settings::PASSWORD_KEYS];
    const SHARED: bool = true;
    const SLOTS: bool = true;
    /// The places held and their numbers are read in one request each
    /// (`slots_present`, `slots_holders`), so a line of many costs a waiter two requests.
    const PLACES: u32 = crate::settings::MAX_SLOTS;
    fn parse(f: &mut Fields) -> Result<RedisConfig> {
        super::config(f)
    }
    fn slot(cfg: &RedisConfig, k: u32) -> RedisConfig {
        cfg.slot(k)
    }
    fn queue(cfg: &RedisConfig) -> Option<RedisConfig> {
        Some(cfg.queue())
    }
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::address(a)
    }
    fn open(cfg: &RedisConfig, lock: &Named) -> Box<dyn Backend> {
        Box::new(Redis::new(cfg.clone(), lock))
    }
    fn verify(cfg: &RedisConfig, lock: &Named, _peer: Option<&std::path::Path>) -> Result<Report> {
        // The probes take the probe lock exclusively, whatever the profile says.
        let mut lock = lock.clone();
        lock.common.shared = false;
        verify(&lock, cfg)
    }
    fn location(c: &RedisConfig) -> String {
        format!(
            "key {:?} on {}://{}:{}/{}",
            c.key,
            if c.tls { "rediss" } else { "redis" },
            c.host,
            c.port,
            c.db
        )
    }
    fn password(c: &RedisConfig) -> Option<&Password> {
        Some(&c.password)
    }
}
