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
//! PARENT/.NAME.l.<G>.<nonce>   symlink; a reader (or breaker) leaving group `.NAME.s.<G>`,
//!                              which it may remove; its record, until NAME is freed
//! PARENT/.NAME.break           symlink; held by the one waiter breaking a silent lock
//! PARENT/.NAME.state/          the state: one entry state~1~TOKEN~CLEAN (`lockdir::state`)
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
//! confirms it is still ours, then `unlink`; on a network filesystem a "not ours" is read
//! again before it counts (GlusterFS can answer ENOENT for a name that exists).
//!
//! # Shared
//! If NAME names a group G: register `G/r.<nonce>`, then `readlink(NAME)` again — only if it
//! still names G is the lock ours (seed 004's fix: if G's last reader left meanwhile, G is
//! gone and registering fails, or NAME has moved on). If there is no NAME: make a new group
//! with our registration inside and publish it with `symlink(G, NAME)`. Release: rename our
//! registration out of G to `.NAME.l.<G>.<nonce>` (our record stays beside the lock), then
//! `rmdir(G)`; only the one whose `rmdir` succeeded (G was empty, and no one can join a
//! removed group) unlinks NAME, and only if it still names G; then our `.l.` entry goes. So
//! NAME naming a removed group has its remover's record beside it: a waiter waits while one
//! of G's leavers lives and breaks NAME at once when all are provably dead — looked at again
//! under the break guard after NAME was re-read (the remover unlinks NAME before its entry).
//!
//! # Writer preference
//! A writer that finds the lock busy leaves `.NAME.w.<nonce>` (refreshed at every retry) and
//! readers do not join or start a group while one exists, so the readers inside drain and the
//! writer gets in. A dead waiting writer's marker is removed by proof of death, or when it
//! has not changed for `stale_after`.
//!
//! # Liveness and breaking
//! Holders refresh their entry (NAME, or their registration) with
//! `utimensat(AT_SYMLINK_NOFOLLOW)` every heartbeat period unless `local = true`; on a network
//! filesystem (which may not set a symlink's times) an exclusive holder rewrites the counter
//! in its heartbeat record `.NAME.beat` instead, and waiters read NAME through a pin (a hard
//! link, made by the server, read and removed) so that no cache decides. The rule is
//! `stale.rs`'s (same host: proof of death; elsewhere: no change for `stale_after` on the
//! waiter's own clock); this file lists the holders and removes exactly one: a dead
//! reader's registration by its exact name (a claim), then the group is left as by a
//! release; a dead exclusive holder's NAME under `.NAME.break`, after re-reading that it
//! still says the same record with the same sign.
//!
//! # Limits
//! A holder paused for longer than `stale_after` can be broken (the honest limit of every
//! lease; fencing tokens exist for it). NAME naming a group that no longer exists with no
//! leaver's entry beside it (its remover could not make one: a full disk, a lock name over 218
//! bytes) is removed after `stale_after` of no change.
//! A group left by readers that died before publishing or leaving it is removed by an
//! exclusive acquisition, one in 16 (`lockdir::tidies`: it lists the parent), once its
//! readers are proven dead, and so are the entries of leavers that died; until then they are
//! only names.
//! On NFS, attribute caching (`acdirmax`, 60 s by default) can hide heartbeats: keep
//! `stale_after` above it.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{FileStat, Mode as FileMode, UtimensatFlags, fstatat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, symlinkat, unlinkat};

use super::faults::{self, Stall, Switch};
use super::filelock::{FileLock, Scheme, Take};
use super::lock::NotReleased;
use super::lock::{Holder, Named};
use super::lockdir::probe::Scheme as Probe;
use super::lockdir::state::Issued;
use super::lockdir::{self, FsConfig, LockDir};
use super::owner::{self, Parsed, Record};
use super::stale::{Evidence, Holders, Observations};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;


/// Prefix of a reader's registration entry inside a group.
const READER_PREFIX: &str = "r.";

/// The symlink backend: the file-lock template with this file's naming.
pub type Symlink = FileLock<Files>;

/// The lock's names: what the judge sees and removes.
pub struct Files {
    profile: String,
    mode: Mode,
    dir: LockDir,
    local: bool,
    file_mode: Option<u32>,
    group: Option<u32>,
    /// A debug switch for the seed-004 race test: seed 004's first shared scheme, one
    /// well-known group name that joiners (re)create with `mkdir` — the race the seed
    /// describes. Never set outside that test.
    seed_scheme: bool,
    /// What we saw of a breaker's guard, and since when.
    guard_seen: Observations,
    /// The group NAME named at the last look (left once its members are removed).
    looked_at_group: Option<OsString>,
    /// At the last look NAME named this group, which is gone.
    gone_group: Option<OsString>,
    /// Our waiting-writer marker, while an exclusive attempt waits.
    marker: Option<OsString>,
    /// What we saw of other writers' markers, and since when.
    markers_seen: Observations,
    /// Our marker could not be made (said once): we wait without writer preference.
    unmarked: bool,
}

/// What we hold.
pub enum Held {
    Exclusive {
        rec: Record,
        /// NAME's target: our rendered record.
        target: String,
        /// Our heartbeat counter (on a network filesystem: the heartbeat record's).
        beats: u64,
    },
    Shared {
        group: OsString,
        /// `group/r.<nonce>`
        entry: PathBuf,
    },
}

/// What a waiter compares between looks of an entry: its inode and ctime (a heartbeat's
/// `utimensat` moves the ctime), or, on a network filesystem, a hash of the exclusive
/// holder's heartbeat record.
type Seen = (u64, (i64, i64));

