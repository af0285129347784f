//! The contract between the policies and the backends: one attempt's answer, the holders it
//! saw, the grant a holder gets, the lease it keeps, and the [`Backend`] trait itself. Nothing
//! here names a backend; the registry (`mod.rs`) is the only file that names them all.

use std::fmt;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::address::Address;
use super::verify::Report;
use crate::error::{Error, Kind, Result, err};
use crate::protocol::Mode;
use crate::settings::{Common, Fields, KeyDoc, Password};
use crate::watch::Watcher;

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
    /// Its slot, of a lock with several (SPEC §3b).
    pub slot: Option<u32>,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(k) = self.slot {
            parts.push(format!("slot={k}"));
        }
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
    /// The token starts the lock's token state again from the clock: the state was missing
    /// (a lock's first use, or a cleaner removed it), so it is above every earlier token only
    /// while the wall clock was not set back meanwhile (file backends; issue 28).
    pub token_from_clock: bool,
    /// The slot held, of a lock with several (SPEC §3b).
    pub slot: Option<u32>,
    /// A reader's: the number of slots the lock's counter recorded, read in the same step as
    /// its token, after taking the lock (SPEC §3b; `slots.rs` judges it). `None`: not read
    /// (`slots.rs` asks [`Backend::recorded_slots`] instead).
    pub recorded_slots: Option<u32>,
}

/// Asked by a backend that keeps slots (SPEC §3b) when its counter recorded another number of
/// slots than the lock's (the number recorded), holding its own lock, before it issues a
/// token: `Err` (78) if someone holds the lock with that number. Asked with 0 where the
/// recorded number was lost with its record (an s3 state cut short): `Err` if someone holds
/// the lock where a contender of this number never would. See `slots.rs`.
pub type Agree = std::sync::Arc<dyn Fn(u32) -> Result<()> + Send + Sync>;

/// The holder's side of SPEC §6: a holder that heartbeats every `period` and was last
/// confirmed at some moment may be broken by a waiter `stale_after` after it, at the
/// earliest `stale_after − period` (the waiter may have seen that heartbeat a period late).
/// LOST is declared early enough that `run`'s CMD is gone (SIGTERM, then SIGKILL after
/// [`grace`](Lease::grace)) before then. Every moment here is CLOCK_BOOTTIME, which counts
/// suspend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub period: Duration,
    stale_after: Duration,
}

impl Lease {
    /// The lease of `held`; `None` if it never heartbeats (nothing breaks it for silence).
    pub fn of(held: &dyn Held, common: &Common) -> Option<Lease> {
        held.period().map(|period| Lease {
            period,
            stale_after: common.stale_after,
        })
    }

    /// How long CMD gets between SIGTERM and SIGKILL once the lock is lost: half a period.
    pub fn grace(&self) -> Duration {
        self.period / 2
    }

    /// The moment by which a holder last confirmed at `confirmed` must have declared LOST.
    pub fn lost_by(&self, confirmed: Duration) -> Duration {
        (confirmed + self.stale_after).saturating_sub(self.period + self.grace())
    }
}

/// The outcome of one attempt: the backend becomes the held lock, or comes back with the
/// holders it saw, or comes back without an answer from its server.
pub enum Attempt {
    Acquired(Box<dyn Held>),
    Busy(Box<dyn Backend>, Vec<Holder>),
    /// The server did not answer a request of this try (a timeout, a refused connection, a
    /// 5xx): the error says which; [`super::wait::acquire`] decides whether that ends the
    /// wait. A backend returns this — rather than `Err` — only if its next try on the same
    /// value is safe whatever became of the unanswered request: a write that landed
    /// without its answer is recognised as its own (a nonce it keeps) and neither held
    /// twice nor left behind.
    Unanswered(Box<dyn Backend>, Error),
}

/// One try's outcome inside a backend, before it becomes an [`Attempt`]: taken, with its
/// grant, or busy with these holders.
pub enum Tried {
    Took(Grant),
    Busy(Vec<Holder>),
}

impl Tried {
    /// The attempt of a backend that holds on a server: taken, the backend becomes the held
    /// lock.
    pub fn on_server<B: Beats>(self, lock: Box<B>) -> Attempt {
        match self {
            Tried::Took(grant) => Attempt::Acquired(Box::new(OnServer { lock, grant })),
            Tried::Busy(holders) => Attempt::Busy(lock, holders),
        }
    }

