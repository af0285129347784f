//! Holding (SPEC §4, §6): the heartbeat schedule, LOST by the lease's point of no return, and
//! release retried until `stale_after`. A [`Hold`] is what [`Hold::acquire`] hands the
//! subcommands: it owns the backend while the lock is held, and is given back by
//! [`Hold::release`] (or [`Hold::abandon`] once lost) — the commands only say what to do
//! when it is lost.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::lock::{Backend, Grant, Held, Lease, NotReleased};
use super::wait::{self, Backoff, Taken};
use crate::error::{Error, Kind, Result, err};
use crate::log::info;
use crate::settings::{Common, fmt_duration};
use crate::sys;
use crate::watch::Watcher;

/// A lock taken and not yet given back.
#[must_use = "dropping a Hold without release() leaves the lock to stale_after"]
pub struct Hold {
    held: Box<dyn Held>,
    backend: &'static str,
    common: Common,
    beat: Heartbeat,
}

impl Hold {
    /// Waits for the lock by the one waiting policy ([`wait::acquire`]: `open`, the wait
    /// counted from `began`) and holds it; the lease runs from the winning attempt.
    pub fn acquire(
        open: impl Fn() -> Result<Box<dyn Backend>>,
        profile: &str,
        common: &Common,
        began: Instant,
        watcher: &mut Watcher,
    ) -> Result<Hold> {
        let mut backend = "";
        let Taken { held, since } = wait::acquire(
            || {
                let lock = open()?;
                backend = lock.name();
                Ok(lock)
            },
            profile,
            common,
            began,
            watcher,
        )?;
        let beat = Heartbeat::new(held.as_ref(), common, since);
        Ok(Hold {
            held,
            backend,
            common: common.clone(),
            beat,
        })
    }

    /// The backend's name (`backend=` of the OK line).
    pub fn backend(&self) -> &'static str {
        self.backend
    }

    /// What the backend handed out with the lock.
    pub fn grant(&self) -> &Grant {
        self.held.grant()
    }

    /// Run mode: a descriptor CMD must inherit so the lock lives as long as it does.
    pub fn inherit_fd(&self) -> Option<BorrowedFd<'_>> {
        self.held.inherit_fd()
    }

    /// How long until the next heartbeat is due; `None`: never (sleep until an event).
    pub fn timeout(&self) -> Option<Duration> {
        self.beat.timeout()
    }

    /// How long CMD gets between SIGTERM and SIGKILL once the lock is lost.
    pub fn grace(&self) -> Duration {
        self.beat.grace()
    }

    /// One heartbeat, if one is due. `lost` runs once the lock is declared lost (at the
    /// lease's point of no return at the latest), before this returns `Kind::Lost`; the
    /// caller then [`abandon`](Hold::abandon)s the hold.
    pub fn beat(&mut self, lost: impl FnOnce(&Error)) -> Result<()> {
        if self.held.alarm().is_some()
            && let Err(e) = self.held.check()
        {
            lost(&e);
            return Err(e);
        }
        self.beat.beat(self.held.as_mut(), lost)
    }

    /// The descriptor to watch beside the heartbeat schedule ([`Held::alarm`]): when it is
    /// readable, [`beat`](Hold::beat) checks the lock at once.
    pub fn alarm(&self) -> Option<BorrowedFd<'_>> {
        self.held.alarm()
    }

    /// Frees the lock, retrying transient failures until `stale_after` (SPEC §4).
    pub fn release(self) -> Result<()> {
        let deadline = Instant::now() + self.common.stale_after;
        let mut backoff = Backoff::new(&self.common);
        let mut held = self.held;
        loop {
            match held.release() {
                Ok(()) => return Ok(()),
                Err(NotReleased {
                    error,
                    retry: Some(again),
                }) if Instant::now() < deadline => {
                    info!("release failed, retrying: {error}");
                    std::thread::sleep(backoff.next_delay());
                    held = again;
                }
                Err(nr) => return Err(nr.error),
            }
        }
    }

    /// Gives a lost (or failing) lock back once, without retrying: whatever is left of it is
    /// the next holder's to break.
    pub fn abandon(self) {
        let _ = self.held.release();
    }
}

