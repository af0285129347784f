//! The file backends' common ground: the lock's parent directory, opened once and used for
//! everything else (`*at` calls); the names beside the lock; the state record; which
//! filesystem the lock lives on and whether the profile may use it there; and the heartbeat
//! record that carries liveness over network filesystems. Each backend keeps only its naming
//! scheme.
//!
//! # Fresh and cached reads
//! A network filesystem may answer `stat`, `readlink` and directory listings from a cache:
//! sshfs for 20 s by default, NFS for `acdirmax` (60 s), each mount on its own. A waiter that
//! judged a holder from such a read could break a live lock. Two things do reach the server
//! every time: *mutations* (`mkdir`, `link`, `symlink`, `rename`, `unlink`, `open(O_EXCL)`),
//! whose answer the server decides, and the *content* of a regular file opened anew (NFS
//! close-to-open consistency; FUSE filesystems read through to their server). So:
//! - liveness is the content of a regular *heartbeat record* ([`write_beat`]): the owner
//!   record plus a counter its holder rewrites in place every heartbeat period, read by
//!   waiters with a fresh `open` + `read` ([`LockDir::read_file`]);
//! - a waiter or breaker removes a holder only by a *claim*, a mutation on a name that carries
//!   the acquisition's nonce, or after re-reading the lock's content fresh; cached names only
//!   propose candidates (see `stale.rs`).
//!
//! Where a filesystem might cache even content (an unknown FUSE filesystem), the profile must
//! say how long with `cache_time`, and `stale_after` must exceed it ([`check`]); `locksmith
//! verify --peer` measures it.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode as FileMode, fstat, fstatat, major, minor};
use nix::sys::statfs::fstatfs;

use super::faults::{self, Stall};
use super::owner::{Parsed, Record, State};
use crate::error::{Error, Result, err, shown};
use crate::protocol::Mode;
use crate::settings::{Fields, KeyDoc, MAX_NAME, MAX_PATH, fmt_duration, parse_duration};

pub mod probe;
pub mod state;

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
    doc: "how long the mount may serve stale attributes (NFS actimeo, sshfs cache_timeout): stale_after must exceed it [default: read from the mount where it says, else a conservative guess]",
}];

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
        })
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

/// The most a heartbeat record (or a link lock file) holds; more is not ours.
const RECORD_CAP: u64 = 4096;

/// A filesystem locksmith cannot vouch for: how long it is assumed to serve stale data
/// unless the profile's `cache_time` says otherwise (NFS's default `acdirmax`).
pub const UNKNOWN_CACHE: Duration = Duration::from_secs(60);

/// `statfs(2)` `f_type` of filesystems whose data lives elsewhere (network, cluster or FUSE):
/// another client may see it differently, and `flock(2)` on them may be node-local.
const REMOTE: &[(u64, &str)] = &[
    (0x6969, "NFS"),
    (0x517B, "SMB"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9p"),
    (0x00C3_6400, "Ceph"),
    (0x5346_414F, "AFS"),
    (0x6B41_4653, "kAFS"),
    (0x7375_7245, "Coda"),
    (0x564C, "NCP"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0x7461_636F, "OCFS2"),
    (0x0116_1970, "GFS2"),
    (0x1366_1366, "OrangeFS"),
    (0x1983_0326, "BeeGFS"),
    (0xAAD7_AAEA, "PanFS"),
    (0x786F_4256, "vboxsf"),
];

/// The filesystem a lock lives on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fs {
    /// For messages: the mount's type (`fuse.sshfs`, `nfs4`, `ext4`) and source.
    pub name: String,
    /// Another machine (or a FUSE daemon) holds the data.
    pub remote: bool,
    /// How long it may serve stale data, where its mount options say (NFS).
    pub cache: Option<Duration>,
    /// Its client's caches, where locksmith checks them (GlusterFS): `Ok` with what was seen,
    /// or `Err` with why no heartbeat backend can keep SPEC §6 there whatever the timings
    /// (a fresh lookup answered with an old inode) and what to set.
    pub client: Option<std::result::Result<String, String>>,
}

