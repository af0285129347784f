//! Semaphores (SPEC §3b): a lock of N slots is N locks of the same backend, slot K kept
//! beside the lock's name (`Registered::slot` says where: docs/LAYOUT.md), each a whole lock
//! of §6 for its holder — crash release, proof of death or `stale_after`, heartbeats, LOST,
//! `break` — and all issuing their fencing tokens from the lock's one counter, so every
//! grant's token is above every earlier one, whatever the slot. This file is the one place
//! that decides which slot a contender takes and whether its number of slots agrees with
//! the lock's; a backend supplies only where slot K is.
//!
//! **The number of slots.** The counter records, with each token, the number of slots of
//! the contender it was issued to. A contender that holds its own lock (a slot, or the lock
//! itself when N = 1) and finds another number recorded asks this file first ([`Agree`]):
//! if anyone holds a lock of the recorded number (the lock itself for 1, else its slots)
//! besides ours, it gives its lock back and fails with 78, naming both numbers, and the
//! record is left as it was. Otherwise it issues over exactly the state it read, so that of
//! two contenders that disagree, the second to issue finds the first's lock taken (each
//! took its lock before reading). Once nobody holds, the next contender's number stands.
//!
//! Readers (`--shared`, one slot) take no token, so no counter asks them: this file looks
//! for them instead, after either side took its lock (`Slots::disagree`), reading the
//! number the counter records (with the reader's token, [`Grant::recorded_slots`], or by
//! [`Backend::recorded_slots`]). A contender whose slots are all busy reads it too, once,
//! so that one of another number is refused at once rather than when a slot frees. A waiter
//! keeps its number too where its backend keeps a waiting room (`waiting.rs` says which),
//! which [`agreement`] asks ([`Room::looks`] says when): a waiter of another number makes the
//! newcomer refused.

use std::os::fd::BorrowedFd;

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lock::{
    Agree, Attempt, Backend, Break, BreakOutcome, Grant, Held, Holder, NotReleased, WaitHint,
};
use super::room::Room;
use crate::error::{Error, Kind, Result, err};
use crate::log::debug;
use crate::watch::Watcher;

/// The most slots a waiter watches at once.
const WATCHED: usize = 4;

/// Opens a lock of the same backend: `Some(k)` slot `k`, `None` the lock's own name.
pub type Opener = Arc<dyn Fn(Option<u32>) -> Box<dyn Backend> + Send + Sync>;

/// A lock of `n` slots, not held: one backend per slot.
pub struct Slots {
    name: &'static str,
    n: u32,
    /// The lock as messages name it, and how to open its other locks.
    lock: String,
    open: Opener,
    /// A reader's (`--shared`, one slot): the counter never asks it, so it looks itself.
    shared: bool,
    /// Whether a busy attempt looked for holders of another number of slots yet.
    looked: bool,
    /// Slot K's backend (`n` = 1: the lock itself), opened when first used; `None` before,
    /// and while trying it.
    slots: Vec<Option<Box<dyn Backend>>>,
    /// When a server must have answered ([`Backend::answer_by`]), for slots opened later.
    answer_by: Option<Instant>,
    /// A fair queue's places ([`places`](Slots::places)).
    places: bool,
    /// The slot tried first, where not at random ([`places`](Slots::places)).
    first: Option<usize>,
    /// How many slots one try tries at most ([`aim`](Slots::aim)): all but for a full line.
    tries: usize,
    /// The first of the slots a waiter watches.
    watched: Option<usize>,
    /// The lock's waiting room, where its backend keeps one (`waiting.rs`).
    room: Option<Room>,
}

/// One try of a lock of slots ([`Slots::try_once`]).
pub enum SlotTry {
    Acquired(Box<dyn Held>),
    Busy(Vec<Holder>),
    Unanswered(Error),
}

