//! SPEC §6's breaking rule, once, for every backend that keeps its own owner records (the
//! way [`super::acquire`] owns waiting).
//!
//! A backend only lists the lock's holders with their [`Evidence`] — the owner record and a
//! *sign* that changes whenever the holder heartbeats, read fresh — and removes exactly one
//! acquisition when told to ([`Holders`]). This module decides:
//! - **alive**: a record of another format (only `--force` breaks it), a same-host holder
//!   that is alive (its pidfd is watched, so the waiter wakes at its death), or a sign that
//!   changed within `stale_after` of the waiter's *own* monotonic clock;
//! - **dead**: a same-host holder (equal boot id and pid namespace) that is provably gone —
//!   acted on at once, but only through the backend's claim on that very acquisition, so a
//!   record a stale cache still serves can never make us remove its successor;
//! - **silent**: another host's holder (or a lock with no record) whose sign stayed the same
//!   for `stale_after` of our own observation.
//!
//! Messages are said once, and only once a removal succeeded. The same rule serves `break`
//! ([`Judge::break_lock`]), with `--force` and `--token`.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::lock::Named;
use super::lock::{Break, BreakOutcome, Grant, Holder, describe};
use super::owner::Parsed;
use super::wake::Wakeups;
use crate::error::{Error, Kind, Result, err};
use crate::log::info;
use crate::protocol::Mode;
use crate::settings::fmt_duration;
use crate::watch::{Event, Watcher};

/// One holder of a lock, as a backend sees it now.
#[derive(Clone, Debug)]
pub struct Evidence {
    /// Which entry this is, stable for one acquisition (observations are kept per key).
    pub key: OsString,
    /// Its owner record; `None`: the lock exists without one (a locker or breaker died
    /// half-way, or a foreign tool made it).
    pub record: Option<Parsed>,
    /// Whatever changes when the holder heartbeats, read fresh.
    pub sign: Vec<u8>,
    pub mode: Mode,
    /// How long the holder has been silent on the *server's* clock, where the server says
    /// (object storage: `Last-Modified` against `Date`, never more than the truth). When
    /// known it alone decides silence: the waiter need not watch for `stale_after` itself.
    pub age: Option<Duration>,
}

impl Evidence {
    pub fn holder(&self) -> Holder {
        let mut h = self.record.as_ref().map(Parsed::holder).unwrap_or_default();
        h.mode = Some(self.mode);
        h
    }

    /// As [`holder`](Evidence::holder), alive or not as the server's clock says where the
    /// holder is not on this host (`status`).
    pub fn judged(&self, stale_after: Duration) -> Holder {
        let mut h = self.holder();
        if h.alive.is_none()
            && let Some(age) = self.age
        {
            h.alive = Some(age < stale_after);
        }
        h
    }

    fn token(&self) -> Option<u64> {
        match &self.record {
            Some(Parsed::V1(r)) => r.token,
            _ => None,
        }
    }
}

/// A backend's holders, for the judge.
pub trait Holders {
    /// The lock's holders now; `None`: the lock is free. `Some(vec![])`: held, but no holder
    /// is left to judge (a shared group whose last reader is leaving).
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>>;

    /// Removes exactly the acquisition `ev` describes (a claim only one process can win, or a
    /// removal after a fresh re-read). `Ok(false)`: it is no longer there, or changed.
    fn remove(&mut self, ev: &Evidence) -> Result<bool>;

