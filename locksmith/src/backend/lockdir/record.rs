//! Fresh reads and records: names looked up again past `ESTALE`, a record read with a
//! fresh `open` + `read` (what a network filesystem does not serve from a cache), pins, the
//! heartbeat record written in place, and what a planted file at a record's name means.

use std::ffi::OsStr;
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode as FileMode, fstat, fstatat};

use crate::backend::faults::{self, Stall};
use crate::backend::owner::{Parsed, Record};
use crate::error::{Error, Result, err};
use crate::protocol::Mode;

/// The most of a heartbeat record (or a link lock file) that is read. Ours stay under 2 KiB
/// (`owner::PROFILE_SHOWN`); an older locksmith wrote a whole lock address into its record,
/// %-escaped up to about 12.5 KiB, and such a record must still read as the holder it is
/// (issue 28: a 4 KiB cap made a long path's own record unreadable: the lock waited on itself).
const RECORD_CAP: u64 = 64 * 1024;

/// Runs `f` (a call that looks a name up) again while it fails with `ESTALE`: a network
/// filesystem (GlusterFS, NFS) answers so when the inode its cache named is gone; a second
/// lookup asks the server. After three, `ESTALE` is what the name said: gone (`ENOENT`).
pub fn unstale<T>(mut f: impl FnMut() -> nix::Result<T>) -> nix::Result<T> {
    for _ in 0..3 {
        match f() {
            Err(Errno::ESTALE) => continue,
            r => return r,
        }
    }
    Err(Errno::ENOENT)
}

/// What locksmith keeps at the name `shown` (beside a lock, or the lock itself), for
/// messages: docs/LAYOUT.md's names.
pub fn role(shown: &Path) -> &'static str {
    let name = shown.file_name().map(OsStr::as_bytes).unwrap_or_default();
    let has = |s: &[u8]| name.windows(s.len()).any(|w| w == s);
    if name.ends_with(b".state") {
        "lock state"
    } else if name.ends_with(b".break") {
        "break guard"
    } else if name.ends_with(b".beat") {
        "heartbeat record"
    } else if has(b".w.") {
        "waiting writer's marker"
    } else if name.starts_with(b".") && has(b".pin.") {
        "fresh-read link"
    } else {
        "lock"
    }
}

/// The answer for something locksmith did not make at `name` in `dir` (`shown`), which
/// should be `expected`: [`crate::files::in_the_way`] with its kind and owner; `e` if it
/// cannot even be looked at.
pub fn planted(dir: BorrowedFd<'_>, name: &OsStr, shown: &Path, expected: &str, e: Errno) -> Error {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => crate::files::in_the_way(role(shown), shown, st.st_mode, st.st_uid, expected),
        Err(_) => Error::path("cannot open", shown, e.into()),
    }
}

/// Whether `name` in `dir` is a symbolic link.
pub fn is_symlink(dir: BorrowedFd<'_>, name: &OsStr) -> bool {
    fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFLNK)
}

/// Where a record (a regular file) should be, `openat` failed with `e`.
fn not_a_record(dir: BorrowedFd<'_>, name: &OsStr, shown: &Path, e: Errno) -> Error {
    match e {
        // O_NOFOLLOW on a symbolic link; EACCES where protected_symlinks refuses first.
        Errno::ELOOP | Errno::ENXIO | Errno::EISDIR => {
            planted(dir, name, shown, "a lock record (a regular file)", e)
        }
        Errno::EACCES if is_symlink(dir, name) => {
            planted(dir, name, shown, "a lock record (a regular file)", e)
        }
        e => Error::path("cannot open", shown, e.into()),
    }
}

/// The content of the regular file `name` in `dir` (`shown` in messages), read fresh: `None`
/// if there is none. Opened so that nothing planted there can block us or be followed;
/// something other than a regular file is a config error naming it.
pub fn read_record(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    shown: &Path,
) -> Result<Option<(Vec<u8>, FileStat)>> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_NOCTTY
        | OFlag::O_CLOEXEC;
    let fd = match unstale(|| openat(dir, name, flags, FileMode::empty())) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(not_a_record(dir, name, shown, e)),
    };
    // A network filesystem may stat and read by path: the file removed (or its directory
    // renamed) since our open is gone, not an error.
    let st = match fstat(&fd) {
        Ok(st) => st,
        Err(Errno::ENOENT | Errno::ESTALE) => return Ok(None),
        Err(e) => return Err(Error::path("cannot stat", shown, e.into())),
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(crate::files::in_the_way(
            role(shown),
            shown,
            st.st_mode,
            st.st_uid,
            "a lock record (a regular file)",
        ));
    }
    let mut buf = Vec::new();
    match File::from(fd).take(RECORD_CAP).read_to_end(&mut buf) {
        Ok(_) => Ok(Some((buf, st))),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESTALE)) => Ok(None),
        Err(e) => Err(Error::path("cannot read", shown, e)),
    }
}