/// One lock of a set to take: where it stands on the command line, its name as messages say
/// it, its timings, and how to open it.
pub struct Wanted<'a> {
    pub given: usize,
    pub name: &'a str,
    pub common: Common,
    pub open: Box<dyn Fn() -> Result<Box<dyn Backend>> + 'a>,
}

/// Several locks held as one (SPEC §3b): taken one after another in the order the caller
/// gives (its canonical order, so that two sets never wait on each other in a circle), each
/// held while the next is waited for, under one deadline; all or none; one lost is the set
/// lost; given back in reverse order. A set of one is exactly [`Hold`].
#[must_use = "dropping a HoldSet without release() leaves its locks to stale_after"]
pub struct HoldSet {
    /// In the order taken, each with its place on the command line.
    holds: Vec<(usize, Hold)>,
}

impl HoldSet {
    /// Takes every lock of `wanted`, in that order. Each lock's wait counts from the start of
    /// the set: `--wait` is one deadline for all. If one cannot be taken, those taken are
    /// given back (in reverse order) and its error is the set's.
    pub fn acquire(wanted: Vec<Wanted<'_>>, watcher: &mut Watcher) -> Result<HoldSet> {
        let began = Instant::now();
        let mut set = HoldSet { holds: Vec::new() };
        for w in wanted {
            match Hold::acquire(&w.open, w.name, &w.common, began, watcher) {
                Ok(h) => set.holds.push((w.given, h)),
                Err(e) => {
                    if let Err(r) = set.release() {
                        info!("giving back the locks taken: {r}");
                    }
                    return Err(e);
                }
            }
        }
        Ok(set)
    }

    /// The held locks in command-line order.
    pub fn as_given(&self) -> Vec<&Hold> {
        let mut v: Vec<&(usize, Hold)> = self.holds.iter().collect();
        v.sort_by_key(|(given, _)| *given);
        v.into_iter().map(|(_, h)| h).collect()
    }

