//! `locksmith verify`: probes a file lock's directory for what its backend relies on, and
//! says whether the backend keeps SPEC §6 there (issue 12).
//!
//! Every probe works beside the lock under names of its own, `.NAME.verify.<nonce>.<what>`
//! (no lock, record, pin or marker name has that form), and never touches the lock or its
//! records. Every name a probe may create is registered before it is created and removed at
//! the end whatever happened (a probe that failed half-way, or did not answer in time).
//! Every probe runs on a thread of its own and is waited for at most a bound
//! (`Ctx::bound` for each change to show, twice that in all): a filesystem that hangs makes
//! that probe `FAIL`, not `verify` hang.
//!
//! What is measured, and against which rule:
//! - the filesystem ([`detect`]) and [`check_dir_mode`];
//! - exclusive creation of the lock name by the backend's own call (`mkdir`, `link`,
//!   `symlink`), raced by two contenders (one through `--peer`), judged as the backend judges
//!   (`link` by the content the name holds, `symlink` by its target read fresh);
//! - `rename(2)` of a symlink over an existing name (the state record), read back fresh after
//!   each; for mkdir, `rename(2)` of a directory onto one that is not empty refused (how it
//!   publishes its lock without `RENAME_NOREPLACE` and `symlink(2)`: SMB); and, for information, how often a reader (through the peer) finds a file missing
//!   in the instant it is renamed over (no backend relies on that: see `rename_gaps`);
//! - a hard link to a symlink read back (the pins through which records are read fresh on a
//!   network filesystem), link counts (measured, relied on by no backend), a symlink's own
//!   times (heartbeats of `symlink` and `mkdir` on a local filesystem), a heartbeat record
//!   rewritten in place by [`write_beat`] and read back by [`read_record`];
//! - `flock(2)` between two descriptors, and (with `--peer`) across the mounts;
//! - with `--peer`: how late a change made here shows through the peer: names created and
//!   removed, a record rewritten in place or renamed over, a symlink read through a pin or
//!   with `readlink`. Each probe first looks through the peer (so its cache holds the old
//!   answer), then changes, then polls every [`POLL`] until the new answer shows.
//!
//! The verdict is locksmith's own rule ([`check`], [`cache_time`], and for shared symlink
//! locks `lockdir::check_shared`) plus every relied-on property: the delays of fresh reads
//! must not exceed the cache time the rule counts with.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier, Mutex, mpsc};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, readlinkat, renameat};
use nix::sys::stat::{Mode as FileMode, UtimensatFlags, fstat, fstatat, mkdirat, utimensat};
use nix::sys::time::TimeSpec;
use nix::unistd::{UnlinkatFlags, linkat, symlinkat, unlinkat};

use super::{Fs, FsConfig};
use super::{
    UNKNOWN_CACHE, cache_time, check, check_dir_mode, detect, pin, read_record, suggest_cache_time,
    write_beat,
};
use crate::backend::lock::Named;
use crate::backend::owner::{Record, State};
use crate::backend::verify::{
    self, Answers, Found, Probing, Problem, Property, Reliance, Report, figure,
};
use crate::error::{Error, Result, err};
use crate::protocol::Mode;
use crate::settings::fmt_duration;

/// How often a change is looked for through the peer: the resolution of the delays.
pub const POLL: Duration = Duration::from_millis(10);

/// Races per exclusive-creation probe.
const ROUNDS: usize = 8;

/// Renames over one name while a fresh reader watches it.
const RENAMES: usize = 20;

/// The file backends: how each takes its lock name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Flock,
    Mkdir,
    Link,
    Symlink,
}

impl Scheme {
    fn name(self) -> &'static str {
        match self {
            Scheme::Flock => "flock",
            Scheme::Mkdir => "mkdir",
            Scheme::Link => "link",
            Scheme::Symlink => "symlink",
        }
    }

    /// Liveness by heartbeats (else the kernel's flock(2) decides).
    fn heartbeats(self) -> bool {
        self != Scheme::Flock
    }
}

/// What one probe saw.
enum Outcome {
    Holds(String),
    Breaks(String),
    /// How late a change showed through the peer (`None`: not within the bound).
    Delay(Option<Duration>),
}

type Probed = std::result::Result<Outcome, String>;

/// What every probe shares: the lock's directory, the peer's, the names made.
#[derive(Clone)]
struct Ctx {
    lock: Arc<OwnedFd>,
    /// The same directory through the peer mount; `None`: no (usable) peer.
    peer: Option<Arc<OwnedFd>>,
    /// The lock's directory, for messages.
    shown: PathBuf,
    /// `.NAME.verify.<nonce>.`
    prefix: String,
    /// Every name a probe may have made, removed at the end.
    made: Arc<Mutex<Vec<OsString>>>,
    /// How long a change may take to show before it counts as not showing.
    bound: Duration,
    remote: bool,
    profile: String,
}

impl Ctx {
    /// A probe name (`prefix` + `tag`), registered for removal before anything creates it.
    fn name(&self, tag: &str) -> OsString {
        let n = OsString::from(format!("{}{tag}", self.prefix));
        self.made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(n.clone());
        n
    }

    fn lock(&self) -> BorrowedFd<'_> {
        self.lock.as_fd()
    }

    /// The peer's directory, else the lock's own.
    fn other(&self) -> BorrowedFd<'_> {
        self.peer.as_deref().map_or(self.lock.as_fd(), AsFd::as_fd)
    }

    fn shown(&self, name: &OsStr) -> PathBuf {
        self.shown.join(name)
    }

    /// Removes every registered name (files, symlinks, empty directories); the names that
    /// would not go. SMB refuses to remove a file or directory that a client still has open
    /// (EBUSY, EACCES: a reader through the other mount a moment ago) and a directory not yet
    /// empty: those are tried again for about two seconds (issue 28: `.NAME.verify.<nonce>.w`
    /// and `.d.rename.2` were left in 3 of 32 runs).
    fn sweep(&self) -> Vec<String> {
        let mut names = std::mem::take(&mut *self.made.lock().unwrap_or_else(|e| e.into_inner()));
        // The deepest first: an entry before the directory holding it.
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let dir = self.lock();
        let remove = |n: &OsString| -> Option<Errno> {
            match unlinkat(dir, n.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => return None,
                Err(_) => {}
            }
            match unlinkat(dir, n.as_os_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => None,
                Err(e) => Some(e),
            }
        };
        let mut pause = Duration::from_millis(5);
        loop {
            let mut again = false;
            names.retain(|n| match remove(n) {
                None => false,
                Some(Errno::EBUSY | Errno::EACCES | Errno::ENOTEMPTY | Errno::EEXIST) => {
                    again = true;
                    true
                }
                Some(_) => true,
            });
            if !again || pause > Duration::from_secs(1) {
                break;
            }
            std::thread::sleep(pause);
            pause *= 2;
        }
        names
            .iter()
            .map(|n| n.to_string_lossy().into_owned())
            .collect()
    }
}

fn failed(what: &str, name: &OsStr, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", name.to_string_lossy())
}

/// Creates the regular file `name` in `dir` (exclusively) holding `text`.
fn create(dir: BorrowedFd<'_>, name: &OsStr, text: &str) -> std::result::Result<(), String> {
    let flags = OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC;
    let fd = openat(dir, name, flags, FileMode::from_bits_truncate(0o600))
        .map_err(|e| failed("cannot create", name, e))?;
    File::from(fd)
        .write_all_at(text.as_bytes(), 0)
        .map_err(|e| failed("cannot write", name, e))
}

