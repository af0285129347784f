//! `backend = "mkdir"`: the lock is the directory at `path`, existing exactly while held
//! (seed 000). Works on local filesystems and NFS (`mkdir(2)` is atomic on both).
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PARENT/NAME/                     the lock: exists exactly while held
//! PARENT/NAME/owner.<nonce>        symlink; its target is the owner record (owner.rs)
//! PARENT/NAME/releasing.<nonce>    the same record, renamed by its holder while releasing
//! PARENT/.NAME.<nonce>.new/        a lock being prepared (published by renameat2 NOREPLACE)
//! PARENT/.NAME.<nonce>.tomb/       a released or broken lock on its way out
//! PARENT/.NAME.state               symlink; the state record (last fencing token, clean?)
//! ```
//! The owner record is the *target of a symlink*: `readlink(2)` reads it atomically without
//! opening a file inside the lock directory, so a reader can never cause NFS's `.nfsXXXX`
//! silly-rename that makes `rmdir` fail and hangs the lock (seed 004).
//!
//! # Taking the name
//! Where `renameat2(RENAME_NOREPLACE)` exists, the lock directory is prepared complete (owner
//! record inside) under a private name and published atomically: NAME never exists without
//! a record, so a locker killed at any moment leaves a lock proof of death breaks at once.
//! On NFS (no NOREPLACE) it is `mkdir` then the record.
//!
//! # Removal is a claim
//! A breaker claims an acquisition by unlinking its record entry; the holder releasing claims
//! it by renaming `owner.<nonce>` to `releasing.<nonce>` (the record stays readable, so its
//! death half-way is still provable). The nonce is in the name, so only one claimant can
//! win and no breaker can remove a successor's lock (its entry has another name). The
//! claimant checks the directory it claimed in is still NAME, renames NAME to a tombstone
//! (freeing the name even if something sits inside it) and tidies the tombstone afterwards.
//!
//! # Liveness
//! The holder touches its owner symlink (`utimensat(AT_SYMLINK_NOFOLLOW)`) every heartbeat
//! period, unless `local = true`. A waiter on the same host (equal boot id and pid namespace)
//! decides by proof of death at once and watches the holder's pidfd; a waiter elsewhere breaks
//! only after seeing the symlink's ctime unchanged for `stale_after` on its own monotonic clock.
//!
//! # Limits
//! A lock directory without a record (a breaker killed between its unlink and its rename, a
//! locker on NFS killed between `mkdir` and `symlink`, or a foreign tool's plain `mkdir`) is
//! broken after `stale_after` of no change; that path re-checks the directory's inode just
//! before renaming it, which leaves a window of microseconds between two such breakers. On
//! NFS, attribute caching (`acdirmax`, 60 s by default) can hide heartbeats: keep
//! `stale_after` above it.

use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, readlinkat, renameat, renameat2};
use nix::sys::stat::{FileStat, Mode as FileMode, UtimensatFlags, fstatat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::owner::{self, Parsed, Record, State};
use super::wake::Wakeups;
use super::{Attempt, Backend, BreakOutcome, Grant, Holder, WaitHint};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::profile::{FsConfig, Profile};
use crate::watch::{Event, Watcher};

const OWNER_PREFIX: &str = "owner.";
/// A holder releasing renames its `owner.<nonce>` to `releasing.<nonce>` (its claim), so the
/// record stays readable until the name is freed: if it is killed half-way, proof of death
/// still applies at once instead of an ownerless directory waiting out `stale_after`.
const RELEASING_PREFIX: &str = "releasing.";

fn is_record_entry(name: &[u8]) -> bool {
    name.starts_with(OWNER_PREFIX.as_bytes()) || name.starts_with(RELEASING_PREFIX.as_bytes())
}

pub struct Mkdir {
    cfg: FsConfig,
    profile: String,
    stale_after: Duration,
    heartbeat: Duration,
    poll: Duration,
    parent: PathBuf,
    name: OsString,
    parent_fd: Option<OwnedFd>,
    /// Our record while we hold the lock.
    ours: Option<Record>,
    /// What a waiter last saw of a holder it cannot judge at once, and since when.
    observed: Option<(Observed, Instant)>,
    /// inotify on the parent and the pidfd of a same-host holder.
    wake: Wakeups,
    prev_crashed: bool,
    /// The filesystem has no `RENAME_NOREPLACE` (NFS): plain `mkdir` then owner record.
    plain_mkdir: bool,
}

/// The state of a lock as a waiter sees it; any change is a sign of life.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Observed {
    Owner {
        entry: String,
        ctime: (i64, i64),
        mtime: (i64, i64),
    },
    Ownerless {
        ino: u64,
        ctime: (i64, i64),
    },
}

