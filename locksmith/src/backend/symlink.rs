//! `backend = "symlink"`: an NFS-safe lock with shared (reader) locks, seed 004's final scheme
//! made crash-safe and writer-preferring.
//!
//! # Layout (see `docs/LAYOUT.md`)
//! ```text
//! PARENT/NAME                  symlink, exists exactly while held. Its target is either
//!                              the owner record of an exclusive holder, or
//!                              `.NAME.s.<nonce>`: the shared group now holding the lock
//! PARENT/.NAME.s.<nonce>/      a shared group (a unique name, never reused)
//! PARENT/.NAME.s.<nonce>/r.<nonce>  symlink; a reader registered in it; target = its record
//! PARENT/.NAME.w.<nonce>       symlink; a writer waiting (readers stop joining); its record
//! PARENT/.NAME.break           symlink; held by the one waiter breaking a silent lock
//! PARENT/.NAME.state           symlink; the state record (last fencing token, clean?)
//! ```
//! `symlink(2)` is atomic on local filesystems and NFS, and `readlink(2)` reads a record
//! whole without opening a file: nothing is ever held open inside the group directory, so the
//! `.nfsXXXX` silly-rename of seed 004 cannot keep it from being removed. Seed 004's
//! per-holder reservation directory is the record itself: for an exclusive holder it is the
//! target of NAME (which is then one atomic step, and names the holder), for a reader the
//! target of its registration entry. Every name carries a nonce that is unique per
//! acquisition, so removing an entry by its exact name is a claim only one process can win.
//!
//! # Exclusive
//! `symlink(record, NAME)`; on `EEXIST` (which NFS may also answer after a retransmitted,
//! successful request) `readlink(NAME)` decides whether it is ours. Release: `readlink`
//! confirms it is still ours, then `unlink`.
//!
//! # Shared
//! If NAME names a group G: register `G/r.<nonce>`, then `readlink(NAME)` again — only if it
//! still names G is the lock ours (seed 004's fix: if G's last reader left meanwhile, G is
//! gone and registering fails, or NAME has moved on). If there is no NAME: make a new group
//! with our registration inside and publish it with `symlink(G, NAME)`. Release: unlink our
//! registration, then `rmdir(G)`; only the one whose `rmdir` succeeded (G was empty, and no
//! one can join a removed group) unlinks NAME, and only if it still names G.
//!
//! # Writer preference
//! A writer that finds the lock busy leaves `.NAME.w.<nonce>` (refreshed at every retry) and
//! readers do not join or start a group while one exists, so the readers inside drain and the
//! writer gets in. A dead waiting writer's marker is removed by proof of death, or when it
//! has not changed for `stale_after`.
//!
//! # Liveness and breaking
//! Holders refresh their entry (NAME, or their registration) with
//! `utimensat(AT_SYMLINK_NOFOLLOW)` every heartbeat period unless `local = true`. Same-host
//! holders are judged by proof of death at once; others after their entry has not changed
//! for `stale_after` on the waiter's own clock. A dead reader's registration is removed by
//! its exact name (a claim) and the group left as by a release; a dead exclusive holder's
//! NAME is removed under `.NAME.break`, after re-checking its inode and record.
//!
//! # Limits
//! A holder paused for longer than `stale_after` can be broken (the honest limit of every
//! lease; fencing tokens exist for it). NAME naming a group that no longer exists — its last
//! reader died between `rmdir` and `unlink` — is removed after `stale_after` of no change.
//! On NFS, attribute caching (`acdirmax`, 60 s by default) can hide heartbeats: keep
//! `stale_after` above it.

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{Mode as FileMode, UtimensatFlags, fstat, fstatat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use super::owner::{self, Parsed, Record, State};
use super::wake::{QueueAt, Wakeups};
use super::{Attempt, Backend, BreakOutcome, Grant, Holder, WaitHint};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::profile::{FsConfig, Profile, fmt_duration};
use crate::protocol::Mode;
use crate::watch::{Event, Watcher};

/// Prefix of a reader's registration entry inside a group.
const READER_PREFIX: &str = "r.";

pub struct Symlink {
    cfg: FsConfig,
    profile: String,
    mode: Mode,
    stale_after: Duration,
    heartbeat: Duration,
    poll: Duration,
    parent: PathBuf,
    name: OsString,
    parent_fd: Option<OwnedFd>,
    held: Option<Held>,
    /// Our waiting-writer marker, while an exclusive attempt waits.
    marker: Option<OsString>,
    /// Entries (by path relative to the parent) a waiter cannot judge at once: what it saw
    /// of them (inode, ctime) and since when.
    observed: HashMap<OsString, (Seen, Instant)>,
    wake: Wakeups,
    prev_crashed: bool,
    /// A debug switch for the seed-004 race test: seed 004's first shared scheme, one
    /// well-known group name that joiners (re)create with `mkdir` — the race the seed
    /// describes. Never set outside that test.
    seed_scheme: bool,
    /// The lock is on a network or FUSE filesystem (known once the parent is opened): names
    /// are read fresh (pinned), liveness is the heartbeat record `.NAME.beat`.
    remote: bool,
    /// Our heartbeat counter while holding exclusively on such a filesystem.
    beats: u64,
}

/// What we hold.
enum Held {
    Exclusive {
        rec: Record,
        /// NAME's target: our rendered record.
        target: String,
    },
    Shared {
        group: OsString,
        /// `group/r.<nonce>`
        entry: PathBuf,
    },
}

type Seen = (u64, (i64, i64));

/// What NAME says.
enum Target {
    Missing,
    /// An exclusive holder's record (or a foreign one).
    Exclusive(Parsed, String, Seen),
    /// A shared group.
    Group(OsString, Seen),
}

/// One member of a group, as a waiter sees it.
struct Member {
    entry: OsString,
    parsed: Parsed,
    seen: Seen,
}

/// FNV-1a: a heartbeat record's content, folded into what a waiter compares.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn seen_of(st: &nix::sys::stat::FileStat) -> Seen {
    (st.st_ino, (st.st_ctime, st.st_ctime_nsec))
}