/// The content of `name` in `dir`, read fresh (`None`: there is none).
fn content(
    ctx: &Ctx,
    dir: BorrowedFd<'_>,
    name: &OsStr,
) -> std::result::Result<Option<Vec<u8>>, String> {
    read_record(dir, name, &ctx.shown(name))
        .map(|r| r.map(|(c, _)| c))
        .map_err(|e| e.message().to_string())
}

/// The target of the symlink `name` in `dir`, read through the hard link `pinned` (made by
/// the server, read, removed), as the backends read records on a network filesystem.
fn pinned(
    ctx: &Ctx,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    pinned: &OsStr,
) -> std::result::Result<Option<OsString>, String> {
    if !pin(dir, name, pinned, &ctx.shown(name)).map_err(|e| e.message().to_string())? {
        return Ok(None);
    }
    let r = readlinkat(dir, pinned);
    let _ = unlinkat(dir, pinned, UnlinkatFlags::NoRemoveDir);
    r.map(Some).map_err(|e| failed("cannot read", pinned, e))
}

/// Polls `seen` every [`POLL`] from `t0` until it says yes or `bound` has passed.
fn until(
    t0: Instant,
    bound: Duration,
    mut seen: impl FnMut() -> std::result::Result<bool, String>,
) -> std::result::Result<Option<Duration>, String> {
    loop {
        if seen()? {
            return Ok(Some(t0.elapsed()));
        }
        if t0.elapsed() >= bound {
            return Ok(None);
        }
        std::thread::sleep(POLL);
    }
}

/// How a backend creates its lock name.
#[derive(Clone, Copy)]
enum Create {
    Mkdir,
    Link,
    Symlink,
}

impl Create {
    fn tag(self) -> &'static str {
        match self {
            Create::Mkdir => "mkdir",
            Create::Link => "link",
            Create::Symlink => "symlink",
        }
    }
}

/// `ROUNDS` races of two contenders (the second through the peer, if any) creating one new
/// name with the backend's call, each judging as the backend does whether it won: exactly
/// one may. With a peer, also: a name made here is refused through the peer although the
/// peer had just looked it up as missing (its cache says "free"; the server decides).
fn exclusive(ctx: &Ctx, how: Create) -> Probed {
    for round in 0..ROUNDS {
        let winners = race(ctx, how, round)?;
        if winners != 1 {
            return Ok(Outcome::Breaks(format!(
                "round {} of {ROUNDS}: {winners} contenders were told they won",
                round + 1
            )));
        }
    }
    let mut detail = format!(
        "{ROUNDS} races of 2 contenders{}: one winner each",
        if ctx.peer.is_some() {
            " (one through the peer)"
        } else {
            ""
        }
    );
    if let Some(peer) = ctx.peer.as_deref().map(AsFd::as_fd) {
        // The peer looks first (its cache: missing), then the name is made here.
        let tag = how.tag();
        let name = ctx.name(&format!("{tag}.seq"));
        let tmp = ctx.name(&format!("{tag}.seq.t"));
        let _ = fstatat(peer, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
        make(how, ctx.lock(), &name, || tmp, "verify-here")?.map_err(|e| failed(tag, &name, e))?;
        let t2 = || ctx.name(&format!("{tag}.seq.t2"));
        if make(how, peer, &name, t2, "verify-peer")?.is_ok() {
            return Ok(Outcome::Breaks(format!(
                "{} made here was made again through the peer (its cache said it was missing)",
                name.to_string_lossy()
            )));
        }
        detail.push_str("; a name made here is refused through the peer");
    }
    Ok(Outcome::Holds(detail))
}

/// Round `round` of [`exclusive`]: two contenders (the second through the peer, if any)
/// make one new name at once; how many were told they won.
fn race(ctx: &Ctx, how: Create, round: usize) -> std::result::Result<usize, String> {
    let tag = how.tag();
    let name = ctx.name(&format!("{tag}.{round}"));
    let ids: Vec<String> = (0..2)
        .map(|i| format!("verify-{tag}-{round}-{i}"))
        .collect();
    let tmps: Vec<OsString> = (0..2)
        .map(|i| ctx.name(&format!("{tag}.{round}.t{i}")))
        .collect();
    let pins: Vec<OsString> = (0..2)
        .map(|i| ctx.name(&format!("{tag}.{round}.p{i}")))
        .collect();
    let dirs = [ctx.lock(), ctx.other()];
    if let Create::Link = how {
        for i in 0..2 {
            create(dirs[i], &tmps[i], &ids[i])?;
        }
    }
    let barrier = Barrier::new(2);
    let won: Vec<std::result::Result<bool, String>> = std::thread::scope(|s| {
        let hands: Vec<_> = (0..2)
            .map(|i| {
                let (dir, name, id, tmp, pin) = (dirs[i], &name, &ids[i], &tmps[i], &pins[i]);
                let barrier = &barrier;
                s.spawn(move || {
                    barrier.wait();
                    contend(ctx, how, dir, name, id, tmp, pin)
                })
            })
            .collect();
        hands
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a contender panicked".into()))
            })
            .collect()
    });
    let mut winners = 0;
    for w in won {
        winners += usize::from(w?);
    }
    Ok(winners)
}

/// One contender of a [`race`]: makes `name` in `dir` with the backend's call and judges,
/// as the backend does, whether it won (`id`: what its lock name would hold; `tmp` and `pin`:
/// names of its own).
fn contend(
    ctx: &Ctx,
    how: Create,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    id: &str,
    tmp: &OsStr,
    pin: &OsStr,
) -> std::result::Result<bool, String> {
    match how {
        Create::Mkdir => match mkdirat(dir, name, FileMode::from_bits_truncate(0o700)) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST | Errno::EPERM | Errno::ENOENT) => Ok(false),
            Err(e) => Err(failed("mkdir", name, e)),
        },
        Create::Link => {
            match linkat(dir, tmp, dir, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::EEXIST | Errno::EPERM | Errno::ENOENT) => {}
                Err(e) => return Err(failed("link", name, e)),
            }
            Ok(content(ctx, dir, name)?.as_deref() == Some(id.as_bytes()))
        }
        Create::Symlink => match symlinkat(id, dir, name) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST | Errno::EPERM | Errno::ENOENT) => {
                let target = if ctx.remote {
                    pinned(ctx, dir, name, pin)?
                } else {
                    readlinkat(dir, name).ok()
                };
                Ok(target.as_deref() == Some(OsStr::new(id)))
            }
            Err(e) => Err(failed("symlink", name, e)),
        },
    }
}

/// Makes `name` in `dir` with the backend's call (`link`: from a new file, `tmp()`, holding
/// `text`; `symlink`: pointing at `text`). `Err`: the new file could not be made.
fn make(
    how: Create,
    dir: BorrowedFd<'_>,
    name: &OsStr,
    tmp: impl FnOnce() -> OsString,
    text: &str,
) -> std::result::Result<nix::Result<()>, String> {
    Ok(match how {
        Create::Mkdir => mkdirat(dir, name, FileMode::from_bits_truncate(0o700)),
        Create::Link => {
            let tmp = tmp();
            create(dir, &tmp, text)?;
            linkat(dir, tmp.as_os_str(), dir, name, AtFlags::empty())
        }
        Create::Symlink => symlinkat(text, dir, name),
    })
}

/// Measurements of each delay a backend relies on (the longest counts).
const SAMPLES: usize = 3;