impl Slots {
    pub fn new(lock: &str, n: u32, open: Opener) -> Slots {
        let mut slots = Slots {
            name: "",
            n,
            lock: lock.to_string(),
            open,
            shared: false,
            looked: false,
            slots: (0..n.max(1)).map(|_| None).collect(),
            answer_by: None,
            places: false,
            first: None,
            tries: n.max(1) as usize,
            watched: None,
            room: None,
        };
        // The others are opened when first used: a fair queue has many places, and an
        // acquisition uses few of them.
        let first = slots.opened(0);
        slots.name = first.name();
        slots.slots[0] = Some(first);
        slots
    }

    /// The lock's waiting room (`waiting.rs`), looked at before a number of slots of ours
    /// replaces another recorded.
    pub fn room(mut self, room: Option<Room>) -> Slots {
        self.room = room;
        // Slot 0 was opened by `new`, with a say that had no room.
        let first = self.say(self.n, self.slot(0));
        if let Some(b) = self.slots[0].as_mut() {
            b.agree_on_slots(first);
        }
        self
    }

    /// The say of this lock for a contender of `n` slots holding `ours` ([`agreement`]).
    fn say(&self, n: u32, ours: Option<u32>) -> Agree {
        agreement(
            self.lock.clone(),
            n,
            ours,
            self.open.clone(),
            self.room.clone(),
        )
    }

    /// A lock taken `--shared` (with one slot: SPEC §3b refuses more).
    pub fn shared(mut self, shared: bool) -> Slots {
        self.shared = shared;
        self
    }

    /// A fair queue's places (`fair.rs`), tried where [`aim`](Slots::aim) says: from the
    /// lowest that looked free upwards (so that the places held stay few and low where they
    /// are listed) or, with none, from a random one as any semaphore's. Their number is not
    /// judged: a place only
    /// orders waiters (the lock's own slots judge its holders), so a line whose counter
    /// records another number — kept by a locksmith with other places, as before 1024 on the
    /// file backends — is joined, not refused.
    pub fn places(mut self) -> Slots {
        self.places = true;
        // Opened by `new` with an agreement: opened again when used, without.
        self.slots[0] = None;
        self
    }

    /// Where the next try of a fair queue's places starts ([`places`](Slots::places)), and how
    /// many places it tries at most: a line listed full tries one at random, not all of them
    /// (a request each on a server, every poll of every waiter beyond the line; the line's
    /// own waiters break a dead waiter's place ahead of them).
    pub fn aim(&mut self, first: Option<u32>, tries: usize) {
        self.first = first.map(|k| (k as usize).min(self.slots.len() - 1));
        self.tries = tries.clamp(1, self.slots.len());
    }

    /// Slot `k`'s backend, taken out (opened on first use); put it back when done.
    fn opened(&mut self, k: usize) -> Box<dyn Backend> {
        if let Some(b) = self.slots[k].take() {
            return b;
        }
        let ours = self.slot(k);
        let mut b = (self.open)(ours);
        if !self.places {
            b.agree_on_slots(self.say(self.n, ours));
        }
        b.answer_by(self.answer_by);
        b
    }

    /// Opens every slot not opened yet (status, break).
    fn open_all(&mut self) {
        for k in 0..self.slots.len() {
            let b = self.opened(k);
            self.slots[k] = Some(b);
        }
    }

    /// Slot `k`'s number as the OK line and `status` say it (`None` for the lock itself).
    fn slot(&self, k: usize) -> Option<u32> {
        (self.n > 1).then_some(k as u32)
    }

