//! `backend = "ftp"`: the lock is the directory at `path` on an FTP server, existing exactly
//! while held (seed 000: `MKD` is atomic on vsftpd, pure-ftpd and libunftp).
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PATH/                                   the lock: exists exactly while held
//! PATH/owner~1~NONCE~SEQ~HOST~PID~PPID~START~BOOT~PIDNS~SINCE~PROFILE/
//!                                         empty directory; its *name* is the owner record
//! PARENT/NAME.tomb.NONCE/                 a released or broken lock on its way out
//! PARENT/NAME.state/state~1~TOKEN~CLEAN/   fencing-token state (see `issue_token`)
//! PARENT/NAME.readers/reader~1~.../        shared holders (see `shared.rs`)
//! PARENT/NAME.waiting/place~N~.../         waiters and their numbers of slots (`room.rs`)
//! ```
//! The owner record lives in the marker's *name*, so `NLST PATH` alone reads it: no `RETR`,
//! no `MLST`/`MDTM` (which vsftpd and pure-ftpd lack on directories), no clock on the server.
//! The marker is a directory made by `MKD`, so taking a free lock is two commands on the
//! control connection and no data connection at all (no `STOR`, no transfer type).
//! Only `MKD`, `RMD`, `RNFR`/`RNTO`, `NLST`, `CWD` and `PWD` are used (`DELE` for tidying
//! foreign litter, `LIST` of the parent only to explain a refused `MKD`), which vsftpd,
//! pure-ftpd and libunftp all have.
//!
//! # A refused `MKD`
//! `550` means exists, missing parent, permission or a file in the way, depending on the
//! server (libunftp even says "File not found" for exists). locksmith never reads the text:
//! it lists `PATH` (a lock → busy, judged below), then `CWD`s the parent (missing → config),
//! then tries an `MKD` beside the lock (refused → denied) and looks for a plain file named
//! like the lock in `LIST PARENT` (→ config); otherwise the lock came and went: try again.
//!
//! # Liveness without clock agreement
//! Every heartbeat the holder renames its marker to the next `SEQ` (`RNFR`/`RNTO`; the
//! command also resets the server's idle timer). A waiter on another host breaks the lock
//! only after seeing the directory's listing unchanged for `stale_after` on its own monotonic
//! clock. A waiter on the same host (equal boot id and pid namespace) decides by proof of
//! death at once, as for `mkdir`.
//!
//! # Removal is a claim
//! Whoever `RMD`s the exact marker name — the holder releasing, or a breaker — has the sole
//! right to remove that acquisition: a live holder renames its marker every heartbeat, so a
//! breaker acting on an old observation fails, and no breaker can remove a successor's lock
//! (its marker has another nonce). The claimant then frees the name: `RMD PATH` (empty now),
//! or if something else sits inside, renames `PATH` to a tombstone beside it and tidies that
//! (`DELE` its contents, `RMD`). Later lockers tidy tombstones left by a crash mid-way.
//!
//! # Connection
//! One control connection serves the whole acquisition (log in once: some servers hash
//! passwords slowly), a waiter's place in the waiting room too (`room.rs`); a newcomer's
//! look there, where another number of slots is recorded, opens a second one for a moment.
//! Connect and read timeouts are 10 s while acquiring; while holding, a
//! whole heartbeat (reconnect and login included) must finish within `stale_after`/4 (at most
//! 10 s), so the caller's heartbeat policy can declare the lock lost before a waiter could
//! legally break in. A dropped connection is re-established by the next heartbeat, whose
//! rename proves our marker is still there (gone → `LOST`). Release reconnects if needed.
//! Data connections (`NLST`) get the same connect and read timeouts (a passive stream
//! builder), and connect to the control connection's address whatever `PASV` names.
//!
//! # FTPS
//! `tls = "explicit"`: `AUTH TLS` before login, `PROT P` for data, rustls with ring;
//! certificates are verified against `ca_file` or the system CA bundle. `tls = "implicit"`
//! (port 990 unless given): TLS from the first byte, then `PBSZ 0`/`PROT P` after login.
//!
//! # Limits
//! A lock directory without a marker (a locker killed between its two `MKD`s, or a foreign
//! tool's `MKD`) is broken after `stale_after` of an unchanged listing, by `RMD` alone: it
//! fails if a new holder's marker appeared meanwhile, so no window. A non-empty directory
//! without a marker is broken only by `break --force`.

use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::lock::{Attempt, Backend, Beats, Break, BreakOutcome, Holder, Named, Tried, WaitHint};
use crate::error::{Kind, Result, err};
use crate::log::info;
use crate::watch::Watcher;

mod config;
mod gate;
mod marker;
mod ours;
pub mod probe;
mod room;
mod session;
mod shared;
mod tokens;

pub use config::{FtpConfig, Tls};
use gate::{Gate, Listing};

pub struct Ftp {
    g: Gate,
    heartbeat: Duration,
    /// A shared (reader) lock was asked for (see `shared.rs`).
    shared: bool,
    sh: shared::State,
    /// The last try got no answer: a marker of ours may stand that no one knows of.
    unsure: bool,
    /// The acquisition's place in the lock's waiting room, where this backend keeps it.
    seat: room::Seat,
}

impl Ftp {
    pub fn new(cfg: FtpConfig, profile: &Named) -> Ftp {
        Ftp {
            seat: room::Seat::new(&cfg, profile),
            g: Gate::new(cfg, profile),
            heartbeat: profile.common.heartbeat(),
            shared: profile.common.shared,
            sh: shared::State::default(),
            unsure: false,
        }
    }
}