/// Renames a new symlink over one name `RENAMES` times (as heartbeat records are published),
/// reading it back fresh after each (through a pin on a network filesystem, as the backends
/// read it): it must read the new target every time, never missing.
fn rename_over(ctx: &Ctx) -> Probed {
    let name = ctx.name("rename");
    let pin_name = ctx.name("rename.pin");
    let here = ctx.lock();
    symlinkat("verify-0", here, name.as_os_str()).map_err(|e| failed("cannot make", &name, e))?;
    for k in 1..=RENAMES {
        let tmp = ctx.name(&format!("rename.{k}"));
        let target = format!("verify-{k}");
        symlinkat(target.as_str(), here, tmp.as_os_str())
            .and_then(|()| renameat(here, tmp.as_os_str(), here, name.as_os_str()))
            .map_err(|e| failed("cannot rename over", &name, e))?;
        let seen = if ctx.remote {
            pinned(ctx, here, &name, &pin_name)?
        } else {
            readlinkat(here, name.as_os_str()).ok()
        };
        if seen.as_deref() != Some(OsStr::new(&target)) {
            return Ok(Outcome::Breaks(format!(
                "rename {k} of {RENAMES}: read back fresh as {seen:?}, not {target:?}"
            )));
        }
    }
    Ok(Outcome::Holds(format!(
        "{RENAMES} renames over a symlink, each read back fresh at once"
    )))
}

/// How long [`state_moves`] waits for a moved state to be listed here.
const LISTING_WAIT: Duration = Duration::from_secs(2);

/// Moves a token state on `RENAMES` times as holders do ([`super::state`]: the entry's exact
/// name renamed to the next), through the peer if there is one, in a directory of its own.
/// After each move, here: the old name renamed again must fail — a holder's late write must
/// never roll the state back. And, measured: how soon the directory, listed fresh as the
/// backends list it, shows the new state (a holder that reads an old one gives the lock back
/// and tries again: slower, not unsafe).
fn state_moves(ctx: &Ctx) -> Probed {
    let name = ctx.name("state");
    let shown = ctx.shown(&name);
    let at = |dir| super::state::StateAt {
        dir,
        name: &name,
        shown: &shown,
        remote: ctx.remote,
        mode: None,
        group: None,
        slots: 1,
        agree: None,
    };
    let (here, there) = (at(ctx.lock()), at(ctx.other()));
    let st = |token| State::one(token, true);
    let msg = |e: Error| e.message().to_string();
    if !here.start(st(0)).map_err(msg)? {
        return Err(format!("{} was there already", name.to_string_lossy()));
    }
    let mut now = st(0);
    let r = (|| -> Probed {
        let mut listed = Some(Duration::ZERO);
        for k in 1..=RENAMES as u64 {
            // Listed here first, so that a cache holds the old state.
            super::state::read(&here).map_err(msg)?;
            if !there.swap(now, st(k)).map_err(msg)? {
                return Err(format!("could not move the state from {} to {k}", k - 1));
            }
            let old = now;
            now = st(k);
            if here.swap(old, st(k + 1000)).map_err(msg)? {
                now = st(k + 1000);
                return Ok(Outcome::Breaks(format!(
                    "move {k} of {RENAMES}: the old state's name, already renamed, was renamed \
                     again: a late write would roll the state back and tokens be issued twice"
                )));
            }
            if let Some(longest) = listed {
                let seen = until(Instant::now(), LISTING_WAIT, || {
                    super::state::read(&here)
                        .map(|s| s == Some(now))
                        .map_err(msg)
                })?;
                listed = seen.map(|d| d.max(longest));
            }
        }
        Ok(Outcome::Holds(format!(
            "{RENAMES} moves of a token state, the old name refused each time; the new one {}",
            match listed {
                Some(d) => format!("listed fresh within {}", figure(d)),
                None => format!(
                    "not listed within {} (holders then give the lock back and try again until \
                     it is: slower handoff, not unsafe)",
                    figure(LISTING_WAIT)
                ),
            }
        )))
    })();
    // The entry is a symlink, or an empty directory where the filesystem has no symlinks.
    if unlinkat(ctx.lock(), &here.entry(now), UnlinkatFlags::NoRemoveDir).is_err() {
        let _ = unlinkat(ctx.lock(), &here.entry(now), UnlinkatFlags::RemoveDir);
    }
    r
}

/// Renames new files over one name `RENAMES` times while a reader (through the peer, if any)
/// opens and reads it fresh in a loop, at least once between two renames: how often the
/// reader finds the name missing (or cannot read it) in the instant of a rename.
fn rename_gaps(ctx: &Ctx) -> Probed {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let name = ctx.name("gaps");
    let here = ctx.lock();
    create(here, &name, "verify-0")?;
    let tmps: Vec<OsString> = (1..=RENAMES)
        .map(|k| ctx.name(&format!("gaps.{k}")))
        .collect();
    let (done, progress) = (AtomicBool::new(false), AtomicUsize::new(0));
    let (missing, errors, reads, wrote) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut missing, mut errors, mut reads) = (0usize, Vec::new(), 0usize);
            while !done.load(Ordering::Acquire) {
                match content(ctx, ctx.other(), &name) {
                    Ok(Some(_)) => {}
                    Ok(None) => missing += 1,
                    Err(e) => errors.push(e),
                }
                reads += 1;
                progress.store(reads, Ordering::Release);
            }
            (missing, errors, reads)
        });
        let mut wrote = Ok(());
        for (k, tmp) in tmps.iter().enumerate() {
            // At least one read between two renames (bounded: a reader that hangs shows).
            let t0 = Instant::now();
            while progress.load(Ordering::Acquire) <= k && t0.elapsed() < ctx.bound {
                std::thread::yield_now();
            }
            let r = create(here, tmp, &format!("verify-{}", k + 1)).and_then(|()| {
                renameat(here, tmp.as_os_str(), here, name.as_os_str())
                    .map_err(|e| failed("cannot rename over", &name, e))
            });
            if let Err(e) = r {
                wrote = Err(e);
                break;
            }
        }
        done.store(true, Ordering::Release);
        let (m, e, r) = reader
            .join()
            .unwrap_or((0, vec!["the reader panicked".into()], 0));
        (m, e, r, wrote)
    });
    wrote?;
    let through = if ctx.peer.is_some() {
        " through the peer"
    } else {
        ""
    };
    if missing == 0 && errors.is_empty() {
        return Ok(Outcome::Holds(format!(
            "{reads} fresh reads{through} during {RENAMES} renames over a file: never missing"
        )));
    }
    let mut what = Vec::new();
    if missing > 0 {
        what.push(format!("missing in {missing}"));
    }
    if let Some(e) = errors.first() {
        what.push(format!("failed in {} ({e})", errors.len()));
    }
    Ok(Outcome::Breaks(format!(
        "{} of {reads} fresh reads{through} during {RENAMES} renames over a file",
        what.join(", ")
    )))
}