/// What filesystem `fd` (a directory or file) is on, by `statfs(2)` type, named from
/// `/proc/self/mountinfo`.
pub fn detect(fd: BorrowedFd<'_>) -> Fs {
    let magic = fstatfs(fd).map_or(0, |s| s.filesystem_type().0 as u64 & 0xFFFF_FFFF);
    let family = REMOTE.iter().find(|(m, _)| *m == magic).map(|(_, n)| *n);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount = fstat(fd)
        .ok()
        .and_then(|st| mount_for_dev(&info, major(st.st_dev), minor(st.st_dev)));
    let name = match (&mount, family) {
        (Some(m), _) => format!("{} ({})", m.fstype, m.source),
        (None, Some(f)) => f.to_string(),
        (None, None) => format!("filesystem type {magic:#x}"),
    };
    let cache = match (family, &mount) {
        (Some("NFS"), Some(m)) => Some(Duration::from_secs(attr_cache_secs(m.opts))),
        (Some("NFS"), None) => Some(UNKNOWN_CACHE),
        _ => None,
    };
    let client = match &mount {
        Some(m) if m.fstype == "fuse.glusterfs" => Some(gluster_caches(&unescape(m.point))),
        _ => None,
    };
    Fs {
        name,
        remote: family.is_some(),
        cache,
        client,
    }
}

/// GlusterFS: whether a mount at `root` is safe for heartbeat locks (`Err`: why not, and what
/// to set; `Ok`: what was checked). A
/// waiter's fresh look at a name (a pin linked to it, a lookup) and at a record's content
/// must reach the bricks. Content: the kernel keeps a file's pages across opens unless the
/// client says `--fopen-keep-cache=off`, and the volume's caches ([`GLUSTER_CACHES`]) keep
/// it too — with md-cache off and either left on, a heartbeat rewritten in place did not show
/// through the other mount for over a minute here. Names: with
/// the kernel's entry cache (the client's `--entry-timeout`, 1 s by default) or the volume's
/// md-cache (`performance.stat-prefetch`, on by default) a mount resolves a name renamed over
/// through another mount to the inode it had cached — seen for as long as that inode keeps
/// another name, 900 ms after the rename and every time (`fs2_smoke::
/// gluster_pins_read_fresh_only_with_the_settings_locksmith_requires`) — so a waiter could read a dead predecessor's record
/// and break a live holder. GlusterFS's virtual `.meta` directory at the mount's root tells
/// both: `cmdline`, the client's command line, and `graphs/active/`, its translators.
fn gluster_caches(root: &Path) -> std::result::Result<String, String> {
    let meta = root.join(".meta");
    let cmdline = match std::fs::read_to_string(meta.join("cmdline")) {
        Ok(c) => c,
        Err(e) => {
            return Err(format!(
                "cannot tell whether its client caches names (reading {}: {e}); mount the volume itself (not a subdirectory) so that locksmith can check it",
                meta.join("cmdline").display()
            ));
        }
    };
    let graph: Vec<String> = match std::fs::read_dir(meta.join("graphs/active")) {
        Ok(d) => d
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) => {
            return Err(format!(
                "cannot tell whether its client caches names (listing {}: {e})",
                meta.join("graphs/active").display()
            ));
        }
    };
    let mut client = Vec::new();
    if !entry_timeout_zero(&cmdline) {
        client.push("entry-timeout=0");
    }
    if !keep_cache_off(&cmdline) {
        client.push("fopen-keep-cache=off");
    }
    let mut set = Vec::new();
    if !client.is_empty() {
        set.push(format!(
            "mount it with -o {} (glusterfs --{})",
            client.join(","),
            client.join(" --")
        ));
    }
    let off: Vec<&str> = GLUSTER_CACHES
        .iter()
        .filter(|(xlator, _)| graph.iter().any(|x| x.ends_with(xlator)))
        .map(|(_, option)| *option)
        .collect();
    if !off.is_empty() {
        set.push(format!(
            "turn the volume's client caches off (gluster volume set VOLUME {} off)",
            off.join(" off, ")
        ));
    }
    if set.is_empty() {
        return Ok(
            "--entry-timeout=0 --fopen-keep-cache=off, no md-cache, quick-read or io-cache (from .meta)"
                .into(),
        );
    }
    Err(format!(
        "its client may answer a lookup with an inode it cached or a read with old content, so a waiter could break a live holder: {}",
        set.join(", and ")
    ))
}