/// Makes `pin`, a hard link in `dir` to whatever `name` is now: the server decides, so the
/// pin can be read past a network filesystem's cache of `name` (sshfs serves `readlink`
/// from one for 20 s). `Ok(false)`: `name` is gone. The caller reads the pin, then removes it.
pub fn pin(dir: BorrowedFd<'_>, name: &OsStr, pin: &OsStr, shown: &Path) -> Result<bool> {
    // GlusterFS answers EIO, ESTALE and even ENOENT while `name` is being replaced (renamed
    // over) or linked by others: no answer about `name`. Only an lstat that agrees makes
    // ENOENT "gone"; otherwise the next try links whatever is there by then.
    let mut pause = Duration::from_millis(1);
    let mut last = Errno::ENOENT;
    for _ in 0..8 {
        match nix::unistd::linkat(dir, name, dir, pin, nix::fcntl::AtFlags::empty()) {
            Ok(()) => return Ok(true),
            Err(Errno::ENOENT) => {
                if fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) == Err(Errno::ENOENT) {
                    return Ok(false);
                }
                last = Errno::ENOENT;
            }
            Err(e @ (Errno::EIO | Errno::ESTALE)) => last = e,
            Err(e) => {
                return Err(Error::path(
                    "cannot read (linking it to read it fresh)",
                    shown,
                    e.into(),
                ));
            }
        }
        std::thread::sleep(pause);
        pause *= 2;
    }
    match last {
        // The server keeps saying gone, a cache says there: the server's word.
        Errno::ENOENT => Ok(false),
        e => Err(Error::path(
            "cannot read (linking it to read it fresh)",
            shown,
            e.into(),
        )),
    }
}

/// Reads `name` in `dir` fresh: `read` is applied to a [`pin`] of it (`pin_name`, removed
/// after). `Ok(None)`: `name` is gone. GlusterFS may answer ESTALE (or ENOENT) reading a pin
/// made a moment ago while others link and unlink the same inode: that is no answer about
/// `name`, so the pin is made again; an error if it never reads.
pub fn read_pinned<T>(
    dir: BorrowedFd<'_>,
    name: &OsStr,
    pin_name: &OsStr,
    shown: &Path,
    mut read: impl FnMut(&OsStr) -> nix::Result<T>,
) -> Result<Option<T>> {
    let mut last = Errno::ESTALE;
    for _ in 0..5 {
        if !pin(dir, name, pin_name, shown)? {
            return Ok(None);
        }
        let r = read(pin_name);
        let _ = nix::unistd::unlinkat(dir, pin_name, nix::unistd::UnlinkatFlags::NoRemoveDir);
        match r {
            Ok(v) => return Ok(Some(v)),
            Err(e @ (Errno::ESTALE | Errno::ENOENT)) => last = e,
            Err(e) => return Err(Error::path("cannot read", shown, e.into())),
        }
    }
    Err(Error::path(
        "cannot read (through a fresh hard link to it)",
        shown,
        last.into(),
    ))
}

/// Makes what was written to `file` reach the server before another host reads it, on a
/// network or FUSE filesystem (`remote`): `fdatasync` (NFS flushes on it, FUSE passes it on to
/// its daemon, GlusterFS's write-behind lets go). On a local filesystem every reader shares the
/// page cache, so nothing is synced: a record needs no durability across a power loss (one
/// from an earlier boot is dead by its boot id; one a crash left empty is silent, breakable
/// after stale_after), and a disk flush per acquisition and per heartbeat is what a lock on a
/// laptop's disk should not cost.
pub fn reach_server(file: &File, remote: bool) -> std::io::Result<()> {
    if remote { file.sync_data() } else { Ok(()) }
}

/// One heartbeat: rewrites the record `name` (in `at`) in place with `rec` at beat `n`, if it
/// still is ours (its nonce), and makes the write reach the server ([`reach_server`];
/// `remote`: the lock is on a network or FUSE filesystem). `Ok(false)`: the record is gone or
/// belongs to someone else — the lock is not ours any more. The check and the write go through
/// one descriptor, so a successor's record (a new file) is never written.
pub fn write_beat(
    at: BorrowedFd<'_>,
    name: &OsStr,
    shown: &Path,
    rec: &Record,
    n: u64,
    remote: bool,
) -> Result<bool> {
    // A heartbeat that stalls (a network filesystem that does not answer): the process's
    // first heartbeat after taking the lock.
    if n > 0 {
        faults::stall(Stall::Beat);
    }
    let flags = OFlag::O_RDWR | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = match unstale(|| openat(at, name, flags, FileMode::empty())) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(false),
        Err(e) => return Err(not_a_record(at, name, shown, e)),
    };
    let file = File::from(fd);
    let st = fstat(file.as_fd()).map_err(|e| Error::path("cannot stat", shown, e.into()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Ok(false);
    }
    let mut old = Vec::new();
    (&file)
        .take(RECORD_CAP)
        .read_to_end(&mut old)
        .map_err(|e| Error::path("cannot read", shown, e))?;
    if !is_ours(&old, rec) {
        return Ok(false);
    }
    let text = rec.render_beat(n);
    file.write_all_at(text.as_bytes(), 0)
        .and_then(|()| {
            if (text.len() as u64) < old.len() as u64 {
                file.set_len(text.len() as u64)
            } else {
                Ok(())
            }
        })
        .and_then(|()| reach_server(&file, remote))
        .map_err(|e| Error::path("cannot heartbeat lock", shown, e))?;
    Ok(true)
}