    /// Every holder listed was removed: free the lock's name if that is a step of its own (a
    /// shared group). `Ok(false)`: someone else holds it meanwhile.
    fn finish(&mut self) -> Result<bool> {
        Ok(true)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verdict {
    Alive,
    /// Same host, provably gone.
    Dead,
    /// No sign of life for `stale_after` of our own observation.
    Silent,
}

/// What a waiter saw of each entry (by key) and since when, on its own monotonic clock: the
/// "unchanged for `stale_after`" half of the rule.
pub struct Observations {
    stale_after: Duration,
    seen: HashMap<OsString, (Vec<u8>, Instant)>,
}

impl Observations {
    pub fn new(stale_after: Duration) -> Observations {
        Observations {
            stale_after,
            seen: HashMap::new(),
        }
    }

    /// True when `sign` under `key` stayed the same for `stale_after` of our observation.
    pub fn silent_for_stale(&mut self, key: &OsStr, sign: &[u8]) -> bool {
        match self.seen.get(key) {
            Some((seen, since)) if seen == sign => since.elapsed() >= self.stale_after,
            _ => {
                self.seen
                    .insert(key.to_owned(), (sign.to_vec(), Instant::now()));
                false
            }
        }
    }

    /// Whether `sign` differs from what we saw of `key` before.
    fn changed(&self, key: &OsStr, sign: &[u8]) -> bool {
        self.seen.get(key).is_some_and(|(seen, _)| seen != sign)
    }

    pub fn forget(&mut self, key: &OsStr) {
        self.seen.remove(key);
    }

    fn clear(&mut self) {
        self.seen.clear();
    }

    /// An entry that is not a holder — a breaker's guard, a waiting writer's marker — may be
    /// removed: its owner is provably dead (same host), or it stayed unchanged for
    /// `stale_after` (another host's, or something planted there).
    pub fn abandoned(&mut self, key: &OsStr, record: &Parsed, sign: &[u8]) -> bool {
        match record {
            Parsed::V1(r) if r.same_host() => provably_dead(record),
            _ => self.silent_for_stale(key, sign),
        }
    }
}

/// Whether the process a record names is provably gone: a record of this host (its boot id
/// and pid namespace) whose pid is dead or reused (its start time differs). Never for another
/// host's record, nor one of another format: those may be alive.
pub fn provably_dead(record: &Parsed) -> bool {
    matches!(record, Parsed::V1(r) if r.alive() == Some(false))
}

/// The waiter's (or breaker's) memory of what it saw, and its rule.
pub struct Judge {
    profile: String,
    path: PathBuf,
    stale_after: Duration,
    poll: Duration,
    local: bool,
    observed: Observations,
    /// A holder was removed: the next acquisition follows a crash (`prev=crashed`).
    pub broke: bool,
}

impl Judge {
    /// The judge of lock `path` (shown in messages) under `profile`'s timings; `local`: the
    /// profile says every contender runs on this host.
    pub fn new(profile: &Named, path: PathBuf, local: bool) -> Judge {
        Judge {
            profile: profile.name.to_string(),
            path,
            stale_after: profile.common.stale_after,
            poll: profile.common.poll,
            local,
            observed: Observations::new(profile.common.stale_after),
            broke: false,
        }
    }

    /// We hold the lock now: forget what we saw of others, stop watching their pids and the
    /// directory (leaving the waiters' queue to the next one), and hand out the grant
    /// (`prev=crashed` if we broke someone on the way).
    pub fn grant(&mut self, wake: &mut Wakeups, token: Option<u64>) -> Grant {
        self.observed.clear();
        wake.done();
        Grant {
            token,
            prev_crashed: std::mem::take(&mut self.broke),
            ..Grant::default()
        }
    }

    fn verdict(&mut self, ev: &Evidence, wake: &mut Wakeups) -> Result<Verdict> {
        match &ev.record {
            Some(Parsed::Foreign(_)) => Ok(Verdict::Alive),
            Some(Parsed::V1(rec)) if rec.same_host() => {
                Ok(if wake.holder_alive(rec.pid, rec.start) {
                    Verdict::Alive
                } else {
                    Verdict::Dead
                })
            }
            Some(Parsed::V1(rec)) if self.local => Err(err!(
                Config,
                "profile `{}` says local = true, but lock {} is held by {} from another host or pid namespace",
                self.profile,
                self.path.display(),
                rec.holder()
            )),
            _ => Ok(if self.silent(ev) {
                Verdict::Silent
            } else {
                Verdict::Alive
            }),
        }
    }

    /// The waiter's step: judges every holder and removes the dead and silent ones.
    /// `Ok(None)`: the lock was freed (or vanished): try again. `Ok(Some(live))`: busy.
    pub fn clear_dead(
        &mut self,
        lock: &mut dyn Holders,
        wake: &mut Wakeups,
    ) -> Result<Option<Vec<Holder>>> {
        let Some(list) = lock.holders()? else {
            // Free (or vanished): whatever comes next is watched from scratch.
            self.observed.clear();
            return Ok(None);
        };
        // "Unchanged for stale_after" means seen unchanged at every look: an entry missing
        // from this look starts again if it comes back. On a network filesystem a new lock
        // between its creation and its records can look just like an old one that was there
        // before (same name, a cached stat), and must not inherit its age.
        self.observed
            .seen
            .retain(|k, _| list.iter().any(|ev| ev.key.as_os_str() == k.as_os_str()));
        let mut live = Vec::new();
        for ev in &list {
            let v = self.verdict(ev, wake)?;
            if v == Verdict::Alive {
                live.push(ev.holder());
                continue;
            }
            if !lock.remove(ev)? {
                // Changed meanwhile, or what we judged was a stale view: look again later.
                self.observed.forget(&ev.key);
                live.push(ev.holder());
                continue;
            }
            self.observed.forget(&ev.key);
            self.broke = true;
            let mut h = ev.holder();
            h.alive = Some(false);
            info!("broke lock {} of {h}: {}", self.path.display(), self.why(v));
        }
        if live.is_empty() && lock.finish()? {
            return Ok(None);
        }
        if live.is_empty() {
            live.push(Holder::default());
        }
        Ok(Some(live))
    }

    /// Silent for `stale_after`: on the server's clock where it says (the sign is still
    /// noted, so that `break` sees a heartbeat change), else on our own observation.
    fn silent(&mut self, ev: &Evidence) -> bool {
        let watched = self.observed.silent_for_stale(&ev.key, &ev.sign);
        match ev.age {
            Some(age) => age >= self.stale_after,
            None => watched,
        }
    }

    fn why(&self, v: Verdict) -> String {
        match v {
            Verdict::Dead => "it is dead (same host: proof of death)".into(),
            _ => format!("no heartbeat for {}", fmt_duration(self.stale_after)),
        }
    }

    /// `break`: removes the lock once its holders are dead or silent (at once with `force`),
    /// and only if it is acquisition `token` when one is given.
    pub fn break_lock(
        &mut self,
        lock: &mut dyn Holders,
        Break { force, token }: Break,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        let path = self.path.display().to_string();
        let mut announced = false;
        loop {
            let Some(list) = lock.holders()? else {
                return Ok(BreakOutcome::Free);
            };
            let holders: Vec<Holder> = list.iter().map(Evidence::holder).collect();
            if let Some(want) = token {
                let exact = matches!(&list[..], [ev] if ev.mode == Mode::Exclusive && ev.token() == Some(want));
                if !exact {
                    return Err(err!(
                        Busy,
                        "lock {path} is not acquisition {want} (held by {}); nothing broken",
                        describe(&holders)
                    ));
                }
            }
            let mut pending = false;
            for ev in &list {
                let go = force || self.may_break(ev)?;
                if !(go && lock.remove(ev)?) {
                    pending = true;
                }
            }
            if !pending && lock.finish()? {
                info!("broke lock {path} of {}", describe(&holders));
                return Ok(BreakOutcome::Broken(
                    holders.into_iter().next().unwrap_or_default(),
                ));
            }
            if !announced {
                info!(
                    "lock {path} is held by {} on another host; breaking it if it stays silent for {}",
                    describe(&holders),
                    fmt_duration(self.stale_after)
                );
                announced = true;
            }
            if let Event::Release(cause) = watcher.wait(&[], Some(self.poll))? {
                return Err(Error::new(
                    Kind::Busy,
                    format!("stopped before breaking: {cause}"),
                ));
            }
        }
    }

    /// `break` without `--force`: may this holder go now? An error: it may not, ever.
    fn may_break(&mut self, ev: &Evidence) -> Result<bool> {
        let path = self.path.display();
        let h = ev.holder();
        match &ev.record {
            Some(Parsed::Foreign(_)) => Err(err!(
                Busy,
                "lock {path} has an owner record of another format ({h}); only --force breaks it"
            )),
            Some(Parsed::V1(r)) if r.same_host() => {
                if crate::host::alive(r.pid, r.start) {
                    return Err(refuse_live(
                        &path.to_string(),
                        &h.to_string(),
                        "which is alive",
                        "break it anyway",
                    ));
                }
                Ok(true)
            }
            _ => {
                if self.observed.changed(&ev.key, &ev.sign) {
                    return Err(err!(
                        Busy,
                        "lock {path} is held by {h}, which is alive: its heartbeat changed the lock"
                    ));
                }
                Ok(self.silent(ev))
            }
        }
    }
}

/// `break` where the server keeps each holder alive (a lease, a session): `holders` with what
/// ends each; the acquisition `token` names, or all of them; without `force`, only if `may_go`
/// says each may go, else refused as [`refuse_live`] says (`live`: why it lives, what
/// `--force` does). `end` ends one (revokes its lease, terminates its session).
pub fn break_server_held<T>(
    lock: &str,
    holders: Vec<(T, Holder)>,
    Break { force, token }: Break,
    may_go: impl Fn(&Holder) -> bool,
    live: [&str; 2],
    mut end: impl FnMut(T, &Holder) -> Result<()>,
) -> Result<BreakOutcome> {
    if holders.is_empty() {
        return Ok(BreakOutcome::Free);
    }
    let targets: Vec<(T, Holder)> = holders
        .into_iter()
        .filter(|(_, h)| token.is_none_or(|t| h.token == Some(t)))
        .collect();
    if let Some(t) = token
        && targets.is_empty()
    {
        return Err(err!(
            Busy,
            "lock {lock} is not held by acquisition {t}; nothing broken"
        ));
    }
    if !force && !targets.iter().all(|(_, h)| may_go(h)) {
        let named: Vec<Holder> = targets.into_iter().map(|(_, h)| h).collect();
        return Err(refuse_live(lock, &describe(&named), live[0], live[1]));
    }
    let mut first = None;
    for (t, h) in targets {
        end(t, &h)?;
        first.get_or_insert(h);
    }
    Ok(BreakOutcome::Broken(first.unwrap_or_default()))
}

/// `break` without `--force` refusing a live holder: the one wording for every backend.
/// `why` says how we know it lives, `force_does` what `--force` would do instead.
pub fn refuse_live(lock: &str, holders: &str, why: &str, force_does: &str) -> Error {
    err!(
        Busy,
        "lock {lock} is held by {holders}, {why}; use --force to {force_does}"
    )
}