    /// As [`on_server`](Tried::on_server), for a backend whose tries are safe to repeat
    /// after a request went unanswered (see [`Attempt::Unanswered`]): an `Unavailable`
    /// error of the try comes back with the backend, for the wait to judge.
    pub fn or_unanswered<B: Beats>(tried: Result<Tried>, lock: Box<B>) -> Result<Attempt> {
        match tried {
            Ok(t) => Ok(t.on_server(lock)),
            Err(e) if e.kind() == Kind::Unavailable => Ok(Attempt::Unanswered(lock, e)),
            Err(e) => Err(e),
        }
    }
}

/// A backend that holds its lock on a server by heartbeats (a session, a lease): what it does
/// while holding. Once taken ([`Tried::on_server`]) it is only reached through the [`Held`]
/// that owns it.
pub trait Beats: Backend + 'static {
    /// How often it must heartbeat.
    fn period(&self) -> Duration;
    /// One heartbeat (see [`Held::heartbeat`]).
    fn beat(&mut self, deadline: Instant) -> Result<()>;
    /// Frees the lock (see [`Held::release`]); an error other than `Lost` leaves it worth
    /// trying again.
    fn free(&mut self) -> Result<()>;
}

/// A lock held on a server: the backend that took it, and its grant.
struct OnServer<B> {
    lock: Box<B>,
    grant: Grant,
}

impl<B: Beats> Held for OnServer<B> {
    fn grant(&self) -> &Grant {
        &self.grant
    }

    fn period(&self) -> Option<Duration> {
        Some(self.lock.period())
    }

    fn heartbeat(&mut self, deadline: Instant) -> Result<()> {
        self.lock.beat(deadline)
    }

    fn release(mut self: Box<Self>) -> std::result::Result<(), NotReleased<Box<dyn Held>>> {
        match self.lock.free() {
            Ok(()) => Ok(()),
            Err(e) => Err(NotReleased::again(e, self)),
        }
    }
}

/// The least bound a request of a try gets near the wait's deadline (see
/// [`Backend::answer_by`]): a try begun as the wait runs out still gets an answer from a
/// server that is merely slow, rather than a timeout that says nothing about the lock.
pub const LAST_BOUND: Duration = Duration::from_secs(1);

/// When a request sent now must be answered: `bound` from now, but not past `by` (the wait's
/// deadline, [`Backend::answer_by`]) unless that leaves less than [`LAST_BOUND`].
pub fn request_by(bound: Duration, by: Option<Instant>) -> Instant {
    let now = Instant::now();
    let full = now + bound;
    match by {
        Some(by) => full.min(by.max(now + LAST_BOUND.min(bound))),
        None => full,
    }
}

/// How to wait between attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitHint {
    /// Retry on a timer with jittered backoff `poll`..`max_poll` (else only on `wake_fd`).
    pub poll: bool,
    /// The wait set up takes the lock itself (a `flock(2)` blocked on a thread), so a
    /// release between the busy try and the set-up cannot be missed: no try in between
    /// (`wait::acquire` makes one otherwise). That try cost the flock backend a read of
    /// `/proc/locks` per waiter — with 1,000 waiters queued, a 2,000-line file made by the
    /// kernel for each, on the CPUs the handoffs need (issue 29).
    pub catches_release: bool,
}

/// What `break` is asked: to break even a live holder (`--force`), only acquisition `token`
/// (`--token`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Break {
    pub force: bool,
    pub token: Option<u64>,
}

/// What `break` did.
#[derive(Debug, PartialEq, Eq)]
pub enum BreakOutcome {
    /// There was no lock.
    Free,
    /// The lock of this holder was removed.
    Broken(Holder),
}

/// A lock backend: one profile's lock, not held. One value serves one acquisition; taking
/// the lock turns it into a [`Held`].
pub trait Backend: Send {
    fn name(&self) -> &'static str;

    /// Tries once, without blocking. Breaking a provably dead or stale holder is part of
    /// trying.
    fn try_acquire(self: Box<Self>) -> Result<Attempt>;

    /// Gets ready to wait after a busy attempt (start a blocking waiter thread, set up
    /// inotify, drain old notifications) and says how to wait.
    fn prepare_wait(&mut self) -> Result<WaitHint>;

    /// A lock that keeps slots (SPEC §3b): what to ask before issuing a token over another
    /// recorded number of slots ([`Agree`]). Others have no counter to ask from.
    fn agree_on_slots(&mut self, _agree: Agree) {}

    /// A lock that keeps slots (SPEC §3b): which of its first `n` slots may be held now,
    /// found in one read where the backend can list them — a superset: every slot held
    /// throughout the read is among them, lowest first. `None` (the default): look at each.
    fn slots_present(&mut self, _n: u32) -> Result<Option<Vec<u32>>> {
        Ok(None)
    }

