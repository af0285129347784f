//! What the FUSE network-filesystem fixtures ([`crate::sshfs`], [`crate::smb`]) share: a
//! mount's presence, tearing the mounts down, keeping a root that still has a mount in it,
//! and listing a directory on the server's side.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether a FUSE mount of type `fstype` (`fuse.sshfs`, `fuse.smbnetfs`) sits at `mnt`
/// (`/proc/self/mountinfo`: field 5 and the type after ` - `).
pub(crate) fn mounted(mnt: &Path, fstype: &str) -> bool {
    let want = mnt.to_string_lossy();
    let kind = format!(" - {fstype} ");
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines().any(|l| {
            let mut f = l.split(' ');
            f.nth(4) == Some(&*want) && l.contains(&kind)
        })
    })
}

/// Unmounts every mount (lazy: detached at once even if something still has a file open in
/// it), then ends each FUSE daemon: a mount namespace made meanwhile elsewhere (`unshare
/// --mount --propagation private`) holds a copy of the mount, and with it the FUSE
/// connection, so the daemon would not notice the unmount. SIGTERM ends its loop; past 5 s it
/// is killed.
pub(crate) fn unmount(mounts: &mut [(std::path::PathBuf, Child)]) {
    for (mnt, _) in mounts.iter() {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(mnt)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for (_, child) in mounts.iter() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    for (_, child) in mounts.iter_mut() {
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Removes the fixture's root directory only once nothing of type `fstype` is mounted in it
/// (else removing it would walk into the mount): one still there is left, and said.
pub(crate) fn remove_root(
    root: &mut Option<tempfile::TempDir>,
    mounts: &[(std::path::PathBuf, Child)],
    fstype: &str,
) {
    if let Some(root) = root.take()
        && mounts.iter().any(|(m, _)| mounted(m, fstype))
    {
        eprintln!(
            "{fstype} fixture: a mount under {} is still there; leaving it",
            root.path().display()
        );
        let _ = root.keep();
    }
}

/// The names in `dir`, sorted (none if it cannot be read).
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
