//! Fair queues (SPEC §3b): waiters are served in the order they began to wait, on every
//! backend that keeps slots, for one slot or several. This file is the one place for the
//! rule; a backend supplies only where its queue is (`Registered::queue`).
//!
//! **The shape** (every working FIFO semaphore is a fair gate plus a counter): the queue is a
//! lock of its own beside the lock's name (`NAME.line`) whose slots are the places, as many
//! as the lock's backend keeps (`Registered::PLACES`: 1024 on the file backends, etcd and
//! redis; 32 on ftp, postgres and s3). A waiter first takes a place — the lowest free slot of
//! the queue where the places held are listed (so they stay few and low), else any: a whole
//! lock of SPEC §6 held for as long as it waits (crash release, proof of death or
//! `stale_after`, heartbeats) — and the fencing token of that grant, from the queue's one
//! counter, is its number in line. Only the waiter whose number is the lowest of the places
//! held (the head) tries the lock itself; once it holds the lock it gives its place back and
//! the next number is the head. A waiter that gives up, fails, or whose parent goes gives its
//! place back at once; one killed leaves its place to the backend's crash rules (at once on
//! the same host, after `stale_after` elsewhere), so it never blocks the line longer than a
//! dead holder would block the lock. A waiter that does not try the lock (behind others, or
//! waiting for a place) asks the lock once whether a contender of another number of slots
//! holds it or waits in its room (`Slots::judge_number`, what an unfair waiter asks when its
//! slots are busy): refused (78) at once, its place given back, rather than at its turn.
//!
//! **Why the line needs no lock of its own:** numbers are issued in order, and a place is
//! held before its number is issued, so once a waiter has its number every waiter ahead of it
//! already holds a place. A waiter reads the places once — those that may be held, listed in
//! one read where the backend can (`Backend::slots_present`: one listing of the directory on
//! the file backends and ftp, one query or request on postgres, etcd, redis and s3 —
//! docs/LAYOUT.md), else every place; their holders' numbers read in one request too where
//! the backend can (`Backend::slots_holders`: postgres, etcd, redis), else each place's —
//! keeps those with lower numbers, and from then on only watches the nearest of them: the
//! line ahead of it can only get shorter. A place seen held whose number is not issued yet is
//! waited on until it is. The nearest place is tried, not only looked at: the backend breaks
//! a dead or stale waiter's place as part of trying, and a place found free is given back at
//! once. The number of places is not judged as a lock's slots are (`Slots::places`): a line
//! kept with another number is joined.
//!
//! **Limits:** more waiters than the backend's places (1024 on the file backends, etcd and
//! redis; 32 on ftp and s3, where a place's holder is read one request each, and postgres,
//! where every waiter keeps sessions of its own) wait for a place in no particular order; a
//! contender without `fair` is not in the line and may go first; on a network filesystem a
//! place may be seen late (its cache time, the listing's included), as every read there.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::lock::{Attempt, Backend, Break, BreakOutcome, Held, Holder, WaitHint};
use super::slots::{Opener, SlotTry, Slots};
use crate::error::{Error, Kind, Result};
use crate::log::{debug, info};
use crate::settings::Common;
use crate::watch::Watcher;

/// A lock taken through its fair queue.
pub struct Fair {
    /// The lock as messages name it.
    name: String,
    /// The lock itself (all its slots); only the head of the line tries it.
    lock: Slots,
    /// How to open the queue's places.
    queue: Opener,
    /// The queue's settings: its number of slots is the places (`Registered::PLACES`).
    common: Common,
    /// Not in line yet: the queue, being tried for a place.
    entering: Option<Slots>,
    place: Option<Place>,
    /// The places held ahead of ours (slot, number), nearest last; the line ahead only
    /// shrinks, so it is read once.
    ahead: Vec<(u32, Option<u64>)>,
    /// The nearest place ahead, kept open between looks (a backend judges silence over
    /// time), and who its last look named there.
    watched: Option<(u32, Box<dyn Backend>, Vec<Holder>)>,
    /// Who holds the lock, as last seen (for messages).
    holders: Vec<Holder>,
    /// A try of this round whose server did not answer ([`Attempt::Unanswered`]).
    unanswered: Option<Error>,
    /// The queue itself, open while entering the line: its two listings (a free place, then
    /// who is ahead) on one session where a server keeps one per backend (postgres). Not
    /// kept while waiting: a connection more per waiter (pure-ftpd's limit per address).
    lister: Option<Box<dyn Backend>>,
}

/// Our place in line: its lock held, its number, and when it heartbeats next.
struct Place {
    held: Box<dyn Held>,
    slot: u32,
    number: Option<u64>,
    next_beat: Option<Instant>,
}

