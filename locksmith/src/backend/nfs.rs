//! NFS attribute caching (SPEC §6): a client may answer `stat` from its cache for up to
//! `acregmax`/`acdirmax` seconds (60 by default), so a waiter on another client can miss a
//! holder's heartbeats for that long. A heartbeat-judged lock on NFS whose `stale_after` is not
//! above the mount's cache time could be broken while its holder is alive: such a profile is
//! refused (78), naming the mount options that would make it safe.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::Duration;

use nix::sys::stat::{fstat, major, minor};
use nix::sys::statfs::{NFS_SUPER_MAGIC, fstatfs};

use crate::error::{Result, err};

/// The Linux NFS client's default `acregmax` and `acdirmax`, in seconds.
const DEFAULT_MAX: u64 = 60;

/// Refuses a heartbeat-judged lock in directory `dir` if it is on NFS and `stale_after` is not
/// above the mount's attribute cache time. `local = true` locks are judged by proof of death
/// only, so they pass.
pub fn check(dir: BorrowedFd<'_>, shown: &Path, stale_after: Duration, local: bool) -> Result<()> {
    if local {
        return Ok(());
    }
    match fstatfs(dir) {
        Ok(fs) if fs.filesystem_type() == NFS_SUPER_MAGIC => {}
        _ => return Ok(()),
    }
    let Ok(st) = fstat(dir) else {
        return Ok(());
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let (source, opts) =
        mount_for_dev(&info, major(st.st_dev), minor(st.st_dev)).unwrap_or(("an NFS server", ""));
    let cache = attr_cache_secs(opts);
    if stale_after > Duration::from_secs(cache) {
        return Ok(());
    }
    Err(err!(
        Config,
        "lock directory {} is on NFS ({source}), whose attribute cache can hide a live holder's heartbeats for up to {cache} s; set stale_after above {cache}s, or mount with a shorter actimeo (or noac), or use local = true if every contender is on this host",
        shown.display()
    ))
}

/// The mount source and super options of the mount whose device is `major:minor`.
fn mount_for_dev(mountinfo: &str, maj: u64, min: u64) -> Option<(&str, &str)> {
    let want = format!("{maj}:{min}");
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.nth(2)? != want {
            return None;
        }
        let (_, tail) = line.split_once(" - ")?;
        let mut rest = tail.split(' ');
        let _fstype = rest.next()?;
        let source = rest.next()?;
        Some((source, rest.next().unwrap_or("")))
    })
}

/// The longest time, in seconds, a cached attribute may be served: `noac` 0, else the larger
/// of `acregmax` and `acdirmax` (the kernel lists them only when not at their defaults).
fn attr_cache_secs(opts: &str) -> u64 {
    let (mut reg, mut dir) = (DEFAULT_MAX, DEFAULT_MAX);
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
    use super::*;

    const INFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
95 22 0:52 / /mnt/locks rw,relatime shared:50 - nfs4 fs1:/export/locks rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.2,local_lock=none,addr=10.0.0.1
96 22 0:53 / /mnt/fast rw,relatime shared:51 - nfs fs2:/fast rw,vers=3,acregmax=5,acdirmax=10,hard
97 22 0:54 / /mnt/noac rw,relatime shared:52 - nfs fs3:/x rw,vers=3,noac,hard
";

    #[test]
    fn finds_the_mount_by_device() {
        assert_eq!(
            mount_for_dev(INFO, 0, 53).map(|(s, _)| s),
            Some("fs2:/fast")
        );
        assert_eq!(mount_for_dev(INFO, 9, 9), None);
    }

    #[test]
    fn cache_time_from_mount_options() {
        let opts = |d| mount_for_dev(INFO, 0, d).unwrap().1;
        assert_eq!(attr_cache_secs(opts(52)), 60, "defaults are not listed");
        assert_eq!(attr_cache_secs(opts(53)), 10);
        assert_eq!(attr_cache_secs(opts(54)), 0);
        assert_eq!(attr_cache_secs("rw,actimeo=3"), 3);
        assert_eq!(attr_cache_secs("rw,actimeo=3,acdirmax=30"), 30);
    }

    #[test]
    fn local_filesystems_pass() {
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        use std::os::fd::AsFd;
        assert!(
            check(
                dir.as_fd(),
                Path::new("/tmp"),
                Duration::from_secs(1),
                false
            )
            .is_ok()
        );
    }
}
