//! Shared (reader) locks over FTP, with writer preference, using only `MKD`, `RMD`,
//! `RNFR`/`RNTO`, `CWD` and `NLST`.
//!
//! # Layout
//! ```text
//! PATH/                          the gate: the exclusive lock, as without readers
//! PARENT/NAME.readers/           reader registrations (exists while readers may be inside)
//! PARENT/NAME.readers/reader~1~NONCE~SEQ~HOST~PID~...~PROFILE/
//!                                one reader: the owner-marker record, renamed every heartbeat
//! ```
//! # Protocol
//! - A **reader** takes the gate exactly as an exclusive locker would (so it waits behind a
//!   writer, and a dead gate holder is broken as usual), registers its marker in
//!   `NAME.readers` (`MKD`; that directory is made first if missing), and releases the gate
//!   at once, keeping its logged-in connection. It holds while its marker exists: it renames
//!   the marker every heartbeat (gone → `LOST`) and its release is the `RMD` of its marker.
//! - A **writer** takes the gate and keeps it: from then on no reader can register. It then
//!   waits for the registered readers to drain, heartbeating the gate meanwhile; readers it
//!   can prove dead (same host) or that stay unrenamed for `stale_after` on its own clock are
//!   removed by the exact name (a live reader's heartbeat renames its marker, so a claim on
//!   an old name fails). When none are left it removes the empty `NAME.readers` and holds.
//!   If it gives up waiting, dropping the backend frees the gate.
//! - Writer preference: a waiting writer that got the gate holds back every new reader;
//!   readers hold the gate only for three commands, so a writer polling for it gets it.
//! - `NAME.readers` is only created or removed under the gate, so a writer's `RMD` of it can
//!   never race a registration; leaving readers remove only their own marker.

