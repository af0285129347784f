//! Hold mode: the OK line and every release cause (SPEC §4).

use std::time::{Duration, Instant};

use crate::support::*;

const T: Duration = Duration::from_secs(10);
/// A generous correctness bound for "at once" (SPEC: 100 ms for local backends).
const AT_ONCE: Duration = Duration::from_secs(1);

#[test]
fn ok_line_is_byte_exact() {
    let sb = Sandbox::standard();
    let h = sb.hold(["f"]);
    // flock's first token is the clock's floor (issue 28: its state may be cleaned away),
    // and its line says so.
    let t = token_of(h.ok());
    assert_eq!(
        h.line.as_deref(),
        Some(format!("OK f backend=flock mode=exclusive token={t} token_from=clock\n").as_str())
    );
    // So are mkdir's, link's and symlink's (issue 28).
    let h2 = sb.hold(["m"]);
    let t = token_of(h2.ok());
    assert_eq!(
        h2.line.as_deref(),
        Some(format!("OK m backend=mkdir mode=exclusive token={t} token_from=clock\n").as_str())
    );
    drop(h2);
    // The next one issues from the state: nothing more to say.
    let h2 = sb.hold(["m"]);
    assert_eq!(
        h2.line.as_deref(),
        Some(format!("OK m backend=mkdir mode=exclusive token={}\n", t + 1).as_str())
    );
    let h3 = sb.hold(["--wait", "0", "--shared", "f"]);
    let l = h3.line.as_deref().unwrap();
    let me = std::process::id();
    assert!(
        l.starts_with("ERROR busy: lock `f` is held by host="),
        "a shared lock must not sit beside an exclusive one: {l:?}"
    );
    assert!(l.contains(&format!(" pid={} ppid={me}", h.pid())), "{l:?}");
}

#[test]
fn shared_flock_locks_overlap_and_exclude_writers() {
    let sb = Sandbox::standard();
    let r1 = sb.hold(["--shared", "f"]);
    let r2 = sb.hold(["--shared", "f"]);
    assert_eq!(r1.line.as_deref(), Some("OK f backend=flock mode=shared\n"));
    r2.ok();
    let o = sb.output(["--wait", "0", "f"]);
    assert_eq!(
        code(o.status),
        75,
        "a writer beside readers: {}",
        stdout(&o)
    );
}

/// Holder A, waiter B blocked behind it (its waiting notice seen); `release` ends A's hold;
/// returns how long B took to say OK, and checks A exited 0.
fn handoff(sb: &Sandbox, profile: &str, release: impl FnOnce(&mut Held)) -> Duration {
    let mut a = sb.hold([profile]);
    a.ok();
    let mut b = sb.spawn_hold(["--wait", "20s", profile]);
    b.wait_stderr("waiting for lock", T);
    assert!(b.line.is_none());
    let t0 = Instant::now();
    release(&mut a);
    assert!(b.read_line(T).is_some(), "waiter never got the lock");
    b.ok();
    let took = b.line_at.unwrap() - t0;
    let st = a.wait_exit(T);
    assert_eq!(code(st), 0, "holder exit: {}", a.stderr_text());
    took
}

#[test]
fn release_after_pipe_close() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let took = handoff(&sb, p, |a| a.close_stdout());
        assert!(took < AT_ONCE, "{p}: handoff took {took:?}");
    }
    assert!(!sb.join("m.lock").exists());
}

#[test]
fn release_on_sigterm_sigint_sighup() {
    let sb = Sandbox::standard();
    for (p, sig) in [
        ("f", 15),
        ("m", 15),
        ("m", 2),
        ("f", 1),
        ("l", 15),
        ("l", 1),
        ("s", 15),
        ("s", 2),
    ] {
        let took = handoff(&sb, p, |a| a.signal(sig));
        assert!(took < AT_ONCE, "{p} signal {sig}: handoff took {took:?}");
    }
}

