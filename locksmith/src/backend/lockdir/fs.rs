//! Which filesystem a lock lives on and whether the profile may use it there: network and
//! FUSE filesystems, their caches (NFS mount options, an sshfs daemon's command line,
//! GlusterFS client options), and the rule that `stale_after` must exceed what a cache may
//! hide.

use std::ffi::OsStr;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::stat::{fstat, major, minor};
use nix::sys::statfs::fstatfs;

use super::config::FsConfig;
use crate::error::{Result, err};
use crate::settings::fmt_duration;

/// A filesystem whose cache time locksmith cannot read: how long it is assumed to serve
/// stale data unless the profile's `cache_time` says otherwise (NFS's default `acdirmax`).
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

/// A filesystem's name for messages: the mount's type (`fuse.sshfs`, `nfs4`, `ext4`) and
/// source, read from `/proc/self/mountinfo` only when a message needs it on a local
/// filesystem (issue 29: a lock taken on ext4 reads no mount table).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsName {
    name: std::sync::OnceLock<String>,
    /// `statfs(2)` type and device, to look the mount up.
    magic: u64,
    dev: Option<(u64, u64)>,
}

impl FsName {
    pub fn as_str(&self) -> &str {
        self.name.get_or_init(|| {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mount = self
                .dev
                .and_then(|(maj, min)| mount_for_dev(&info, maj, min));
            name_of(mount.as_ref(), family(self.magic), self.magic)
        })
    }
}

impl From<&str> for FsName {
    fn from(name: &str) -> FsName {
        FsName {
            name: std::sync::OnceLock::from(name.to_string()),
            magic: 0,
            dev: None,
        }
    }
}

impl std::fmt::Display for FsName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn name_of(mount: Option<&Mount<'_>>, family: Option<&str>, magic: u64) -> String {
    match (mount, family) {
        (Some(m), _) => format!("{} ({})", m.fstype, m.source),
        (None, Some(f)) => f.to_string(),
        (None, None) => format!("filesystem type {magic:#x}"),
    }
}

/// The filesystem a lock lives on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fs {
    /// For messages: the mount's type and source.
    pub name: FsName,
    /// Another machine (or a FUSE daemon) holds the data.
    pub remote: bool,
    /// How long it may serve stale data, where locksmith can read it: NFS's mount options,
    /// an sshfs mount's daemon's command line (`sshfs.rs`), a GlusterFS client's
    /// ([`gluster_cache_time`]).
    pub cache: Option<Duration>,
    /// On whose word `cache` is, or (without it) why it is unknown; empty where there is
    /// nothing to say (a local filesystem, an unknown FUSE filesystem).
    pub cache_how: String,
    /// Its client's caches, where locksmith checks them (GlusterFS): `Ok` with what was seen,
    /// or `Err` with why no heartbeat backend can keep SPEC §6 there whatever the timings
    /// (a fresh lookup answered with an old inode) and what to set.
    pub client: Option<std::result::Result<String, String>>,
}

/// Whether `fd` is on a network or FUSE filesystem, by `statfs(2)` type alone (what
/// [`detect`] says as `remote`, without reading `/proc/self/mountinfo`: issue 29, the flock
/// path reads no more than it needs).
pub fn is_remote(fd: BorrowedFd<'_>) -> bool {
    family(magic(fd)).is_some()
}

/// Whether directory `dir` is on a network or FUSE filesystem (`false` if it cannot be read).
pub fn is_remote_dir(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|s| family(s.filesystem_type().0 as u64 & 0xFFFF_FFFF).is_some())
}

/// The `statfs(2)` type of the filesystem `fd` is on (0 if it cannot be read).
fn magic(fd: BorrowedFd<'_>) -> u64 {
    fstatfs(fd).map_or(0, |s| s.filesystem_type().0 as u64 & 0xFFFF_FFFF)
}

/// The family of a network or FUSE filesystem of type `magic`; `None`: a local one.
fn family(magic: u64) -> Option<&'static str> {
    REMOTE.iter().find(|(m, _)| *m == magic).map(|(_, n)| *n)
}

