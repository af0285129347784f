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
use crate::settings::{Fields, KeyDoc, Password};
use crate::backend::verify::{Report, Status, figure, median};
use crate::error::Result;
use crate::settings::fmt_duration;

/// The shortest lease probed for expiry (seconds).
const EXPIRY_TTL: i64 = 2;

/// Probes the cluster of lock `cfg` (profile `p`). `Err` where nothing could be probed: no
/// endpoint answers (69), the user is refused (77), a request fails.
pub fn verify(p: &Named, cfg: &EtcdConfig) -> Result<Report> {
    let mut e = Etcd::new(cfg.clone(), p);
    let server = e.server();
    let mut r = Report::new(
        format!(
            "locksmith verify {}: backend etcd, prefix {} at {server}",
            p.name, cfg.prefix
        ),
        format!("{} ({server})", cfg.prefix),
    );
    members(&mut e, &mut r)?;
    let base = format!("{}.verify.{}", cfg.prefix, crate::host::nonce());
    let mut leases = Vec::new();
    let probed = probe(p, &mut e, &base, &mut leases, &mut r);
    // Whatever happened: every lease revoked, every key deleted.
    for lease in leases {
        let _ = e.call(Duration::from_secs(3), |mut c| async move {
            c.lease_revoke(lease).await
        });
    }
    for (key, prefix) in [(format!("{base}/"), true), (format!("{base}.state"), false)] {
        let k = key.clone();
        let gone = e
            .call(Duration::from_secs(3), |mut c| {
                let k = k.clone();
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
            .is_some_and(|r| r.kvs.is_empty());
        if !gone {
            r.left.push(if prefix { format!("{key}*") } else { key });
        }
    }
    probed?;
    r.add(
        "leader change",
        Status::Info,
        "etcd renews every lease when a new leader is elected: a dead holder's key may outlive its TTL by an election",
    );
    r.add(
        "server clock",
        Status::Info,
        "not compared: the TTL runs on the leader's clock; a holder counts its own from each keepalive it sent",
    );
    Ok(r)
}

/// Each endpoint's member status; `Err` if none answers (or the user is refused).
fn members(e: &mut Etcd, r: &mut Report) -> Result<()> {
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
    r.add("endpoints", Status::Ok, detail);
    let alarms: Vec<String> = answered
        .iter()
        .flat_map(|(u, st, _)| st.errors.iter().map(move |x| format!("{u}: {x}")))
        .collect();
    let mut leaders: Vec<u64> = answered.iter().map(|a| a.1.leader).collect();
    leaders.sort_unstable();
    leaders.dedup();
    let term = answered.iter().map(|a| a.1.raft_term).max().unwrap_or(0);
    if !alarms.is_empty() {
        r.add(
            "leader",
            Status::Fail,
            format!("members report errors: {}", alarms.join("; ")),
        );
    } else if leaders.contains(&0) {
        r.add(
            "leader",
            Status::Fail,
            "a member knows no leader: leases can be neither granted nor renewed there",
        );
    } else if leaders.len() > 1 {
        r.add(
            "leader",
            Status::Fail,
            format!(
                "members name different leaders ({}): an election is under way or the cluster is split",
                leaders
                    .iter()
                    .map(|l| format!("{l:x}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    } else {
        r.add(
            "leader",
            Status::Ok,
            format!("member {:x}, raft term {term}", leaders[0]),
        );
    }
    Ok(())
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
        |mut c| async move { c.lease_grant(ttl).await },
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

fn probe(p: &Named, e: &mut Etcd, base: &str, leases: &mut Vec<i64>, r: &mut Report) -> Result<()> {
    let queue = format!("{base}/");
    let stale_after = p.common.stale_after;
    let period = p.common.heartbeat();

    // A linearizable read: a leader and a quorum answer.
    let t = Instant::now();
    keys(e, &queue)?;
    r.add(
        "linearizable read",
        Status::Ok,
        format!(
            "answered in {} (a leader and a quorum)",
            figure(t.elapsed())
        ),
    );

    // An unrenewed lease, left to expire while the rest runs.
    let (short, short_ttl) = grant(e, EXPIRY_TTL, leases)?;
    let short_key = format!("{queue}x/{short:016x}");
    put(e, &short_key, short)?;
    let short_at = Instant::now();

    // The lease the backend would take, and its keepalive.
    let asked = e.ttl;
    let (l1, granted) = grant(e, asked, leases)?;
    let slack = p.common.max_poll + period;
    let granted_d = Duration::from_secs(granted.max(0) as u64);
    if granted < asked {
        r.add(
            "lease TTL",
            Status::Fail,
            format!(
                "asked {asked}s (stale_after {}), granted {granted}s: the lease could expire before its holder declares LOST",
                fmt_duration(stale_after)
            ),
        );
    } else if granted_d > stale_after + slack {
        r.add(
            "lease TTL",
            Status::Fail,
            format!(
                "asked {asked}s for stale_after {}, granted {granted}s (the server's minimum TTL, from its election timeout): a dead holder's key lives {granted}s, past stale_after + max_poll + a heartbeat; set stale_after to at least {granted}s",
                fmt_duration(stale_after)
            ),
        );
    } else {
        r.add(
            "lease TTL",
            Status::Ok,
            format!(
                "asked {asked}s for stale_after {} (whole seconds, at least 2), granted {granted}s",
                fmt_duration(stale_after)
            ),
        );
    }
    let mut rtts = Vec::new();
    let mut renewed = Vec::new();
    for _ in 0..3 {
        let (ttl, d) = keep_alive(e, l1)?;
        renewed.push(ttl);
        rtts.push(d);
    }
    let rtt = median(rtts);
    // A heartbeat must be confirmed a quarter TTL before the lease could expire.
    let budget = Duration::from_millis(asked as u64 * 750).saturating_sub(period);
    if renewed.iter().all(|t| *t > 0) && rtt < budget {
        r.add(
            "lease keepalive",
            Status::Ok,
            format!(
                "renewed to {}s in {} (median of 3); one every {} must be confirmed within {}",
                renewed[0],
                figure(rtt),
                fmt_duration(period),
                fmt_duration(budget)
            ),
        );
    } else {
        r.add(
            "lease keepalive",
            Status::Fail,
            format!(
                "keepalives answered TTLs {renewed:?} in {} (median of 3); one every {} must be confirmed within {}",
                figure(rtt),
                fmt_duration(period),
                fmt_duration(budget)
            ),
        );
    }

    // Queue order: by create revision, oldest first.
    let (l2, _) = grant(e, asked, leases)?;
    let (k1, k2) = (format!("{queue}w/{l1:016x}"), format!("{queue}w/{l2:016x}"));
    put(e, &k1, l1)?;
    put(e, &k2, l2)?;
    let (listed, at) = keys(e, &format!("{queue}w/"))?;
    let names: Vec<&str> = listed.iter().map(|(k, _)| k.as_str()).collect();
    if names == [k1.as_str(), k2.as_str()] && listed[0].1 < listed[1].1 {
        r.add(
            "queue order",
            Status::Ok,
            format!(
                "two keys listed oldest first (create revisions {} < {})",
                listed[0].1, listed[1].1
            ),
        );
    } else {
        r.add(
            "queue order",
            Status::Fail,
            format!("two keys put in turn were listed as {listed:?}"),
        );
    }

    // A revoke frees the key at once, and a watcher of it sees the deletion.
    let c = e.client()?;
    let watch_key = k1.clone();
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
    let (left, _) = keys(e, &format!("{queue}w/"))?;
    let (ttl_after, _) = keep_alive(e, l1)?;
    match seen {
        Ok(Some(when)) if left.len() == 1 && left[0].0 == k2 && ttl_after == 0 => r.add(
            "revoke and watch",
            Status::Ok,
            format!(
                "a revoke ({}) removed the lease's key at once; a watcher saw the deletion {} after it was sent; the revoked lease answers TTL 0",
                figure(revoked),
                figure(when.saturating_duration_since(t))
            ),
        ),
        other => r.add(
            "revoke and watch",
            Status::Fail,
            format!(
                "after a revoke: watch {}, keys left {:?}, keepalive TTL {ttl_after}",
                match other {
                    Ok(Some(_)) => "saw the deletion".to_string(),
                    Ok(None) => "ended without the deletion".to_string(),
                    Err(w) => format!("failed ({w})"),
                },
                left
            ),
        ),
    }

    // The release transaction, guarded by the key's lease.
    let state = format!("{base}.state");
    let guarded = |lease: i64| {
        let (k, st) = (k2.clone(), state.clone());
        move |mut c: Client| {
            let (k, st) = (k.clone(), st.clone());
            async move { c.put_and_delete_if_leased(&k, lease, &st, "clean 0").await }
        }
    };
    let wrong = call(e, "release transaction", guarded(l1))?.succeeded;
    let right = call(e, "release transaction", guarded(l2))?.succeeded;
    let (after, _) = keys(e, &format!("{queue}w/"))?;
    if !wrong && right && after.is_empty() {
        r.add(
            "release transaction",
            Status::Ok,
            "a clean mark and the key's deletion in one step: refused for another lease, done for its own",
        );
    } else {
        r.add(
            "release transaction",
            Status::Fail,
            format!(
                "for another lease: {}; for its own: {}; keys left {after:?}",
                if wrong { "done" } else { "refused" },
                if right { "done" } else { "refused" }
            ),
        );
    }

    // The unrenewed lease: its key goes when it expires.
    let bound = Duration::from_secs(short_ttl.max(1) as u64) * 3 + Duration::from_secs(5);
    let gone = loop {
        let (k, _) = keys(e, &format!("{queue}x/"))?;
        if k.is_empty() {
            break Some(short_at.elapsed());
        }
        if short_at.elapsed() > bound {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    match gone {
        Some(d) => r.add(
            "lease expiry",
            Status::Ok,
            format!(
                "a {short_ttl}s lease left unrenewed: its key went after {}",
                figure(d)
            ),
        ),
        None => r.add(
            "lease expiry",
            Status::Fail,
            format!(
                "a {short_ttl}s lease left unrenewed: its key was still there after {}",
                fmt_duration(bound)
            ),
        ),
    }
    r.accepts = format!(
        "backend etcd keeps SPEC §6 here; it accepts stale_after of {short_ttl}s or more (the shortest lease this cluster grants; now {}, a {granted}s lease)",
        fmt_duration(stale_after)
    );
    Ok(())
}

/// The registry's view of the backend (`backend/mod.rs`): here, beside its probe, so that the
/// backend's own file never names the probe that uses it.
impl Registered for Etcd {
    type Config = EtcdConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::KEYS, crate::settings::PASSWORD_KEYS];
    const SHARED: bool = true;
    fn parse(f: &mut Fields) -> Result<EtcdConfig> {
        super::config(f)
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