    /// Holding our lock, whether a contender of another number holds beside us where no
    /// counter asks it — readers (shared, one slot) take no token, so the counter never
    /// judges them, whichever of the two comes second:
    ///
    /// - holding a slot (N > 1): a holder of the lock itself, which can only be a reader
    ///   (an exclusive one took a token, and the counter asked);
    /// - holding the lock itself shared: the number the counter records, read after taking
    ///   it (with its token where the backend could: [`Grant::recorded_slots`]; else by
    ///   [`Backend::recorded_slots`]), and when it is more than 1, a holder of any of those
    ///   slots ([`agreement`]'s look).
    ///
    /// Of a reader R and a slot contender S acting at once, at least one is refused, never
    /// both admitted: each acts (takes its lock) before it looks, and S records its number
    /// in the counter as it takes its token, before its look. If S's look comes before R's
    /// act, then S's record does too, so R reads S's number (it stays while S holds: a
    /// contender of another number may only change it after finding none of S's slots held)
    /// and then finds S's slot taken: R is refused. Otherwise R's act comes before S's look,
    /// and S finds R: S is refused. (Both may be, as for two contenders the counter judges.)
    /// An exclusive holder of one slot needs no look here: the counter asked before issuing
    /// its token, over exactly the record it read (see the module's docs).
    fn disagree(&self, grant: &Grant) -> Result<Option<crate::error::Error>> {
        if self.places {
            return Ok(None);
        }
        if self.n == 1 {
            if !self.shared {
                return Ok(None);
            }
            // Read with the reader's token where the backend could (no second session).
            let recorded = match grant.recorded_slots {
                Some(m) => Some(m),
                None => (self.open)(None).recorded_slots()?,
            };
            return Ok(match recorded {
                Some(m) if m > 1 => self.say(1, None)(m).err(),
                _ => None,
            });
        }
        let mut b = (self.open)(None);
        Ok(b.holder()?
            .map(|h| refusal(&self.lock, "1 slot", "the lock itself", &h, self.n)))
    }

    fn each(&mut self) -> impl Iterator<Item = (Option<u32>, &mut Box<dyn Backend>)> {
        let several = self.n > 1;
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(move |(k, b)| b.as_mut().map(|b| (several.then_some(k as u32), b)))
    }

    /// One try of [`Backend::try_acquire`], keeping the value (a fair queue's entering
    /// waiter re-aims it between tries, `fair.rs`).
    pub fn try_once(&mut self) -> Result<SlotTry> {
        let n = self.slots.len();
        let began = crate::sys::boottime();
        // Contenders start at different slots, so that a free one is found in one try
        // (unless told which looked free).
        let start = match self.first {
            Some(k) => k,
            None if n > 1 => fastrand::usize(..n),
            None => 0,
        };
        // A try of fewer than all (a full line, [`aim`](Slots::aim)) tries the watched slots
        // first: a wait on one may have been granted (postgres: its waiter thread took it),
        // and a slot held that way, never tried, would sit in the line with no number.
        let watched: Vec<usize> = match self.watched {
            Some(w) if self.tries < n => (0..n.min(WATCHED)).map(|i| (w + i) % n).collect(),
            _ => Vec::new(),
        };
        let order = watched.iter().copied().chain(
            (0..n.min(self.tries))
                .map(|i| (start + i) % n)
                .filter(|k| !watched.contains(k)),
        );
        let mut holders = Vec::new();
        for k in order {
            let lock = self.opened(k);
            match lock.try_acquire()? {
                Attempt::Acquired(held) => {
                    // Refused, or the look failed: the lock goes back either way.
                    if let Some(e) = self.disagree(held.grant()).unwrap_or_else(Some) {
                        if let Err(nr) = held.release() {
                            debug!("giving back lock {}: {}", self.lock, nr.error);
                        }
                        return Err(e);
                    }
                    let ours = self.slot(k);
                    let held = SlotHeld::new(held, ours, began);
                    return Ok(SlotTry::Acquired(Box::new(held)));
                }
                Attempt::Busy(lock, mut seen) => {
                    self.slots[k] = Some(lock);
                    let slot = self.slot(k);
                    for h in &mut seen {
                        h.slot = slot;
                    }
                    holders.extend(seen);
                }
                Attempt::Unanswered(lock, e) => {
                    // The other slots are tried at the next try: this one's server (the
                    // same for all) did not answer.
                    self.slots[k] = Some(lock);
                    return Ok(SlotTry::Unanswered(e));
                }
            }
        }
        // Every slot busy: once, look where a contender of another number would be, so that
        // one who disagrees is told now rather than when a slot frees (the first attempt of
        // a wait; the number is still judged at every grant). One slot: the lock itself was
        // busy, so no contender of more slots holds it, and a grant judges the rest.
        if self.n > 1 {
            self.judge_number()?;
        }
        Ok(SlotTry::Busy(holders))
    }

