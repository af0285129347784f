//! The file backends' settings (`path`, `file_mode`, `group`, `local`, `cache_time`): one
//! reader for a profile section and an address.

use crate::error::{Result, shown};
use crate::settings::{Fields, KeyDoc, MAX_NAME, MAX_PATH, parse_duration};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Settings of the filesystem backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsConfig {
    /// Absolute path of the lock (file for flock, directory for mkdir).
    pub path: PathBuf,
    /// Mode for files and directories locksmith creates (directories get `x` where `r` is).
    pub file_mode: Option<u32>,
    /// Group for files and directories locksmith creates.
    pub group: Option<u32>,
    /// Every contender is on this host: no heartbeat, staleness by proof of death alone
    /// (and, for flock, a network or FUSE filesystem is accepted).
    pub local: bool,
    /// How late the mount may show another host's changes, as the user states it (network
    /// and FUSE filesystems; `stale_after` must exceed it).
    pub cache_time: Option<Duration>,
    /// A slot of a lock with several (SPEC §3b): the lock's own name, whose token state
    /// (`.NAME.state`) every slot issues from. `None`: the lock itself.
    pub slot_of: Option<std::ffi::OsString>,
}

/// The keys of every file backend ([`FsConfig::parse`]).
pub static FS_KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "path",
        example: "\"/var/lock/myapp/x.lock\"",
        doc: "the lock (required); relative paths are resolved against the profiles file's directory; its directory must exist",
    },
    KeyDoc {
        key: "file_mode",
        example: "\"0660\"",
        doc: "permission bits of the files locksmith creates, so that a group can share the lock (no setuid, setgid or sticky bits)",
    },
    KeyDoc {
        key: "group",
        example: "\"staff\"",
        doc: "the group of the files locksmith creates (a group name or number of this host)",
    },
    KeyDoc {
        key: "local",
        example: "true",
        doc: "the lock's filesystem is used from this host only: allows flock on a network or FUSE mount, whose locks other hosts do not see [default: false]",
    },
];

/// The key of the file backends that heartbeat (mkdir, link, symlink).
pub static HEARTBEAT_KEYS: &[KeyDoc] = &[KeyDoc {
    key: "cache_time",
    example: "\"1s\"",
    doc: "how long the mount may serve stale attributes (NFS actimeo, sshfs cache_timeout): stale_after must exceed it [default: NFS's mount options, or an sshfs mount's process's options (22s with sshfs's defaults), else 60s assumed]",
}];

/// How much longer than the lock's own name the longest name the file backends must make
/// beside it is: `.NAME.state.<nonce>` (the token state being made; flock's too), one more than
/// `.NAME.beat.<nonce>` and `.NAME.<nonce>.tomb`. (mkdir's `.NAME.<nonce>.<host>.<pid>.<start>.new`
/// and link's `….tmp` are longer, up to 66 more bytes: made only where they fit, else
/// `.NAME.<nonce>.new` / `.tmp`: `lockdir/leftover.rs`.)
pub const BESIDE: usize = 24;
/// The longest lock name those backends take: every name they make beside it fits in
/// `NAME_MAX` (issue 28: a longer one failed half-way with ENAMETOOLONG, and mkdir could not
/// even give back the lock it had made).
pub const MAX_LOCK_NAME: usize = MAX_NAME - BESIDE;

