//! `backend = "mkdir"`: the lock is the directory at `path`, existing exactly while held
//! (seed 000). Works on local filesystems and NFS (`mkdir(2)` is atomic on both).
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PARENT/NAME/                     the lock: exists exactly while held
//! PARENT/NAME/owner.<nonce>        symlink; its target is the owner record (owner.rs) — locally,
//!                                  only what proof of death needs (`short_owner`)
//! PARENT/NAME/beat                 the heartbeat record: owner record + counter (lockdir.rs)
//! PARENT/NAME/releasing.<nonce>    the same record, renamed by its holder while releasing
//! PARENT/NAME/breaker.<nonce>      symlink; the record of a breaker, made before it claims
//! PARENT/NAME/claimed.<nonce>      the holder's record entry, renamed by breaker <nonce>
//! PARENT/.NAME.<nonce>.<host>.<pid>.<start>.new/
//!                                  a lock being prepared (published by renameat2 NOREPLACE,
//!                                  or on SMB by rename), its maker named (`.NAME.<nonce>.new`
//!                                  where that name would be too long)
//! PARENT/.NAME.<nonce>.tomb/       a released or broken lock on its way out
//! PARENT/.NAME.state/              the state: one entry state~1~TOKEN~CLEAN (`lockdir::state`)
//! ```
//! Where the filesystem has no `symlink(2)` (SMB through smbnetfs: ENOSYS, learnt once per
//! lock), the owner and breaker records are regular files holding the record, written as
//! `NAME/new.<nonce>` and renamed onto their free names (`lockdir::make_entry`; readers take
//! either form, `lockdir::read_entry`), and the state's entry is an empty directory.
//! The owner record is the *target of a symlink*: `readlink(2)` reads it atomically without
//! opening a file inside the lock directory, so a reader can never cause NFS's `.nfsXXXX`
//! silly-rename that makes `rmdir` fail and hangs the lock (seed 004).
//!
//! # Taking the name
//! Where `renameat2(RENAME_NOREPLACE)` exists, the lock directory is prepared complete (owner
//! record inside) under a private name and published atomically: NAME never exists without
//! a record, so a locker killed at any moment leaves a lock proof of death breaks at once.
//! Where there is neither NOREPLACE nor `symlink(2)` (SMB through smbnetfs) it is published
//! by a plain `rename(2)`, which never replaces a directory that is not empty: the same
//! promise (`create_published` says why that is exclusive there). On NFS and sshfs (no
//! NOREPLACE) it is `mkdir` then the record.
//!
//! # Removal is a claim
//! The holder releasing claims its acquisition by renaming `owner.<nonce>` to
//! `releasing.<nonce>` (the record stays readable, so its death half-way is still provable).
//! A breaker first leaves its own record as `breaker.<its nonce>`, then claims by renaming
//! the holder's entry to `claimed.<its nonce>`. The nonce is in the name, so only one
//! claimant can win and no breaker can remove a successor's lock (its entry has another
//! name). The claimant checks the directory it claimed in is still NAME, renames NAME to a
//! tombstone (freeing the name even if something sits inside it) and tidies the tombstone
//! afterwards. A breaker killed between its claim and freeing the name is itself a holder
//! of the directory, known by its record: proof of death breaks it at once, by the same
//! claim on `claimed.<its nonce>` (so a lock never waits on a dead breaker).
//!
//! # Liveness
//! Unless `local = true`, the holder rewrites the counter in `NAME/beat` every heartbeat
//! period. A waiter
//! reads `NAME/beat` fresh — its *fixed* name needs no listing, which a network filesystem
//! may serve from a cache — so it knows who holds the lock *now*: the rule is `stale.rs`'s
//! (same host: proof of death; elsewhere: no change for `stale_after`), and the removal is
//! the claim on `owner.<nonce>` of exactly that holder.
//!
//! # Leftovers
//! A locker killed between making its `.NAME.<nonce>….new` and publishing it leaves that
//! directory; one acquisition in 16 removes it if its maker is provably dead
//! (`Files::tidy_leftovers`: one listing of the parent per 16 acquisitions, none per
//! wait), judged by the maker its name carries — on a network filesystem (SMB) by that
//! alone: looking into another mount's `.new` there makes its live maker fail. The same look
//! removes tombstones left behind on a local filesystem (a releaser's tidying that failed: see
//! Limits).
//!
//! # Limits
//! A lock directory without a record (a locker on NFS or sshfs killed between `mkdir` and
//! its owner entry, or a foreign
//! tool's plain `mkdir`) is broken after `stale_after` of no change; that path re-checks the directory's inode just
//! before renaming it, which leaves a window of microseconds between two such breakers. A
//! reader holding `NAME/beat` open on the releaser's mount keeps the tombstone from being
//! removed (a `.nfsXXXX` / `.fuse_hiddenXXXX` file): the removal is retried for about 2.5
//! seconds, then the tombstone is left (the name is free at once either way): on a local
//! filesystem for a later acquisition's look at the leftovers to remove, on a network one
//! for good (a `.fuse_hidden`/`.nfs` file is held open there: only NFS and FUSE have them).
//! Another host's `.new` left by a locker killed before publishing stays (nothing can tell its
//! maker is dead), and so does one named without its maker (a name near `NAME_MAX`) on a
//! network filesystem, or locally without a record (killed between its `mkdir` and its first
//! record).

use std::ffi::{OsStr, OsString};
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags, openat, renameat, renameat2};
use nix::sys::stat::{
    FileStat, Mode as FileMode, fstat, fstatat, mkdirat,
};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::faults::{self, Switch};
use super::filelock::{FileLock, Scheme, Take};
use super::lock::NotReleased;
use super::lock::Named;
use super::lockdir::probe::Scheme as Probe;
use super::lockdir::leftover::{self, Unpublished, maker_of, parse_maker};
use super::lockdir::{self, FsConfig, LockDir};
use super::owner::{Parsed, Record};
use super::stale::{Evidence, Holders};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info, trace};
use crate::protocol::Mode;