impl Symlink {
    pub fn new(cfg: FsConfig, profile: &Profile) -> Symlink {
        let parent = cfg
            .path
            .parent()
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/"));
        let name = cfg.path.file_name().map(OsString::from).unwrap_or_default();
        Symlink {
            profile: profile.name.clone(),
            mode: if profile.common.shared {
                Mode::Shared
            } else {
                Mode::Exclusive
            },
            stale_after: profile.common.stale_after,
            heartbeat: profile.common.heartbeat(),
            poll: profile.common.poll,
            parent,
            name,
            cfg,
            parent_fd: None,
            held: None,
            marker: None,
            observed: HashMap::new(),
            wake: Wakeups::default(),
            prev_crashed: false,
            seed_scheme: std::env::var_os("LOCKSMITH_SYMLINK_SEED_SCHEME")
                .is_some_and(|v| v == "1"),
            remote: false,
            beats: 0,
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
            super::lockdir::check_dir_mode(st.st_mode, &self.parent)?;
            let fs = super::lockdir::detect(fd.as_fd());
            super::lockdir::check(&fs, &self.parent, &self.cfg, self.stale_after, true)?;
            if fs.remote && !self.cfg.local && self.mode == Mode::Shared {
                return Err(err!(
                    Config,
                    "lock {} is on {}: shared symlink locks cannot heartbeat there yet (a reader's entry is a symlink, whose times a network filesystem may not set); take it exclusively, or set local = true if every contender runs on this host",
                    self.cfg.path.display(),
                    fs.name
                ));
            }
            self.remote = fs.remote;
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

    fn group_prefix(&self) -> OsString {
        self.beside(".s.")
    }

    fn marker_prefix(&self) -> OsString {
        self.beside(".w.")
    }

    fn io(&self, what: &str, e: Errno) -> Error {
        Error::path(what, &self.cfg.path, e.into())
    }

    /// `readlink` + `lstat` of `name` (relative to the parent); `None` if it does not exist.
    fn read_entry(&mut self, name: &OsStr) -> Result<Option<(String, Seen)>> {
        let parent = self.parent_fd()?;
        let st = match fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(self.io("cannot inspect lock", e)),
        };
        if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
            return Err(err!(
                Config,
                "{} is not a symbolic link: it is not a lock of backend `symlink`",
                self.parent.join(name).display()
            ));
        }
        match readlinkat(parent, name) {
            Ok(t) => Ok(Some((t.to_string_lossy().into_owned(), seen_of(&st)))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.io("cannot read lock", e)),
        }
    }

    /// Reads `name` as [`read_entry`](Self::read_entry) does, but fresh on a network
    /// filesystem, whose `readlink` may answer from a cache (sshfs: 20 s): a hard link to it
    /// under a new name (a mutation, decided by the server, of whatever is there now) is
    /// read, then removed.
    fn read_fresh(&mut self, name: &OsStr) -> Result<Option<(String, Seen)>> {
        if !self.remote {
            return self.read_entry(name);
        }
        let pin = self.beside(&format!(".pin.{}", crate::host::nonce()));
        let shown = self.parent.join(name);
        if !super::lockdir::pin(self.parent_fd()?, name, &pin, &shown)? {
            return Ok(None);
        }
        let r = self.read_entry(&pin);
        let _ = unlinkat(
            self.parent_fd()?,
            pin.as_os_str(),
            UnlinkatFlags::NoRemoveDir,
        );
        r
    }

    /// On a network filesystem, what changes when an exclusive holder with record `rec`
    /// heartbeats: its heartbeat record `.NAME.beat`, read fresh (or, before it wrote one,
    /// NAME's own look).
    fn remote_seen(&mut self, parsed: &Parsed, seen: Seen) -> Result<Seen> {
        let beat = self.beside(".beat");
        let content = self.dir_read(&beat)?;
        Ok(match (parsed, content) {
            (Parsed::V1(rec), Some(c)) if super::lockdir::is_ours(&c, rec) => (fnv(&c), (0, 0)),
            _ => seen,
        })
    }

    fn dir_read(&mut self, name: &OsStr) -> Result<Option<Vec<u8>>> {
        let shown = self.parent.join(name);
        Ok(super::lockdir::read_record(self.parent_fd()?, name, &shown)?.map(|(c, _)| c))
    }