/// A directory renamed onto a directory that is not empty is refused, both kept as they were:
/// how mkdir publishes its lock where there is neither `RENAME_NOREPLACE` nor `symlink(2)`
/// (SMB through smbnetfs; mkdir.rs, `create_published`).
fn rename_onto_full_dir(ctx: &Ctx) -> Probed {
    let here = ctx.lock();
    let (full, entry, new) = (ctx.name("full"), ctx.name("full/f"), ctx.name("full.new"));
    let mode = FileMode::from_bits_truncate(0o700);
    mkdirat(here, full.as_os_str(), mode).map_err(|e| failed("cannot make", &full, e))?;
    create(here, &entry, "verify-full")?;
    mkdirat(here, new.as_os_str(), mode).map_err(|e| failed("cannot make", &new, e))?;
    // SMB: EBUSY or EACCES while the file just closed is still open on the server (a moment).
    let renamed = super::soon(|| renameat(here, new.as_os_str(), here, full.as_os_str()));
    let there = |n: &OsString| fstatat(here, n.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
    match renamed {
        Ok(()) => Ok(Outcome::Breaks(
            "a directory renamed onto one that is not empty replaced it".into(),
        )),
        Err(e @ (Errno::ENOTEMPTY | Errno::EEXIST)) if there(&entry) && there(&new) => {
            Ok(Outcome::Holds(format!(
                "a directory renamed onto one that is not empty was refused ({e}); both kept"
            )))
        }
        Err(e @ (Errno::ENOTEMPTY | Errno::EEXIST)) => Ok(Outcome::Breaks(format!(
            "a directory renamed onto one that is not empty was refused ({e}), but one of the two changed"
        ))),
        Err(e) => Err(failed("cannot rename a directory onto", &full, e)),
    }
}

/// A hard link to a symlink (a pin) is a symlink with the same target.
fn pin_symlink(ctx: &Ctx) -> Probed {
    let (name, pin_name) = (ctx.name("pin"), ctx.name("pin.p"));
    let here = ctx.lock();
    symlinkat("verify-pin", here, name.as_os_str()).map_err(|e| failed("cannot make", &name, e))?;
    match pinned(ctx, here, &name, &pin_name) {
        Ok(Some(t)) if t == "verify-pin" => Ok(Outcome::Holds(
            "a hard link to a symlink reads its target".into(),
        )),
        Ok(t) => Ok(Outcome::Breaks(format!(
            "a hard link to a symlink reads {t:?}, not \"verify-pin\""
        ))),
        Err(e) => Ok(Outcome::Breaks(e)),
    }
}

/// The link count of a file linked twice, through this mount (and the peer).
fn link_count(ctx: &Ctx) -> Probed {
    let (a, b) = (ctx.name("nlink.a"), ctx.name("nlink.b"));
    let here = ctx.lock();
    create(here, &a, "verify")?;
    linkat(here, a.as_os_str(), here, b.as_os_str(), AtFlags::empty())
        .map_err(|e| failed("cannot link", &b, e))?;
    let mut seen = Vec::new();
    for (dir, which) in [
        (Some(here), "here"),
        (ctx.peer.as_deref().map(AsFd::as_fd), "through the peer"),
    ] {
        let Some(dir) = dir else { continue };
        let st = fstatat(dir, b.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| failed("cannot stat", &b, e))?;
        seen.push((st.st_nlink, which));
    }
    let text = seen
        .iter()
        .map(|(n, w)| format!("{n} {w}"))
        .collect::<Vec<_>>()
        .join(", ");
    if seen.iter().all(|(n, _)| *n == 2) {
        Ok(Outcome::Holds(format!(
            "a file linked twice counts 2 ({text})"
        )))
    } else {
        Ok(Outcome::Breaks(format!(
            "a file linked twice counts {text}"
        )))
    }
}

/// A symlink's own times can be set (`utimensat(AT_SYMLINK_NOFOLLOW)`) and read back.
fn symlink_times(ctx: &Ctx) -> Probed {
    let name = ctx.name("times");
    let here = ctx.lock();
    // A target that does not exist: a server that follows the link fails (sshfs).
    symlinkat("verify-missing-target", here, name.as_os_str())
        .map_err(|e| failed("cannot make", &name, e))?;
    let t = TimeSpec::new(1_000_000_000, 0);
    if let Err(e) = utimensat(
        here,
        name.as_os_str(),
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    ) {
        return Ok(Outcome::Breaks(format!(
            "cannot set a symlink's own times: {e}"
        )));
    }
    let st = fstatat(here, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| failed("cannot stat", &name, e))?;
    if st.st_mtime != 1_000_000_000 {
        return Ok(Outcome::Breaks(format!(
            "a symlink's times were set, but read back as {} (not 1000000000)",
            st.st_mtime
        )));
    }
    Ok(Outcome::Holds("set and read back".into()))
}

/// A heartbeat record rewritten in place by the backends' own [`write_beat`], read back
/// fresh by [`read_record`].
fn record_rewrite(ctx: &Ctx) -> Probed {
    let name = ctx.name("beat");
    let here = ctx.lock();
    let rec = Record::ours(&ctx.profile);
    create(here, &name, &rec.render_beat(0))?;
    match write_beat(here, &name, &ctx.shown(&name), &rec, 1, ctx.remote) {
        Ok(true) => {}
        Ok(false) => {
            return Ok(Outcome::Breaks(
                "the record written was not read back as ours".into(),
            ));
        }
        Err(e) => return Ok(Outcome::Breaks(e.message().to_string())),
    }
    match content(ctx, here, &name)? {
        Some(c) if c == rec.render_beat(1).as_bytes() => Ok(Outcome::Holds(
            "rewritten in place, synced, read back fresh".into(),
        )),
        c => Ok(Outcome::Breaks(format!(
            "read back as {:?} after the rewrite",
            c.map(|c| String::from_utf8_lossy(&c).into_owned())
        ))),
    }
}

/// Opens (creating) the probe file `name` in `dir` for flock(2).
fn open_probe(dir: BorrowedFd<'_>, name: &OsString) -> std::result::Result<File, String> {
    openat(
        dir,
        name.as_os_str(),
        OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_CLOEXEC,
        FileMode::from_bits_truncate(0o600),
    )
    .map(File::from)
    .map_err(|e| failed("cannot open", name, e))
}

/// flock(2) on two descriptors of one file through this mount: the second must be refused.
fn flock_here(ctx: &Ctx) -> Probed {
    let name = ctx.name("flock");
    let open = |dir: BorrowedFd<'_>| open_probe(dir, &name);
    let (a, b) = (open(ctx.lock())?, open(ctx.lock())?);
    a.try_lock().map_err(|e| failed("cannot flock", &name, e))?;
    match b.try_lock() {
        Ok(()) => Ok(Outcome::Breaks(
            "two descriptors of one file both got LOCK_EX".into(),
        )),
        Err(std::fs::TryLockError::WouldBlock) => {
            Ok(Outcome::Holds("a second descriptor is refused".into()))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(failed("cannot flock", &name, e)),
    }
}

/// flock(2) through this mount, then through the peer: the peer must be refused while it is
/// held, and get it once it is released.
fn flock_across(ctx: &Ctx, peer: &OwnedFd) -> Probed {
    let name = ctx.name("flock.peer");
    let open = |dir: BorrowedFd<'_>| open_probe(dir, &name);
    let a = open(ctx.lock())?;
    a.try_lock().map_err(|e| failed("cannot flock", &name, e))?;
    let b = open(peer.as_fd())?;
    match b.try_lock() {
        Ok(()) => Ok(Outcome::Breaks(
            "a lock held here is not seen through the peer (flock(2) is node-local here): both got LOCK_EX".into(),
        )),
        Err(std::fs::TryLockError::WouldBlock) => {
            drop(a);
            let after = match b.try_lock() {
                Ok(()) => "; it gets it once released here",
                Err(_) => "; (not granted at once after the release here)",
            };
            Ok(Outcome::Holds(format!("the peer is refused while it is held here{after}")))
        }
        Err(std::fs::TryLockError::Error(e)) => Err(failed("cannot flock", &name, e)),
    }
}

/// The changes whose delay through the peer is measured.
#[derive(Clone, Copy)]
enum Change {
    /// A new name: looked up through the peer (missing), created here.
    NameCreated,
    /// A name seen through the peer, removed here.
    NameRemoved,
    /// A record seen through the peer, rewritten in place here ([`write_beat`]); read fresh.
    Rewrite,
    /// A record seen through the peer, replaced here by a rename; read fresh.
    Rename,
    /// A symlink seen through the peer, replaced here by a rename while a second name holds
    /// the old one; read through a pin.
    Pinned,
    /// The same, read with `readlink(2)`.
    Readlink,
}

/// How late `change` made here shows through the peer: the longest of [`SAMPLES`] for the
/// records locksmith reads fresh (one sample may catch a cache part-way through its time),
/// one for the rest (sshfs's 20 s name cache would double the run).
fn delay(ctx: &Ctx, peer: &OwnedFd, change: Change) -> Probed {
    let n = match change {
        Change::Rewrite | Change::Rename | Change::Pinned => SAMPLES,
        _ => 1,
    };
    let mut longest = Duration::ZERO;
    for i in 0..n {
        match delay_once(ctx, peer, change, i)? {
            Outcome::Delay(Some(d)) => longest = longest.max(d),
            other => return Ok(other),
        }
    }
    Ok(Outcome::Delay(Some(longest)))
}

/// One measurement of [`delay`] (`i`: its number, for unique names).
fn delay_once(ctx: &Ctx, peer: &OwnedFd, change: Change, i: usize) -> Probed {
    let tag = match change {
        Change::NameCreated => "d.create",
        Change::NameRemoved => "d.remove",
        Change::Rewrite => "d.rewrite",
        Change::Rename => "d.rename",
        Change::Pinned => "d.pin",
        Change::Readlink => "d.readlink",
    };
    let (name, tmp, pin_name) = (
        ctx.name(&format!("{tag}.{i}")),
        ctx.name(&format!("{tag}.{i}.t")),
        ctx.name(&format!("{tag}.{i}.p")),
    );
    let (here, there, bound) = (ctx.lock(), peer.as_fd(), ctx.bound);
    let exists =
        |dir: BorrowedFd<'_>| match fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(failed("cannot stat", &name, e)),
        };
    let reads = |text: &str| -> std::result::Result<bool, String> {
        Ok(match change {
            Change::Pinned => {
                pinned(ctx, there, &name, &pin_name)?.as_deref() == Some(OsStr::new(text))
            }
            Change::Readlink => {
                readlinkat(there, name.as_os_str()).ok().as_deref() == Some(OsStr::new(text))
            }
            _ => content(ctx, there, &name)?.as_deref() == Some(text.as_bytes()),
        })
    };
    // The old answer, seen through the peer first (so that its cache holds it).
    let rec = Record::ours(&ctx.profile);
    let (old, new) = match change {
        Change::Rewrite => (rec.render_beat(0), rec.render_beat(1)),
        _ => ("verify-old".to_string(), "verify-new".to_string()),
    };
    let primed = match change {
        Change::NameCreated => exists(there)?.then_some(Duration::ZERO),
        Change::NameRemoved => {
            create(here, &name, &old)?;
            until(Instant::now(), bound, || exists(there))?
        }
        Change::Rewrite | Change::Rename => {
            create(here, &name, &old)?;
            until(Instant::now(), bound, || reads(&old))?
        }
        Change::Pinned | Change::Readlink => {
            symlinkat(old.as_str(), here, name.as_os_str())
                .map_err(|e| failed("cannot make", &name, e))?;
            until(Instant::now(), bound, || reads(&old))?
        }
    };
    match (change, primed) {
        (Change::NameCreated, Some(_)) => {
            return Err("the new name already showed through the peer".into());
        }
        (Change::NameCreated, None) => {}
        (_, None) => {
            return Err(format!(
                "the first version did not show through the peer within {}",
                fmt_duration(bound)
            ));
        }
        _ => {}
    }
    // The change, then the wait for it.
    let r = match change {
        Change::NameCreated => create(here, &name, &new),
        Change::NameRemoved => unlinkat(here, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
            .map_err(|e| failed("cannot remove", &name, e)),
        Change::Rewrite => match write_beat(here, &name, &ctx.shown(&name), &rec, 1, ctx.remote) {
            Ok(true) => Ok(()),
            Ok(false) => Err("the record was not ours to rewrite".into()),
            Err(e) => Err(e.message().to_string()),
        },
        Change::Rename => create(here, &tmp, &new).and_then(|()| {
            renameat(here, tmp.as_os_str(), here, name.as_os_str())
                .map_err(|e| failed("cannot rename over", &name, e))
        }),
        Change::Pinned | Change::Readlink => {
            if let Change::Pinned = change {
                // The old record keeps a second name through the change, as link's lock name
                // and a contender's pin do: GlusterFS's caches resolved the name to that inode
                // for as long (fs2_smoke::gluster_pins_read_fresh_only_with_the_settings_locksmith_requires).
                let keep = ctx.name(&format!("{tag}.{i}.k"));
                linkat(
                    here,
                    name.as_os_str(),
                    here,
                    keep.as_os_str(),
                    AtFlags::empty(),
                )
                .map_err(|e| failed("cannot link", &name, e))?;
            }
            symlinkat(new.as_str(), here, tmp.as_os_str())
                .and_then(|()| renameat(here, tmp.as_os_str(), here, name.as_os_str()))
                .map_err(|e| failed("cannot rename over", &name, e))
        }
    };
    r?;
    let t0 = Instant::now();
    let d = match change {
        Change::NameCreated => until(t0, bound, || exists(there))?,
        Change::NameRemoved => until(t0, bound, || exists(there).map(|e| !e))?,
        _ => until(t0, bound, || reads(&new))?,
    };
    Ok(Outcome::Delay(d))
}

/// A property of the lock's directory, probed by `f` on the probes' context and judged as
/// [`Dir::found`] says.
fn probed(
    name: &'static str,
    relied: bool,
    why: &'static str,
    f: impl FnOnce(&Ctx) -> Probed + Send + 'static,
) -> Property<Dir> {
    Property::new(name, relied, why, move |d: &mut Dir| {
        let probed = f(&d.ctx);
        Ok(d.found(relied, probed))
    })
}

/// The properties `scheme` relies on here (`remote`: a network filesystem; `local`: the
/// profile's `local = true`), and the ones measured for information (see each backend's
/// module docs); with `peer`, the delays through it. `unmeasured`: why nothing is measured
/// across mounts.
fn probes(
    scheme: Scheme,
    remote: bool,
    local: bool,
    symlinks: bool,
    peer: Option<Arc<OwnedFd>>,
    unmeasured: &str,
) -> Vec<Property<Dir>> {
    let beats = scheme.heartbeats() && !local;
    let mut v = vec![match scheme {
        Scheme::Flock => probed("flock on this mount", true, "", flock_here),
        Scheme::Mkdir => probed("mkdir exclusive", true, "", |c| exclusive(c, Create::Mkdir)),
        Scheme::Link => probed("link exclusive", true, "", |c| exclusive(c, Create::Link)),
        Scheme::Symlink => probed("symlink exclusive", true, "", |c| {
            exclusive(c, Create::Symlink)
        }),
    }];
    // mkdir where there are no symbolic links (SMB): records are files renamed onto free
    // names, the state entry a directory; nothing is renamed over a name or read through a pin.
    let plain = scheme == Scheme::Mkdir && !symlinks;
    v.push(probed(
        "rename over a name",
        !plain,
        "without symbolic links mkdir renames only onto free names (its records are files, its state entry a directory)",
        rename_over,
    ));
    if scheme == Scheme::Mkdir {
        v.push(probed(
            "rename onto a full dir",
            plain,
            "mkdir publishes its lock by rename(2) only without RENAME_NOREPLACE and symlink(2), as on SMB",
            rename_onto_full_dir,
        ));
    }
    v.push(probed("token state moves", true, "", state_moves));
    v.push(probed(
        "rename atomicity",
        false,
        "a record is renamed over by its holder only, and a reader that finds it missing in that instant sees a change, which never counts toward a break",
        rename_gaps,
    ));
    if scheme != Scheme::Flock {
        v.push(probed(
            "pin (link a symlink)",
            remote && !plain,
            if plain {
                "without symbolic links mkdir reads its records with a fresh open, never through a pin"
            } else {
                "records are read directly on a local filesystem"
            },
            pin_symlink,
        ));
    }
    if scheme == Scheme::Link {
        v.push(probed(
            "link count",
            false,
            "link judges by the content the lock name holds",
            link_count,
        ));
    }
    let no_beat = "local = true: no heartbeat";
    if matches!(scheme, Scheme::Mkdir | Scheme::Symlink) {
        v.push(probed(
            "symlink times",
            beats && !remote,
            if local {
                no_beat
            } else {
                "on a network filesystem the heartbeat is a record file"
            },
            symlink_times,
        ));
    }
    if scheme.heartbeats() {
        v.push(probed(
            "record rewrite",
            beats && (remote || scheme != Scheme::Symlink),
            if local {
                no_beat
            } else {
                "this backend's heartbeat here is a symlink's times"
            },
            record_rewrite,
        ));
    }
    if scheme == Scheme::Flock {
        v.push(match peer.clone() {
            Some(p) => probed("flock across mounts", true, "", move |c| {
                flock_across(c, &p)
            }),
            None => Property::known(
                "flock across mounts",
                Reliance::Relied,
                Found::Unmeasured(unmeasured.to_string()),
            ),
        });
    }
    if let Some(p) = peer {
        for (property, change, relied, why) in delays(reads_fresh(scheme, remote, local)) {
            // mkdir without symlinks renames its heartbeat record only onto a free name in the
            // directory it just made: never over a record a reader may hold.
            let relied = relied && !(plain && matches!(change, Change::Pinned | Change::Rename));
            let p = p.clone();
            v.push(probed(property, relied, why, move |c| delay(c, &p, change)));
        }
    }
    v
}

/// Whether `scheme` reads records fresh across hosts (so their delays through a peer count):
/// the heartbeat backends on a network filesystem, unless `local = true`.
fn reads_fresh(scheme: Scheme, remote: bool, local: bool) -> bool {
    scheme.heartbeats() && !local && remote
}

/// The delays measured through a peer: property, change, relied on (given `fresh`: records
/// are read fresh across hosts), and why not.
fn delays(fresh: bool) -> [(&'static str, Change, bool, &'static str); 6] {
    let no_record = "no heartbeat record is read across hosts here";
    [
        (
            "name delay (create)",
            Change::NameCreated,
            false,
            "a new lock name is decided by the server, not a cache",
        ),
        (
            "name delay (remove)",
            Change::NameRemoved,
            false,
            "a freed lock may look held this long through the peer: slower handoff, not unsafe",
        ),
        ("content delay (rewrite)", Change::Rewrite, fresh, no_record),
        ("content delay (rename)", Change::Rename, fresh, no_record),
        (
            "pinned read delay",
            Change::Pinned,
            fresh,
            "no record is read through a pin here",
        ),
        (
            "readlink delay",
            Change::Readlink,
            false,
            "records are read through pins, not readlink, on a network filesystem",
        ),
    ]
}

/// The lock's directory, opened as the backends open it.
fn open_dir(path: &Path, what: &str) -> Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        FileMode::empty(),
    )
    .map_err(|e| Error::path(what, path, e.into()))
}