    /// Once per acquisition, holding nothing of the lock: `Err` (78) where a contender of
    /// another number holds it — the lock itself (one slot, for a contender of several),
    /// slot N (more than ours), and, where the counter records another number, that number's
    /// slots — or waits in its room ([`agreement`]). Asked by a wait whose slots were all
    /// busy ([`try_once`](Slots::try_once)), and by a fair line's waiter that waits without
    /// trying the lock (`fair.rs`), who would otherwise be told only at its turn.
    pub fn judge_number(&mut self) -> Result<()> {
        if self.looked || self.places {
            return Ok(());
        }
        self.looked = true;
        let judged = self.look_for_another_number();
        // A server that did not answer: asked again at the next try.
        if judged
            .as_ref()
            .is_err_and(|e| e.kind() == Kind::Unavailable)
        {
            self.looked = false;
        }
        judged
    }

    fn look_for_another_number(&mut self) -> Result<()> {
        if self.n > 1 {
            for name in [None, Some(self.n)] {
                let mut other = (self.open)(name);
                other.answer_by(self.answer_by);
                if let Some(h) = other.holder()? {
                    let (recorded, held_as) = match name {
                        None => ("1 slot".to_string(), "the lock itself".to_string()),
                        Some(k) => (format!("more than {} slots", self.n), format!("slot {k}")),
                    };
                    return Err(refusal(&self.lock, &recorded, &held_as, &h, self.n));
                }
            }
        }
        // The counter's number changes only when none of its slots is held (module
        // docs): another number recorded and one of its slots held, ours would be
        // refused when it frees (fewer than recorded: slot N may well be free). Read through
        // slot 0 where it is open (a busy try's), else through one opened for the read and
        // closed after (a fair waiter keeps no session more while it waits in line).
        let recorded = match self.slots[0].as_mut() {
            Some(first) => first.recorded_slots(),
            None => {
                let mut first = (self.open)(self.slot(0));
                first.answer_by(self.answer_by);
                first.recorded_slots()
            }
        };
        if let Some(m) = recorded?
            && m != self.n
        {
            self.say(self.n, None)(m)?;
        }
        Ok(())
    }
}

/// The slot a name beside a lock stands for, where a backend lists its slots in one read
/// (`Backend::slots_present`): `rest` is what follows `NAME.slot-` — the slot's number as every
/// backend writes it (`slot(k)`: decimal, no sign, no leading zero), below `n`, then a tail
/// `tail` accepts (the slot's own name: the empty tail). Anything else (`slot-07`, `slot-3x`,
/// a slot past `n`) is no slot of ours.
pub fn slot_named(rest: &str, n: u32, tail: impl Fn(&str) -> bool) -> Option<u32> {
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let (digits, after) = rest.split_at(end);
    let k: u32 = digits.parse().ok()?;
    (k < n && k.to_string() == digits && tail(after)).then_some(k)
}

/// The refusal of a contender of `n` slots: `holder`, in `held_as`, holds the lock with
/// `recorded`.
fn refusal(
    lock: &str,
    recorded: &str,
    held_as: &str,
    holder: &Holder,
    n: u32,
) -> crate::error::Error {
    err!(
        Config,
        "lock {lock} is held with {recorded} ({held_as}: {holder}), but this asks for {n}: all \
         contenders of one lock must agree on `slots`"
    )
}

/// The say of a lock of `n` slots, for the contender holding `ours`, on a counter that
/// recorded another number (see the module's docs).
fn agreement(lock: String, n: u32, ours: Option<u32>, open: Opener, room: Option<Room>) -> Agree {
    Arc::new(move |before: u32| {
        if before != n {
            held_with(&lock, n, ours, &open, before)?;
        }
        // Nobody holds with another number; a waiter of another number in the lock's
        // waiting room gets the lock next (`waiting.rs`: asked at every issue where there
        // is a room, for a number of its own the record may not show — but not by a waiter
        // of the recorded number: it is no newcomer).
        if let Some(room) = &room
            && room.looks(before, n)
            && let Some(m) = room.other_than(n, &lock)
        {
            return Err(waited_refusal(&lock, m, n));
        }
        Ok(())
    })
}

