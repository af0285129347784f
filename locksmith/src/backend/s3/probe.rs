//! `locksmith verify` on an s3 lock: what the backend relies on, tried on the server with
//! the backend's own client (credentials, region, endpoint, TLS).
//!
//! The probes work beside the lock, under `KEY.verify.<nonce>/` (never `KEY`,
//! `KEY.readers/` or `KEY.state`), and delete every object they made at the end.
//!
//! What is measured, and why the backend needs it (see `s3.rs`):
//! - exclusive create: at least 16 clients at once `PUT` one new key with
//!   `If-None-Match: *`, several rounds: exactly one must win every round (SeaweedFS#8800,
//!   versitygw#2288 and s3s-fs 0.14 let several win);
//! - `If-Match` on an object changed since: refused (412), and the ETag changes with the
//!   body (a heartbeat is a rewrite that must change it);
//! - conditional `DELETE`: refused for a stale ETag (the object stays), done for the current
//!   one (a late holder never removes a successor's object);
//! - the server's clock: `Last-Modified` and `Date` are both answered (staleness is judged
//!   on them); its skew against ours is reported.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use super::http::{Client, Cond};
use super::{S3, S3Config, Site};
use crate::backend::address::Address;
use crate::backend::lock::{Backend, Named, Registered};
use crate::backend::verify::{self, Found, Probing, Property, Report, figure};
use crate::error::{Result, err};
use crate::settings::{Fields, KeyDoc};

/// Concurrent creators per round, and rounds.
pub const RACERS: usize = 16;
pub const ROUNDS: usize = 4;

/// Probes the server of lock `cfg` (profile `p`). `Err` where nothing could be probed: no
/// answer (69), refused credentials (77), no such bucket (78).
pub fn verify(p: &Named, cfg: &S3Config) -> Result<Report> {
    verify::run(Session::open(p, cfg)?)
}

struct Session {
    site: Site,
    /// `KEY.verify.<nonce>/`: every probe object is under it.
    base: String,
    /// The server's clock against ours when the session opened: (server − ours) seconds.
    skew: f64,
    dates: bool,
    stale_after: Duration,
}

impl Session {
    fn open(p: &Named, cfg: &S3Config) -> Result<Session> {
        let mut site = Site::new(cfg.clone(), p);
        // Every probe request on a new connection: they follow refusals at once
        // ([`Client::unpooled`]).
        site.client = Some(super::client(cfg)?.unpooled());
        let base = format!("{}.verify.{}/", cfg.key, crate::host::nonce());
        // Credentials, bucket and server first: a LIST of our (empty) prefix.
        let limit = site.timeout;
        let before = SystemTime::now();
        let r = site.call(
            "GET",
            "",
            &[("list-type", "2"), ("prefix", &base)],
            Cond::None,
            &[],
            limit,
        )?;
        let after = SystemTime::now();
        if !r.ok() {
            return Err(site.odd("LIST", &base, &r));
        }
        let mid = before + after.duration_since(before).unwrap_or_default() / 2;
        let skew = r.date.map_or(0.0, |d| match d.duration_since(mid) {
            Ok(ahead) => ahead.as_secs_f64(),
            Err(behind) => -behind.duration().as_secs_f64(),
        });
        Ok(Session {
            site,
            base,
            skew,
            dates: r.date.is_some(),
            stale_after: p.common.stale_after,
        })
    }

    fn client(&mut self) -> Result<Client> {
        Ok(self.site.client()?.clone())
    }

