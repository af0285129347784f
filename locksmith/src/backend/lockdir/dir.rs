//! A lock's directory, opened once: every later call is relative to it (`*at`), on the
//! filesystem [`super::fs`] detected.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{FileStat, Mode as FileMode, fstat};

use super::config::FsConfig;
use super::fs::{Fs, check, check_dir_mode_on, detect};
use super::record::{reach_server, read_record};
use super::state::Issued;
use crate::backend::faults::{self, Stall};
use crate::backend::lock::Agree;
use crate::backend::owner::State;
use crate::error::{Error, Result, err};

/// A lock's directory, opened once.
pub struct LockDir {
    /// The lock itself, for messages.
    pub path: PathBuf,
    pub parent: PathBuf,
    pub name: OsString,
    cfg: FsConfig,
    stale_after: Duration,
    /// The lock's number of slots (SPEC §3b), recorded with each token.
    slots: u32,
    /// What to ask before issuing over another recorded number of slots (SPEC §3b).
    agree: Option<Agree>,
    fd: Option<OwnedFd>,
    fs: Option<Fs>,
    /// Whether the filesystem keeps symbolic links (learnt on the first refusal: SMB has none),
    /// and with it which form record entries take ([`super::make_entry`]).
    symlinks: std::cell::Cell<bool>,
    /// The longest name the parent's filesystem takes (`statfs`), once it answered.
    name_max: Option<usize>,
}

impl LockDir {
    /// How long after making the lock a locker may still write into it by a name it looked
    /// up: a waiter may break a lock that showed no change for `stale_after` (half a
    /// `stale_after` of margin for a waiter that saw it late and a slow clock).
    pub fn making_budget(&self) -> Duration {
        self.stale_after / 2
    }

    pub fn new(cfg: &FsConfig, common: &crate::settings::Common) -> LockDir {
        let (stale_after, slots) = (common.stale_after, common.slots);
        LockDir {
            path: cfg.path.clone(),
            parent: cfg
                .path
                .parent()
                .map_or_else(|| PathBuf::from("/"), PathBuf::from),
            name: cfg.path.file_name().map(OsString::from).unwrap_or_default(),
            cfg: cfg.clone(),
            stale_after,
            slots,
            agree: None,
            fd: None,
            fs: None,
            symlinks: std::cell::Cell::new(true),
            name_max: None,
        }
    }

