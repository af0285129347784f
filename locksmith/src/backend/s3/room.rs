//! `s3`'s waiting room (SPEC §3b; `waiting.rs` says what a room is for, docs/LAYOUT.md how
//! this one is laid out): an object per waiter, `LOCK.waiting/N.TAG.PID.START.NONCE` — a
//! waiter of N slots, of host tag TAG ([`host::Host::tag`](crate::host::Host::tag), `-`
//! without one), its pid and start time: the name alone says whether a waiter of this host
//! is provably dead. Its body is the waiter's owner record with a beat counter (each rewrite
//! a new body, so a new ETag: a tidy's `If-Match` then misses a place rewritten since).
//!
//! - A waiter puts its place after its first busy try and rewrites it every heartbeat
//!   period (`waiting.rs` tries within that, and keeps it on a try the server did not
//!   answer), so that it never looks silent; it deletes it when it stops waiting, or —
//!   having taken the lock — beside the OK line, on a thread its release waits for (each a
//!   request bounded by 2 s).
//! - A place is a waiter while it lives: written less than `stale_after` ago on the
//!   **server's** clock (the listing's `LastModified` against the `Date` of the page that
//!   listed it, whole seconds: a second is taken off, as every s3 judgement here) and not of
//!   a waiter of this host proven dead. A place of no known age (no `Date`, a `LastModified`
//!   that does not parse) is no waiter: it must not keep the number for ever. A joiner first
//!   deletes the places that are not (`If-Match` the version it listed; at most
//!   [`TIDIED`] per join, all of it bounded by one request bound, stopping at the first
//!   failure): a killed waiter's place stays until the next waiter comes. Only names of
//!   places are judged or deleted.
//! - A contender looks (one listing) only when another number is recorded than its own (a
//!   look over its own number would cost a listing at every acquisition): a waiter of one
//!   slot behind readers is not kept from a newcomer of the number recorded.

use std::time::{Duration, Instant, SystemTime};

use super::http::Cond;
use super::{Listed, S3Config, Site};
use crate::backend::lock::{Named, request_by};
use crate::backend::owner::Record;
use crate::backend::room::{Keeper, Maker, Place, maker_dead, other_number, place_fields};
use crate::error::{Result, err};
use crate::log::{debug, info};

/// The most dead places one join deletes (the rest go with the next joiners).
const TIDIED: usize = 16;

/// The room of an s3 lock.
pub struct S3Room {
    /// The lock's own settings (its key: whatever the slot).
    cfg: S3Config,
    named: Named,
}

impl S3Room {
    pub fn new(cfg: &S3Config, named: &Named) -> S3Room {
        let key = cfg.slot_of.clone().unwrap_or_else(|| cfg.key.clone());
        S3Room {
            cfg: S3Config {
                key,
                slot_of: None,
                ..cfg.clone()
            },
            named: named.clone(),
        }
    }

    fn prefix(&self) -> String {
        format!("{}.waiting/", self.cfg.key)
    }

    fn site(&self, by: Option<Instant>) -> Site {
        let mut site = Site::new(self.cfg.clone(), &self.named);
        site.by = by;
        site
    }

    /// The places listed (objects with a place's name), each with its number of slots and
    /// whether it lives.
    fn places(&self, site: &mut Site) -> Result<Vec<(Listed, u32, bool)>> {
        let listed = site.listing(&self.prefix())?;
        let stale_after = self.named.common.stale_after;
        Ok(listed
            .into_iter()
            .filter_map(|l| {
                let name = l.key.strip_prefix(&self.prefix())?;
                let (n, maker) = parse(name)?;
                let heard = age(l.modified, l.date).is_some_and(|a| a < stale_after);
                let live = heard && !maker_dead(maker);
                Some((l, n, live))
            })
            .collect())
    }
}

/// A place's name, `N.TAG.PID.START.NONCE` ([`place_fields`]). `None`: not a place's name.
fn parse(name: &str) -> Option<(u32, Option<Maker<'_>>)> {
    let [n, tag, pid, start, nonce] = name.split('.').collect::<Vec<_>>()[..] else {
        return None;
    };
    place_fields(n, tag, pid, start, nonce)
}

/// How long ago, on the server's clock, a listed object was written: a second less than the
/// difference (`Date` is in whole seconds) — never more than the truth.
fn age(modified: Option<SystemTime>, date: Option<SystemTime>) -> Option<Duration> {
    let (m, d) = (modified?, date?);
    Some(
        d.duration_since(m)
            .unwrap_or_default()
            .saturating_sub(Duration::from_secs(1)),
    )
}

