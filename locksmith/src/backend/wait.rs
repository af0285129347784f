//! Waiting (SPEC §4.5, §6): try; on contention say once who holds it; wait for the backend's
//! descriptor, a backoff timer or a release cause; give up at `wait`. The one place a
//! contender waits, whatever the backend (as cargo's `acquire` is).

use std::time::{Duration, Instant};

use super::lock::{Attempt, Backend, Held, Holder, Lease, WaitHint, describe};
use crate::error::{Error, Kind, Result};
use crate::log::{info, trace};
use crate::settings::{Common, Wait, fmt_duration};
use crate::watch::{Event, Watcher};

/// A lock [`acquire`] took.
pub struct Taken {
    pub held: Box<dyn Held>,
    /// When (CLOCK_BOOTTIME) the attempt that took it began. The lock may have been ours —
    /// and silent, on a waiter's clock — from then on, not only from when the attempt
    /// returned: a holder counts its lease from here ([`Lease`]).
    pub since: Duration,
}

/// Jittered exponential backoff from `poll` to `max_poll` ("don't hammer the server").
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(common: &Common) -> Backoff {
        Backoff {
            next: common.poll,
            max: common.max_poll,
        }
    }

    /// The next delay: the current step scaled by a random factor in [0.5, 1.0], then the
    /// step doubles up to `max_poll`.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next.mul_f64(0.5 + fastrand::f64() * 0.5);
        self.next = (self.next * 2).min(self.max);
        d
    }
}

