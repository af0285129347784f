//! The companion executable (src/companion.rs, issue 29): a `locksmith` built with the local
//! backends only — the Debian package's — hands a lock of any other backend to
//! `locksmith-net` by executing it in its own place, and keeps its local locks itself.
//!
//! The slim build is `$LOCKSMITH_SLIM` (`.ci/run`: the Debian package's `locksmith`,
//! target/release/locksmith after `packaging/build-deb`; by hand: `cargo build -p
//! locksmith-helper --no-default-features --bin locksmith --target-dir target/slim`); the
//! companion it hands to is the build under test, named by `$LOCKSMITH_NET`. Outside CI an
//! absent slim build is a visible SKIP; under `CI=true` it fails.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::redis::{sandbox, start};
use crate::support::*;

const T: Duration = Duration::from_secs(20);

fn slim() -> Option<String> {
    match std::env::var("LOCKSMITH_SLIM") {
        Ok(p) if !p.is_empty() => Some(p),
        _ => {
            missing(
                "LOCKSMITH_SLIM names no build of the local backends only",
                "cargo build -p locksmith-helper --no-default-features --bin locksmith --target-dir target/slim",
            );
            None
        }
    }
}

/// `slim --profiles FILE ARGS…` as [`Sandbox::cmd`] runs the build under test, its companion
/// `companion` (`$LOCKSMITH_NET`).
fn slim_cmd(slim: &str, companion: &str, sb: &Sandbox, args: &[&str]) -> Command {
    let mut c = Command::new(slim);
    c.env_remove("LOCKSMITH_PROFILES")
        .env_remove("LOCKSMITH_LOG")
        .env("LOCKSMITH_NET", companion)
        .arg("--profiles")
        .arg(&sb.profiles)
        .args(args)
        .stdin(Stdio::null());
    c
}

fn exe_of(pid: i32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).unwrap()
}

#[test]
fn a_slim_build_hands_a_network_lock_to_its_companion_in_its_own_place() {
    let Some(slim) = slim() else { return };
    let Some(r) = start() else { return };
    let sb = sandbox(&r);
    let address = format!("redis://{}:{}?key=t:r", r.host, r.port);
    // A profile whose lock is an address (`url = …`) too.
    let text = std::fs::read_to_string(&sb.profiles).unwrap();
    sb.write_profiles(&format!("{text}\n[profile.ru]\nurl = \"{address}\"\n"));
    for lock in ["r", "ru", address.as_str()] {
        let mut c = slim_cmd(&slim, bin(), &sb, &[lock]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut a = Held::spawn(c);
        let line = a.read_line(T).unwrap_or_else(|| panic!("{lock}: no line"));
        assert!(
            line.starts_with("OK ") && line.contains(" backend=redis "),
            "{line}"
        );
        // The same process, now the companion: the parent's pid and pipe are the holder's.
        assert_eq!(
            exe_of(a.pid()),
            std::fs::canonicalize(bin()).unwrap(),
            "{lock}"
        );
        let v = r.cli(&["GET", "t:r"]);
        assert!(v.contains(&format!(" pid={} ", a.pid())), "{v}");
        a.close_stdout();
        assert_eq!(code(a.wait_exit(T)), 0, "{}", a.stderr_text());
        assert_eq!(r.cli(&["EXISTS", "t:r"]), "0", "{lock}: released");
    }
    // `--version` says which backends the companion takes.
    let o = output_within(slim_cmd(&slim, bin(), &sb, &["--version"]), T);
    assert!(
        stdout(&o)
            .contains("backends: flock, mkdir, link, symlink, ftp, postgres, etcd, s3, redis\n"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("handed to "), "{}", stdout(&o));
}

/// Several locks, a local one first: the slim build loads the file lock, then hands the whole
/// command over at the redis lock; what `-v` says of each lock is said once, by the companion
/// (the slim build said the file lock's line before the hand-over, and the companion again).
#[test]
fn a_set_handed_over_says_each_lock_once() {
    let Some(slim) = slim() else { return };
    let Some(r) = start() else { return };
    let sb = sandbox(&r);
    let file = sb.join("a.lock").display().to_string();
    let o = output_within(
        slim_cmd(&slim, bin(), &sb, &["-v", "run", &file, "r", "--", "true"]),
        T,
    );
    let err = stderr(&o);
    assert_eq!(code(o.status), 0, "{err}");
    assert!(err.contains("handed to "), "{err}");
    for (what, n) in [("backend flock", 1), ("backend redis", 1)] {
        let said = err
            .lines()
            .filter(|l| l.contains(&format!(": {what}, ")))
            .count();
        assert_eq!(said, n, "{what}: {err}");
    }
}

#[test]
fn a_slim_build_keeps_its_local_locks_itself() {
    let Some(slim) = slim() else { return };
    let sb = Sandbox::new("[profile.f]\nbackend = \"flock\"\npath = \"{dir}/f.lock\"\n");
    let file = sb.join("a.lock").display().to_string();
    for lock in ["f", file.as_str()] {
        let mut c = slim_cmd(&slim, bin(), &sb, &[lock]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut a = Held::spawn(c);
        let line = a.read_line(T).unwrap_or_else(|| panic!("{lock}: no line"));
        assert!(line.contains(" backend=flock "), "{line}");
        assert_eq!(
            exe_of(a.pid()),
            std::fs::canonicalize(&slim).unwrap(),
            "{lock}"
        );
        a.close_stdout();
        assert_eq!(code(a.wait_exit(T)), 0, "{}", a.stderr_text());
    }
}

#[test]
fn a_slim_build_without_its_companion_says_so_and_takes_nothing() {
    let Some(slim) = slim() else { return };
    let sb = Sandbox::new(
        "[profile.r]\nbackend = \"redis\"\nhost = \"127.0.0.1\"\nport = 1\nkey = \"k\"\n",
    );
    let gone = sb.join("no-such-locksmith-net").display().to_string();
    for (lock, want) in [("r", 78), ("redis://127.0.0.1:1?key=k", 64)] {
        let o = output_within(slim_cmd(&slim, &gone, &sb, &["run", lock, "--", "true"]), T);
        assert_eq!(code(o.status), want, "{lock}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("backend `redis` was left out of this build")
                && err.contains(&format!("no {gone} found")),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // Named as its own companion: never executes itself again.
    let o = output_within(slim_cmd(&slim, &slim, &sb, &["run", "r", "--", "true"]), T);
    assert_eq!(code(o.status), 78, "{}", stderr(&o));
    assert!(stderr(&o).contains("is this very build"), "{}", stderr(&o));
    // A companion that leads back to the slim build (a wrapper): refused there, no loop.
    let wrapper = sb.join("locksmith-net");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {slim} \"$@\"\n")).unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let w = wrapper.display().to_string();
    let o = output_within(slim_cmd(&slim, &w, &sb, &["run", "r", "--", "true"]), T);
    assert_eq!(code(o.status), 78, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("handed over to this build already"),
        "{}",
        stderr(&o)
    );
}