const OWNER_PREFIX: &str = "owner.";
/// How a short owner entry's target begins ([`short_owner`]).
const SHORT_OWNER: &str = "locksmith-beat ";
/// A holder releasing renames its `owner.<nonce>` to `releasing.<nonce>` (its claim), so the
/// record stays readable until the name is freed: if it is killed half-way, proof of death
/// still applies at once instead of an ownerless directory waiting out `stale_after`.
const RELEASING_PREFIX: &str = "releasing.";
/// The heartbeat record inside the lock directory (a fixed name: read without a listing).
const BEAT: &str = "beat";
/// A breaker's own record (a symlink, as an owner record), left before it claims.
const BREAKER_PREFIX: &str = "breaker.";
/// A claimed acquisition's record entry, renamed to carry its claimant's nonce.
const CLAIMED_PREFIX: &str = "claimed.";


fn is_record_entry(name: &[u8]) -> bool {
    name.starts_with(OWNER_PREFIX.as_bytes()) || name.starts_with(RELEASING_PREFIX.as_bytes())
}

/// The mkdir backend: the file-lock template with this file's naming.
pub type Mkdir = FileLock<Files>;

/// The lock's directories: what the judge sees and removes.
pub struct Files {
    profile: String,
    dir: LockDir,
    file_mode: Option<u32>,
    group: Option<u32>,
    /// The filesystem has no `RENAME_NOREPLACE` (NFS, sshfs): plain `mkdir` then records.
    plain_mkdir: bool,
    /// The filesystem has neither `RENAME_NOREPLACE` nor `symlink(2)` (SMB through
    /// smbnetfs): the complete lock directory is published by a plain `rename(2)`
    /// ([`Files::create_published`]).
    publish_by_rename: bool,
}

/// What a waiter compares between looks: the heartbeat record's content (read fresh), and
/// the identity and times of the owner entry or, with no record, of the directory itself.
fn sign_of(beat: Option<&[u8]>, st: Option<&FileStat>) -> Vec<u8> {
    let mut s = Vec::new();
    if let Some(st) = st {
        for x in [
            st.st_ino as i64,
            st.st_ctime,
            st.st_ctime_nsec,
            st.st_mtime,
            st.st_mtime_nsec,
        ] {
            s.extend_from_slice(&x.to_le_bytes());
        }
    }
    s.push(b'|');
    s.extend_from_slice(beat.unwrap_or(b"no beat"));
    s
}

impl Files {
    fn path(&self) -> &Path {
        &self.dir.path
    }

    fn dir_mode(&self) -> FileMode {
        // A directory needs x where it has r to be usable.
        let m = self.file_mode.unwrap_or(0o777);
        let x = (m & 0o444) >> 2;
        FileMode::from_bits_truncate(m | x)
    }

    /// `NAME/<entry>`, relative to the parent.
    fn inside(&self, entry: &str) -> PathBuf {
        PathBuf::from(&self.dir.name).join(entry)
    }