impl Keeper for S3Room {
    /// Tidies, then puts our place: all of it by one request bound (and the wait's deadline).
    fn join(&self, n: u32, by: Option<Instant>) -> Result<Option<Box<dyn Place>>> {
        let mut site = self.site(by);
        site.by = Some(request_by(site.timeout, by));
        let dead = self.places(&mut site)?.into_iter().filter(|(_, _, live)| !live);
        for (l, _, _) in dead.take(TIDIED) {
            let cond = l.etag.as_deref().map_or(Cond::None, Cond::Is);
            let limit = site.limit();
            match site.call("DELETE", &l.key, &[], cond, &[], limit) {
                Ok(r) if r.ok() => info!("removed a dead waiter's place {}", l.key),
                Ok(_) => {}
                Err(e) => {
                    debug!("cannot remove {}: {e}", l.key);
                    break;
                }
            }
        }
        let record = Record::ours(&self.named.name);
        let tag = crate::host::this().tag().unwrap_or_else(|| "-".into());
        let key = format!(
            "{}{n}.{tag}.{}.{}.{}",
            self.prefix(),
            record.pid,
            record.start,
            record.nonce
        );
        let mut place = S3Place {
            site,
            key,
            record,
            beats: 0,
            written: Instant::now(),
            heartbeat: self.named.common.heartbeat(),
            put: false,
        };
        place.write()?;
        place.site.by = by;
        Ok(Some(Box::new(place)))
    }

    fn other_than(&self, n: u32, lock: &str, by: Option<Instant>) -> Option<u32> {
        let mut site = self.site(by);
        other_number(self.places(&mut site), n, lock)
    }

    /// A listing: only where another number is recorded.
    fn cheap(&self) -> bool {
        false
    }
}

/// A waiter's place: its object.
struct S3Place {
    site: Site,
    key: String,
    /// The waiter's owner record, written with a new beat each time.
    record: Record,
    beats: u64,
    /// When it was last written.
    written: Instant,
    heartbeat: Duration,
    /// Whether a write may have landed (so there is something to delete).
    put: bool,
}

impl S3Place {
    /// Writes the place; failed, it is tried again a heartbeat period later, not at once.
    fn write(&mut self) -> Result<()> {
        let limit = self.site.limit();
        self.written = Instant::now();
        self.beats += 1;
        let body = self.record.render_beat(self.beats).into_bytes();
        let r = self
            .site
            .call("PUT", &self.key, &[], Cond::None, &body, limit);
        // Sent, it may have landed: there is something to delete.
        self.put = true;
        let r = r?;
        if !r.ok() {
            return Err(err!(
                Unavailable,
                "PUT {}: unexpected answer {}",
                self.key,
                r.what()
            ));
        }
        Ok(())
    }
}

impl Place for S3Place {
    fn keep(&mut self, by: Option<Instant>) -> Result<()> {
        if self.written.elapsed() < self.heartbeat {
            return Ok(());
        }
        self.site.by = by;
        self.write()
    }

    fn keep_within(&self) -> Option<Duration> {
        Some(self.heartbeat.saturating_sub(self.written.elapsed()))
    }

    fn leaves_slowly(&self) -> bool {
        true
    }
}

impl Drop for S3Place {
    fn drop(&mut self) {
        if !self.put {
            return;
        }
        self.site.by = Some(Instant::now() + Duration::from_secs(2));
        let limit = self.site.limit();
        if let Err(e) = self
            .site
            .call("DELETE", &self.key, &[], Cond::None, &[], limit)
        {
            info!(
                "cannot give back our place in the waiting room {}: it stays until it is silent ({e})",
                self.key
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_a_place_s_name_is_a_place() {
        assert_eq!(
            parse("2.0123456789abcdef.42.7.n1"),
            Some((2, Some(("0123456789abcdef", 42, 7))))
        );
        assert_eq!(parse("1024.-.42.7.n1"), Some((1024, None)));
        for bad in [
            "0.-.42.7.n1",
            "1025.-.42.7.n1",
            "x.-.42.7.n1",
            "2.-.42.7.",
            "2.-.-42x.7.n1",
            "2.-.42.7.n1.more",
            "2.-.42.7",
            "",
            "99999999999999999999.-.1.1.n",
        ] {
            assert_eq!(parse(bad), None, "{bad}");
        }
    }
}
