//! What the tests against the real `locksmith` helper share: finding it, and a temporary
//! directory.

use std::fs;
use std::path::{Path, PathBuf};

/// The real helper, or `None` (a skip) when it is not built; a panic under `CI=true`.
pub fn helper() -> Option<PathBuf> {
    let path = match std::env::var_os("LOCKSMITH_BIN").filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("current_exe");
            // target/<profile>/deps/<test> → target/<profile>/locksmith
            exe.parent()
                .and_then(Path::parent)
                .expect("the test binary lives in target/<profile>/deps")
                .join("locksmith")
        }
    };
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "no locksmith helper at {} (run `cargo build -p locksmith-helper`, or set LOCKSMITH_BIN)",
        path.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    eprintln!("skipped: {why}");
    None
}

/// A fresh directory under cargo's per-target temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(name: &str) -> TempDir {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("netlock-test-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
