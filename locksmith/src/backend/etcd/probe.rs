//! `locksmith verify` on an etcd lock: what the backend relies on, tried on the cluster with
//! the backend's own client (its endpoints, TLS, user, timeouts and fail-over; issue 12).
//!
//! The probes work beside the lock, under `PREFIX.verify.<nonce>/` and
//! `PREFIX.verify.<nonce>.state` (never under the lock's queue `PREFIX/`, where a key would
//! be a locker), and at the end revoke every lease they granted and delete every key they
//! put: nothing stays on the cluster.
//!
//! What is measured, and why the backend needs it (see `etcd.rs`):
//! - each endpoint's member status: it answers, which leader it knows, its alarms;
//! - a linearizable read (a leader and a quorum);
//! - a lease granted with the TTL the backend asks for `stale_after` (the server may grant
//!   more: its minimum TTL follows its election timeout), renewed by a keepalive;
//! - queue order: keys listed oldest first by create revision (the lock recipe);
//! - a revoke removes the lease's key at once and a watcher of that key sees the deletion
//!   (how a waiter learns the lock is free); a revoked lease answers keepalives with TTL 0;
//! - the release transaction (a clean mark and the key's deletion, guarded by the key's
//!   lease): refused for another lease, done for its own;
//! - a lease left unrenewed expires and its key goes (the crash safety).

use std::time::{Duration, Instant};

use super::rpc::{self, Client, EventType};
use super::{Etcd, EtcdConfig};
use crate::backend::address::Address;
use crate::backend::lock::{Backend, Named, Registered};
use crate::backend::verify::{
    self, Found, Probing, Property, Reliance, Report, either, figure, median,
};
use crate::error::Result;
use crate::settings::fmt_duration;
use crate::settings::{Fields, KeyDoc, Password};

/// The shortest lease probed for expiry (seconds).
const EXPIRY_TTL: i64 = 2;

/// Probes the cluster of lock `cfg` (profile `p`). `Err` where nothing could be probed: no
/// endpoint answers (69), the user is refused (77), a request fails.
pub fn verify(p: &Named, cfg: &EtcdConfig) -> Result<Report> {
    verify::run(Site::open(p, cfg)?)
}

/// `verify`'s probing session on an etcd cluster: the backend's client, the keys beside the
/// lock (`base`) and every lease granted; what each probe leaves for the next.
struct Site {
    e: Etcd,
    p: Named,
    prefix: String,
    server: String,
    /// The `endpoints` and `leader` lines, from each member's status.
    endpoints: Found,
    leader: Found,
    /// `PREFIX.verify.<nonce>`: the probes' keys are under `base/`, and `base.state`.
    base: String,
    /// The probes' queue, beside the lock's: `base/`.
    queue: String,
    leases: Vec<i64>,
    /// The unrenewed lease left to expire: its TTL, and since when.
    short_ttl: i64,
    short_at: Instant,
    /// The TTL asked for `stale_after`, and the lease granted for it (`l1`) with its TTL.
    asked: i64,
    l1: i64,
    granted: i64,
    /// A second lease, the two queued keys, and the revision they were listed at.
    l2: i64,
    k1: String,
    k2: String,
    at: i64,
}

impl Site {
    /// The backend's client, and each endpoint's member status.
    fn open(p: &Named, cfg: &EtcdConfig) -> Result<Site> {
        let mut e = Etcd::new(cfg.clone(), p);
        let server = e.server();
        let (endpoints, leader) = members(&mut e)?;
        let base = format!("{}.verify.{}", cfg.prefix, crate::host::nonce());
        Ok(Site {
            e,
            p: p.clone(),
            prefix: cfg.prefix.clone(),
            server,
            endpoints,
            leader,
            queue: format!("{base}/"),
            base,
            leases: Vec::new(),
            short_ttl: 0,
            short_at: Instant::now(),
            asked: 0,
            l1: 0,
            granted: 0,
            l2: 0,
            k1: String::new(),
            k2: String::new(),
            at: 0,
        })
    }

    /// A linearizable read: a leader and a quorum answer.
    fn linearizable_read(&mut self) -> Result<Found> {
        let t = Instant::now();
        keys(&mut self.e, &self.queue)?;
        Ok(Found::Holds(format!(
            "answered in {} (a leader and a quorum)",
            figure(t.elapsed())
        )))
    }

