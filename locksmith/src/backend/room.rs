//! A lock's waiting room (SPEC §3b: "the lock records N while anyone holds or waits"): the
//! handle a waiter (`waiting.rs`) and the lock's say (`slots.rs`'s `agreement`) share, over
//! the room a backend keeps — its mechanism only: how a place is taken, kept and given back,
//! and how the room is looked at (`lockdir/room.rs`: a byte-range lock of a local file;
//! `s3/room.rs`: an object per place; `ftp/room.rs`: a directory per place). `waiting.rs`
//! says what a room is for and which backends keep one (redis keeps its own, in its taking
//! script).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::log::debug;

/// A backend's waiting room: its mechanism.
pub trait Keeper: Send + Sync {
    /// Takes a place for a waiter of `n` slots, its requests answered by `by` (the wait's
    /// deadline, if any). `Ok(None)`: no place taken here — no room (a network filesystem), or
    /// one the lock's own backend takes in its tries (ftp: `ftp/room.rs`).
    fn join(&self, n: u32, by: Option<Instant>) -> Result<Option<Box<dyn Place>>>;

    /// The number of slots of a live waiter in the room other than `n`, if any. A room that
    /// cannot be looked at shows nobody (it is a courtesy to waiters, and must not keep the
    /// lock's number from changing for ever): said at `-v` by the keeper.
    fn other_than(&self, n: u32, lock: &str, by: Option<Instant>) -> Option<u32>;

    /// Whether a look costs nothing worth counting (a local file): then a contender looks at
    /// every issue, over its own number too; else only when another number is recorded
    /// (a look over one's own number would cost a request at every acquisition).
    fn cheap(&self) -> bool;
}

/// A waiter's place in a room; dropped, it is given back (a request, where the room is on a
/// server, bounded by the keeper).
pub trait Place: Send {
    /// Keeps the place alive where it expires (a server's), once due; by `by`.
    fn keep(&mut self, _by: Option<Instant>) -> Result<()> {
        Ok(())
    }

    /// How soon [`Place::keep`] must be called again; `None`: never.
    fn keep_within(&self) -> Option<Duration> {
        None
    }

    /// Whether giving it back takes a request (a server's): a waiter that took the lock then
    /// gives it back beside its OK line, not before it.
    fn leaves_slowly(&self) -> bool {
        false
    }
}

/// A lock's room, as one acquisition sees it: the keeper, and whether this acquisition
/// waits there now (a waiter of the number recorded, taking the lock, is no newcomer: it need
/// not look — with 1,000 waiters in a room, a look reads the 1,000 places at every handoff).
#[derive(Clone)]
pub struct Room {
    keeper: Arc<dyn Keeper>,
    joined: Arc<AtomicBool>,
    /// The wait's deadline, told by the waiter (`waiting.rs`), which bounds a look's requests.
    by: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("joined", &self.waited())
            .finish_non_exhaustive()
    }
}

impl Room {
    pub fn new(keeper: impl Keeper + 'static) -> Room {
        Room {
            keeper: Arc::new(keeper),
            joined: Arc::new(AtomicBool::new(false)),
            by: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether this acquisition waited in the room, and still does.
    pub fn waited(&self) -> bool {
        self.joined.load(Ordering::SeqCst)
    }

    /// Said by the waiter as it joins and leaves.
    pub fn set_joined(&self, joined: bool) {
        self.joined.store(joined, Ordering::SeqCst);
    }

    /// The wait's deadline, told before each try.
    pub fn answer_by(&self, by: Option<Instant>) {
        *self.by.lock().unwrap_or_else(|e| e.into_inner()) = by;
    }

    fn by(&self) -> Option<Instant> {
        *self.by.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Keeper::join`].
    pub fn join(&self, n: u32) -> Result<Option<Box<dyn Place>>> {
        self.keeper.join(n, self.by())
    }

    /// Whether a contender that holds its lock and finds `before` recorded, asking for `n`,
    /// looks at the room (the rule of `slots.rs`'s `agreement`): not a waiter of the number
    /// recorded that waits here itself (no newcomer); over its own number only where a look
    /// is cheap.
    pub fn looks(&self, before: u32, n: u32) -> bool {
        if before == n {
            !self.waited() && self.keeper.cheap()
        } else {
            true
        }
    }

    /// [`Keeper::other_than`].
    pub fn other_than(&self, n: u32, lock: &str) -> Option<u32> {
        self.keeper.other_than(n, lock, self.by())
    }
}

/// What a look at a room kept on a server found, as [`Keeper::other_than`] says it: the
/// number of the first live place (its name, number, whether it lives) of a number other than `n`. A room
/// that could not be read shows nobody (said at `-v`).
pub fn other_number<P>(found: Result<Vec<(P, u32, bool)>>, n: u32, lock: &str) -> Option<u32> {
    match found {
        Ok(places) => places
            .into_iter()
            .find_map(|(_, m, live)| (live && m != n).then_some(m)),
        Err(e) => {
            debug!("lock {lock}: its waiting room: {e}; looked at as empty");
            None
        }
    }
}
