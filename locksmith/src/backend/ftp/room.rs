//! `ftp`'s waiting room (SPEC §3b; `waiting.rs` says what a room is for, docs/LAYOUT.md how
//! this one is laid out): the directory `PARENT/NAME.waiting/` beside the lock, holding an
//! empty directory per waiter named `place~N~TAG~PID~START~NONCE~T` ([`stamped_stem`]: who
//! keeps it, and when it last renamed it).
//!
//! - **On the lock's own connection** ([`Seat`]): the backend of the lock itself (or of its
//!   slot 0) makes the place in its second busy try — after a whole busy try, which judged our
//!   number where N > 1; not under `--wait 0` — renames it to a new T in a busy try once a heartbeat period has
//!   passed (it asks to be tried that often: `try_within`), and removes it (`RMD`, then `RMD`
//!   of the room, which fails while other places are in it) when it takes the lock, before
//!   the OK line, or when the acquisition stops waiting or another slot of it took the lock.
//!   No connection of its own: a server that limits its clients (pure-ftpd: 50 by default)
//!   would refuse a waiter's second login.
//! - FTP servers give no clock (the lock's own liveness is judged by observation over
//!   `stale_after`, which a one-shot look cannot do): a place's age is judged by the looker's
//!   clock against T, with slack ([`judge_stamped`]). A name that is not a place's is ignored.
//! - A joiner first removes up to [`TIDIED`](crate::backend::room::TIDIED) places that do not live (`RMD` of the exact
//!   name: a live waiter's rename since makes it fail, as a claim on a marker does); a
//!   killed waiter's place stays until the next waiter comes.
//! - A contender looks ([`FtpRoom`], the lock's `Keeper`: a connection of its own for a
//!   moment, and one `NLST`) only where the lock records another number than its own, or a
//!   reader where it records more than one: a waiter of one slot behind readers is not kept
//!   from a newcomer of the number recorded.

use std::time::{Duration, Instant};

use super::config::FtpConfig;
use super::session::{ACQUIRE_TIMEOUT, Session};
use crate::backend::lock::{Named, request_by};
use crate::backend::room::{Keeper, Place, judge_stamped, other_number, stamped, stamped_stem, tidy};
use crate::error::{Kind, Result, err};
use crate::log::{debug, info};

/// How long giving a place back may take (a waiter giving up is past its deadline by it).
const LEAVING: Duration = Duration::from_secs(1);

/// `PATH.waiting` of the lock (the lock's, whatever slot `cfg` is of).
fn room_of(cfg: &FtpConfig) -> String {
    format!("{}.waiting", cfg.slot_of.as_deref().unwrap_or(&cfg.path))
}

/// The places in room `dir`: each name with its number of slots and whether it lives
/// ([`judge_stamped`]).
fn places(s: &mut Session, dir: &str, stale_after: Duration) -> Result<Vec<(String, u32, bool)>> {
    Ok(s.entries(dir)?
        .into_iter()
        .filter_map(|name| {
            let (n, live) = judge_stamped(&name, stale_after)?;
            Some((name, n, live))
        })
        .collect())
}

/// The room of an ftp lock, as a newcomer looks at it (`slots.rs`'s `agreement`). The places
/// are taken by the lock's own backend ([`Seat`]), not through this keeper.
pub struct FtpRoom {
    /// The lock's own settings.
    cfg: FtpConfig,
    stale_after: Duration,
}

impl FtpRoom {
    pub fn new(cfg: &FtpConfig, named: &Named) -> FtpRoom {
        FtpRoom {
            cfg: cfg.clone(),
            stale_after: named.common.stale_after,
        }
    }
}

impl Keeper for FtpRoom {
    /// None here: the lock's backend takes the place on its own connection ([`Seat`]).
    fn join(&self, _n: u32, _by: Option<Instant>) -> Result<Option<Box<dyn Place>>> {
        Ok(None)
    }