    /// A lock that keeps slots: who holds each of its first `n` slots (`Holder::slot` says
    /// which), as `status` of each slot's lock would say, read in one request where the
    /// backend can. `None` (the default): ask each (a fair line's numbers, `fair.rs`).
    fn slots_holders(&mut self, _n: u32) -> Result<Option<Vec<Holder>>> {
        Ok(None)
    }

    /// A lock that keeps slots (SPEC §3b): the number of slots its one counter records now
    /// (1 before any was recorded), read without taking or changing anything, so that a
    /// contender the counter never asks (a reader, a waiter) can be judged by `slots.rs`.
    /// `None`: the record cannot be read (or the backend keeps none).
    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        Ok(None)
    }

    /// Descriptors that become readable when another attempt is worthwhile.
    fn wake_fds(&self) -> Vec<BorrowedFd<'_>>;

    /// After one of [`wake_fds`](Self::wake_fds) became readable: whether to try now, or
    /// to wait on (what woke us was about something else, and was read). The default: try.
    /// Must return true unless it consumed what made its descriptors readable.
    fn woken(&mut self) -> bool {
        true
    }

    /// The wait's deadline, told before each try (`None`: no deadline): a backend whose tries
    /// talk to a server bounds each request of a try by [`request_by`], so that a server that
    /// does not answer keeps the wait past its deadline by at most [`LAST_BOUND`], not by a
    /// whole request bound. Others ignore it.
    fn answer_by(&mut self, _by: Option<Instant>) {}

    /// At the latest, how soon to try again whatever [`WaitHint`] says (a fair queue's
    /// waiter keeps its place alive); `None`: no such bound.
    fn try_within(&self) -> Option<Duration> {
        None
    }

    /// The current holders, without taking or changing anything.
    fn status(&mut self) -> Result<Vec<Holder>>;

    /// Who holds the lock, for a message, after a busy try that did not say
    /// ([`Attempt::Busy`] with no holders because naming them costs more than the try:
    /// flock's come from `/proc/locks`, whose every read takes the kernel's file-lock
    /// semaphore for writing — an RCU grace period, ~8 ms here, while every flock(2) on the
    /// machine waits, the holder's release included). Asked only where a message shows them
    /// (`wait.rs`). The default: nobody known.
    fn name_holders(&mut self) -> Vec<Holder> {
        Vec::new()
    }

    /// A live holder of this lock, where a decision rests on whether there is one (`slots.rs`:
    /// a contender of another number of slots): a lock held from before the look until after
    /// it is always found. The default: the first of [`status`](Self::status) not provably
    /// dead. A backend whose listing can miss a holder answers otherwise (flock: `/proc/locks`
    /// is read in pieces, not as one snapshot).
    fn holder(&mut self) -> Result<Option<Holder>> {
        Ok(self.status()?.into_iter().find(|h| h.alive != Some(false)))
    }

    /// Removes a lock whose holder is dead or silent (`break`); see each backend.
    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome>;
}

/// A lock held: it owns what holding needs (the opened file, the names made, the session, the
/// lease) and is given back by [`release`](Held::release). Holding *is* the value.
#[must_use = "dropping a Held without release() leaves the lock to stale_after"]
pub trait Held: Send {
    /// What the backend handed out with the lock.
    fn grant(&self) -> &Grant;

    /// How often the holder must heartbeat; `None`: never (zero wakeups while holding).
    fn period(&self) -> Option<Duration> {
        None
    }

    /// Refreshes liveness and checks the lock is still ours. `Kind::Lost`: it is not. A
    /// backend that talks to a server returns by `deadline` (an error if unconfirmed): past
    /// it the holder could no longer stop its command before a waiter may break in.
    fn heartbeat(&mut self, _deadline: Instant) -> Result<()> {
        Ok(())
    }

    /// Frees the lock. `Kind::Lost` if it was no longer ours; the held value back in
    /// [`NotReleased::retry`] if nothing of the release happened and trying again is
    /// worthwhile.
    fn release(self: Box<Self>) -> std::result::Result<(), NotReleased<Box<dyn Held>>>;

    /// When (CLOCK_BOOTTIME) the attempt that took the lock itself began, where that is later
    /// than when the backend was asked (a fair queue's waiter tries the lock only after its
    /// work in line): the lease counts from here. `None`: from when the backend was asked.
    fn began(&self) -> Option<Duration> {
        None
    }