/// The waiting policy: try; on contention say once on stderr who holds it; wait for the
/// backend's descriptor, a backoff timer, or a release cause; give up at `wait`.
/// Returns `Kind::Busy` if the wait elapsed or was interrupted (parent gone, signal).
///
/// An attempt that took the lock but returned past its lease's point of no return (a
/// network filesystem stalled between creating the lock and writing its records, say) gives
/// it back and tries again: a waiter may already have judged it silent for `stale_after`
/// and broken in, and nothing done after that moment proves otherwise. `open` opens the
/// backend: once, and again after such a give-back. The wait counts from `began` (for several
/// locks, when the set began: one deadline for all).
///
/// **A try the server did not answer** ([`Attempt::Unanswered`]: a request timed out, the
/// connection was refused, a 5xx) ends the wait only if the contender is not waiting: it
/// has never seen the lock busy and has no `--wait` to wait for (`--wait 0`, or the default
/// `forever` before any answer — an endpoint that is wrong from the start is told at once,
/// 69, as SPEC §4 says of an unreachable server). A waiter — one that saw the lock busy, or
/// has time left before its deadline — says once on stderr that the server does not
/// answer and tries again at its next poll: one slow request (SeaweedFS holds the losers of
/// racing creates in 1-second steps) or a server paused for a moment must not end a wait
/// that the lock's holder would not have ended. Its deadline still holds: a server away
/// when the wait runs out ends it with 69 (unavailable, not 75: nobody knows whether the
/// lock is busy), naming the last failure; release causes (parent gone, a signal) still end
/// it at once (75).
///
/// Why trying again is safe: only backends whose next try recognises their own unanswered
/// write return `Unanswered` (the contract says so): a request that timed out may have
/// succeeded on the server, and the backend keeps what it sent (its nonce) so that the next
/// try adopts the object it finds as its own — never holding twice, never leaving it behind
/// (`s3`: the create's `If-None-Match: *` answers 412 and the owner record's nonce is ours;
/// `redis`: the key's value is our record; `etcd`: the key is named by our lease; `ftp`: the
/// owner marker's nonce; `postgres` gives the session up instead and ends it on the server —
/// each backend's `try_acquire` says how). Other backends still end the wait with the error.
///
/// **The deadline bounds the requests too** (but `--wait 0`'s one try, which gets its whole
/// request bound): each try is told it ([`Backend::answer_by`]),
/// and a backend that talks to a server bounds each request of the try by it, leaving at
/// least [`LAST_BOUND`](super::lock::LAST_BOUND): a server that stops answering keeps a wait
/// past its deadline by about a second, not by a whole request bound (up to 10 s). Where a
/// backend does not (see each backend's `answer_by`), one request may still run past it.
pub fn acquire(
    mut open: impl FnMut() -> Result<Box<dyn Backend>>,
    profile: &str,
    common: &Common,
    began: Instant,
    watcher: &mut Watcher,
) -> Result<Taken> {
    let deadline = match common.wait {
        Wait::Forever => None,
        Wait::For(d) => Some(began + d),
    };
    // What bounds a try's requests: the deadline of a wait; not of `--wait 0`, whose one try
    // gets its whole request bound (a cap would only make a slow answer look like none).
    let by = deadline.filter(|_| matches!(common.wait, Wait::For(d) if !d.is_zero()));
    let mut lock = open()?;
    let mut backoff = Backoff::new(common);
    let mut said = false;
    let mut prepared = false;
    // Whether the lock was ever seen busy; the holders last seen; the failure of the last
    // try, if the server did not answer it.
    let mut seen_busy = false;
    let mut holders = Vec::new();
    // The holders the waiting notice named (a busy try may leave them unnamed).
    let mut shown = Vec::new();
    let mut unanswered: Option<Error> = None;
    loop {
        let began = crate::sys::boottime();
        trace!("lock `{profile}`: trying");
        lock.answer_by(by);
        match lock.try_acquire()? {
            Attempt::Acquired(held) => {
                let began = held.began().map_or(began, |b| b.max(began));
                let took = crate::sys::boottime().saturating_sub(began);
                match Lease::of(held.as_ref(), common) {
                    Some(l) if began + took >= l.lost_by(began) => {
                        info!(
                            "took lock `{profile}` in {}, too late to keep it (a waiter may break a holder silent for {}): giving it back and trying again",
                            fmt_duration(took),
                            fmt_duration(common.stale_after)
                        );
                        if let Err(e) = held.release() {
                            info!("giving back lock `{profile}`: {}", e.error);
                        }
                        lock = open()?;
                        holders = Vec::new();
                        unanswered = None;
                    }
                    _ => {
                        return Ok(Taken { held, since: began });
                    }
                }
            }
            Attempt::Busy(backend, h) => {
                lock = backend;
                holders = h;
                seen_busy = true;
                if unanswered.take().is_some() {
                    info!("lock `{profile}`: the server answers again");
                }
            }
            Attempt::Unanswered(backend, e) => {
                lock = backend;
                // A contender that never saw the lock busy and is not waiting (`--wait 0`,
                // or `forever` before any answer) is told at once; one with a `--wait` is
                // told at its deadline, below, as "gave up after waiting".
                let waits = matches!(common.wait, Wait::For(d) if !d.is_zero());
                if !seen_busy && !waits {
                    return Err(e);
                }
                if unanswered.is_none() {
                    info!(
                        "lock `{profile}`: no answer ({}); still waiting, trying again",
                        e.message()
                    );
                }
                unanswered = Some(e);
            }
        }
        let now = Instant::now();
        // Who holds it, where a try left that unnamed (it may cost: `name_holders`), only
        // when a line shows it: the busy error, the waiting notice.
        let named = |lock: &mut Box<dyn Backend>, holders: Vec<Holder>| {
            if holders.is_empty() {
                lock.name_holders()
            } else {
                holders
            }
        };
        let busy = |holders: &[Holder], why: String| -> Error {
            Error::new(
                Kind::Busy,
                format!("lock `{profile}` is held by {}{why}", describe(holders)),
            )
        };
        if deadline.is_some_and(|d| now >= d) {
            if let Some(e) = unanswered {
                let waited = match common.wait {
                    Wait::For(d) => fmt_duration(d),
                    Wait::Forever => unreachable!("no deadline without a wait"),
                };
                return Err(Error::new(
                    Kind::Unavailable,
                    format!("{}; gave up after waiting {waited}", e.message()),
                ));
            }
            let holders = named(&mut lock, holders);
            return Err(match common.wait {
                Wait::For(d) if d.is_zero() => busy(&holders, String::new()),
                Wait::For(d) => busy(
                    &holders,
                    format!("; gave up after waiting {}", fmt_duration(d)),
                ),
                Wait::Forever => unreachable!("no deadline without a wait"),
            });
        }
        if !said && unanswered.is_none() {
            if crate::log::level() >= crate::log::NORMAL {
                holders = named(&mut lock, std::mem::take(&mut holders));
                shown.clone_from(&holders);
            }
            info!(
                "waiting for lock `{profile}`, held by {}",
                describe(&holders)
            );
            said = true;
        }
        let hint = if unanswered.is_some() {
            // Not yet: what watches for a release talks to the server too.
            WaitHint {
                poll: true,
                catches_release: false,
            }
        } else {
            lock.prepare_wait()?
        };
        if !prepared && unanswered.is_none() && !hint.catches_release {
            // A release between our failed try and the notification set-up would be missed:
            // try once more now that the backend watches.
            prepared = true;
            continue;
        }
        let mut timeout = hint.poll.then(|| backoff.next_delay());
        if let Some(d) = lock.try_within() {
            timeout = Some(timeout.map_or(d, |t| t.min(d)));
        }
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(now);
            timeout = Some(timeout.map_or(left, |t| t.min(left)));
        }
        // Woken by something the backend says is not worth a try (another lock's entry
        // going away in a shared directory): wait on for the rest of the timeout.
        let until = timeout.map(|t| Instant::now() + t);
        loop {
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            match watcher.wait(&lock.wake_fds(), left)? {
                // Stopping at once: no new look at who holds it (naming may ask a server),
                // only what the last try or the notice said.
                Event::Release(cause) => {
                    let holders = if holders.is_empty() { shown } else { holders };
                    return Err(busy(&holders, format!("; stopped waiting: {cause}")));
                }
                Event::Ready if !lock.woken() => {
                    trace!("lock `{profile}`: woken for another entry")
                }
                Event::Ready | Event::Timeout => break,
            }
        }
    }
}