use super::gate::Gate;
use super::marker::parse_reader;
use super::ours::{Ours, Place};
use super::session::Session;
use crate::backend::lock::{Break, BreakOutcome, Grant, Holder, Tried};
use crate::backend::owner::Parsed;
use crate::backend::stale::{Evidence, Holders};
use crate::error::{Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::watch::Watcher;

/// Shared-lock state of one backend value.
#[derive(Default)]
pub(super) struct State {
    pub(super) reader: Option<Ours>,
    /// A writer holding the gate while readers drain: the grant it will hand out.
    pub(super) draining: Option<Grant>,
    /// A reader registration of ours went unanswered and may have landed (issue 27): the
    /// next registration looks for it by our nonce, and a reader giving up takes it away.
    pub(super) unsure: bool,
}

fn reader_holder(name: &str) -> Holder {
    let mut h = match parse_reader(name) {
        Some((rec, _)) => rec.holder(),
        None => Parsed::Foreign(name.to_string()).holder(),
    };
    h.mode = Some(Mode::Shared);
    h
}

impl State {
    /// One attempt in the profile's mode (the gate alone is `Gate::try_gate`).
    pub(super) fn attempt(&mut self, g: &mut Gate, shared: bool) -> Result<Tried> {
        if shared {
            self.try_reader(g)
        } else {
            self.try_writer(g)
        }
    }

    fn try_reader(&mut self, g: &mut Gate) -> Result<Tried> {
        let mut grant = match g.try_gate()? {
            Tried::Busy(h) => return Ok(Tried::Busy(h)),
            Tried::Took(g) => g,
        };
        // The write epoch: the last exclusive token (0 before the first), read under the
        // gate so that no writer is between its token and its hold.
        let registered = g.s.read_state().and_then(|st| {
            grant.token = Some(st.as_ref().map_or(0, |(_, s)| s.token));
            grant.recorded_slots = Some(st.as_ref().map_or(1, |(_, s)| s.slots()));
            grant.prev_crashed |= st.is_some_and(|(_, s)| !s.clean);
            self.register(g)
        });
        // The gate goes whatever happened: readers never keep it.
        let gate = self.release_gate(g);
        registered?;
        if let Err(e) = gate {
            // Registered, but the gate may still stand: we hold shared regardless (a stuck
            // gate only delays others until it is broken as stale).
            debug!("releasing the gate after registering: {e}");
        }
        Ok(Tried::Took(grant))
    }

    /// Registers our reader marker (under the gate).
    fn register(&mut self, g: &mut Gate) -> Result<()> {
        let dir = g.s.readers_dir();
        // The acquisition's record, kept across tries: a registration of ours whose reply was
        // lost is found by its nonce.
        let ours = Ours::new(Place::Reader, g.record());
        let target = ours.path(&g.s);
        let mut refusal = None;
        for _ in 0..2 {
            let was_unsure = self.unsure;
            self.unsure = true;
            match g.s.cmd("MKD", |c| c.mkdir(target.as_str()))? {
                Ok(()) => {
                    self.unsure = false;
                    self.reader = Some(ours);
                    return Ok(());
                }
                Err(r) => {
                    self.unsure = was_unsure;
                    refusal = Some(r);
                }
            }
            if self.unsure
                && let Some((name, seq)) = ours.find(&mut g.s)?
            {
                // Ours, made by a registration whose reply was lost: renamed at once (writers
                // count a reader's silence from now).
                let mut found = Ours::found(Place::Reader, ours.rec.clone(), name, seq);
                found.beat(&mut g.s)?;
                info!(
                    "shared lock {}: a reader marker of ours whose reply was lost is there; it is ours",
                    g.s.url()
                );
                self.unsure = false;
                self.reader = Some(found);
                return Ok(());
            }
            // Act, then look: the usual refusal is a missing `NAME.readers`.
            let _ = g.s.cmd("MKD", |c| c.mkdir(dir.as_str()))?;
        }
        let (code, text) = refusal.expect("refused above");
        Err(err!(
            Denied,
            "cannot register a reader of {} in {dir}: {text} (code {code})",
            g.s.url()
        ))
    }

    /// Frees the gate after registering, keeping the logged-in connection.
    fn release_gate(&mut self, g: &mut Gate) -> Result<()> {
        g.release_once()
    }

    fn try_writer(&mut self, g: &mut Gate) -> Result<Tried> {
        if self.draining.is_some() {
            // Still ours? A heartbeat renames the gate's marker (so no one judges it
            // silent while we wait for readers) and tells us if it was broken.
            g.s.deadline = None;
            match g.beat() {
                Ok(()) => {}
                Err(e) if e.kind() == Kind::Lost => {
                    info!("{e}; trying again");
                    self.draining = None;
                    g.ours = None;
                }
                Err(e) => return Err(e),
            }
        }
        if self.draining.is_none() {
            match g.try_gate()? {
                Tried::Busy(h) => return Ok(Tried::Busy(h)),
                Tried::Took(g) => self.draining = Some(g),
            }
        }
        let readers = self.drain(g)?;
        if readers.is_empty() {
            let mut grant = self.draining.take().expect("set above");
            // A reader that died holding did not release cleanly either.
            grant.prev_crashed |= g.judge.grant(&mut g.wake, None).prev_crashed;
            if let Err(e) = g.stamp_token(&mut grant) {
                // No token, no lock: free the gate rather than hold without one.
                let _ = g.release_once();
                return Err(e);
            }
            return Ok(Tried::Took(grant));
        }
        Ok(Tried::Busy(readers))
    }

    /// With the gate held: removes dead and silent readers (`stale.rs`'s rule); the live
    /// ones remain. Empty: `NAME.readers` is gone (or never was) — settled only by an `RMD`
    /// of it that was done, or by a listing of the parent without it: libunftp has refused
    /// `CWD`, `NLST` and `RMD` spuriously under load, and no refusal may make a writer
    /// overlook a reader or leave the directory behind.
    fn drain(&mut self, g: &mut Gate) -> Result<Vec<Holder>> {
        let dir = g.s.readers_dir();
        let mut readers = Readers {
            s: &mut g.s,
            dir,
        };
        match readers.remove_dir()? {
            Some(true) => {
                debug!("drain: {} is gone: no readers", readers.dir);
                return Ok(Vec::new());
            }
            Some(false) => {}
            None => {
                debug!(
                    "drain: RMD {} and the listing of its parent refused: looking again",
                    readers.dir
                );
                return Ok(vec![Holder::default()]);
            }
        }
        Ok(g
            .judge
            .clear_dead(&mut readers, &mut g.wake)?
            .unwrap_or_default())
    }

    /// A reader's heartbeat: rename our marker to the next sequence number.
    pub(super) fn beat_reader(&mut self, g: &mut Gate) -> Result<()> {
        match self.reader.as_mut() {
            Some(r) => r.beat(&mut g.s),
            None => Err(err!(Lost, "shared lock {} is not ours", g.s.url())),
        }
    }

    /// A reader's release: the `RMD` of its marker. An error other than `Lost` keeps it
    /// registered: the caller retries.
    pub(super) fn release_reader(&mut self, g: &mut Gate) -> Result<()> {
        let Some(r) = self.reader.as_mut() else {
            return Ok(());
        };
        match r.claim(&mut g.s) {
            Err(e) if e.kind() != Kind::Lost => Err(e),
            claimed => {
                self.reader = None;
                claimed.map(drop)
            }
        }
    }

    /// The registered readers, without changing anything.
    pub(super) fn reader_holders(&mut self, g: &mut Gate) -> Result<Vec<Holder>> {
        let dir = g.s.readers_dir();
        Ok(g
            .s
            .entries(&dir)?
            .iter()
            .map(|n| reader_holder(n))
            .collect())
    }

    /// `break` of the readers (the gate is free or was just broken): removes dead and
    /// silent readers, refuses live ones unless `force`.
    pub(super) fn break_readers(
        &mut self,
        g: &mut Gate,
        force: bool,
        watcher: &mut Watcher,
    ) -> Result<Option<Holder>> {
        let dir = g.s.readers_dir();
        let mut readers = Readers {
            s: &mut g.s,
            dir,
        };
        Ok(
            match g.judge.break_lock(&mut readers, Break { force, token: None }, watcher)? {
                BreakOutcome::Free => None,
                BreakOutcome::Broken(h) => Some(h),
            },
        )
    }

    /// A reader giving up after an unanswered registration: its marker, if it landed, is
    /// claimed (best effort, on a short bound: what stays is broken as stale later).
    pub(super) fn give_back_reader(&mut self, g: &mut Gate) {
        if !self.unsure || self.reader.is_some() {
            return;
        }
        g.s.deadline = Some(std::time::Instant::now() + std::time::Duration::from_secs(2));
        let ours = Ours::new(Place::Reader, g.record());
        if let Ok(Some((name, seq))) = ours.find(&mut g.s) {
            let mut found = Ours::found(Place::Reader, ours.rec.clone(), name, seq);
            match found.claim(&mut g.s) {
                Ok(_) => info!("gave back a reader registration of ours whose reply was lost"),
                Err(e) => info!("a reader registration of ours whose reply was lost stays until it is stale ({e})"),
            }
        }
        g.s.deadline = None;
    }

    /// A writer that gave up while readers drained frees the gate (best effort: if this
    /// fails, the gate is broken as stale later).
    pub(super) fn abandon_gate(&mut self, g: &mut Gate) {
        if self.draining.take().is_some() {
            match g.release_once() {
                Ok(()) => debug!(
                    "gave up waiting for readers; gate of {} freed",
                    g.s.url()
                ),
                Err(e) => debug!("gave up waiting for readers; freeing the gate: {e}"),
            }
            g.s.quit();
        }
    }
}

/// The readers registered in `NAME.readers`, as the judge (`stale.rs`) sees them: each is its
/// marker, renamed at every heartbeat (the sign is its name; removing that exact name is the
/// claim, which fails once a live reader renamed it).
struct Readers<'a> {
    s: &'a mut Session,
    dir: String,
}