    /// Writes (replacing) our heartbeat record `.NAME.beat` at beat `n`.
    fn write_beat_record(&mut self, rec: &Record, n: u64) -> Result<bool> {
        let beat = self.beside(".beat");
        let shown = self.parent.join(&beat);
        let tmp = self.beside(&format!(".beat.{}", rec.nonce));
        let mode = FileMode::from_bits_truncate(self.cfg.file_mode.unwrap_or(0o644));
        let parent = self.parent_fd()?;
        if n > 0 {
            return super::lockdir::write_beat(parent, &beat, &shown, rec, n);
        }
        let r = openat(
            parent,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            mode,
        )
        .map_err(std::io::Error::from)
        .and_then(|fd| {
            use std::os::unix::fs::FileExt;
            let f = std::fs::File::from(fd);
            f.write_all_at(rec.render_beat(0).as_bytes(), 0)?;
            f.sync_data()
        })
        .and_then(|()| {
            renameat(parent, tmp.as_os_str(), parent, beat.as_os_str()).map_err(Into::into)
        });
        if let Err(e) = r {
            let _ = unlinkat(parent, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(Error::path("cannot write heartbeat record", &shown, e));
        }
        Ok(true)
    }

    /// Removes `.NAME.beat` if it is the heartbeat record of acquisition `rec`.
    fn remove_beat_record(&mut self, text: &str) {
        let Parsed::V1(rec) = Record::parse(text) else {
            return;
        };
        let beat = self.beside(".beat");
        if let Ok(Some(c)) = self.dir_read(&beat)
            && super::lockdir::is_ours(&c, &rec)
            && let Ok(parent) = self.parent_fd()
        {
            let _ = unlinkat(parent, beat.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }

    fn target(&mut self) -> Result<Target> {
        let name = self.name.clone();
        let Some((text, seen)) = self.read_fresh(&name)? else {
            return Ok(Target::Missing);
        };
        let prefix = self.group_prefix();
        let group = OsString::from(&text);
        if group.as_bytes().starts_with(prefix.as_bytes()) && !text.contains('/') {
            return Ok(Target::Group(group, seen));
        }
        let parsed = Record::parse(&text);
        let seen = if self.remote {
            self.remote_seen(&parsed, seen)?
        } else {
            seen
        };
        Ok(Target::Exclusive(parsed, text, seen))
    }

    /// `symlink(target, name)`; `Ok(true)` if `name` now says `target` (ours: NFS may answer
    /// `EEXIST` after a retransmitted, successful request), `Ok(false)` if it says
    /// something else, `ENOENT` from a missing directory passed on.
    fn make_link(&mut self, target: &str, at: &Path) -> std::result::Result<bool, Errno> {
        let parent = self.parent_fd().map_err(|_| Errno::EBADF)?;
        match symlinkat(target, parent, at) {
            Ok(()) => return Ok(true),
            Err(Errno::EEXIST) => {}
            // sshfs answers a racing symlink(2) over an existing name with EPERM or ENOENT
            // (SFTP's generic failure): whoever won, the name says.
            Err(Errno::EPERM | Errno::ENOENT) if self.remote => {}
            Err(e) => return Err(e),
        }
        match self.read_fresh(at.as_os_str()) {
            Ok(Some((t, _))) => Ok(t == target),
            Ok(None) => Ok(false),
            Err(_) => Err(Errno::EIO),
        }
    }

    fn silent_for_stale(&mut self, key: &OsStr, seen: Seen) -> bool {
        match self.observed.get(key) {
            Some((s, since)) if *s == seen => since.elapsed() >= self.stale_after,
            _ => {
                self.observed.insert(key.to_owned(), (seen, Instant::now()));
                false
            }
        }
    }

    /// Whether the holder of `parsed` (an entry seen as `seen` under `key`) is dead or
    /// silent. Foreign records are alive (only `--force` breaks them).
    fn dead(&mut self, key: &OsStr, parsed: &Parsed, seen: Seen) -> Result<bool> {
        match parsed {
            Parsed::Foreign(_) => Ok(false),
            Parsed::V1(rec) if rec.same_host() => Ok(!self.wake.holder_alive(rec.pid, rec.start)),
            Parsed::V1(rec) if self.cfg.local => Err(err!(
                Config,
                "profile `{}` says local = true, but lock {} is held by {} from another host or pid namespace",
                self.profile,
                self.cfg.path.display(),
                rec.holder()
            )),
            Parsed::V1(_) => Ok(self.silent_for_stale(key, seen)),
        }
    }

    /// Members of group `g`; `None` if the group does not exist (any more).
    fn members(&mut self, g: &OsStr) -> Result<Option<(OwnedFd, Vec<Member>)>> {
        let shown = self.parent.join(g);
        let parent = self.parent_fd()?;
        let fd = match openat(
            parent,
            g,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            FileMode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(Error::path("cannot open shared group", &shown, e.into())),
        };
        let dup = openat(
            &fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            FileMode::empty(),
        )
        .map_err(|e| Error::path("cannot open shared group", &shown, e.into()))?;
        let mut dir = Dir::from_fd(dup)
            .map_err(|e| Error::path("cannot list shared group", &shown, e.into()))?;
        let mut names = Vec::new();
        for ent in dir.iter() {
            let ent = ent.map_err(|e| Error::path("cannot list shared group", &shown, e.into()))?;
            let n = ent.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(OsStr::from_bytes(n).to_owned());
            }
        }
        let mut out = Vec::new();
        for n in names {
            let Ok(st) = fstatat(&fd, n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
                continue;
            };
            let parsed = match readlinkat(&fd, n.as_os_str()) {
                Ok(t) if n.as_bytes().starts_with(READER_PREFIX.as_bytes()) => {
                    Record::parse(&t.to_string_lossy())
                }
                Ok(t) => Parsed::Foreign(t.to_string_lossy().into_owned()),
                Err(Errno::ENOENT) => continue,
                Err(_) => Parsed::Foreign(n.to_string_lossy().into_owned()),
            };
            out.push(Member {
                entry: n,
                parsed,
                seen: seen_of(&st),
            });
        }
        Ok(Some((fd, out)))
    }

    /// Names beginning with `prefix` in the parent directory.
    fn list_beside(&mut self, prefix: &OsStr) -> Result<Vec<OsString>> {
        let path = self.cfg.path.clone();
        let parent = self.parent_fd()?;
        // A description of our own: listing moves its offset.
        let dup = openat(
            parent,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            FileMode::empty(),
        )
        .map_err(|e| Error::path("cannot list the directory of lock", &path, e.into()))?;
        let mut dir = Dir::from_fd(dup)
            .map_err(|e| Error::path("cannot list the directory of lock", &path, e.into()))?;
        let mut out = Vec::new();
        for ent in dir.iter() {
            let ent =
                ent.map_err(|e| Error::path("cannot list the directory of lock", &path, e.into()))?;
            let n = ent.file_name().to_bytes();
            if n.starts_with(prefix.as_bytes()) {
                out.push(OsStr::from_bytes(n).to_owned());
            }
        }
        Ok(out)
    }

    /// Live waiting writers (dead or silent markers are removed on the way).
    fn writers_waiting(&mut self) -> Result<Vec<Holder>> {
        let mut live = Vec::new();
        for m in self.list_beside(&self.marker_prefix())? {
            if self.marker.as_ref() == Some(&m) {
                continue;
            }
            let Some((text, seen)) = self.read_entry(&m).or_else(|e| match e.kind() {
                Kind::Config => Ok(None),
                _ => Err(e),
            })?
            else {
                continue;
            };
            let parsed = Record::parse(&text);
            if self.dead(&m, &parsed, seen)? {
                debug!(
                    "removing the marker of a dead waiting writer: {}",
                    parsed.holder()
                );
                let _ = unlinkat(self.parent_fd()?, m.as_os_str(), UnlinkatFlags::NoRemoveDir);
                self.observed.remove(&m);
            } else {
                let mut h = parsed.holder();
                h.mode = Some(Mode::Exclusive);
                live.push(h);
            }
        }
        Ok(live)
    }

    /// A waiting writer: leave (or refresh) our marker so readers stop joining.
    fn mark_waiting(&mut self) -> Result<()> {
        let now = TimeSpec::UTIME_NOW;
        self.parent_fd()?;
        if self.remote && (self.marker.is_some() || !self.cfg.local) {
            // No readers without local = true there (refused); with it, markers are judged
            // by proof of death alone and need no refreshing (which sshfs cannot do).
            return Ok(());
        }
        if let Some(m) = self.marker.clone() {
            match utimensat(
                self.parent_fd()?,
                m.as_os_str(),
                &now,
                &now,
                UtimensatFlags::NoFollowSymlink,
            ) {
                Ok(()) => return Ok(()),
                // Removed by a reader that judged us silent: make it again.
                Err(Errno::ENOENT) => self.marker = None,
                Err(e) => return Err(self.io("cannot mark a waiting writer beside", e)),
            }
        }
        let rec = Record::ours(&self.profile);
        let mut m = self.marker_prefix();
        m.push(&rec.nonce);
        match self.make_link(&rec.render(), Path::new(&m)) {
            Ok(true) => {
                self.marker = Some(m);
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(self.io("cannot mark a waiting writer beside", e)),
        }
    }

    fn unmark_waiting(&mut self) {
        if let Some(m) = self.marker.take()
            && let Ok(parent) = self.parent_fd()
        {
            let _ = unlinkat(parent, m.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }

    fn state_name(&self) -> OsString {
        self.beside(".state")
    }

    fn read_state(&mut self) -> Result<Option<State>> {
        let name = self.state_name();
        let shown = self.parent.join(&name);
        self.parent_fd()?;
        let remote = self.remote;
        super::lockdir::read_state_fresh(self.parent_fd()?, &name, &shown, remote)
    }

    fn write_state(&mut self, st: State) -> Result<()> {
        let name = self.state_name();
        let shown = self.parent.join(&name);
        owner::write_state(self.parent_fd()?, &name, &shown, st)
    }

    /// One exclusive attempt. `Ok(None)`: something changed, look again.
    fn try_exclusive(&mut self) -> Result<Option<Attempt>> {
        let mut rec = Record::ours(&self.profile);
        rec.token = Some(self.read_state()?.map_or(1, |s| s.token + 1));
        let target = rec.render();
        let name = self.name.clone();
        match self.make_link(&target, Path::new(&name)) {
            Ok(true) => return self.finish_exclusive(rec, target).map(Some),
            Ok(false) => {}
            Err(e) => return Err(self.io("cannot create lock", e)),
        }
        let holders = match self.target()? {
            Target::Missing => return Ok(None),
            Target::Exclusive(parsed, text, seen) => {
                match self.judge_exclusive(parsed, &text, seen)? {
                    Some(h) => h,
                    None => return Ok(None),
                }
            }
            Target::Group(g, seen) => match self.judge_group(&g, seen)? {
                Some(h) => h,
                None => return Ok(None),
            },
        };
        self.mark_waiting()?;
        Ok(Some(Attempt::Busy(holders)))
    }

    /// Holding exclusively: fencing token (rewriting NAME if the speculated one was
    /// overtaken), state "not cleanly released" until our release says otherwise.
    fn finish_exclusive(&mut self, mut rec: Record, mut target: String) -> Result<Attempt> {
        let name = self.name.clone();
        let r = (|| -> Result<()> {
            let state = self.read_state()?;
            let token = state.map_or(1, |s| s.token + 1);
            if state.is_some_and(|s| !s.clean) {
                self.prev_crashed = true;
            }
            if rec.token != Some(token) {
                rec.token = Some(token);
                let text = rec.render();
                let mut tmp = self.beside(&format!(".{}.new", rec.nonce));
                let parent = self.parent_fd()?;
                let r = symlinkat(text.as_str(), parent, tmp.as_os_str())
                    .and_then(|()| renameat(parent, tmp.as_os_str(), parent, name.as_os_str()));
                if let Err(e) = r {
                    let _ = unlinkat(parent, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
                    return Err(self.io("cannot write owner record of", e));
                }
                tmp.clear();
                target = text;
            }
            self.write_state(State {
                token,
                clean: false,
            })?;
            if self.remote && !self.cfg.local {
                self.beats = 0;
                self.write_beat_record(&rec, 0)?;
            }
            Ok(())
        })();
        self.held = Some(Held::Exclusive {
            rec: rec.clone(),
            target,
        });
        if let Err(e) = r {
            let _ = self.release();
            return Err(e);
        }
        self.unmark_waiting();
        self.tidy_groups();
        self.observed.clear();
        self.wake.done();
        Ok(Attempt::Acquired(Grant {
            token: rec.token,
            prev_crashed: std::mem::take(&mut self.prev_crashed),
        }))
    }

    /// While holding exclusively, no group can be current: remove groups left by readers
    /// that died before publishing or leaving them (proof of death only).
    fn tidy_groups(&mut self) {
        let Ok(groups) = self.list_beside(&self.group_prefix()) else {
            return;
        };
        for g in groups {
            let Ok(Some((fd, members))) = self.members(&g) else {
                continue;
            };
            let all_dead = members.iter().all(|m| match &m.parsed {
                Parsed::V1(r) => r.same_host() && !crate::host::alive(r.pid, r.start),
                Parsed::Foreign(_) => false,
            });
            if !all_dead {
                continue;
            }
            for m in &members {
                let _ = unlinkat(&fd, m.entry.as_os_str(), UnlinkatFlags::NoRemoveDir);
            }
            if let Ok(parent) = self.parent_fd() {
                let _ = unlinkat(parent, g.as_os_str(), UnlinkatFlags::RemoveDir);
            }
        }
    }

    /// An exclusive holder found at NAME: `Some(holders)` busy, `None` it was just broken.
    fn judge_exclusive(
        &mut self,
        parsed: Parsed,
        text: &str,
        seen: Seen,
    ) -> Result<Option<Vec<Holder>>> {
        let mut holder = parsed.holder();
        holder.mode = Some(Mode::Exclusive);
        let name = self.name.clone();
        if !self.dead(&name, &parsed, seen)? {
            return Ok(Some(vec![holder]));
        }
        info!(
            "breaking lock {} of {} holder {holder}",
            self.cfg.path.display(),
            if matches!(&parsed, Parsed::V1(r) if r.same_host()) {
                "dead (same host: proof of death)".to_string()
            } else {
                format!(
                    "silent (no heartbeat for {})",
                    fmt_duration(self.stale_after)
                )
            }
        );
        self.observed.remove(&name);
        if self.break_name(text, seen)? {
            self.prev_crashed = true;
            Ok(None)
        } else {
            Ok(Some(vec![holder]))
        }
    }

    /// A group found at NAME: removes dead or silent readers and leaves the group for them
    /// if they were the last. `Some(holders)` busy, `None` the lock was freed.
    fn judge_group(&mut self, g: &OsStr, seen: Seen) -> Result<Option<Vec<Holder>>> {
        let Some((fd, members)) = self.members(g)? else {
            // NAME names a group that is gone: its last reader is between rmdir and unlink
            // (microseconds), or died there.
            let name = self.name.clone();
            if self.silent_for_stale(&name, seen) {
                info!(
                    "breaking lock {}: it names a shared group that no longer exists, unchanged for {}",
                    self.cfg.path.display(),
                    fmt_duration(self.stale_after)
                );
                self.observed.remove(&name);
                if self.break_name(&g.to_string_lossy(), seen)? {
                    self.prev_crashed = true;
                    return Ok(None);
                }
            }
            return Ok(Some(vec![Holder {
                mode: Some(Mode::Shared),
                ..Holder::default()
            }]));
        };
        let mut live = Vec::new();
        for m in members {
            let key = Path::new(g).join(&m.entry).into_os_string();
            if self.dead(&key, &m.parsed, m.seen)? {
                info!(
                    "removing dead reader {} from lock {}",
                    m.parsed.holder(),
                    self.cfg.path.display()
                );
                // The claim: only one remover wins, and the name is never reused.
                if unlinkat(&fd, m.entry.as_os_str(), UnlinkatFlags::NoRemoveDir).is_ok() {
                    self.prev_crashed = true;
                }
                self.observed.remove(&key);
            } else {
                let mut h = m.parsed.holder();
                h.mode = Some(Mode::Shared);
                live.push(h);
            }
        }
        // No reader left (we removed the dead, or the last one is between unlinking its
        // entry and removing the group, or died there): removing the empty group is a claim
        // only one process wins, so anyone may do it and then free NAME.
        if live.is_empty() && self.leave_group(g)? {
            return Ok(None);
        }
        if live.is_empty() {
            live.push(Holder {
                mode: Some(Mode::Shared),
                ..Holder::default()
            });
        }
        Ok(Some(live))
    }

    /// After leaving group `g`: remove it if it is empty; whoever removed it (only one can)
    /// frees NAME if NAME still names it. `Ok(true)` if we freed NAME.
    fn leave_group(&mut self, g: &OsStr) -> Result<bool> {
        let parent = self.parent_fd()?;
        match unlinkat(parent, g, UnlinkatFlags::RemoveDir) {
            Ok(()) => {}
            // Others still read (or another leaver won): they free NAME.
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(self.io("cannot remove shared group of", e)),
        }
        // G is gone and cannot come back (its name is unique): nobody else can have made
        // NAME name it, nor be about to remove NAME while it names G.
        let name = self.name.clone();
        let parent = self.parent_fd()?;
        match readlinkat(parent, name.as_os_str()) {
            Ok(t) if t.as_bytes() == g.as_bytes() => {
                unlinkat(parent, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| self.io("cannot remove lock", e))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Removes NAME if it still says `text` and is the inode seen, serialised by
    /// `.NAME.break`. `Ok(false)`: another breaker is at work (or the lock changed).
    fn break_name(&mut self, text: &str, seen: Seen) -> Result<bool> {
        let guard = self.beside(".break");
        let me = Record::ours(&self.profile);
        let mine = me.render();
        match self.make_link(&mine, Path::new(&guard)) {
            Ok(true) => {}
            Ok(false) => {
                // Someone else is breaking. If they died doing it (or went silent), clear
                // their guard.
                if let Some((t, gseen)) = self.read_entry(&guard)? {
                    let parsed = Record::parse(&t);
                    if self.dead(&guard, &parsed, gseen)? {
                        self.unlink_if(&guard, &t);
                        self.observed.remove(&guard);
                    }
                }
                return Ok(false);
            }
            Err(e) => return Err(self.io("cannot take the break guard of", e)),
        }
        let name = self.name.clone();
        let now = match self.read_fresh(&name)? {
            Some((t, s)) if self.remote => {
                let p = Record::parse(&t);
                let s = self.remote_seen(&p, s)?;
                Some((t, s))
            }
            x => x,
        };
        let broke = match now {
            Some((t, s)) if t == text && s.0 == seen.0 => {
                // Its heartbeat record first, while NAME still keeps others from writing one.
                if self.remote {
                    self.remove_beat_record(text);
                }
                self.unlink_if(&name, text)
            }
            _ => false,
        };
        self.unlink_if(&guard, &mine);
        Ok(broke)
    }

    /// Unlinks symlink `name` if it still says `text`.
    fn unlink_if(&mut self, name: &OsStr, text: &str) -> bool {
        match self.read_fresh(name) {
            Ok(Some((t, _))) if t == text => {}
            _ => return false,
        }
        let Ok(parent) = self.parent_fd() else {
            return false;
        };
        unlinkat(parent, name, UnlinkatFlags::NoRemoveDir).is_ok()
    }

    /// One shared attempt. `Ok(None)`: something changed, look again.
    fn try_shared(&mut self) -> Result<Option<Attempt>> {
        let writers = self.writers_waiting()?;
        if !writers.is_empty() {
            // Writer preference: let the readers inside drain. Name who holds it now.
            let (_, list) = self.holders()?;
            let holders = if list.is_empty() {
                writers
            } else {
                list.into_iter().map(|m| m.parsed.holder()).collect()
            };
            return Ok(Some(Attempt::Busy(holders)));
        }
        let rec = Record::ours(&self.profile);
        let text = rec.render();
        let reg = format!("{READER_PREFIX}{}", rec.nonce);
        match self.target()? {
            Target::Missing => {
                let mut g = self.group_prefix();
                g.push(if self.seed_scheme { "seed" } else { &rec.nonce });
                let seed_scheme = self.seed_scheme;
                let mode = self.dir_mode();
                let group = self.cfg.group;
                let path = self.cfg.path.clone();
                let parent = self.parent_fd()?;
                match mkdirat(parent, g.as_os_str(), mode) {
                    Ok(()) => {}
                    Err(Errno::EEXIST) if seed_scheme => {}
                    Err(e) => {
                        return Err(Error::path(
                            "cannot create shared group beside",
                            &path,
                            e.into(),
                        ));
                    }
                }
                if let Some(gid) = group {
                    let _ = nix::unistd::fchownat(
                        parent,
                        g.as_os_str(),
                        None,
                        Some(nix::unistd::Gid::from_raw(gid)),
                        AtFlags::AT_SYMLINK_NOFOLLOW,
                    );
                }
                let entry = Path::new(&g).join(&reg);
                let published = self
                    .make_link(&text, &entry)
                    .and_then(|ok| {
                        if ok {
                            self.make_link(&g.to_string_lossy(), Path::new(&self.name.clone()))
                        } else {
                            Ok(false)
                        }
                    })
                    .map_err(|e| self.io("cannot create lock", e));
                match published {
                    Ok(true) => Ok(Some(self.finish_shared(g, entry))),
                    // Our fresh, still empty group was tidied away by someone: look again.
                    Ok(false) | Err(_) if !self.parent.join(&g).exists() => Ok(None),
                    Ok(false) => {
                        // Someone else took NAME first: take our group away again.
                        let parent = self.parent_fd()?;
                        let _ = unlinkat(parent, entry.as_os_str(), UnlinkatFlags::NoRemoveDir);
                        let _ = unlinkat(parent, g.as_os_str(), UnlinkatFlags::RemoveDir);
                        Ok(None)
                    }
                    Err(e) => {
                        let parent = self.parent_fd()?;
                        let _ = unlinkat(parent, entry.as_os_str(), UnlinkatFlags::NoRemoveDir);
                        let _ = unlinkat(parent, g.as_os_str(), UnlinkatFlags::RemoveDir);
                        Err(e)
                    }
                }
            }
            Target::Group(g, seen) => {
                if self.seed_scheme {
                    let mode = self.dir_mode();
                    let _ = mkdirat(self.parent_fd()?, g.as_os_str(), mode);
                }
                let entry = Path::new(&g).join(&reg);
                match self.make_link(&text, &entry) {
                    // The group is gone: its last reader is leaving (or died leaving).
                    Err(Errno::ENOENT) => {
                        return Ok(self.judge_group(&g, seen)?.map(Attempt::Busy));
                    }
                    Err(e) => return Err(self.io("cannot join shared lock", e)),
                    Ok(false) => return Ok(None),
                    Ok(true) => {}
                }
                // Seed 004's race: G's last reader may have left (removing G and NAME) between
                // our readlink and our registration, and a writer may hold NAME now. Only
                // if NAME still names G do we hold it.
                let name = self.name.clone();
                let still = matches!(readlinkat(self.parent_fd()?, name.as_os_str()), Ok(t) if t.as_bytes() == g.as_bytes());
                if still {
                    return Ok(Some(self.finish_shared(g, entry)));
                }
                let _ = unlinkat(
                    self.parent_fd()?,
                    entry.as_os_str(),
                    UnlinkatFlags::NoRemoveDir,
                );
                // We may have kept an emptied group alive for a moment: leave it properly.
                self.leave_group(&g)?;
                Ok(None)
            }
            Target::Exclusive(parsed, t, seen) => {
                Ok(self.judge_exclusive(parsed, &t, seen)?.map(Attempt::Busy))
            }
        }
    }

    fn finish_shared(&mut self, group: OsString, entry: PathBuf) -> Attempt {
        self.held = Some(Held::Shared { group, entry });
        self.observed.clear();
        self.wake.done();
        // Readers report the write epoch: the last exclusive token.
        let token = match self.read_state() {
            Ok(s) => s.map(|s| s.token),
            Err(e) => {
                debug!("no fencing token: {e}");
                None
            }
        };
        Attempt::Acquired(Grant {
            token,
            prev_crashed: std::mem::take(&mut self.prev_crashed),
        })
    }

    fn dir_mode(&self) -> FileMode {
        // Readers of other users register inside the group: it needs w and x where it has r.
        let m = self.cfg.file_mode.unwrap_or(0o777);
        let x = (m & 0o444) >> 2;
        FileMode::from_bits_truncate(m | x)
    }

    /// The holders for `status` and `break` (members named by their path from the parent).
    fn holders(&mut self) -> Result<(Target, Vec<Member>)> {
        let t = self.target()?;
        let list = match &t {
            Target::Missing => Vec::new(),
            Target::Exclusive(p, _, seen) => vec![Member {
                entry: self.name.clone(),
                parsed: p.clone(),
                seen: *seen,
            }],
            Target::Group(g, _) => match self.members(g)? {
                None => Vec::new(),
                Some((_, ms)) => ms
                    .into_iter()
                    .map(|m| Member {
                        entry: Path::new(g).join(&m.entry).into_os_string(),
                        ..m
                    })
                    .collect(),
            },
        };
        Ok((t, list))
    }
}

impl Drop for Symlink {
    fn drop(&mut self) {
        // A writer that gave up waiting takes its marker away.
        self.unmark_waiting();
    }
}

impl Backend for Symlink {
    fn name(&self) -> &'static str {
        "symlink"
    }

    fn try_acquire(&mut self) -> Result<Attempt> {
        self.wake.drain();
        let mut last = Vec::new();
        for _ in 0..8 {
            let r = match self.mode {
                Mode::Exclusive => self.try_exclusive(),
                Mode::Shared => self.try_shared(),
            };
            match r {
                Ok(Some(Attempt::Busy(h))) => {
                    last = h;
                    break;
                }
                Ok(Some(a)) => return Ok(a),
                Ok(None) => continue,
                Err(e) => {
                    self.unmark_waiting();
                    return Err(e);
                }
            }
        }
        Ok(Attempt::Busy(last))
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        // Writers queue (wake.rs); readers all watch: a writer leaving lets them all in.
        let queue = (self.mode == Mode::Exclusive && !self.remote).then(|| QueueAt {
            path: self.parent.join(self.beside(".queue")),
            mode: self.cfg.file_mode,
            group: self.cfg.group,
        });
        self.wake.watch_dir(&self.parent, queue);
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
        let now = TimeSpec::UTIME_NOW;
        match &self.held {
            None => Err(err!(Lost, "not holding")),
            Some(Held::Exclusive { rec, .. }) if self.remote => {
                // Our heartbeat record is replaced by a successor and removed by a breaker:
                // while it is ours, so is the lock.
                let rec = rec.clone();
                self.beats += 1;
                if !self.write_beat_record(&rec, self.beats)? {
                    return Err(err!(
                        Lost,
                        "lock {} was broken: our heartbeat record is gone",
                        path.display()
                    ));
                }
                Ok(())
            }
            Some(Held::Exclusive { target, .. }) => {
                let target = target.clone();
                let name = self.name.clone();
                match self.read_entry(&name)? {
                    Some((t, _)) if t == target => {}
                    _ => {
                        return Err(err!(
                            Lost,
                            "lock {} was broken: it no longer names us",
                            path.display()
                        ));
                    }
                }
                utimensat(
                    self.parent_fd()?,
                    name.as_os_str(),
                    &now,
                    &now,
                    UtimensatFlags::NoFollowSymlink,
                )
                .map_err(|e| Error::path("cannot heartbeat lock", &path, e.into()))
            }
            Some(Held::Shared { entry, .. }) => {
                let entry = entry.clone();
                match utimensat(
                    self.parent_fd()?,
                    &entry,
                    &now,
                    &now,
                    UtimensatFlags::NoFollowSymlink,
                ) {
                    Ok(()) => Ok(()),
                    Err(Errno::ENOENT) => Err(err!(
                        Lost,
                        "shared lock {} was broken: our registration is gone",
                        path.display()
                    )),
                    Err(e) => Err(Error::path("cannot heartbeat lock", &path, e.into())),
                }
            }
        }
    }

    fn release(&mut self) -> Result<()> {
        let path = self.cfg.path.clone();
        match self.held.take() {
            None => Ok(()),
            Some(Held::Exclusive { rec, target }) => {
                let name = self.name.clone();
                match self.read_fresh(&name)? {
                    Some((t, _)) if t == target => {}
                    _ => {
                        return Err(err!(
                            Lost,
                            "lock {} was broken while held: it no longer names us",
                            path.display()
                        ));
                    }
                }
                if let Some(token) = rec.token
                    && self.read_state().ok().flatten().map(|s| s.token) == Some(token)
                    && let Err(e) = self.write_state(State { token, clean: true })
                {
                    info!("{e}; the next holder will see prev=crashed");
                }
                // Our heartbeat record first, while NAME still keeps others from writing one.
                if self.remote {
                    self.remove_beat_record(&target);
                }
                if !self.unlink_if(&name, &target) {
                    return Err(err!(
                        Lost,
                        "lock {} was broken while releasing it",
                        path.display()
                    ));
                }
                Ok(())
            }
            Some(Held::Shared { group, entry }) => {
                match unlinkat(self.parent_fd()?, &entry, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => {}
                    Err(Errno::ENOENT) => {
                        return Err(err!(
                            Lost,
                            "shared lock {} was broken while held: our registration is gone",
                            path.display()
                        ));
                    }
                    Err(e) => return Err(Error::path("cannot release lock", &path, e.into())),
                }
                self.leave_group(&group)?;
                Ok(())
            }
        }
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        let (t, list) = self.holders()?;
        let epoch = self.read_state().ok().flatten().map(|s| s.token);
        let mut out: Vec<Holder> = list
            .into_iter()
            .map(|m| {
                let mut h = m.parsed.holder();
                match &t {
                    Target::Group(..) => {
                        h.mode = Some(Mode::Shared);
                        h.token = epoch;
                    }
                    _ => h.mode = Some(Mode::Exclusive),
                }
                h
            })
            .collect();
        if out.is_empty() && !matches!(t, Target::Missing) {
            out.push(Holder::default());
        }
        Ok(out)
    }

    fn break_lock(
        &mut self,
        force: bool,
        token: Option<u64>,
        watcher: &mut Watcher,
    ) -> Result<BreakOutcome> {
        let mut announced = false;
        loop {
            let (t, list) = self.holders()?;
            let path = self.cfg.path.display().to_string();
            match t {
                Target::Missing => return Ok(BreakOutcome::Free),
                Target::Exclusive(parsed, text, seen) => {
                    let holder = parsed.holder();
                    let theirs = match &parsed {
                        Parsed::V1(r) => r.token,
                        Parsed::Foreign(_) => None,
                    };
                    if let Some(want) = token
                        && theirs != Some(want)
                    {
                        return Err(err!(
                            Busy,
                            "lock {path} is not acquisition {want} ({holder}); nothing broken"
                        ));
                    }
                    let name = self.name.clone();
                    let decided = match &parsed {
                        _ if force => true,
                        Parsed::Foreign(_) => {
                            return Err(err!(
                                Busy,
                                "lock {path} has an owner record of another format ({holder}); only --force breaks it"
                            ));
                        }
                        Parsed::V1(r) if r.same_host() => {
                            if crate::host::alive(r.pid, r.start) {
                                return Err(err!(
                                    Busy,
                                    "lock {path} is held by {holder}, which is alive; use --force to break it anyway"
                                ));
                            }
                            true
                        }
                        Parsed::V1(_) => {
                            if self.observed.get(&name).is_some_and(|(s, _)| *s != seen) {
                                return Err(err!(
                                    Busy,
                                    "lock {path} is held by {holder}, which is alive: its heartbeat changed the lock"
                                ));
                            }
                            self.silent_for_stale(&name, seen)
                        }
                    };
                    if decided && self.break_name(&text, seen)? {
                        info!("broke lock {path} of {holder}");
                        return Ok(BreakOutcome::Broken(holder));
                    }
                    if !decided && !announced {
                        info!(
                            "lock {path} is held by {holder} on another host; breaking it if it stays silent for {}",
                            fmt_duration(self.stale_after)
                        );
                        announced = true;
                    }
                }
                Target::Group(g, seen) => {
                    if let Some(want) = token {
                        return Err(err!(
                            Busy,
                            "lock {path} is held shared, not by acquisition {want}; nothing broken"
                        ));
                    }
                    if list.is_empty() {
                        // A group that no longer exists.
                        let name = self.name.clone();
                        if (force || self.silent_for_stale(&name, seen))
                            && self.break_name(&g.to_string_lossy(), seen)?
                        {
                            info!(
                                "broke lock {path}: it named a shared group that no longer exists"
                            );
                            return Ok(BreakOutcome::Broken(Holder::default()));
                        }
                    } else {
                        let mut refused = None;
                        let mut pending = false;
                        for Member {
                            entry: key,
                            parsed,
                            seen: s,
                        } in &list
                        {
                            let decided = match parsed {
                                _ if force => true,
                                Parsed::Foreign(_) => {
                                    refused = Some(format!(
                                        "{} has a record of another format; only --force breaks it",
                                        parsed.holder()
                                    ));
                                    false
                                }
                                Parsed::V1(r) if r.same_host() => {
                                    let alive = crate::host::alive(r.pid, r.start);
                                    if alive {
                                        refused = Some(format!(
                                            "reader {} is alive; use --force to break it anyway",
                                            parsed.holder()
                                        ));
                                    }
                                    !alive
                                }
                                Parsed::V1(_) => {
                                    if self.observed.get(key).is_some_and(|(o, _)| o != s) {
                                        refused = Some(format!(
                                            "reader {} is alive: its heartbeat changed its entry",
                                            parsed.holder()
                                        ));
                                        false
                                    } else {
                                        let d = self.silent_for_stale(key, *s);
                                        pending |= !d;
                                        d
                                    }
                                }
                            };
                            if let Some(why) = refused {
                                return Err(err!(Busy, "lock {path} is held shared: {why}"));
                            }
                            if decided {
                                let _ = unlinkat(
                                    self.parent_fd()?,
                                    key.as_os_str(),
                                    UnlinkatFlags::NoRemoveDir,
                                );
                            }
                        }
                        if !pending {
                            self.leave_group(&g)?;
                            let holders: Vec<Holder> =
                                list.iter().map(|m| m.parsed.holder()).collect();
                            info!("broke shared lock {path} of {}", super::describe(&holders));
                            return Ok(BreakOutcome::Broken(
                                holders.into_iter().next().unwrap_or_default(),
                            ));
                        }
                        if !announced {
                            info!(
                                "lock {path} is held shared by readers on another host; breaking it if they stay silent for {}",
                                fmt_duration(self.stale_after)
                            );
                            announced = true;
                        }
                    }
                }
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