    /// The parent directory: opened, its mode and filesystem checked, on first use.
    pub fn fd(&mut self) -> Result<BorrowedFd<'_>> {
        if self.fd.is_none() {
            let fd = nix::fcntl::open(
                &self.parent,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                FileMode::empty(),
            )
            .map_err(|e| Error::path("cannot open the directory of lock", &self.path, e.into()))?;
            let st = fstat(&fd).map_err(|e| {
                Error::path("cannot stat the directory of lock", &self.path, e.into())
            })?;
            let fs = detect(fd.as_fd());
            check_dir_mode_on(st.st_mode, &self.parent, &fs)?;
            check(&fs, &self.parent, &self.cfg, self.stale_after, true)?;
            self.fs = Some(fs);
            self.fd = Some(fd);
        }
        Ok(self.fd.as_ref().expect("opened above").as_fd())
    }

    /// The parent directory ([`fd`](Self::fd)) and whether it is on a network or FUSE
    /// filesystem.
    pub fn fd_remote(&mut self) -> Result<(BorrowedFd<'_>, bool)> {
        self.fd()?;
        let remote = self.remote();
        Ok((self.fd.as_ref().expect("opened above").as_fd(), remote))
    }

    /// Whether the lock is on a network or FUSE filesystem (known once [`fd`](Self::fd) ran).
    pub fn remote(&self) -> bool {
        self.fs.as_ref().is_some_and(|f| f.remote)
    }

    /// Whether the filesystem keeps symbolic links, as far as known ([`super::make_entry`]).
    pub fn symlinks(&self) -> &std::cell::Cell<bool> {
        &self.symlinks
    }

    /// The filesystem's name for messages (known once [`fd`](Self::fd) ran).
    pub fn fs_name(&self) -> &str {
        self.fs.as_ref().map_or("", |f| f.name.as_str())
    }

    /// The longest name the parent's filesystem takes, at most 255 (its `statfs`; kept once
    /// it answered, 255 while it does not).
    pub fn name_max(&mut self) -> usize {
        if self.name_max.is_none() {
            self.name_max = self
                .fd()
                .ok()
                .and_then(|fd| nix::sys::statfs::fstatfs(fd).ok())
                .map(|s| s.maximum_name_length() as usize);
        }
        self.name_max.unwrap_or(255).min(255)
    }

    /// The name of the lock whose slots these are (its own where it has none): the NAME of
    /// the entries beside it that every slot shares (`.NAME.state`, leftovers).
    pub fn lock_name(&self) -> &OsStr {
        self.cfg.token_name()
    }

    /// `.NAME<suffix>`: a name beside the lock.
    pub fn beside(&self, suffix: &str) -> OsString {
        let mut n = OsString::from(".");
        n.push(&self.name);
        n.push(suffix);
        n
    }

    /// Which entries of the parent going away may be a release of this lock, for a waiter
    /// watching the parent (`wake::Releases`): NAME itself (unlinked, or renamed to a
    /// tombstone) and a waiting writer's mark (`.NAME.w.<nonce>`, which holds readers off).
    /// Not a contender's `.NAME.<nonce>….new` or `.tmp` tidied after a failed try, a
    /// tombstone's removal, nor any other lock's entries (`NAME.slot-1` is not `NAME`).
    pub fn releases(&self) -> crate::backend::wake::Releases {
        let name = self.name.as_bytes().to_vec();
        let marks = self.beside(".w.").into_vec();
        Box::new(move |entry: &OsStr| {
            let entry = entry.as_bytes();
            entry == name.as_slice() || entry.starts_with(&marks)
        })
    }

    /// The waiters' queue beside the lock (`.NAME.queue`, see `wake.rs`); `None` on a
    /// network or FUSE filesystem (known once [`fd`](Self::fd) ran), where every waiter polls.
    pub fn queue(&self) -> Option<crate::backend::wake::QueueAt> {
        (!self.remote()).then(|| crate::backend::wake::QueueAt {
            path: self.shown(self.beside(".queue")),
            mode: self.cfg.file_mode,
            group: self.cfg.group,
        })
    }

    /// A name relative to the parent, for messages.
    pub fn shown(&self, name: impl AsRef<Path>) -> PathBuf {
        self.parent.join(name)
    }

    /// `name` in `at` (a directory opened beside the lock, with its name there), else in the
    /// parent, for messages: the path where the call was made (issue 28).
    pub fn shown_in(&self, at: Option<(BorrowedFd<'_>, &OsStr)>, name: &OsStr) -> PathBuf {
        match at {
            Some((_, sub)) => self.shown(sub).join(name),
            None => self.shown(name),
        }
    }

    /// The state beside the lock (`.NAME.state`, see [`state`]), `None` if no token was
    /// issued yet. Read fresh on a network filesystem.
    pub fn read_state(&mut self) -> Result<Option<State>> {
        self.with_state(super::state::read)
    }

    /// The token the next acquisition takes ([`super::state::next_token`]): one above the
    /// state, or above the clock's floor where there is none.
    pub fn next_token(&mut self) -> Result<u64> {
        self.read_state().map(super::state::next_token)
    }

    /// Issues exactly `token`, holding the lock ([`super::state::issue_exactly`]): `Ok(None)` when
    /// the state moved past it.
    pub fn issue_token_exactly(&mut self, token: u64) -> Result<Option<Issued>> {
        let stale_after = self.stale_after;
        let issued = self.with_state(|at| super::state::issue_exactly(at, token, stale_after))?;
        // A holder that stalls just after taking its token, before it can use it: the
        // process's first token.
        if issued.is_some() {
            faults::stall(Stall::Taken);
        }
        Ok(issued)
    }

    /// Which of the first `n` slots of this lock may be held, lowest first: the names
    /// `NAME.slot-K` present in one listing of the parent ([`Backend::slots_present`]; a lock
    /// of these backends exists exactly while held, docs/LAYOUT.md). A name there throughout
    /// the listing is in it; one made or removed meanwhile may or may not be.
    ///
    /// [`Backend::slots_present`]: crate::backend::lock::Backend::slots_present
    pub fn slots_present(&mut self, n: u32) -> Result<Vec<u32>> {
        let mut prefix = self.name.as_bytes().to_vec();
        prefix.extend_from_slice(b".slot-");
        let path = self.path.clone();
        let failed = |e: Errno| Error::path("cannot list the directory of lock", &path, e.into());
        let mut present = Vec::new();
        crate::files::each_name(self.fd()?, ".", OFlag::empty(), |name| {
            // Exactly as `FsConfig::slot` writes K, nothing after it.
            let k = name
                .to_bytes()
                .strip_prefix(prefix.as_slice())
                .and_then(|digits| std::str::from_utf8(digits).ok())
                .and_then(|d| crate::backend::slots::slot_named(d, n, str::is_empty));
            present.extend(k);
            std::ops::ControlFlow::Continue(())
        })
        .map_err(failed)?;
        present.sort_unstable();
        Ok(present)
    }

    /// What to ask before issuing over another recorded number of slots (SPEC §3b).
    pub fn agree_on_slots(&mut self, agree: Agree) {
        self.agree = Some(agree);
    }

    /// Marks our acquisition's state clean, still holding the lock ([`super::state::mark_clean`]).
    pub fn mark_clean(&mut self, token: u64) -> Result<()> {
        self.with_state(|at| super::state::mark_clean(at, token))
    }

    fn with_state<T>(
        &mut self,
        f: impl FnOnce(&super::state::StateAt<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut name = OsString::from(".");
        name.push(self.cfg.token_name());
        name.push(".state");
        let shown = self.shown(&name);
        self.fd()?;
        let (remote, mode, group, slots) = (
            self.remote(),
            self.cfg.file_mode,
            self.cfg.group,
            self.slots,
        );
        let agree = self.agree.clone();
        f(&super::state::StateAt {
            dir: self.fd()?,
            name: &name,
            shown: &shown,
            remote,
            mode,
            group,
            slots,
            agree: agree.as_ref(),
        })
    }

    /// The content of the regular file `name` beside the lock, read fresh ([`read_record`]).
    pub fn read_file(&mut self, name: &OsStr) -> Result<Option<(Vec<u8>, FileStat)>> {
        let shown = self.shown(name);
        read_record(self.fd()?, name, &shown)
    }

    /// Creates the regular file `name` (in `at`: a directory beside the lock and its name there;
    /// else the parent) with `text`, mode and group
    /// per profile; `Ok(None)` if the name exists (or a racing create made the server answer
    /// EPERM/ENOENT, as sshfs does). On a write failure nothing is left.
    pub fn create_file(
        &mut self,
        at: Option<(BorrowedFd<'_>, &OsStr)>,
        name: &OsStr,
        text: &str,
    ) -> Result<Option<File>> {
        let shown = self.shown_in(at, name);
        let (mode, group) = (self.cfg.file_mode, self.cfg.group);
        let (parent, remote) = self.fd_remote()?;
        let dir = at.map_or(parent, |(d, _)| d);
        let flags = OFlag::O_RDWR
            | OFlag::O_CREAT
            | OFlag::O_EXCL
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC;
        let fd = match openat(
            dir,
            name,
            flags,
            FileMode::from_bits_truncate(mode.unwrap_or(0o644)),
        ) {
            Ok(fd) => fd,
            Err(Errno::EEXIST) => return Ok(None),
            Err(e) => return Err(Error::path("cannot create", &shown, e.into())),
        };
        let file = File::from(fd);
        let r = (|| -> Result<()> {
            file.write_all_at(text.as_bytes(), 0)
                .and_then(|()| reach_server(&file, remote))
                .map_err(|e| Error::path("cannot write", &shown, e))?;
            if let Some(m) = mode {
                nix::sys::stat::fchmod(&file, FileMode::from_bits_truncate(m))
                    .map_err(|e| Error::path("cannot chmod", &shown, e.into()))?;
            }
            if let Some(g) = group {
                nix::unistd::fchown(&file, None, Some(nix::unistd::Gid::from_raw(g)))
                    .map_err(|e| Error::path("cannot chgrp", &shown, e.into()))?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            let _ = nix::unistd::unlinkat(dir, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
            return Err(e);
        }
        Ok(Some(file))
    }

    /// Publishes the heartbeat record `text` as the regular file `name` (in `at`, else the
    /// parent), replacing what is there: written under the unique name `tmp`, then renamed
    /// over `name` (a network filesystem may answer EEXIST for `name` itself from its cache of
    /// an earlier one). Nothing is left on failure.
    pub fn publish(
        &mut self,
        at: Option<(BorrowedFd<'_>, &OsStr)>,
        tmp: &OsStr,
        name: &OsStr,
        text: &str,
    ) -> Result<()> {
        let shown = self.shown_in(at, name);
        if self.create_file(at, tmp, text)?.is_none() {
            return Err(err!(
                Io,
                "cannot write heartbeat record {}: {} is in the way",
                shown.display(),
                self.shown_in(at, tmp).display()
            ));
        }
        let dir = match at {
            Some((d, _)) => d,
            None => self.fd()?,
        };
        if let Err(e) = super::record::rename_soon(dir, tmp, name) {
            let _ = nix::unistd::unlinkat(dir, tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
            return Err(Error::path(
                "cannot write heartbeat record",
                &shown,
                e.into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slots_present_are_the_names_of_slots_below_n() {
        let d = tempfile::tempdir().unwrap();
        let names = [
            "q.slot-0",
            "q.slot-7",
            "q.slot-12",
            "q.slot-1024",
            "q.slot-07",
            "q.slot-3x",
            "q.slot-",
            ".q.slot-4.queue",
            ".q.slot-5.0123456789abcdef.new",
            "qq.slot-6",
            "q",
        ];
        for n in names {
            std::fs::create_dir(d.path().join(n)).unwrap();
        }
        let cfg = FsConfig {
            slot_of: None,
            path: d.path().join("q"),
            file_mode: None,
            group: None,
            local: false,
            cache_time: None,
        };
        let mut dir = LockDir::new(&cfg, &crate::settings::Common::builtin());
        assert_eq!(dir.slots_present(1024).unwrap(), [0, 7, 12]);
        assert_eq!(dir.slots_present(8).unwrap(), [0, 7]);
    }
}