/// What filesystem `fd` (a directory or file) is on, by `statfs(2)` type, named from
/// `/proc/self/mountinfo` (read here for a network or FUSE filesystem, whose mount says
/// more; for a local one only if a message names it).
pub fn detect(fd: BorrowedFd<'_>) -> Fs {
    let magic = magic(fd);
    let family = family(magic);
    let dev = fstat(fd)
        .ok()
        .map(|st| (major(st.st_dev), minor(st.st_dev)));
    let name = FsName {
        name: std::sync::OnceLock::new(),
        magic,
        dev,
    };
    if family.is_none() {
        return Fs {
            name,
            remote: false,
            cache: None,
            cache_how: String::new(),
            client: None,
        };
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mount = dev.and_then(|(maj, min)| mount_for_dev(&info, maj, min));
    let _ = name.name.set(name_of(mount.as_ref(), family, magic));
    let (cache, cache_how) = match (family, &mount) {
        (Some("NFS"), Some(m)) => (
            Some(Duration::from_secs(attr_cache_secs(m.opts))),
            "per its mount options".to_string(),
        ),
        (Some("NFS"), None) => (Some(UNKNOWN_CACHE), "NFS's default acdirmax".to_string()),
        (_, Some(m)) if m.fstype == "fuse.sshfs" => {
            let (maj, min) = dev.unwrap_or_default();
            match super::sshfs::mount_cache(&super::sshfs::Mount {
                point: &unescape(m.point),
                source: &unescape(m.source).to_string_lossy(),
                uid: user_id(m.opts),
                dev: &format!("{maj}:{min}"),
            }) {
                Ok((t, how)) => (Some(t), how),
                Err(why) => (None, why),
            }
        }
        _ => (None, String::new()),
    };
    let (client, (cache, cache_how)) = match &mount {
        Some(m) if m.fstype == "fuse.glusterfs" => match gluster_caches(&unescape(m.point)) {
            Ok((seen, t)) => (
                Some(Ok(seen)),
                (
                    Some(t),
                    "from its client's command line (.meta): the kernel's attribute and negative caches, names and content read fresh".to_string(),
                ),
            ),
            Err(why) => (Some(Err(why)), (cache, cache_how)),
        },
        _ => (None, (cache, cache_how)),
    };
    Fs {
        name,
        remote: family.is_some(),
        cache,
        cache_how,
        client,
    }
}

/// GlusterFS: whether a mount at `root` is safe for heartbeat locks (`Err`: why not, and what
/// to set; `Ok`: what was checked, and the mount's cache time — [`gluster_cache_time`]). A
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
fn gluster_caches(root: &Path) -> std::result::Result<(String, Duration), String> {
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
        return Ok((
            "--entry-timeout=0 --fopen-keep-cache=off, no md-cache, quick-read or io-cache (from .meta)"
                .into(),
            gluster_cache_time(&cmdline),
        ));
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

/// The cache time of a GlusterFS mount whose client caches neither names nor content (what
/// [`gluster_caches`] requires): what is left is the kernel's, as the client's command line
/// sets it — attributes (`--attribute-timeout`, 1 s by default) and absent names
/// (`--negative-timeout`, 0 by default) — both counted, in whole milliseconds rounded up.
/// A default profile (`stale_after` 60 s) then works on such a mount the first time (issue
/// 28 item 6), as on sshfs.
fn gluster_cache_time(cmdline: &str) -> Duration {
    let secs = |name: &str, default: f64| {
        client_option(cmdline, name)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
            .unwrap_or(default)
    };
    let total = secs("--attribute-timeout", 1.0) + secs("--negative-timeout", 0.0);
    Duration::from_millis((total * 1000.0).ceil().min(1e12) as u64)
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
/// the profile's `cache_time`, else what the mount says (NFS's mount options, an sshfs
/// daemon's command line), else [`UNKNOWN_CACHE`] (and why it is unknown, where known).
pub fn cache_time(fs: &Fs, cfg: &FsConfig) -> (Duration, String) {
    match (cfg.cache_time, fs.cache) {
        (Some(c), _) => (c, "as the profile's cache_time says".into()),
        (None, Some(c)) => (c, fs.cache_how.clone()),
        (None, None) if fs.cache_how.is_empty() => {
            (UNKNOWN_CACHE, "assumed: its cache time is unknown".into())
        }
        (None, None) => (
            UNKNOWN_CACHE,
            format!("assumed: its cache time is unknown, {}", fs.cache_how),
        ),
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

/// A filesystem without a call the backend needs (SMB through smbnetfs: `link(2)` EPERM,
/// `symlink(2)` ENOSYS): a config error (78) naming the call and what locks there.
pub fn missing_call(
    backend: &str,
    call: &str,
    lock: &Path,
    fs_name: &str,
    e: nix::errno::Errno,
) -> crate::error::Error {
    let on = if fs_name.is_empty() {
        String::new()
    } else {
        format!(" on {fs_name}")
    };
    err!(
        Config,
        "lock {}{on}: this filesystem has no {call}(2) ({e}), which backend \"{backend}\" needs; use backend \"mkdir\", which needs only mkdir(2) and exclusive creates",
        lock.display()
    )
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

/// [`check_dir_mode`] for a lock directory on `fs`. On a network filesystem the modes may be
/// the client's invention (smbnetfs shows every share's root 0777 and chmod does not change
/// it): the refusal says so, and what to do instead.
pub fn check_dir_mode_on(mode: u32, dir: &Path, fs: &Fs) -> Result<()> {
    match check_dir_mode(mode, dir) {
        Err(_) if fs.remote => Err(err!(
            Config,
            "directory {} on {} reads as writable by others and not sticky (mode {:04o}): anyone could remove the lock. A network filesystem's client may make modes up (smbnetfs shows a share's root as 0777 whatever the server allows, and chmod does not change it); who may write there is the server's say. If only the lock's users can write this share, keep the lock in a subdirectory of it (mkdir {}/locks), which reads as not writable by others; else chmod o-w or +t on the server",
            dir.display(),
            fs.name,
            mode & 0o7777,
            dir.display()
        )),
        r => r,
    }
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

/// The user who mounted a FUSE filesystem (its super options' `user_id=N`).
fn user_id(opts: &str) -> Option<u32> {
    opts.split(',')
        .find_map(|o| o.strip_prefix("user_id="))
        .and_then(|v| v.parse().ok())
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

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
            slot_of: None,
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
            cache_how: String::new(),
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
    fn a_cache_time_read_from_the_mount_counts_and_says_whence() {
        let s = Duration::from_secs;
        let dir = Path::new("/mnt/a");
        let read = Fs {
            name: "fuse.sshfs (127.0.0.1:/srv)".into(),
            remote: true,
            cache: Some(s(22)),
            cache_how: "per its sshfs process 7, sshfs's defaults: …".into(),
            client: None,
        };
        assert!(check(&read, dir, &cfg(false, None), s(23), true).is_ok());
        let e = check(&read, dir, &cfg(false, None), s(22), true).unwrap_err();
        assert!(e.message().contains("stale_after above 22s"), "{e}");
        assert!(e.message().contains("sshfs process 7"), "{e}");
        // The profile's word wins.
        assert!(check(&read, dir, &cfg(false, Some(s(1))), s(3), true).is_ok());
        let unseen = Fs {
            cache: None,
            cache_how: "no sshfs process serving /mnt/a can be seen here".into(),
            ..read
        };
        let e = check(&unseen, dir, &cfg(false, None), s(60), true).unwrap_err();
        assert!(e.message().contains("stale_after above 1m"), "{e}");
        assert!(e.message().contains("unknown, no sshfs process"), "{e}");
        assert!(check(&unseen, dir, &cfg(false, None), s(61), true).is_ok());
        assert_eq!(user_id("rw,user_id=1000,group_id=1000"), Some(1000));
        assert_eq!(user_id("rw,relatime"), None);
    }

    #[test]
    fn gluster_client_caches_are_refused_whatever_the_timings() {
        let gluster = Fs {
            name: "fuse.glusterfs (10.0.0.1:v)".into(),
            remote: true,
            cache: None,
            cache_how: String::new(),
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
    fn gluster_cache_time_from_the_clients_command_line() {
        let meta = |args: &str| format!("{{ \"Cmdlinestr\": \"glusterfs {args} /mnt/g\" }}");
        let ms = |args: &str| gluster_cache_time(&meta(args)).as_millis();
        assert_eq!(
            ms("--entry-timeout=0"),
            1000,
            "the kernel's 1 s attribute cache"
        );
        assert_eq!(ms("--attribute-timeout=0"), 0);
        assert_eq!(ms("--attribute-timeout=2.5 --negative-timeout=1"), 3500);
        assert_eq!(ms("--attribute-timeout 0.0001"), 1);
        assert_eq!(ms("--attribute-timeout=x"), 1000, "unreadable: the default");
        assert_eq!(ms("--attribute-timeout=-3"), 1000);
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