#[test]
fn release_after_parent_sigkill() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let parent = perl_parent(&sb, p, false);
        parent.ok();
        let mut b = sb.spawn_hold(["--wait", "20s", p]);
        b.wait_stderr("waiting for lock", T);
        let t0 = Instant::now();
        kill9(parent.pid());
        assert!(b.read_line(T).is_some(), "{p}: waiter never got the lock");
        b.ok();
        let took = b.line_at.unwrap() - t0;
        assert!(took < AT_ONCE, "{p}: crash release took {took:?}");
    }
}

#[test]
fn release_after_parent_sigkill_while_grandchild_holds_pipe() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let mut parent = perl_parent(&sb, p, true);
        parent.ok();
        let gc_line = parent.read_line(T).expect("grandchild line");
        let gc: i32 = gc_line
            .trim()
            .strip_prefix("grandchild ")
            .unwrap()
            .parse()
            .unwrap();
        let mut b = sb.spawn_hold(["--wait", "20s", p]);
        b.wait_stderr("waiting for lock", T);
        let t0 = Instant::now();
        kill9(parent.pid());
        let got = b.read_line(T);
        kill9(gc);
        assert!(got.is_some(), "{p}: the pipe's other reader kept the lock");
        b.ok();
        let took = b.line_at.unwrap() - t0;
        assert!(took < AT_ONCE, "{p}: release took {took:?}");
    }
}

#[test]
fn watch_stdin_releases_on_eof_and_is_off_by_default() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        // Default: the parent's stdin reaching EOF decides nothing.
        let mut c = sb.cmd([p]);
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut a = Held::spawn(c);
        a.read_line(T);
        a.ok();
        drop(a.child.stdin.take());
        let o = sb.output(["--wait", "300ms", p]);
        assert_eq!(
            code(o.status),
            75,
            "{p}: stdin EOF released without --watch-stdin"
        );
        assert!(a.exited().is_none());

        // --watch-stdin: it does.
        let mut c = sb.cmd(["--watch-stdin", p]);
        c.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        drop(a);
        let mut w = Held::spawn(c);
        w.read_line(T);
        w.ok();
        let mut b = sb.spawn_hold(["--wait", "20s", p]);
        b.wait_stderr("waiting for lock", T);
        let t0 = Instant::now();
        drop(w.child.stdin.take());
        assert!(b.read_line(T).is_some());
        b.ok();
        assert!(b.line_at.unwrap() - t0 < AT_ONCE);
        assert_eq!(code(w.wait_exit(T)), 0);
    }
}

/// The seed's parent: `open L, "locksmith P |"; ... close L` — close returns promptly and
/// reports a clean exit.
#[test]
fn seed_style_perl_parent() {
    let sb = Sandbox::standard();
    let script = r#"
        my ($cmd) = @ARGV;
        open(L, "$cmd |") or die "spawn: $!";
        my $l = <L>;
        die "no lock: $l" unless $l =~ /^OK/;
        my $t0 = time;
        use Time::HiRes qw(time);
        $t0 = time;
        close(L);
        printf "closed status=%d ms=%.1f\n", $?, (time - $t0) * 1000;
    "#;
    for p in LOCAL {
        let cmd = format!("{} --profiles {} {p}", bin(), sb.profiles.display());
        let o = std::process::Command::new("perl")
            .arg("-e")
            .arg(script)
            .arg(&cmd)
            .output()
            .unwrap();
        let out = stdout(&o);
        assert!(o.status.success(), "{p}: {out} {}", stderr(&o));
        let ms: f64 = out.trim().rsplit("ms=").next().unwrap().parse().unwrap();
        assert!(out.starts_with("closed status=0 "), "{p}: {out}");
        assert!(ms < 1000.0, "{p}: close took {ms} ms");
        assert_eq!(
            code(sb.output(["--wait", "0", "run", p, "--", "true"]).status),
            0
        );
    }
}
