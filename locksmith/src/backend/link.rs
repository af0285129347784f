//! `backend = "link"`: a lock *file* made with `link(2)` (seed 002, done right), safe on
//! network filesystems.
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PARENT/NAME                    the lock file: exists exactly while held; content = owner
//!                                record + heartbeat counter (a heartbeat record, lockdir.rs)
//! PARENT/.NAME.<nonce>.<host>.<pid>.<start>.tmp
//!                                a would-be lock file, hard-linked to NAME, then removed; its
//!                                maker named (`.NAME.<nonce>.tmp` where that would be too long)
//! PARENT/.NAME.break             held (same scheme) by the one waiter breaking a dead lock
//! PARENT/.NAME.state/            the state: one entry state~1~TOKEN~CLEAN (`lockdir::state`)
//! ```
//! To acquire, write the owner record into a unique temp file beside the lock, `link(2)` it to
//! NAME, remove the temp file, and judge success by **what NAME holds, read fresh**: our
//! nonce or not. Neither `link(2)`'s answer (NFS may say EEXIST after a retransmitted,
//! successful request; sshfs says EPERM when another racer won) nor the link count (sshfs
//! reports 1 for a file the server holds twice) is trusted. The heartbeat rewrites the
//! counter in NAME in place — through a descriptor whose content it has just checked is
//! ours — so waiters on other hosts see it change with a fresh read.
//!
//! # Breaking
//! The rule is `stale.rs`'s. A breaker takes `.NAME.break` (the same link scheme), re-reads
//! NAME fresh, and unlinks it only if it still holds exactly the content it judged; so two
//! breakers never both win and no breaker removes a successor's lock. A breaker's guard left
//! by its death is removed by proof of death, or once unchanged for `stale_after`.
//!
//! # Limits
//! Release and break re-read NAME, then unlink it: a holder paused for longer than
//! `stale_after` exactly between the two could remove a successor's lock (the honest limit of
//! every lease; fencing tokens exist for it). On NFS a reader holding NAME open while it is
//! unlinked only leaves a `.nfsXXXX` file behind; the name is free at once.

use std::ffi::{OsStr, OsString};
use std::os::fd::BorrowedFd;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};