/// One look at the lock directory.
struct Inspection {
    dir: OwnedFd,
    ino: u64,
    ctime: (i64, i64),
    owner: Option<(String, Parsed, FileStat)>,
}

impl Mkdir {
    pub fn new(cfg: FsConfig, profile: &Profile) -> Mkdir {
        let parent = cfg
            .path
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        let name = cfg.path.file_name().map(OsString::from).unwrap_or_default();
        Mkdir {
            profile: profile.name.clone(),
            stale_after: profile.common.stale_after,
            heartbeat: profile.common.heartbeat(),
            poll: profile.common.poll,
            parent,
            name,
            cfg,
            parent_fd: None,
            ours: None,
            observed: None,
            wake: Wakeups::default(),
            prev_crashed: false,
            // A debug switch: behave as on NFS (no RENAME_NOREPLACE), so the tests cover the
            // path NFS users take on a machine that cannot mount NFS.
            plain_mkdir: std::env::var_os("LOCKSMITH_MKDIR_PLAIN").is_some_and(|v| v == "1"),
        }
    }

    /// The parent directory, opened once; every later call is relative to it (`*at`).
    fn parent_fd(&mut self) -> Result<BorrowedFd<'_>> {
        if self.parent_fd.is_none() {
            let fd = nix::fcntl::open(
                &self.parent,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                FileMode::empty(),
            )
            .map_err(|e| {
                Error::path(
                    "cannot open the directory of lock",
                    &self.cfg.path,
                    e.into(),
                )
            })?;
            let st = nix::sys::stat::fstat(&fd).map_err(|e| {
                Error::path(
                    "cannot stat the directory of lock",
                    &self.cfg.path,
                    e.into(),
                )
            })?;
            super::lockdir::check_dir_mode(st.st_mode, &self.parent)?;
            super::lockdir::check(
                &super::lockdir::detect(fd.as_fd()),
                &self.parent,
                &self.cfg,
                self.stale_after,
                true,
            )?;
            self.parent_fd = Some(fd);
        }
        Ok(self.parent_fd.as_ref().expect("opened above").as_fd())
    }

    fn dir_mode(&self) -> FileMode {
        // A directory needs x where it has r to be usable.
        let m = self.cfg.file_mode.unwrap_or(0o777);
        let x = (m & 0o444) >> 2;
        FileMode::from_bits_truncate(m | x)
    }

    fn tomb_name(&self, nonce: &str) -> OsString {
        let mut t = OsString::from(".");
        t.push(&self.name);
        t.push(format!(".{nonce}.tomb"));
        t
    }

    fn owner_path(&self, entry: &str) -> PathBuf {
        PathBuf::from(&self.name).join(entry)
    }

    /// Takes the name. `Ok(false)`: it exists.
    ///
    /// Where the filesystem has `renameat2(RENAME_NOREPLACE)` (ext4, xfs, btrfs, tmpfs), a
    /// complete lock directory — owner record inside — is prepared under a private name and
    /// published atomically, so the lock never exists without an owner record and a locker
    /// killed at any moment leaves a lock that proof of death can break at once. Elsewhere
    /// (NFS answers EINVAL) it is `mkdir(2)` then the owner symlink.
    fn create(&mut self) -> Result<bool> {
        // Cheap look first, so waiters do not prepare (and remove) a directory per attempt.
        let name = self.name.clone();
        let parent = self.parent_fd()?;
        if fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
            return Ok(false);
        }
        let mut rec = Record::ours(&self.profile);
        // Speculate on the token, so the record rarely needs rewriting once we hold the name.
        rec.token = Some(self.read_state()?.map_or(1, |s| s.token + 1));
        let entry = format!("{OWNER_PREFIX}{}", rec.nonce);
        let taken = if self.plain_mkdir {
            self.create_plain(&rec, &entry)?
        } else {
            self.create_published(&rec, &entry)?
        };
        if !taken {
            return Ok(false);
        }
        if let Err(e) = self.finish_create(&mut rec, &entry) {
            // Leave nothing behind: the directory is ours.
            let owner_path = self.owner_path(&entry);
            let parent = self.parent_fd()?;
            let _ = unlinkat(parent, &owner_path, UnlinkatFlags::NoRemoveDir);
            let _ = unlinkat(parent, name.as_os_str(), UnlinkatFlags::RemoveDir);
            return Err(e);
        }
        self.ours = Some(rec);
        Ok(true)
    }

    /// `mkdir` a private `.NAME.<nonce>.new`, the owner symlink inside, then
    /// `renameat2(.., RENAME_NOREPLACE)` onto NAME.
    fn create_published(&mut self, rec: &Record, entry: &str) -> Result<bool> {
        let mut new = OsString::from(".");
        new.push(&self.name);
        new.push(format!(".{}.new", rec.nonce));
        let name = self.name.clone();
        let path = self.cfg.path.clone();
        self.make_dir(&new, rec, entry)?;
        let parent = self.parent_fd()?;
        let undo = |parent: BorrowedFd<'_>| {
            let _ = unlinkat(
                parent,
                &PathBuf::from(&new).join(entry),
                UnlinkatFlags::NoRemoveDir,
            );
            let _ = unlinkat(parent, new.as_os_str(), UnlinkatFlags::RemoveDir);
        };
        match renameat2(
            parent,
            new.as_os_str(),
            parent,
            name.as_os_str(),
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) | Err(Errno::ENOTEMPTY) => {
                undo(parent);
                Ok(false)
            }
            Err(Errno::EINVAL) | Err(Errno::ENOSYS) => {
                undo(parent);
                debug!(
                    "no RENAME_NOREPLACE on {}: using mkdir",
                    self.parent.display()
                );
                self.plain_mkdir = true;
                self.create_plain(rec, entry)
            }
            Err(e) => {
                undo(parent);
                Err(Error::path("cannot create lock directory", &path, e.into()))
            }
        }
    }

    /// `mkdir(2)` NAME, then the owner symlink inside.
    fn create_plain(&mut self, rec: &Record, entry: &str) -> Result<bool> {
        let name = self.name.clone();
        match self.make_dir(&name, rec, entry) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == Kind::Busy => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes directory `dir` (mode and group per profile) with the owner symlink inside;
    /// `Kind::Busy` if `dir` exists. On failure nothing is left.
    fn make_dir(&mut self, dir: &OsString, rec: &Record, entry: &str) -> Result<()> {
        let path = self.cfg.path.clone();
        let (file_mode, group, mode) = (self.cfg.file_mode, self.cfg.group, self.dir_mode());
        let parent = self.parent_fd()?;
        match mkdirat(parent, dir.as_os_str(), mode) {
            Ok(()) => {}
            Err(Errno::EEXIST) => return Err(err!(Busy, "exists")),
            Err(e) => return Err(Error::path("cannot create lock directory", &path, e.into())),
        }
        let r = nix::unistd::symlinkat(
            rec.render().as_str(),
            parent,
            &PathBuf::from(dir).join(entry),
        )
        .map_err(|e| Error::path("cannot write owner record in", &path, e.into()))
        .and_then(|()| {
            if file_mode.is_some() {
                nix::sys::stat::fchmodat(
                    parent,
                    dir.as_os_str(),
                    mode,
                    nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                )
                .map_err(|e| Error::path("cannot chmod", &path, e.into()))?;
            }
            if let Some(g) = group {
                nix::unistd::fchownat(
                    parent,
                    dir.as_os_str(),
                    None,
                    Some(nix::unistd::Gid::from_raw(g)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|e| Error::path("cannot chgrp", &path, e.into()))?;
            }
            Ok(())
        });
        if r.is_err() {
            let _ = unlinkat(
                parent,
                &PathBuf::from(dir).join(entry),
                UnlinkatFlags::NoRemoveDir,
            );
            let _ = unlinkat(parent, dir.as_os_str(), UnlinkatFlags::RemoveDir);
        }
        r
    }

    /// Holding the name now: take the next fencing token (rewriting the owner record,
    /// atomically by renaming a new symlink over it, if the speculated token was overtaken),
    /// and mark the state "not cleanly released" until our release says otherwise.
    fn finish_create(&mut self, rec: &mut Record, entry: &str) -> Result<()> {
        let state = self.read_state()?;
        let token = state.map_or(1, |s| s.token + 1);
        if state.is_some_and(|s| !s.clean) {
            self.prev_crashed = true;
        }
        if rec.token == Some(token) {
            // The speculation held: the record already says the right token.
            return self.write_state(State {
                token,
                clean: false,
            });
        }
        rec.token = Some(token);
        rec.since = super::owner::now_rfc3339();
        let path = self.cfg.path.clone();
        let owner_path = self.owner_path(entry);
        let tmp = self.owner_path(&format!("new.{}", rec.nonce));
        let parent = self.parent_fd()?;
        nix::unistd::symlinkat(rec.render().as_str(), parent, &tmp)
            .and_then(|()| renameat(parent, &tmp, parent, &owner_path))
            .map_err(|e| {
                let _ = unlinkat(parent, &tmp, UnlinkatFlags::NoRemoveDir);
                Error::path("cannot write owner record in", &path, e.into())
            })?;
        self.write_state(State {
            token,
            clean: false,
        })
    }

    fn state_name(&self) -> OsString {
        let mut n = OsString::from(".");
        n.push(&self.name);
        n.push(".state");
        n
    }

    /// The state beside the lock (`.NAME.state`), `None` if there is none yet.
    fn read_state(&mut self) -> Result<Option<State>> {
        let name = self.state_name();
        let shown = self.parent.join(&name);
        owner::read_state(self.parent_fd()?, &name, &shown)
    }

    fn write_state(&mut self, st: State) -> Result<()> {
        let name = self.state_name();
        let shown = self.parent.join(&name);
        owner::write_state(self.parent_fd()?, &name, &shown, st)
    }

    /// Looks at the lock without changing it. `None`: there is no lock right now.
    fn inspect(&mut self) -> Result<Option<Inspection>> {
        let path = self.cfg.path.clone();
        let name = self.name.clone();
        let parent = self.parent_fd()?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let dir = match openat(parent, name.as_os_str(), flags, FileMode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) | Err(Errno::ENOTDIR) => {
                return Err(err!(
                    Config,
                    "lock path {} exists but is not a directory (a file or symlink is in the way)",
                    path.display()
                ));
            }
            Err(e) => return Err(Error::path("cannot inspect lock", &path, e.into())),
        };
        let st = nix::sys::stat::fstat(&dir)
            .map_err(|e| Error::path("cannot stat lock", &path, e.into()))?;
        let mut owner = None;
        let listing = nix::dir::Dir::from_fd(
            dir.try_clone()
                .map_err(|e| Error::path("cannot read lock", &path, e))?,
        );
        if let Ok(mut listing) = listing {
            for entry in listing.iter().flatten() {
                let fname = entry.file_name().to_bytes();
                if !is_record_entry(fname) {
                    continue;
                }
                let fname = String::from_utf8_lossy(fname).into_owned();
                let Ok(target) = readlinkat(&dir, fname.as_str()) else {
                    continue; // removed meanwhile, or not a symlink
                };
                let Ok(lst) = fstatat(&dir, fname.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                    continue;
                };
                let parsed = Record::parse(&String::from_utf8_lossy(target.as_bytes()));
                owner = Some((fname, parsed, lst));
                break;
            }
        }
        Ok(Some(Inspection {
            dir,
            ino: st.st_ino,
            ctime: (st.st_ctime, st.st_ctime_nsec),
            owner,
        }))
    }

    /// True when `what` has stayed the same for `stale_after` of our own observation.
    fn silent_for_stale(&mut self, what: Observed) -> bool {
        match &self.observed {
            Some((seen, since)) if *seen == what => since.elapsed() >= self.stale_after,
            _ => {
                self.observed = Some((what, Instant::now()));
                false
            }
        }
    }

    /// Claims one acquisition by unlinking its owner entry (only one claimant can: the nonce
    /// is in the name), then frees the name. `Ok(false)`: someone else claimed it first.
    fn claim_and_remove(&mut self, dir: &OwnedFd, entry: &str) -> Result<bool> {
        match unlinkat(dir, entry, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {}
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => {
                return Err(Error::path(
                    "cannot remove owner record of",
                    &self.cfg.path,
                    e.into(),
                ));
            }
        }
        let nonce = crate::host::nonce();
        // The directory we looked into may have been renamed to a tombstone meanwhile (its
        // releaser then died while tidying): a claim there claims nothing at NAME.
        let here = nix::sys::stat::fstat(dir).map(|st| (st.st_dev, st.st_ino));
        let name = self.name.clone();
        let parent = self.parent_fd()?;
        let at_name = fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map(|st| (st.st_dev, st.st_ino));
        if here.is_err() || here != at_name {
            debug!("claimed a record in a directory that is no longer the lock; retrying");
            return Ok(false);
        }
        self.free_name(&nonce)?;
        Ok(true)
    }

    /// Renames the lock directory to a tombstone (works even if something sits inside it),
    /// then tidies the tombstone; tidying may fail without leaving the lock held.
    fn free_name(&mut self, nonce: &str) -> Result<()> {
        let tomb = self.tomb_name(nonce);
        let name = self.name.clone();
        let path = self.cfg.path.clone();
        let parent = self.parent_fd()?;
        match renameat(parent, name.as_os_str(), parent, tomb.as_os_str()) {
            Ok(()) => {}
            Err(e) => {
                // Last resort: rmdir works if it is empty.
                unlinkat(parent, name.as_os_str(), UnlinkatFlags::RemoveDir)
                    .map_err(|_| Error::path("cannot remove lock directory", &path, e.into()))?;
                return Ok(());
            }
        }
        if let Err(e) = tidy(parent, &tomb) {
            debug!(
                "left tombstone {} behind: {e}",
                self.parent.join(&tomb).display()
            );
        }
        Ok(())
    }

    /// Breaks an ownerless lock directory, provided it is still the one we watched.
    fn remove_ownerless(&mut self, ino: u64) -> Result<()> {
        let nonce = crate::host::nonce();
        let name = self.name.clone();
        let parent = self.parent_fd()?;
        match fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_ino == ino => self.free_name(&nonce),
            _ => Ok(()), // gone or replaced meanwhile: nothing to break
        }
    }

    /// Decides about an existing lock: `Some(holders)` busy, `None` it was just broken.
    fn judge(&mut self, ins: Inspection) -> Result<Option<Vec<Holder>>> {
        let Some((entry, parsed, lst)) = ins.owner else {
            let what = Observed::Ownerless {
                ino: ins.ino,
                ctime: ins.ctime,
            };
            if self.silent_for_stale(what) {
                info!(
                    "breaking lock {} without owner record, unchanged for {}",
                    self.cfg.path.display(),
                    crate::profile::fmt_duration(self.stale_after)
                );
                self.remove_ownerless(ins.ino)?;
                self.observed = None;
                return Ok(None);
            }
            return Ok(Some(Vec::new()));
        };
        let rec = match parsed {
            Parsed::V1(rec) => rec,
            foreign @ Parsed::Foreign(_) => return Ok(Some(vec![foreign.holder()])),
        };
        let mut holder = rec.holder();
        if rec.same_host() {
            if self.wake.holder_alive(rec.pid, rec.start) {
                return Ok(Some(vec![holder]));
            }
            info!(
                "breaking lock {} of dead holder {holder} (same host: proof of death)",
                self.cfg.path.display()
            );
        } else if self.cfg.local {
            return Err(err!(
                Config,
                "profile `{}` says local = true, but lock {} is held by {holder} from another host or pid namespace",
                self.profile,
                self.cfg.path.display()
            ));
        } else {
            let what = Observed::Owner {
                entry: entry.clone(),
                ctime: (lst.st_ctime, lst.st_ctime_nsec),
                mtime: (lst.st_mtime, lst.st_mtime_nsec),
            };
            if !self.silent_for_stale(what) {
                return Ok(Some(vec![holder]));
            }
            holder.alive = Some(false);
            info!(
                "breaking lock {} of {holder}: no heartbeat for {}",
                self.cfg.path.display(),
                crate::profile::fmt_duration(self.stale_after)
            );
        }
        self.observed = None;
        if self.claim_and_remove(&ins.dir, &entry)? {
            self.prev_crashed = true;
        }
        Ok(None)
    }
}

