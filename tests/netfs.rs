//! The file backends on a real network filesystem (issue 12): sshfs, one server directory
//! mounted twice ([`Sshfs`]). `sshfs_fixture_mounts_twice_and_cleans_up` checks the fixture
//! itself.

use crate::support::*;

/// The fixture itself: both mounts show the served directory, a write through a mount lands on
/// the server, and drop leaves nothing behind (no mount, no process, no directory).
#[test]
fn sshfs_fixture_mounts_twice_and_cleans_up() {
    let Some(fx) = Sshfs::start() else { return };
    std::fs::write(fx.server.join("hello"), "hi").unwrap();
    for m in ['a', 'b'] {
        let seen = std::fs::read_to_string(fx.mount_point(m).join("hello"));
        assert_eq!(seen.ok().as_deref(), Some("hi"), "through mount {m}");
    }
    std::fs::write(fx.b.join("from-b"), "b").unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.server.join("from-b")).unwrap(),
        "b"
    );
    let (a, b) = (fx.a.clone(), fx.b.clone());
    let root = a.parent().unwrap().to_path_buf();
    let pids = fx.processes();
    assert!(
        pids.len() >= 5,
        "sshfs ×2, socat, a fork per mount: {pids:?}"
    );
    drop(fx);
    assert!(!mounted(&a) && !mounted(&b), "a mount outlived the fixture");
    let left: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes outlived the fixture: {left:?}");
    assert!(!root.exists(), "{} outlived the fixture", root.display());
}
