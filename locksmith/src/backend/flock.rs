//! `backend = "flock"`: flock(2) on a semaphore file, interoperating with flock(1).
//!
//! The kernel holds the lock for the open file description and drops it when the last
//! descriptor closes, so a dead holder never blocks anyone: no heartbeat, no staleness, zero
//! wakeups while holding. The file is **never unlinked** (seed 001: unlinking a flock file
//! lets two processes hold "the" lock on two different inodes).
//!
//! Waiting blocks in the kernel on a helper thread, on a duplicate of the same open file
//! description; the main thread polls the thread's wake-up beside every release cause, so a
//! waiter still stops at once when its parent dies. If the process exits in the instant the
//! kernel granted the lock, closing the descriptors releases it.
//!
//! Writer preference: flock(2) lets a stream of `LOCK_SH` holders starve a `LOCK_EX` waiter,
//! so locksmith users also pass a gate beside the file (`.NAME.gate`, never unlinked either):
//! a waiting writer holds the gate `LOCK_EX` while it waits for the lock; readers take the gate
//! `LOCK_SH` only for the moment of taking their lock, so new readers queue behind a waiting
//! writer while the readers inside drain. flock(1) users on the same file do not pass the gate
//! (they are neither slowed nor preferred); where the gate cannot be created (a directory we
//! may not write), there is no preference.
//!
//! Fencing tokens and `prev=crashed` come from a state record beside the file
//! (`.NAME.state`, see `docs/LAYOUT.md`), written only while holding `LOCK_EX`.
//!
//! # Limits
//! flock(2) over NFS is emulated with byte-range locks on Linux and **may block forever**
//! if the server loses track of a client; owner information comes from `/proc/locks`, so
//! only holders on this host are named.

use std::path::Path;
use std::ffi::OsString;
use std::fs::{self, File, TryLockError};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode as FileMode;

use super::address::Address;
use super::lock::Registered;
use super::lockdir::probe::Scheme;
use super::verify::Report;
use super::lock::{
    Attempt, Backend, Break, BreakOutcome, Grant, Held, Holder, Named, NotReleased, WaitHint,
    refuse_break,
};
use super::wake::Blocking;
use super::lockdir::FsConfig;
use super::lockdir::state::{self, StateAt};
use crate::error::{Error, Kind, Result};
use crate::host;
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::settings::{Common, Fields, KeyDoc};
use crate::watch::Watcher;

/// The keys of `backend = "flock"`: the file backends' keys ([`FsConfig::parse`]).
pub fn config(f: &mut Fields) -> crate::error::Result<FsConfig> {
    FsConfig::parse(f, false)
}

pub struct Flock {
    cfg: FsConfig,
    mode: Mode,
    file: Option<File>,
    /// The opened file's device and inode (`fstat` when opened), for the removal watch.
    file_id: (u64, u64),
    /// The writer-preference gate, once opened.
    gate: Option<File>,
    /// flock(1)'s forms: nothing beside the file (no token state, no gate).
    flock1: bool,
    /// The lock's number of slots (SPEC §3b), recorded with each token.
    slots: u32,
    /// What to ask before issuing over another recorded number of slots.
    agree: Option<super::lock::Agree>,
    /// A thread blocked in flock(2) on a duplicate descriptor: whether it holds the lock.
    waiter: Option<Blocking<bool>>,
    /// The removal watch, once made (not in flock(1)'s forms), or why it could not be: said
    /// only if the lock is taken ([`Flock::acquired`]).
    watch: Option<std::io::Result<Watch>>,
}

/// A flock lock held: the locked descriptor, and the fencing token of an exclusive
/// acquisition, to mark its clean release.
pub struct FlockHeld {
    cfg: FsConfig,
    slots: u32,
    file: File,
    token: Option<u64>,
    grant: Grant,
    /// Watching the held file for a cleaner (not in flock(1)'s forms).
    watch: Option<Watch>,
    /// Declared lost: the state beside the path is no longer ours to mark.
    lost: bool,
}