/// The refusal of a contender of `n` slots: a waiter of `m` is in the lock's waiting room
/// (here, or in a backend's own step: `redis.rs`'s `ACQUIRE`).
pub fn waited_refusal(lock: &str, m: u32, n: u32) -> Error {
    err!(
        Config,
        "lock {lock} is waited for with {m} slot(s) (a waiter in its waiting room), but this \
         asks for {n}: all contenders of one lock must agree on `slots`"
    )
}

/// For [`agreement`]: `Err` (78) if anyone holds a lock of the recorded number `before` (0:
/// lost) other than `ours`.
fn held_with(lock: &str, n: u32, ours: Option<u32>, open: &Opener, before: u32) -> Result<()> {
    let names: Vec<Option<u32>> = match before {
        // The number was lost with its record: the places a contender of another number
        // may hold that ours never does — the lock itself for one of several, every
        // slot listed beyond ours (all of them for one of one slot). A contender of
        // fewer slots, in slots below ours, cannot be told from ours any more.
        0 => {
            let first = if n > 1 { n } else { 0 };
            let present = open(None).slots_present(crate::settings::MAX_SLOTS)?;
            (n > 1)
                .then_some(None)
                .into_iter()
                .chain(
                    present
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|&k| k >= first)
                        .map(Some),
                )
                .collect()
        }
        1 => vec![None],
        m => (0..m).map(Some).collect(),
    };
    for name in names.into_iter().filter(|k| *k != ours) {
        let mut other = open(name);
        if let Some(h) = other.holder()? {
            let held_as = match name {
                None => "the lock itself".to_string(),
                Some(k) => format!("slot {k}"),
            };
            let recorded = match before {
                0 => "a number of slots whose record was lost".to_string(),
                m => format!("{m} slot(s) recorded"),
            };
            return Err(refusal(lock, &recorded, &held_as, &h, n));
        }
    }
    debug!("lock {lock}: {before} slot(s) recorded (0: lost), none held: {n} stand(s)");
    Ok(())
}

impl Backend for Slots {
    fn name(&self) -> &'static str {
        self.name
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.answer_by = by;
        for (_, lock) in self.each() {
            lock.answer_by(by);
        }
    }

    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        Ok(match self.try_once()? {
            SlotTry::Acquired(held) => Attempt::Acquired(held),
            SlotTry::Busy(holders) => Attempt::Busy(self, holders),
            SlotTry::Unanswered(e) => Attempt::Unanswered(self, e),
        })
    }

    /// Waits on at most [`WATCHED`] slots, the same few each time, chosen at random (each
    /// watch costs a descriptor, a thread or an inotify instance per waiter); the others are
    /// tried on the backoff timer.
    fn prepare_wait(&mut self) -> Result<WaitHint> {
        let n = self.slots.len();
        let start = *self.watched.get_or_insert_with(|| fastrand::usize(..n));
        let mut poll = n > WATCHED;
        // A release of any slot is caught only if every slot is watched by a wait that
        // catches one.
        let mut catches_release = n <= WATCHED;
        for i in 0..n.min(WATCHED) {
            let k = (start + i) % n;
            let mut b = self.opened(k);
            let hint = b.prepare_wait();
            self.slots[k] = Some(b);
            let hint = hint?;
            poll |= hint.poll;
            catches_release &= hint.catches_release;
        }
        Ok(WaitHint {
            poll,
            catches_release,
        })
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.slots
            .iter()
            .flatten()
            .flat_map(|b| b.wake_fds())
            .collect()
    }

    /// The soonest any opened slot asks to be tried again (a redis writer's mark behind
    /// readers, a place in a waiting room kept on a server).
    fn try_within(&self) -> Option<Duration> {
        self.slots
            .iter()
            .flatten()
            .filter_map(|b| b.try_within())
            .min()
    }

    fn woken(&mut self) -> bool {
        // Every watched slot reads its events (none is left readable for nothing).
        self.slots
            .iter_mut()
            .flatten()
            .fold(false, |any, b| b.woken() | any)
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        self.open_all();
        let mut all = Vec::new();
        for (slot, b) in self.each() {
            for mut h in b.status()? {
                h.slot = slot;
                all.push(h);
            }
        }
        Ok(all)
    }

    /// Each slot's own, where its busy try left them unnamed (slots looked at only).
    fn name_holders(&mut self) -> Vec<Holder> {
        let mut all = Vec::new();
        for (slot, b) in self.each() {
            for mut h in b.name_holders() {
                h.slot = slot;
                all.push(h);
            }
        }
        all
    }

    /// Breaks every slot `how` allows (with `--token`, the one acquisition); a slot whose
    /// holder may not be broken is left alone and said, unless another was broken.
    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome> {
        if self.n == 1 {
            return self.slots[0]
                .as_mut()
                .expect("opened")
                .break_lock(how, watcher);
        }
        self.open_all();
        let mut broken = None;
        let mut refused = None;
        for (slot, b) in self.each() {
            match b.break_lock(how, watcher) {
                Ok(BreakOutcome::Broken(mut h)) => {
                    h.slot = slot;
                    debug!("broke slot {}: {h}", slot.unwrap_or(0));
                    broken.get_or_insert(h);
                }
                Ok(BreakOutcome::Free) => {}
                Err(e) if e.kind() == Kind::Config || e.kind() == Kind::Io => return Err(e),
                Err(e) => {
                    refused.get_or_insert(e);
                }
            }
        }
        match (broken, refused) {
            (Some(h), _) => Ok(BreakOutcome::Broken(h)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(BreakOutcome::Free),
        }
    }
}

