//! Opening a file by name so that whatever sits at that name cannot stall or flood the
//! helper (issue 15): every file locksmith opens by name — lock files and gates, the profiles
//! file, `password_file`, `ca_file` — goes through [`open_regular`].
//!
//! - `open(2)` with `O_NONBLOCK`: a FIFO planted at the name opens at once instead of
//!   waiting in the kernel for a writer (deaf to `--wait`, signals and parent death).
//!   `O_NOCTTY` too, so a terminal never becomes ours; `O_NOFOLLOW` where the caller asks.
//! - `fstat(2)` on the descriptor just opened, never `stat` before: the kind checked is the
//!   kind of the file we hold. Anything but a regular file (FIFO, device, directory, socket)
//!   is a config error (78) that names the file, the kind and its owner.
//! - Reads stop at a cap: [`SECRET_CAP`] for a password, [`CONFIG_CAP`] for a profiles file
//!   or a CA bundle. A file over it is a config error, not an allocation of gigabytes.
//!
//! `O_NONBLOCK` is cleared again once the kind is known: it changes nothing for a regular
//! file, but the flock descriptor is inherited by `run`'s command.

use std::ffi::CStr;
use std::fs::File;
use std::io::Read;
use std::mem::MaybeUninit;
use std::ops::ControlFlow;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{F_GETFL, F_SETFL, OFlag, fcntl, open};
use nix::sys::stat::{FileStat, Mode, fstat};

use crate::error::{Error, Kind, Result, err};

/// The most a password file may hold: 64 KiB (a password is a line; this is generous).
pub const SECRET_CAP: u64 = 64 * 1024;

/// The most a profiles file or a CA bundle may hold: 4 MiB (Debian's system bundle of ~150
/// roots is about 220 KB; a profiles file of 10,000 profiles about 1 MB).
pub const CONFIG_CAP: u64 = 4 * 1024 * 1024;

/// Lists the directory `name` in `dir` (`"."`: `dir` itself, listed from its start through a
/// descriptor of its own): every name, `.` and `..` included, to `each` until it breaks.
/// `ENOENT` is the open's (nothing at `name`): a directory removed while listed ends the
/// listing, as with `readdir(3)`.
/// `flags` are added to `O_RDONLY | O_DIRECTORY | O_CLOEXEC` (`O_NOFOLLOW`, `O_NONBLOCK`).
///
/// Plain `getdents64(2)` into a buffer on the stack: no `fdopendir` around it, whose `fstat`,
/// two `fcntl`, 32 KiB allocation and closing rewind every token issued paid (issue 29).
pub fn each_name(
    dir: BorrowedFd<'_>,
    name: &(impl nix::NixPath + ?Sized),
    flags: OFlag,
    each: impl FnMut(&CStr) -> ControlFlow<()>,
) -> nix::Result<()> {
    let flags = flags | OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let fd = nix::fcntl::openat(dir, name, flags, Mode::empty())?;
    list(fd.as_fd(), each)
}

/// [`each_name`] through `fd`, a directory descriptor opened for reading whose open file
/// description nobody else reads through (a listing moves its offset): from where it is.
pub fn list(fd: BorrowedFd<'_>, mut each: impl FnMut(&CStr) -> ControlFlow<()>) -> nix::Result<()> {
    // Room for at least 15 entries of the longest name (255 bytes) a filesystem gives.
    let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
    let mut listing = rustix::fs::RawDir::new(fd, &mut buf);
    while let Some(entry) = listing.next() {
        let entry = match entry {
            Ok(entry) => entry,
            // A directory removed since it was opened: Linux answers ENOENT, which POSIX (and
            // glibc's `readdir`) take as the end of the listing.
            Err(e) if e == rustix::io::Errno::NOENT => break,
            Err(e) => return Err(Errno::from_raw(e.raw_os_error())),
        };
        if each(entry.file_name()).is_break() {
            break;
        }
    }
    Ok(())
}

/// What a file mode says the file is, as a message names it.
pub fn kind_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO (named pipe)",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symbolic link",
        _ => "a file of unknown kind",
    }
}

/// Who owns a file, for a message: `user nobody (uid 65534)`, or `uid 1234` if no account
/// has that uid.
pub fn owner_name(uid: u32) -> String {
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => format!("user {} (uid {uid})", u.name),
        _ => format!("uid {uid}"),
    }
}