impl Readers<'_> {
    /// Removes `NAME.readers`. `Some(true)`: it is gone (removed now, or not in its parent's
    /// listing: missing, as for every exclusive-only lock). `Some(false)`: `RMD` refused while
    /// the parent lists it — readers are inside, or an entry our listing did not show (libunftp
    /// has answered a listing without entries that were there), or the refusal was spurious.
    /// `None`: the parent's listing was refused too. A writer holds only on `Some(true)`.
    fn remove_dir(&mut self) -> Result<Option<bool>> {
        let dir = self.dir.clone();
        if self.s.cmd("RMD", |c| c.rmdir(dir.as_str()))?.is_ok() {
            return Ok(Some(true));
        }
        Ok(self.s.listed_beside(".readers")?.map(|listed| !listed))
    }
}

impl Holders for Readers<'_> {
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        let names = self.s.entries(&self.dir)?;
        if names.is_empty() {
            return Ok(if self.remove_dir()? == Some(true) {
                None
            } else {
                debug!(
                    "{} lists nothing but cannot be removed: looking again",
                    self.dir
                );
                Some(Vec::new())
            });
        }
        Ok(Some(
            names
                .into_iter()
                .map(|n| {
                    let (key, record) = match parse_reader(&n) {
                        Some((rec, _)) => (rec.nonce.clone(), Parsed::V1(rec)),
                        None => (n.clone(), Parsed::Foreign(n.clone())),
                    };
                    Evidence {
                        key: key.into(),
                        record: Some(record),
                        sign: n.into_bytes(),
                        mode: Mode::Shared,
                        age: None,
                    }
                })
                .collect(),
        ))
    }

    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let name = String::from_utf8_lossy(&ev.sign);
        let target = format!("{}/{name}", self.dir);
        self.s.remove_marker(&target)
    }

    /// The last reader removed: `NAME.readers` goes too (or they are not all gone).
    fn finish(&mut self) -> Result<bool> {
        Ok(self.remove_dir()? == Some(true))
    }
}
