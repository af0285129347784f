//! The waiting room (SPEC §3b: "the lock records N while anyone holds or waits"): a waiter
//! of a lock-directory backend holds a lock of its own beside the lock's, `.NAME.waiting`,
//! **shared**, from its first busy try until it holds the lock or stops waiting. A
//! contender that finds another number of slots recorded than its own, and none of that
//! number's slots held, looks at the room before it issues (`slots.rs`'s `agreement`): a
//! waiter there (not itself) waits with the recorded number (one of another number is
//! refused when it begins: `Slots::try_once`), so the newcomer is refused (78) rather than
//! taking the lock the waiter is about to get, and the waiter later refused.
//!
//! **Which backends keep one** (`Profile::room`): mkdir, link and symlink on a local
//! filesystem, whose waiters try again on a notice or a timer — between a release and that
//! try a newcomer could come first. Their room is a flock(2) file, never unlinked (as
//! `.NAME.queue`): the kernel frees a killed waiter's place at once and nothing else is
//! left behind. None on a network filesystem (those backends are used there to keep out of
//! its lock manager), where a waiter's number is not kept. flock's, postgres' and etcd's
//! waiters need none: the kernel or the server grants a waiter the lock the moment it frees
//! (a blocked flock(2), a queued advisory lock, the oldest key of the queue), before any
//! newcomer, and the holder's record is then the waiter's. ftp, redis and s3 keep none yet:
//! a room there needs its dead waiters' places removed (a shared lock's readers are only
//! judged by a writer) and its requests bounded by the wait's deadline.
//!
//! **What it does not know:** the room says that someone waits, not with which number; the
//! recorded one is assumed, as a waiter of another number is refused when it begins while
//! the record's holders hold. Not so for a waiter that began behind readers (who record
//! nothing) or on a lock with no state yet, nor between a waiter's first busy try and its
//! joining: there the newcomer goes first and the waiter is refused when it gets the lock,
//! as before the room existed. Anyone who can open the room file can hold it shared and so
//! keep the lock's number from changing while nobody holds it (the refusal names the pid).
//!
//! A room that cannot be joined or looked at (something else at its name, a file we may not
//! open) does not fail a wait or a contender: the waiter waits unrecorded, the look sees
//! nobody (said at `-v`).

use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::lock::{Agree, Attempt, Backend, Break, BreakOutcome, Held, Holder, WaitHint};
use crate::error::Result;
use crate::log::debug;
use crate::protocol::Mode;
use crate::watch::Watcher;

/// A lock's waiting room: how to open it (a lock taken shared), and whether this process
/// waits there now.
#[derive(Clone)]
pub struct Room {
    /// `None`: no room where the lock is now (a network filesystem).
    open: Arc<dyn Fn() -> Option<Box<dyn Backend>> + Send + Sync>,
    joined: Arc<AtomicBool>,
}