    /// A connection of its own and one `NLST`, all by one request bound.
    fn other_than(&self, n: u32, lock: &str, by: Option<Instant>) -> Option<u32> {
        let mut s = Session::new(self.cfg.clone(), self.stale_after, 1);
        let found = s.bounded(request_by(ACQUIRE_TIMEOUT, by), |s| {
            places(s, &room_of(&self.cfg), self.stale_after)
        });
        // Dropped without a `QUIT`, whose answer could outlast the bound.
        drop(s);
        other_number(found, n, lock)
    }

    /// A connection and a listing: only where another number is recorded.
    fn cheap(&self) -> bool {
        false
    }
}

/// An acquisition's place in the room, kept by one of its backends on that backend's
/// control connection (see the module's docs).
pub(super) struct Seat {
    /// `PATH.waiting`.
    dir: String,
    /// `place~N~TAG~PID~START~NONCE`: the name but for its T (made when first written: most
    /// backends opened never keep a place).
    stem: String,
    n: u32,
    acquisition: String,
    /// The lock as messages name it.
    lock: String,
    /// Whether this backend keeps the acquisition's place: the lock itself or its slot 0,
    /// in a wait (not `--wait 0`).
    keeps: bool,
    /// The busy tries seen: the place is taken at the second.
    busy: u32,
    /// The place's paths that may exist, the one in use last: a command whose reply was lost
    /// (a `MKD`, a rename) may have landed, and is given back too. Empty: no place.
    names: Vec<String>,
    /// When it was last written (tried).
    written: Option<Instant>,
    /// Joining failed for good in this wait.
    refused: bool,
    heartbeat: Duration,
    stale_after: Duration,
}

impl Seat {
    pub(super) fn new(cfg: &FtpConfig, named: &Named) -> Seat {
        let first = match &cfg.slot_of {
            None => true,
            Some(lock) => cfg.path == format!("{lock}.slot-0"),
        };
        let waits = !matches!(named.common.wait, crate::settings::Wait::For(d) if d.is_zero());
        Seat {
            dir: room_of(cfg),
            stem: String::new(),
            n: named.common.slots.max(1),
            acquisition: named.acquisition.clone(),
            lock: named.name.clone(),
            keeps: first && waits,
            busy: 0,
            names: Vec::new(),
            written: None,
            refused: false,
            heartbeat: named.common.heartbeat(),
            stale_after: named.common.stale_after,
        }
    }

    /// After a busy try of ours on `s` (`asked`: the lock's number is asked about ours,
    /// which a fair line's place is not): the second takes our place, later ones keep it once
    /// a heartbeat period passed. Bounded as a request of the wait (`by`); a failure is said
    /// at `-v` and the wait goes on (unrecorded, where the room refuses us).
    pub(super) fn busy(&mut self, s: &mut Session, by: Option<Instant>, asked: bool) {
        if !self.keeps || !asked || self.refused {
            return;
        }
        self.busy = self.busy.saturating_add(1);
        let joining = self.names.is_empty();
        if joining && self.busy < 2 {
            return;
        }
        if !joining && self.written.is_some_and(|w| w.elapsed() < self.heartbeat) {
            return;
        }
        let r = s.bounded(request_by(ACQUIRE_TIMEOUT, by), |s| {
            if joining {
                self.tidy(s)?;
            }
            self.write(s)
        });
        match r {
            Ok(()) if joining => debug!("lock {}: waiting in its waiting room", self.lock),
            Ok(()) => {}
            Err(e) => {
                debug!(
                    "lock {}: its waiting room: {e}; a contender of another number of slots \
                     may not be told of this waiter",
                    self.lock
                );
                self.refused |= e.kind() != Kind::Unavailable;
            }
        }
    }

    /// How soon our place must be renamed again; `None`: we keep none. Never less than a
    /// quarter period: a try that does not reach us (unanswered, or another slot's) renames
    /// nothing, and must not make the wait spin — a place lives for twice `stale_after`.
    pub(super) fn within(&self) -> Option<Duration> {
        if self.names.is_empty() || self.refused {
            return None;
        }
        let since = self.written.map_or(self.heartbeat, |w| w.elapsed());
        Some(
            self.heartbeat
                .saturating_sub(since)
                .max(self.heartbeat / 4),
        )
    }