/// The held file's directory watched (dnotify: `SIGIO` when a name in it is removed or
/// renamed): a cleaner (systemd-tmpfiles on /tmp) that removes a held lock file lets the next
/// locker create a new file at the path and lock it at once (issue 28). The kernel wakes us
/// only when a name in that directory goes, and only once the lock is ours ([`arm`]): no
/// wake-up while nothing happens there, none while waiting.
///
/// Made before a wait ([`Flock::prepare_wait`]), so that what a waiter can do before the lock
/// is its own is not done after (issue 29: between a contended grant and CMD, every
/// microsecond is one the next waiter waits too), else as the lock is taken; the directory's
/// descriptor also reaches the state beside the file, opened once instead of at each use.
///
/// [`arm`]: Watch::arm
struct Watch {
    /// The directory (closing it ends its notifications).
    dir: OwnedFd,
    /// Readable after a `SIGIO`.
    signals: File,
    /// The pipe's writing end, written by the `SIGIO` handler (closed after it is taken away).
    _tx: OwnedFd,
    /// The routing of `SIGIO` to `signals`, taken away with the watch.
    routed: signal_hook::SigId,
    /// The watched file, once armed.
    dev: u64,
    ino: u64,
}

impl Drop for Watch {
    fn drop(&mut self) {
        signal_hook::low_level::unregister(self.routed);
    }
}

impl Watch {
    /// The directory of `path` opened and `SIGIO` routed to a pipe; nothing watched yet.
    /// `Err`: no watch here (the lock works as flock(1)'s does).
    fn prepare(path: &Path) -> std::io::Result<Watch> {
        let dir = path
            .parent()
            .ok_or_else(|| std::io::Error::other("it names no directory"))?;
        let dir = nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            FileMode::empty(),
        )?;
        let (signals, tx) = crate::sys::self_pipe()?;
        let routed = crate::sys::signal_to_pipe(libc::SIGIO, std::os::fd::AsRawFd::as_raw_fd(&tx))?;
        Ok(Watch {
            dir,
            signals,
            _tx: tx,
            routed,
            dev: 0,
            ino: 0,
        })
    }

    /// Watches the file `(dev, ino)` (its `fstat` when opened), locked at `path`: `Ok(true)`
    /// watched, `Ok(false)` the path no longer names it (removed between our open and our
    /// lock: the path is someone else's now), `Err`: cannot watch here.
    fn arm(&mut self, path: &Path, (dev, ino): (u64, u64)) -> std::io::Result<bool> {
        crate::sys::dir_notify(self.dir.as_fd())?;
        (self.dev, self.ino) = (dev, ino);
        Ok(!self.gone(path))
    }

    /// Whether `path` no longer names the watched file (signals read and dropped first).
    /// A path that cannot be looked at now (no descriptor left) still counts as ours.
    fn gone(&self, path: &Path) -> bool {
        let mut buf = [0u8; 64];
        while (&self.signals).read(&mut buf).is_ok_and(|n| n > 0) {}
        match fs::symlink_metadata(path) {
            Ok(md) => md.dev() != self.dev || md.ino() != self.ino,
            Err(e) => e.kind() == std::io::ErrorKind::NotFound,
        }
    }
}

/// Said once where a held file cannot be watched for removal.
fn not_watching(path: &Path, e: &dyn std::fmt::Display) {
    info!(
        "not watching {} for removal by a cleaner ({e}): a removed lock file would go unnoticed, as with flock(1)",
        path.display()
    );
}

impl Flock {
    pub fn new(cfg: FsConfig, common: &Common) -> Flock {
        Flock {
            cfg,
            mode: common.mode(),
            file: None,
            file_id: (0, 0),
            gate: None,
            waiter: None,
            flock1: common.flock1,
            slots: common.slots,
            agree: None,
            watch: None,
        }
    }