    /// Run mode: the descriptor CMD must inherit — a lone lock's; a set has none (CMD dies
    /// with locksmith instead).
    pub fn inherit_fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.holds[..] {
            [(_, h)] => h.inherit_fd(),
            _ => None,
        }
    }

    /// The locks' alarms ([`Hold::alarm`]): the caller waits on them too, and
    /// [`beat`](HoldSet::beat)s when one is readable.
    pub fn alarms(&self) -> Vec<BorrowedFd<'_>> {
        self.holds.iter().filter_map(|(_, h)| h.alarm()).collect()
    }

    /// How long until the next heartbeat of any lock is due; `None`: never.
    pub fn timeout(&self) -> Option<Duration> {
        self.holds.iter().filter_map(|(_, h)| h.timeout()).min()
    }

    /// How long CMD gets between SIGTERM and SIGKILL once a lock is lost.
    pub fn grace(&self) -> Duration {
        self.holds
            .iter()
            .map(|(_, h)| h.grace())
            .min()
            .unwrap_or(Duration::from_secs(1))
    }

    /// The heartbeats due. `lost` runs once, when the first lock is declared lost: the set
    /// is lost with it.
    pub fn beat(&mut self, lost: impl FnOnce(&Error)) -> Result<()> {
        let mut lost = Some(lost);
        for (_, h) in &mut self.holds {
            h.beat(|e| {
                if let Some(f) = lost.take() {
                    f(e)
                }
            })?;
        }
        Ok(())
    }

    /// Frees every lock, the last taken first; the first failure is the set's (after trying
    /// them all).
    pub fn release(mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some((_, h)) = self.holds.pop() {
            if let Err(e) = h.release() {
                info!("{e}");
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Gives every lock back once, without retrying (the set was lost).
    pub fn abandon(mut self) {
        while let Some((_, h)) = self.holds.pop() {
            h.abandon();
        }
    }
}

/// The heartbeat schedule of a holder: every min(keepalive, stale_after/3) from the start
/// of the attempt that took the lock ([`Taken::since`]); a failure to confirm is retried,
/// and LOST declared by the [`Lease`]'s point of no return after the last confirmed
/// heartbeat — counted from when it was *sent*, since the server may have seen it at any
/// moment after. Every attempt is bounded by that point (the backend gets it as a deadline).
struct Heartbeat {
    lease: Option<Lease>,
    retry: Duration,
    /// When (CLOCK_BOOTTIME) the last confirmed heartbeat (or the winning attempt) began.
    last_ok: Duration,
    next: Instant,
}

impl Heartbeat {
    fn new(held: &dyn Held, common: &Common, since: Duration) -> Heartbeat {
        let lease = Lease::of(held, common);
        let age = sys::boottime().saturating_sub(since);
        Heartbeat {
            lease,
            retry: common.poll,
            last_ok: since,
            next: Instant::now() + lease.map_or(Duration::ZERO, |l| l.period.saturating_sub(age)),
        }
    }

    /// `None`: no heartbeat, sleep until an event.
    fn timeout(&self) -> Option<Duration> {
        self.lease
            .map(|_| self.next.saturating_duration_since(Instant::now()))
    }

    /// How long CMD gets between SIGTERM and SIGKILL once the lock is lost.
    fn grace(&self) -> Duration {
        self.lease.map_or(Duration::from_secs(1), |l| l.grace())
    }

    /// One heartbeat, if one is due. `lost` runs once the lock is declared lost, before
    /// this returns `Kind::Lost`: at the lease's point of no return at the latest, even
    /// while the heartbeat call is still in flight — a filesystem call may block in the
    /// kernel for as long as its server likes (a FUSE or hard NFS mount), and the deadline
    /// a backend is given cannot interrupt it. So the call runs on a thread of its own,
    /// and this thread waits for it only until that point; past it, `lost` (stop CMD, say
    /// LOST) runs at once and the beat ends once the call returns.
    fn beat(&mut self, held: &mut dyn Held, lost: impl FnOnce(&Error)) -> Result<()> {
        let Some(lease) = self.lease else {
            return Ok(());
        };
        let period = lease.period;
        if Instant::now() < self.next {
            return Ok(());
        }
        let start = sys::boottime();
        let lost_by = lease.lost_by(self.last_ok);
        // A beat begun past the point of no return (the process was paused, say) comes too
        // late to stop anything: the backend's answer alone says whether the lock is still
        // ours (a server that kept our session), and it gets half a period — the backend's
        // deadline too, not a deadline already passed.
        let wait = if start >= lost_by {
            lease.grace()
        } else {
            lost_by - start
        };
        let deadline = Instant::now() + wait;
        let (done, returned) = std::sync::mpsc::channel();
        let mut lost = Some(lost);
        let result = std::thread::scope(|s| {
            let call = s.spawn(move || {
                let r = held.heartbeat(deadline);
                let _ = done.send(());
                r
            });
            let wait = deadline.saturating_duration_since(Instant::now());
            if returned.recv_timeout(wait).is_err() {
                let e = err!(
                    Lost,
                    "no heartbeat confirmed for {}: the last one has not returned (the filesystem or server stalls)",
                    fmt_duration(sys::boottime().saturating_sub(self.last_ok))
                );
                if let Some(lost) = lost.take() {
                    lost(&e);
                }
                // The call cannot be cut short: the lock is given up once it returns.
                let _ = call.join();
                return Err(e);
            }
            Ok(call
                .join()
                .unwrap_or_else(|_| Err(err!(Io, "the heartbeat panicked"))))
        });
        let e = match result {
            Err(overdue) => return Err(overdue),
            Ok(Ok(())) => {
                self.last_ok = start;
                self.next = Instant::now() + period;
                return Ok(());
            }
            Ok(Err(e)) if e.kind() == Kind::Lost => e,
            Ok(Err(e)) => {
                let silent = sys::boottime().saturating_sub(self.last_ok);
                let retry = self.retry.min(period);
                // Give up if the next try would begin past the point of no return.
                if sys::boottime() + retry < lost_by {
                    info!("heartbeat failed, retrying: {e}");
                    self.next = Instant::now() + retry;
                    return Ok(());
                }
                err!(
                    Lost,
                    "no heartbeat confirmed for {}: {}",
                    fmt_duration(silent),
                    e.message()
                )
            }
        };
        if let Some(lost) = lost.take() {
            lost(&e);
        }
        Err(e)
    }
}
