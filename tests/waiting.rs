//! Waiting for a busy lock: --wait 0, --wait D bounds, and a waiter that must stop at once
//! when its parent dies or closes the pipe (SPEC §4.5).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::support::*;

const T: Duration = Duration::from_secs(10);

/// With `-q` too: the busy line names the holder even where the waiting notice, not shown,
/// did not look (flock reads `/proc/locks` only for a line that shows it, issue 29).
#[test]
fn wait_zero_names_the_holder() {
    let sb = Sandbox::standard();
    for (p, quiet) in LOCAL.iter().flat_map(|p| [(*p, false), (*p, true)]) {
        let h = sb.hold([p]);
        h.ok();
        let args: &[&str] = if quiet {
            &["-q", "--wait", "0", p]
        } else {
            &["--wait", "0", p]
        };
        let o = sb.output(args);
        assert_eq!(code(o.status), 75);
        let line = stdout(&o);
        let want = format!(
            "ERROR busy: lock `{p}` is held by host={} pid={} ppid={}",
            nix::unistd::gethostname().unwrap().to_string_lossy(),
            h.pid(),
            std::process::id()
        );
        assert!(
            line.starts_with(&want),
            "{line:?} should start with {want:?}"
        );
        assert_eq!(line.lines().count(), 1);
        if p != "f" {
            assert!(line.contains(" since=20"), "mkdir records since: {line:?}");
        }
    }
}

/// A flock lock of 2 slots, both held: the busy line of a third names both holders (each
/// slot's, from `/proc/locks`, read for that line only), and so does the waiting notice.
#[test]
fn a_busy_flock_semaphore_names_every_holder() {
    let sb = Sandbox::standard();
    let a = sb.hold(["--slots", "2", "f"]);
    let b = sb.hold(["--slots", "2", "f"]);
    a.ok();
    b.ok();
    let pids = [a.pid(), b.pid()].map(|p| format!(" pid={p} "));
    let o = sb.output(["-q", "--wait", "0", "--slots", "2", "f"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    for pid in &pids {
        assert!(stdout(&o).contains(pid.as_str()), "{pid}: {}", stdout(&o));
    }
    let o = sb.output(["--wait", "300ms", "--slots", "2", "f"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    let notice = stderr(&o);
    assert!(notice.contains("waiting for lock `f`"), "{notice}");
    for pid in &pids {
        assert!(notice.contains(pid.as_str()), "{pid}: {notice}");
    }
}

/// A fair waiter behind another, on a flock lock: in line it does not try the lock, yet its
/// waiting notice names the holder (looked up for the notice only).
#[test]
fn a_fair_waiter_behind_another_names_the_holder() {
    let sb = Sandbox::standard();
    let h = sb.hold(["--fair", "f"]);
    h.ok();
    let pid = format!(" pid={} ", h.pid());
    let mut first = sb.spawn_hold(["--fair", "f"]);
    let line = first.wait_stderr("waiting for lock `f`", T);
    assert!(line.contains(&pid), "{line}");
    let mut second = sb.spawn_hold(["--fair", "f"]);
    let line = second.wait_stderr("waiting for lock `f`", T);
    assert!(line.contains(&pid), "{line}");
}

#[test]
fn wait_duration_gives_up_in_bounds() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let h = sb.hold([p]);
        h.ok();
        let t0 = Instant::now();
        let o = sb.output(["--wait", "1s", p]);
        let took = t0.elapsed();
        assert_eq!(code(o.status), 75, "{p}: {}", stdout(&o));
        assert!(
            stdout(&o).contains("gave up after waiting 1s"),
            "{}",
            stdout(&o)
        );
        // max_poll is 4s by default.
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_secs(6),
            "{p}: gave up after {took:?}"
        );
        assert!(
            stderr(&o).contains("waiting for lock"),
            "says once that it waits"
        );
        assert_eq!(stderr(&o).matches("waiting for lock").count(), 1);
    }
}

#[test]
fn quiet_waiter_says_nothing() {
    let sb = Sandbox::standard();
    let h = sb.hold(["m"]);
    h.ok();
    let o = sb.output(["-q", "--wait", "100ms", "m"]);
    assert_eq!(code(o.status), 75);
    assert_eq!(stderr(&o), "");
}

#[test]
fn waiter_stops_when_its_pipe_closes() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let h = sb.hold([p]);
        h.ok();
        let mut w = sb.spawn_hold(["--wait", "60s", p]);
        w.wait_stderr("waiting for lock", T);
        w.close_stdout();
        let st = w.wait_exit(Duration::from_secs(2));
        assert_eq!(code(st), 75, "{p}");
        drop(h);
        eventually(T, "lock free", || {
            code(sb.output(["--wait", "0", "run", p, "--", "true"]).status) == 0
        });
    }
}

/// The waiter's parent is SIGKILLed while the waiter is blocked: it exits 75 without ever
/// saying OK and leaves nothing behind. (This test process becomes a subreaper so it can
/// collect the orphaned waiter's exit status.)
#[test]
fn waiter_stops_when_its_parent_dies() {
    nix::sys::prctl::set_child_subreaper(true).unwrap();
    let sb = Sandbox::standard();
    for p in LOCAL {
        let mut h = sb.hold([p]);
        h.ok();
        let script = r#"
            my ($bin, $profiles, $name) = @ARGV;
            $| = 1;
            my $pid = open(L, "-|", $bin, "--profiles", $profiles, "--wait", "60s", $name) or die;
            print "pid $pid\n";
            my $l = <L>;
            print "got $l";
            sleep 1000;
        "#;
        let mut c = Command::new("perl");
        c.args(["-e", script, bin()])
            .arg(&sb.profiles)
            .arg(p)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut parent = Held::spawn(c);
        let line = parent.read_line(T).unwrap();
        let waiter: i32 = line.trim().strip_prefix("pid ").unwrap().parse().unwrap();
        parent.wait_stderr("waiting for lock", T);
        let t0 = Instant::now();
        kill9(parent.pid());
        let status = loop {
            // ECHILD until the parent's death has re-parented the waiter to us.
            match waitpid(Pid::from_raw(waiter), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(nix::errno::Errno::ECHILD) => {
                    assert!(
                        t0.elapsed() < T,
                        "waiter still waiting after its parent died"
                    );
                    std::thread::sleep(Duration::from_millis(2));
                }
                Ok(s) => break s,
                Err(e) => panic!("waitpid: {e}"),
            }
        };
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "took {:?}",
            t0.elapsed()
        );
        assert_eq!(status, WaitStatus::Exited(Pid::from_raw(waiter), 75), "{p}");
        assert_eq!(
            parent.read_line(Duration::from_millis(50)),
            None,
            "never said OK"
        );
        h.close_stdout();
        assert_eq!(code(h.wait_exit(T)), 0);
        if p != "f" {
            let lock = sb.join(&format!("{p}.lock"));
            assert!(
                std::fs::symlink_metadata(lock).is_err(),
                "nothing left behind"
            );
        }
    }
}