    /// Holding: the fencing token and whether the last exclusive holder released cleanly.
    /// Exclusive holders take the next token (written while holding, so serialised among
    /// locksmith users); shared ones report the current write epoch. Only locksmith keeps
    /// the state: flock(1) users on the same file neither see nor advance it. In a directory
    /// we cannot write, there are no tokens (flock itself does not need the directory); in
    /// flock(1)'s forms, none either: nothing is kept beside the file (issue 25, finding 12).
    fn grant(&self, dir: Option<BorrowedFd<'_>>) -> Result<Grant> {
        if self.flock1 {
            return Ok(Grant::default());
        }
        let shared = self.mode == Mode::Shared;
        let no_token = |why: &dyn std::fmt::Display| {
            info!(
                "lock {}: no fencing token this time ({why}); the OK line carries no token=",
                self.cfg.path.display()
            );
            Ok(Grant::default())
        };
        // The state's names beside the file must fit in a name; flock(2) itself takes any
        // name, as flock(1) does (issue 28).
        let name_len = self.cfg.token_name().len();
        if name_len > super::lockdir::MAX_LOCK_NAME {
            return no_token(&format_args!(
                "its name is {name_len} bytes long: the token state beside it needs names {} bytes longer, and a name is at most {}",
                super::lockdir::BESIDE,
                crate::settings::MAX_NAME
            ));
        }
        let Some(r) = with_state(&self.cfg, dir, self.slots, self.agree.as_ref(), |at| {
            if shared {
                state::read(at).map(|s| Grant {
                    token: s.map(|s| s.token),
                    recorded_slots: Some(s.map_or(1, |s| s.slots())),
                    ..Grant::default()
                })
            } else {
                state::issue(at).map(|i| Grant {
                    token: Some(i.token),
                    prev_crashed: i.prev_crashed,
                    token_from_clock: i.from_clock,
                    ..Grant::default()
                })
            }
        }) else {
            return no_token(&"it names no directory");
        };
        match r {
            // Something planted there: said as the other backends say it, never a token
            // silently dropped (issue 15). Another number of slots held beside us (Config),
            // or the state moved on under us round after round (Lost): the counter that keeps
            // different numbers of slots apart did not record us, so we are not admitted —
            // the lock is let go as `self` drops (issue 26: admitting here was the one
            // suspect of an overlap of an exclusive holder and `--slots 2` holders).
            Err(e) if matches!(e.kind(), Kind::Config | Kind::Lost) => Err(e),
            // Never silently (issue 28): a directory we may not write, descriptor pressure.
            Err(e) => no_token(&e.message()),
            ok => ok,
        }
    }

    /// Holding: the locked descriptor with its grant, or (dropped) the lock let go again if
    /// its state cannot be used. Outside flock(1)'s forms the file is watched for removal; a
    /// file removed before that (a cleaner, between our open and our lock) is let go and the
    /// path tried again: its lock is not the path's lock.
    fn acquired(mut self) -> Result<Attempt> {
        self.prepare_watch();
        let watch = match self.watch.take() {
            Some(Ok(mut w)) => match w.arm(&self.cfg.path, self.file_id) {
                Ok(true) => Some(w),
                Ok(false) => {
                    debug!(
                        "{} was removed as we locked it: trying the new one",
                        self.cfg.path.display()
                    );
                    self.file = None;
                    return Box::new(self).try_acquire();
                }
                Err(e) => {
                    not_watching(&self.cfg.path, &e);
                    None
                }
            },
            Some(Err(e)) => {
                not_watching(&self.cfg.path, &e);
                None
            }
            None => None,
        };
        let grant = self.grant(watch.as_ref().map(|w| w.dir.as_fd()))?;
        let file = self.file.take().expect("locked, so opened");
        Ok(Attempt::Acquired(Box::new(FlockHeld {
            token: (self.mode == Mode::Exclusive).then_some(grant.token).flatten(),
            cfg: self.cfg,
            slots: self.slots,
            file,
            grant,
            watch,
            lost: false,
        })))
    }

    /// The watch made (not armed) where there is none yet: before waiting, so that a waiter
    /// does not make it between its grant and its command; else on taking the lock. Not in
    /// flock(1)'s forms.
    fn prepare_watch(&mut self) {
        if !self.flock1 && self.watch.is_none() {
            self.watch = Some(Watch::prepare(&self.cfg.path));
        }
    }