/// The GlusterFS client translators that cache what locksmith must read fresh (their name in
/// `.meta/graphs/active` ends so) and the volume option that turns each off: md-cache keeps a
/// renamed-over name's old inode; quick-read and io-cache (off by default) keep content.
const GLUSTER_CACHES: &[(&str, &str)] = &[
    ("-md-cache", "performance.stat-prefetch"),
    ("-quick-read", "performance.quick-read"),
    ("-io-cache", "performance.io-cache"),
];

/// The value of a GlusterFS client's option `name` (`--entry-timeout`) on its command line
/// (`.meta/cmdline`: its arguments within JSON), the last one given; `Some("")` for an option
/// given without a value.
fn client_option<'a>(cmdline: &'a str, name: &str) -> Option<&'a str> {
    let words: Vec<&str> = cmdline
        .split(|c: char| c.is_whitespace() || c == '"')
        .filter(|w| !w.is_empty())
        .collect();
    let mut value = None;
    for (i, w) in words.iter().enumerate() {
        match w.strip_prefix(name) {
            Some(v) if v.starts_with('=') => value = Some(&v[1..]),
            Some("") => {
                value = Some(
                    words
                        .get(i + 1)
                        .copied()
                        .filter(|n| !n.starts_with('-'))
                        .unwrap_or(""),
                )
            }
            _ => {}
        }
    }
    value
}

/// Whether the client's kernel entry cache is off (`--entry-timeout=0`).
fn entry_timeout_zero(cmdline: &str) -> bool {
    client_option(cmdline, "--entry-timeout")
        .and_then(|v| v.parse::<f64>().ok())
        .is_some_and(|v| v == 0.0)
}

/// Whether the client lets the kernel drop a file's cached pages at every open
/// (`--fopen-keep-cache=off`; GlusterFS keeps them by default).
fn keep_cache_off(cmdline: &str) -> bool {
    client_option(cmdline, "--fopen-keep-cache")
        .is_some_and(|v| matches!(v, "off" | "no" | "false" | "0" | "disable"))
}

/// A mount point as `/proc/self/mountinfo` escapes it (`\040` for a space, octal).
fn unescape(field: &str) -> PathBuf {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], oct) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(OsStr::from_bytes(&out))
}

/// Refuses a profile that cannot keep SPEC §6 on `fs` (78, naming the filesystem and what to
/// set). `heartbeats`: the backend judges liveness by heartbeats (mkdir, link, symlink), else
/// it relies on the kernel's `flock(2)`. `local = true` passes: every contender is on this
/// host, liveness is decided by proof of death alone.
pub fn check(
    fs: &Fs,
    shown: &Path,
    cfg: &FsConfig,
    stale_after: Duration,
    heartbeats: bool,
) -> Result<()> {
    if !fs.remote || cfg.local {
        return Ok(());
    }
    if !heartbeats {
        return Err(err!(
            Config,
            "lock file {} is on {}, a network or FUSE filesystem: flock(2) there may exclude only processes on this host, so two hosts could both hold the lock; use backend \"mkdir\", \"link\" or \"symlink\" there, or set local = true if every contender runs on this host",
            shown.display(),
            fs.name
        ));
    }
    if let Some(Err(why)) = &fs.client {
        return Err(err!(
            Config,
            "lock directory {} is on {}: {why}; or set local = true if every contender runs on this host",
            shown.display(),
            fs.name
        ));
    }
    let (cache, how) = cache_time(fs, cfg);
    if stale_after > cache {
        return Ok(());
    }
    Err(err!(
        Config,
        "lock directory {} is on {}, which may show another host's changes up to {} late ({how}); a waiter could then miss a live holder's heartbeats: set stale_after above {}, or state the mount's real cache time with cache_time = \"…\" (locksmith verify --peer measures it), or set local = true if every contender runs on this host",
        shown.display(),
        fs.name,
        fmt_duration(cache),
        fmt_duration(cache)
    ))
}