    /// Takes the name. `Ok(Some(rec))`: ours, with this record; `Ok(None)`: it exists.
    ///
    /// Where the filesystem has `renameat2(RENAME_NOREPLACE)` (ext4, xfs, btrfs, tmpfs), a
    /// complete lock directory — records inside — is prepared under a private name and
    /// published atomically, so the lock never exists without an owner record and a locker
    /// killed at any moment leaves a lock that proof of death can break at once. Elsewhere
    /// (NFS, sshfs answer EINVAL) it is `mkdir(2)` then the records.
    fn create(&mut self) -> Result<Option<Record>> {
        // Cheap look first, so waiters neither read the state nor prepare (and remove) a
        // directory per attempt. Not on a network filesystem: there the look is answered from
        // the mount's cache (sshfs: up to 20 s) and would keep a waiter out of a free lock;
        // `mkdir(2)` itself asks the server.
        let name = self.dir.name.clone();
        let (parent, remote) = self.dir.fd_remote()?;
        if !remote && fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
            return Ok(None);
        }
        let mut rec = Record::ours(&self.profile);
        // The token our records carry: once we hold the name exactly this one is taken, or
        // the name given back (`finish_create`).
        rec.token = Some(self.dir.next_token()?);
        let taken = if self.plain_mkdir {
            self.create_plain(&rec)?
        } else {
            self.create_published(&rec)?
        };
        Ok(taken.then_some(rec))
    }

    /// `mkdir` a private `.NAME.<nonce>.new` with the records inside, then
    /// `renameat2(.., RENAME_NOREPLACE)` onto NAME.
    fn create_published(&mut self, rec: &Record) -> Result<bool> {
        let new = self.dir.unpublished_name(rec, ".new");
        let name = self.dir.name.clone();
        self.make_dir(&new, rec)?;
        faults::stall(faults::Stall::Publishing);
        let parent = self.dir.fd()?;
        let (from, to) = (new.as_os_str(), name.as_os_str());
        let published = if self.publish_by_rename {
            // SMB refuses to rename while a directory is open on some mount: the lock (a
            // waiter listing it: taken), or our own `.new`, whose close FUSE sends after
            // `close(2)` returned (a moment: again). ENOENT with our `.new` still there: NAME
            // was there and went as we renamed (smbnetfs answers a collision by removing the
            // target, which fails on a lock that is not empty): taken, look again.
            let there =
                |n: &std::ffi::OsStr| fstatat(parent, n, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
            lockdir::soon(|| match renameat(parent, from, parent, to) {
                Err(Errno::EACCES | Errno::EBUSY) if there(to) => Err(Errno::EEXIST),
                Err(Errno::ENOENT) if there(from) => Err(Errno::EEXIST),
                r => r,
            })
        } else {
            renameat2(parent, from, parent, to, RenameFlags::RENAME_NOREPLACE)
        };
        match published {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = tidy(parent, &new, &[BEAT], true);
                match e {
                    Errno::EEXIST | Errno::ENOTEMPTY => Ok(false),
                    // Without `symlink(2)` too (SMB through smbnetfs, where `mkdir` is the
                    // only backend): a plain rename publishes as exclusively. rename(2) never
                    // replaces a directory that is not empty (ENOTEMPTY or EEXIST, atomically,
                    // on the server), and on such a filesystem no locksmith ever makes NAME
                    // empty: this one always publishes it complete (beat and owner entry
                    // inside), and earlier ones could not lock there at all (their owner
                    // entry was a symbolic link). So NAME never exists without a record, and
                    // a locker killed at any moment leaves a lock that proof of death breaks
                    // at once, not one without a record that waits out `stale_after` — the
                    // kill -9 soak on SMB got as few as 5 of 160 acquisitions through with
                    // `mkdir(NAME)` then records (tests/netfs.rs). What it gives up: an
                    // empty NAME made by a foreign tool's plain `mkdir` is replaced, not
                    // waited out for `stale_after` (README, "Tried on SMB").
                    Errno::EINVAL | Errno::ENOSYS
                        if !self.publish_by_rename && !self.dir.symlinks().get() =>
                    {
                        debug!(
                            "no RENAME_NOREPLACE nor symlink(2) on {}: publishing by rename",
                            self.dir.parent.display()
                        );
                        self.publish_by_rename = true;
                        self.create_published(rec)
                    }
                    Errno::EINVAL | Errno::ENOSYS if !self.publish_by_rename => {
                        debug!(
                            "no RENAME_NOREPLACE on {}: using mkdir",
                            self.dir.parent.display()
                        );
                        self.plain_mkdir = true;
                        self.create_plain(rec)
                    }
                    e => Err(Error::path(
                        "cannot create lock directory",
                        self.path(),
                        e.into(),
                    )),
                }
            }
        }
    }

    /// `mkdir(2)` NAME, then the records inside.
    fn create_plain(&mut self, rec: &Record) -> Result<bool> {
        let name = self.dir.name.clone();
        match self.make_dir(&name, rec) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == Kind::Busy => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Makes directory `dir` (mode and group per profile) with the heartbeat record and the
    /// owner symlink inside; `Kind::Busy` if `dir` exists. On failure nothing is left.
    fn make_dir(&mut self, dir: &OsString, rec: &Record) -> Result<()> {
        let path = self.path().to_path_buf();
        let (group, mode) = (self.group, self.dir_mode());
        let chmod = self.file_mode.is_some();
        let budget = self.dir.making_budget();
        let becomes_the_lock = *dir == self.dir.name || self.publish_by_rename;
        let parent = self.dir.fd()?;
        let began = crate::sys::boottime();
        let late = || crate::sys::boottime().saturating_sub(began) >= budget;
        match mkdirat(parent, dir.as_os_str(), mode) {
            Ok(()) if becomes_the_lock => {
                faults::stall(faults::Stall::Making);
            }
            Ok(()) => {}
            // EPERM: sshfs's and GlusterFS's answer when a racer made it first (and may
            // have removed it again since: on a network filesystem, look again).
            Err(Errno::EEXIST) | Err(Errno::EPERM) => {
                let there = lockdir::unstale(|| {
                    fstatat(parent, dir.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                })
                .is_ok();
                if there || self.dir.remote() {
                    return Err(err!(Busy, "exists"));
                }
                return Err(Error::path(
                    "cannot create lock directory",
                    &path,
                    Errno::EPERM.into(),
                ));
            }
            Err(e) => return Err(Error::path("cannot create lock directory", &path, e.into())),
        }
        let r = (|| -> Result<()> {
            let parent = self.dir.fd()?;
            let fd = openat(
                parent,
                dir.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                FileMode::empty(),
            )
            .map_err(|e| Error::path("cannot open lock directory", &path, e.into()))?;
            // Opened by name: only while nobody may yet have broken the directory we made
            // (record-less, it is broken after stale_after) is it surely ours. Later, leave
            // it unwritten and unremoved — it may be a successor's — for that rule.
            if *dir == self.dir.name && late() {
                info!(
                    "made lock directory {} but could not open it in time; leaving it to be broken as one without a record",
                    path.display()
                );
                return Err(err!(Busy, "exists"));
            }
            if chmod {
                nix::sys::stat::fchmod(&fd, mode)
                    .map_err(|e| Error::path("cannot chmod", &path, e.into()))?;
            }
            if let Some(g) = group {
                nix::unistd::fchown(&fd, None, Some(nix::unistd::Gid::from_raw(g)))
                    .map_err(|e| Error::path("cannot chgrp", &path, e.into()))?;
            }
            let beat = rec.render_beat(0);
            if *dir != self.dir.name && !self.dir.remote() {
                // Our private `.new` on a local filesystem: nobody writes in it before it is
                // published, so the record is made under its own name (issue 29: one rename
                // less per acquisition).
                let at = Some((fd.as_fd(), dir.as_os_str()));
                if self.dir.create_file(at, BEAT.as_ref(), &beat)?.is_none() {
                    return Err(err!(
                        Io,
                        "cannot write heartbeat record in {}: something is in the way",
                        self.dir.shown(dir).display()
                    ));
                }
            } else {
                // sshfs answered EEXIST for `beat` from its cache of the lock's previous
                // directory.
                let tmp = format!("{BEAT}.{}", rec.nonce);
                self.dir.publish(
                    Some((fd.as_fd(), dir.as_os_str())),
                    tmp.as_ref(),
                    BEAT.as_ref(),
                    &beat,
                )?;
            }
            let owner = format!("{OWNER_PREFIX}{}", rec.nonce);
            let tmp = format!("new.{}", rec.nonce);
            let text = short_owner(rec)
                .filter(|_| !self.dir.remote() && self.dir.symlinks().get())
                .unwrap_or_else(|| rec.render());
            // The name is unique to this acquisition, so EEXIST is no answer about anyone
            // else: our own request answered twice (NFS after a retransmission) if the entry
            // says our record; GlusterFS also answers it for an entry that is not there (a
            // fresh directory being looked up by others): then try again.
            let mut pause = Duration::from_millis(1);
            for _ in 0..8 {
                match lockdir::make_entry(fd.as_fd(), &owner, &text, &tmp, self.dir.symlinks()) {
                    Ok(()) => return Ok(()),
                    Err(Errno::EEXIST) => match lockdir::read_entry(fd.as_fd(), &owner) {
                        Ok(t) if t == text.as_bytes() => return Ok(()),
                        Err(Errno::ENOENT) => {}
                        _ => break,
                    },
                    Err(e) => {
                        return Err(Error::path("cannot write owner entry in", &path, e.into()));
                    }
                }
                std::thread::sleep(pause);
                pause *= 2;
            }
            Err(Error::path(
                "cannot write owner entry in",
                &path,
                Errno::EEXIST.into(),
            ))
        })();
        match r {
            // Too late to know whose NAME is: not ours to tidy.
            Err(e) if e.kind() == Kind::Busy || (*dir == self.dir.name && late()) => Err(e),
            // ENOENT inside the lock we made (the parent was there a moment ago): it was
            // broken as we made it — a waiter saw it without records. Busy: look again.
            Err(e) if *dir == self.dir.name && e.kind() == Kind::Config => {
                debug!("the lock directory we made went before its records: {e}");
                Err(err!(Busy, "exists"))
            }
            Err(e) => {
                let private = *dir != self.dir.name;
                let _ = tidy(self.dir.fd()?, dir, &[BEAT], private);
                Err(e)
            }
            Ok(()) => Ok(()),
        }
    }

    /// Removes leftovers beside the lock, of every slot of it (`lockdir::leftover`):
    /// tombstones (`.NAME.<nonce>.tomb/`, never the lock, whoever left them), and what lockers
    /// killed before publishing left: `.NAME.<nonce>….new/` directories whose maker is provably
    /// dead ([`LockDir::remove_dead_makers`]: by the maker the name carries, else — locally —
    /// by the record inside). On a network filesystem only the names are judged (below).
    ///
    /// One listing of the parent, only after an acquisition succeeded, and only one in
    /// [`lockdir::tidies`]: waiters never pay for it, and a lock taken and released in a loop pays
    /// one `getdents` pass of the parent every 16 cycles. Best effort: what fails is said at
    /// debug level and left.
    fn tidy_leftovers(&mut self, ours: &str) {
        let at = self.dir.parent.clone();
        let found = self.dir.leftovers(&[".tomb", ".new"]);
        // On a network or FUSE filesystem nothing inside another mount's `.new` is looked at:
        // there even a `stat` of one being published made its maker fail (smbnetfs: EIO on
        // its records, its `.new` left behind; `netfs::smb::mkdir::counter_race_across_mounts`
        // lost 31 to 92 of 200 increments). Only a name that says its maker is dead is removed.
        let Ok((parent, remote)) = self.dir.fd_remote() else {
            return;
        };
        let (tombs, new): (Vec<_>, Vec<_>) = found.into_iter().partition(|l| l.suffix == ".tomb");
        // A tombstone is never the lock: whoever left it (a releaser or breaker whose tidying
        // failed: a file held open inside, a network filesystem's ESTALE, a kill) no longer
        // needs it, and the releaser tidying one right now takes our removal as its own. Not
        // on a network filesystem: there looking into another mount's directory can fail its
        // owner's calls (SMB), and the releaser's own tidying, which waits out ESTALE and a
        // file held open, is what removes it. One
        // with an owner entry inside is no tombstone (a release or a break moves the owner
        // entry before the rename) but a lock directory named like one — another lock of this
        // directory, `.NAME.<16 hex>.tomb`: left alone.
        let tombs = tombs
            .into_iter()
            .filter(|l| !remote && std::str::from_utf8(&l.middle).is_ok_and(leftover::hex));
        for tomb in tombs.take(leftover::LEFTOVERS) {
            let shown = at.join(&tomb.name);
            if !entries_at(parent, &tomb.name, OWNER_PREFIX).is_empty() {
                trace!("left {}: an owner entry inside", shown.display());
                continue;
            }
            match tidy_once(parent, &tomb.name) {
                Ok(()) | Err(Errno::ENOENT) => debug!("removed leftover tombstone {}", shown.display()),
                Err(e) => debug!("cannot remove {}: {e}", shown.display()),
            }
        }
        // Each removed in one pass: a dead maker holds nothing open there.
        let new = new
            .into_iter()
            .filter_map(|l| Unpublished::parse(&l.middle).map(|u| (l.name, u)))
            .collect();
        self.dir
            .remove_dead_makers(new, ours, unpublished_record, tidy_once);
    }

    fn open_lock(&mut self) -> Result<Option<OwnedFd>> {
        let path = self.path().to_path_buf();
        let name = self.dir.name.clone();
        let mut flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let (parent, remote) = self.dir.fd_remote()?;
        // On a network filesystem the lock directory is looked into without opening it on the
        // server (O_PATH: FUSE sends no opendir): SMB refuses to rename a directory another
        // client has open, and every waiter looking into the lock kept its holder from freeing
        // the name (kill -9 soak: 7 of 160 acquisitions got through).
        if remote {
            flags |= OFlag::O_PATH;
        }
        match lockdir::unstale(|| openat(parent, name.as_os_str(), flags, FileMode::empty())) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            // O_NOFOLLOW on a symbolic link (EACCES first where protected_symlinks refuses).
            Err(e @ (Errno::ELOOP | Errno::ENOTDIR | Errno::EACCES))
                if e != Errno::EACCES || lockdir::is_symlink(parent, &name) =>
            {
                Err(lockdir::planted(
                    parent,
                    &name,
                    &path,
                    "a directory (backend `mkdir`)",
                    e,
                ))
            }
            Err(e) => Err(Error::path("cannot inspect lock", &path, e.into())),
        }
    }

    /// The record entries a listing of the lock directory shows (maybe from a cache).
    fn listed(dir: &OwnedFd) -> Vec<String> {
        let mut v = entries(dir, OWNER_PREFIX);
        v.extend(entries(dir, RELEASING_PREFIX));
        v
    }

    /// Claims the acquisition with nonce `nonce` — a holder's, or a breaker's that claimed
    /// before us and died — by renaming its entry (`owner.`, `releasing.` or `claimed.`
    /// `<nonce>`) to `claimed.<our nonce>`, our own record left beside it first as
    /// `breaker.<our nonce>`: only one claimant can win, and until it frees the name it is
    /// known by its record. Then frees the name. `Ok(false)`: someone else claimed it first,
    /// or it is not in the lock directory now.
    fn claim(&mut self, dir: &OwnedFd, nonce: &str) -> Result<bool> {
        let me = Record::ours(&self.profile);
        let mine = format!("{BREAKER_PREFIX}{}", me.nonce);
        let to = format!("{CLAIMED_PREFIX}{}", me.nonce);
        trace!("claiming acquisition {nonce} as {}", me.nonce);
        let tmp = format!("new.{}", me.nonce);
        match lockdir::make_entry(dir.as_fd(), &mine, &me.render(), &tmp, self.dir.symlinks()) {
            Ok(()) => {}
            // The directory we opened was removed meanwhile (released or broken, and tidied;
            // ESTALE: removed through another client of a network filesystem).
            Err(Errno::ENOENT | Errno::ESTALE) => return Ok(false),
            Err(e) => {
                return Err(Error::path(
                    "cannot write breaker record in",
                    self.path(),
                    e.into(),
                ));
            }
        }
        let mut claimed = false;
        for prefix in [OWNER_PREFIX, RELEASING_PREFIX, CLAIMED_PREFIX] {
            // SMB: EBUSY while a reader on another mount has the entry open (a moment).
            let from = format!("{prefix}{nonce}");
            match lockdir::soon(|| renameat(dir, from.as_str(), dir, to.as_str())) {
                Ok(()) => {
                    trace!("claimed {prefix}{nonce} (renamed it to {to}); freeing the name");
                    claimed = true;
                    break;
                }
                // ESTALE: the directory we opened was removed through another client of a
                // network filesystem (GlusterFS, NFS) — the record is gone with it.
                Err(Errno::ENOENT | Errno::ESTALE) => {}
                Err(e) => {
                    let _ = unlinkat(dir, mine.as_str(), UnlinkatFlags::NoRemoveDir);
                    return Err(Error::path(
                        "cannot claim owner record of",
                        self.path(),
                        e.into(),
                    ));
                }
            }
        }
        // NFS may answer a retransmitted rename that succeeded with ENOENT: ours if it is
        // there under our name.
        if !claimed && fstatat(dir, to.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok() {
            claimed = true;
        }
        if !claimed {
            let _ = unlinkat(dir, mine.as_str(), UnlinkatFlags::NoRemoveDir);
            return Ok(false);
        }
        // The directory we looked into may have been renamed to a tombstone meanwhile (its
        // releaser then died while tidying): a claim there claims nothing at NAME.
        let here = fstat(dir).map(|st| (st.st_dev, st.st_ino));
        let name = self.dir.name.clone();
        let at_name = fstatat(
            self.dir.fd()?,
            name.as_os_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map(|st| (st.st_dev, st.st_ino));
        if here.is_err() || here != at_name {
            debug!("claimed a record in a directory that is no longer the lock");
            return Ok(false);
        }
        self.free_name(&crate::host::nonce(), &[])
    }

    /// The breaker that claimed the acquisition in `dir` and has not freed the name (yet):
    /// its record and its `claimed.<nonce>` entry. `(None, None)` if there is none (a
    /// locksmith that claims by unlinking, or a locker on NFS between `beat` and its owner
    /// entry): then the lock has no record.
    fn claimant(dir: &OwnedFd) -> (Option<Parsed>, Option<String>) {
        let Some(entry) = entries(dir, CLAIMED_PREFIX).into_iter().next() else {
            return (None, None);
        };
        let nonce = &entry[CLAIMED_PREFIX.len()..];
        match lockdir::read_entry(dir.as_fd(), &format!("{BREAKER_PREFIX}{nonce}")) {
            Ok(t) => (
                Some(Record::parse(&String::from_utf8_lossy(&t))),
                Some(entry),
            ),
            Err(_) => (None, None),
        }
    }

    /// Renames the lock directory to a tombstone (works even if something sits inside it),
    /// then tidies the tombstone; tidying may fail without leaving the lock held.
    /// `Ok(false)`: the name was gone already (a network filesystem's cache showed it).
    /// `known`: the entries the caller knows are inside (removed by name first).
    fn free_name(&mut self, nonce: &str, known: &[&str]) -> Result<bool> {
        let tomb = self.dir.beside(&format!(".{nonce}.tomb"));
        let name = self.dir.name.clone();
        let path = self.path().to_path_buf();
        let parent = self.dir.fd()?;
        // SMB refuses to rename a directory another client has open (a waiter looking into
        // the lock: EACCES, EBUSY) for as long as it has it open — milliseconds: try again,
        // for about two seconds, before calling it an error.
        let rename = || renameat(parent, name.as_os_str(), parent, tomb.as_os_str());
        let mut pause = Duration::from_millis(1);
        let mut renamed = rename();
        while matches!(renamed, Err(Errno::EACCES | Errno::EBUSY)) && pause < Duration::from_secs(1) {
            std::thread::sleep(pause + Duration::from_micros(fastrand::u64(0..1_000)));
            pause *= 2;
            renamed = rename();
        }
        match renamed {
            Ok(()) => trace!("freed the name: lock renamed to {}", tomb.to_string_lossy()),
            Err(Errno::ENOENT) => return Ok(false),
            Err(e) => {
                // Last resort: rmdir works if it is empty.
                unlinkat(parent, name.as_os_str(), UnlinkatFlags::RemoveDir)
                    .map_err(|_| Error::path("cannot remove lock directory", &path, e.into()))?;
                return Ok(true);
            }
        }
        if let Err(e) = tidy(parent, &tomb, known, true) {
            debug!(
                "left tombstone {} behind: {e}",
                self.dir.shown(&tomb).display()
            );
        }
        Ok(true)
    }
}

/// The owner record inside an unpublished `.NAME.<nonce>.new`: its `owner.<nonce>` entry,
/// else its heartbeat record (written first); `None` if it has neither yet.
fn unpublished_record(parent: BorrowedFd<'_>, new: &OsStr, nonce: &str) -> Option<Parsed> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(parent, new, flags, FileMode::empty()).ok()?;
    match lockdir::read_entry(fd.as_fd(), &format!("{OWNER_PREFIX}{nonce}")) {
        Ok(t) => Some(owner_record(&t, nonce)),
        Err(_) => {
            let t = lockdir::read_entry(fd.as_fd(), BEAT).ok()?;
            Some(Record::parse(&String::from_utf8_lossy(&t)))
        }
    }
}

/// What a local lock's owner entry says when it cannot say the whole record: the holder's
/// host tag, pid and start time (`SHORT_OWNER` `TAG.PID.START`), all proof of death needs;
/// the record itself is in `beat`. Under 60 bytes, so that ext4 keeps the symbolic link's
/// target in its inode: a longer one takes a block of its own, allocated at every
/// acquisition and freed at every release — and on a filesystem mounted with `discard`
/// (this machine's root) discarded too, ~45 µs of each cycle (issue 29). `None` where this
/// host cannot be tagged ([`crate::host::Host::tag`]): the whole record then.
fn short_owner(rec: &Record) -> Option<String> {
    let text = format!("{SHORT_OWNER}{}", maker_of(rec)?);
    (text.len() < 60).then_some(text)
}

/// The record an owner entry (`owner.<nonce>`, `releasing.<nonce>`) holds: the whole record,
/// or [`short_owner`]'s form, read as a holder known by its host tag, pid and start time.
fn owner_record(text: &[u8], nonce: &str) -> Parsed {
    let text = String::from_utf8_lossy(text);
    let Some(rest) = text.strip_prefix(SHORT_OWNER) else {
        return Record::parse(&text);
    };
    match parse_maker(rest) {
        Some((tag, pid, start)) => Parsed::V1(Record::tagged(&tag, pid, start, nonce)),
        None => Parsed::Foreign(text.chars().take(200).collect()),
    }
}

/// Removes a dead maker's unpublished directory: our records in it, then it, once (no
/// retries: nobody holds a file open there, and a directory that stays — something not ours
/// inside — is left for a later look).
fn tidy_once(parent: BorrowedFd<'_>, dir: &OsString) -> nix::Result<()> {
    remove_records(parent, dir)?;
    unlinkat(parent, dir.as_os_str(), UnlinkatFlags::RemoveDir)
}

/// Unlinks what a locksmith makes inside a lock directory (record entries, a breaker's and a
/// claimed record, a record being made, `beat`) from `dir` in `parent`, listed afresh; anything
/// else is left.
fn remove_records(parent: BorrowedFd<'_>, dir: &OsString) -> nix::Result<()> {
    // A new open file description each time: a shared one would keep its offset, and every
    // listing after the first would start at the end (and see nothing new).
    let fd = openat(
        parent,
        dir.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        FileMode::empty(),
    )?;
    let mut names: Vec<std::ffi::CString> = Vec::new();
    // What was listed before a failure is still removed; the directory's `rmdir` decides.
    let _ = crate::files::list(fd.as_fd(), |n| {
        let b = n.to_bytes();
        if is_record_entry(b)
            || [BREAKER_PREFIX, CLAIMED_PREFIX, "new.", BEAT]
                .iter()
                .any(|p| b.starts_with(p.as_bytes()))
        {
            names.push(n.to_owned());
        }
        ControlFlow::Continue(())
    });
    for n in &names {
        let _ = unlinkat(&fd, n.as_c_str(), UnlinkatFlags::NoRemoveDir);
    }
    Ok(())
}

/// Removes our records from a lock directory that is no longer the lock (a tombstone, or one
/// that was never published), then the directory itself.
///
/// A waiter on the same mount reading `beat` just then keeps the file alive under a hidden
/// name (`.fuse_hiddenXXXX`, NFS's `.nfsXXXX`) until it closes it — a few milliseconds, longer
/// on a loaded machine — and the directory is not empty till then: the removal is retried for
/// about 2.5 s (it was about 1.3 s: the clean-clone CI of session 20 left one tombstone in a
/// GlusterFS counter race).
///
/// An empty directory (a lock being made whose first record could not be created, e.g. for
/// want of descriptors) is removed whether or not a descriptor can be had; a listing holds one
/// descriptor, and the `O_PATH` reference below is let go when the listing cannot get one
/// (issue 28: under `ulimit -n` pressure a second one failed and the directory stayed).
///
/// `private`: `dir` is a name only we make (a tombstone, our `.new`), so ESTALE is a network
/// filesystem's passing answer about it; for the lock's own name (a plain `mkdir` whose records
/// failed) it may mean that the directory we made went, and the name is someone else's now.
fn tidy(parent: BorrowedFd<'_>, dir: &OsString, known: &[&str], private: bool) -> nix::Result<()> {
    let rmdir = || unlinkat(parent, dir.as_os_str(), UnlinkatFlags::RemoveDir);
    // Held open across the `rmdir` (an `O_PATH` reference), so that the directory is freed
    // when this is dropped, after the `rmdir` let go of the parent — not inside it, which
    // holds the parent locked the while: freeing a directory's block on ext4 mounted with
    // `discard` (this machine's root) waits for the device, and every look or `mkdir` beside
    // the lock waited with it (two loops of `run mkdir … -- true`: a waiter's `mkdir` of its
    // `.new` blocked 249 µs median, in 222 of 600 handoffs; issue 29).
    let mut held = openat(
        parent,
        dir.as_os_str(),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        FileMode::empty(),
    )
    .ok();
    // What the caller knows is inside goes first, by name: the usual tombstone (a release's
    // `releasing.<nonce>` and `beat`) is then removed without listing it (issue 29: a failed
    // rmdir and the listing's eight calls less per release).
    for name in known {
        let mut inside = dir.clone();
        inside.push("/");
        inside.push(name);
        let _ = unlinkat(parent, inside.as_os_str(), UnlinkatFlags::NoRemoveDir);
    }
    // Not empty yet (a file held open inside), or a network filesystem's passing ESTALE
    // (GlusterFS, under load: the stop's CI of session 29 left a tombstone so): again, after
    // a pause. Gone (`ENOENT`): another locker's look tidied it ([`Files::tidy_leftovers`]).
    let again = |r: &nix::Result<()>| match r {
        Err(Errno::ENOTEMPTY | Errno::EEXIST) => true,
        Err(Errno::ESTALE) => private,
        _ => false,
    };
    let done = |r: nix::Result<()>| match r {
        Err(Errno::ENOENT) => Ok(()),
        r => r,
    };
    let mut pause = Duration::from_millis(5);
    loop {
        let r = rmdir();
        if !again(&r) || pause >= Duration::from_millis(1500) {
            return done(r);
        }
        let listed = match remove_records(parent, dir) {
            Err(Errno::EMFILE | Errno::ENFILE) if held.is_some() => {
                held = None;
                remove_records(parent, dir)
            }
            r => r,
        };
        let r = listed.and_then(|()| rmdir());
        if !again(&r) {
            return done(r);
        }
        std::thread::sleep(pause);
        pause *= 2;
    }
}

/// Whether acquisition `nonce` was claimed in the lock directory `dir`: neither its
/// `owner.<nonce>` nor its `releasing.<nonce>` is there (looked up in that order, the order
/// in which a releasing holder renames one to the other).
fn claimed(dir: &OwnedFd, nonce: &str) -> bool {
    [OWNER_PREFIX, RELEASING_PREFIX].iter().all(|prefix| {
        let entry = format!("{prefix}{nonce}");
        matches!(
            lockdir::unstale(|| fstatat(dir, entry.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW)),
            Err(Errno::ENOENT)
        )
    })
}

/// [`entries`] of the directory `name` in `parent` (not followed if a symbolic link; nothing
/// if it cannot be opened as a directory).
fn entries_at(parent: BorrowedFd<'_>, name: &OsStr, prefix: &str) -> Vec<String> {
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    match openat(parent, name, flags, FileMode::empty()) {
        Ok(fd) => entries(&fd, prefix),
        Err(_) => Vec::new(),
    }
}

/// The names starting with `prefix` that a listing of `dir` shows (maybe from a cache).
fn entries(dir: &OwnedFd, prefix: &str) -> Vec<String> {
    // Opened anew: `dir` may be an O_PATH descriptor (`open_lock`), and a listing of its own
    // starts at the beginning.
    let mut out = Vec::new();
    let _ = crate::files::each_name(dir.as_fd(), ".", OFlag::empty(), |n| {
        if n.to_bytes().starts_with(prefix.as_bytes()) {
            out.push(String::from_utf8_lossy(n.to_bytes()).into_owned());
        }
        ControlFlow::Continue(())
    });
    out
}

impl Holders for Files {
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        let Some(dir) = self.open_lock()? else {
            return Ok(None);
        };
        let name = self.dir.name.clone();
        // Who holds it now: the heartbeat record, read fresh. Without one (an older
        // locksmith's lock, or a locker between mkdir and its records), the listing.
        let beat = lockdir::read_record(
            dir.as_fd(),
            BEAT.as_ref(),
            &self.dir.shown(self.inside(BEAT)),
        )?;
        let from_beat = beat.as_ref().and_then(|(c, _)| match lockdir::parse(c) {
            Parsed::V1(r) => Some(r),
            Parsed::Foreign(_) => None,
        });
        let (record, entry) = match from_beat {
            // The acquisition the heartbeat record names holds the lock only while its
            // entry is there: `owner.<nonce>`, or `releasing.<nonce>` while its holder
            // releases. With neither, someone claimed it (released or broke it) and has not
            // freed the name yet, maybe killed before it could: judging the holder the record
            // names would wait forever (its entry is gone, no breaker can win it again). The
            // lock is the claimant's now: a breaker is known by its record; without one (a
            // locksmith that claims by unlinking), the lock has no record, and the rule for
            // a directory without one applies (no change for `stale_after`).
            Some(r) if claimed(&dir, &r.nonce) => Self::claimant(&dir),
            Some(r) => {
                let entry = format!("{OWNER_PREFIX}{}", r.nonce);
                (Some(Parsed::V1(r)), Some(entry))
            }
            None => match Self::listed(&dir).into_iter().next() {
                Some(entry) => match lockdir::read_entry(dir.as_fd(), &entry) {
                    Ok(t) => {
                        let nonce = entry.split_once('.').map_or("", |(_, n)| n);
                        (Some(owner_record(&t, nonce)), Some(entry))
                    }
                    Err(_) => (None, None),
                },
                None => Self::claimant(&dir),
            },
        };
        let st = match &entry {
            Some(e) => fstatat(&dir, e.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok(),
            None => fstat(&dir).ok(),
        };
        // A lock directory with no record — on a network filesystem too: a live holder's
        // heartbeat record, read fresh, would be there (a locker writes it at once, into the
        // directory it made, or leaves that directory alone: `make_dir`), and its appearing
        // changes the sign; the listing and the directory's stat may come from a cache, which
        // only delays the verdict. So the rule for a lock without a record applies (no change
        // for stale_after): a locker killed between mkdir and its records on NFS or sshfs must
        // not leave a lock that only --force breaks.
        let key = match &record {
            Some(Parsed::V1(r)) => OsString::from(&r.nonce),
            _ => name,
        };
        Ok(Some(vec![Evidence {
            key,
            record,
            sign: sign_of(beat.as_ref().map(|(c, _)| c.as_slice()), st.as_ref()),
            mode: Mode::Exclusive,
            age: None,
        }]))
    }

    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let Some(dir) = self.open_lock()? else {
            return Ok(false);
        };
        match &ev.record {
            Some(Parsed::V1(r)) => {
                let nonce = r.nonce.clone();
                self.claim(&dir, &nonce)
            }
            Some(Parsed::Foreign(_)) | None => {
                // No record of ours to claim: break it only if nothing changed since we
                // judged (the heartbeat record read fresh, the listing), then free the name.
                let mut now = self.holders()?.unwrap_or_default();
                match now.pop() {
                    Some(e) if e.sign == ev.sign => {}
                    _ => return Ok(false),
                }
                if let Some(Parsed::Foreign(_)) = &ev.record
                    && let Some(entry) = Self::listed(&dir).into_iter().next()
                {
                    return self.claim(&dir, entry.split_once('.').map_or("", |(_, n)| n));
                }
                self.free_name(&crate::host::nonce(), &[])
            }
        }
    }
}

impl Scheme for Files {
    /// Our record and its heartbeat counter.
    type Held = (Record, u64);
    const NAME: &'static str = "mkdir";
    const PROBE: Probe = Probe::Mkdir;
    const SHARED: bool = false;

    fn new(cfg: &FsConfig, lock: &Named) -> Files {
        Files {
            profile: lock.name.to_string(),
            dir: LockDir::new(cfg, &lock.common),
            file_mode: cfg.file_mode,
            group: cfg.group,
            // A test switch: behave as on NFS (no RENAME_NOREPLACE), so the tests cover the
            // path NFS users take on a machine that cannot mount NFS.
            plain_mkdir: faults::on(Switch::MkdirPlain),
            publish_by_rename: false,
        }
    }

    fn dir(&self) -> &LockDir {
        &self.dir
    }

    fn dir_mut(&mut self) -> &mut LockDir {
        &mut self.dir
    }

    /// Holding the name: take exactly the fencing token our records name, marking the state
    /// "not cleanly released" until our release says otherwise. If the state moved past it
    /// (someone took and released the lock since we read it, or we stalled here and were
    /// broken), the name is given back and we look again.
    fn take(&mut self) -> Result<Take<(Record, u64)>> {
        let Some(mut rec) = self.create()? else {
            return Ok(Take::Taken);
        };
        let token = rec.token.unwrap_or(0);
        let issued = self.dir.issue_token_exactly(token);
        if let Ok(Some(issued)) = issued {
            trace!("took the name: nonce {} token {token}", rec.nonce);
            if lockdir::tidies(rec.token) {
                self.tidy_leftovers(&rec.nonce);
            }
            return Ok(Take::Held((rec, 0), Some(issued)));
        }
        // Given back as a release does: claimed first (our owner entry, which exists only in
        // our own directory), so a lock broken and taken by a successor meanwhile is never
        // freed. No token of ours to mark clean.
        rec.token = None;
        if let Err(nr) = self.release((rec, 0)) {
            debug!("giving back what we made: {}", nr.error);
        }
        match issued {
            Ok(_) => {
                debug!(
                    "fencing token {token} was overtaken while we took {}: giving it back",
                    self.path().display()
                );
                Ok(Take::Again)
            }
            Err(e) => Err(e),
        }
    }

    fn beat(&mut self, held: &mut (Record, u64)) -> Result<()> {
        let (rec, n) = held;
        let path = self.path().to_path_buf();
        let (beat, owner) = (
            self.inside(BEAT),
            self.inside(&format!("{OWNER_PREFIX}{}", rec.nonce)),
        );
        let (parent, remote) = self.dir.fd_remote()?;
        if !lockdir::write_beat(parent, beat.as_os_str(), &path, rec, *n + 1, remote)? {
            return Err(err!(
                Lost,
                "lock {} was broken: our heartbeat record is gone",
                path.display()
            ));
        }
        // Our claim is the owner entry: still there? (A network filesystem may answer from a
        // cache: the record above is what waiters judge by.)
        match fstatat(parent, &owner, AtFlags::AT_SYMLINK_NOFOLLOW).map(drop) {
            Ok(()) => {}
            Err(Errno::ENOENT) => {
                return Err(err!(
                    Lost,
                    "lock {} was broken: our owner record is gone",
                    path.display()
                ));
            }
            Err(e) => return Err(Error::path("cannot heartbeat lock", &path, e.into())),
        }
        *n += 1;
        Ok(())
    }

    fn release(&mut self, held: (Record, u64)) -> std::result::Result<(), NotReleased<(Record, u64)>> {
        let rec = &held.0;
        let path = self.path().to_path_buf();
        let owner = self.inside(&format!("{OWNER_PREFIX}{}", rec.nonce));
        let claimed = self.inside(&format!("{RELEASING_PREFIX}{}", rec.nonce));
        let parent = self.dir.fd().map_err(NotReleased::done)?;
        // The claim: from here nobody else may remove or take this acquisition.
        match lockdir::soon(|| renameat(parent, &owner, parent, &claimed)) {
            Ok(()) => {}
            Err(Errno::ENOENT) => {
                return Err(NotReleased::done(err!(
                    Lost,
                    "lock {} was broken while held: our owner record is gone",
                    path.display()
                )));
            }
            Err(e) => {
                // Still ours: the caller may retry.
                return Err(NotReleased {
                    error: Error::path("cannot release lock", &path, e.into()),
                    retry: Some((held.0, 0)),
                });
            }
        }
        self.free_claimed(rec, &claimed).map_err(NotReleased::done)
    }
}

impl Files {
    /// After our claim (`releasing.<nonce>`): frees the name if the lock we claimed in is ours.
    fn free_claimed(&mut self, rec: &Record, claimed: &Path) -> Result<()> {
        let path = self.path().to_path_buf();
        // The claim went by NAME's path (as every write does on a path-based network
        // filesystem such as sshfs): our entry may have been planted in a successor's lock by
        // a write that stalled past our lock's break. Ours only if its heartbeat record is
        // ours; else take the entry back out and free nothing. (A local filesystem writes
        // through our descriptors: nothing to check.)
        let beat = self.inside(BEAT);
        let shown = self.dir.shown(&beat);
        let ours = !self.dir.remote()
            || match self.open_lock()? {
                Some(d) => lockdir::read_record(d.as_fd(), BEAT.as_ref(), &shown)?
                    .is_some_and(|(c, _)| lockdir::is_ours(&c, rec)),
                None => false,
            };
        if !ours {
            let parent = self.dir.fd()?;
            let _ = unlinkat(parent, claimed, UnlinkatFlags::NoRemoveDir);
            return Err(err!(
                Lost,
                "lock {} was broken while held: it holds another's heartbeat record",
                path.display()
            ));
        }
        // Still holding the name: say this acquisition ended cleanly, unless the state moved
        // on (only possible after a pause longer than stale_after).
        if let Some(token) = rec.token
            && let Err(e) = self.dir.mark_clean(token)
        {
            info!("{e}; the next holder will see prev=crashed");
        }
        let releasing = format!("{RELEASING_PREFIX}{}", rec.nonce);
        self.free_name(&rec.nonce, &[&releasing, BEAT]).map(drop)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_short_owner_entry_fits_an_inode_and_names_its_holder() {
        use super::{Parsed, Record, owner_record, short_owner};
        let mut rec = Record::ours("m");
        rec.pid = 4_194_304; // pid_max's most
        rec.start = 999_999_999_999; // 300 years of uptime at 100 ticks a second
        let text = short_owner(&rec).expect("this host has a tag");
        assert!(text.len() < 60, "{text}");
        match owner_record(text.as_bytes(), "0123456789abcdef") {
            Parsed::V1(r) => {
                assert!(r.same_host(), "ours: proof of death applies");
                assert_eq!((r.pid, r.start), (rec.pid, rec.start));
                assert_eq!(r.nonce, "0123456789abcdef");
            }
            other => panic!("{other:?}"),
        }
        // Another host's (or pid namespace's) tag: judged by its heartbeat.
        let other = "locksmith-beat 0123456789abcdef.42.7";
        match owner_record(other.as_bytes(), "n") {
            Parsed::V1(r) => assert!(!r.same_host() && r.pid == 42 && r.start == 7),
            other => panic!("{other:?}"),
        }
        // A whole record is read as before; anything else in that form is foreign.
        let whole = rec.render();
        assert_eq!(
            owner_record(whole.as_bytes(), "x"),
            Record::parse(&whole),
            "the whole record"
        );
        for bad in [
            "locksmith-beat 0123.42.7",
            "locksmith-beat 0123456789abcdef.0.7",
            "locksmith-beat 0123456789abcdef.42",
            "locksmith-beat 0123456789abcdef.42.7.1",
        ] {
            assert!(
                matches!(owner_record(bad.as_bytes(), "n"), Parsed::Foreign(_)),
                "{bad}"
            );
        }
    }
}