    /// The lease the backend would take (after an unrenewed one, left to expire while the
    /// rest runs): granted as asked, and not so much longer that a dead holder's key
    /// outlives `stale_after`.
    fn lease_ttl(&mut self) -> Result<Found> {
        let (short, short_ttl) = grant(&mut self.e, EXPIRY_TTL, &mut self.leases)?;
        put(&mut self.e, &format!("{}x/{short:016x}", self.queue), short)?;
        (self.short_ttl, self.short_at) = (short_ttl, Instant::now());

        let asked = self.e.ttl;
        let (l1, granted) = grant(&mut self.e, asked, &mut self.leases)?;
        (self.asked, self.l1, self.granted) = (asked, l1, granted);
        let stale_after = self.p.common.stale_after;
        let slack = self.p.common.max_poll + self.p.common.heartbeat();
        let granted_d = Duration::from_secs(granted.max(0) as u64);
        Ok(if granted < asked {
            Found::Breaks(format!(
                "asked {asked}s (stale_after {}), granted {granted}s: the lease could expire before its holder declares LOST",
                fmt_duration(stale_after)
            ))
        } else if granted_d > stale_after + slack {
            Found::Breaks(format!(
                "asked {asked}s for stale_after {}, granted {granted}s (the server's minimum TTL, from its election timeout): a dead holder's key lives {granted}s, past stale_after + max_poll + a heartbeat; set stale_after to at least {granted}s",
                fmt_duration(stale_after)
            ))
        } else {
            Found::Holds(format!(
                "asked {asked}s for stale_after {} (whole seconds, at least 2), granted {granted}s",
                fmt_duration(stale_after)
            ))
        })
    }

    /// Keepalives renew the lease, confirmed a quarter TTL before it could expire.
    fn lease_keepalive(&mut self) -> Result<Found> {
        let period = self.p.common.heartbeat();
        let mut rtts = Vec::new();
        let mut renewed = Vec::new();
        for _ in 0..3 {
            let (ttl, d) = keep_alive(&mut self.e, self.l1)?;
            renewed.push(ttl);
            rtts.push(d);
        }
        let rtt = median(rtts);
        let budget = Duration::from_millis(self.asked as u64 * 750).saturating_sub(period);
        Ok(if renewed.iter().all(|t| *t > 0) && rtt < budget {
            Found::Holds(format!(
                "renewed to {}s in {} (median of 3); one every {} must be confirmed within {}",
                renewed[0],
                figure(rtt),
                fmt_duration(period),
                fmt_duration(budget)
            ))
        } else {
            Found::Breaks(format!(
                "keepalives answered TTLs {renewed:?} in {} (median of 3); one every {} must be confirmed within {}",
                figure(rtt),
                fmt_duration(period),
                fmt_duration(budget)
            ))
        })
    }

    /// Queue order: by create revision, oldest first.
    fn queue_order(&mut self) -> Result<Found> {
        let (l1, queue) = (self.l1, self.queue.clone());
        let (l2, _) = grant(&mut self.e, self.asked, &mut self.leases)?;
        let (k1, k2) = (format!("{queue}w/{l1:016x}"), format!("{queue}w/{l2:016x}"));
        put(&mut self.e, &k1, l1)?;
        put(&mut self.e, &k2, l2)?;
        let (listed, at) = keys(&mut self.e, &format!("{queue}w/"))?;
        let names: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
        let found = if names == [k1.as_str(), k2.as_str()] && listed[0].1 < listed[1].1 {
            Found::Holds(format!(
                "two keys listed oldest first (create revisions {} < {})",
                listed[0].1, listed[1].1
            ))
        } else {
            Found::Breaks(format!("two keys put in turn were listed as {listed:?}"))
        };
        (self.l2, self.k1, self.k2, self.at) = (l2, k1, k2, at);
        Ok(found)
    }