/// Removes our owner symlinks from a tombstone, then the tombstone itself.
fn tidy(parent: BorrowedFd<'_>, tomb: &OsString) -> nix::Result<()> {
    let fd = openat(
        parent,
        tomb.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        FileMode::empty(),
    )?;
    let mut listing = nix::dir::Dir::from_fd(fd.try_clone().map_err(|_| Errno::EBADF)?)?;
    for entry in listing.iter().flatten() {
        let n = entry.file_name().to_bytes();
        if is_record_entry(n) || n.starts_with(b"new.") {
            let _ = unlinkat(&fd, entry.file_name(), UnlinkatFlags::NoRemoveDir);
        }
    }
    unlinkat(parent, tomb.as_os_str(), UnlinkatFlags::RemoveDir)
}

impl Backend for Mkdir {
    fn name(&self) -> &'static str {
        "mkdir"
    }

    fn try_acquire(&mut self) -> Result<Attempt> {
        // A few rounds: the lock may vanish between our mkdir and our look, or be broken.
        // Drain old notifications *before* trying: a release after this point leaves a
        // fresh event, so the wait that may follow cannot miss it.
        self.wake.drain();
        let mut holders = Vec::new();
        for _ in 0..4 {
            if self.create()? {
                self.observed = None;
                self.wake.forget_holder();
                return Ok(Attempt::Acquired(Grant {
                    token: self.ours.as_ref().and_then(|r| r.token),
                    prev_crashed: std::mem::take(&mut self.prev_crashed),
                }));
            }
            let Some(ins) = self.inspect()? else {
                continue;
            };
            match self.judge(ins)? {
                Some(h) => {
                    holders = h;
                    break;
                }
                None => continue,
            }
        }
        Ok(Attempt::Busy(holders))
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        self.wake.watch_dir(&self.parent)?;
        Ok(WaitHint { poll: true })
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.wake.fds()
    }

    fn heartbeat_period(&self) -> Option<Duration> {
        (!self.cfg.local).then_some(self.heartbeat)
    }

    fn heartbeat(&mut self, _deadline: Instant) -> Result<()> {
        let Some(rec) = &self.ours else {
            return Err(err!(Lost, "not holding"));
        };
        let owner_path = self.owner_path(&format!("{OWNER_PREFIX}{}", rec.nonce));
        let path = self.cfg.path.clone();
        let parent = self.parent_fd()?;
        let now = TimeSpec::UTIME_NOW;
        match utimensat(
            parent,
            &owner_path,
            &now,
            &now,
            UtimensatFlags::NoFollowSymlink,
        ) {
            Ok(()) => Ok(()),
            Err(Errno::ENOENT) => Err(err!(
                Lost,
                "lock {} was broken: our owner record is gone",
                path.display()
            )),
            Err(e) => Err(Error::path("cannot heartbeat lock", &path, e.into())),
        }
    }

    fn release(&mut self) -> Result<()> {
        let Some(rec) = self.ours.take() else {
            return Ok(());
        };
        let owner_path = self.owner_path(&format!("{OWNER_PREFIX}{}", rec.nonce));
        let path = self.cfg.path.clone();
        let claimed = self.owner_path(&format!("{RELEASING_PREFIX}{}", rec.nonce));
        let parent = self.parent_fd()?;
        // The claim: from here nobody else may remove or take this acquisition.
        match renameat(parent, &owner_path, parent, &claimed) {
            Ok(()) => {
                // Still holding the name: say this acquisition ended cleanly, unless the state
                // moved on (only possible after a pause longer than stale_after).
                if let Some(token) = rec.token
                    && self.read_state().ok().flatten().map(|s| s.token) == Some(token)
                    && let Err(e) = self.write_state(State { token, clean: true })
                {
                    info!("{e}; the next holder will see prev=crashed");
                }
                self.free_name(&rec.nonce)
            }
            Err(Errno::ENOENT) => Err(err!(
                Lost,
                "lock {} was broken while held: our owner record is gone",
                path.display()
            )),
            Err(e) => {
                self.ours = Some(rec); // still ours: the caller may retry
                Err(Error::path("cannot release lock", &path, e.into()))
            }
        }
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(match self.inspect()? {
            None => Vec::new(),
            Some(ins) => match ins.owner {
                Some((_, parsed, _)) => vec![parsed.holder()],
                None => vec![Holder::default()],
            },
        })
    }

    fn break_lock(
        &mut self,
        force: bool,
        token: Option<u64>,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        let mut announced = false;
        loop {
            let Some(ins) = self.inspect()? else {
                return Ok(BreakOutcome::Free);
            };
            if let Some(t) = token {
                let theirs = match &ins.owner {
                    Some((_, Parsed::V1(rec), _)) => rec.token,
                    _ => None,
                };
                if theirs != Some(t) {
                    return Err(err!(
                        Busy,
                        "lock {} is not acquisition {t} (its token: {}); nothing broken",
                        self.cfg.path.display(),
                        theirs.map_or("none".into(), |x| x.to_string())
                    ));
                }
            }
            let holder = ins
                .owner
                .as_ref()
                .map(|(_, p, _)| p.holder())
                .unwrap_or_default();
            let parsed = ins
                .owner
                .as_ref()
                .map(|(e, p, l)| (e.clone(), p.clone(), *l));
            let decided = match &parsed {
                _ if force => true,
                Some((_, Parsed::Foreign(_), _)) => {
                    return Err(err!(
                        Busy,
                        "lock {} has an owner record of another format ({holder}); only --force breaks it",
                        self.cfg.path.display()
                    ));
                }
                Some((_, Parsed::V1(rec), _)) if rec.same_host() => {
                    if crate::host::alive(rec.pid, rec.start) {
                        return Err(err!(
                            Busy,
                            "lock {} is held by {holder}, which is alive; use --force to break it anyway",
                            self.cfg.path.display()
                        ));
                    }
                    true
                }
                Some((entry, _, lst))
                    if self.observed.as_ref().is_some_and(|(seen, _)| {
                        *seen
                            != Observed::Owner {
                                entry: entry.clone(),
                                ctime: (lst.st_ctime, lst.st_ctime_nsec),
                                mtime: (lst.st_mtime, lst.st_mtime_nsec),
                            }
                    }) =>
                {
                    return Err(err!(
                        Busy,
                        "lock {} is held by {holder}, which is alive: its heartbeat changed the lock",
                        self.cfg.path.display()
                    ));
                }
                Some((entry, _, lst)) => self.silent_for_stale(Observed::Owner {
                    entry: entry.clone(),
                    ctime: (lst.st_ctime, lst.st_ctime_nsec),
                    mtime: (lst.st_mtime, lst.st_mtime_nsec),
                }),
                None => self.silent_for_stale(Observed::Ownerless {
                    ino: ins.ino,
                    ctime: ins.ctime,
                }),
            };
            if decided {
                let done = match &parsed {
                    Some((entry, _, _)) => self.claim_and_remove(&ins.dir, entry)?,
                    None => {
                        self.remove_ownerless(ins.ino)?;
                        true
                    }
                };
                if done {
                    info!("broke lock {} of {holder}", self.cfg.path.display());
                    return Ok(BreakOutcome::Broken(holder));
                }
                continue;
            }
            if !announced {
                info!(
                    "lock {} is held by {holder} on another host; breaking it if it stays silent for {}",
                    self.cfg.path.display(),
                    crate::profile::fmt_duration(self.stale_after)
                );
                announced = true;
            }
            if let Event::Release(cause) = watcher.wait(&[], Some(self.poll))? {
                return Err(Error::new(
                    Kind::Busy,
                    format!("stopped before breaking: {cause}"),
                ));
            }
        }
    }
}