/// Whether a record's content is the acquisition `rec` (same nonce).
pub fn is_ours(content: &[u8], rec: &Record) -> bool {
    matches!(parse(content), Parsed::V1(r) if r.nonce == rec.nonce)
}

/// Parses a record file's content.
pub fn parse(content: &[u8]) -> Parsed {
    Record::parse(String::from_utf8_lossy(content).trim())
}

/// Refuses shared locks on a network filesystem (`remote`, named by `fs_name`, asked only
/// for the message: naming a local filesystem reads the mount table) unless `local = true`:
/// a reader's entry is a symlink, whose times it may not set.
pub fn check_shared<'a>(
    path: &Path,
    remote: bool,
    fs_name: impl FnOnce() -> &'a str,
    mode: Mode,
    local: bool,
) -> Result<()> {
    if remote && mode == Mode::Shared && !local {
        return Err(err!(
            Config,
            "lock {} is on {}: shared symlink locks cannot heartbeat there yet (a reader's entry is a symlink, whose times a network filesystem may not set); take it exclusively, or set local = true if every contender runs on this host",
            path.display(),
            fs_name()
        ));
    }
    Ok(())
}

/// Whether `e`, the answer to a `symlink(2)` or `link(2)` on a name of our own that nobody
/// else can have made, says the filesystem lacks the call (SMB through smbnetfs: symlink
/// ENOSYS, link EPERM; FAT-like filesystems EPERM).
pub fn call_missing(e: Errno) -> bool {
    matches!(e, Errno::ENOSYS | Errno::EPERM | Errno::EOPNOTSUPP)
}

/// Makes the record entry `name` in `dir` holding `text`, in the form the filesystem keeps
/// (`symlinks`: whether it has `symlink(2)`, learnt here on its first refusal, once per lock):
/// a symbolic link whose target is the text (read in one `readlink`, nothing opened inside
/// the lock), or else a regular file written and synced under the private name `tmp` and then
/// renamed onto `name` — a free name unique to the acquisition, so the rename replaces
/// nothing (where a rename over a name is unlink-then-rename, as on SMB, that matters) and a
/// reader never sees the entry half-written. Nothing is left on failure.
pub fn make_entry(
    dir: BorrowedFd<'_>,
    name: &str,
    text: &str,
    tmp: &str,
    symlinks: &std::cell::Cell<bool>,
) -> nix::Result<()> {
    if symlinks.get() {
        match nix::unistd::symlinkat(text, dir, name) {
            Err(e) if call_missing(e) => symlinks.set(false),
            r => return r,
        }
    }
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(dir, tmp, flags, FileMode::from_bits_truncate(0o644))?;
    let file = File::from(fd);
    let unlink = || nix::unistd::unlinkat(dir, tmp, nix::unistd::UnlinkatFlags::NoRemoveDir);
    let written = file
        .write_all_at(text.as_bytes(), 0)
        .and_then(|()| file.sync_data());
    drop(file);
    if let Err(e) = written {
        let _ = unlink();
        return Err(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)));
    }
    rename_soon(dir, tmp.as_ref(), name.as_ref()).inspect_err(|_| {
        let _ = unlink();
    })
}

/// Tries `f` (a rename or unlink of a file we just closed) again while it answers EBUSY or
/// EACCES, for about two seconds: through FUSE the close reaches the daemon after `close(2)`
/// returns, and SMB refuses to rename or remove a file that is still open (issue 28: an
/// owner record's rename failed EBUSY in a race across two mounts; verify's probe files were
/// left on the server).
pub fn soon(mut f: impl FnMut() -> nix::Result<()>) -> nix::Result<()> {
    let mut pause = Duration::from_millis(1);
    loop {
        match f() {
            Err(Errno::EBUSY | Errno::EACCES) if pause < Duration::from_secs(1) => {
                std::thread::sleep(pause);
                pause *= 2;
            }
            r => return r,
        }
    }
}

/// `renameat(dir, from, dir, to)` of a file we just closed, per [`soon`].
pub fn rename_soon(dir: BorrowedFd<'_>, from: &OsStr, to: &OsStr) -> nix::Result<()> {
    soon(|| nix::fcntl::renameat(dir, from, dir, to))
}

/// The text of the record entry `name` in `dir`, in either form [`make_entry`] makes: the
/// symbolic link's target, or the regular file's content.
pub fn read_entry(dir: BorrowedFd<'_>, name: &str) -> nix::Result<Vec<u8>> {
    match nix::fcntl::readlinkat(dir, name) {
        Ok(t) => Ok(t.as_bytes().to_vec()),
        Err(Errno::EINVAL) => {
            let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
            let fd = openat(dir, name, flags, FileMode::empty())?;
            let mut buf = Vec::new();
            File::from(fd)
                .take(RECORD_CAP)
                .read_to_end(&mut buf)
                .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
            Ok(buf)
        }
        Err(e) => Err(e),
    }
}
