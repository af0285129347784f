//! The GlusterFS fixture ([`Gluster`]): a file written through one mount is read through the
//! other, and nothing of the fixture survives its drop.

use crate::support::*;
use std::fs;
use std::time::Instant;

#[test]
fn gluster_mounts_share_one_volume() {
    let t0 = Instant::now();
    let Some(g) = Gluster::start() else { return };
    let started = t0.elapsed();
    eprintln!("GlusterFS volume and two mounts up in {started:?}");

    fs::write(g.a.join("hello"), "from a\n").unwrap();
    assert_eq!(fs::read_to_string(g.b.join("hello")).unwrap(), "from a\n");
    assert_eq!(
        fs::read_to_string(g.server.join("hello")).unwrap(),
        "from a\n"
    );
    assert_eq!(g.server_listing(), ["hello"]);
    // One volume, two mounts: create is atomic across them.
    fs::create_dir(g.b.join("d")).unwrap();
    let e = fs::create_dir(g.a.join("d")).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists, "{e}");

    let (a, b, ns) = (g.a.clone(), g.b.clone(), g.netns.clone());
    let t1 = Instant::now();
    drop(g);
    eprintln!("... and gone in {:?}", t1.elapsed());
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    for m in [&a, &b] {
        assert!(
            !info.contains(&format!(" {} ", m.display())),
            "{m:?} still mounted"
        );
    }
    assert!(
        !a.exists() && !b.exists(),
        "the fixture's directories are left"
    );
    assert!(
        !std::path::Path::new("/run/netns").join(&ns).exists(),
        "network namespace {ns} is left"
    );
}
