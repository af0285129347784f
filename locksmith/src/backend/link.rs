//! `backend = "link"`: an NFS-safe lock *file* made with `link(2)` (seed 002, done right).
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PARENT/NAME                    the lock file: exists exactly while held; content = owner record
//! PARENT/.NAME.<nonce>.tmp       a would-be lock file, hard-linked to NAME, then removed
//! PARENT/.NAME.break             held (same scheme) by the one waiter breaking a dead lock
//! PARENT/.NAME.state             symlink; the state record (last fencing token, clean?)
//! ```
//! To acquire, write the owner record into a unique temp file beside the lock, `link(2)` it to
//! NAME, and judge success by the temp file's **link count being 2** — on NFS `link` can
//! report failure after succeeding (a retransmitted request) — then remove the temp file
//! either way. The holder keeps its inode open: the heartbeat sets its times (`futimens`) and
//! checks NAME is still that inode.
//!
//! # Breaking
//! A waiter that judged the holder dead (same host: proof of death at once) or silent (NAME's
//! inode and ctime unchanged for `stale_after` on its own clock) first takes `.NAME.break`
//! (the same link scheme), then — serialised — checks NAME is still the inode and record it
//! judged, and only then unlinks it; so two breakers never both win and no breaker removes a
//! successor's lock. A dead breaker's `.NAME.break` is itself broken by proof of death, or
//! after `stale_after`.
//!
//! # Limits
//! The holder's release checks NAME is still its inode, then unlinks it: a holder paused for
//! longer than `stale_after` exactly between the two could remove a successor's lock (the
//! same honest limit as every lease). Readers open the lock file to read its record; on NFS a
//! reader holding it open while it is unlinked only leaves a `.nfsXXXX` file behind, the name
//! is free at once.

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode as FileMode, fstat, fstatat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};

use super::owner::{self, Parsed, Record, State};
use super::wake::Wakeups;
use super::{Attempt, Backend, BreakOutcome, Grant, Holder, WaitHint};
use crate::error::{Error, Kind, Result, err};
use crate::log::info;
use crate::profile::{FsConfig, Profile, fmt_duration};
use crate::watch::{Event, Watcher};

pub struct Link {
    cfg: FsConfig,
    profile: String,
    stale_after: Duration,
    heartbeat: Duration,
    poll: Duration,
    parent: PathBuf,
    name: OsString,
    parent_fd: Option<OwnedFd>,
    /// Our record and our lock file's inode, while we hold the lock.
    ours: Option<(Record, File)>,
    /// What a waiter last saw of a lock it cannot judge at once (inode, ctime), and since when.
    observed: Option<(Seen, Instant)>,
    /// inotify on the parent and the pidfd of a same-host holder.
    wake: Wakeups,
    prev_crashed: bool,
}

/// What a waiter sees of a lock file: its inode and ctime (a heartbeat changes the ctime).
type Seen = (u64, (i64, i64));

/// One look at a lock file.
struct Inspection {
    ino: u64,
    ctime: (i64, i64),
    record: Option<Parsed>,
}

