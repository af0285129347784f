//! Waiting (SPEC §4.5, §6): try; on contention say once who holds it; wait for the backend's
//! descriptor, a backoff timer or a release cause; give up at `wait`. The one place a
//! contender waits, whatever the backend (as cargo's `acquire` is).

use std::time::{Duration, Instant};

use super::lock::{Attempt, Backend, Held, Lease, describe};
use crate::error::{Error, Kind, Result};
use crate::log::info;
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
    let mut lock = open()?;
    let mut backoff = Backoff::new(common);
    let mut said = false;
    let mut prepared = false;
    loop {
        let began = crate::sys::boottime();
        let holders = match lock.try_acquire()? {
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
                        Vec::new()
                    }
                    _ => {
                        return Ok(Taken { held, since: began });
                    }
                }
            }
            Attempt::Busy(backend, h) => {
                lock = backend;
                h
            }
        };
        let now = Instant::now();
        let busy = |why: String| -> Error {
            Error::new(
                Kind::Busy,
                format!("lock `{profile}` is held by {}{why}", describe(&holders)),
            )
        };
        if deadline.is_some_and(|d| now >= d) {
            return Err(match common.wait {
                Wait::For(d) if d.is_zero() => busy(String::new()),
                Wait::For(d) => busy(format!("; gave up after waiting {}", fmt_duration(d))),
                Wait::Forever => unreachable!("no deadline without a wait"),
            });
        }
        if !said {
            info!(
                "waiting for lock `{profile}`, held by {}",
                describe(&holders)
            );
            said = true;
        }
        let hint = lock.prepare_wait()?;
        if !prepared {
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
        match watcher.wait(&lock.wake_fds(), timeout)? {
            Event::Release(cause) => {
                return Err(busy(format!("; stopped waiting: {cause}")));
            }
            Event::Ready | Event::Timeout => {}
        }
    }
}