/// Probes the directory of the file lock `cfg` (backend `scheme`, profile `p`) and, with
/// `peer` (the same server directory through another mount), how it looks from there.
/// `Err` only where nothing could be probed (the directory cannot be opened or written, the
/// peer does not show it); an unsafe backend is a [`Report`] with problems.
///
/// All of it runs on a thread of its own, waited for at most a bound worked out from the
/// profile (three times the longest a change may take to show, plus half a minute): even an
/// `open` of the directory on a mount whose server is gone makes this an I/O error (74), not
/// a hang. Each probe has its own, shorter bound (a `FAIL` line).
pub fn verify(p: &Named, scheme: Scheme, cfg: &FsConfig, peer: Option<&Path>) -> Result<Report> {
    let longest = UNKNOWN_CACHE
        .max(cfg.cache_time.unwrap_or_default())
        .max(p.common.stale_after)
        + Duration::from_secs(5);
    let overall = longest * 3 + Duration::from_secs(30);
    let (tx, rx) = mpsc::channel();
    let (p2, cfg2, peer2) = (p.clone(), cfg.clone(), peer.map(Path::to_path_buf));
    std::thread::spawn(move || {
        let _ = tx.send(Dir::open(&p2, scheme, &cfg2, peer2.as_deref()).and_then(verify::run));
    });
    rx.recv_timeout(overall).unwrap_or_else(|_| {
        Err(err!(
            Io,
            "the filesystem of lock {} did not answer within {}: verify gave up",
            cfg.path.display(),
            fmt_duration(overall)
        ))
    })
}