impl Backend for Ftp {
    fn name(&self) -> &'static str {
        "ftp"
    }

    /// A try whose server did not answer comes back with the backend: its owner record
    /// (nonce) is kept across tries, so a marker of ours that landed without its reply is
    /// found and taken as ours (the gate's, a reader's registration), an empty lock directory
    /// our unanswered `MKD` may have made is removed, and a token rename of ours that landed is
    /// recognised (`Gate::recognise`, `shared::State::register`, `Session::issue_token`).
    ///
    /// A busy try takes or keeps the acquisition's place in the waiting room, a take gives it
    /// back before the OK line (`room.rs`).
    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let tried = self.sh.attempt(&mut self.g, self.shared);
        self.unsure = tried.as_ref().is_err_and(|e| e.kind() == Kind::Unavailable);
        match &tried {
            Ok(Tried::Busy(_)) => {
                let asked = self.g.s.agree.is_some();
                self.seat.busy(&mut self.g.s, self.g.by, asked);
            }
            Ok(Tried::Took(_)) => self.seat.leave(&mut self.g.s),
            Err(_) => {}
        }
        Tried::or_unanswered(tried, self)
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.g.by = by;
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        Ok(WaitHint { poll: true, catches_release: false })
    }

    /// Our place in the waiting room is renamed by a busy try every heartbeat period.
    fn try_within(&self) -> Option<Duration> {
        self.seat.within()
    }

    fn agree_on_slots(&mut self, agree: super::lock::Agree) {
        self.g.s.agree = Some(agree);
    }

    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        let st = self.g.s.read_state()?;
        Ok(Some(st.map_or(1, |(_, s)| s.slots())))
    }

    /// One `NLST` of the directory holding the slots, `PARENT/`: slot K is present while
    /// `NAME.slot-K` (the lock directory, existing exactly while held or being taken) or its
    /// readers `NAME.slot-K.readers` is listed. An FTP server lists what its filesystem holds
    /// at the moment, so a slot held throughout the listing is in it. A server that refuses
    /// the listing: `None`, every slot is read. A fair line's places (`fair.rs`) were otherwise
    /// read one listing each. The wait's deadline bounds it as it bounds a try.
    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        self.g.s.deadline = self
            .g
            .by
            .map(|by| by.max(Instant::now() + super::lock::LAST_BOUND));
        let listed = self.g.s.names_beside();
        self.g.s.deadline = None;
        let Some(names) = listed? else {
            return Ok(None);
        };
        let base = format!("{}.slot-", self.g.s.name());
        let mut v: Vec<u32> = names
            .iter()
            .filter_map(|name| {
                let rest = name.strip_prefix(&base)?;
                // The slot's directory, or its readers'.
                super::slots::slot_named(rest, n, |t| t.is_empty() || t == ".readers")
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        Ok(Some(v))
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.g.wake.fds()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        // The gate read first: a reader registering holds it from before its marker is made
        // until after, so a reader acting before this look is found in one of the two (read
        // the other way round, a reader between the listing and the gate's read was in
        // neither: a `--slots 2` holder then ran beside it, issue 26). Shown readers first:
        // the mode shown is the first holder's.
        let gate = self.g.gate_holders()?;
        let mut holders = self.sh.reader_holders(&mut self.g)?;
        holders.extend(gate);
        Ok(holders)
    }

    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome> {
        let gate = self.g.judge.break_lock(
            &mut Listing {
                s: &mut self.g.s,
                listed: None,
            },
            how,
            watcher,
        )?;
        if let Some(want) = how.token {
            // A token names one exclusive acquisition: readers are never it.
            if !self.sh.reader_holders(&mut self.g)?.is_empty() {
                return Err(err!(
                    Busy,
                    "lock {} is held shared, not by acquisition {want}; nothing broken",
                    self.g.s.url()
                ));
            }
            return Ok(gate);
        }
        let readers = self.sh.break_readers(&mut self.g, how.force, watcher)?;
        Ok(match (gate, readers) {
            (BreakOutcome::Broken(h), _) => BreakOutcome::Broken(h),
            (BreakOutcome::Free, Some(h)) => BreakOutcome::Broken(h),
            (BreakOutcome::Free, None) => BreakOutcome::Free,
        })
    }
}

impl Beats for Ftp {
    fn period(&self) -> Duration {
        self.heartbeat
    }

    fn beat(&mut self, deadline: Instant) -> Result<()> {
        let was_connected = self.g.s.conn.is_some();
        self.g.s.deadline = Some((Instant::now() + self.g.s.hold_timeout()).min(deadline));
        let r = if self.sh.reader.is_some() {
            self.sh.beat_reader(&mut self.g)
        } else {
            self.g.beat()
        };
        self.g.s.deadline = None;
        self.g.s.set_timeout(self.g.s.hold_timeout());
        if r.is_ok() && !was_connected {
            info!("reconnected to {}; the lock is still ours", self.g.s.url());
        }
        r
    }

    fn free(&mut self) -> Result<()> {
        let r = if self.sh.reader.is_some() {
            self.sh.release_reader(&mut self.g)
        } else {
            self.g.release_once()
        };
        r?;
        self.g.s.quit();
        Ok(())
    }
}

impl Drop for Ftp {
    fn drop(&mut self) {
        self.sh.abandon_gate(&mut self.g);
        // A locker that gives up after a try got no answer takes away what that try may have
        // left: our marker (found by our nonce) and its lock directory.
        if self.unsure {
            self.sh.give_back_reader(&mut self.g);
            self.g.give_back();
        }
        // A waiter that stops, or whose other slot took the lock.
        self.seat.leave(&mut self.g.s);
    }
}

