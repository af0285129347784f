//! The waiting room (SPEC §3b: "the lock records N while anyone holds or waits"): a waiter
//! of N slots of a lock-directory backend holds an OFD read lock on byte N of a file beside
//! the lock, `.NAME.waiting`, from its first busy try until it holds the lock or stops
//! waiting; the kernel gives it back when the waiter dies. A newcomer asks the room before
//! it issues a token (`slots.rs`'s `agreement`, from `lockdir/state.rs`; a waiter of the
//! recorded number, in the room itself, does not): a lock held over any byte but its own
//! number (`F_OFD_GETLK`) is a waiter of another number, who gets the lock next — so the
//! newcomer is refused (78, naming both numbers) rather than taking it, and the waiter
//! later refused. The look costs one failed open(2) on a lock that never had a waiter, and
//! on one that had (the file stays) an open with its checks, two fcntl(2) (the kernel reads
//! every place) and a close.
//!
//! **Which backends keep one** (`Registered::room`): mkdir, link and symlink — on a local
//! filesystem this file's byte-range room (`lockdir/room.rs`), on a network filesystem a
//! directory of named places (`lockdir/netroom.rs`: byte-range locks are what those backends
//! are used there to keep out of), each waiter trying again on a notice or a timer, so that
//! between a release and that try a newcomer could come first. flock's, postgres' and etcd's
//! waiters need none: the kernel or the server grants a waiter the lock the moment it frees
//! (a blocked flock(2), a queued advisory lock, the oldest key of the queue), before any
//! newcomer, and the holder's record is then the waiter's. s3 keeps one through this wrapper
//! too, on the server (`s3/room.rs`: an object per place, rewritten every heartbeat period,
//! judged by the server's clock); redis and ftp keep theirs in the very step that tries the
//! lock (`redis.rs`'s `ACQUIRE`: a place taken by a busy try, with an expiry, looked at by a
//! take; `ftp/room.rs`: a directory per place made and renamed by busy tries on the lock's
//! own connection, judged by the looker's clock with slack, looked at through this wrapper's
//! room).
//!
//! **Not covered:** the moment between a waiter's first busy try and its joining (there a
//! newcomer of another number still goes first, and the waiter is refused when it gets the
//! lock, as before the room existed). Anyone who can open the room file (or write a room
//! directory) can lock a byte of it (make a place) and so keep the lock's number from
//! changing while nobody holds it (the refusal says which number it claims), or remove a
//! place from a room directory and lose its waiter's number.
//!
//! A room that cannot be joined or looked at (something else at its name, a file we may not
//! open) does not fail a wait or a contender: the waiter waits unrecorded, the look sees
//! nobody (said at `-v`).

use std::os::fd::BorrowedFd;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::lock::{
    Agree, Attempt, Backend, Break, BreakOutcome, Grant, Held, Holder, NotReleased, WaitHint,
};
use super::room::{Place, Room};
use crate::error::Result;
use crate::log::debug;
use crate::watch::Watcher;

/// A lock whose waiters hold a place in its waiting room while they wait.
pub struct Waiting {
    /// The lock as messages name it.
    name: String,
    lock: Option<Box<dyn Backend>>,
    room: Room,
    /// Our number of slots: the byte of the room we hold.
    n: u32,
    /// Our place.
    joined: Option<Box<dyn Place>>,
    /// Joining failed for good in this wait.
    unjoinable: bool,
    /// The wait's deadline, told before each try: it bounds the room's requests too.
    by: Option<Instant>,
}

impl Waiting {
    pub fn new(lock: Box<dyn Backend>, name: &str, room: Room, n: u32) -> Waiting {
        Waiting {
            name: name.to_string(),
            lock: Some(lock),
            room,
            n: n.max(1),
            joined: None,
            unjoinable: false,
            by: None,
        }
    }

    fn lock(&mut self) -> &mut Box<dyn Backend> {
        self.lock.as_mut().expect("the lock is back")
    }

    /// Keeps our place alive where it expires, once due.
    fn keep(&mut self) {
        if let Some(place) = self.joined.as_mut()
            && let Err(e) = place.keep(self.by)
        {
            debug!(
                "lock {}: cannot keep its place in its waiting room: {e}",
                self.name
            );
        }
    }

    /// Takes our place in the room, once per wait; later, keeps it.
    fn join(&mut self) {
        if self.joined.is_some() {
            return self.keep();
        }
        if self.unjoinable {
            return;
        }
        match self.room.join(self.n) {
            Ok(Some(place)) => {
                debug!("lock {}: waiting in its waiting room", self.name);
                self.joined = Some(place);
                self.room.set_joined(true);
            }
            Ok(None) => self.unjoinable = true,
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

    /// Gives our place back (we hold the lock, or stop waiting): the place is dropped — on a
    /// thread if that takes a request, whose end is returned (the holder's release waits for
    /// it).
    fn leave(&mut self) -> Option<JoinHandle<()>> {
        self.room.set_joined(false);
        let place = self.joined.take()?;
        if !place.leaves_slowly() {
            return None;
        }
        std::thread::Builder::new()
            .name("leave-room".into())
            .stack_size(256 * 1024)
            .spawn(move || drop(place))
            .ok()
    }
}

impl Backend for Waiting {
    fn name(&self) -> &'static str {
        self.lock.as_ref().expect("the lock is back").name()
    }

    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let lock = self.lock.take().expect("the lock is back");
        match lock.try_acquire()? {
            Attempt::Acquired(held) => Ok(Attempt::Acquired(match self.leave() {
                Some(leaving) => Box::new(Leaving {
                    held,
                    leaving: Some(leaving),
                }),
                None => held,
            })),
            Attempt::Busy(lock, holders) => {
                self.lock = Some(lock);
                Ok(Attempt::Busy(self, holders))
            }
            // No `prepare_wait` follows a try the server did not answer: the place is kept
            // here (once due), else it would lapse, and its bound ask for a try at once.
            Attempt::Unanswered(lock, e) => {
                self.lock = Some(lock);
                self.keep();
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
        self.room.answer_by(by);
        self.lock().answer_by(by)
    }

    /// The lock's bound, and our place's where it must be kept alive.
    fn try_within(&self) -> Option<Duration> {
        let lock = self.lock.as_ref().expect("the lock is back").try_within();
        let place = self.joined.as_ref().and_then(|p| p.keep_within());
        lock.into_iter().chain(place).min()
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

/// A lock taken by a waiter whose place is being given back on a thread: the OK line does not
/// wait for that request; the release does (so that a `run` of a short command leaves no
/// place behind).
struct Leaving {
    held: Box<dyn Held>,
    leaving: Option<JoinHandle<()>>,
}

impl Held for Leaving {
    fn grant(&self) -> &Grant {
        self.held.grant()
    }

    fn period(&self) -> Option<Duration> {
        self.held.period()
    }

    fn began(&self) -> Option<Duration> {
        self.held.began()
    }

    fn heartbeat(&mut self, deadline: Instant) -> Result<()> {
        self.held.heartbeat(deadline)
    }

    fn release(mut self: Box<Self>) -> std::result::Result<(), NotReleased<Box<dyn Held>>> {
        if let Some(leaving) = self.leaving.take() {
            let _ = leaving.join();
        }
        self.held.release()
    }

    fn inherit_fd(&self) -> Option<BorrowedFd<'_>> {
        self.held.inherit_fd()
    }

    fn alarm(&self) -> Option<BorrowedFd<'_>> {
        self.held.alarm()
    }

    fn check(&mut self) -> Result<()> {
        self.held.check()
    }
}