fn sign(seen: Seen) -> Vec<u8> {
    let (ino, (s, ns)) = seen;
    format!("{ino}:{s}.{ns}").into_bytes()
}

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

fn seen_of(st: &FileStat) -> Seen {
    (st.st_ino, (st.st_ctime, st.st_ctime_nsec))
}

/// What [`owner::look`] found at `shown`, which must be a symbolic link.
fn entry((st, text): (FileStat, Option<OsString>), shown: &Path) -> Result<(String, Seen)> {
    match text {
        Some(t) => Ok((t.to_string_lossy().into_owned(), seen_of(&st))),
        None => Err(crate::files::in_the_way(
            lockdir::role(shown),
            shown,
            st.st_mode,
            st.st_uid,
            "a symbolic link (backend `symlink`)",
        )),
    }
}

impl Files {
    /// The parent directory, opened and checked on first use ([`check_shared`]).
    fn fd(&mut self) -> Result<BorrowedFd<'_>> {
        self.dir.fd()?;
        lockdir::check_shared(
            &self.dir.path,
            self.dir.remote(),
            || self.dir.fs_name(),
            self.mode,
            self.local,
        )?;
        self.dir.fd()
    }

    fn remote(&self) -> bool {
        self.dir.remote()
    }

    fn path(&self) -> &Path {
        &self.dir.path
    }

    fn group_prefix(&self) -> OsString {
        self.dir.beside(".s.")
    }

    fn marker_prefix(&self) -> OsString {
        self.dir.beside(".w.")
    }

    fn io(&self, what: &str, e: Errno) -> Error {
        // EPERM is no answer here (sshfs answers it to a racing symlink over a name).
        if matches!(e, Errno::ENOSYS | Errno::EOPNOTSUPP) {
            return lockdir::missing_call(<Self as Scheme>::NAME, "symlink", &self.dir.path, self.dir.fs_name(), e);
        }
        Error::path(what, &self.dir.path, e.into())
    }

    /// `readlink` + `lstat` of `name` (relative to the parent); `None` if it does not exist.
    fn read_entry(&mut self, name: &OsStr) -> Result<Option<(String, Seen)>> {
        let shown = self.dir.shown(name);
        let parent = self.fd()?;
        match lockdir::unstale(|| owner::look(parent, name)) {
            Ok(found) => entry(found, &shown).map(Some),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(Error::path("cannot read lock", &shown, e.into())),
        }
    }

    /// Reads `name` as [`read_entry`](Self::read_entry) does, but fresh on a network
    /// filesystem, whose `readlink` may answer from a cache (sshfs: 20 s): a hard link to it
    /// under a new name (a mutation, decided by the server, of whatever is there now) is
    /// read, then removed.
    fn read_fresh(&mut self, name: &OsStr) -> Result<Option<(String, Seen)>> {
        self.fd()?;
        if !self.remote() {
            return self.read_entry(name);
        }
        let pin = self.dir.beside(&format!(".pin.{}", crate::host::nonce()));
        let shown = self.dir.shown(name);
        let parent = self.fd()?;
        match lockdir::read_pinned(parent, name, &pin, &shown, |p| owner::look(parent, p))? {
            Some(found) => entry(found, &shown).map(Some),
            None => Ok(None),
        }
    }

    /// On a network filesystem, what changes when an exclusive holder with record `rec`
    /// heartbeats: its heartbeat record `.NAME.beat`, read fresh (or, before it wrote one,
    /// NAME's own look).
    fn remote_seen(&mut self, parsed: &Parsed) -> Result<Seen> {
        let beat = self.dir.beside(".beat");
        let content = self.dir_read(&beat)?;
        Ok(match (parsed, content) {
            (Parsed::V1(rec), Some(c)) if lockdir::is_ours(&c, rec) => (fnv(&c), (0, 0)),
            // No heartbeat record of its own (not written yet, or removed by a release that
            // died before unlinking NAME): nothing of it changes — NAME's text, unique to one
            // acquisition, is compared beside this. Not NAME's ctime: every waiter's fresh
            // read (a hard link, then its removal) moves it; nor its inode number: sshfs
            // numbers each new name (the pin) anew, so a killed holder was never broken.
            _ => (0, (0, 0)),
        })
    }

    fn dir_read(&mut self, name: &OsStr) -> Result<Option<Vec<u8>>> {
        self.fd()?;
        Ok(self.dir.read_file(name)?.map(|(c, _)| c))
    }

    /// Rewrites our heartbeat record `.NAME.beat` at beat `n`; `Ok(false)`: it is gone or
    /// another's.
    fn write_beat_record(&mut self, rec: &Record, n: u64) -> Result<bool> {
        let beat = self.dir.beside(".beat");
        let shown = self.dir.shown(&beat);
        let (at, remote) = self.dir.fd_remote()?;
        lockdir::write_beat(at, &beat, &shown, rec, n, remote)
    }

    /// Writes our first heartbeat record `.NAME.beat`, having just taken NAME (`target`).
    /// Exclusively: a record there is a successor's if we stalled past `stale_after` while
    /// taking the lock and were broken — replacing it would stop the successor with a false
    /// LOST; `Ok(false)` then (give the lock back). One that is not ours while NAME still
    /// names us is a leftover (a breaker or releaser killed between its two steps, or a
    /// network filesystem's cached answer for a removed one), replaced.
    fn publish_beat_record(&mut self, rec: &Record, target: &str) -> Result<bool> {
        let beat = self.dir.beside(".beat");
        let text = rec.render_beat(0);
        if self.dir.create_file(None, &beat, &text)?.is_some() {
            return Ok(true);
        }
        // NFS may say EEXIST for a retransmitted create that succeeded.
        if let Some(c) = self.dir_read(&beat)?
            && lockdir::is_ours(&c, rec)
        {
            return Ok(true);
        }
        let name = self.dir.name.clone();
        if self.says(&name, target)?.is_err() {
            return Ok(false);
        }
        let tmp = self.dir.beside(&format!(".beat.{}", rec.nonce));
        self.dir.publish(None, &tmp, &beat, &text)?;
        Ok(true)
    }

    /// Removes `.NAME.beat` if it is the heartbeat record of acquisition `rec`.
    fn remove_beat_record(&mut self, text: &str) {
        let Parsed::V1(rec) = Record::parse(text) else {
            return;
        };
        let beat = self.dir.beside(".beat");
        if let Ok(Some(c)) = self.dir_read(&beat)
            && lockdir::is_ours(&c, &rec)
            && let Ok(parent) = self.fd()
        {
            let _ = unlinkat(parent, beat.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }

    fn target(&mut self) -> Result<Target> {
        let name = self.dir.name.clone();
        let Some((text, seen)) = self.read_fresh(&name)? else {
            return Ok(Target::Missing);
        };
        let prefix = self.group_prefix();
        let group = OsString::from(&text);
        if group.as_bytes().starts_with(prefix.as_bytes()) && !text.contains('/') {
            // On a network filesystem `seen` is the look of a fresh pin, whose link and unlink
            // move the ctime at every look: a group's name is unique, nothing else to compare.
            let seen = if self.remote() { (0, (0, 0)) } else { seen };
            return Ok(Target::Group(group, seen));
        }
        let parsed = Record::parse(&text);
        let seen = if self.remote() {
            self.remote_seen(&parsed)?
        } else {
            seen
        };
        Ok(Target::Exclusive(parsed, text, seen))
    }

    /// `symlink(target, name)`; `Ok(true)` if `name` now says `target` (ours: NFS may answer
    /// `EEXIST` after a retransmitted, successful request), `Ok(false)` if it says
    /// something else, `ENOENT` from a missing directory passed on.
    /// The outer error: what is at `at` cannot be read (something planted there, named).
    fn make_link(&mut self, target: &str, at: &Path) -> Result<std::result::Result<bool, Errno>> {
        let parent = self.fd()?;
        match symlinkat(target, parent, at) {
            Ok(()) => return Ok(Ok(true)),
            Err(Errno::EEXIST) => {}
            // sshfs answers a racing symlink(2) over an existing name with EPERM or ENOENT
            // (SFTP's generic failure), GlusterFS with ESTALE or EIO: whoever won, the name
            // says.
            Err(Errno::EPERM | Errno::ENOENT | Errno::ESTALE | Errno::EIO) if self.remote() => {}
            Err(e) => return Ok(Err(e)),
        }
        Ok(Ok(self
            .read_fresh(at.as_os_str())?
            .is_some_and(|(t, _)| t == target)))
    }

    /// Members of group `g`; `None` if the group does not exist (any more).
    fn members(&mut self, g: &OsStr) -> Result<Option<(OwnedFd, Vec<Member>)>> {
        let shown = self.dir.shown(g);
        let parent = self.fd()?;
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
        let names = names_in(fd.as_fd(), &shown, "shared group", |n| n != b"." && n != b"..")?;
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
        let path = self.dir.path.clone();
        names_in(self.fd()?, &path, "the directory of lock", |n| {
            n.starts_with(prefix.as_bytes())
        })
    }

    /// While holding exclusively, no group can be current: remove groups left by readers
    /// that died before publishing or leaving them, and the entries of leavers that died
    /// leaving (proof of death only; one exclusive acquisition in 16 looks, one listing,
    /// [`lockdir::tidies`]).
    fn tidy_groups(&mut self) {
        let (groups, leavers) = (self.group_prefix(), self.dir.beside(".l."));
        let Ok(names) = self.list_beside(&self.dir.beside(".")) else {
            return;
        };
        for n in names {
            // `.NAME.l.<G>.<nonce>` and `.NAME.s.<G>` exactly: another lock's names share
            // these prefixes (`.NAME.l.w.<nonce>` of lock `NAME.l`, `.NAME.s.<nonce>.new/`
            // of lock `NAME.s`).
            let rest = |p: &OsString| n.as_bytes().strip_prefix(p.as_bytes());
            if rest(&leavers)
                .is_some_and(|r| r.len() == 33 && r[16] == b'.' && is_nonce(&r[..16]) && is_nonce(&r[17..]))
            {
                if let Ok(parent) = self.fd()
                    && let Ok(t) = readlinkat(parent, n.as_os_str())
                    && super::stale::provably_dead(&Record::parse(&t.to_string_lossy()))
                {
                    let _ = unlinkat(parent, n.as_os_str(), UnlinkatFlags::NoRemoveDir);
                }
                continue;
            }
            if !rest(&groups).is_some_and(is_nonce) {
                continue;
            }
            let Ok(Some((fd, members))) = self.members(&n) else {
                continue;
            };
            if !members.iter().all(|m| super::stale::provably_dead(&m.parsed)) {
                continue;
            }
            for m in &members {
                let _ = unlinkat(&fd, m.entry.as_os_str(), UnlinkatFlags::NoRemoveDir);
            }
            if let Ok(parent) = self.fd() {
                let _ = unlinkat(parent, n.as_os_str(), UnlinkatFlags::RemoveDir);
            }
        }
    }

    /// Where a reader (or a breaker) that may remove group G (`.NAME.s.<G>`) stands while it
    /// does: `.NAME.l.<G>.<nonce>`, a symlink to its record. Made before G's `rmdir` and
    /// removed after NAME is freed, so NAME naming a group that is gone has its remover's
    /// record beside it, alive or provably dead (same host: a shared lock is only ever taken
    /// there). This is the prefix of G's leavers; `None` for a name that is not a group.
    fn leaver_prefix(&self, g: &OsStr) -> Option<OsString> {
        let gp = self.group_prefix();
        let id = g.as_bytes().strip_prefix(gp.as_bytes())?;
        let mut p = self.dir.beside(".l.");
        p.push(OsStr::from_bytes(id));
        p.push(".");
        Some(p)
    }

    /// The entries of group `g`'s leavers now, with their records (those of another form,
    /// or planted by something else, say nothing of a remover: not listed).
    fn leavers(&mut self, g: &OsStr) -> Result<Vec<(OsString, Parsed)>> {
        let Some(prefix) = self.leaver_prefix(g) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for n in self.list_beside(&prefix)? {
            if !is_nonce(&n.as_bytes()[prefix.len()..]) {
                continue;
            }
            if let Ok(t) = readlinkat(self.fd()?, n.as_os_str())
                && let p @ Parsed::V1(_) = Record::parse(&t.to_string_lossy())
            {
                out.push((n, p));
            }
        }
        Ok(out)
    }

    /// What a waiter compares between looks of NAME naming group `g`, which is gone: NAME's
    /// own look and the names of G's leavers (one coming or going starts `stale_after`
    /// again), or that they could not be listed; with the leavers, where listed.
    fn gone_group(&mut self, g: &OsStr, seen: Seen) -> (Vec<u8>, Option<Vec<(OsString, Parsed)>>) {
        let mut sg = sign(seen);
        let mut list = self.leavers(g).ok();
        match &mut list {
            Some(l) => {
                l.sort_by(|a, b| a.0.cmp(&b.0));
                for (n, _) in l.iter() {
                    sg.push(b'|');
                    sg.extend_from_slice(n.as_bytes());
                }
            }
            None => sg.extend_from_slice(b"|?"),
        }
        (sg, list)
    }

    /// Leaves group `g` by moving our registration `entry` out of it to our leaver's entry
    /// (one `rename`: our record stays beside the lock while we may remove G), then as
    /// [`leave_group`](Self::leave_group). `Err(ENOENT)` inside: our registration is gone.
    fn leave(&mut self, g: &OsStr, entry: &Path) -> Result<std::result::Result<bool, Errno>> {
        let nonce = entry.file_name().and_then(|n| n.to_str()?.strip_prefix(READER_PREFIX));
        let leaving = nonce.zip(self.leaver_prefix(g)).map(|(n, mut l)| {
            l.push(n);
            l
        });
        let parent = self.fd()?;
        let moved = match &leaving {
            Some(l) => renameat(parent, entry, parent, l.as_os_str()),
            None => Err(Errno::EINVAL),
        };
        match moved {
            Ok(()) => self.leave_group(g, leaving).map(Ok),
            Err(Errno::ENOENT) => Ok(Err(Errno::ENOENT)),
            // No leaver's entry to be had (a full disk or quota, a name too long for it):
            // leave as before it existed; NAME left naming a removed G is then judged by
            // `stale_after`.
            Err(e) => {
                debug!("cannot move our registration out of the group ({e}): unlinking it");
                match unlinkat(parent, entry, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) => self.leave_group(g, None).map(Ok),
                    Err(e) => Ok(Err(e)),
                }
            }
        }
    }

    /// After leaving group `g`: remove it if it is empty; whoever removed it (only one can)
    /// frees NAME if NAME still names it. `Ok(true)` if we freed NAME. `leaving`: our
    /// leaver's entry, if we made it already (else one is made here, and if it cannot be,
    /// NAME naming a removed G is judged as a lock without a record: `stale_after`). Ours is
    /// removed afterwards whatever happened (a name with our fresh nonce is nobody else's).
    fn leave_group(&mut self, g: &OsStr, leaving: Option<OsString>) -> Result<bool> {
        let leaving = leaving.or_else(|| {
            let rec = Record::ours(&self.profile);
            let mut l = self.leaver_prefix(g)?;
            l.push(&rec.nonce);
            let parent = self.fd().ok()?;
            let _ = symlinkat(rec.render().as_str(), parent, l.as_os_str());
            Some(l)
        });
        let r = self.remove_group(g);
        if let Some(l) = leaving
            && let Ok(parent) = self.fd()
        {
            let _ = unlinkat(parent, l.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
        r
    }

    fn remove_group(&mut self, g: &OsStr) -> Result<bool> {
        let parent = self.fd()?;
        match unlinkat(parent, g, UnlinkatFlags::RemoveDir) {
            Ok(()) => {}
            // Others still read (or another leaver won): they free NAME.
            Err(Errno::ENOTEMPTY | Errno::EEXIST | Errno::ENOENT) => return Ok(false),
            Err(e) => return Err(self.io("cannot remove shared group of", e)),
        }
        faults::stall(Stall::Leaving);
        // G is gone and cannot come back (its name is unique): nobody else can have made
        // NAME name it, nor be about to remove NAME while it names G.
        let name = self.dir.name.clone();
        let parent = self.fd()?;
        match readlinkat(parent, name.as_os_str()) {
            Ok(t) if t.as_bytes() == g.as_bytes() => {
                unlinkat(parent, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| self.io("cannot remove lock", e))?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Removes NAME if it still says `text` with the same `sign` (read fresh), serialised by
    /// `.NAME.break`. `Ok(false)`: another breaker is at work (or the lock changed). NAME
    /// naming a group that is gone is removed only if, looked at again after NAME was
    /// re-read, none of that group's leavers may be alive (the one that removed the group
    /// unlinks NAME before its entry: if its entry is gone, so is the NAME we would remove);
    /// G's leavers' entries go with it.
    fn break_name(&mut self, text: &str, was: &[u8]) -> Result<bool> {
        let guard = self.dir.beside(".break");
        let mine = Record::ours(&self.profile).render();
        match self.make_link(&mine, Path::new(&guard))? {
            Ok(true) => self.guard_seen.forget(&guard),
            Ok(false) => {
                // Someone else is breaking. If they died doing it (or went silent), clear
                // their guard.
                if let Some((t, seen)) = self.read_fresh(&guard)?
                    && self
                        .guard_seen
                        .abandoned(&guard, &Record::parse(&t), &sign(seen))
                    && self.unlink_if(&guard, &t)
                {
                    info!(
                        "removed the abandoned break guard {} (its breaker died or went silent)",
                        self.dir.shown(&guard).display()
                    );
                    self.guard_seen.forget(&guard);
                }
                return Ok(false);
            }
            Err(e) => return Err(self.io("cannot take the break guard of", e)),
        }
        let name = self.dir.name.clone();
        let (same, exclusive, leavers) = match self.target()? {
            Target::Exclusive(_, t, s) => (t == text && sign(s) == was, true, Vec::new()),
            Target::Group(g, s) if g.as_bytes() == text.as_bytes() => {
                // G is gone (only such a group is broken): looked at again now that NAME was
                // re-read, its leavers are the same as judged, and none of this host is alive
                // (one may be G's remover between its `rmdir` and its `unlink` of NAME).
                let (sg, list) = self.gone_group(&g, s);
                let list = list.unwrap_or_default();
                let live = list
                    .iter()
                    .any(|(_, p)| matches!(p, Parsed::V1(r) if r.alive() == Some(true)));
                (sg == was && !live, false, list)
            }
            _ => (false, false, Vec::new()),
        };
        let broke = same
            && {
                // Its heartbeat record first, while NAME still keeps others from writing one.
                if exclusive && self.remote() {
                    self.remove_beat_record(text);
                }
                self.unlink_if(&name, text)
            };
        // G's leavers' entries go with it: none of this host lived, and G's name is never
        // used again (those of another boot or host would stay for good otherwise).
        if broke && let Ok(parent) = self.fd() {
            for (l, _) in &leavers {
                let _ = unlinkat(parent, l.as_os_str(), UnlinkatFlags::NoRemoveDir);
            }
        }
        self.unlink_if(&guard, &mine);
        Ok(broke)
    }

    /// Whether symlink `name` says `text` (read fresh), and what it said otherwise. A "no" is
    /// confirmed by reading again: GlusterFS can answer a lookup of a name that exists with
    /// ENOENT, or a read with an error, while others link and unlink pins of it. A "yes" needs
    /// no confirmation: every `text` here is unique to one acquisition and never comes back
    /// once removed, so a fresh read that shows it shows the present.
    fn says(&mut self, name: &OsStr, text: &str) -> Result<std::result::Result<(), String>> {
        self.fd()?;
        let tries = if self.remote() { 4 } else { 1 };
        let mut pause = Duration::from_millis(2);
        let mut last: Result<Option<(String, Seen)>> = Ok(None);
        for i in 0..tries {
            if i > 0 {
                debug!(
                    "{} read as {} (not {text}): reading it again",
                    self.dir.shown(name).display(),
                    match &last {
                        Ok(Some((t, _))) => t.clone(),
                        Ok(None) => "gone".into(),
                        Err(e) => format!("an error: {e}"),
                    }
                );
                std::thread::sleep(pause);
                pause *= 3;
            }
            last = self.read_fresh(name);
            if matches!(&last, Ok(Some((t, _))) if t == text) {
                return Ok(Ok(()));
            }
        }
        match last? {
            Some((t, _)) => Ok(Err(format!("it names {t}"))),
            None => Ok(Err("it is gone".into())),
        }
    }

    /// Unlinks symlink `name` if it still says `text`.
    fn unlink_if(&mut self, name: &OsStr, text: &str) -> bool {
        if !matches!(self.says(name, text), Ok(Ok(()))) {
            return false;
        }
        let Ok(parent) = self.fd() else {
            return false;
        };
        unlinkat(parent, name, UnlinkatFlags::NoRemoveDir).is_ok()
    }

    fn dir_mode(&self) -> FileMode {
        // Readers of other users register inside the group: it needs w and x where it has r.
        let m = self.file_mode.unwrap_or(0o777);
        let x = (m & 0o444) >> 2;
        FileMode::from_bits_truncate(m | x)
    }

    /// The holders for `status` (members named by their path from the parent).
    fn listing(&mut self) -> Result<(Target, Vec<Member>)> {
        let t = self.target()?;
        let list = match &t {
            Target::Missing => Vec::new(),
            Target::Exclusive(p, _, seen) => vec![Member {
                entry: self.dir.name.clone(),
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

impl Holders for Files {
    /// An exclusive holder: keyed by NAME's text (unique per acquisition). A group: one
    /// entry per reader, keyed by its path from the parent. A group that no longer exists
    /// (its remover is between `rmdir` and `unlink`, or died there): NAME, keyed by G, with
    /// the record of a leaver alive or unknown, else of a provably dead one — its remover
    /// is among them, since a leaver's entry outlives its `unlink` of NAME (see
    /// [`leaver_prefix`](Self::leaver_prefix)); none (a remover that could not make its
    /// entry): without a record, judged by `stale_after`.
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        self.looked_at_group = None;
        self.gone_group = None;
        match self.target()? {
            Target::Missing => Ok(None),
            Target::Exclusive(parsed, text, seen) => Ok(Some(vec![Evidence {
                key: text.into(),
                record: Some(parsed),
                sign: sign(seen),
                mode: Mode::Exclusive,
                age: None,
            }])),
            Target::Group(g, seen) => {
                let Some((_, members)) = self.members(&g)? else {
                    // A listing that fails (a directory we may search but not read) tells
                    // nothing: judged as a lock without a record.
                    let (sg, list) = self.gone_group(&g, seen);
                    let (dead, unknown): (Vec<_>, Vec<_>) = list
                        .unwrap_or_default()
                        .into_iter()
                        .partition(|(_, p)| super::stale::provably_dead(p));
                    let record = unknown.into_iter().chain(dead).next();
                    self.gone_group = Some(g.clone());
                    return Ok(Some(vec![Evidence {
                        key: g,
                        record: record.map(|(_, p)| p),
                        sign: sg,
                        mode: Mode::Shared,
                        age: None,
                    }]));
                };
                let list = members
                    .into_iter()
                    .map(|m| Evidence {
                        key: Path::new(&g).join(&m.entry).into_os_string(),
                        record: Some(m.parsed),
                        sign: sign(m.seen),
                        mode: Mode::Shared,
                        age: None,
                    })
                    .collect();
                self.looked_at_group = Some(g);
                Ok(Some(list))
            }
        }
    }

    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let gone = self.gone_group.as_deref() == Some(ev.key.as_os_str());
        match ev.mode {
            // A reader: its registration's exact name (`G/r.<nonce>`, as listed from G; never
            // reused) is the claim.
            Mode::Shared if !gone => {
                let key = ev.key.as_bytes();
                let Some(at) = key.iter().position(|b| *b == b'/') else {
                    return Ok(false);
                };
                let (g, entry) = (OsStr::from_bytes(&key[..at]), OsStr::from_bytes(&key[at + 1..]));
                // The group opened without following a symlink swapped in since the listing.
                let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
                let Ok(gfd) = openat(self.fd()?, g, flags, FileMode::empty()) else {
                    return Ok(false);
                };
                Ok(unlinkat(&gfd, entry, UnlinkatFlags::NoRemoveDir).is_ok())
            }
            // An exclusive holder (keyed by NAME's text, whatever it says), or NAME naming a
            // group that is gone.
            _ => self.break_name(&ev.key.to_string_lossy(), &ev.sign),
        }
    }

    /// The readers removed: leave their group as the last of them would have.
    fn finish(&mut self) -> Result<bool> {
        match self.looked_at_group.take() {
            Some(g) => self.leave_group(&g, None),
            None => Ok(true),
        }
    }
}

impl Files {
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
            if self.markers_seen.abandoned(&m, &parsed, &sign(seen)) {
                debug!(
                    "removing the marker of a dead waiting writer: {}",
                    parsed.holder()
                );
                let _ = unlinkat(self.fd()?, m.as_os_str(), UnlinkatFlags::NoRemoveDir);
                self.markers_seen.forget(&m);
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
        self.fd()?;
        if self.remote() && (self.marker.is_some() || !self.local) {
            // No readers without local = true there (refused); with it, markers are judged
            // by proof of death alone and need no refreshing (which sshfs cannot do).
            return Ok(());
        }
        if let Some(m) = self.marker.clone() {
            match utimensat(
                self.fd()?,
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
        match self.make_link(&rec.render(), Path::new(&m))? {
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
            && let Ok(parent) = self.fd()
        {
            let _ = unlinkat(parent, m.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }

    /// One exclusive try.
    fn take_exclusive(&mut self) -> Result<Take<Held>> {
        let mut rec = Record::ours(&self.profile);
        rec.token = Some(self.dir.next_token()?);
        let target = rec.render();
        let name = self.dir.name.clone();
        match self.make_link(&target, Path::new(&name))? {
            Ok(true) => self.finish_exclusive(rec, target),
            Ok(false) => Ok(Take::Taken),
            Err(e) => Err(self.io("cannot create lock", e)),
        }
    }

    /// Holding exclusively: fencing token, state "not cleanly released" until our release
    /// says otherwise. If the token NAME names was overtaken (someone took and released the
    /// lock between our read of the state and our symlink), or a successor's heartbeat
    /// record is there (we stalled and were broken), NAME is given back if it still names us
    /// and we look again. Rewriting NAME instead (a rename over it) would replace a
    /// successor's lock if we stalled here past stale_after and were broken meanwhile.
    fn finish_exclusive(&mut self, rec: Record, target: String) -> Result<Take<Held>> {
        let name = self.dir.name.clone();
        let mut took = None;
        // Ok(true): overtaken.
        let r = (|| -> Result<bool> {
            let Some(issued) = self.dir.issue_token_exactly(rec.token.unwrap_or(0))? else {
                return Ok(true);
            };
            took = Some(issued);
            if self.remote() && !self.local && !self.publish_beat_record(&rec, &target)? {
                return Ok(true);
            }
            Ok(false)
        })();
        if let Ok(true) = r {
            debug!(
                "fencing token {} was overtaken, or a successor's heartbeat record is there, \
                 while we took {}: giving it back",
                rec.token.unwrap_or_default(),
                self.path().display()
            );
            self.unlink_if(&name, &target);
            return Ok(Take::Again);
        }
        let token = rec.token;
        let held = Held::Exclusive {
            rec,
            target,
            beats: 0,
        };
        if let Err(e) = r {
            let _ = self.release(held);
            return Err(e);
        }
        self.unmark_waiting();
        if lockdir::tidies(token) {
            self.tidy_groups();
        }
        debug_assert_eq!(took.map(|i| i.token), token);
        Ok(Take::Held(held, took))
    }

    /// One shared try.
    fn take_shared(&mut self) -> Result<Take<Held>> {
        let writers = self.writers_waiting()?;
        if !writers.is_empty() {
            // Writer preference: let the readers inside drain. Name who holds it now.
            let (_, list) = self.listing()?;
            let holders = if list.is_empty() {
                writers
            } else {
                list.into_iter().map(|m| m.parsed.holder()).collect()
            };
            return Ok(Take::Busy(holders));
        }
        let rec = Record::ours(&self.profile);
        let text = rec.render();
        let reg = format!("{READER_PREFIX}{}", rec.nonce);
        let f = &mut *self;
        match f.target()? {
            Target::Missing => {
                let mut g = f.group_prefix();
                g.push(if f.seed_scheme { "seed" } else { &rec.nonce });
                let seed_scheme = f.seed_scheme;
                let mode = f.dir_mode();
                let group = f.group;
                let path = f.path().to_path_buf();
                let parent = f.fd()?;
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
                let name = f.dir.name.clone();
                // Any error, a planted file at NAME included, takes our group away below.
                let mut publish = || -> Result<bool> {
                    let r = match f.make_link(&text, &entry)? {
                        Ok(true) => f.make_link(&g.to_string_lossy(), Path::new(&name))?,
                        r => r,
                    };
                    r.map_err(|e| f.io("cannot create lock", e))
                };
                let published = publish();
                let group_gone = !f.dir.shown(&g).exists();
                match published {
                    Ok(true) => Ok(f.finish_shared(g, entry)),
                    // Our fresh, still empty group was tidied away by someone: look again.
                    Ok(false) | Err(_) if group_gone => Ok(Take::Again),
                    Ok(false) => {
                        // Someone else took NAME first: take our group away again.
                        let parent = f.fd()?;
                        let _ = unlinkat(parent, entry.as_os_str(), UnlinkatFlags::NoRemoveDir);
                        let _ = unlinkat(parent, g.as_os_str(), UnlinkatFlags::RemoveDir);
                        Ok(Take::Again)
                    }
                    Err(e) => {
                        let parent = f.fd()?;
                        let _ = unlinkat(parent, entry.as_os_str(), UnlinkatFlags::NoRemoveDir);
                        let _ = unlinkat(parent, g.as_os_str(), UnlinkatFlags::RemoveDir);
                        Err(e)
                    }
                }
            }
            Target::Group(g, _) => {
                if f.seed_scheme {
                    let mode = f.dir_mode();
                    let _ = mkdirat(f.fd()?, g.as_os_str(), mode);
                }
                let entry = Path::new(&g).join(&reg);
                match f.make_link(&text, &entry)? {
                    // The group is gone: its last reader is leaving (or died leaving).
                    Err(Errno::ENOENT) => return Ok(Take::Taken),
                    Err(e) => return Err(f.io("cannot join shared lock", e)),
                    Ok(false) => return Ok(Take::Again),
                    Ok(true) => {}
                }
                // Seed 004's race: G's last reader may have left (removing G and NAME) between
                // our readlink and our registration, and a writer may hold NAME now. Only
                // if NAME still names G do we hold it.
                let name = f.dir.name.clone();
                let still = matches!(readlinkat(f.fd()?, name.as_os_str()), Ok(t) if t.as_bytes() == g.as_bytes());
                if still {
                    return Ok(f.finish_shared(g, entry));
                }
                // We may have kept an emptied group alive for a moment: leave it properly.
                match f.leave(&g, &entry)? {
                    Ok(_) | Err(Errno::ENOENT) => {}
                    Err(e) => return Err(f.io("cannot leave shared lock", e)),
                }
                Ok(Take::Again)
            }
            Target::Exclusive(..) => Ok(Take::Taken),
        }
    }

    fn finish_shared(&mut self, group: OsString, entry: PathBuf) -> Take<Held> {
        // Readers report the write epoch: the last exclusive token.
        let token = match self.dir.read_state() {
            Ok(s) => s.map(|s| s.token),
            Err(e) => {
                debug!("no fencing token: {e}");
                None
            }
        };
        let read = token.map(|token| Issued {
            token,
            ..Issued::default()
        });
        Take::Held(Held::Shared { group, entry }, read)
    }
}


impl Drop for Files {
    fn drop(&mut self) {
        // A writer that gave up waiting takes its marker away.
        self.unmark_waiting();
    }
}

impl Scheme for Files {
    type Held = Held;
    const NAME: &'static str = "symlink";
    const PROBE: Probe = Probe::Symlink;
    const SHARED: bool = true;
    const ROUNDS: usize = 8;

    fn new(cfg: &FsConfig, lock: &Named) -> Files {
        Files {
            profile: lock.name.to_string(),
            mode: lock.common.mode(),
            dir: LockDir::new(cfg, &lock.common),
            local: cfg.local,
            file_mode: cfg.file_mode,
            group: cfg.group,
            seed_scheme: faults::on(Switch::SymlinkSeedScheme),
            guard_seen: Observations::new(lock.common.stale_after),
            looked_at_group: None,
            gone_group: None,
            marker: None,
            markers_seen: Observations::new(lock.common.stale_after),
            unmarked: false,
        }
    }

    fn dir(&self) -> &LockDir {
        &self.dir
    }

    fn dir_mut(&mut self) -> &mut LockDir {
        &mut self.dir
    }

    fn take(&mut self) -> Result<Take<Held>> {
        match self.mode {
            Mode::Exclusive => self.take_exclusive(),
            Mode::Shared => self.take_shared(),
        }
    }

    /// A waiting writer leaves (or refreshes) its marker so readers stop joining.
    fn contended(&mut self) -> Result<()> {
        match self.mode {
            Mode::Exclusive => match self.mark_waiting() {
                // A full, read-only or unwritable directory: wait without writer preference,
                // as mkdir and link waiters wait (issue 28: this waiter exited 74). Something
                // planted at the marker's name is still refused.
                Err(e) if e.kind() != Kind::Config => {
                    if !self.unmarked {
                        self.unmarked = true;
                        info!("{e}; waiting without writer preference (readers may keep arriving)");
                    }
                    Ok(())
                }
                r => r,
            },
            Mode::Shared => Ok(()),
        }
    }

    fn failed(&mut self) {
        self.unmark_waiting();
    }

    /// Writers queue (wake.rs); readers all watch: a writer leaving lets them all in.
    fn queues(&self) -> bool {
        self.mode == Mode::Exclusive
    }

    fn beat(&mut self, held: &mut Held) -> Result<()> {
        let path = self.path().to_path_buf();
        let now = TimeSpec::UTIME_NOW;
        self.fd()?;
        match held {
            Held::Exclusive { rec, beats, .. } if self.remote() => {
                // Our heartbeat record is replaced by a successor and removed by a breaker:
                // while it is ours, so is the lock.
                *beats += 1;
                if !self.write_beat_record(rec, *beats)? {
                    return Err(err!(
                        Lost,
                        "lock {} was broken: our heartbeat record is gone",
                        path.display()
                    ));
                }
                Ok(())
            }
            Held::Exclusive { target, .. } => {
                let name = self.dir.name.clone();
                match self.read_entry(&name)? {
                    Some((t, _)) if t == *target => {}
                    _ => {
                        return Err(err!(
                            Lost,
                            "lock {} was broken: it no longer names us",
                            path.display()
                        ));
                    }
                }
                utimensat(
                    self.fd()?,
                    name.as_os_str(),
                    &now,
                    &now,
                    UtimensatFlags::NoFollowSymlink,
                )
                .map_err(|e| Error::path("cannot heartbeat lock", &path, e.into()))
            }
            Held::Shared { entry, .. } => {
                match utimensat(self.fd()?, &*entry, &now, &now, UtimensatFlags::NoFollowSymlink) {
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

    fn release(&mut self, held: Held) -> std::result::Result<(), NotReleased<Held>> {
        self.release_held(held).map_err(NotReleased::done)
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        let (t, list) = self.listing()?;
        let epoch = self.dir.read_state().ok().flatten().map(|s| s.token);
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
}

impl Files {
    fn release_held(&mut self, held: Held) -> Result<()> {
        let path = self.path().to_path_buf();
        match held {
            Held::Exclusive { rec, target, .. } => {
                let name = self.dir.name.clone();
                if let Err(now) = self.says(&name, &target)? {
                    return Err(err!(
                        Lost,
                        "lock {} was broken while held: it no longer names us ({now}; we were {target})",
                        path.display()
                    ));
                }
                if let Some(token) = rec.token
                    && let Err(e) = self.dir.mark_clean(token)
                {
                    info!("{e}; the next holder will see prev=crashed");
                }
                // Our heartbeat record first, while NAME still keeps others from writing one.
                if self.remote() {
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
            Held::Shared { group, entry } => match self.leave(&group, &entry)? {
                Ok(_) => Ok(()),
                Err(Errno::ENOENT) => Err(err!(
                    Lost,
                    "shared lock {} was broken while held: our registration is gone",
                    path.display()
                )),
                Err(e) => Err(Error::path("cannot release lock", &path, e.into())),
            },
        }
    }
}

/// Whether `n` is a nonce as [`crate::host::nonce`] makes them (16 lowercase hex digits):
/// a leaver's entry ends with one, and nothing of another lock that shares its prefix does.
fn is_nonce(n: &[u8]) -> bool {
    n.len() == 16 && n.iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
}

/// The names in directory `dir` (shown as `shown`, the `what` of messages) that `keep`
/// accepts, listed through a description of our own (listing moves its offset).
fn names_in(
    dir: BorrowedFd<'_>,
    shown: &Path,
    what: &str,
    keep: impl Fn(&[u8]) -> bool,
) -> Result<Vec<OsString>> {
    let mut out = Vec::new();
    crate::files::each_name(dir, ".", OFlag::empty(), |n| {
        if keep(n.to_bytes()) {
            out.push(OsString::from_vec(n.to_bytes().to_vec()));
        }
        std::ops::ControlFlow::Continue(())
    })
    .map_err(|e| Error::path(&format!("cannot list {what}"), shown, e.into()))?;
    Ok(out)
}
