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
use super::lock::{
    Attempt, Backend, Break, BreakOutcome, Grant, Held, Holder, Named, NotReleased, Registered,
    WaitHint,
};
use super::lockdir::probe::Scheme as Probe;
use super::lockdir::state::Issued;
use super::lockdir::{self, FsConfig, LockDir};
use super::stale::{Evidence, Holders, Judge};
use super::verify::Report;
use super::wake::Wakeups;
use crate::error::Result;
use crate::settings::{Fields, KeyDoc};
use crate::watch::Watcher;

/// What one try at taking the name found.
pub enum Take<H> {
    /// The name is ours: what holding it is, and the fencing token it carries as issued (or,
    /// for a reader, as read: the write epoch), with whether the previous acquisition ended
    /// without a clean release; `None`: no token.
    Held(H, Option<Issued>),
    /// Someone else's: the template judges its holders.
    Taken,
    /// Something changed under us (a token overtaken, a group tidied away): look again.
    Again,
    /// Busy by the scheme's own rule (waiting writers go first): these hold it.
    Busy(Vec<Holder>),
}

/// A lock-directory scheme: its naming only.
pub trait Scheme: Holders + Send + Sized + 'static {
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
    fn dir_mut(&mut self) -> &mut LockDir;
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
}

/// What one attempt found: the name is ours, with its grant, or these hold it.
type Found<H> = std::result::Result<(H, Grant), Vec<Holder>>;

impl<S: Scheme> FileLock<S> {
    pub fn new(cfg: &FsConfig, lock: &Named) -> FileLock<S> {
        FileLock {
            files: S::new(cfg, lock),
            judge: Judge::new(lock, cfg.path.clone(), cfg.local),
            wake: Wakeups::default(),
            period: (!cfg.local).then_some(lock.common.heartbeat()),
        }
    }

    fn attempt(&mut self) -> Result<Found<S::Held>> {
        // Drain old notifications *before* trying: a release after this point leaves a
        // fresh event, so the wait that may follow cannot miss it.
        self.wake.drain();
        let mut holders = Vec::new();
        for _ in 0..S::ROUNDS {
            match self.files.take()? {
                Take::Held(held, issued) => {
                    self.judge.broke |= issued.is_some_and(|i| i.prev_crashed);
                    let grant = Grant {
                        token_from_clock: issued.is_some_and(|i| i.from_clock),
                        ..self.judge.grant(&mut self.wake, issued.map(|i| i.token))
                    };
                    return Ok(Ok((held, grant)));
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
        Ok(Err(self.files.busy(holders)?))
    }
}

impl<S: Scheme> Backend for FileLock<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        match self.attempt() {
            Ok(Ok((held, grant))) => Ok(Attempt::Acquired(Box::new(FileHeld {
                files: self.files,
                held,
                grant,
                period: self.period,
            }))),
            Ok(Err(holders)) => Ok(Attempt::Busy(self, holders)),
            Err(e) => {
                self.files.failed();
                Err(e)
            }
        }
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        let dir = self.files.dir();
        let queue = if self.files.queues() {
            dir.queue()
        } else {
            None
        };
        self.wake.watch_dir(&dir.parent, queue, || dir.releases());
        Ok(WaitHint {
            poll: true,
            catches_release: false,
        })
    }

    fn woken(&mut self) -> bool {
        self.wake.woken()
    }

    fn agree_on_slots(&mut self, agree: super::lock::Agree) {
        self.files.dir_mut().agree_on_slots(agree);
    }

    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        let st = self.files.dir_mut().read_state()?;
        Ok(Some(st.map_or(1, |s| s.slots())))
    }

    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        self.files.dir_mut().slots_present(n).map(Some)
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.wake.fds()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        self.files.status()
    }

    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome> {
        self.judge.break_lock(&mut self.files, how, watcher)
    }
}

/// A file lock held: the scheme (its opened directory) and what holding is to it.
pub struct FileHeld<S: Scheme> {
    files: S,
    held: S::Held,
    grant: Grant,
    period: Option<Duration>,
}

impl<S: Scheme> Held for FileHeld<S> {
    fn grant(&self) -> &Grant {
        &self.grant
    }

    fn period(&self) -> Option<Duration> {
        self.period
    }

    fn heartbeat(&mut self, _deadline: Instant) -> Result<()> {
        self.files.beat(&mut self.held)
    }

    fn release(self: Box<Self>) -> std::result::Result<(), NotReleased<Box<dyn Held>>> {
        let FileHeld {
            mut files,
            held,
            grant,
            period,
        } = *self;
        files.release(held).map_err(|nr| NotReleased {
            error: nr.error,
            retry: nr.retry.map(|held| {
                Box::new(FileHeld {
                    files,
                    held,
                    grant,
                    period,
                }) as Box<dyn Held>
            }),
        })
    }
}

impl<S: Scheme + 'static> Registered for FileLock<S> {
    type Config = FsConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[lockdir::FS_KEYS, lockdir::HEARTBEAT_KEYS];
    const SHARED: bool = S::SHARED;
    const ON_FILES: bool = true;
    const SLOTS: bool = true;
    const PLACES: u32 = lockdir::PLACES;
    fn parse(f: &mut Fields) -> Result<FsConfig> {
        FsConfig::parse(f, true)
    }
    fn slot(cfg: &FsConfig, k: u32) -> FsConfig {
        cfg.slot(k)
    }
    fn queue(cfg: &FsConfig) -> Option<FsConfig> {
        Some(cfg.queue())
    }
    /// On a local filesystem byte-range locks of one file (`lockdir/room.rs`); on a network
    /// one a directory of named places (`lockdir/netroom.rs`).
    fn room(cfg: &FsConfig, lock: &Named) -> Option<super::room::Room> {
        let parent = cfg.path.parent().unwrap_or(Path::new("/"));
        Some(if lockdir::is_remote_dir(parent) {
            super::room::Room::new(lockdir::netroom::NetRoom::new(cfg, lock))
        } else {
            super::room::Room::new(lockdir::room::DirRoom::new(cfg.waiting()))
        })
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
