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

/// mkdir, link, symlink (and every non-flock backend): if locksmith is killed, CMD dies with
/// it — and the lock is free (the holder is gone and proof of death breaks it at once).
#[test]
fn cmd_dies_with_a_killed_locksmith() {
    let sb = Sandbox::standard();
    for p in ["m", "l", "s"] {
        let mut c = sb.cmd(["run", p, "--", "sh", "-c", "echo $$; exec sleep 1000"]);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut r = Held::spawn(c);
        let cmd_pid: i32 = r.read_line(T).unwrap().trim().parse().unwrap();
        assert!(alive(cmd_pid), "{p}");
        kill9(r.pid());
        r.wait_exit(T);
        eventually(T, "CMD to die with locksmith", || !alive(cmd_pid));
        let o = sb.output(["--wait", "5", "run", p, "--", "true"]);
        assert_eq!(code(o.status), 0, "{p}: {}", stderr(&o));
    }
}

/// CMD starts as a shell would start it (issue 29 starts it without std's `fork`): an empty
/// signal mask, SIGPIPE at its default (locksmith ignores it), a file without `#!` run by
/// /bin/sh (as flock(1) and `execvp(3)` run it), `PATH` searched in order with a
/// non-executable match remembered (126) while later directories are tried.
#[test]
fn cmd_starts_with_default_signals_and_execvp_search() {
    let sb = Sandbox::standard();
    let script = sb.join("plain-script");
    std::fs::write(&script, "echo \"plain $1 $2\"\n").unwrap();
    chmod(&script, 0o755);
    let (first, second) = (sb.join("bin1"), sb.join("bin2"));
    for d in [&first, &second] {
        std::fs::create_dir(d).unwrap();
    }
    // bin1/tool is not executable, bin2/tool is: the search goes on to bin2.
    std::fs::write(first.join("tool"), "#!/bin/sh\necho first\n").unwrap();
    chmod(&first.join("tool"), 0o644);
    std::fs::write(second.join("tool"), "#!/bin/sh\necho second\n").unwrap();
    chmod(&second.join("tool"), 0o755);
    let both = format!("{}:{}", first.display(), second.display());
    let sys_path = std::env::var("PATH").unwrap_or_default();
    for p in LOCAL {
        // Run from a shell that ignores nothing: what CMD sees is locksmith's doing.
        let o = sb.output([
            "run",
            p,
            "--",
            "sh",
            "-c",
            "sed -n 's/^\\(SigBlk\\|SigIgn\\):[[:space:]]*//p' /proc/self/status",
        ]);
        let masks: Vec<u64> = stdout(&o)
            .lines()
            .map(|l| u64::from_str_radix(l.trim(), 16).unwrap())
            .collect();
        assert_eq!(masks.len(), 2, "{p}: {}", stderr(&o));
        assert_eq!(masks[0], 0, "{p}: CMD's signal mask is empty");
        assert_eq!(
            masks[1] & (1 << (libc::SIGPIPE - 1)),
            0,
            "{p}: SIGPIPE is not ignored in CMD"
        );
        let o = sb
            .cmd(["run", p, "--", "tool"])
            .env("PATH", format!("{both}:{sys_path}"))
            .output()
            .unwrap();
        assert_eq!(stdout(&o), "second\n", "{p}: {}", stderr(&o));
        let o = sb
            .cmd(["run", p, "--", "tool"])
            .env("PATH", first.as_os_str())
            .output()
            .unwrap();
        assert_eq!(
            code(o.status),
            126,
            "{p}: only a non-executable match: {}",
            stderr(&o)
        );
        let o = sb.output(["run", p, "--", script.to_str().unwrap(), "a", "b"]);
        assert_eq!(code(o.status), 0, "{p}: {}", stderr(&o));
        assert_eq!(
            stdout(&o),
            "plain a b\n",
            "{p}: a script without #! runs by /bin/sh"
        );
    }
    // Started by a parent that ignores SIGCHLD (inherited: the kernel would reap CMD before
    // locksmith saw its status), CMD's status still comes back, and the lock is freed.
    for p in LOCAL {
        let ignoring = ["perl", "-e", "$SIG{CHLD} = 'IGNORE'; exec @ARGV or die"];
        let o = sb
            .cmd_via(&ignoring, ["run", p, "--", "sh", "-c", "exit 3"])
            .output()
            .unwrap();
        assert_eq!(code(o.status), 3, "{p}: {}", stderr(&o));
        assert_eq!(stderr(&o), "", "{p}");
    }
    // flock(1) itself runs the script the same way.
    let o = std::process::Command::new("flock")
        .arg(sb.join("f1.lock"))
        .args([script.to_str().unwrap(), "a", "b"])
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "plain a b\n", "flock(1): {}", stderr(&o));
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

fn chmod(path: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}