/// How late `fs` may show another host's changes, as [`check`] counts it, and on whose word:
/// the profile's `cache_time`, else the mount options (NFS), else [`UNKNOWN_CACHE`].
pub fn cache_time(fs: &Fs, cfg: &FsConfig) -> (Duration, &'static str) {
    match (cfg.cache_time, fs.cache) {
        (Some(c), _) => (c, "as the profile's cache_time says"),
        (None, Some(c)) => (c, "per its mount options"),
        (None, None) => (UNKNOWN_CACHE, "assumed: its cache time is unknown"),
    }
}

/// The `cache_time` to state for a mount that showed a change `measured` late (`verify
/// --peer`): whole seconds, with a quarter (at least 250 ms) to spare, since one measurement
/// may have caught a cache that was not at its longest.
pub fn suggest_cache_time(measured: Duration) -> Duration {
    let spare = (measured / 4).max(Duration::from_millis(250));
    let total = measured + spare;
    let secs = total.as_secs() + u64::from(total.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// Refuses a lock directory that others may write unless it is sticky (as `/tmp` is): in it
/// anyone could remove or replace our lock and records.
pub fn check_dir_mode(mode: u32, dir: &Path) -> Result<()> {
    if mode & 0o002 != 0 && mode & 0o1000 == 0 {
        return Err(err!(
            Config,
            "directory {} is writable by others and not sticky (mode {:04o}): anyone could remove the lock; chmod o-w or +t",
            dir.display(),
            mode & 0o7777
        ));
    }
    Ok(())
}

struct Mount<'a> {
    /// Where it is mounted, escaped as in mountinfo.
    point: &'a str,
    fstype: &'a str,
    source: &'a str,
    opts: &'a str,
}

/// The mount whose device is `major:minor`.
fn mount_for_dev(mountinfo: &str, maj: u64, min: u64) -> Option<Mount<'_>> {
    let want = format!("{maj}:{min}");
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2)? != want {
            return None;
        }
        let point = fields.nth(1)?;
        let (_, tail) = line.split_once(" - ")?;
        let mut rest = tail.split(' ');
        Some(Mount {
            point,
            fstype: rest.next()?,
            source: rest.next()?,
            opts: rest.next().unwrap_or(""),
        })
    })
}

/// NFS: the longest time, in seconds, a cached attribute may be served: `noac` 0, else the
/// larger of `acregmax` and `acdirmax` (the kernel lists them only when not at their
/// defaults, 60 s).
fn attr_cache_secs(opts: &str) -> u64 {
    let (mut reg, mut dir) = (60, 60);
    for opt in opts.split(',') {
        let (k, v) = opt.split_once('=').unwrap_or((opt, ""));
        let n = v.parse::<u64>().ok();
        match (k, n) {
            ("noac", _) => return 0,
            ("actimeo", Some(n)) => (reg, dir) = (n, n),
            ("acregmax", Some(n)) => reg = n,
            ("acdirmax", Some(n)) => dir = n,
            _ => {}
        }
    }
    reg.max(dir)
}

/// A lock's directory, opened once.
pub struct LockDir {
    /// The lock itself, for messages.
    pub path: PathBuf,
    pub parent: PathBuf,
    pub name: OsString,
    cfg: FsConfig,
    stale_after: Duration,
    fd: Option<OwnedFd>,
    fs: Option<Fs>,
}

impl LockDir {
    /// How long after making the lock a locker may still write into it by a name it looked
    /// up: a waiter may break a lock that showed no change for `stale_after` (half a
    /// `stale_after` of margin for a waiter that saw it late and a slow clock).
    pub fn making_budget(&self) -> Duration {
        self.stale_after / 2
    }