/// The file lock and what its verdict counts with, the same for every probe's copy of
/// [`Dir`].
struct Site {
    profile: String,
    scheme: Scheme,
    cfg: FsConfig,
    fs: Fs,
    /// The lock's directory.
    parent: PathBuf,
    stale_after: Duration,
    mode: Mode,
    /// The cache time locksmith's rule counts with here, and on whose word.
    limit: Duration,
    limit_how: String,
    /// Why nothing is measured across mounts (no usable peer).
    unmeasured_why: String,
    /// What opening the directory found (the filesystem, its client caches, the directory's
    /// mode, the peer): each line's name, reliance, answer and problem.
    opened: Vec<(&'static str, Reliance, Found, Problem)>,
    /// Whether the filesystem keeps symbolic links ([`has_symlinks`]).
    symlinks: bool,
}

/// `verify`'s probing session on a file lock's directory: the probes' context and the site.
#[derive(Clone)]
struct Dir {
    ctx: Ctx,
    site: Arc<Site>,
}

impl Dir {
    /// Opens the lock's directory (and the peer's) as the probes need it, and says what it
    /// found; `Err` where nothing can be probed.
    fn open(p: &Named, scheme: Scheme, cfg: &FsConfig, peer: Option<&Path>) -> Result<Dir> {
        let parent = cfg
            .path
            .parent()
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        let lock_name = cfg.path.file_name().map(OsString::from).unwrap_or_default();
        let dir = open_dir(&parent, "cannot open the directory of lock")?;
        let dir_st = fstat(&dir).map_err(|e| Error::path("cannot stat", &parent, e.into()))?;
        let fs = detect(dir.as_fd());
        let stale_after = p.common.stale_after;
        let mut opened = found_at(&fs, cfg, dir_st.st_mode, &parent);

        let prefix = format!(
            ".{}.verify.{}.",
            lock_name.to_string_lossy(),
            crate::host::nonce()
        );
        writable(dir.as_fd(), &prefix, cfg)?;
        let symlinks = has_symlinks(dir.as_fd(), &prefix);

        let (limit, limit_how) = cache_time(&fs, cfg);
        let bound = limit.max(UNKNOWN_CACHE).max(stale_after) + Duration::from_secs(5);
        let mut ctx = Ctx {
            lock: Arc::new(dir),
            peer: None,
            shown: parent.clone(),
            prefix,
            made: Arc::new(Mutex::new(Vec::new())),
            bound,
            remote: fs.remote,
            profile: p.name.to_string(),
        };
        let (peer_line, unmeasured_why) = match peer {
            None => (
                Found::Unmeasured("none given (--peer DIR): nothing measured across mounts".into()),
                "no --peer given".to_string(),
            ),
            Some(peer_path) => attach_peer(&mut ctx, peer_path, &dir_st, &fs)?,
        };
        opened.push(("peer", Reliance::Relied, peer_line, Problem::Named));
        Ok(Dir {
            ctx,
            site: Arc::new(Site {
                profile: p.name.to_string(),
                scheme,
                cfg: cfg.clone(),
                fs,
                parent,
                stale_after,
                mode: if p.common.shared {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                },
                limit,
                limit_how,
                unmeasured_why,
                opened,
                symlinks,
            }),
        })
    }