impl Fair {
    pub fn new(lock: Slots, name: &str, queue_common: &Common, queue: Opener) -> Fair {
        Fair {
            name: name.to_string(),
            lock,
            queue,
            common: queue_common.clone(),
            entering: None,
            place: None,
            ahead: Vec::new(),
            watched: None,
            holders: Vec::new(),
            unanswered: None,
            lister: None,
        }
    }

    /// The queue itself, opened once per entry, to list its places ([`Fair::lister`]'s field).
    fn lister(&mut self) -> &mut Box<dyn Backend> {
        self.lister.get_or_insert_with(|| (self.queue)(None))
    }

    /// Takes a place if one is free; then reads who is ahead.
    fn enter(&mut self) -> Result<()> {
        // Where the places held are listed in one read, the lowest free one is taken (so
        // they stay few and low: the listing stays short), and a line listed full has one
        // place tried at random ([`Slots::aim`]); else any place, from a random one.
        let places = self.common.slots;
        // Listed again at each try of a waiter beyond a full line (the lowest place freed
        // since); a listing that fails then keeps the last aim (a failed try is tried
        // again, not the end of the wait).
        let listed = match self.lister().slots_present(places) {
            Ok(listed) => Some(listed),
            Err(e) if self.entering.is_some() => {
                debug!("lock {}: the places of its fair queue: {e}", self.name);
                self.lister = None;
                None
            }
            Err(e) => return Err(e),
        };
        let aim = listed.map(|listed| match listed {
            Some(held) => match (0..places).find(|k| held.binary_search(k).is_err()) {
                Some(k) => (Some(k), places as usize),
                None => (None, 1),
            },
            None => (None, places as usize),
        });
        let mut queue = match self.entering.take() {
            Some(mut q) => {
                if let Some((first, tries)) = aim {
                    q.aim(first, tries);
                }
                q
            }
            None => {
                let (first, tries) = aim.unwrap_or((None, places as usize));
                let mut q = Slots::new(
                    &format!("{} (its fair queue)", self.name),
                    places,
                    self.queue.clone(),
                )
                .places();
                q.aim(first, tries);
                q
            }
        };
        match queue.try_once()? {
            SlotTry::Acquired(held) => {
                let grant = held.grant().clone();
                let period = held.period();
                let slot = grant.slot.unwrap_or(0);
                self.place = Some(Place {
                    held,
                    slot,
                    number: grant.token,
                    next_beat: period.map(|p| Instant::now() + p),
                });
                self.read_line()?;
                debug!(
                    "lock {}: in line, number {:?} in place {slot}, {} ahead",
                    self.name,
                    grant.token,
                    self.ahead.len()
                );
            }
            SlotTry::Busy(seen) => {
                self.lister = None;
                debug!(
                    "lock {}: every place of its fair queue is taken ({})",
                    self.name,
                    super::lock::describe(&seen)
                );
                self.entering = Some(queue);
            }
            SlotTry::Unanswered(e) => {
                self.lister = None;
                self.entering = Some(queue);
                self.unanswered = Some(e);
            }
        }
        Ok(())
    }

    /// Reads every other place once: those held with a lower number (or none issued yet)
    /// are ahead of ours.
    fn read_line(&mut self) -> Result<()> {
        let place = self.place.as_ref().expect("in line");
        let (ours, number) = (place.slot, place.number);
        self.ahead.clear();
        self.watched = None;
        let Some(number) = number else {
            // No number (a counter that could not be read): no order to keep.
            self.lister = None;
            return Ok(());
        };
        // Every place's holders in one request where the backend can (postgres), else each.
        let places = self.common.slots;
        let listed = match self.lister().slots_holders(places)? {
            Some(all) => all
                .into_iter()
                .filter_map(|h| Some((h.slot?, h)))
                .collect::<Vec<_>>(),
            None => {
                // The places that may be held, on the lister's session; then it is closed
                // before each place is asked (a connection more per entering waiter otherwise).
                let present = self
                    .lister()
                    .slots_present(places)?
                    .unwrap_or_else(|| (0..places).collect());
                self.lister = None;
                let mut all = Vec::new();
                for k in present {
                    if k != ours {
                        all.extend((self.queue)(Some(k)).status()?.into_iter().map(|h| (k, h)));
                    }
                }
                all
            }
        };
        self.lister = None;
        for (k, h) in listed.into_iter().filter(|(k, _)| *k != ours) {
            match h.token {
                Some(t) if t >= number => {}
                t => self.ahead.push((k, t)),
            }
        }
        // Nearest last; a place whose number is not issued yet counts as nearest.
        self.ahead.sort_by_key(|&(_, t)| t.unwrap_or(u64::MAX));
        Ok(())
    }