impl Link {
    pub fn new(cfg: FsConfig, profile: &Profile) -> Link {
        let parent = cfg
            .path
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        let name = cfg.path.file_name().map(OsString::from).unwrap_or_default();
        Link {
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
        }
    }

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
            let st = fstat(&fd).map_err(|e| {
                Error::path(
                    "cannot stat the directory of lock",
                    &self.cfg.path,
                    e.into(),
                )
            })?;
            super::mkdir::check_dir_mode(st.st_mode, &self.parent)?;
            super::nfs::check(fd.as_fd(), &self.parent, self.stale_after, self.cfg.local)?;
            self.parent_fd = Some(fd);
        }
        Ok(self.parent_fd.as_ref().expect("opened above").as_fd())
    }

    fn beside(&self, suffix: &str) -> OsString {
        let mut n = OsString::from(".");
        n.push(&self.name);
        n.push(suffix);
        n
    }

    /// Writes `rec` into a fresh temp file and links it to `target`. `Ok(Some(file))`: we
    /// made `target` (the link count said 2); `Ok(None)`: it exists.
    fn link_new(&mut self, rec: &Record, target: &OsString) -> Result<Option<File>> {
        let tmp = self.beside(&format!(".{}.tmp", rec.nonce));
        let path = self.cfg.path.clone();
        let (mode, group) = (self.cfg.file_mode, self.cfg.group);
        let parent = self.parent_fd()?;
        let fd = openat(
            parent,
            tmp.as_os_str(),
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            FileMode::from_bits_truncate(mode.unwrap_or(0o644)),
        )
        .map_err(|e| Error::path("cannot create a lock file beside", &path, e.into()))?;
        let mut file = File::from(fd);
        let linked = (|| -> Result<bool> {
            file.write_all(format!("{}\n", rec.render()).as_bytes())
                .map_err(|e| Error::path("cannot write owner record beside", &path, e))?;
            if let Some(m) = mode {
                nix::sys::stat::fchmod(&file, FileMode::from_bits_truncate(m))
                    .map_err(|e| Error::path("cannot chmod a lock file beside", &path, e.into()))?;
            }
            if let Some(g) = group {
                nix::unistd::fchown(&file, None, Some(nix::unistd::Gid::from_raw(g)))
                    .map_err(|e| Error::path("cannot chgrp a lock file beside", &path, e.into()))?;
            }
            let r = linkat(
                parent,
                tmp.as_os_str(),
                parent,
                target.as_os_str(),
                AtFlags::empty(),
            );
            // Judge by the link count, not by link(2)'s answer (NFS may say EEXIST after a
            // retransmitted, successful request).
            let nlink = fstat(&file)
                .map_err(|e| Error::path("cannot stat a lock file beside", &path, e.into()))?
                .st_nlink;
            match r {
                _ if nlink == 2 => Ok(true),
                Ok(()) | Err(Errno::EEXIST) => Ok(false),
                Err(e) => Err(Error::path("cannot create lock", &path, e.into())),
            }
        })();
        let _ = unlinkat(parent, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        Ok(linked?.then_some(file))
    }

    /// Opens and reads a lock file without changing it. `None`: there is none.
    fn inspect_file(&mut self, name: &OsString) -> Result<Option<Inspection>> {
        let path = self.parent.join(name);
        let parent = self.parent_fd()?;
        let fd = match openat(
            parent,
            name.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
            FileMode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => {
                return Err(err!(
                    Denied,
                    "lock path {} is a symbolic link: refusing to follow it",
                    path.display()
                ));
            }
            Err(e) => return Err(Error::path("cannot inspect lock", &path, e.into())),
        };
        let st = fstat(&fd).map_err(|e| Error::path("cannot stat lock", &path, e.into()))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(err!(
                Config,
                "lock path {} is not a regular file",
                path.display()
            ));
        }
        let mut text = String::new();
        let _ = File::from(fd).take(4096).read_to_string(&mut text);
        Ok(Some(Inspection {
            ino: st.st_ino,
            ctime: (st.st_ctime, st.st_ctime_nsec),
            record: (!text.trim().is_empty()).then(|| Record::parse(text.trim())),
        }))
    }

    fn inspect(&mut self) -> Result<Option<Inspection>> {
        let name = self.name.clone();
        self.inspect_file(&name)
    }

    fn silent_for_stale(&mut self, what: Seen) -> bool {
        match &self.observed {
            Some((seen, since)) if *seen == what => since.elapsed() >= self.stale_after,
            _ => {
                self.observed = Some((what, Instant::now()));
                false
            }
        }
    }

    /// Decides about an existing lock: `Some(holders)` busy, `None` it was just broken (or
    /// vanished: try again).
    fn judge(&mut self, ins: Inspection) -> Result<Option<Vec<Holder>>> {
        let rec = match &ins.record {
            Some(Parsed::V1(rec)) => Some(rec.clone()),
            Some(foreign @ Parsed::Foreign(_)) => return Ok(Some(vec![foreign.holder()])),
            None => None,
        };
        let mut holder = rec.as_ref().map(Record::holder).unwrap_or_default();
        match &rec {
            Some(rec) if rec.same_host() => {
                if self.wake.holder_alive(rec.pid, rec.start) {
                    return Ok(Some(vec![holder]));
                }
                info!(
                    "breaking lock {} of dead holder {holder} (same host: proof of death)",
                    self.cfg.path.display()
                );
            }
            Some(_) if self.cfg.local => {
                return Err(err!(
                    Config,
                    "profile `{}` says local = true, but lock {} is held by {holder} from another host or pid namespace",
                    self.profile,
                    self.cfg.path.display()
                ));
            }
            _ => {
                if !self.silent_for_stale((ins.ino, ins.ctime)) {
                    return Ok(Some(vec![holder]));
                }
                holder.alive = Some(false);
                info!(
                    "breaking lock {} of {holder}: no heartbeat for {}",
                    self.cfg.path.display(),
                    fmt_duration(self.stale_after)
                );
            }
        }
        self.observed = None;
        if self.break_exact(ins.ino, rec.as_ref().map(|r| r.nonce.as_str()))? {
            self.prev_crashed = true;
            Ok(None)
        } else {
            Ok(Some(vec![holder]))
        }
    }

    /// Removes NAME if it still is inode `ino` with record `nonce`, serialised by
    /// `.NAME.break`. `Ok(false)`: another breaker is at work (or won); try again later.
    fn break_exact(&mut self, ino: u64, nonce: Option<&str>) -> Result<bool> {
        let guard_name = self.beside(".break");
        let me = Record::ours(&self.profile);
        let guard = match self.link_new(&me, &guard_name)? {
            Some(g) => g,
            None => {
                // Someone else is breaking. If they died doing it, clear their guard.
                if let Some(ins) = self.inspect_file(&guard_name)?
                    && let Some(Parsed::V1(r)) = &ins.record
                    && r.same_host()
                    && !crate::host::alive(r.pid, r.start)
                {
                    self.unlink_if(&guard_name, ins.ino);
                }
                return Ok(false);
            }
        };
        let still = self.inspect()?.filter(|now| {
            now.ino == ino
                && match (&now.record, nonce) {
                    (Some(Parsed::V1(r)), Some(n)) => r.nonce == n,
                    (None, None) => true,
                    _ => false,
                }
        });
        let broke = still.is_some() && self.unlink_if(&self.name.clone(), ino);
        let guard_ino = fstat(&guard).map(|s| s.st_ino).unwrap_or(0);
        self.unlink_if(&guard_name, guard_ino);
        Ok(broke)
    }

    /// Unlinks `name` if it still is inode `ino` (a check right before the act; breakers are
    /// serialised, so only a holder paused past `stale_after` could slip in between).
    fn unlink_if(&mut self, name: &OsString, ino: u64) -> bool {
        let Ok(parent) = self.parent_fd() else {
            return false;
        };
        match fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_ino == ino => {
                unlinkat(parent, name.as_os_str(), UnlinkatFlags::NoRemoveDir).is_ok()
            }
            _ => false,
        }
    }

    fn state_name(&self) -> OsString {
        self.beside(".state")
    }

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

    /// Holding: fencing token (rewriting the record if the speculated one was overtaken),
    /// state marked "not cleanly released" until our release says otherwise.
    fn finish_create(&mut self, rec: &mut Record, file: &mut File) -> Result<()> {
        let state = self.read_state()?;
        let token = state.map_or(1, |s| s.token + 1);
        if state.is_some_and(|s| !s.clean) {
            self.prev_crashed = true;
        }
        if rec.token != Some(token) {
            rec.token = Some(token);
            let text = format!("{}\n", rec.render());
            let path = self.cfg.path.clone();
            use std::os::unix::fs::FileExt;
            file.write_all_at(text.as_bytes(), 0)
                .and_then(|()| file.set_len(text.len() as u64))
                .map_err(|e| Error::path("cannot write owner record of", &path, e))?;
        }
        self.write_state(State {
            token,
            clean: false,
        })
    }

    /// Whether NAME still is the inode we hold open.
    fn still_ours(&mut self) -> Result<bool> {
        let Some((_, file)) = &self.ours else {
            return Ok(false);
        };
        let mine = fstat(file.as_fd())
            .map_err(|e| Error::path("cannot stat lock", &self.cfg.path, e.into()))?
            .st_ino;
        let name = self.name.clone();
        let path = self.cfg.path.clone();
        let parent = self.parent_fd()?;
        match fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(st.st_ino == mine),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(Error::path("cannot stat lock", &path, e.into())),
        }
    }
}