    /// A revoke frees the key at once, and a watcher of it sees the deletion.
    fn revoke_and_watch(&mut self) -> Result<Found> {
        let e = &mut self.e;
        let (l1, at) = (self.l1, self.at);
        // The other key's lease may be as short as stale_after: renewed, it outlives a slow
        // step (a loaded machine) and stays the one key left.
        keep_alive(e, self.l2)?;
        let c = e.client()?;
        let watch_key = self.k1.clone();
        let rt_limit = e.timeout;
        let stream = e
            .run(rt_limit, async move {
                let mut c = c;
                c.watch(&watch_key, at + 1).await
            })?
            .map_err(|why| e.fail("probe: watch", why))?;
        let t = Instant::now();
        call(e, "lease revoke", |mut c| async move {
            c.lease_revoke(l1).await
        })?;
        let revoked = t.elapsed();
        let seen = e.run(rt_limit, async move {
            let mut s = stream;
            loop {
                match s.message().await? {
                    Some(m) if m.canceled => return Ok(None),
                    Some(m) => {
                        if m.events
                            .iter()
                            .any(|ev| ev.r#type == EventType::Delete as i32)
                        {
                            return Ok(Some(Instant::now()));
                        }
                    }
                    None => return Ok(None),
                }
            }
        })?;
        let (left, _) = keys(e, &format!("{}w/", self.queue))?;
        let (ttl_after, _) = keep_alive(e, l1)?;
        Ok(match seen {
            Ok(Some(when)) if left.len() == 1 && left[0].0 == self.k2 && ttl_after == 0 => {
                Found::Holds(format!(
                    "a revoke ({}) removed the lease's key at once; a watcher saw the deletion {} after it was sent; the revoked lease answers TTL 0",
                    figure(revoked),
                    figure(when.saturating_duration_since(t))
                ))
            }
            other => Found::Breaks(format!(
                "after a revoke: watch {}, keys left {:?}, keepalive TTL {ttl_after}",
                match other {
                    Ok(Some(_)) => "saw the deletion".to_string(),
                    Ok(None) => "ended without the deletion".to_string(),
                    Err(w) => format!("failed ({w})"),
                },
                left
            )),
        })
    }

    /// The release transaction (a clean mark and the key's deletion), guarded by the key's
    /// lease: refused for another lease, done for its own.
    fn release_transaction(&mut self) -> Result<Found> {
        let state = format!("{}.state", self.base);
        let k2 = self.k2.clone();
        let guarded = |lease: i64| {
            let (k, st) = (k2.clone(), state.clone());
            move |mut c: Client| {
                let (k, st) = (k.clone(), st.clone());
                async move { c.put_and_delete_if_leased(&k, lease, &st, "clean 0").await }
            }
        };
        keep_alive(&mut self.e, self.l2)?;
        let wrong = call(&mut self.e, "release transaction", guarded(self.l1))?.succeeded;
        let right = call(&mut self.e, "release transaction", guarded(self.l2))?.succeeded;
        let (after, _) = keys(&mut self.e, &format!("{}w/", self.queue))?;
        Ok(if !wrong && right && after.is_empty() {
            Found::Holds(
                "a clean mark and the key's deletion in one step: refused for another lease, done for its own".into(),
            )
        } else {
            Found::Breaks(format!(
                "for another lease: {}; for its own: {}; keys left {after:?}",
                either(wrong, "done", "refused"),
                either(right, "done", "refused")
            ))
        })
    }

    /// The unrenewed lease: its key goes when it expires.
    fn lease_expiry(&mut self) -> Result<Found> {
        let short_ttl = self.short_ttl;
        let bound = Duration::from_secs(short_ttl.max(1) as u64) * 3 + Duration::from_secs(5);
        let gone = loop {
            let (k, _) = keys(&mut self.e, &format!("{}x/", self.queue))?;
            if k.is_empty() {
                break Some(self.short_at.elapsed());
            }
            if self.short_at.elapsed() > bound {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        Ok(match gone {
            Some(d) => Found::Holds(format!(
                "a {short_ttl}s lease left unrenewed: its key went after {}",
                figure(d)
            )),
            None => Found::Breaks(format!(
                "a {short_ttl}s lease left unrenewed: its key was still there after {}",
                fmt_duration(bound)
            )),
        })
    }
}

/// The etcd backend's declaration: each member's status, then what the lock recipe relies
/// on, probed in turn.
impl Probing for Site {
    fn header(&self) -> (String, String) {
        (
            format!(
                "locksmith verify {}: backend etcd, prefix {} at {}",
                self.p.name, self.prefix, self.server
            ),
            format!("{} ({})", self.prefix, self.server),
        )
    }

    fn properties(&self) -> Vec<Property<Site>> {
        vec![
            Property::known("endpoints", Reliance::Relied, self.endpoints.clone()),
            Property::known("leader", Reliance::Relied, self.leader.clone()),
            Property::relied("linearizable read", Site::linearizable_read),
            Property::relied("lease TTL", Site::lease_ttl),
            Property::relied("lease keepalive", Site::lease_keepalive),
            Property::relied("queue order", Site::queue_order),
            Property::relied("revoke and watch", Site::revoke_and_watch),
            Property::relied("release transaction", Site::release_transaction),
            Property::relied("lease expiry", Site::lease_expiry),
        ]
    }

    /// Whatever happened: every lease revoked, every key deleted.
    fn clean_up(&mut self) -> Vec<String> {
        for lease in std::mem::take(&mut self.leases) {
            let _ = self.e.call(Duration::from_secs(3), |mut c| async move {
                c.lease_revoke(lease).await
            });
        }
        let mut left = Vec::new();
        for (key, prefix) in [
            (format!("{}/", self.base), true),
            (format!("{}.state", self.base), false),
        ] {
            if !deleted(&mut self.e, &key, prefix) {
                left.push(if prefix { format!("{key}*") } else { key });
            }
        }
        left
    }

    fn afterwards(&self) -> Vec<Property<Site>> {
        vec![
            Property::stated(
                "leader change",
                "etcd renews every lease when a new leader is elected: a dead holder's key may outlive its TTL by an election",
            ),
            Property::stated(
                "server clock",
                "not compared: the TTL runs on the leader's clock; a holder counts its own from each keepalive it sent",
            ),
        ]
    }

    fn accepts(&mut self, _: &mut Report) -> String {
        format!(
            "backend etcd keeps SPEC §6 here; it accepts stale_after of {}s or more (the shortest lease this cluster grants; now {}, a {}s lease)",
            self.short_ttl,
            fmt_duration(self.p.common.stale_after),
            self.granted
        )
    }
}

/// Deletes `key` (every key under it, as a `prefix`) and reads it back: whether it is gone.
fn deleted(e: &mut Etcd, key: &str, prefix: bool) -> bool {
    e.call(Duration::from_secs(3), |mut c| {
        let k = key.to_string();
        async move {
            c.delete(&k, prefix).await?;
            if prefix {
                c.range_prefix(&k).await
            } else {
                c.get(&k).await
            }
        }
    })
    .ok()
    .and_then(|r| r.ok())
    .is_some_and(|r| r.kvs.is_empty())
}

/// Each endpoint's member status: the `endpoints` and `leader` lines; `Err` if none answers
/// (or the user is refused).
fn members(e: &mut Etcd) -> Result<(Found, Found)> {
    let opts = e.options()?;
    let limit = e.timeout;
    let mut answered = Vec::new();
    let mut down = Vec::new();
    for url in e.cfg.endpoints.clone() {
        let o = opts.clone();
        let u = url.clone();
        let t = Instant::now();
        let got = e.run(limit, async move {
            let mut c = Client::connect(&u, &o).await?;
            c.status().await
        })?;
        match got {
            Ok(st) => answered.push((url, st, t.elapsed())),
            Err(why) if why.starts_with("denied: ") => return Err(e.fail("cannot connect", why)),
            Err(why) => down.push(format!("{url} ({why})")),
        }
    }
    if answered.is_empty() {
        return Err(e.fail("cannot connect", down.join("; ")));
    }
    let n = e.cfg.endpoints.len();
    let version = answered[0].1.version.clone();
    let times: Vec<Duration> = answered.iter().map(|a| a.2).collect();
    let mut detail = format!(
        "{} of {n} answer (etcd {version}, {} to connect and answer, median)",
        answered.len(),
        figure(median(times))
    );
    if !down.is_empty() {
        detail.push_str(&format!(
            "; not answering: {} (the backend fails over to the others)",
            down.join(", ")
        ));
    }
    let alarms: Vec<String> = answered
        .iter()
        .flat_map(|(u, st, _)| st.errors.iter().map(move |x| format!("{u}: {x}")))
        .collect();
    let mut leaders: Vec<u64> = answered.iter().map(|a| a.1.leader).collect();
    leaders.sort_unstable();
    leaders.dedup();
    let term = answered.iter().map(|a| a.1.raft_term).max().unwrap_or(0);
    let leader = if !alarms.is_empty() {
        Found::Breaks(format!("members report errors: {}", alarms.join("; ")))
    } else if leaders.contains(&0) {
        Found::Breaks(
            "a member knows no leader: leases can be neither granted nor renewed there".into(),
        )
    } else if leaders.len() > 1 {
        Found::Breaks(format!(
            "members name different leaders ({}): an election is under way or the cluster is split",
            leaders
                .iter()
                .map(|l| format!("{l:x}"))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    } else {
        Found::Holds(format!("member {:x}, raft term {term}", leaders[0]))
    };
    Ok((Found::Holds(detail), leader))
}

/// A request of the probes: bounded by the backend's timeout, failing over as it does; a
/// refusal is an error naming `what`.
fn call<T, F, Fut>(e: &mut Etcd, what: &str, f: F) -> Result<T>
where
    F: Fn(Client) -> Fut,
    Fut: std::future::Future<Output = rpc::Result<T>>,
{
    let limit = e.timeout;
    e.call(limit, f)?
        .map_err(|why| e.fail(&format!("probe: {what}"), why))
}

fn grant(e: &mut Etcd, ttl: i64, leases: &mut Vec<i64>) -> Result<(i64, i64)> {
    let g = call(
        e,
        "lease grant",
        |mut c| async move { c.lease_grant(ttl, 0).await },
    )?;
    leases.push(g.id);
    Ok((g.id, g.ttl))
}

fn put(e: &mut Etcd, key: &str, lease: i64) -> Result<i64> {
    let resp = call(e, "put", |mut c| {
        let k = key.to_string();
        async move { c.put(&k, "locksmith verify", lease).await }
    })?;
    Ok(resp.header.map_or(0, |h| h.revision))
}

/// The keys under `prefix`, oldest first, with their create revisions; and the revision
/// read at.
fn keys(e: &mut Etcd, prefix: &str) -> Result<(Vec<(String, i64)>, i64)> {
    let resp = call(e, "range", |mut c| {
        let p = prefix.to_string();
        async move { c.range_prefix(&p).await }
    })?;
    let at = resp.header.as_ref().map_or(0, |h| h.revision);
    Ok((
        resp.kvs
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(&kv.key).into_owned(),
                    kv.create_revision,
                )
            })
            .collect(),
        at,
    ))
}

/// One keepalive: the TTL answered (0: the lease is gone) and its round trip.
fn keep_alive(e: &mut Etcd, lease: i64) -> Result<(i64, Duration)> {
    let t = Instant::now();
    let ttl = call(e, "lease keepalive", |mut c| async move {
        let (_k, mut s) = c.lease_keep_alive(lease).await?;
        Ok(s.message().await?.map_or(0, |r| r.ttl))
    })?;
    Ok((ttl, t.elapsed()))
}

/// The registry's view of the backend (`backend/mod.rs`): here, beside its probe, so that the
/// backend's own file never names the probe that uses it.
impl Registered for Etcd {
    type Config = EtcdConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::KEYS, crate::settings::PASSWORD_KEYS];
    const SHARED: bool = true;
    const SLOTS: bool = true;
    /// The places held and their numbers are read in one request each
    /// (`slots_present`, `slots_holders`), so a line of many costs a waiter two requests.
    const PLACES: u32 = crate::settings::MAX_SLOTS;
    fn parse(f: &mut Fields) -> Result<EtcdConfig> {
        super::config(f)
    }
    fn slot(cfg: &EtcdConfig, k: u32) -> EtcdConfig {
        cfg.slot(k)
    }
    fn queue(cfg: &EtcdConfig) -> Option<EtcdConfig> {
        Some(cfg.queue())
    }
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::address(a)
    }
    fn open(cfg: &EtcdConfig, lock: &Named) -> Box<dyn Backend> {
        Box::new(super::Etcd::new(cfg.clone(), lock))
    }
    fn verify(cfg: &EtcdConfig, lock: &Named, _peer: Option<&std::path::Path>) -> Result<Report> {
        verify(lock, cfg)
    }
    fn location(c: &EtcdConfig) -> String {
        format!("{} under {}", c.endpoints.join(","), c.prefix)
    }
    fn password(c: &EtcdConfig) -> Option<&Password> {
        Some(&c.password)
    }
}