    /// `open(2)` with `O_CREAT | O_NOFOLLOW`: read-only is enough for flock(2), as for
    /// flock(1), so a shared semaphore file need not be writable by everyone.
    fn file(&mut self) -> Result<&File> {
        if self.file.is_none() {
            let path = &self.cfg.path;
            let dir = path.parent().unwrap_or(std::path::Path::new("/"));
            if let Ok(md) = fs::metadata(dir) {
                super::lockdir::check_dir_mode(md.mode(), dir)?;
            }
            let mode = FileMode::from_bits_truncate(self.cfg.file_mode.unwrap_or(0o666));
            // Non-blocking open, kind checked on the descriptor: a FIFO planted at the path
            // must not hold us in open(2) (issue 15).
            let opened = crate::files::open_regular(
                path,
                "lock file",
                OFlag::O_RDONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW,
                mode,
            );
            let (file, st) = match opened {
                Ok((file, st)) => (file, st),
                // flock(1)'s forms lock a directory as flock(1) does: opened read-only.
                Err(_) if self.flock1 && fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) => {
                    let dir = File::from(
                        nix::fcntl::open(
                            path,
                            OFlag::O_RDONLY
                                | OFlag::O_DIRECTORY
                                | OFlag::O_NOFOLLOW
                                | OFlag::O_CLOEXEC,
                            FileMode::empty(),
                        )
                        .map_err(|e| Error::path("cannot open lock directory", path, e.into()))?,
                    );
                    let st = nix::sys::stat::fstat(&dir)
                        .map_err(|e| Error::path("cannot stat lock directory", path, e.into()))?;
                    (dir, st)
                }
                Err(e) => return Err(e),
            };
            // flock(2) on a network or FUSE filesystem may exclude only this host's processes
            // (the mount table is read only then, to name it).
            if !self.cfg.local && super::lockdir::is_remote(file.as_fd()) {
                let fs = super::lockdir::detect(file.as_fd());
                super::lockdir::check(&fs, path, &self.cfg, Duration::ZERO, false)?;
            }
            self.cfg.fix_owner(&file, &st);
            self.file_id = (st.st_dev, st.st_ino);
            self.file = Some(file);
        }
        Ok(self.file.as_ref().expect("opened above"))
    }

    /// The gate beside the lock file, made only by a writer that waits (`create`): a
    /// reader passes it only where a writer made it, so an uncontended lock leaves nothing
    /// beside its file. `None`: no gate (none yet, it cannot be opened, or flock(1)'s forms).
    /// Something other than a regular file at the gate's name (a planted FIFO, a directory)
    /// is refused as it would be at the lock file's: a config error naming it.
    fn gate(&mut self, create: bool) -> Result<Option<&File>> {
        if self.gate.is_none() && !self.flock1 {
            self.gate = self.open_gate(create)?;
        }
        Ok(self.gate.as_ref())
    }

    fn open_gate(&self, create: bool) -> Result<Option<File>> {
        let Some(path) = (|| {
            let mut name = OsString::from(".");
            name.push(self.cfg.path.file_name()?);
            name.push(".gate");
            Some(self.cfg.path.parent()?.join(name))
        })() else {
            return Ok(None);
        };
        let mode = FileMode::from_bits_truncate(self.cfg.file_mode.unwrap_or(0o666));
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW;
        let what = "writer-preference gate";
        let opened = if create {
            crate::files::open_regular(&path, what, flags | OFlag::O_CREAT, mode).map(Some)
        } else {
            crate::files::open_regular_if_there(&path, what, flags, mode)
        };
        match opened {
            Ok(None) => Ok(None),
            Ok(Some((file, st))) => {
                self.cfg.fix_owner(&file, &st);
                Ok(Some(file))
            }
            Err(e) if e.kind() == Kind::Config => Err(e),
            Err(e) => {
                if create {
                    debug!("no writer preference: {e}");
                }
                Ok(None)
            }
        }
    }

    fn holders(&self) -> Vec<Holder> {
        match fs::symlink_metadata(&self.cfg.path) {
            Ok(md) => proc_locks_holders(md.dev(), md.ino()),
            Err(_) => Vec::new(),
        }
    }
}