impl Backend for Link {
    fn name(&self) -> &'static str {
        "link"
    }

    fn try_acquire(&mut self) -> Result<Attempt> {
        self.wake.drain();
        let mut holders = Vec::new();
        for _ in 0..4 {
            let name = self.name.clone();
            let exists = {
                let parent = self.parent_fd()?;
                fstatat(parent, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok()
            };
            if !exists {
                let mut rec = Record::ours(&self.profile);
                rec.token = Some(self.read_state()?.map_or(1, |s| s.token + 1));
                if let Some(mut file) = self.link_new(&rec, &name)? {
                    if let Err(e) = self.finish_create(&mut rec, &mut file) {
                        let ino = fstat(&file).map(|s| s.st_ino).unwrap_or(0);
                        self.unlink_if(&name, ino);
                        return Err(e);
                    }
                    self.ours = Some((rec.clone(), file));
                    self.observed = None;
                    self.wake.forget_holder();
                    return Ok(Attempt::Acquired(Grant {
                        token: rec.token,
                        prev_crashed: std::mem::take(&mut self.prev_crashed),
                    }));
                }
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
        let path = self.cfg.path.clone();
        let Some((_, file)) = &self.ours else {
            return Err(err!(Lost, "not holding"));
        };
        let now = TimeSpec::UTIME_NOW;
        nix::sys::stat::futimens(file.as_fd(), &now, &now)
            .map_err(|e| Error::path("cannot heartbeat lock", &path, e.into()))?;
        if !self.still_ours()? {
            return Err(err!(
                Lost,
                "lock {} was broken: it is no longer our file",
                path.display()
            ));
        }
        Ok(())
    }

    fn release(&mut self) -> Result<()> {
        if self.ours.is_none() {
            return Ok(());
        }
        let path = self.cfg.path.clone();
        if !self.still_ours()? {
            self.ours = None;
            return Err(err!(
                Lost,
                "lock {} was broken while held: it is no longer our file",
                path.display()
            ));
        }
        let (rec, file) = self.ours.take().expect("checked above");
        if let Some(token) = rec.token
            && self.read_state().ok().flatten().map(|s| s.token) == Some(token)
            && let Err(e) = self.write_state(State { token, clean: true })
        {
            info!("{e}; the next holder will see prev=crashed");
        }
        let ino = fstat(file.as_fd()).map(|s| s.st_ino).unwrap_or(0);
        let name = self.name.clone();
        if !self.unlink_if(&name, ino) {
            return Err(err!(
                Lost,
                "lock {} was broken while releasing it",
                path.display()
            ));
        }
        Ok(())
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(match self.inspect()? {
            None => Vec::new(),
            Some(ins) => vec![ins.record.map(|p| p.holder()).unwrap_or_default()],
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
            let holder = ins.record.as_ref().map(|p| p.holder()).unwrap_or_default();
            let rec = match &ins.record {
                Some(Parsed::V1(r)) => Some(r.clone()),
                _ => None,
            };
            if let Some(t) = token
                && rec.as_ref().and_then(|r| r.token) != Some(t)
            {
                return Err(err!(
                    Busy,
                    "lock {} is not acquisition {t} ({holder}); nothing broken",
                    self.cfg.path.display()
                ));
            }
            let decided = match (&ins.record, &rec) {
                _ if force => true,
                (Some(Parsed::Foreign(_)), _) => {
                    return Err(err!(
                        Busy,
                        "lock {} has an owner record of another format ({holder}); only --force breaks it",
                        self.cfg.path.display()
                    ));
                }
                (_, Some(r)) if r.same_host() => {
                    if crate::host::alive(r.pid, r.start) {
                        return Err(err!(
                            Busy,
                            "lock {} is held by {holder}, which is alive; use --force to break it anyway",
                            self.cfg.path.display()
                        ));
                    }
                    true
                }
                _ => {
                    if self
                        .observed
                        .as_ref()
                        .is_some_and(|(seen, _)| *seen != (ins.ino, ins.ctime))
                    {
                        return Err(err!(
                            Busy,
                            "lock {} is held by {holder}, which is alive: its heartbeat changed the lock",
                            self.cfg.path.display()
                        ));
                    }
                    self.silent_for_stale((ins.ino, ins.ctime))
                }
            };
            // If this fails, another breaker is at work or the lock changed: look again shortly.
            if decided && self.break_exact(ins.ino, rec.as_ref().map(|r| r.nonce.as_str()))? {
                info!("broke lock {} of {holder}", self.cfg.path.display());
                return Ok(BreakOutcome::Broken(holder));
            }
            if !decided && !announced {
                info!(
                    "lock {} is held by {holder} on another host; breaking it if it stays silent for {}",
                    self.cfg.path.display(),
                    fmt_duration(self.stale_after)
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