    /// What a probe of a property (`relied` on or not) found: a delay judged against the
    /// cache time the rule counts with; an error, `could not probe`.
    fn found(&self, relied: bool, probed: Probed) -> Found {
        let (limit, how, bound) = (self.site.limit, &self.site.limit_how, self.ctx.bound);
        match probed {
            Err(e) => Found::Breaks(format!("could not probe: {e}")),
            Ok(Outcome::Holds(s)) => Found::Holds(s),
            Ok(Outcome::Breaks(s)) => Found::Breaks(s),
            Ok(Outcome::Delay(None)) => Found::Timed(
                bound,
                Box::new(Found::Breaks(format!(
                    "not shown within {}",
                    fmt_duration(bound)
                ))),
            ),
            Ok(Outcome::Delay(Some(d))) => {
                // With room to spare: one run may not catch the cache at its longest.
                let needs = suggest_cache_time(d);
                let judged = if relied && needs > limit {
                    Found::Breaks(format!(
                        "{} (longest of {SAMPLES}): with room to spare that needs a cache time of {}, more than {} ({how})",
                        figure(d),
                        fmt_duration(needs),
                        fmt_duration(limit)
                    ))
                } else if relied {
                    Found::Holds(format!(
                        "{} (longest of {SAMPLES}; with room to spare within the cache time {}, {how})",
                        figure(d),
                        fmt_duration(limit)
                    ))
                } else {
                    Found::Holds(figure(d))
                };
                Found::Timed(d, Box::new(judged))
            }
        }
    }

    /// locksmith's own rule for this profile here (the one place: `lockdir::check`).
    fn rule(&self) -> Result<()> {
        let s = &*self.site;
        let heartbeats = s.scheme.heartbeats();
        check(
            &s.fs,
            if heartbeats { &s.parent } else { &s.cfg.path },
            &s.cfg,
            if heartbeats {
                s.stale_after
            } else {
                Duration::ZERO
            },
            heartbeats,
        )
        .and_then(|()| match s.scheme {
            Scheme::Symlink => super::check_shared(
                &s.cfg.path,
                s.fs.remote,
                || s.fs.name.as_str(),
                s.mode,
                s.cfg.local,
            ),
            _ => Ok(()),
        })
    }

    /// The `profile` line: the rule's verdict, or why it holds here.
    fn profile_line(&self) -> Found {
        let s = &*self.site;
        match (self.rule(), s.scheme, s.fs.remote, s.cfg.local) {
            (Err(e), ..) => Found::Breaks(e.message().to_string()),
            (Ok(()), _, true, true) => {
                Found::Holds("local = true: every contender runs on this host".into())
            }
            (Ok(()), Scheme::Flock, ..) => {
                Found::Holds("a local filesystem: the kernel's flock(2) decides".into())
            }
            (Ok(()), _, false, _) => Found::Holds(format!(
                "stale_after {}: a local filesystem, no cache to outwait",
                fmt_duration(s.stale_after)
            )),
            (Ok(()), _, true, false) => Found::Holds(format!(
                "stale_after {} > the cache time {} ({})",
                fmt_duration(s.stale_after),
                fmt_duration(s.limit),
                s.limit_how
            )),
        }
    }

    /// Whether the rule counts with a cache time here.
    fn counts_cache(&self) -> bool {
        let s = &*self.site;
        s.scheme.heartbeats() && s.fs.remote && !s.cfg.local
    }