/// A slot held: the slot's lock, its grant with the slot said, and when the attempt that
/// took it began.
struct SlotHeld {
    held: Box<dyn Held>,
    grant: Grant,
    began: std::time::Duration,
}

impl SlotHeld {
    fn new(held: Box<dyn Held>, slot: Option<u32>, began: std::time::Duration) -> SlotHeld {
        let grant = Grant {
            slot,
            ..held.grant().clone()
        };
        SlotHeld { held, grant, began }
    }
}

impl Held for SlotHeld {
    fn grant(&self) -> &Grant {
        &self.grant
    }

    fn period(&self) -> Option<std::time::Duration> {
        self.held.period()
    }

    fn began(&self) -> Option<std::time::Duration> {
        Some(self.held.began().map_or(self.began, |b| b.max(self.began)))
    }

    fn heartbeat(&mut self, deadline: std::time::Instant) -> Result<()> {
        self.held.heartbeat(deadline)
    }

    fn release(self: Box<Self>) -> std::result::Result<(), NotReleased<Box<dyn Held>>> {
        let SlotHeld { held, grant, began } = *self;
        held.release().map_err(|nr| NotReleased {
            error: nr.error,
            retry: nr
                .retry
                .map(|held| Box::new(SlotHeld { held, grant, began }) as Box<dyn Held>),
        })
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

#[cfg(test)]
mod tests {
    use super::slot_named;

    #[test]
    fn a_slot_is_named_by_its_canonical_number_below_n_and_an_accepted_tail() {
        let own = |t: &str| t.is_empty();
        assert_eq!(slot_named("0", 32, own), Some(0));
        assert_eq!(slot_named("31", 32, own), Some(31));
        assert_eq!(slot_named("32", 32, own), None);
        assert_eq!(slot_named("07", 32, own), None);
        assert_eq!(slot_named("", 32, own), None);
        assert_eq!(slot_named("+3", 32, own), None);
        assert_eq!(slot_named("3x", 32, own), None);
        assert_eq!(slot_named("99999999999", u32::MAX, own), None);
        let readers = |t: &str| t.is_empty() || t == ".readers";
        assert_eq!(slot_named("5.readers", 32, readers), Some(5));
        assert_eq!(slot_named("5.state", 32, readers), None);
    }
}
