//! Run mode (SPEC §4 "run"): CMD's status, its environment, -E, signals, and CMD never
//! outliving the lock.

use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn exit_status_and_stdout_belong_to_cmd() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let o = sb.output(["run", p, "--", "sh", "-c", "echo hi; exit 7"]);
        assert_eq!(code(o.status), 7, "{p}");
        assert_eq!(stdout(&o), "hi\n", "{p}: stdout is CMD's alone");
        let o = sb.output(["run", p, "--", "sh", "-c", "kill -9 $$"]);
        assert_eq!(code(o.status), 128 + 9, "{p}: killed by a signal");
        let o = sb.output(["run", p, "--", "/nonexistent/cmd"]);
        assert_eq!(code(o.status), 127, "{p}: {}", stderr(&o));
        let o = sb.output(["run", p, "--", sb.profiles.to_str().unwrap()]);
        assert_eq!(code(o.status), 126, "{p}: not executable: {}", stderr(&o));
        // Nothing of the lock is left after any of these.
        assert_eq!(
            code(sb.output(["--wait", "0", "run", p, "--", "true"]).status),
            0
        );
    }
    assert!(!sb.join("m.lock").exists());
}

#[test]
fn cmd_sees_its_profile() {
    let sb = Sandbox::standard();
    let o = sb
        .cmd([
            "run",
            "m",
            "--",
            "sh",
            "-c",
            "echo $LOCKSMITH_PROFILE ${LOCKSMITH_TOKEN-none}",
        ])
        .env("LOCKSMITH_TOKEN", "stale-from-outside")
        .output()
        .unwrap();
    // A token from the clock's floor (issue 28), not the one from outside.
    let out = stdout(&o);
    let (profile, token) = out.trim().split_once(' ').unwrap_or_default();
    assert_eq!(profile, "m", "{}", stderr(&o));
    assert!(
        token.parse::<u64>().is_ok_and(|t| t > 1),
        "{out}: {}",
        stderr(&o)
    );
    let o = sb.output(["run", "f", "--", "sh", "-c", "echo ${LOCKSMITH_TOKEN-none}"]);
    // flock's first token is the clock's floor (issue 28: its state may be cleaned away).
    assert!(
        stdout(&o).trim().parse::<u64>().is_ok_and(|t| t > 1),
        "flock keeps tokens too: {}",
        stdout(&o)
    );
}

#[test]
fn busy_exits_75_or_the_conflict_code_without_running_cmd() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let h = sb.hold([p]);
        h.ok();
        let marker = sb.join("ran");
        let touch = format!("touch {}", marker.display());
        let o = sb.output(["--wait", "0", "run", p, "--", "sh", "-c", &touch]);
        assert_eq!(code(o.status), 75, "{p}");
        assert_eq!(stdout(&o), "", "errors go to stderr in run mode");
        assert!(
            stderr(&o).starts_with(&format!("ERROR busy: lock `{p}` is held by host=")),
            "{}",
            stderr(&o)
        );
        let o = sb.output(["--wait", "0", "-E", "3", "run", p, "--", "sh", "-c", &touch]);
        assert_eq!(code(o.status), 3, "{p}: -E");
        assert!(!marker.exists(), "CMD ran without the lock");
    }
}

#[test]
fn signals_are_forwarded_to_cmd() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let mut c = sb.cmd([
            "run",
            p,
            "--",
            "sh",
            "-c",
            "trap 'echo got-term; exit 9' TERM; echo ready; while :; do sleep 0.02; done",
        ]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut r = Held::spawn(c);
        assert_eq!(r.read_line(T).as_deref(), Some("ready\n"));
        r.signal(15);
        assert_eq!(r.read_line(T).as_deref(), Some("got-term\n"));
        assert_eq!(
            code(r.wait_exit(T)),
            9,
            "{p}: locksmith exits with CMD's status"
        );
        assert_eq!(
            code(sb.output(["--wait", "0", "run", p, "--", "true"]).status),
            0
        );
    }
}

/// mkdir (and every non-flock backend): if locksmith is killed, CMD dies with it.
#[test]
fn cmd_dies_with_a_killed_locksmith() {
    let sb = Sandbox::standard();
    let mut c = sb.cmd(["run", "m", "--", "sh", "-c", "echo $$; exec sleep 1000"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut r = Held::spawn(c);
    let cmd_pid: i32 = r.read_line(T).unwrap().trim().parse().unwrap();
    assert!(alive(cmd_pid));
    kill9(r.pid());
    r.wait_exit(T);
    eventually(T, "CMD to die with locksmith", || !alive(cmd_pid));
}

/// flock: CMD inherits the locked descriptor, so the lock lives exactly as long as CMD
/// (as with flock(1)), even if locksmith is killed.
#[test]
fn flock_lock_lives_as_long_as_cmd() {
    let sb = Sandbox::standard();
    let mut c = sb.cmd(["run", "f", "--", "sh", "-c", "echo $$; exec sleep 1000"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut r = Held::spawn(c);
    let cmd_pid: i32 = r.read_line(T).unwrap().trim().parse().unwrap();
    kill9(r.pid());
    r.wait_exit(T);
    assert!(alive(cmd_pid), "CMD keeps running, as under flock(1)");
    assert_eq!(
        code(sb.output(["--wait", "0", "f"]).status),
        75,
        "CMD still holds it"
    );
    kill9(cmd_pid);
    eventually(T, "the lock to be free once CMD is gone", || {
        code(sb.output(["--wait", "0", "run", "f", "--", "true"]).status) == 0
    });
}