use super::faults;
use super::filelock::{FileLock, Scheme, Take};
use super::lock::NotReleased;
use super::lock::{Holder, Named};
use super::lockdir::probe::Scheme as Probe;
use super::lockdir::state::Issued;
use super::lockdir::leftover::Unpublished;
use super::lockdir::{self, FsConfig, LockDir};
use super::owner::Record;
use super::stale::{Evidence, Holders, Observations};
use crate::error::{Error, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;


/// The link backend: the file-lock template with this file's naming.
pub type Link = FileLock<Files>;

/// The lock's files: what the judge sees and removes.
pub struct Files {
    profile: String,
    dir: LockDir,
    /// What we saw of a breaker's guard, and since when.
    guard_seen: Observations,
    /// This attempt's `link(2)` failed with nothing at NAME: the filesystem may refuse hard
    /// links (said if the attempt ends with nobody holding the lock).
    refused: Option<Errno>,
}

/// What `link(2)` made of an attempt.
enum Linked {
    /// NAME holds our record.
    Ours,
    /// NAME holds something else.
    Taken,
    /// Nothing is at NAME, yet link(2) failed with this: the filesystem may refuse hard links.
    Refused(Errno),
}


impl Files {
    /// Writes `rec` into a fresh temp file, links it to `target`, removes the temp file and
    /// reads `target` back.
    fn link_new(&mut self, rec: &Record, target: &OsString) -> Result<Linked> {
        let tmp = self.dir.unpublished_name(rec, ".tmp");
        let path = self.dir.path.clone();
        if self
            .dir
            .create_file(None, &tmp, &rec.render_beat(0))?
            .is_none()
        {
            return Err(err!(
                Io,
                "cannot create a lock file beside {}: {} exists",
                path.display(),
                self.dir.shown(&tmp).display()
            ));
        }
        faults::stall(faults::Stall::Publishing);
        let parent = self.dir.fd()?;
        let r = linkat(
            parent,
            tmp.as_os_str(),
            parent,
            target.as_os_str(),
            AtFlags::empty(),
        );
        let _ = unlinkat(parent, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        match r {
            // EPERM/ENOENT: what sshfs answers when a racer's link won (SFTP's generic
            // failure); whoever won, the name's content says.
            Ok(()) | Err(Errno::EEXIST | Errno::EPERM | Errno::ENOENT | Errno::ESTALE) => {}
            Err(e) => return Err(Error::path("cannot create lock", &path, e.into())),
        }
        Ok(match self.dir.read_file(target)? {
            Some((content, _)) if lockdir::is_ours(&content, rec) => Linked::Ours,
            Some(_) => Linked::Taken,
            // Gone again at once (released, or another breaker's guard): look again.
            None => match r {
                Err(e) if e != Errno::EEXIST => Linked::Refused(e),
                _ => Linked::Taken,
            },
        })
    }

    /// Removes NAME if it still holds exactly `content` (read fresh). `Ok(false)`: it does
    /// not (any more).
    fn unlink_if(&mut self, name: &OsString, content: &[u8]) -> Result<bool> {
        match self.dir.read_file(name)? {
            Some((now, _)) if now == content => {}
            _ => return Ok(false),
        }
        match unlinkat(self.dir.fd()?, name.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(Error::path(
                "cannot remove",
                &self.dir.shown(name),
                e.into(),
            )),
        }
    }

    /// Takes `.NAME.break`, the one breaker's guard. `Ok(None)`: another breaker has it
    /// (a dead or silent one's guard is removed on the way; try again later).
    fn take_guard(&mut self) -> Result<Option<Record>> {
        let guard = self.dir.beside(".break");
        let me = Record::ours(&self.profile);
        match self.link_new(&me, &guard)? {
            Linked::Ours => {
                self.guard_seen.forget(&guard);
                return Ok(Some(me));
            }
            // Refused with nothing there: a racing breaker came and went (sshfs answers
            // EPERM); the lock's own acquisition reports a filesystem without hard links.
            Linked::Refused(_) | Linked::Taken => {}
        }
        let Some((content, _)) = self.dir.read_file(&guard)? else {
            return Ok(None);
        };
        let dead = self
            .guard_seen
            .abandoned(&guard, &lockdir::parse(&content), &content);
        if dead && self.unlink_if(&guard, &content)? {
            info!(
                "removed the abandoned break guard {} (its breaker died or went silent)",
                self.dir.shown(&guard).display()
            );
            self.guard_seen.forget(&guard);
        }
        Ok(None)
    }

    /// Removes the would-be lock files (`.NAME.<nonce>….tmp`, of every slot) that lockers
    /// killed between making one and removing it left, where the maker is provably dead
    /// ([`LockDir::remove_dead_makers`]): one listing of the parent, in one acquisition of 16
    /// ([`lockdir::tidies`]), as mkdir's unpublished directories.
    fn tidy_leftovers(&mut self, ours: &str) {
        let left = self
            .dir
            .leftovers(&[".tmp"])
            .into_iter()
            .filter_map(|l| Unpublished::parse(&l.middle).map(|u| (l.name, u)))
            .collect();
        let record = |parent: BorrowedFd<'_>, name: &OsStr, _: &str| {
            lockdir::read_record(parent, name, Path::new(name))
                .ok()
                .flatten()
                .map(|(content, _)| lockdir::parse(&content))
        };
        let remove = |parent: BorrowedFd<'_>, name: &OsString| {
            unlinkat(parent, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
        };
        self.dir.remove_dead_makers(left, ours, record, remove);
    }

    fn drop_guard(&mut self, me: &Record) {
        let guard = self.dir.beside(".break");
        if let Ok(Some((content, _))) = self.dir.read_file(&guard)
            && lockdir::is_ours(&content, me)
        {
            let _ = self.unlink_if(&guard, &content);
        }
    }
}

impl Holders for Files {
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        let name = self.dir.name.clone();
        Ok(self.dir.read_file(&name)?.map(|(content, _)| {
            let text = String::from_utf8_lossy(&content);
            vec![Evidence {
                key: name,
                record: (!text.trim().is_empty()).then(|| lockdir::parse(&content)),
                // What a waiter compares between looks: the content, read fresh (ours: the
                // record with its heartbeat counter).
                sign: content,
                mode: Mode::Exclusive,
                age: None,
            }]
        }))
    }

    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let Some(me) = self.take_guard()? else {
            return Ok(false);
        };
        let name = self.dir.name.clone();
        let r = self.unlink_if(&name, &ev.sign);
        self.drop_guard(&me);
        r
    }
}

impl Files {
    /// NAME's content if it still holds `rec` (read fresh).
    fn still_ours(&mut self, rec: &Record) -> Result<Option<Vec<u8>>> {
        let name = self.dir.name.clone();
        Ok(match self.dir.read_file(&name)? {
            Some((content, _)) if lockdir::is_ours(&content, rec) => Some(content),
            _ => None,
        })
    }