    /// `RACERS` clients create one new key at once, `ROUNDS` times.
    fn exclusive_create(&mut self) -> Result<Found> {
        let client = self.client()?;
        let limit = self.site.timeout * 2;
        let mut winners = Vec::new();
        let started = Instant::now();
        for round in 0..ROUNDS {
            let key = format!("{}race-{round}", self.base);
            let barrier = Arc::new(Barrier::new(RACERS));
            let answers: Vec<std::result::Result<u16, String>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..RACERS)
                    .map(|i| {
                        let (c, b, key) = (client.clone(), Arc::clone(&barrier), key.clone());
                        s.spawn(move || {
                            let body = format!("racer {i}\n");
                            b.wait();
                            c.call("PUT", &key, &[], Cond::Absent, body.as_bytes(), limit)
                                .map(|r| r.status)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
                    .collect()
            });
            let mut won = 0;
            for a in &answers {
                match a {
                    Ok(200 | 201 | 204) => won += 1,
                    Ok(412 | 409) => {}
                    Ok(s @ (400 | 501)) => {
                        return Err(err!(
                            Config,
                            "{} rejects the conditional header `If-None-Match` (HTTP {s}): it cannot hold a lock",
                            self.site.server()
                        ));
                    }
                    Ok(s) => {
                        return Ok(Found::Breaks(format!(
                            "round {}: a creator got HTTP {s}",
                            round + 1
                        )));
                    }
                    Err(why) => {
                        return Ok(Found::Breaks(format!(
                            "round {}: a creator got no answer: {why}",
                            round + 1
                        )));
                    }
                }
            }
            winners.push(won);
        }
        let took = figure(started.elapsed());
        Ok(if winners.iter().all(|&w| w == 1) {
            Found::Holds(format!(
                "{RACERS} creators at once with If-None-Match: *, {ROUNDS} rounds: exactly one won each ({took})"
            ))
        } else {
            Found::Breaks(format!(
                "{RACERS} creators at once with If-None-Match: *: {} won in rounds 1..{ROUNDS} (exactly 1 each is needed): the server does not serialise conditional writes",
                winners
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })
    }

    fn put(&mut self, key: &str, body: &str, cond: Cond<'_>) -> Result<super::http::Reply> {
        let limit = self.site.timeout;
        self.site
            .call("PUT", key, &[], cond, body.as_bytes(), limit)
    }

    /// A write `If-Match` an ETag the object no longer has is refused.
    fn if_match(&mut self) -> Result<Found> {
        let key = format!("{}cas", self.base);
        let a = self.put(&key, "locksmith verify 1\n", Cond::None)?;
        let b = self.put(&key, "locksmith verify 2\n", Cond::None)?;
        let (Some(e1), Some(e2)) = (a.etag, b.etag) else {
            return Ok(Found::Breaks("a PUT answered no ETag".into()));
        };
        if e1 == e2 {
            return Ok(Found::Breaks(format!(
                "two different bodies got the same ETag {e1}: a heartbeat could not be told from the write before it"
            )));
        }
        let c = self.put(&key, "locksmith verify 3\n", Cond::Is(&e1))?;
        let d = self.put(&key, "locksmith verify 3\n", Cond::Is(&e2))?;
        Ok(match (c.status, d.ok()) {
            (412, true) => Found::Holds(
                "a write If-Match an old ETag: 412; If-Match the current one: done; the ETag changes with the body".into(),
            ),
            (s, _) if s != 412 => Found::Breaks(format!(
                "a write If-Match an ETag the object no longer has was answered {} (412 is needed): a holder could overwrite its successor",
                c.what()
            )),
            _ => Found::Breaks(format!(
                "a write If-Match the current ETag was refused ({})",
                d.what()
            )),
        })
    }

    /// A DELETE `If-Match` an old ETag is refused and the object stays; the current one
    /// deletes.
    fn conditional_delete(&mut self) -> Result<Found> {
        let key = format!("{}del", self.base);
        let limit = self.site.timeout;
        let a = self.put(&key, "locksmith verify a\n", Cond::None)?;
        let b = self.put(&key, "locksmith verify b\n", Cond::None)?;
        let (Some(old), Some(now)) = (a.etag, b.etag) else {
            return Ok(Found::Breaks("a PUT answered no ETag".into()));
        };
        let r = self
            .site
            .call("DELETE", &key, &[], Cond::Is(&old), &[], limit)?;
        let head = self
            .site
            .call("HEAD", &key, &[], Cond::None, &[], limit)?;
        if r.status != 412 || !head.ok() {
            return Ok(Found::Breaks(format!(
                "a DELETE If-Match an old ETag was answered {} and the object is {}: a late holder's release would remove its successor's lock",
                r.what(),
                if head.ok() { "still there" } else { "gone" }
            )));
        }
        let r = self
            .site
            .call("DELETE", &key, &[], Cond::Is(&now), &[], limit)?;
        let head = self
            .site
            .call("HEAD", &key, &[], Cond::None, &[], limit)?;
        Ok(if r.ok() && head.status == 404 {
            Found::Holds("If-Match an old ETag: 412, the object kept; the current one: deleted".into())
        } else {
            Found::Breaks(format!(
                "a DELETE If-Match the current ETag was answered {} (the object is {})",
                r.what(),
                if head.ok() { "still there" } else { "gone" }
            ))
        })
    }

    /// `Last-Modified` and `Date`, and the skew of the server's clock.
    fn server_clock(&mut self) -> Result<Found> {
        let key = format!("{}clock", self.base);
        let limit = self.site.timeout;
        self.put(&key, "locksmith verify clock\n", Cond::None)?;
        let r = self
            .site
            .call("HEAD", &key, &[], Cond::None, &[], limit)?;
        let skew = if self.skew.abs() < 1.0 {
            "within a second of ours (its dates are whole seconds)".to_string()
        } else if self.skew > 0.0 {
            format!("{:.1}s ahead of ours", self.skew)
        } else {
            format!("{:.1}s behind ours", -self.skew)
        };
        Ok(match (r.last_modified, r.date, self.dates) {
            (Some(_), Some(_), true) => Found::Holds(format!(
                "Last-Modified and Date answered; the server's clock is {skew} (staleness is judged on the server's clock alone, so skew does not matter)"
            )),
            _ => Found::Breaks(
                "the server does not answer Last-Modified and Date: staleness cannot be judged on its clock".into(),
            ),
        })
    }
}

impl Probing for Session {
    fn header(&self) -> (String, String) {
        (
            format!(
                "locksmith verify {}: backend s3 at {}",
                self.site.profile,
                self.site.server()
            ),
            self.site.shown(),
        )
    }

    fn properties(&self) -> Vec<Property<Session>> {
        vec![
            Property::relied("exclusive create", Session::exclusive_create),
            Property::relied("If-Match", Session::if_match),
            Property::relied("conditional delete", Session::conditional_delete),
            Property::relied("server clock", Session::server_clock),
        ]
    }

    fn clean_up(&mut self) -> Vec<String> {
        let limit = self.site.timeout;
        let base = self.base.clone();
        let Ok(keys) = self.site.list(&base) else {
            return vec![format!("{base}*")];
        };
        let mut left = Vec::new();
        for key in keys {
            let gone = self
                .site
                .call("DELETE", &key, &[], Cond::None, &[], limit)
                .is_ok_and(|r| r.ok() || r.status == 404);
            if !gone {
                left.push(key);
            }
        }
        left
    }

    fn accepts(&mut self, _: &mut Report) -> String {
        format!(
            "backend s3 keeps SPEC §6 on this server (stale_after {} judged on its clock)",
            crate::settings::fmt_duration(self.stale_after)
        )
    }
}

/// The registry's view of the backend (`backend/mod.rs`): here, beside its probe, so that the
/// backend's own file never names the probe that uses it.
impl Registered for S3 {
    type Config = S3Config;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::KEYS];
    const SHARED: bool = true;
    const SLOTS: bool = true;
    fn parse(f: &mut Fields) -> Result<S3Config> {
        super::config(f)
    }
    fn slot(cfg: &S3Config, k: u32) -> S3Config {
        cfg.slot(k)
    }
    fn queue(cfg: &S3Config) -> Option<S3Config> {
        Some(cfg.queue())
    }
    fn room(cfg: &S3Config, lock: &Named) -> Option<crate::backend::room::Room> {
        let room = super::room::S3Room::new(cfg, lock);
        Some(crate::backend::room::Room::new(room))
    }
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::address(a)
    }
    fn open(cfg: &S3Config, lock: &Named) -> Box<dyn Backend> {
        Box::new(S3::new(cfg.clone(), lock))
    }
    fn verify(cfg: &S3Config, lock: &Named, _peer: Option<&std::path::Path>) -> Result<Report> {
        verify(lock, cfg)
    }
    /// The AWS conventions' variables ([`super::http::credentials`]): the key id too, so
    /// that an AWS tool run as CMD does not find half a set and fail, but falls back to its
    /// other sources (`AWS_PROFILE`, `~/.aws/credentials`) as it would without them.
    fn secret_env(_c: &S3Config) -> Vec<&str> {
        vec!["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"]
    }
    fn location(c: &S3Config) -> String {
        match &c.endpoint {
            Some(e) => format!("{e}/{}/{}", c.bucket, c.key),
            None => format!("s3://{}/{}", c.bucket, c.key),
        }
    }
}