/// The one answer (issue 15) for a name locksmith uses that holds something locksmith did
/// not make there — a planted file at the lock path, its token state, a breaker's guard:
/// a config error naming the file (`what` `path`), what it is (`mode`), its owner, what was
/// `expected`, and what to do.
pub fn in_the_way(what: &str, path: &Path, mode: u32, uid: u32, expected: &str) -> Error {
    err!(
        Config,
        "{what} {} is {} owned by {}, not {expected}: something else is in the way; remove it, \
         and keep locks in a directory only their users can write",
        crate::error::shown(path),
        kind_name(mode),
        owner_name(uid)
    )
}

/// The config error for a name that holds the wrong kind of file.
fn wrong_kind(what: &str, path: &Path, mode: u32, uid: u32) -> Error {
    in_the_way(what, path, mode, uid, "a regular file")
}

/// `open(2)` with `O_NONBLOCK | O_NOCTTY | O_CLOEXEC` added to `flags`, then `fstat(2)` on
/// the new descriptor: `Ok` only for a regular file, whose descriptor is returned blocking
/// again. `what` names the file in errors ("lock file", "password_file"). A directory, FIFO,
/// device or socket at `path` is `Kind::Config`. Other failures to open: with `O_CREAT` (a
/// lock file) classified by errno as [`Error::path`] does; without (a file the user
/// configured: profiles, password, CA) `Kind::Config`.
///
/// # References
/// - <https://man7.org/linux/man-pages/man2/open.2.html> (`O_NONBLOCK` on FIFOs)
/// - <https://man7.org/linux/man-pages/man7/fifo.7.html>
pub fn open_regular(path: &Path, what: &str, flags: OFlag, mode: Mode) -> Result<(File, FileStat)> {
    open_regular_if_there(path, what, flags, mode)?.ok_or_else(|| {
        err!(
            Config,
            "cannot open {what} {}: {}",
            crate::error::shown(path),
            std::io::Error::from(Errno::ENOENT)
        )
    })
}

/// [`open_regular`] of a file that may not be there yet: `None` when the open (without
/// `O_CREAT`) says nothing is at `path` — the open's answer, not a look before or after it.
pub fn open_regular_if_there(
    path: &Path,
    what: &str,
    flags: OFlag,
    mode: Mode,
) -> Result<Option<(File, FileStat)>> {
    let flags = flags | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let fd: OwnedFd = match open(path, flags, mode) {
        Ok(fd) => fd,
        // A directory opened for writing or created: EISDIR. A socket (or a device without a
        // driver, or a FIFO opened for writing without a reader): ENXIO. Name what is there;
        // `lstat` only describes it, the decision is the open's.
        Err(e @ (Errno::EISDIR | Errno::ENXIO | Errno::ENODEV)) => {
            return Err(match std::fs::symlink_metadata(path) {
                Ok(md) => {
                    use std::os::unix::fs::MetadataExt;
                    wrong_kind(what, path, md.mode(), md.uid())
                }
                Err(_) => Error::path(&format!("cannot open {what}"), path, e.into()),
            });
        }
        // A symbolic link where `O_NOFOLLOW` asked for none: ELOOP, or EACCES first where
        // `fs.protected_symlinks` forbids following another user's link in a sticky directory.
        Err(e @ (Errno::ELOOP | Errno::EACCES)) if flags.contains(OFlag::O_NOFOLLOW) => {
            use std::os::unix::fs::MetadataExt;
            return Err(match std::fs::symlink_metadata(path) {
                Ok(md) if md.file_type().is_symlink() => {
                    wrong_kind(what, path, md.mode(), md.uid())
                }
                _ => Error::path(&format!("cannot open {what}"), path, e.into()),
            });
        }
        Err(e) if flags.contains(OFlag::O_CREAT) => {
            return Err(Error::path(&format!("cannot open {what}"), path, e.into()));
        }
        Err(Errno::ENOENT) => return Ok(None),
        // A file the user configured (profiles, password, CA): any failure is config.
        Err(e) => {
            return Err(err!(
                Config,
                "cannot open {what} {}: {}",
                crate::error::shown(path),
                std::io::Error::from(e)
            ));
        }
    };
    let st = fstat(&fd).map_err(|e| Error::path(&format!("cannot stat {what}"), path, e.into()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(wrong_kind(what, path, st.st_mode, st.st_uid));
    }
    let fl = OFlag::from_bits_truncate(
        fcntl(fd.as_fd(), F_GETFL).map_err(|e| Error::path("fcntl", path, e.into()))?,
    );
    fcntl(fd.as_fd(), F_SETFL(fl - OFlag::O_NONBLOCK))
        .map_err(|e| Error::path("fcntl", path, e.into()))?;
    Ok(Some((File::from(fd), st)))
}

/// Reads a regular file opened with [`open_regular`], at most `cap` bytes; a file over the
/// cap (by its size or by what it yields) is a config error.
pub fn read_capped(
    mut file: File,
    st: &FileStat,
    path: &Path,
    what: &str,
    cap: u64,
) -> Result<Vec<u8>> {
    let too_big = |size: u64| {
        Error::new(
            Kind::Config,
            format!(
                "{what} {} is {}, over the limit of {} KiB",
                crate::error::shown(path),
                if size > cap {
                    format!("{size} bytes")
                } else {
                    "larger than it says".into()
                },
                cap / 1024
            ),
        )
    };
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > cap {
        return Err(too_big(size));
    }
    let mut buf = Vec::with_capacity(size as usize);
    (&mut file)
        .take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::path(&format!("cannot read {what}"), path, e))?;
    if buf.len() as u64 > cap {
        return Err(too_big(buf.len() as u64));
    }
    Ok(buf)
}