    pub fn new(cfg: &FsConfig, stale_after: Duration) -> LockDir {
        LockDir {
            path: cfg.path.clone(),
            parent: cfg
                .path
                .parent()
                .map_or_else(|| PathBuf::from("/"), PathBuf::from),
            name: cfg.path.file_name().map(OsString::from).unwrap_or_default(),
            cfg: cfg.clone(),
            stale_after,
            fd: None,
            fs: None,
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
            check_dir_mode(st.st_mode, &self.parent)?;
            let fs = detect(fd.as_fd());
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

    /// The filesystem's name for messages (known once [`fd`](Self::fd) ran).
    pub fn fs_name(&self) -> &str {
        self.fs.as_ref().map_or("", |f| f.name.as_str())
    }

    /// `.NAME<suffix>`: a name beside the lock.
    pub fn beside(&self, suffix: &str) -> OsString {
        let mut n = OsString::from(".");
        n.push(&self.name);
        n.push(suffix);
        n
    }

    /// The waiters' queue beside the lock (`.NAME.queue`, see `wake.rs`); `None` on a
    /// network or FUSE filesystem (known once [`fd`](Self::fd) ran), where every waiter polls.
    pub fn queue(&self) -> Option<super::wake::QueueAt> {
        (!self.remote()).then(|| super::wake::QueueAt {
            path: self.shown(self.beside(".queue")),
            mode: self.cfg.file_mode,
            group: self.cfg.group,
        })
    }

    /// A name relative to the parent, for messages.
    pub fn shown(&self, name: impl AsRef<Path>) -> PathBuf {
        self.parent.join(name)
    }

    /// The state beside the lock (`.NAME.state`, see [`state`]), `None` if no token was
    /// issued yet. Read fresh on a network filesystem.
    pub fn read_state(&mut self) -> Result<Option<State>> {
        self.with_state(state::read)
    }

    /// Issues exactly `token`, holding the lock ([`state::issue_exactly`]): `Ok(None)` when
    /// the state moved past it.
    pub fn issue_token_exactly(&mut self, token: u64) -> Result<Option<bool>> {
        let issued = self.with_state(|at| state::issue_exactly(at, token))?;
        // A holder that stalls just after taking its token, before it can use it: the
        // process's first token.
        if issued.is_some() {
            faults::stall(Stall::Taken);
        }
        Ok(issued)
    }

    /// Marks our acquisition's state clean, still holding the lock ([`state::mark_clean`]).
    pub fn mark_clean(&mut self, token: u64) -> Result<()> {
        self.with_state(|at| state::mark_clean(at, token))
    }

    fn with_state<T>(&mut self, f: impl FnOnce(&state::StateAt<'_>) -> Result<T>) -> Result<T> {
        let name = self.beside(".state");
        let shown = self.shown(&name);
        self.fd()?;
        let (remote, mode, group) = (self.remote(), self.cfg.file_mode, self.cfg.group);
        f(&state::StateAt {
            dir: self.fd()?,
            name: &name,
            shown: &shown,
            remote,
            mode,
            group,
        })
    }

    /// The content of the regular file `name` beside the lock, read fresh ([`read_record`]).
    pub fn read_file(&mut self, name: &OsStr) -> Result<Option<(Vec<u8>, FileStat)>> {
        let shown = self.shown(name);
        read_record(self.fd()?, name, &shown)
    }

    /// Creates the regular file `name` (in `at`, else the parent) with `text`, mode and group
    /// per profile; `Ok(None)` if the name exists (or a racing create made the server answer
    /// EPERM/ENOENT, as sshfs does). On a write failure nothing is left.
    pub fn create_file(
        &mut self,
        at: Option<BorrowedFd<'_>>,
        name: &OsStr,
        text: &str,
    ) -> Result<Option<File>> {
        let shown = self.shown(name);
        let (mode, group) = (self.cfg.file_mode, self.cfg.group);
        let (parent, remote) = self.fd_remote()?;
        let dir = at.unwrap_or(parent);
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
        at: Option<BorrowedFd<'_>>,
        tmp: &OsStr,
        name: &OsStr,
        text: &str,
    ) -> Result<()> {
        let shown = self.shown(name);
        if self.create_file(at, tmp, text)?.is_none() {
            return Err(err!(
                Io,
                "cannot write heartbeat record {}: {} is in the way",
                shown.display(),
                self.shown(tmp).display()
            ));
        }
        let dir = match at {
            Some(d) => d,
            None => self.fd()?,
        };
        if let Err(e) = nix::fcntl::renameat(dir, tmp, dir, name) {
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

/// Refuses shared locks on a network filesystem (`remote`, named `fs_name`) unless
/// `local = true`: a reader's entry is a symlink, whose times it may not set.
pub fn check_shared(
    path: &Path,
    remote: bool,
    fs_name: &str,
    mode: Mode,
    local: bool,
) -> Result<()> {
    if remote && mode == Mode::Shared && !local {
        return Err(err!(
            Config,
            "lock {} is on {}: shared symlink locks cannot heartbeat there yet (a reader's entry is a symlink, whose times a network filesystem may not set); take it exclusively, or set local = true if every contender runs on this host",
            path.display(),
            fs_name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
95 22 0:52 / /mnt/locks rw,relatime shared:50 - nfs4 fs1:/export/locks rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.2,local_lock=none,addr=10.0.0.1
96 22 0:53 / /mnt/fast rw,relatime shared:51 - nfs fs2:/fast rw,vers=3,acregmax=5,acdirmax=10,hard
97 22 0:54 / /mnt/noac rw,relatime shared:52 - nfs fs3:/x rw,vers=3,noac,hard
98 22 0:55 / /mnt/a rw,nosuid,nodev,relatime shared:53 - fuse.sshfs 127.0.0.1:/srv rw,user_id=0,group_id=0
";

    #[test]
    fn finds_the_mount_by_device() {
        assert_eq!(
            mount_for_dev(INFO, 0, 53).map(|m| m.source),
            Some("fs2:/fast")
        );
        assert_eq!(
            mount_for_dev(INFO, 0, 55).map(|m| m.fstype),
            Some("fuse.sshfs")
        );
        assert!(mount_for_dev(INFO, 9, 9).is_none());
    }

    #[test]
    fn nfs_cache_time_from_mount_options() {
        let opts = |d| mount_for_dev(INFO, 0, d).unwrap().opts;
        assert_eq!(attr_cache_secs(opts(52)), 60, "defaults are not listed");
        assert_eq!(attr_cache_secs(opts(53)), 10);
        assert_eq!(attr_cache_secs(opts(54)), 0);
        assert_eq!(attr_cache_secs("rw,actimeo=3"), 3);
        assert_eq!(attr_cache_secs("rw,actimeo=3,acdirmax=30"), 30);
    }

    fn cfg(local: bool, cache_time: Option<Duration>) -> FsConfig {
        FsConfig {
            path: PathBuf::from("/mnt/a/x"),
            file_mode: None,
            group: None,
            local,
            cache_time,
        }
    }

    #[test]
    fn remote_filesystems_need_stale_after_above_their_cache() {
        let sshfs = Fs {
            name: "fuse.sshfs (127.0.0.1:/srv)".into(),
            remote: true,
            cache: None,
            client: None,
        };
        let s = Duration::from_secs;
        let dir = Path::new("/mnt/a");
        let e = check(&sshfs, dir, &cfg(false, None), s(3), true).unwrap_err();
        assert_eq!(e.kind(), crate::error::Kind::Config);
        assert!(e.message().contains("fuse.sshfs"), "{e}");
        assert!(e.message().contains("cache_time"), "{e}");
        assert!(check(&sshfs, dir, &cfg(false, None), s(61), true).is_ok());
        assert!(check(&sshfs, dir, &cfg(false, Some(s(1))), s(3), true).is_ok());
        assert!(check(&sshfs, dir, &cfg(true, None), s(3), true).is_ok());
        let e = check(&sshfs, dir, &cfg(false, None), s(3), false).unwrap_err();
        assert!(e.message().contains("flock(2)"), "{e}");
        assert!(check(&sshfs, dir, &cfg(true, None), s(3), false).is_ok());
    }

    #[test]
    fn gluster_client_caches_are_refused_whatever_the_timings() {
        let gluster = Fs {
            name: "fuse.glusterfs (10.0.0.1:v)".into(),
            remote: true,
            cache: None,
            client: Some(Err("… mount it with -o entry-timeout=0".into())),
        };
        let dir = Path::new("/mnt/g");
        let e = check(
            &gluster,
            dir,
            &cfg(false, Some(Duration::ZERO)),
            Duration::from_secs(60),
            true,
        )
        .unwrap_err();
        assert_eq!(e.kind(), crate::error::Kind::Config);
        assert!(e.message().contains("fuse.glusterfs"), "{e}");
        assert!(e.message().contains("entry-timeout=0"), "{e}");
        assert!(e.message().contains("local = true"), "{e}");
        assert!(
            check(
                &gluster,
                dir,
                &cfg(true, None),
                Duration::from_secs(3),
                true
            )
            .is_ok()
        );
    }

    #[test]
    fn gluster_keep_cache_from_the_clients_command_line() {
        let meta = |args: &str| format!("{{ \"Cmdlinestr\": \"glusterfs {args} /mnt/g\" }}");
        assert!(keep_cache_off(&meta("--fopen-keep-cache=off")));
        assert!(keep_cache_off(&meta("--fopen-keep-cache=false -N")));
        assert!(!keep_cache_off(&meta("")));
        assert!(!keep_cache_off(&meta("--fopen-keep-cache")));
        assert!(!keep_cache_off(&meta("--fopen-keep-cache -N")));
        assert!(!keep_cache_off(&meta("--fopen-keep-cache=on")));
        assert!(!keep_cache_off(&meta(
            "--fopen-keep-cache=off --fopen-keep-cache"
        )));
    }

    #[test]
    fn gluster_entry_timeout_from_the_clients_command_line() {
        let meta = |args: &str| {
            format!("{{ \n  \"Cmdlinestr\": \"glusterfs -N --volfile-id=v {args} /mnt/g\"\n}}")
        };
        assert!(entry_timeout_zero(&meta("--entry-timeout=0")));
        assert!(entry_timeout_zero(&meta(
            "--entry-timeout=0.0 --attribute-timeout=1"
        )));
        assert!(entry_timeout_zero(&meta("--entry-timeout 0")));
        assert!(entry_timeout_zero(&meta(
            "--entry-timeout=1 --entry-timeout=0"
        )));
        assert!(!entry_timeout_zero(&meta("")));
        assert!(!entry_timeout_zero(&meta("--entry-timeout=1")));
        assert!(!entry_timeout_zero(&meta(
            "--entry-timeout=0 --entry-timeout=1"
        )));
        assert!(!entry_timeout_zero(&meta("--attribute-timeout=0")));
        assert!(!entry_timeout_zero(&meta("--entry-timeout=x")));
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape("/mnt/a"), PathBuf::from("/mnt/a"));
        assert_eq!(
            unescape("/mnt/my\\040locks"),
            PathBuf::from("/mnt/my locks")
        );
        assert_eq!(
            unescape("/mnt/back\\134slash"),
            PathBuf::from("/mnt/back\\slash")
        );
        assert_eq!(unescape("/mnt/odd\\9"), PathBuf::from("/mnt/odd\\9"));
        assert_eq!(mount_for_dev(INFO, 0, 55).map(|m| m.point), Some("/mnt/a"));
    }

    #[test]
    fn suggested_cache_time_covers_the_measurement_with_room() {
        let ms = Duration::from_millis;
        assert_eq!(suggest_cache_time(ms(0)), Duration::from_secs(1));
        assert_eq!(suggest_cache_time(ms(5)), Duration::from_secs(1));
        assert_eq!(suggest_cache_time(ms(750)), Duration::from_secs(1));
        assert_eq!(suggest_cache_time(ms(1010)), Duration::from_secs(2));
        assert_eq!(suggest_cache_time(ms(20_300)), Duration::from_secs(26));
    }

    #[test]
    fn local_filesystems_pass() {
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        let fs = detect(dir.as_fd());
        assert!(!fs.remote, "{fs:?}");
        assert!(
            check(
                &fs,
                Path::new("/tmp"),
                &cfg(false, None),
                Duration::from_secs(1),
                false
            )
            .is_ok()
        );
    }
}
