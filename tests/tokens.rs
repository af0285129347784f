//! Fencing tokens and prev=crashed (SPEC §6): each exclusive acquisition's token is greater
//! than every earlier one, across clean releases, kill -9 and breaks; prev=crashed appears
//! exactly when the previous acquisition did not end in locksmith's own release.

use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn mkdir_tokens_increase_and_crashes_are_reported() {
    tokens_increase_and_crashes_are_reported("m");
}

#[test]
fn link_tokens_increase_and_crashes_are_reported() {
    tokens_increase_and_crashes_are_reported("l");
}

#[test]
fn symlink_tokens_increase_and_crashes_are_reported() {
    tokens_increase_and_crashes_are_reported("s");
}

/// flock: the kernel frees a killed holder's lock at once; the state beside the file still
/// tells the next holder that the previous one did not release cleanly.
#[test]
fn flock_tokens_increase_and_crashes_are_reported() {
    tokens_increase_and_crashes_are_reported("f");
}

/// A shared (reader) acquisition reports the write epoch: the last exclusive token.
#[test]
fn shared_flock_reports_the_write_epoch() {
    let sb = Sandbox::standard();
    let w = sb.hold(["f"]);
    let t = token_of(w.ok());
    drop(w);
    let r = sb.hold(["--shared", "f"]);
    assert_eq!(
        r.ok(),
        format!("OK f backend=flock mode=shared token={t}\n")
    );
}

fn tokens_increase_and_crashes_are_reported(p: &str) {
    let sb = Sandbox::standard();
    let mut last = 0;
    let mut crashed_before = false;
    for i in 0..40 {
        let mut h = sb.hold(["--wait", "5s", p]);
        let line = h.ok().to_string();
        let t = token_of(&line);
        assert!(t > last, "round {i}: token {t} after {last}");
        last = t;
        assert_eq!(
            line.contains(" prev=crashed"),
            crashed_before,
            "round {i}: {line:?}"
        );
        // Pseudo-random but reproducible mix of clean releases and kill -9s.
        crashed_before = (i * 7 + 3) % 5 < 2;
        if crashed_before {
            kill9(h.pid());
            h.wait_exit(T);
        } else {
            h.close_stdout();
            assert_eq!(code(h.wait_exit(T)), 0);
        }
    }
    // State lives beside the lock, never inside it.
    assert!(std::fs::symlink_metadata(sb.join(&format!(".{p}.lock.state"))).is_ok());
}

#[test]
fn break_with_token_only_breaks_that_acquisition() {
    let sb = Sandbox::standard();
    let mut h = sb.hold(["m"]);
    let t = token_of(h.ok());
    kill9(h.pid());
    h.wait_exit(T);
    let o = sb.output(["break", "--token", &(t + 1).to_string(), "m"]);
    assert_eq!(
        code(o.status),
        75,
        "a wrong token breaks nothing: {}",
        stderr(&o)
    );
    assert!(sb.join("m.lock").exists());
    let o = sb.output(["break", "--token", &t.to_string(), "m"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(!sb.join("m.lock").exists());
    let next = sb.hold(["m"]);
    assert_eq!(token_of(next.ok()), t + 1);
    assert!(
        next.ok().contains(" prev=crashed"),
        "broken by `break`: {}",
        next.ok()
    );
}

#[test]
fn run_exports_the_token() {
    let sb = Sandbox::standard();
    let a = sb.output(["run", "m", "--", "sh", "-c", "echo $LOCKSMITH_TOKEN"]);
    let b = sb.output(["run", "m", "--", "sh", "-c", "echo $LOCKSMITH_TOKEN"]);
    assert_eq!((stdout(&a), stdout(&b)), ("1\n".into(), "2\n".into()));
}

/// A `.NAME.state` that is not the directory of LAYOUT.md (here a symlink in a pre-release
/// format, `locksmith-state v=1 token=N clean=C`) is something in the way: 78 naming it, no
/// lock taken, no token issued, the symlink left as it was. Every file backend.
#[test]
fn a_state_that_is_not_the_directory_is_in_the_way() {
    let sb = Sandbox::standard();
    for (p, n) in [("f", 41), ("m", 7), ("l", 1000), ("s", 3)] {
        let state = sb.join(&format!(".{p}.lock.state"));
        let text = format!("locksmith-state v=1 token={n} clean=1");
        std::os::unix::fs::symlink(&text, &state).unwrap();
        let o = sb.output(["--wait", "0", "run", p, "--", "true"]);
        let err = stderr(&o);
        assert_eq!(code(o.status), 78, "{p}: {err}");
        assert!(err.starts_with("ERROR config: lock state "), "{p}: {err}");
        assert!(err.contains("is a symbolic link"), "{p}: {err}");
        assert!(err.contains("remove it"), "{p}: {err}");
        assert_eq!(
            std::fs::read_link(&state).unwrap().to_str(),
            Some(text.as_str())
        );
        std::fs::remove_file(&state).unwrap();
        let h = sb.hold([p]);
        let t = token_of(h.ok());
        if p == "f" {
            // A new flock state starts at the clock's floor (issue 28): microseconds.
            assert!(t > 1_000_000_000_000_000, "{p}: {t}");
        } else {
            assert_eq!(t, 1, "{p}: tokens start at 1 once it is removed");
        }
    }
}
