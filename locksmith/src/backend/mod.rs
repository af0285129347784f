//! The lock backends and the one policy every backend waits by.
//!
//! A backend knows how to *try* once, how to tell the waiter when trying again is worthwhile
//! (a descriptor to poll, and/or polling with backoff), how to heartbeat and release, and how
//! to describe the holder. The waiting policy — try, say once who holds it, wait, give up at
//! `wait` — lives here only (as cargo's `acquire` does), so the protocol and watch code never
//! see a backend's details and new backends plug in without touching them.

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod flock;
#[cfg(feature = "ftp")]
pub mod ftp;
pub mod link;
pub mod lockdir;
pub mod mkdir;
pub mod owner;
#[cfg(feature = "postgres")]
pub mod postgres;
pub mod stale;
pub mod symlink;
pub mod wake;

use std::fmt;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use crate::error::{Error, Kind, Result, err};
use crate::log::info;
use crate::profile::{BackendConfig, Common, Profile, Wait, fmt_duration};
use crate::protocol::Mode;
use crate::watch::{Event, Watcher};

/// Someone holding (or recorded as holding) the lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holder {
    pub host: Option<String>,
    /// The holding locksmith (or, for flock, the process that took the lock).
    pub pid: Option<i32>,
    /// Its parent.
    pub ppid: Option<i32>,
    /// RFC 3339 UTC.
    pub since: Option<String>,
    pub token: Option<u64>,
    pub mode: Option<Mode>,
    /// Known at once: `Some(true)` alive, `Some(false)` provably dead; `None` unknown.
    pub alive: Option<bool>,
    /// A record locksmith cannot read (another format version).
    pub foreign: Option<String>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(h) = &self.host {
            parts.push(format!("host={h}"));
        }
        if let Some(p) = self.pid {
            parts.push(format!("pid={p}"));
        }
        if let Some(p) = self.ppid {
            parts.push(format!("ppid={p}"));
        }
        if let Some(s) = &self.since {
            parts.push(format!("since={s}"));
        }
        if let Some(t) = self.token {
            parts.push(format!("token={t}"));
        }
        if let Some(v) = &self.foreign {
            parts.push(format!("record={v:?}"));
        }
        if parts.is_empty() {
            f.write_str("an unknown holder")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// Names a list of holders for a message.
pub fn describe(holders: &[Holder]) -> String {
    if holders.is_empty() {
        return "an unknown holder".into();
    }
    holders
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the backend hands out with the lock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    pub token: Option<u64>,
    /// The previous acquisition did not end in a clean release.
    pub prev_crashed: bool,
}

/// The outcome of one attempt.
#[derive(Debug)]
pub enum Attempt {
    Acquired(Grant),
    Busy(Vec<Holder>),
}

/// How to wait between attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitHint {
    /// Retry on a timer with jittered backoff `poll`..`max_poll` (else only on `wake_fd`).
    pub poll: bool,
}

/// What `break` did.
#[derive(Debug, PartialEq, Eq)]
pub enum BreakOutcome {
    /// There was no lock.
    Free,
    /// The lock of this holder was removed.
    Broken(Holder),
}

/// A lock backend. One value serves one profile, for one acquisition.
pub trait Backend {
    fn name(&self) -> &'static str;

    /// Tries once, without blocking. Breaking a provably dead or stale holder is part of
    /// trying.
    fn try_acquire(&mut self) -> Result<Attempt>;

    /// Gets ready to wait after a busy attempt (start a blocking waiter thread, set up
    /// inotify, drain old notifications) and says how to wait.
    fn prepare_wait(&mut self) -> Result<WaitHint>;

    /// Descriptors that become readable when another attempt is worthwhile.
    fn wake_fds(&self) -> Vec<BorrowedFd<'_>>;

    /// How often the holder must heartbeat; `None`: never (zero wakeups while holding).
    fn heartbeat_period(&self) -> Option<Duration>;

    /// Refreshes liveness and checks the lock is still ours. `Kind::Lost`: it is not. A
    /// backend that talks to a server returns by `deadline` (an error if unconfirmed): past
    /// it the holder could no longer stop its command before a waiter may break in.
    fn heartbeat(&mut self, deadline: Instant) -> Result<()>;

    /// Frees the lock. `Kind::Lost` if it was no longer ours.
    fn release(&mut self) -> Result<()>;

    /// The current holders, without taking or changing anything.
    fn status(&mut self) -> Result<Vec<Holder>>;

    /// Removes a lock whose holder is dead or silent (`break`); see each backend.
    fn break_lock(
        &mut self,
        force: bool,
        token: Option<u64>,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome>;

    /// Run mode: a descriptor the command must inherit so the lock lives as long as it does.
    fn inherit_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
}

/// Opens the backend a profile names. Nothing is created or taken yet.
pub fn open(profile: &Profile) -> Result<Box<dyn Backend>> {
    let mode = if profile.common.shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    };
    Ok(match &profile.backend {
        BackendConfig::Flock(cfg) => Box::new(flock::Flock::new(cfg.clone(), mode)),
        BackendConfig::Mkdir(cfg) => Box::new(mkdir::Mkdir::new(cfg.clone(), profile)),
        #[cfg(feature = "ftp")]
        BackendConfig::Ftp(cfg) => Box::new(ftp::Ftp::new(cfg.clone(), profile)),
        #[cfg(not(feature = "ftp"))]
        BackendConfig::Ftp(_) => unreachable!("refused when the profile was read"),
        #[cfg(feature = "postgres")]
        BackendConfig::Postgres(cfg) => Box::new(postgres::Postgres::new(cfg.clone(), profile)),
        #[cfg(not(feature = "postgres"))]
        BackendConfig::Postgres(_) => unreachable!("refused when the profile was read"),
        #[cfg(feature = "etcd")]
        BackendConfig::Etcd(cfg) => Box::new(etcd::Etcd::new(cfg.clone(), profile)),
        #[cfg(not(feature = "etcd"))]
        BackendConfig::Etcd(_) => unreachable!("refused when the profile was read"),
        BackendConfig::Link(cfg) => Box::new(link::Link::new(cfg.clone(), profile)),
        BackendConfig::Symlink(cfg) => Box::new(symlink::Symlink::new(cfg.clone(), profile)),
    })
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
pub fn acquire(
    lock: &mut dyn Backend,
    profile: &str,
    common: &Common,
    watcher: &mut Watcher,
) -> Result<Grant> {
    let deadline = match common.wait {
        Wait::Forever => None,
        Wait::For(d) => Some(Instant::now() + d),
    };
    let mut backoff = Backoff::new(common);
    let mut said = false;
    let mut prepared = false;
    loop {
        let holders = match lock.try_acquire()? {
            Attempt::Acquired(grant) => return Ok(grant),
            Attempt::Busy(h) => h,
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

/// `break` on a backend that has no use for it.
pub fn refuse_break(backend: &str, why: &str) -> Error {
    err!(
        Usage,
        "`break` does not apply to backend `{backend}`: {why}"
    )
}
