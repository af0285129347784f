//! Issue 28: the faults users meet on ordinary machines — long paths at the limits, descriptor
//! pressure, a full or read-only disk, a cleaner deleting a lock file under its holder.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(20);

/// Names in `dir`, sorted (hidden ones too).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A directory inside `root` whose path is `len` bytes long (components of at most 200).
fn deep_dir(root: &Path, len: usize) -> PathBuf {
    let mut p = root.to_path_buf();
    while p.as_os_str().len() < len {
        let left = len - p.as_os_str().len() - 1;
        p.push("d".repeat(left.min(200)));
    }
    fs::create_dir_all(&p).unwrap();
    assert_eq!(p.as_os_str().len(), len);
    p
}

/// Item 2: a lock whose path is close to `PATH_MAX` (its record longer than 4 KiB before the
/// fix). Each lock-directory backend takes it, holds it against a second contender, says
/// who holds it, and releases it: nothing is left but the token state. On main, link exited
/// 75 (it could not read back its own record) and left its lock file behind; mkdir and
/// symlink exited 74 (ENAMETOOLONG: the record did not fit in a symbolic link).
#[test]
fn long_paths_lock_and_release_on_every_lock_directory_backend() {
    let sb = Sandbox::new("");
    for scheme in ["link", "mkdir", "symlink"] {
        let name = format!("{scheme}.lock");
        // The whole path: 4,095 bytes, the longest accepted.
        let dir = deep_dir(&sb.join(scheme), 4095 - name.len() - 1);
        let addr = format!("{scheme}:{}/{name}", dir.display());
        let o = sb.output(["--wait", "0", "run", &addr, "--", "true"]);
        assert_eq!(code(o.status), 0, "{scheme}: {}", stderr(&o));
        assert_eq!(
            names(&dir),
            [format!(".{name}.state")],
            "{scheme}: left behind"
        );

        let mut h = sb.hold(["--wait", "0", &addr]);
        h.ok();
        let busy = sb.output(["--wait", "0", "run", &addr, "--", "true"]);
        assert_eq!(code(busy.status), 75, "{scheme}: {}", stderr(&busy));
        let st = sb.output(["status", &addr]);
        assert_eq!(code(st.status), 1, "{scheme}: {}", stderr(&st));
        assert!(
            stdout(&st).contains(&format!("pid={}", h.pid()))
                || stdout(&st).contains(&format!("pid {}", h.pid())),
            "{scheme}: status does not name the holder: {}",
            stdout(&st)
        );
        // Killed: its lock is judged dead by proof of death, and the next one takes it.
        kill9(h.pid());
        let _ = h.wait_exit(T);
        let mut next = sb.hold(["--wait", "5s", &addr]);
        assert!(
            next.ok().contains(" prev=crashed"),
            "{scheme}: {}",
            next.ok()
        );
        next.close_stdout();
        assert!(next.wait_exit(T).success());
        assert_eq!(
            names(&dir),
            [format!(".{name}.state")],
            "{scheme}: left behind"
        );
    }
}