    /// Run mode: a descriptor the command must inherit so the lock lives as long as it does.
    fn inherit_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// A descriptor that becomes readable when something may have taken the lock from under
    /// its holder (flock: a cleaner removing the lock file); the holder then runs
    /// [`check`](Held::check). `None`: nothing to watch. No wake-up while nothing happens.
    fn alarm(&self) -> Option<BorrowedFd<'_>> {
        None
    }

    /// After the [`alarm`](Held::alarm): whether the lock is still ours. `Kind::Lost`: it
    /// is not.
    fn check(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A release that failed: why, and the held value again if trying once more is worthwhile
/// (nothing of the release happened yet).
pub struct NotReleased<H> {
    pub error: Error,
    pub retry: Option<H>,
}

impl<H> NotReleased<H> {
    /// Failed for good: nothing to retry.
    pub fn done(error: Error) -> NotReleased<H> {
        NotReleased { error, retry: None }
    }

    /// Failed, and worth trying again unless the lock is lost.
    pub fn again(error: Error, held: H) -> NotReleased<H> {
        let retry = (error.kind() != Kind::Lost).then_some(held);
        NotReleased { error, retry }
    }
}

/// `break` on a backend that has no use for it.
pub fn refuse_break(backend: &str, why: &str) -> Error {
    err!(
        Usage,
        "`break` does not apply to backend `{backend}`: {why}"
    )
}

/// The lock as a backend sees it besides its own settings: its name as messages say it (a
/// profile's name, or the address as given) and the settings every backend shares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub name: String,
    pub common: Common,
    /// A nonce of this acquisition, the same for every slot of it: its place in a waiting
    /// room kept on a server (SPEC §3b, `waiting.rs`).
    pub acquisition: String,
}

/// What the registry (`backend/mod.rs`) needs of a backend besides [`Backend`]: its settings,
/// read from a profile section or an address; how to open it; how `verify` probes it. A new
/// backend implements this and [`Backend`] in its own file and adds one line to the registry.
pub trait Registered {
    /// The backend's own settings.
    type Config: Clone + fmt::Debug + PartialEq + Eq;
    /// Its own keys, documented where they are parsed.
    const KEYS: &'static [&'static [KeyDoc]];
    /// Whether it can take a shared (reader) lock.
    const SHARED: bool;
    /// Whether it locks a file a second mount may show (`verify --peer`).
    const ON_FILES: bool = false;
    /// Whether it keeps several slots (SPEC §3b): [`slot`](Registered::slot) says where.
    const SLOTS: bool = false;
    /// The settings of slot `k` of a lock with several (only asked where [`SLOTS`](Registered::SLOTS)):
    /// its own lock, next to the lock's, with the lock's fencing-token counter.
    fn slot(cfg: &Self::Config, _k: u32) -> Self::Config {
        cfg.clone()
    }
    /// The settings of the lock's fair queue (SPEC §3b), `None` where it keeps none: a lock of
    /// its own beside the lock's, whose slots the waiters hold (`fair.rs`).
    fn queue(_cfg: &Self::Config) -> Option<Self::Config> {
        None
    }
    /// The places of its fair queue (only asked where [`queue`](Registered::queue) keeps one):
    /// that many waiters are in line, in order; more wait for a place in no order. Places
    /// cost where they are read one by one (a request each to a server), so a network
    /// backend keeps few; one that lists the places held in one read
    /// ([`Backend::slots_present`]) can keep many.
    const PLACES: u32 = 32;
    /// Its waiting room (SPEC §3b, `waiting.rs`), where it keeps one through the waiting
    /// wrapper: a waiter's place there keeps its number of slots.
    fn room(_cfg: &Self::Config, _lock: &Named) -> Option<super::room::Room> {
        None
    }
    /// Reads its keys (a profile section or an address: the same code).
    fn parse(f: &mut Fields) -> Result<Self::Config>;
    /// The keys an address's parts say (its query is added by the registry).
    fn parts(a: &Address) -> std::result::Result<toml::Table, String>;
    /// Opens it: nothing is created or taken yet.
    fn open(cfg: &Self::Config, lock: &Named) -> Box<dyn Backend>;
    /// `verify`'s report: what it relies on, probed where the lock is.
    fn verify(cfg: &Self::Config, lock: &Named, peer: Option<&Path>) -> Result<Report>;
    /// Where the lock is, for `-v`: never a password.
    fn location(cfg: &Self::Config) -> String;
    /// Where the server password comes from, for the server backends.
    fn password(_cfg: &Self::Config) -> Option<&Password> {
        None
    }
    /// The environment variables that carry the lock's server secrets: locksmith's, never
    /// CMD's (`run` removes them from CMD's environment, issues 15 and 27). By default the
    /// one the password comes from (`password_env`, or a convention such as `$PGPASSWORD`
    /// or `$REDISCLI_AUTH`).
    fn secret_env(cfg: &Self::Config) -> Vec<&str> {
        match Self::password(cfg) {
            Some(Password::Env(var)) => vec![var.as_str()],
            _ => Vec::new(),
        }
    }
}