impl Room {
    pub fn new(open: impl Fn() -> Option<Box<dyn Backend>> + Send + Sync + 'static) -> Room {
        Room {
            open: Arc::new(open),
            joined: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// A lock whose waiters hold its waiting room while they wait.
pub struct Waiting {
    /// The lock as messages name it.
    name: String,
    lock: Option<Box<dyn Backend>>,
    room: Room,
    /// Our place (a room needs no heartbeat: flock's).
    joined: Option<Box<dyn Held>>,
    /// Joining failed for good in this wait (not a busy room or a server not answering).
    unjoinable: bool,
    /// The wait's deadline, for the room's requests too.
    by: Option<Instant>,
}

impl Waiting {
    pub fn new(lock: Box<dyn Backend>, name: &str, room: Room) -> Waiting {
        Waiting {
            name: name.to_string(),
            lock: Some(lock),
            room,
            joined: None,
            unjoinable: false,
            by: None,
        }
    }

    fn lock(&mut self) -> &mut Box<dyn Backend> {
        self.lock.as_mut().expect("the lock is back")
    }

    /// Takes our place in the room, unless we have one (tried at every wait until it is
    /// had: the room is busy only for the moment a contender looks at it, [`waiter`]).
    fn join(&mut self) {
        if self.joined.is_some() || self.unjoinable {
            return;
        }
        let Some(mut room) = (self.room.open)() else {
            self.unjoinable = true;
            return;
        };
        room.answer_by(self.by);
        match room.try_acquire() {
            Ok(Attempt::Acquired(held)) => {
                debug!("lock {}: waiting in its waiting room", self.name);
                self.joined = Some(held);
                self.room.joined.store(true, Ordering::SeqCst);
            }
            Ok(Attempt::Busy(_, holders)) => debug!(
                "lock {}: its waiting room is busy ({}); joined at the next try",
                self.name,
                super::lock::describe(&holders)
            ),
            Ok(Attempt::Unanswered(_, e)) => {
                debug!(
                    "lock {}: its waiting room: {e}; joined at the next try",
                    self.name
                )
            }
            Err(e) => {
                debug!(
                    "lock {}: cannot wait in its waiting room ({e}); waiting unrecorded (a \
                     contender of another number of slots is not told of this waiter)",
                    self.name
                );
                self.unjoinable = true;
            }
        }
    }

    /// Gives our place back (we hold the lock, or stop waiting).
    fn leave(&mut self) {
        let Some(joined) = self.joined.take() else {
            return;
        };
        self.room.joined.store(false, Ordering::SeqCst);
        if let Err(e) = joined.release() {
            debug!("lock {}: leaving its waiting room: {}", self.name, e.error);
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.leave();
    }
}

/// A live waiter in `room`, for a contender of another number of slots (`slots.rs`): the
/// backend's own answer ([`Backend::holder`]: flock's asks the kernel), unless this process
/// waits there itself — then one of those `/proc/locks` lists other than us, waiting (shared:
/// not another contender's look). A room that cannot be looked at (none here, something
/// else at its name, a file we may not open) shows nobody: it is a courtesy to waiters, and
/// must not keep the lock's number from changing for ever.
pub fn waiter(room: &Room, lock: &str) -> Option<Holder> {
    let mut b = (room.open)()?;
    let looked = b.holder().and_then(|h| match h {
        Some(_) if room.joined.load(Ordering::SeqCst) => {
            let me = &crate::host::this().hostname;
            let pid = std::process::id() as i32;
            let ours = |h: &Holder| h.pid == Some(pid) && h.host.as_ref().is_none_or(|x| x == me);
            Ok(b.status()?
                .into_iter()
                .find(|h| h.alive != Some(false) && h.mode != Some(Mode::Exclusive) && !ours(h)))
        }
        h => Ok(h),
    });
    looked.unwrap_or_else(|e| {
        debug!("lock {lock}: its waiting room: {e}; looked at as empty");
        None
    })
}

impl Backend for Waiting {
    fn name(&self) -> &'static str {
        self.lock.as_ref().expect("the lock is back").name()
    }

    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let lock = self.lock.take().expect("the lock is back");
        match lock.try_acquire()? {
            Attempt::Acquired(held) => {
                self.leave();
                Ok(Attempt::Acquired(held))
            }
            Attempt::Busy(lock, holders) => {
                self.lock = Some(lock);
                Ok(Attempt::Busy(self, holders))
            }
            Attempt::Unanswered(lock, e) => {
                self.lock = Some(lock);
                Ok(Attempt::Unanswered(self, e))
            }
        }
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        self.join();
        self.lock().prepare_wait()
    }

    fn agree_on_slots(&mut self, agree: Agree) {
        self.lock().agree_on_slots(agree)
    }

    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        self.lock().slots_present(n)
    }

    fn slots_holders(&mut self, n: u32) -> Result<Option<Vec<Holder>>> {
        self.lock().slots_holders(n)
    }

    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        self.lock().recorded_slots()
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.lock.as_ref().expect("the lock is back").wake_fds()
    }

    fn woken(&mut self) -> bool {
        self.lock().woken()
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.by = by;
        self.lock().answer_by(by)
    }

    fn try_within(&self) -> Option<Duration> {
        self.lock.as_ref().expect("the lock is back").try_within()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        self.lock().status()
    }

    fn name_holders(&mut self) -> Vec<Holder> {
        self.lock().name_holders()
    }

    fn holder(&mut self) -> Result<Option<Holder>> {
        self.lock().holder()
    }

    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome> {
        self.lock().break_lock(how, watcher)
    }
}