    /// Holding: exactly the fencing token our record names, the state marked "not cleanly
    /// released" until our release says otherwise (`Some`: as issued). `Ok(None)`: the
    /// state moved past it (someone took and released the lock since we read it, or we
    /// stalled here and were broken): NAME is given back if it still holds our record, and
    /// the caller looks again.
    fn finish_create(&mut self, rec: &Record) -> Result<Option<Issued>> {
        let token = rec.token.unwrap_or(0);
        let Some(issued) = self.dir.issue_token_exactly(token)? else {
            debug!(
                "fencing token {token} was overtaken while we took {}: giving it back",
                self.dir.path.display()
            );
            let name = self.dir.name.clone();
            self.unlink_if(&name, rec.render_beat(0).as_bytes())?;
            return Ok(None);
        };
        Ok(Some(issued))
    }
}

impl Scheme for Files {
    /// Our record and its heartbeat counter.
    type Held = (Record, u64);
    const NAME: &'static str = "link";
    const PROBE: Probe = Probe::Link;
    const SHARED: bool = false;

    fn new(cfg: &FsConfig, lock: &Named) -> Files {
        Files {
            profile: lock.name.to_string(),
            dir: LockDir::new(cfg, &lock.common),
            guard_seen: Observations::new(lock.common.stale_after),
            refused: None,
        }
    }

    fn dir(&self) -> &LockDir {
        &self.dir
    }

    fn dir_mut(&mut self) -> &mut LockDir {
        &mut self.dir
    }

    fn take(&mut self) -> Result<Take<(Record, u64)>> {
        let name = self.dir.name.clone();
        let exists = {
            let parent = self.dir.fd()?;
            nix::sys::stat::fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
        };
        if exists {
            return Ok(Take::Taken);
        }
        let mut rec = Record::ours(&self.profile);
        rec.token = Some(self.dir.next_token()?);
        match self.link_new(&rec, &name)? {
            Linked::Ours => match self.finish_create(&rec) {
                Ok(Some(issued)) => {
                    self.refused = None;
                    if lockdir::tidies(rec.token) {
                        self.tidy_leftovers(&rec.nonce);
                    }
                    Ok(Take::Held((rec, 0), Some(issued)))
                }
                Ok(None) => Ok(Take::Again), // overtaken: look again
                Err(e) => {
                    let content = rec.render_beat(0);
                    let _ = self.unlink_if(&name, content.as_bytes());
                    Err(e)
                }
            },
            Linked::Refused(e) => {
                self.refused = Some(e);
                Ok(Take::Taken)
            }
            Linked::Taken => Ok(Take::Taken),
        }
    }

    fn busy(&mut self, holders: Vec<Holder>) -> Result<Vec<Holder>> {
        if holders.is_empty()
            && let Some(e) = self.refused.take()
        {
            // Refused with nobody there: not a race lost but a filesystem without hard links.
            if lockdir::call_missing(e) {
                return Err(lockdir::missing_call(
                    Self::NAME,
                    "link",
                    &self.dir.path,
                    self.dir.fs_name(),
                    e,
                ));
            }
            return Err(Error::path(
                "cannot create lock (does this filesystem support hard links?)",
                &self.dir.path,
                e.into(),
            ));
        }
        self.refused = None;
        Ok(holders)
    }

    fn failed(&mut self) {
        self.refused = None;
    }

    fn beat(&mut self, held: &mut (Record, u64)) -> Result<()> {
        let (rec, n) = held;
        let (name, path) = (self.dir.name.clone(), self.dir.path.clone());
        let (at, remote) = self.dir.fd_remote()?;
        if !lockdir::write_beat(at, &name, &path, rec, *n + 1, remote)? {
            return Err(err!(
                Lost,
                "lock {} was broken: it no longer holds our record",
                path.display()
            ));
        }
        *n += 1;
        Ok(())
    }

    fn release(&mut self, held: (Record, u64)) -> std::result::Result<(), NotReleased<(Record, u64)>> {
        let path = self.dir.path.clone();
        let content = match self.still_ours(&held.0) {
            Ok(Some(c)) => c,
            Ok(None) => {
                return Err(NotReleased::done(err!(
                    Lost,
                    "lock {} was broken while held: it no longer holds our record",
                    path.display()
                )));
            }
            // Nothing done yet: the caller may retry.
            Err(error) => {
                return Err(NotReleased {
                    error,
                    retry: Some(held),
                });
            }
        };
        if let Some(token) = held.0.token
            && let Err(e) = self.dir.mark_clean(token)
        {
            info!("{e}; the next holder will see prev=crashed");
        }
        let name = self.dir.name.clone();
        if !self.unlink_if(&name, &content).map_err(NotReleased::done)? {
            return Err(NotReleased::done(err!(
                Lost,
                "lock {} was broken while releasing it",
                path.display()
            )));
        }
        Ok(())
    }
}