    /// What to set, where a measured delay (`worst`) outgrew the cache time counted with.
    fn what_to_set(&self, worst: Option<Duration>) -> Option<String> {
        let s = &*self.site;
        let w = worst.filter(|_| self.counts_cache())?;
        let c = suggest_cache_time(w);
        if c > s.limit {
            Some(format!(
                "set cache_time = \"{}\" (the measured {} with room to spare) and stale_after above it",
                fmt_duration(c),
                figure(w)
            ))
        } else if s.cfg.cache_time.is_none() && self.rule().is_err() {
            Some(format!(
                "measured: records showed through the peer within {}, so cache_time = \"{}\" with stale_after above it would do",
                figure(w),
                fmt_duration(c)
            ))
        } else {
            None
        }
    }
}

/// What opening the directory found: its filesystem, the client's caches (where locksmith
/// checks them), the directory's mode.
fn found_at(
    fs: &Fs,
    cfg: &FsConfig,
    mode: u32,
    parent: &Path,
) -> Vec<(&'static str, Reliance, Found, Problem)> {
    let mut v = vec![(
        "filesystem",
        Reliance::Stated,
        Found::Holds(format!(
            "{}: {}",
            fs.name,
            if fs.remote {
                "network or FUSE (another host may see it differently)"
            } else {
                "local"
            }
        )),
        Problem::Named,
    )];
    // Where locksmith checks the client's caches (GlusterFS): the rule says the same (the
    // profile line), so a failure here is not a problem of its own.
    let caches = match &fs.client {
        Some(Ok(seen)) => Some((Reliance::Relied, Found::Holds(seen.clone()))),
        Some(Err(why)) if !cfg.local => Some((Reliance::Relied, Found::Breaks(why.clone()))),
        Some(Err(why)) => Some((
            Reliance::Stated,
            Found::Holds(format!("local = true: {why}")),
        )),
        None => None,
    };
    if let Some((reliance, found)) = caches {
        v.push(("client caches", reliance, found, Problem::Elsewhere));
    }
    let directory = match check_dir_mode(mode, parent) {
        Ok(()) => Found::Holds(format!("{} (mode {:04o})", parent.display(), mode & 0o7777)),
        Err(e) => Found::Breaks(e.message().to_string()),
    };
    v.push(("directory", Reliance::Relied, directory, Problem::Bare));
    v
}

/// Whether probe files can be made beside the lock at all (denied, read-only: the SPEC's
/// codes, as for a lock).
fn writable(dir: BorrowedFd<'_>, prefix: &str, cfg: &FsConfig) -> Result<()> {
    let probe_name = OsString::from(format!("{prefix}w"));
    openat(
        dir,
        probe_name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC,
        FileMode::from_bits_truncate(0o600),
    )
    .map_err(|e| Error::path("cannot create probe files beside lock", &cfg.path, e.into()))?;
    unlink_soon(dir, &probe_name);
    Ok(())
}

/// Unlinks the file `name` in `dir` we just closed, per [`super::record::soon`] (issue 28:
/// `.NAME.verify.<nonce>.w` was left on an SMB server).
fn unlink_soon(dir: BorrowedFd<'_>, name: &OsStr) {
    let _ = super::record::soon(|| unlinkat(dir, name, UnlinkatFlags::NoRemoveDir));
}

/// Whether the filesystem keeps symbolic links (SMB through smbnetfs: ENOSYS): where it does
/// not, `mkdir` keeps its records as files and its state entry as a directory
/// (`lockdir::make_entry`), and relies on no symlink renamed over a name nor read through a pin.
fn has_symlinks(dir: BorrowedFd<'_>, prefix: &str) -> bool {
    let name = OsString::from(format!("{prefix}s"));
    match symlinkat("verify-symlinks", dir, name.as_os_str()) {
        Ok(()) => {
            unlink_soon(dir, &name);
            true
        }
        Err(e) => !super::record::call_missing(e),
    }
}

/// The peer: another mount of the lock's directory, which must show a file made here. Its
/// line, and why nothing is measured across mounts if it cannot stand in for another host
/// (else `ctx.peer` is set).
fn attach_peer(
    ctx: &mut Ctx,
    peer_path: &Path,
    dir_st: &nix::sys::stat::FileStat,
    fs: &Fs,
) -> Result<(Found, String)> {
    let parent = ctx.shown.clone();
    let pfd = open_dir(peer_path, "--peer: cannot open directory")
        .map_err(|e| err!(Usage, "{}", e.message()))?;
    let pst = fstat(&pfd).map_err(|e| Error::path("cannot stat", peer_path, e.into()))?;
    if pst.st_dev == dir_st.st_dev && pst.st_ino != dir_st.st_ino {
        return Err(err!(
            Usage,
            "--peer {} is another directory on the lock's filesystem, not the lock's directory {} through another mount",
            peer_path.display(),
            parent.display()
        ));
    }
    // Without a cache on either side, a file shows at once or never.
    let pfs = detect(pfd.as_fd());
    let wait = if fs.remote || pfs.remote {
        ctx.bound
    } else {
        Duration::from_secs(1)
    };
    let name = ctx.name("peer");
    let r = (|| -> std::result::Result<Option<Duration>, String> {
        create(ctx.lock(), &name, &name.to_string_lossy())?;
        let t0 = Instant::now();
        until(t0, wait, || {
            Ok(content(ctx, pfd.as_fd(), &name)?.as_deref() == Some(name.as_encoded_bytes()))
        })
    })();
    let seen = match r {
        Ok(Some(d)) => d,
        Ok(None) | Err(_) => {
            ctx.sweep();
            return Err(err!(
                Usage,
                "--peer {} does not show the lock's directory {}: a file made there did not appear through it within {}{}",
                peer_path.display(),
                parent.display(),
                fmt_duration(wait),
                r.err().map(|e| format!(" ({e})")).unwrap_or_default()
            ));
        }
    };
    if pst.st_dev == dir_st.st_dev {
        let why = format!(
            "--peer {} is on the lock's own mount: it shares its caches",
            peer_path.display()
        );
        let line = Found::Unmeasured(format!("{why}, so it cannot stand in for another host"));
        return Ok((line, why));
    }
    let line = Found::Holds(format!(
        "{} shows the lock's directory through another mount ({}; a new file showed after {})",
        peer_path.display(),
        pfs.name,
        figure(seen)
    ));
    ctx.peer = Some(Arc::new(pfd));
    Ok((line, "no --peer given".to_string()))
}

/// The file backends' declaration: what opening found, the probes of `scheme` (all at
/// once), locksmith's own rule for the profile after them.
impl Probing for Dir {
    fn header(&self) -> (String, String) {
        let s = &*self.site;
        (
            format!(
                "locksmith verify {}: backend {}, lock {}",
                s.profile,
                s.scheme.name(),
                s.cfg.path.display()
            ),
            s.cfg.path.display().to_string(),
        )
    }

    fn properties(&self) -> Vec<Property<Dir>> {
        let s = &*self.site;
        let mut v: Vec<Property<Dir>> = s
            .opened
            .iter()
            .map(|(name, reliance, found, problem)| {
                Property::known(name, *reliance, found.clone()).said_as(*problem)
            })
            .collect();
        v.extend(probes(
            s.scheme,
            s.fs.remote,
            s.cfg.local,
            s.symlinks,
            self.ctx.peer.clone(),
            &s.unmeasured_why,
        ));
        if self.ctx.peer.is_none() {
            v.push(Property::known(
                "cross-mount delays",
                Reliance::Relied,
                Found::Unmeasured(self.delays_unmeasured()),
            ));
        }
        v
    }

    fn afterwards(&self) -> Vec<Property<Dir>> {
        vec![
            Property::known("profile", Reliance::Relied, self.profile_line())
                .said_as(Problem::First),
        ]
    }

    fn probe(&mut self, properties: Vec<Property<Dir>>) -> Answers {
        let within = self.ctx.bound * 2 + Duration::from_secs(10);
        verify::at_once(self, properties, within, "the filesystem hangs?")
    }

    fn clean_up(&mut self) -> Vec<String> {
        self.ctx.sweep_bounded()
    }

    fn accepts(&mut self, r: &mut Report) -> String {
        let s = &*self.site;
        let worst = r.measured.iter().copied().max();
        let name = s.scheme.name();
        let counts_cache = self.counts_cache();
        let mut accepts = format!("backend {name} keeps SPEC §6 here");
        if counts_cache && matches!(s.fs.client, Some(Err(_))) {
            accepts = format!(
                "backend {name} cannot keep SPEC §6 here with any stale_after until the mount's client caches change (see profile)"
            );
        } else if counts_cache {
            accepts.push_str(&format!(
                "; it accepts stale_after above {} ({})",
                fmt_duration(s.limit),
                s.limit_how
            ));
            match worst {
                Some(w) => accepts.push_str(&format!(
                    "; records showed through the peer within {}",
                    figure(w)
                )),
                None => accepts.push_str(&format!(
                    "; cross-mount delays unmeasured ({}): that cache time is taken on trust",
                    s.unmeasured_why
                )),
            }
        } else if s.scheme.heartbeats() && !s.cfg.local {
            accepts.push_str(&format!(
                "; any stale_after (now {}): no cache to outwait",
                fmt_duration(s.stale_after)
            ));
        }
        if s.fs.remote && s.cfg.local {
            accepts
                .push_str(" only with every contender on this host and this mount (local = true)");
        }
        r.problems.extend(self.what_to_set(worst));
        accepts
    }
}

impl Dir {
    /// The `cross-mount delays` line without a usable peer: which delays are taken on trust.
    fn delays_unmeasured(&self) -> String {
        let s = &*self.site;
        let why = &s.unmeasured_why;
        let plain = s.scheme == Scheme::Mkdir && !s.symlinks;
        let relied: Vec<&str> = delays(reads_fresh(s.scheme, s.fs.remote, s.cfg.local))
            .iter()
            .filter(|d| d.2 && !(plain && matches!(d.1, Change::Pinned | Change::Rename)))
            .map(|d| d.0)
            .collect();
        if relied.is_empty() {
            format!("{why} (none relied on here)")
        } else {
            format!(
                "{why}: the {} relied on are taken to stay within the cache time {} ({})",
                relied.join(", "),
                fmt_duration(s.limit),
                s.limit_how
            )
        }
    }
}

impl Ctx {
    /// [`sweep`](Self::sweep) on a thread, waited for at most 10 s.
    fn sweep_bounded(&self) -> Vec<String> {
        let (tx, rx) = mpsc::channel();
        let c = self.clone();
        std::thread::spawn(move || {
            let _ = tx.send(c.sweep());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| vec![format!("{}* (no answer within 10s)", self.prefix)])
    }
}