    /// Whether we are the head of the line: tries the nearest place ahead until one is still
    /// held by a waiter ahead of us, or none is left. Trying (not only looking) is what a
    /// backend's contract allows before it waits (postgres waits by taking the lock in a
    /// thread), and it breaks a place whose waiter is provably dead or silent past
    /// `stale_after`; a place found free is given back at once.
    fn at_head(&mut self) -> Result<bool> {
        let number = self.place.as_ref().and_then(|p| p.number);
        while let Some(&(k, _)) = self.ahead.last() {
            let (other, named) = match self.watched.take() {
                Some((j, b, named)) if j == k => (b, named),
                _ => ((self.queue)(Some(k)), Vec::new()),
            };
            match other.try_acquire()? {
                Attempt::Acquired(held) => {
                    debug!("lock {}: place {k} ahead is free", self.name);
                    if let Err(e) = held.release() {
                        debug!("giving back place {k}: {}", e.error);
                    }
                    self.ahead.pop();
                    // The places further ahead were mostly left before this one (their
                    // waiters were served first): where the places held are listed in one
                    // read, those gone are dropped by it, not each taken and given back —
                    // which made the waiter at place p of a long line take p - 1 places
                    // on its way to the head, O(N²) for the line (issue 26).
                    if self.ahead.len() > 1
                        && let Some(present) =
                            (self.queue)(None).slots_present(self.common.slots)?
                    {
                        self.ahead.retain(|(k, _)| present.binary_search(k).is_ok());
                    }
                }
                Attempt::Busy(mut other, mut holders) => {
                    // A look that names nobody — postgres, while its waiter thread is blocked
                    // on the place — is no answer: who holds the place is read (read as
                    // "nobody ahead", it let a waiter overtake the one at that place, issue
                    // 26). Not what the last look named: the place may have been left and
                    // taken by a newer waiter before our waiter thread queued behind it,
                    // and waiting on that one, who waits on us, would stall the line.
                    // Unreadable: the last look's, until a read answers.
                    if holders.is_empty() {
                        holders = other.status().unwrap_or_else(|e| {
                            debug!("lock {}: who holds place {k}: {e}", self.name);
                            named
                        });
                    }
                    // Still ours to wait for: a holder with a lower number, or one whose
                    // number is not issued yet; else a newer waiter sits there now.
                    let ahead = holders.iter().any(|h| match (h.token, number) {
                        (Some(t), Some(n)) => t < n,
                        (None, _) => true,
                        (Some(_), None) => false,
                    });
                    if !ahead {
                        self.ahead.pop();
                        continue;
                    }
                    self.watched = Some((k, other, holders));
                    return Ok(false);
                }
                Attempt::Unanswered(other, e) => {
                    self.watched = Some((k, other, named));
                    self.unanswered = Some(e);
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Keeps our place alive; a place lost (broken while we were stopped or silent) is taken
    /// again at the end of the line. Never an error: a place is not worth failing a wait for.
    fn beat(&mut self) {
        let Some(place) = self.place.as_mut() else {
            return;
        };
        let Some(next) = place.next_beat else {
            return;
        };
        let now = Instant::now();
        if now < next {
            return;
        }
        let period = place.held.period().unwrap_or(self.common.heartbeat());
        match place.held.heartbeat(now + period) {
            Ok(()) => {
                place.next_beat = Some(Instant::now() + period);
            }
            // A heartbeat not confirmed (a slow or unreachable server) does not end the wait:
            // the place is only a place in line. It is tried again soon; if it was broken
            // meanwhile, the next heartbeat says so and the waiter goes to the end of the line.
            Err(e) if e.kind() != Kind::Lost => {
                debug!("lock {}: its place in line not confirmed: {e}", self.name);
                place.next_beat = Some(Instant::now() + self.common.poll.min(period));
            }
            Err(e) => {
                info!(
                    "lock {}: lost its place in line ({e}); going to the end of the line",
                    self.name
                );
                let place = self.place.take().expect("in line");
                let _ = place.held.release();
                self.ahead.clear();
                self.watched = None;
            }
        }
    }

    /// Gives our place back (we hold the lock, or stop waiting).
    fn leave(&mut self) {
        if let Some(place) = self.place.take()
            && let Err(e) = place.held.release()
        {
            debug!(
                "lock {}: giving its place in line back: {}",
                self.name, e.error
            );
        }
    }
}

impl Drop for Fair {
    fn drop(&mut self) {
        self.leave();
    }
}

impl Backend for Fair {
    fn name(&self) -> &'static str {
        self.lock.name()
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        if let Some(q) = self.entering.as_mut() {
            q.answer_by(by);
        }
        let watched = self.watched.as_mut().map(|(_, b, _)| b);
        self.lock.answer_by(by);
        if let Some(b) = watched {
            b.answer_by(by);
        }
    }

    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        self.beat();
        if self.place.is_none() {
            // In line behind others, who holds the lock is read only if a message shows it
            // (`name_holders`); what an earlier place saw is not said again.
            self.holders.clear();
            self.enter()?;
        }
        if self.place.is_none() || !self.at_head()? {
            // Waiting without trying the lock: told now, once, where a contender of another
            // number holds it (or waits in its room), not when our turn comes; our place goes
            // back with us. Not while a server does not answer: asked at a later try.
            if self.unanswered.is_none() {
                match self.lock.judge_number() {
                    Err(e) if e.kind() == Kind::Unavailable => self.unanswered = Some(e),
                    r => r?,
                }
            }
            if let Some(e) = self.unanswered.take() {
                return Ok(Attempt::Unanswered(self, e));
            }
            let holders = self.holders.clone();
            return Ok(Attempt::Busy(self, holders));
        }
        match self.lock.try_once()? {
            SlotTry::Acquired(held) => {
                self.leave();
                Ok(Attempt::Acquired(held))
            }
            SlotTry::Busy(holders) => {
                self.holders.clone_from(&holders);
                Ok(Attempt::Busy(self, holders))
            }
            SlotTry::Unanswered(e) => Ok(Attempt::Unanswered(self, e)),
        }
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        if let Some(q) = self.entering.as_mut() {
            return q.prepare_wait();
        }
        if self.place.is_some() && self.ahead.is_empty() {
            return self.lock.prepare_wait();
        }
        // Behind others: woken when the nearest place ahead changes where its backend can
        // tell, and looking again every `poll` in any case (try_within).
        if let Some((_, b, _)) = self.watched.as_mut() {
            b.prepare_wait()?;
        }
        Ok(WaitHint {
            poll: false,
            catches_release: false,
        })
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        if let Some(q) = self.entering.as_ref() {
            return q.wake_fds();
        }
        if self.place.is_some() && self.ahead.is_empty() {
            return self.lock.wake_fds();
        }
        match self.watched.as_ref() {
            Some((_, b, _)) => b.wake_fds(),
            None => Vec::new(),
        }
    }

    fn woken(&mut self) -> bool {
        // The same choice as `wake_fds`.
        if let Some(q) = self.entering.as_mut() {
            return q.woken();
        }
        if self.place.is_some() && self.ahead.is_empty() {
            return self.lock.woken();
        }
        self.watched.as_mut().is_none_or(|(_, b, _)| b.woken())
    }

    /// Our place's heartbeat; behind others, a look every `poll`; at the head of the line,
    /// the lock's own bound too (it is the lock that is tried).
    fn try_within(&self) -> Option<Duration> {
        let place = self.place.as_ref()?;
        let now = Instant::now();
        let beat = place.next_beat.map(|n| n.saturating_duration_since(now));
        let look = (!self.ahead.is_empty()).then_some(self.common.poll);
        let lock = self
            .ahead
            .is_empty()
            .then(|| self.lock.try_within())
            .flatten();
        [beat, look, lock].into_iter().flatten().min()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        self.lock.status()
    }

    /// Those of the lock's last try; in line behind others, where the lock was not tried,
    /// those its `status` lists (once: a message shows them).
    fn name_holders(&mut self) -> Vec<Holder> {
        let lock = &mut self.lock;
        let mut named = lock.name_holders();
        if named.is_empty() {
            named = lock.status().unwrap_or_else(|e| {
                debug!("lock {}: who holds it: {e}", self.name);
                Vec::new()
            });
        }
        // Kept for the busy tries to come (as when it was read on entering the line).
        self.holders.clone_from(&named);
        named
    }

    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome> {
        self.lock.break_lock(how, watcher)
    }
}

/// The places of a queue of `places` that may be held, lowest first: those its backend lists
/// in one read (`Backend::slots_present`), else every one.
fn present(queue: &Opener, places: u32) -> Result<Vec<u32>> {
    Ok(queue(None)
        .slots_present(places)?
        .unwrap_or_else(|| (0..places).collect()))
}

/// The waiters of a fair queue of `places`, in their order (`status`): read in one request
/// where the backend can (`Backend::slots_holders`), else each place that may be held.
pub fn waiters(queue: &Opener, places: u32) -> Result<Vec<Holder>> {
    let mut all = match queue(None).slots_holders(places)? {
        Some(all) => all,
        None => {
            let mut all = Vec::new();
            for k in present(queue, places)? {
                all.extend(queue(Some(k)).status()?);
            }
            all
        }
    };
    for h in &mut all {
        h.slot = None;
    }
    all.sort_by_key(|h| h.token.unwrap_or(u64::MAX));
    Ok(all)
}