impl FsConfig {
    /// The keys of the filesystem backends: `path`, `file_mode`, `group`, `local`, and
    /// `cache_time` where the backend judges liveness by heartbeats (`heartbeats`: mkdir,
    /// link, symlink).
    pub fn parse(f: &mut Fields, heartbeats: bool) -> Result<FsConfig> {
        let path = f.required("path", Fields::string)?;
        if path.is_empty() {
            return Err(f.error("`path` is empty"));
        }
        if path.contains('\0') {
            return Err(f.error(&format!(
                "`path` {} contains a NUL byte",
                shown(Path::new(&path))
            )));
        }
        let path = f.anchor(path);
        let too_long = path.as_os_str().len() > MAX_PATH || path.iter().any(|c| c.len() > MAX_NAME);
        if too_long {
            return Err(f.error(&format!(
                "`path` {} is {} bytes long: a path is at most {MAX_PATH} bytes, a name in it at most {MAX_NAME}",
                shown(&path),
                path.as_os_str().len()
            )));
        }
        if path.file_name().is_none() {
            return Err(f.error(&format!(
                "`path` {} does not name a file or directory",
                shown(&path)
            )));
        }
        let name_len = path.file_name().map_or(0, |n| n.len());
        if heartbeats && name_len > MAX_LOCK_NAME {
            return Err(f.error(&format!(
                "`path` {}: its last name is {name_len} bytes long; this backend keeps names \
                 beside the lock {BESIDE} bytes longer (`.NAME.state.<nonce>`), and a name is at \
                 most {MAX_NAME} bytes: use a name of at most {MAX_LOCK_NAME} bytes",
                shown(&path)
            )));
        }
        let file_mode = match f.string("file_mode")? {
            None => None,
            Some(s) => Some(match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
                Ok(m) if m <= 0o777 => m,
                // Root would create a setuid (or setgid, or sticky) file (issue 15).
                Ok(m) if m <= 0o7777 => {
                    return Err(f.error(&format!(
                            "`file_mode` = \"{s}\" sets setuid, setgid or sticky bits; give permission bits only, at most \"0777\""
                        )));
                }
                _ => {
                    return Err(f.error(&format!(
                        "`file_mode` = \"{s}\" is not an octal mode like \"0660\""
                    )));
                }
            }),
        };
        let group = match f.string("group")? {
            None => None,
            Some(g) => Some(resolve_group(&g).ok_or_else(|| {
                f.error(&format!("`group` = \"{g}\": no such group on this host"))
            })?),
        };
        let local = f.bool("local")?.unwrap_or(false);
        if !heartbeats && f.has("cache_time") {
            return Err(f.error(
                "`cache_time` applies to backends mkdir, link and symlink (flock has no heartbeat)",
            ));
        }
        let cache_time = match heartbeats
            .then(|| f.string("cache_time"))
            .transpose()?
            .flatten()
        {
            Some(s) => {
                Some(parse_duration(&s).map_err(|m| f.error(&format!("`cache_time`: {m}")))?)
            }
            None => None,
        };
        Ok(FsConfig {
            path,
            file_mode,
            group,
            local,
            cache_time,
            slot_of: None,
        })
    }

    /// Slot `k` of the lock (SPEC §3b, docs/LAYOUT.md): its own lock `NAME.slot-K` beside
    /// the lock's name, issuing tokens from the lock's state.
    pub fn slot(&self, k: u32) -> FsConfig {
        let name = self.path.file_name().unwrap_or_default();
        let mut own = name.to_os_string();
        own.push(format!(".slot-{k}"));
        FsConfig {
            path: self.path.with_file_name(own),
            slot_of: Some(name.to_os_string()),
            ..self.clone()
        }
    }

    /// The lock's fair queue (SPEC §3b, docs/LAYOUT.md): a lock of its own, `NAME.line`,
    /// whose slots its waiters hold, issuing their places in line from its own state.
    pub fn queue(&self) -> FsConfig {
        let mut own = self.path.file_name().unwrap_or_default().to_os_string();
        own.push(".line");
        FsConfig {
            path: self.path.with_file_name(own),
            slot_of: None,
            ..self.clone()
        }
    }

    /// The lock's waiting room: `.NAME.waiting`, a file whose byte N a waiter of N slots
    /// holds an OFD read lock on while it waits (SPEC §3b: the lock records N while anyone
    /// waits; `waiting.rs`), never unlinked, as `.NAME.queue`.
    /// `.NAME.waiting.d` beside the lock: its waiting room on a network filesystem
    /// (`netroom.rs`).
    pub fn waiting_dir(&self) -> std::ffi::OsString {
        let mut own = std::ffi::OsString::from(".");
        own.push(self.path.file_name().unwrap_or_default());
        own.push(".waiting.d");
        own
    }

    pub fn waiting(&self) -> FsConfig {
        let mut own = std::ffi::OsString::from(".");
        own.push(self.path.file_name().unwrap_or_default());
        own.push(".waiting");
        FsConfig {
            path: self.path.with_file_name(own),
            slot_of: None,
            ..self.clone()
        }
    }

    /// Applies `file_mode` and `group` to a file we own (best effort: a file made by
    /// another user keeps its mode): a flock lock file, its gate, a waiting room.
    pub fn fix_owner(&self, file: &std::fs::File, st: &nix::sys::stat::FileStat) {
        use std::os::fd::AsFd;
        if st.st_uid != nix::unistd::geteuid().as_raw() {
            return;
        }
        if let Some(m) = self.file_mode
            && st.st_mode & 0o7777 != m
        {
            let mode = nix::sys::stat::Mode::from_bits_truncate(m);
            let _ = nix::sys::stat::fchmod(file.as_fd(), mode);
        }
        if let Some(g) = self.group
            && st.st_gid != g
        {
            let _ = nix::unistd::fchown(file.as_fd(), None, Some(nix::unistd::Gid::from_raw(g)));
        }
    }

    /// The name whose `.NAME.state` issues this lock's tokens.
    pub fn token_name(&self) -> &std::ffi::OsStr {
        self.slot_of
            .as_deref()
            .unwrap_or_else(|| self.path.file_name().unwrap_or_default())
    }
}

fn resolve_group(g: &str) -> Option<u32> {
    if let Ok(gid) = g.parse::<u32>() {
        return Some(gid);
    }
    nix::unistd::Group::from_name(g)
        .ok()
        .flatten()
        .map(|gr| gr.gid.as_raw())
}

/// The mode of a directory locksmith makes beside a lock (its state, its waiting room on a
/// network filesystem): whoever may write the lock's directory `parent` may use it — the
/// parent's bits (umask aside; setgid and sticky kept), or `file_mode`'s with search added.
pub fn dir_mode(
    file_mode: Option<u32>,
    parent: std::os::fd::BorrowedFd<'_>,
) -> nix::Result<nix::sys::stat::Mode> {
    let bits = match file_mode {
        Some(m) => m | (m & 0o444) >> 2,
        None => nix::sys::stat::fstat(parent)?.st_mode & 0o3777,
    };
    Ok(nix::sys::stat::Mode::from_bits_truncate(bits))
}