impl Backend for Flock {
    fn name(&self) -> &'static str {
        "flock"
    }

    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        if let Some(w) = &self.waiter {
            // The waiter thread decides.
            if !w.returned() {
                return Ok(Attempt::Busy(self, Vec::new()));
            }
            let w = self.waiter.take().expect("checked above");
            if w.join() == Some(true) {
                return self.acquired();
            }
            // It failed: try directly below, which reports the error.
        }
        let shared = self.mode == Mode::Shared;
        let path = self.cfg.path.clone();
        self.file()?;
        // Readers pass the gate (a waiting writer holds it); writers trying go straight in.
        let gate = if shared { self.gate(false)? } else { None };
        if let Some(g) = gate {
            match g.try_lock_shared() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    return Ok(Attempt::Busy(self, Vec::new()));
                }
                Err(TryLockError::Error(e)) => return Err(Error::path("flock", &path, e)),
            }
        }
        let file = self.file.as_ref().expect("opened above");
        let r = if shared {
            file.try_lock_shared()
        } else {
            file.try_lock()
        };
        if let Some(g) = &self.gate {
            let _ = g.unlock();
        }
        match r {
            Ok(()) => self.acquired(),
            // Who holds it is named only if a message shows it (`name_holders`).
            Err(TryLockError::WouldBlock) => Ok(Attempt::Busy(self, Vec::new())),
            Err(TryLockError::Error(e)) => Err(Error::path("flock", &path, e)),
        }
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        if self.waiter.is_some() {
            // Still blocked (its answer is read by the next try).
            return Ok(WaitHint { poll: false, catches_release: true });
        }
        let shared = self.mode == Mode::Shared;
        let path = self.cfg.path.clone();
        let dup = self
            .file()?
            .try_clone()
            .map_err(|e| Error::path("cannot duplicate descriptor of", &path, e))?;
        let gate = self.gate(!shared)?.and_then(|g| g.try_clone().ok());
        let waiter = Blocking::spawn("flock-wait", Some(64 * 1024), move || {
            // Same open file description as the main descriptor: when this returns Ok the
            // main descriptor holds the lock too. A writer holds the gate while it waits (new
            // readers queue behind it); a reader only passes through it.
            let r = (|| {
                if let Some(g) = &gate {
                    if shared { g.lock_shared() } else { g.lock() }?;
                }
                if shared {
                    dup.lock_shared()
                } else {
                    dup.lock()
                }
            })();
            if let Some(g) = &gate {
                let _ = g.unlock();
            }
            r.is_ok()
        })
        .map_err(|e| Error::io("cannot start the flock waiter thread", e))?;
        self.waiter = Some(waiter);
        // While the waiter is queued in the kernel already.
        self.prepare_watch();
        Ok(WaitHint { poll: false, catches_release: true })
    }

    fn agree_on_slots(&mut self, agree: super::lock::Agree) {
        self.agree = Some(agree);
    }

    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        if self.cfg.token_name().len() > super::lockdir::MAX_LOCK_NAME {
            return Ok(None); // no state beside it (see `grant`)
        }
        with_state(&self.cfg, None, self.slots, None, state::read)
            .transpose()
            .map(|s| s.map(|s| s.map_or(1, |s| s.slots())))
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.waiter.iter().map(Blocking::fd).collect()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(self.holders())
    }

    fn name_holders(&mut self) -> Vec<Holder> {
        self.holders()
    }

    /// The kernel's answer, not `/proc/locks`': that file is made a few records per read(2),
    /// each read starting again at a record's index, so a lock held throughout is skipped
    /// when a record before it goes between two reads (a `--slots 2` holder beside a reader,
    /// each finding nobody: issue 26). A lock of our own, not waiting, on a descriptor of our
    /// own: granted, nobody held it then (given back at once, as the descriptor closes);
    /// refused, somebody holds — or another contender's look like this one held it for its
    /// few microseconds, so it is tried again after a short random pause, and only refused
    /// every time is it held (named from `/proc/locks` where it can be). No file is created.
    fn holder(&mut self) -> Result<Option<Holder>> {
        const LOOKS: u32 = 5;
        let path = &self.cfg.path;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW;
        let Some((file, _)) =
            crate::files::open_regular_if_there(path, "lock file", flags, FileMode::empty())?
        else {
            return Ok(None);
        };
        for look in 0..LOOKS {
            if look > 0 {
                std::thread::sleep(Duration::from_micros(fastrand::u64(200..2_000)));
            }
            match file.try_lock() {
                Ok(()) => {
                    let _ = file.unlock();
                    return Ok(None);
                }
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(Error::path("flock", path, e)),
            }
        }
        Ok(Some(self.holders().into_iter().next().unwrap_or(Holder {
            host: Some(host::this().hostname.clone()),
            alive: Some(true),
            ..Holder::default()
        })))
    }

    fn break_lock(&mut self, _: Break, _: &mut Watcher) -> Result<BreakOutcome> {
        Err(refuse_break(
            "flock",
            "the kernel releases a flock lock the moment its holder exits",
        ))
    }
}

impl Held for FlockHeld {
    fn grant(&self) -> &Grant {
        &self.grant
    }

    /// Closes our descriptor. Deliberately no `LOCK_UN`: in run mode the command shares
    /// the open file description, and the lock must live exactly as long as it does.
    fn release(self: Box<Self>) -> std::result::Result<(), NotReleased<Box<dyn Held>>> {
        // Still holding: say this acquisition ended cleanly, then close.
        if let Some(token) = self.token
            && !self.lost
            && let Some(Err(e)) = with_state(
                &self.cfg,
                self.watch.as_ref().map(|w| w.dir.as_fd()),
                self.slots,
                None,
                |at| state::mark_clean(at, token),
            )
        {
            info!("{e}; the next holder will see prev=crashed");
        }
        Ok(())
    }