/// [`open_regular`] read-only, then [`read_capped`].
pub fn read_regular(path: &Path, what: &str, cap: u64) -> Result<Vec<u8>> {
    let (file, st) = open_regular(path, what, OFlag::O_RDONLY, Mode::empty())?;
    read_capped(file, &st, path, what, cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name, over several `getdents64` buffers; a directory removed while listed ends
    /// the listing (`readdir(3)`'s rule); nothing at the name is the open's ENOENT; a symbolic
    /// link with `O_NOFOLLOW` is ENOTDIR (with `O_DIRECTORY`; else ELOOP), never followed.
    #[test]
    fn listings_see_every_name_and_end_quietly_on_a_removed_directory() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        std::fs::create_dir(&d).unwrap();
        // 300 names of 200 bytes: about 15 buffers of 4 KiB.
        let mut made: Vec<String> = (0..300).map(|i| format!("{i:0>200}")).collect();
        for n in &made {
            std::fs::write(d.join(n), "").unwrap();
        }
        let top = nix::fcntl::open(
            dir.path(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            Mode::empty(),
        )
        .unwrap();
        let mut seen = Vec::new();
        each_name(top.as_fd(), "d", OFlag::O_NOFOLLOW, |n| {
            let n = n.to_str().unwrap();
            if n != "." && n != ".." {
                seen.push(n.to_string());
            }
            ControlFlow::Continue(())
        })
        .unwrap();
        seen.sort();
        made.sort();
        assert_eq!(seen, made);
        // Stopped early: no more names.
        let mut calls = 0;
        each_name(top.as_fd(), "d", OFlag::empty(), |_| {
            calls += 1;
            ControlFlow::Break(())
        })
        .unwrap();
        assert_eq!(calls, 1);
        let e = each_name(top.as_fd(), "none", OFlag::empty(), |_| {
            ControlFlow::Continue(())
        });
        assert_eq!(e, Err(Errno::ENOENT));
        std::os::unix::fs::symlink("d", dir.path().join("l")).unwrap();
        let e = each_name(top.as_fd(), "l", OFlag::O_NOFOLLOW, |_| {
            ControlFlow::Continue(())
        });
        assert!(matches!(e, Err(Errno::ELOOP | Errno::ENOTDIR)), "{e:?}");
        // Opened, then removed: the listing is empty, not an error.
        let gone = dir.path().join("gone");
        std::fs::create_dir(&gone).unwrap();
        let fd =
            nix::fcntl::open(&gone, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        std::fs::remove_dir(&gone).unwrap();
        let mut names = 0;
        list(fd.as_fd(), |_| {
            names += 1;
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(names, 0);
    }

    #[test]
    fn a_fifo_opens_at_once_and_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("p");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).unwrap();
        let e = read_regular(&fifo, "password_file", SECRET_CAP).unwrap_err();
        assert_eq!(e.kind(), Kind::Config);
        assert!(e.message().contains("is a FIFO (named pipe)"), "{e}");
        let e = read_regular(dir.path(), "profiles file", CONFIG_CAP).unwrap_err();
        assert_eq!(e.kind(), Kind::Config);
        assert!(e.message().contains("is a directory"), "{e}");
        let e = read_regular(Path::new("/dev/zero"), "ca_file", CONFIG_CAP).unwrap_err();
        assert!(e.message().contains("is a character device"), "{e}");
    }

    #[test]
    fn reads_stop_at_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("big");
        std::fs::write(&f, vec![b'x'; 2048]).unwrap();
        assert_eq!(read_regular(&f, "x", 4096).unwrap().len(), 2048);
        let e = read_regular(&f, "x", 1024).unwrap_err();
        assert!(
            e.message().contains("2048 bytes, over the limit of 1 KiB"),
            "{e}"
        );
    }
}
