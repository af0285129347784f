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
    let a: u64 = stdout(&a).trim().parse().unwrap();
    let b: u64 = stdout(&b).trim().parse().unwrap();
    assert_eq!(b, a + 1);
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
        // A new state starts at the clock's floor (issue 28): microseconds.
        assert!(t > 1_000_000_000_000_000, "{p}: {t}");
    }
}

/// The clock's microseconds now: the floor below every token a new state issues.
fn micros_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Issue 28: a cleaner (systemd-tmpfiles) removes `.NAME.state/` while nobody holds the lock;
/// the next token is still greater than every earlier one — every file backend — and an OK
/// line whose token starts the state again from the clock says so (`token_from=clock`: the
/// promise then rests on a wall clock not set back), as the lock's first does; no other does.
#[test]
fn tokens_keep_increasing_after_a_cleaner_removes_the_state() {
    let sb = Sandbox::standard();
    let from_clock = |line: &str| line.trim_end().ends_with(" token_from=clock");
    for p in ["m", "l", "s", "f"] {
        let mut seen = Vec::new();
        for round in 0..3 {
            for k in 0..3 {
                let mut h = sb.hold(["--wait", "5s", p]);
                let line = h.ok().to_string();
                assert_eq!(
                    from_clock(&line),
                    round == 0 && k == 0,
                    "{p} round {round}: {line}"
                );
                seen.push(token_of(&line));
                h.close_stdout();
                assert_eq!(code(h.wait_exit(T)), 0);
            }
            // Lock free: the cleaner removes the state, as `rm -rf` does.
            let state = sb.join(&format!(".{p}.lock.state"));
            assert!(state.is_dir(), "{p}: no state at {}", state.display());
            std::fs::remove_dir_all(&state).unwrap();
            let before = micros_now();
            let h = sb.hold(["--wait", "5s", p]);
            assert!(from_clock(h.ok()), "{p} round {round}: {}", h.ok());
            let t = token_of(h.ok());
            let earlier = *seen.iter().max().unwrap();
            assert!(
                t > earlier,
                "{p} round {round}: token {t} after {earlier} (all: {seen:?})"
            );
            assert!(t > before, "{p}: token {t} below the clock {before}");
            seen.push(t);
        }
        assert!(seen.windows(2).all(|w| w[1] > w[0]), "{p}: tokens {seen:?}");
    }
}

/// A taker whose read of "no state" is old by the time it holds the name (it stalled longer
/// than `stale_after`, 1.5 s on these profiles, while taking) does not start the state from
/// that old read: it gives the name back, reads again and takes a token from the clock after
/// the stall — so a token issued and cleaned away meanwhile is never undercut.
#[test]
fn a_taker_stalled_with_no_state_takes_a_token_from_after_the_stall() {
    let sb = Sandbox::standard();
    for p in ["fast", "lfast", "sfast"] {
        let before = micros_now();
        let mut c = sb.cmd(["--wait", "10s", p]);
        c.env("LOCKSMITH_TEST_STALL_TAKING_MS", "2000")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut h = Held::spawn(c);
        let line = h
            .read_line(T)
            .unwrap_or_else(|| panic!("{p}: {}", h.stderr_text()));
        let t = token_of(&line);
        assert!(
            t > before + 1_900_000,
            "{p}: token {t} from the read before the stall (started {before})"
        );
        h.close_stdout();
        assert_eq!(code(h.wait_exit(T)), 0);
    }
}