    fn inherit_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.file.as_fd())
    }

    fn alarm(&self) -> Option<BorrowedFd<'_>> {
        self.watch.as_ref().map(|w| w.signals.as_fd())
    }

    /// The held file still at its path, or LOST: another locker may lock a new file there.
    fn check(&mut self) -> Result<()> {
        let Some(w) = &self.watch else {
            return Ok(());
        };
        if !w.gone(&self.cfg.path) {
            return Ok(());
        }
        self.lost = true;
        Err(crate::error::err!(
            Lost,
            "lock file {} was removed or replaced while held (a cleaner such as systemd-tmpfiles?): another locker can lock a new file at that path",
            self.cfg.path.display()
        ))
    }
}

/// `f` on the state record beside the semaphore file (`.NAME.state`, as for mkdir), in
/// `opened` (the file's directory, opened with it) or else the directory opened now; `None`
/// if the path names no directory.
fn with_state<T>(
    cfg: &FsConfig,
    opened: Option<BorrowedFd<'_>>,
    slots: u32,
    agree: Option<&super::lock::Agree>,
    f: impl FnOnce(&StateAt<'_>) -> Result<T>,
) -> Option<Result<T>> {
    let dir = cfg.path.parent()?;
    let mut name = OsString::from(".");
    name.push(cfg.token_name());
    name.push(".state");
    let fd: OwnedFd;
    let at = match opened {
        Some(fd) => fd,
        None => match nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            FileMode::empty(),
        ) {
            Ok(opened) => {
                fd = opened;
                fd.as_fd()
            }
            Err(e) => {
                return Some(Err(Error::path(
                    "cannot open the directory of",
                    &dir.join(&name),
                    e.into(),
                )));
            }
        },
    };
    Some(f(&StateAt {
        dir: at,
        name: &name,
        shown: &dir.join(&name),
        remote: false,
        mode: cfg.file_mode,
        group: cfg.group,
        slots,
        agree,
    }))
}

/// `/proc/locks`, read with a buffer of 64 KiB: the kernel makes the records of one read(2)
/// in one pass (up to a page of them), where `read_to_string`'s first read of 32 bytes would
/// make one record per pass and skip records as others come and go between the passes.
fn proc_locks() -> Option<String> {
    let mut f = File::open("/proc/locks").ok()?;
    let mut text = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    String::from_utf8(text).ok()
}

/// Holders of flock locks on (`dev`, `ino`) per `/proc/locks` (granted ones, not waiters).
fn proc_locks_holders(dev: u64, ino: u64) -> Vec<Holder> {
    let Some(text) = proc_locks() else {
        return Vec::new();
    };
    // glibc's dev_t encoding; /proc/locks prints "%02x:%02x:%lu".
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    let me = host::this();
    text.lines()
        .filter_map(|line| {
            let mut w = line.split_ascii_whitespace().skip(1);
            let kind = w.next()?;
            if kind != "FLOCK" {
                return None; // "->" marks a blocked waiter; POSIX/OFDLCK are other locks
            }
            let _advisory = w.next()?;
            let rw = w.next()?;
            let pid: i32 = w.next()?.parse().ok()?;
            (w.next()? == want).then(|| Holder {
                host: Some(me.hostname.clone()),
                pid: Some(pid),
                ppid: host::stat(pid).map(|s| s.ppid),
                since: None,
                token: None,
                mode: Some(if rw == "READ" {
                    Mode::Shared
                } else {
                    Mode::Exclusive
                }),
                alive: Some(true),
                foreign: None,
                slot: None,
            })
        })
        .collect()
}

impl Registered for Flock {
    type Config = FsConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::lockdir::FS_KEYS];
    const SHARED: bool = true;
    const ON_FILES: bool = true;
    const SLOTS: bool = true;
    fn parse(f: &mut Fields) -> crate::error::Result<FsConfig> {
        config(f)
    }
    fn slot(cfg: &FsConfig, k: u32) -> FsConfig {
        cfg.slot(k)
    }
    /// Kept by mkdir locks (`Profile::queue`), whose holders' numbers others can read.
    fn queue(cfg: &FsConfig) -> Option<FsConfig> {
        Some(cfg.queue())
    }
    const PLACES: u32 = super::lockdir::PLACES;
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::address::path_keys(a)
    }
    fn open(cfg: &FsConfig, lock: &Named) -> Box<dyn Backend> {
        Box::new(Flock::new(cfg.clone(), &lock.common))
    }
    fn verify(cfg: &FsConfig, lock: &Named, peer: Option<&Path>) -> crate::error::Result<Report> {
        super::lockdir::probe::verify(lock, Scheme::Flock, cfg, peer)
    }
    fn location(cfg: &FsConfig) -> String {
        cfg.path.display().to_string()
    }
}
