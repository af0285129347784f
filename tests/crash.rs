//! locksmith itself dies (SPEC §6 layer b): on this host the lock is broken at once by
//! proof of death (a zombie counts as dead); from "another host" — another pid namespace, or
//! a forged record — only after `stale_after` of silence, and a live one never.

use std::fs;
use std::os::unix::fs::symlink;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::support::*;

const T: Duration = Duration::from_secs(10);

#[test]
fn killed_holder_on_this_host_is_broken_at_once() {
    let sb = Sandbox::standard();
    // Killed while a waiter blocks (the waiter watches the holder's pidfd) ...
    let a = sb.hold(["m"]);
    let first = token_of(a.ok());
    let mut w = sb.spawn_hold(["--wait", "20s", "m"]);
    w.wait_stderr("waiting for lock", T);
    let t0 = Instant::now();
    kill9(a.pid()); // not reaped yet: a zombie, which `kill(pid, 0)` would call alive
    let line = w.read_line(T).expect("waiter got nothing");
    let took = t0.elapsed();
    assert_eq!(
        line,
        format!(
            "OK m backend=mkdir mode=exclusive token={} prev=crashed\n",
            first + 1
        )
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    drop(w);
    // ... and killed with no waiter around: the next locker breaks it at once.
    let mut b = sb.hold(["m"]);
    b.ok();
    kill9(b.pid());
    b.wait_exit(T);
    let c = sb.hold(["--wait", "0", "m"]);
    assert_eq!(
        c.line.as_deref(),
        Some(
            format!(
                "OK m backend=mkdir mode=exclusive token={} prev=crashed\n",
                first + 3
            )
            .as_str()
        )
    );
}

#[test]
fn other_host_holder_is_broken_only_after_stale_after() {
    let sb = Sandbox::standard();
    let Some(a) = other_host_holder(&sb, "fast") else {
        return;
    };
    a.ok();
    // Alive and heartbeating: never broken, however long a waiter hammers (> 2 × stale_after).
    let o = sb.output(["--wait", "3500ms", "fast"]);
    assert_eq!(
        code(o.status),
        75,
        "a live holder was broken: {}",
        stdout(&o)
    );
    // Killed silently (the namespace's init dies, taking locksmith with it).
    let t0 = Instant::now();
    kill9(a.pid());
    let mut w = sb.hold(["--wait", "10s", "fast"]);
    let took = t0.elapsed();
    let line = w.line.clone();
    assert_eq!(
        line.as_deref().map(token_hidden).as_deref(),
        Some("OK fast backend=mkdir mode=exclusive token=T prev=crashed\n"),
        "{}",
        w.stderr_text()
    );
    // stale_after 1500ms, heartbeat 200ms, max_poll 100ms: [1.3 s, 1.8 s] plus slack.
    assert!(
        took >= Duration::from_millis(1300),
        "broken too early: {took:?}"
    );
    assert!(
        took < Duration::from_millis(3000),
        "broken too late: {took:?}"
    );
}

/// mkdir's owner entry on a local filesystem says only what proof of death needs (host tag,
/// pid, start time: the record itself is in `beat`), short enough for ext4 to keep the
/// symbolic link's target in its inode (issue 29). With `beat` gone (a cleaner), that entry
/// alone still tells a live holder (kept) from a killed one (broken at once).
#[test]
fn mkdir_owner_entry_alone_tells_a_live_holder_from_a_dead_one() {
    let sb = Sandbox::standard();
    let mut a = sb.hold(["m"]);
    a.ok();
    let lock = sb.join("m.lock");
    let owner = fs::read_dir(&lock)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("owner.")
        })
        .expect("an owner entry");
    let target = fs::read_link(&owner).unwrap();
    assert!(target.as_os_str().len() < 60, "{target:?}");
    fs::remove_file(lock.join("beat")).unwrap();
    let o = sb.output(["--wait", "0", "m"]);
    assert_eq!(
        code(o.status),
        75,
        "a live holder was broken: {}",
        stdout(&o)
    );
    assert!(
        stdout(&o).contains(&format!("pid={}", a.pid())),
        "{}",
        stdout(&o)
    );
    kill9(a.pid());
    a.wait_exit(T);
    let t0 = Instant::now();
    let o = sb.output(["--wait", "10s", "run", "m", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(!lock.exists());
}

fn forge(sb: &Sandbox, name: &str, record: &str) {
    let dir = sb.join(name);
    fs::create_dir(&dir).unwrap();
    symlink(record, dir.join("owner.0123456789abcdef")).unwrap();
}

#[test]
fn forged_foreign_record_waits_for_stale_after() {
    let sb = Sandbox::standard();
    forge(
        &sb,
        "fast.lock",
        "locksmith v=1 host=elsewhere pid=4242 ppid=1 start=1 boot=not-this-boot pidns=pid:[1] since=2026-01-01T00:00:00Z profile=fast nonce=0123456789abcdef",
    );
    let o = sb.output(["--wait", "0", "fast"]);
    assert!(stdout(&o).starts_with("ERROR busy: lock `fast` is held by host=elsewhere pid=4242 ppid=1 since=2026-01-01T00:00:00Z"), "{}", stdout(&o));
    let t0 = Instant::now();
    let mut w = sb.hold(["--wait", "10s", "fast"]);
    let took = t0.elapsed();
    assert_eq!(
        w.line.as_deref().map(token_hidden).as_deref(),
        Some("OK fast backend=mkdir mode=exclusive token=T prev=crashed token_from=clock\n")
    );
    assert!(took >= Duration::from_millis(1500), "{took:?}");
    w.wait_stderr("no heartbeat for 1s500ms", T);
}

#[test]
fn record_of_unknown_version_is_never_broken_without_force() {
    let sb = Sandbox::standard();
    forge(&sb, "fast.lock", "locksmith v=9 whatever=1");
    let o = sb.output(["--wait", "2500ms", "fast"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    let o = sb.output(["break", "fast"]);
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("only --force"), "{}", stderr(&o));
    let o = sb.output(["break", "--force", "fast"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(!sb.join("fast.lock").exists());
    assert_eq!(
        code(
            sb.output(["--wait", "0", "run", "fast", "--", "true"])
                .status
        ),
        0
    );
}

#[test]
fn ownerless_directory_is_broken_after_stale_after() {
    let sb = Sandbox::standard();
    fs::create_dir(sb.join("fast.lock")).unwrap(); // a plain `mkdir` locker that died
    let t0 = Instant::now();
    let w = sb.hold(["--wait", "10s", "fast"]);
    assert!(w.ok().starts_with("OK fast "));
    assert!(t0.elapsed() >= Duration::from_millis(1500));
}

/// Proof of death is about the whole process, not its main thread. A holder killed while one
/// of its threads is slow to go (locksmith closes its inotify instance on a thread: an SRCU
/// grace period, uninterruptible) shows `Z` in `/proc/PID/stat` — the main thread's state —
/// until that thread is gone, and a child it forked gets its parent-death signal only then: a
/// `run` helper killed between `fork` and its child's `PR_SET_PDEATHSIG` left a CMD that
/// passed the `getppid` check and ran beside the next holder's (the soak's "tokens not
/// strictly increasing"). Here the holder is a process whose main thread exited while
/// another thread sleeps: alive, never broken; once it exits, broken at once.
#[test]
fn holder_whose_main_thread_exited_while_a_thread_lives_is_alive() {
    let sb = Sandbox::standard();
    let script = "import ctypes, threading, time\n\
                  threading.Thread(target=time.sleep, args=(60,)).start()\n\
                  ctypes.CDLL(None).pthread_exit(None)\n";
    let Ok(mut p) = std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(Stdio::null())
        .spawn()
    else {
        missing(
            "no python3 to make a process whose main thread exited",
            ".ci/run installs python3",
        );
        return;
    };
    let pid = p.id() as i32;
    let stat = || {
        let text = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let f: Vec<String> = text[text.rfind(')').map_or(0, |i| i + 1)..]
            .split_whitespace()
            .map(String::from)
            .collect();
        // Fields 3 (state), 20 (threads), 22 (start time).
        (f[0].clone(), f[17].clone(), f[19].clone())
    };
    let t0 = Instant::now();
    while stat().0 != "Z" {
        assert!(t0.elapsed() < T, "main thread never exited: {:?}", stat());
        std::thread::sleep(Duration::from_millis(10));
    }
    let (_, threads, start) = stat();
    assert_eq!(threads, "2");
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let pidns = fs::read_link("/proc/self/ns/pid").unwrap();
    forge(
        &sb,
        "m.lock",
        &format!(
            "locksmith v=1 host=vm pid={pid} ppid=1 start={start} boot={} pidns={} since=2026-01-01T00:00:00Z profile=m nonce=0123456789abcdef",
            boot.trim(),
            pidns.display()
        ),
    );
    let o = sb.output(["--wait", "1s", "run", "m", "--", "true"]);
    assert_eq!(
        code(o.status),
        75,
        "a live holder was broken: {}",
        stderr(&o)
    );
    // Killed (not reaped: a zombie, now the last thread): broken at once.
    kill9(pid);
    let t0 = Instant::now();
    let o = sb.output(["--wait", "5s", "run", "m", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t0.elapsed()
    );
    assert!(stderr(&o).contains("it is dead"), "{}", stderr(&o));
    p.wait().unwrap();
}

/// A breaker of an older locksmith claimed a dead holder's acquisition by unlinking its
/// `owner.<nonce>` and was killed before freeing the name: the lock directory keeps the dead
/// holder's heartbeat record and no entry, and no claim can be won on it again. It is a
/// directory without a record, broken after `stale_after` of no change — not held forever
/// (seen in the soak).
#[test]
fn breaker_killed_between_claim_and_free_leaves_a_lock_broken_after_stale_after() {
    let sb = Sandbox::standard();
    let mut a = sb.hold(["fast"]);
    a.ok();
    kill9(a.pid());
    a.wait_exit(T);
    let lock = sb.join("fast.lock");
    let owners: Vec<_> = fs::read_dir(&lock)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("owner.")
        })
        .collect();
    assert_eq!(owners.len(), 1, "{owners:?}");
    fs::remove_file(&owners[0]).unwrap(); // the breaker's claim; then it died
    assert!(lock.join("beat").exists());
    let t0 = Instant::now();
    let o = sb.output(["--wait", "10s", "run", "fast", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1500),
        "broken at once: {took:?}"
    );
    assert!(
        stderr(&o).contains("no heartbeat for 1s500ms"),
        "{}",
        stderr(&o)
    );
}

/// A breaker claims by renaming the holder's entry to `claimed.<its nonce>`, its own record
/// left beside as `breaker.<its nonce>`. Killed before it frees the name (the soak killed
/// breakers there), it is the lock's holder as far as proof of death goes: a dead breaker is
/// broken at once, a live one never.
#[test]
fn breaker_killed_between_claim_and_free_is_broken_at_once() {
    let sb = Sandbox::standard();
    let mut a = sb.hold(["fast"]);
    a.ok();
    kill9(a.pid());
    a.wait_exit(T);
    let lock = sb.join("fast.lock");
    let owner = fs::read_dir(&lock)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("owner."))
        .expect("an owner entry");
    // The breaker: a process of this host, alive at first.
    let mut breaker = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = breaker.id();
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let start = text[text.rfind(')').unwrap() + 1..]
        .split_whitespace()
        .nth(19)
        .unwrap()
        .to_string();
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let pidns = fs::read_link("/proc/self/ns/pid").unwrap();
    let nonce = "00000000b4ea4e40";
    symlink(
        format!(
            "locksmith v=1 host=vm pid={pid} ppid=1 start={start} boot={} pidns={} since=2026-01-01T00:00:00Z profile=fast nonce={nonce}",
            boot.trim(),
            pidns.display()
        ),
        lock.join(format!("breaker.{nonce}")),
    )
    .unwrap();
    fs::rename(lock.join(&owner), lock.join(format!("claimed.{nonce}"))).unwrap();
    // Alive: never broken (> stale_after of waiting).
    let o = sb.output(["--wait", "2s", "run", "fast", "--", "true"]);
    assert_eq!(
        code(o.status),
        75,
        "a live breaker was broken: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains(&format!("pid={pid}")), "{}", stderr(&o));
    // Dead: broken at once.
    kill9(pid as i32);
    breaker.wait().unwrap();
    let t0 = Instant::now();
    let o = sb.output(["--wait", "5s", "run", "fast", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t0.elapsed()
    );
    assert!(stderr(&o).contains("it is dead"), "{}", stderr(&o));
    let left: Vec<_> = sb
        .listing()
        .into_iter()
        .filter(|n| n.contains("fast.lock"))
        .collect();
    assert!(
        left.iter()
            .all(|n| n.ends_with(".state") || n.ends_with(".queue") || n.ends_with(".waiting")),
        "{left:?}"
    );
}

/// The same on the path NFS users take (mkdir, then the record), forced by its debug switch.
#[test]
fn killed_holder_is_broken_at_once_with_plain_mkdir() {
    let sb = Sandbox::standard();
    let spawn = |args: &[&str]| {
        let mut c = sb.cmd(args);
        c.env("LOCKSMITH_MKDIR_PLAIN", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut h = Held::spawn(c);
        h.read_line(T);
        h
    };
    let mut a = spawn(&["m"]);
    let first = token_of(a.ok());
    kill9(a.pid());
    a.wait_exit(T);
    let b = spawn(&["--wait", "0", "m"]);
    assert_eq!(
        b.line.as_deref().map(token_hidden).as_deref(),
        Some("OK m backend=mkdir mode=exclusive token=T prev=crashed\n")
    );
    assert_eq!(token_of(b.ok()), first + 1, "{}", b.ok());
}

#[test]
fn killed_link_holder_is_broken_at_once() {
    let sb = Sandbox::standard();
    let a = sb.hold(["l"]);
    assert_eq!(
        a.line.as_deref().map(token_hidden).as_deref(),
        Some("OK l backend=link mode=exclusive token=T token_from=clock\n")
    );
    let first = token_of(a.ok());
    let mut w = sb.spawn_hold(["--wait", "20s", "l"]);
    w.wait_stderr("waiting for lock", T);
    let t0 = Instant::now();
    kill9(a.pid());
    let line = w.read_line(T).expect("waiter got nothing");
    assert_eq!(
        line,
        format!(
            "OK l backend=link mode=exclusive token={} prev=crashed\n",
            first + 1
        )
    );
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "took {:?}",
        t0.elapsed()
    );
    drop(w);
    let leftovers: Vec<_> = sb
        .listing()
        .into_iter()
        .filter(|n| n.contains(".tmp") || n.contains(".break"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A holder that stalls while taking the lock — here just after taking its fencing token, as
/// a network filesystem under load can — for longer than stale_after is silent to a waiter, which may
/// legally break in. The stalled one must then give the lock back and wait its turn: its
/// command never runs beside the breaker's, and commands run in fencing-token order. For
/// every file backend that heartbeats; the stalled holder is in another pid namespace, so
/// only silence can break it.
#[test]
fn holder_stalled_while_taking_the_lock_gives_it_back() {
    let Some(pidns) = other_pidns() else { return };
    let sb = Sandbox::standard();
    // Each critical section logs its start and end; the breaker's is long enough that a
    // stalled holder running its command as soon as it wakes would land inside it.
    let cs =
        r#"echo "start $LOCKSMITH_TOKEN" >> "$0"; sleep 3; echo "end $LOCKSMITH_TOKEN" >> "$0""#;
    for (p, lock) in [
        ("fast", "fast.lock"),
        ("lfast", "lfast.lock"),
        ("sfast", "sfast.lock"),
    ] {
        let log = sb.join(&format!("{p}.log"));
        let lock = sb.join(lock);
        let (w, h) = stalled_holder_then_waiter(
            &sb,
            pidns,
            p,
            ("LOCKSMITH_TEST_STALL_TAKEN_MS", "4000"),
            cs,
            || fs::symlink_metadata(&lock).is_ok(),
            cs,
            &log,
        );
        let herr = String::from_utf8_lossy(&h.stderr);
        let text = fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let tokens: Vec<u64> = lines
            .chunks(2)
            .map(|pair| {
                let (Some(s), Some(e)) = (
                    pair[0].strip_prefix("start "),
                    pair.get(1).and_then(|l| l.strip_prefix("end ")),
                ) else {
                    panic!("{p}: critical sections overlapped: {lines:?}");
                };
                assert_eq!(s, e, "{p}: critical sections overlapped: {lines:?}");
                s.parse().unwrap()
            })
            .collect();
        assert_eq!(tokens.len(), 2, "{p}: {lines:?}; stalled holder: {herr}");
        assert!(tokens[0] < tokens[1], "{p}: tokens out of order: {lines:?}");
        assert_eq!(code(w.status), 0, "{p}: breaker: {}", stderr(&w));
        assert_eq!(code(h.status), 0, "{p}: stalled holder: {herr}");
        assert!(
            herr.contains("too late to keep it"),
            "{p}: the stalled holder did not give the lock back: {herr}"
        );
    }
}

/// A heartbeat that stalls — a filesystem call that does not return, as on a network mount
/// whose server stops answering — must not keep the holder from stopping its command: by the
/// lease's point of no return `run` says LOST and kills CMD, before a waiter may legally break
/// in, although the stalled call returns only later. The waiter's critical section then never
/// sees the stalled holder's command still running. mkdir and link (their heartbeat is a
/// record file rewritten in place); the holder in another pid namespace.
#[test]
fn heartbeat_that_stalls_stops_the_command_before_a_waiter_may_break_in() {
    let Some(pidns) = other_pidns() else { return };
    let sb = Sandbox::new(
        r#"
[profile.m]
backend = "mkdir"
path = "{dir}/m.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "300ms"
stale_after = "3s"

[profile.l]
backend = "link"
path = "{dir}/l.lock"
poll = "20ms"
max_poll = "100ms"
keepalive = "300ms"
stale_after = "3s"
"#,
    );
    // The stalled holder's command ticks until it is stopped; the waiter's logs its start
    // and end.
    let ticks = r#"while :; do echo "tick $LOCKSMITH_TOKEN" >> "$0"; sleep 0.05; done"#;
    let cs =
        r#"echo "start $LOCKSMITH_TOKEN" >> "$0"; sleep 1; echo "end $LOCKSMITH_TOKEN" >> "$0""#;
    for p in ["m", "l"] {
        let log = sb.join(&format!("{p}.log"));
        let (w, h) = stalled_holder_then_waiter(
            &sb,
            pidns,
            p,
            ("LOCKSMITH_TEST_STALL_BEAT_MS", "8000"),
            ticks,
            || fs::read_to_string(&log).is_ok_and(|t| t.contains("tick")),
            cs,
            &log,
        );
        let herr = String::from_utf8_lossy(&h.stderr);
        let text = fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.starts_with("start "))
            .unwrap_or_else(|| panic!("{p}: the waiter's command never ran: {lines:?}"));
        assert!(
            lines[start..].iter().all(|l| !l.starts_with("tick")),
            "{p}: the stalled holder's command still ran inside the waiter's: {lines:?}"
        );
        assert!(
            lines[start + 1..]
                .first()
                .is_some_and(|l| l.starts_with("end ")),
            "{p}: {lines:?}"
        );
        let token = |l: &str| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
        assert!(token(lines[0]) < token(lines[start]), "{p}: {lines:?}");
        assert_eq!(code(w.status), 0, "{p}: waiter: {}", stderr(&w));
        assert_eq!(code(h.status), 74, "{p}: stalled holder: {herr}");
        assert!(
            herr.contains("ERROR lost: ") && herr.contains("has not returned"),
            "{p}: {herr}"
        );
    }
}

/// Runs `run P -- sh -c HOLDER_CS LOG` in the other pid namespace with the stall switch
/// `stall` set, waits until `ready` says it has got as far as the test needs, then runs a
/// waiter `run P -- sh -c CS LOG` here; returns both outputs (waiter, holder).
#[allow(clippy::too_many_arguments)]
fn stalled_holder_then_waiter(
    sb: &Sandbox,
    pidns: &[&str],
    p: &str,
    stall: (&str, &str),
    holder_cs: &str,
    ready: impl Fn() -> bool,
    cs: &str,
    log: &std::path::Path,
) -> (std::process::Output, std::process::Output) {
    let mut h = sb.cmd_via(
        pidns,
        ["-v", "--wait", "30s", "run", p, "--", "sh", "-c", holder_cs],
    );
    h.arg(log)
        .env(stall.0, stall.1)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let h = h.spawn().unwrap();
    let t0 = Instant::now();
    while !ready() {
        assert!(t0.elapsed() < T, "{p}: the stalled holder never got going");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut w = sb.cmd(["--wait", "30s", "run", p, "--", "sh", "-c", cs]);
    w.arg(log);
    let w = output_within(w, Duration::from_secs(60));
    (w, h.wait_with_output().unwrap())
}

/// A holder that stalls while taking the lock — just before it moves the token state on —
/// writes it late: after the breaker that took over and the holders after it wrote theirs.
/// The fencing tokens every critical section saw must still strictly increase in the order
/// they ran: a late state write must not make a token be issued twice. The stalled holder is
/// in another pid namespace (only silence breaks it); short holders here take the lock one
/// after another until it has finished, and twice more.
///
/// When the state was one name renamed over, the late write of token 1 rolled it back and
/// tokens 2, 3, … were issued again after ~600 (mkdir, link and symlink alike). Now the
/// state moves by renaming its exact name (`lockdir::state`): the late rename finds its name
/// gone, and the stalled holder says its token was overtaken and looks again.
#[test]
fn late_state_write_of_a_stalled_taker_never_reissues_a_token() {
    let Some(pidns) = other_pidns() else { return };
    let sb = Sandbox::standard();
    let cs = r#"echo "$LOCKSMITH_TOKEN" >> "$0""#;
    let mut problems = Vec::new();
    for (p, lock) in [
        ("fast", "fast.lock"),
        ("lfast", "lfast.lock"),
        ("sfast", "sfast.lock"),
    ] {
        let log = sb.join(&format!("{p}.tokens"));
        let lock = sb.join(lock);
        let mut h = sb.cmd_via(
            pidns,
            ["-v", "--wait", "30s", "run", p, "--", "sh", "-c", cs],
        );
        h.arg(&log)
            .env("LOCKSMITH_TEST_STALL_TAKING_MS", "4000")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut h = h.spawn().unwrap();
        let t0 = Instant::now();
        while fs::symlink_metadata(&lock).is_err() {
            assert!(t0.elapsed() < T, "{p}: the stalled holder never got going");
            std::thread::sleep(Duration::from_millis(5));
        }
        let short = || {
            let mut c = sb.cmd(["--wait", "30s", "run", p, "--", "sh", "-c", cs]);
            c.arg(&log);
            let o = output_within(c, Duration::from_secs(60));
            assert_eq!(code(o.status), 0, "{p}: a short holder: {}", stderr(&o));
        };
        let mut after = 0;
        while after < 2 {
            short();
            if h.try_wait().unwrap().is_some() {
                after += 1;
            }
        }
        let h = h.wait_with_output().unwrap();
        assert_eq!(code(h.status), 0, "{p}: stalled holder: {}", stderr(&h));
        assert!(
            stderr(&h).contains("was overtaken"),
            "{p}: the stalled holder's late state write was not refused: {}",
            stderr(&h)
        );
        let tokens: Vec<u64> = fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
            problems.push(format!(
                "{p}: token {} after {} ({} critical sections)",
                w[1],
                w[0],
                tokens.len()
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "a token was issued twice: {problems:#?}"
    );
}

/// Issue 28: a locker killed while its private `.NAME.<nonce>.new/` exists (prepared with its
/// records, not yet published) leaves it behind; the next acquisition removes it — proof of
/// death, the judge of every dead holder — but never a live locker's (it goes on to publish
/// and hold), nor another host's (its maker may be alive).
#[test]
fn a_killed_lockers_unpublished_directory_is_tidied_within_sixteen_acquisitions() {
    let sb = Sandbox::standard();
    let unpublished = || -> Vec<String> {
        sb.listing()
            .into_iter()
            .filter(|n| n.starts_with(".m.lock.") && n.ends_with(".new"))
            .collect()
    };
    let stalled = |ms: &str, wait: &str| {
        let mut c = sb.cmd(["--wait", wait, "m"]);
        c.env("LOCKSMITH_TEST_STALL_PUBLISHING_MS", ms)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        Held::spawn(c)
    };
    // The locker is stalled before its publish once its `.new` holds its owner entry.
    let prepared = |known: &[String]| -> String {
        let t0 = Instant::now();
        loop {
            let ready = unpublished().into_iter().find(|n| {
                !known.contains(n)
                    && fs::read_dir(sb.join(n)).is_ok_and(|mut d| {
                        d.any(|e| {
                            e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("owner."))
                        })
                    })
            });
            if let Some(n) = ready {
                return n;
            }
            assert!(t0.elapsed() < T, "no prepared .new: {:?}", sb.listing());
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let mut dead = stalled("60000", "0");
    let dead_new = prepared(&[]);
    kill9(dead.pid());
    dead.wait_exit(T);
    // Its name alone says its maker is dead (`.m.lock.<nonce>.<host>.<pid>.<start>.new`):
    // emptied of its records, it is still tidied.
    assert_eq!(
        dead_new.split('.').count(),
        8,
        "the maker is in the name: {dead_new}"
    );
    for e in fs::read_dir(sb.join(&dead_new)).unwrap() {
        fs::remove_file(e.unwrap().path()).unwrap();
    }
    let mut live = stalled("6000", "20s");
    let live_new = prepared(std::slice::from_ref(&dead_new));
    // Another host's, by its name (another host tag).
    let named_foreign = ".m.lock.0123456789abcdef.0000000000000000.999999.1.new";
    fs::create_dir(sb.join(named_foreign)).unwrap();
    // An unnamed one (older versions, names near NAME_MAX) whose record is of a dead process
    // of this host: judged by its record, removed.
    let unnamed_dead = ".m.lock.fedcba9876543210.new";
    fs::create_dir(sb.join(unnamed_dead)).unwrap();
    let boot = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let pidns = fs::read_link("/proc/self/ns/pid").unwrap();
    let gone = {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    symlink(
        format!(
            "locksmith v=1 host=here pid={gone} ppid=1 start=1 boot={} pidns={} since=2026-01-01T00:00:00Z profile=m nonce=fedcba9876543210",
            boot.trim(),
            pidns.display()
        ),
        sb.join(unnamed_dead).join("owner.fedcba9876543210"),
    )
    .unwrap();
    let foreign = ".m.lock.0123456789abcdef.new";
    fs::create_dir(sb.join(foreign)).unwrap();
    symlink(
        "locksmith v=1 host=elsewhere pid=4242 ppid=1 start=1 boot=not-this-boot pidns=pid:[1] since=2026-01-01T00:00:00Z profile=m nonce=0123456789abcdef",
        sb.join(foreign).join("owner.0123456789abcdef"),
    )
    .unwrap();

    // One acquisition in 16 looks (the one whose token is a multiple of 16: consecutive
    // acquisitions take consecutive tokens), so within 16 the dead locker's is gone.
    for tries in 1.. {
        let mut h = sb.hold(["--wait", "0", "m"]);
        h.ok();
        h.close_stdout();
        assert_eq!(code(h.wait_exit(T)), 0);
        let left = unpublished();
        assert!(left.contains(&live_new), "the live locker's: {left:?}");
        assert!(
            left.contains(&foreign.to_string()) && left.contains(&named_foreign.to_string()),
            "another host's: {left:?}"
        );
        if !left.contains(&dead_new) && !left.contains(&unnamed_dead.to_string()) {
            break;
        }
        assert!(tries < 16, "the dead locker's, after {tries}: {left:?}");
    }

    // The live locker goes on: it publishes, and holds.
    let line = live.read_line(Duration::from_secs(20));
    assert!(
        line.as_deref().is_some_and(|l| l.starts_with("OK m ")),
        "{line:?}: {}",
        live.stderr_text()
    );
    live.close_stdout();
    assert_eq!(code(live.wait_exit(T)), 0);
    assert_eq!(
        unpublished(),
        [named_foreign.to_string(), foreign.to_string()]
    );
}

/// Runs `locksmith ARGS` stalled in its publish (`LOCKSMITH_TEST_STALL_PUBLISHING_MS`), kills
/// it once `left` lists what it made, and returns that name.
fn killed_in_its_publish(sb: &Sandbox, args: &[&str], left: &dyn Fn() -> Vec<String>) -> String {
    let mut c = sb.cmd(args);
    c.env("LOCKSMITH_TEST_STALL_PUBLISHING_MS", "60000")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut killed = Held::spawn(c);
    let t0 = Instant::now();
    while left().is_empty() {
        assert!(
            t0.elapsed() < T,
            "{args:?}: nothing made: {:?}",
            sb.listing()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    kill9(killed.pid());
    killed.wait_exit(T);
    left().pop().unwrap()
}

/// A locker killed in its try leaves its would-be lock under its private name (mkdir's
/// `.m.lock.slot-K.<nonce>….new/`, link's `.l.lock.slot-K.<nonce>….tmp`): acquisitions of
/// the *other* slot remove it too, within 16. Before, only slot K's own holders looked for
/// slot K's leftovers (a CI run's GlusterFS mkdir test found a killed waiter's `.new` at its
/// end).
#[test]
fn a_killed_locker_s_leftover_is_tidied_by_another_slot_within_sixteen_acquisitions() {
    let sb = Sandbox::standard();
    for (p, suffix) in [("m", ".new"), ("l", ".tmp")] {
        let prefix = format!(".{p}.lock.slot-");
        let left = || -> Vec<String> {
            sb.listing()
                .into_iter()
                .filter(|n| n.starts_with(&prefix) && n.ends_with(suffix))
                .collect()
        };
        let slot_of = |h: &Held| crate::slots::field(h.ok(), "slot").map(str::to_string);
        for round in 1.. {
            let leftover = killed_in_its_publish(&sb, &["--slots", "2", "--wait", "0", p], &left);
            let k = leftover[prefix.len()..]
                .split('.')
                .next()
                .unwrap()
                .to_string();
            // Slot K held throughout, so that every acquisition after takes the other one.
            let (a, b) = (sb.hold(["--slots", "2", p]), sb.hold(["--slots", "2", p]));
            let (mut keep, mut other) = if slot_of(&a).as_deref() == Some(k.as_str()) {
                (a, b)
            } else {
                (b, a)
            };
            assert_eq!(slot_of(&keep), Some(k.clone()), "{p}");
            other.close_stdout();
            assert_eq!(code(other.wait_exit(T)), 0, "{p}");
            // Either holder may have been the one acquisition in 16 that looks (slot K's
            // own among them): then this round shows nothing, and another is made.
            if !left().contains(&leftover) {
                keep.close_stdout();
                assert_eq!(code(keep.wait_exit(T)), 0, "{p}");
                assert!(round < 5, "{p}: the holders' own look every time");
                continue;
            }
            for tries in 1.. {
                let mut h = sb.hold(["--slots", "2", "--wait", "0", p]);
                assert_ne!(slot_of(&h), Some(k.clone()), "{p}");
                h.close_stdout();
                assert_eq!(code(h.wait_exit(T)), 0, "{p}");
                if left().is_empty() {
                    break;
                }
                assert!(
                    tries < 16,
                    "{p}: {leftover} left after {tries}: {:?}",
                    sb.listing()
                );
            }
            keep.close_stdout();
            assert_eq!(code(keep.wait_exit(T)), 0, "{p}");
            break;
        }
    }
}

/// Names planted beside a link lock to look like its leftovers never hang an acquisition nor
/// reach past themselves: a FIFO and a directory named like unnamed `.tmp` files (judged by
/// their content locally: neither is a regular file, so neither is judged, and both stay), a
/// directory named like a dead maker's (not a file: `unlink` refuses it, it stays) and a
/// symbolic link put in place of a killed locker's own `.tmp` (a dead maker's name: the link
/// itself is removed, what it points at is untouched). 20 acquisitions, a look among them.
#[test]
fn planted_look_alikes_of_link_leftovers_hang_nothing_and_reach_nothing() {
    let sb = Sandbox::standard();
    let tmp = || -> Vec<String> {
        sb.listing()
            .into_iter()
            .filter(|n| n.starts_with(".l.lock.") && n.ends_with(".tmp"))
            .collect()
    };
    let dead = killed_in_its_publish(&sb, &["--wait", "0", "l"], &tmp);
    assert_eq!(
        dead.split('.').count(),
        8,
        "the maker is in the name: {dead}"
    );
    // The killed locker's own name, now a symbolic link to a file outside.
    let outside = sb.join("outside");
    fs::write(&outside, "keep me").unwrap();
    fs::remove_file(sb.join(&dead)).unwrap();
    symlink(&outside, sb.join(&dead)).unwrap();
    // A dead maker's name (another nonce) on a directory.
    let mut parts: Vec<String> = dead.split('.').map(str::to_string).collect();
    parts[3] = "fedcba9876543210".into();
    let dir = parts.join(".");
    fs::create_dir(sb.join(&dir)).unwrap();
    let fifo = ".l.lock.0123456789abcdef.tmp";
    nix::unistd::mkfifo(
        &sb.join(fifo),
        nix::sys::stat::Mode::from_bits_truncate(0o666),
    )
    .unwrap();
    let unnamed_dir = ".l.lock.00112233445566aa.tmp";
    fs::create_dir(sb.join(unnamed_dir)).unwrap();
    for _ in 0..20 {
        let o = output_within(sb.cmd(["--wait", "5s", "run", "l", "--", "true"]), T);
        assert_eq!(code(o.status), 0, "{}", stderr(&o));
    }
    let left = tmp();
    assert!(
        !left.contains(&dead),
        "the dead maker's link stays: {left:?}"
    );
    for stays in [&dir, &fifo.to_string(), &unnamed_dir.to_string()] {
        assert!(left.contains(stays), "{stays} went: {left:?}");
    }
    assert_eq!(fs::read_to_string(&outside).unwrap(), "keep me");
}

/// A tombstone a releaser could not remove (a file held open inside past its retries,
/// GlusterFS's passing ESTALE: the stop's CI of session 29 left one in a counter race) is
/// never the lock: the next look at the leftovers (one acquisition in 16) removes it, with the
/// records inside. Another lock's, a look-alike, one holding something not ours, a symbolic
/// link named like one and a lock directory named like one (an owner entry inside: a release
/// or a break moves that entry before the rename) stay, and what the link points to is not
/// touched.
#[test]
fn a_tombstone_left_behind_is_tidied_within_sixteen_acquisitions() {
    let sb = Sandbox::standard();
    // A directory with a heartbeat record and one entry, as a lock directory has.
    let plant = |dir: &str, entry: &str| {
        fs::create_dir(sb.join(dir)).unwrap();
        fs::write(
            sb.join(dir).join("beat"),
            "locksmith v=1 host=elsewhere pid=1\n",
        )
        .unwrap();
        symlink("x", sb.join(dir).join(entry)).unwrap();
    };
    let tomb = ".m.lock.0123456789abcdef.tomb";
    plant(tomb, "releasing.0123456789abcdef");
    let other_lock = ".m.lock.x.0123456789abcdef.tomb";
    let look_alike = ".m.lock.0123456789abcdeg.tomb";
    let not_ours = ".m.lock.fedcba9876543210.tomb";
    for d in [other_lock, look_alike, not_ours] {
        fs::create_dir(sb.join(d)).unwrap();
        fs::write(sb.join(d).join("beat"), "").unwrap();
    }
    fs::write(sb.join(not_ours).join("precious"), "keep").unwrap();
    let target = sb.join("target-dir");
    fs::create_dir(&target).unwrap();
    fs::write(target.join("beat"), "keep").unwrap();
    let linked = ".m.lock.00000000000000aa.tomb";
    symlink(&target, sb.join(linked)).unwrap();
    let a_lock = ".m.lock.1111111111111111.tomb";
    plant(a_lock, "owner.2222222222222222");
    let tombs = || -> Vec<String> {
        let mut v: Vec<String> = sb
            .listing()
            .into_iter()
            .filter(|n| n.starts_with(".m.lock.") && n.ends_with(".tomb"))
            .collect();
        v.sort();
        v
    };
    for tries in 1.. {
        let mut h = sb.hold(["--wait", "0", "m"]);
        h.ok();
        h.close_stdout();
        assert_eq!(code(h.wait_exit(T)), 0);
        if !tombs().contains(&tomb.to_string()) {
            break;
        }
        assert!(
            tries < 16,
            "the leftover tombstone, after {tries}: {:?}",
            tombs()
        );
    }
    let mut want = vec![linked, a_lock, look_alike, other_lock, not_ours];
    want.sort();
    assert_eq!(tombs(), want);
    assert_eq!(
        fs::read_to_string(sb.join(not_ours).join("precious")).unwrap(),
        "keep"
    );
    assert_eq!(fs::read_to_string(target.join("beat")).unwrap(), "keep");
    assert!(
        sb.join(a_lock).join("beat").exists(),
        "the lock named like a tombstone"
    );
}

/// In a pid namespace whose `/proc` is still the outer one's (`unshare -p -f` without
/// `--mount-proc`), `/proc/PID` shows the process the outer namespace numbers PID, not the
/// holder: a holder of this namespace is judged there by its heartbeat, as another host's
/// is. Before that, a killed holder's pid named a live kernel thread and its lock was never
/// breakable (`stale_after` or not), or named nothing and a live holder was broken at once.
/// Holder, a contender while it lives and the waiter after its kill -9 all run in that
/// namespace; mkdir, link and symlink (`stale_after` 1.5 s, keepalive 200 ms).
#[test]
fn a_pid_namespace_seeing_the_outer_proc_judges_by_heartbeat() {
    let Some(_) = other_pidns() else { return };
    let sb = Sandbox::standard();
    let script = r#"
bin=$1; profiles=$2; p=$3; out=$4
sleep 600 | "$bin" --profiles "$profiles" "$p" > "$out" 2>&1 &
holder=$!
until grep -q '^OK' "$out"; do sleep 0.02; done
"$bin" --profiles "$profiles" --wait 2500ms "$p" < /dev/null > /dev/null 2>&1
echo "live=$?"
kill -9 "$holder"
echo killed
exec "$bin" --profiles "$profiles" --wait 20s run "$p" -- true
"#;
    for p in ["fast", "lfast", "sfast"] {
        let out = sb.join(&format!("{p}.holder"));
        let mut c = std::process::Command::new("unshare");
        c.args(["--pid", "--fork", "--kill-child", "sh", "-c", script, "sh"])
            .arg(bin())
            .arg(&sb.profiles)
            .arg(p)
            .arg(&out)
            .env_remove("LOCKSMITH_PROFILES")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut h = Held::spawn(c);
        let live = h.read_line(Duration::from_secs(20));
        assert_eq!(
            live.as_deref(),
            Some("live=75\n"),
            "{p}: a live holder was not kept: {}",
            fs::read_to_string(&out).unwrap_or_default()
        );
        assert_eq!(h.read_line(T).as_deref(), Some("killed\n"), "{p}");
        let t0 = Instant::now();
        let st = h.wait_exit(Duration::from_secs(30));
        let took = t0.elapsed();
        assert_eq!(
            code(st),
            0,
            "{p}: the waiter did not get in: {}",
            h.stderr_text()
        );
        // Breakable once stale_after has passed since the last heartbeat (up to a keepalive
        // before the kill), never before; and not much later.
        assert!(
            took >= Duration::from_millis(1200) && took < Duration::from_secs(6),
            "{p}: took {took:?}"
        );
    }
}