    /// Removes up to [`TIDIED`](crate::backend::room::TIDIED) places that do not live ([`tidy`]).
    fn tidy(&mut self, s: &mut Session) -> Result<()> {
        let found = places(s, &self.dir, self.stale_after)?;
        tidy(found, |name| {
            let path = format!("{}/{name}", self.dir);
            let gone = s.cmd("RMD", |c| c.rmdir(path.as_str()))?.is_ok();
            if gone {
                info!("removed a dead waiter's place {path}");
            }
            Ok(gone)
        })
    }

    /// Makes the place, or renames it to a new T (made again where it is gone: a joiner
    /// whose clock judged it dead, say).
    fn write(&mut self, s: &mut Session) -> Result<()> {
        self.written = Some(Instant::now());
        if self.stem.is_empty() {
            self.stem = stamped_stem(self.n, &self.acquisition);
        }
        let next = format!("{}/{}", self.dir, stamped(&self.stem));
        if let Some(old) = self.names.last().cloned() {
            if old == next {
                return Ok(());
            }
            self.names.push(next.clone());
            // Renamed: `old` was there, so every earlier name (a rename whose reply was lost
            // landed) is gone. Refused: `old` is not there (a joiner removed it).
            let renamed = s.cmd("RNFR/RNTO", |c| c.rename(old.as_str(), next.as_str()))?;
            self.names.pop();
            if renamed.is_ok() {
                self.names = vec![next];
                return Ok(());
            }
            self.names.retain(|n| *n != old);
        }
        // The room itself first where it is not there (its last waiter removes it, so a
        // leaver may remove it between our two `MKD`s: tried again later).
        let mut room_made = false;
        for _ in 0..3 {
            if !self.names.contains(&next) {
                self.names.push(next.clone());
            }
            if s.cmd("MKD", |c| c.mkdir(next.as_str()))?.is_ok() {
                return Ok(());
            }
            let dir = self.dir.clone();
            room_made |= s.cmd("MKD", |c| c.mkdir(dir.as_str()))?.is_ok();
        }
        self.names.retain(|n| *n != next);
        let why = format!("cannot make a place in waiting room {} ({})", self.dir, s.url());
        Err(if room_made {
            err!(Unavailable, "{why}: its other waiters left meanwhile")
        } else {
            err!(Denied, "{why}")
        })
    }

    /// Gives our place back: `RMD` of each name it may have, the one in use first (once more
    /// if the connection broke), then of the room, which fails while other places are in it — the room goes
    /// with its last place. All by [`LEAVING`]; what stays is tidied by the next waiter.
    pub(super) fn leave(&mut self, s: &mut Session) {
        if self.names.is_empty() {
            return;
        }
        let names = std::mem::take(&mut self.names);
        let left = s.bounded(Instant::now() + LEAVING, |s| {
            let mut left = Vec::new();
            for name in names.into_iter().rev() {
                let mut gone = s.cmd("RMD", |c| c.rmdir(name.as_str()));
                if gone.is_err() {
                    gone = s.cmd("RMD", |c| c.rmdir(name.as_str()));
                }
                match gone {
                    Ok(Ok(())) => {}
                    Ok(Err((_, text))) => debug!("our place {name}: RMD: {text}"),
                    Err(e) => left.push(format!("{name} ({e})")),
                }
            }
            if left.is_empty() {
                let dir = self.dir.clone();
                let _ = s.cmd("RMD", |c| c.rmdir(dir.as_str()));
            }
            left
        });
        if !left.is_empty() {
            info!(
                "cannot give back our place in the waiting room of lock {}: {}; it stays \
                 until the next waiter finds it silent",
                self.lock,
                left.join(", ")
            );
        }
    }
}
