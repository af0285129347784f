//! The file-lock template: [`Backend`] and [`Registered`] implemented once for the schemes
//! that keep a lock as names in a directory (mkdir, link, symlink). A scheme supplies only its
//! naming — one try at taking the name, its holders with their evidence, removing exactly one,
//! a heartbeat, a release — and the template owns the rest: the rounds of an attempt, SPEC §6's
//! judge ([`Judge`]: proof of death, `stale_after`, the break loop), the waiters' wake-ups,
//! `prev=crashed`, the heartbeat period, `status` and `break`.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use super::address::Address;
use super::lock::{Attempt, Backend, BreakOutcome, Holder, Named, Registered, WaitHint};
use super::lockdir::probe::Scheme as Probe;
use super::lockdir::{self, FsConfig, LockDir};
use super::stale::{Evidence, Holders, Judge};
use super::verify::Report;
use super::wake::Wakeups;
use crate::error::{Error, Result, err};
use crate::settings::{Fields, KeyDoc};
use crate::watch::Watcher;

/// What one try at taking the name found.
pub enum Take<H> {
    /// The name is ours: what holding it is, the fencing token it carries, and whether the
    /// previous acquisition ended without a clean release.
    Held(H, Option<u64>, bool),
    /// Someone else's: the template judges its holders.
    Taken,
    /// Something changed under us (a token overtaken, a group tidied away): look again.
    Again,
    /// Busy by the scheme's own rule (waiting writers go first): these hold it.
    Busy(Vec<Holder>),
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
}

/// A lock-directory scheme: its naming only.
pub trait Scheme: Holders + Send + Sized {
    /// What holding the lock is (our record, the names we made).
    type Held: Send;
    /// The backend's name.
    const NAME: &'static str;
    /// Its `verify` probes.
    const PROBE: Probe;
    /// Whether it can take a shared (reader) lock.
    const SHARED: bool;
    /// Tries at taking the name before an attempt says busy.
    const ROUNDS: usize = 4;

    fn new(cfg: &FsConfig, lock: &Named) -> Self;
    /// The lock's directory.
    fn dir(&self) -> &LockDir;
    /// One try at taking the name (its fencing token included).
    fn take(&mut self) -> Result<Take<Self::Held>>;
    /// The holders were judged alive: a waiting writer says so (symlink).
    fn contended(&mut self) -> Result<()> {
        Ok(())
    }
    /// The attempt ends busy with `holders`: the scheme may say why instead.
    fn busy(&mut self, holders: Vec<Holder>) -> Result<Vec<Holder>> {
        Ok(holders)
    }
    /// The attempt failed with an error: take back what waiting left (symlink's marker).
    fn failed(&mut self) {}
    /// Whether waiters queue for the lock (`wake.rs`); readers of a shared lock all watch.
    fn queues(&self) -> bool {
        true
    }
    /// Refreshes liveness; `Kind::Lost` when the lock is no longer ours.
    fn beat(&mut self, held: &mut Self::Held) -> Result<()>;
    /// Frees the lock; `Kind::Lost` if it was no longer ours.
    fn release(&mut self, held: Self::Held) -> std::result::Result<(), NotReleased<Self::Held>>;
    /// The current holders, for `status`.
    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(self
            .holders()?
            .map(|list| list.iter().map(Evidence::holder).collect())
            .unwrap_or_default())
    }
}

/// A lock kept as names in a directory, by scheme `S`.
pub struct FileLock<S: Scheme> {
    files: S,
    judge: Judge,
    /// inotify on the parent and the pidfd of a same-host holder.
    wake: Wakeups,
    /// The heartbeat period; `None`: `local = true`, nothing to refresh.
    period: Option<Duration>,
    held: Option<S::Held>,
}

impl<S: Scheme> FileLock<S> {
    pub fn new(cfg: &FsConfig, lock: &Named) -> FileLock<S> {
        FileLock {
            files: S::new(cfg, lock),
            judge: Judge::new(lock, cfg.path.clone(), cfg.local),
            wake: Wakeups::default(),
            period: (!cfg.local).then_some(lock.common.heartbeat()),
            held: None,
        }
    }

    fn attempt(&mut self) -> Result<Attempt> {
        // Drain old notifications *before* trying: a release after this point leaves a
        // fresh event, so the wait that may follow cannot miss it.
        self.wake.drain();
        let mut holders = Vec::new();
        for _ in 0..S::ROUNDS {
            match self.files.take()? {
                Take::Held(held, token, prev_crashed) => {
                    self.judge.broke |= prev_crashed;
                    self.held = Some(held);
                    return Ok(self.judge.acquired(&mut self.wake, token));
                }
                Take::Again => continue,
                Take::Busy(h) => {
                    holders = h;
                    break;
                }
                Take::Taken => {}
            }
            // A few rounds: the lock may vanish between our try and our look, or be broken.
            if let Some(h) = self.judge.clear_dead(&mut self.files, &mut self.wake)? {
                self.files.contended()?;
                holders = h;
                break;
            }
        }
        Ok(Attempt::Busy(self.files.busy(holders)?))
    }
}

impl<S: Scheme> Backend for FileLock<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn try_acquire(&mut self) -> Result<Attempt> {
        self.attempt().inspect_err(|_| self.files.failed())
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        let dir = self.files.dir();
        let queue = if self.files.queues() {
            dir.queue()
        } else {
            None
        };
        self.wake.watch_dir(&dir.parent, queue);
        Ok(WaitHint { poll: true })
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.wake.fds()
    }

    fn heartbeat_period(&self) -> Option<Duration> {
        self.period
    }

    fn heartbeat(&mut self, _deadline: Instant) -> Result<()> {
        let Some(held) = self.held.as_mut() else {
            return Err(err!(Lost, "not holding"));
        };
        self.files.beat(held)
    }

    fn release(&mut self) -> Result<()> {
        let Some(held) = self.held.take() else {
            return Ok(());
        };
        self.files.release(held).map_err(|nr| {
            self.held = nr.retry;
            nr.error
        })
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        self.files.status()
    }

    fn break_lock(
        &mut self,
        force: bool,
        token: Option<u64>,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        self.judge
            .break_lock(&mut self.files, force, token, watcher)
    }
}

impl<S: Scheme + 'static> Registered for FileLock<S> {
    type Config = FsConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[lockdir::FS_KEYS, lockdir::HEARTBEAT_KEYS];
    const SHARED: bool = S::SHARED;
    const ON_FILES: bool = true;
    fn parse(f: &mut Fields) -> Result<FsConfig> {
        FsConfig::parse(f, true)
    }
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::address::path_keys(a)
    }
    fn open(cfg: &FsConfig, lock: &Named) -> Box<dyn Backend> {
        Box::new(FileLock::<S>::new(cfg, lock))
    }
    fn verify(cfg: &FsConfig, lock: &Named, peer: Option<&Path>) -> Result<Report> {
        lockdir::probe::verify(lock, S::PROBE, cfg, peer)
    }
    fn location(cfg: &FsConfig) -> String {
        cfg.path.display().to_string()
    }
}
