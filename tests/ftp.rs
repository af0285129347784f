//! `backend = "ftp"` against real FTP servers: the pipe protocol, contention, races, crash
//! takeover after `stale_after` and never before, error kinds, and a server restart while
//! holding. Each body takes a `TestFtp`; `every_server!` makes the `#[test]`s for one server:
//! the embedded libunftp (`ftp_server.rs`, below in `libunftp`) and Debian's pure-ftpd and
//! vsftpd (`ftp_debian.rs`).

use std::fs;
use std::time::{Duration, Instant};

use crate::ftp_server::{FtpServer, PASSWORD, TestFtp};
use crate::support::*;

const T: Duration = Duration::from_secs(20);

/// `#[test]` wrappers that run suite bodies of this module against a server made by
/// `$start` (an `Option`: `None` skips, the fixture having said why).
macro_rules! ftp_suite {
    ($start:expr; $($t:ident),* $(,)?) => {$(
        #[test]
        fn $t() {
            let Some(mut srv) = $start else { return };
            crate::ftp::$t(&mut srv);
        }
    )*};
}
pub(crate) use ftp_suite;

/// The bodies that run against every server: this embedded one, and the Debian servers of
/// `ftp_debian.rs`.
macro_rules! every_server {
    ($start:expr) => {
        crate::ftp::ftp_suite!($start;
            ok_line_and_the_lock_directory_lives_exactly_while_held,
            uncontended_cycles_are_quick,
            second_locker_is_busy_and_names_the_holder,
            eight_racing_lockers_exactly_one_ok,
            counter_race_through_ftp_is_exact,
            error_kinds_wrong_password_closed_port_missing_parent,
            killed_holder_on_this_host_is_broken_at_once,
            silent_holder_from_another_host_is_broken_after_stale_after_and_not_before,
            other_host_holder_live_is_never_broken_killed_is_taken_over_after_stale_after,
            server_restart_while_holding_reconnects_and_release_works,
            break_a_stale_lock_and_refuse_a_live_one,
            a_file_in_the_way_is_config_and_no_permission_is_denied,
            the_password_never_shows_even_verbose,
            a_holder_whose_lock_was_broken_says_lost,
            tokens_increase_crashes_are_reported_and_break_takes_a_token,
            slots_admit_n_holders_and_no_more_with_rising_tokens,
            fair_line_is_served_in_order_and_a_killed_waiter_does_not_stall_it,
            a_waiter_keeps_its_number_of_slots_and_leaves_no_place,
            a_killed_waiter_s_place_goes_with_the_next_waiter,
            a_reader_is_refused_beside_a_waiter_of_another_number,
            a_newcomer_of_the_recorded_number_is_refused_beside_a_writer_behind_readers,
        );
    };
}
pub(crate) use every_server;

/// The suite against the embedded libunftp server.
mod libunftp {
    use crate::ftp_server::FtpServer;
    crate::ftp::every_server!(Some(FtpServer::start()));
    crate::ftp_shared::every_server_shared!(Some(FtpServer::start()));
    crate::ftp::ftp_suite!(Some(FtpServer::start_idle(1)); a_hold_outlives_the_server_idle_timeout);

    #[test]
    fn a_marker_whose_reply_is_lost_is_recognised_as_ours() {
        crate::ftp::a_marker_whose_reply_is_lost_is_recognised_as_ours(&mut FtpServer::start());
    }

    #[test]
    fn a_reader_registration_whose_reply_is_lost_is_recognised_as_ours() {
        crate::ftp::a_reader_registration_whose_reply_is_lost_is_recognised_as_ours(
            &mut FtpServer::start(),
        );
    }
}

/// [`sandbox`] plus profile `pr`: lock `locks/p` through `relay` (stale_after 30 s).
fn sandbox_via(srv: &dyn TestFtp, relay: &testkit::mute::Relay) -> Sandbox {
    let sb = sandbox(srv);
    let profiles = fs::read_to_string(sb.path().join("profiles.toml")).unwrap();
    sb.write_profiles(&format!(
        "{profiles}\n[profile.pr]\nbackend = \"ftp\"\nhost = \"127.0.0.1\"\nport = {}\n\
         user = \"{}\"\npassword = \"{PASSWORD}\"\npath = \"locks/p\"\nstale_after = \"30s\"\n",
        relay.port(),
        srv.user()
    ));
    sb
}

/// Issue 27, a reader: its registration lands while the server goes away (as in
/// [`a_marker_whose_reply_is_lost_is_recognised_as_ours`]); the server back, its next try
/// finds its reader marker by its nonce and holds shared — one reader marker, and nothing
/// left after its release. (A new nonce would have left that marker a live reader on this
/// host, keeping writers out until `stale_after`.)
pub fn a_reader_registration_whose_reply_is_lost_is_recognised_as_ours(srv: &mut dyn TestFtp) {
    let relay = testkit::mute::Relay::start(format!("127.0.0.1:{}", srv.port()).parse().unwrap());
    let sb = sandbox_via(srv, &relay);
    let mut a = sb.hold(["p"]);
    a.ok();
    // The readers' directory is there (else the first registration is refused, then made).
    srv.mkdir("locks/p.readers");
    let mut b = sb.spawn_hold(["--wait", "120s", "--shared", "pr"]);
    b.wait_stderr("waiting for lock", T);
    relay.fail_from(b"MKD locks/p.readers/reader~");
    a.close_stdout();
    assert_eq!(code(a.wait_exit(T)), 0);
    let pid = format!("~{}~", b.pid());
    let readers = || -> Vec<String> {
        fs::read_dir(srv.path("locks/p.readers"))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    };
    eventually(T, "the reader's marker landed", || {
        readers().iter().any(|m| m.contains(&pid))
    });
    let said = b.wait_stderr("no answer", Duration::from_secs(40));
    assert!(said.contains("still waiting"), "{said}");
    relay.restore();
    let line = b.read_line(T).expect("the reader got nothing");
    assert!(line.starts_with("OK pr backend=ftp mode=shared"), "{line}");
    let r = readers();
    assert_eq!(r.len(), 1, "{r:?}");
    assert!(r[0].contains(&pid), "{r:?}");
    b.close_stdout();
    assert_eq!(code(b.wait_exit(T)), 0);
    let err = b.stderr_text();
    assert!(
        err.contains("a reader marker of ours whose reply was lost"),
        "{err}"
    );
    assert!(readers().is_empty(), "{:?}", readers());
    assert!(!srv.path("locks/p").exists(), "lock left behind");
}

/// Issue 27: a take whose owner marker lands while the server goes away (a relay before it,
/// [`testkit::mute`], passes the marker's `MKD` on, then mutes every answer and refuses new
/// connections). The waiter's try gets no answer (10 s), its clean-up cannot reach the
/// server, it keeps waiting; the server back, its next try finds the marker by its nonce —
/// the same acquisition's — and takes it as its own: OK with the next token, no
/// `prev=crashed`, one marker, and its release leaves nothing. (A new nonce would have made
/// the marker a live holder on this host until `stale_after`, 30 s here.)
pub fn a_marker_whose_reply_is_lost_is_recognised_as_ours(srv: &mut dyn TestFtp) {
    let relay = testkit::mute::Relay::start(format!("127.0.0.1:{}", srv.port()).parse().unwrap());
    let sb = sandbox_via(srv, &relay);
    let mut a = sb.hold(["p"]);
    let t1 = token_of(a.ok());
    let mut b = sb.spawn_hold(["--wait", "120s", "pr"]);
    b.wait_stderr("waiting for lock", T);
    relay.fail_from(b"MKD locks/p/owner~");
    a.close_stdout();
    assert_eq!(code(a.wait_exit(T)), 0);
    let pid = format!("~{}~", b.pid());
    eventually(T, "the waiter's marker landed", || {
        markers(srv).iter().any(|m| m.contains(&pid))
    });
    let said = b.wait_stderr("no answer", Duration::from_secs(40));
    assert!(said.contains("still waiting"), "{said}");
    assert_eq!(b.line, None);
    relay.restore();
    let line = b.read_line(T).expect("the waiter got nothing");
    assert_eq!(
        line,
        format!("OK pr backend=ftp mode=exclusive token={}\n", t1 + 1)
    );
    let m = markers(srv);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].contains(&pid), "{m:?}");
    b.close_stdout();
    assert_eq!(code(b.wait_exit(T)), 0);
    let err = b.stderr_text();
    assert!(
        err.contains("an owner marker of ours whose reply was lost"),
        "{err}"
    );
    assert!(!srv.path("locks/p").exists(), "lock left behind");
    assert!(leftovers(srv).is_empty(), "litter: {:?}", leftovers(srv));
}

/// A sandbox whose profiles talk to `srv`: `p` (lock `locks/p`, short stale_after) and
/// a few broken variants.
pub fn sandbox(srv: &dyn TestFtp) -> Sandbox {
    let port = srv.port();
    let user = srv.user();
    Sandbox::new(&format!(
        r#"
[defaults]
poll = "20ms"
max_poll = "100ms"
keepalive = "200ms"
stale_after = "1500ms"

[profile.p]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
path = "locks/p"

[profile.race]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
path = "locks/p"
poll = "5ms"
max_poll = "25ms"

[profile.patient]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
path = "locks/p"
stale_after = "30s"
keepalive = "2s"

[profile.filepw]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password_file = "{{dir}}/ftp.pass"
path = "locks/p"

[profile.wrongpw]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "not-the-password"
path = "locks/p"

[profile.noparent]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
path = "missing/p"

[profile.closed]
backend = "ftp"
host = "127.0.0.1"
port = {closed}
user = "{user}"
password = "{PASSWORD}"
path = "locks/p"
"#,
        closed = closed_port(),
    ))
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn markers(srv: &dyn TestFtp) -> Vec<String> {
    match fs::read_dir(srv.path("locks/p")) {
        Err(_) => Vec::new(),
        Ok(d) => d
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
    }
}

/// What is left beside the lock, but for its fencing-token state (which stays, holding
/// exactly one entry).
fn leftovers(srv: &dyn TestFtp) -> Vec<String> {
    let state: Vec<String> = fs::read_dir(srv.path("locks/p.state"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(state.len() <= 1, "state entries: {state:?}");
    fs::read_dir(srv.path("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "p.state")
        .collect()
}

pub fn ok_line_and_the_lock_directory_lives_exactly_while_held(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut a = sb.hold(["p"]);
    let line = a.line.clone();
    assert_eq!(
        line.as_deref(),
        Some("OK p backend=ftp mode=exclusive token=1\n"),
        "{}",
        a.stderr_text()
    );
    assert!(srv.path("locks/p").is_dir());
    let m = markers(srv);
    assert_eq!(m.len(), 1, "{m:?}");
    assert!(m[0].starts_with("owner~1~"), "{m:?}");
    assert!(m[0].contains(&format!("~{}~", a.pid())), "{m:?}");
    // The heartbeat renames the marker (liveness visible without clocks).
    let first = m[0].clone();
    eventually(T, "the marker to be renamed by a heartbeat", || {
        let m = markers(srv);
        m.len() == 1 && m[0] != first
    });
    let t0 = Instant::now();
    a.close_stdout();
    assert_eq!(code(a.wait_exit(T)), 0, "{}", a.stderr_text());
    let took = t0.elapsed();
    assert!(!srv.path("locks/p").exists(), "lock left behind");
    assert!(leftovers(srv).is_empty(), "litter: {:?}", leftovers(srv));
    eprintln!(
        "ftp ({}): release after pipe close took {took:?}",
        srv.name()
    );
}

pub fn uncontended_cycles_are_quick(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut took: Vec<Duration> = (0..15)
        .map(|_| {
            let t0 = Instant::now();
            let o = sb.output(["--wait", "0", "run", "p", "--", "true"]);
            assert_eq!(code(o.status), 0, "{}", stderr(&o));
            t0.elapsed()
        })
        .collect();
    took.sort();
    eprintln!(
        "ftp ({}): `run p -- true` median {:?}",
        srv.name(),
        took[took.len() / 2]
    );
    assert!(took[took.len() / 2] < Duration::from_secs(1));
}

pub fn second_locker_is_busy_and_names_the_holder(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let a = sb.hold(["p"]);
    a.ok();
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.starts_with("ERROR busy: lock `p` is held by host="),
        "{out}"
    );
    assert!(out.contains(&format!(" pid={} ", a.pid())), "{out}");
    assert!(
        out.contains(&format!(" ppid={} ", std::process::id())),
        "{out}"
    );
    // status names the holder too; it exits 1 while held.
    let o = sb.output(["status", "--json", "p"]);
    assert_eq!(code(o.status), 1, "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains(&format!("\"pid\":{}", a.pid())), "{s}");
    assert!(s.contains("\"alive\":true"), "{s}");
    drop(a);
    eventually(T, "the lock to be released", || {
        !srv.path("locks/p").exists()
    });
    let o = sb.output(["status", "p"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}

pub fn eight_racing_lockers_exactly_one_ok(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    for round in 0..3 {
        let mut all: Vec<Held> = (0..8)
            .map(|_| sb.spawn_hold(["--wait", "0", "p"]))
            .collect();
        let mut oks = 0;
        for h in &mut all {
            match h.read_line(T) {
                Some(l) if l.starts_with("OK ") => oks += 1,
                Some(l) => assert!(l.starts_with("ERROR busy:"), "round {round}: {l}"),
                None => panic!("round {round}: no line: {}", h.stderr_text()),
            }
        }
        assert_eq!(oks, 1, "round {round}");
        drop(all);
        eventually(T, "the lock to be released", || {
            !srv.path("locks/p").exists()
        });
    }
}

/// Read, widen the window, write back; `set -C` makes `>` use O_EXCL for the marker.
const CRITICAL: &str = r#"
if ! (set -C; : > "$D/inside") 2>/dev/null; then echo overlap >> "$D/overlaps"; fi
n=$(cat "$D/counter")
i=0; while [ $i -lt 30 ]; do i=$((i+1)); done
echo $((n+1)) > "$D/counter"
rm -f "$D/inside"
"#;

pub fn counter_race_through_ftp_is_exact(srv: &mut dyn TestFtp) {
    const PROCS: usize = 4;
    const INCREMENTS: usize = 100;
    let sb = sandbox(srv);
    let d = sb.path().join("race");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("counter"), "0\n").unwrap();
    let t0 = Instant::now();
    let workers: Vec<_> = (0..PROCS)
        .map(|_| {
            let mut c = sb.cmd(["-q", "run", "race", "--", "sh", "-c", CRITICAL]);
            c.env("D", &d);
            std::thread::spawn(move || {
                for _ in 0..INCREMENTS {
                    let o = c.output().unwrap();
                    assert!(
                        o.status.success(),
                        "increment failed: {:?} {}",
                        o.status,
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let count: usize = fs::read_to_string(d.join("counter"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let overlaps = fs::read_to_string(d.join("overlaps")).map_or(0, |s| s.lines().count());
    eprintln!(
        "ftp ({}): {} locked increments in {:?}",
        srv.name(),
        PROCS * INCREMENTS,
        t0.elapsed()
    );
    assert_eq!(overlaps, 0, "two holders at once");
    assert_eq!(count, PROCS * INCREMENTS, "lost updates");
    assert!(!srv.path("locks/p").exists());
    assert!(leftovers(srv).is_empty(), "{:?}", leftovers(srv));
}

pub fn error_kinds_wrong_password_closed_port_missing_parent(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let o = sb.output(["-v", "--wait", "0", "wrongpw"]);
    assert_eq!(code(o.status), 77, "{} {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).starts_with("ERROR denied: "), "{}", stdout(&o));
    for text in [stdout(&o), stderr(&o)] {
        assert!(
            !text.contains("not-the-password"),
            "password leaked: {text}"
        );
    }
    let o = sb.output(["--wait", "0", "closed"]);
    assert_eq!(code(o.status), 69, "{} {}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).starts_with("ERROR unavailable: "),
        "{}",
        stdout(&o)
    );
    let o = sb.output(["--wait", "0", "noparent"]);
    assert_eq!(code(o.status), 78, "{} {}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("parent directory"), "{}", stdout(&o));
    assert!(!srv.path("missing").exists());
    // password_file must be private; then it works.
    let pw = sb.join("ftp.pass");
    fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&pw, fs::Permissions::from_mode(0o644)).unwrap();
    let o = sb.output(["--wait", "0", "run", "filepw", "--", "true"]);
    assert_eq!(code(o.status), 78, "{} {}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("chmod 600"), "{}", stderr(&o));
    fs::set_permissions(&pw, fs::Permissions::from_mode(0o600)).unwrap();
    let o = sb.output(["--wait", "0", "run", "filepw", "--", "true"]);
    assert_eq!(code(o.status), 0, "{} {}", stdout(&o), stderr(&o));
}

pub fn killed_holder_on_this_host_is_broken_at_once(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut a = sb.hold(["p"]);
    a.ok();
    let mut w = sb.spawn_hold(["--wait", "20s", "p"]);
    w.wait_stderr("waiting for lock", T);
    let t0 = Instant::now();
    kill9(a.pid());
    let line = w.read_line(T).expect("waiter got nothing");
    let took = t0.elapsed();
    assert_eq!(
        line,
        "OK p backend=ftp mode=exclusive token=2 prev=crashed\n"
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let _ = a.wait_exit(T);
}

/// A marker written straight into the server's directory, as a holder on another host
/// would leave it: waiters break it only after `stale_after` of silence.
pub fn silent_holder_from_another_host_is_broken_after_stale_after_and_not_before(
    srv: &mut dyn TestFtp,
) {
    let sb = sandbox(srv);
    srv.mkdir("locks/p");
    srv.mkdir(
        "locks/p/owner~1~0123456789abcdef~7~elsewhere~4242~1~1~not-this-boot~1~20260101T000000Z~p",
    );
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 75);
    assert!(
        stdout(&o).starts_with(
            "ERROR busy: lock `p` is held by host=elsewhere pid=4242 ppid=1 since=2026-01-01T00:00:00Z"
        ),
        "{}",
        stdout(&o)
    );
    let t0 = Instant::now();
    let mut w = sb.hold(["--wait", "10s", "p"]);
    let took = t0.elapsed();
    let line = w.line.clone();
    assert_eq!(
        line.as_deref(),
        Some("OK p backend=ftp mode=exclusive token=1 prev=crashed\n"),
        "{}",
        w.stderr_text()
    );
    assert!(
        took >= Duration::from_millis(1500),
        "broken too early: {took:?}"
    );
    assert!(took < Duration::from_secs(4), "broken too late: {took:?}");
    w.wait_stderr("no heartbeat for 1s500ms", T);
}

pub fn other_host_holder_live_is_never_broken_killed_is_taken_over_after_stale_after(
    srv: &mut dyn TestFtp,
) {
    let sb = sandbox(srv);
    let Some(a) = other_host_holder(&sb, "p") else {
        return;
    };
    a.ok();
    // Alive and heartbeating: never broken while a waiter hammers for > 2 × stale_after.
    let o = sb.output(["--wait", "3500ms", "p"]);
    assert_eq!(
        code(o.status),
        75,
        "a live holder was broken: {}",
        stdout(&o)
    );
    // Killed silently (the namespace's init dies, taking locksmith with it).
    let t0 = Instant::now();
    kill9(a.pid());
    let w = sb.hold(["--wait", "10s", "p"]);
    let took = t0.elapsed();
    assert_eq!(
        w.line.as_deref(),
        Some("OK p backend=ftp mode=exclusive token=2 prev=crashed\n")
    );
    // stale_after 1500ms, heartbeat 200ms, max_poll 100ms: [1.3 s, 1.8 s] plus slack.
    assert!(
        took >= Duration::from_millis(1300),
        "broken too early: {took:?}"
    );
    assert!(took < Duration::from_secs(3), "broken too late: {took:?}");
    eprintln!(
        "ftp ({}): takeover after a silent death took {took:?}",
        srv.name()
    );
}

pub fn server_restart_while_holding_reconnects_and_release_works(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut a = sb.hold(["-v", "p"]);
    a.ok();
    srv.restart();
    a.wait_stderr("reconnected to", T);
    assert!(a.exited().is_none(), "{}", a.stderr_text());
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    // Cut the control connection again and release at once: release reconnects.
    srv.restart();
    a.close_stdout();
    assert_eq!(code(a.wait_exit(T)), 0, "{}", a.stderr_text());
    assert!(!srv.path("locks/p").exists());
}

pub fn break_a_stale_lock_and_refuse_a_live_one(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let a = sb.hold(["p"]);
    a.ok();
    let o = sb.output(["break", "p"]);
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("alive"), "{}", stderr(&o));
    drop(a);
    eventually(T, "the lock to be released", || {
        !srv.path("locks/p").exists()
    });
    srv.mkdir("locks/p");
    // A marker left as a plain file (not what locksmith writes) is removed just as well.
    srv.write(
        "locks/p/owner~1~0123456789abcdef~0~elsewhere~4242~1~1~not-this-boot~1~20260101T000000Z~p",
        "",
    );
    let t0 = Instant::now();
    let o = sb.output(["break", "p"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(t0.elapsed() >= Duration::from_millis(1500));
    assert!(!srv.path("locks/p").exists());
}

pub fn a_file_in_the_way_is_config_and_no_permission_is_denied(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    srv.write("locks/p", "not a lock");
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 78, "{} {}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("a file is in the way"),
        "{}",
        stdout(&o)
    );
    fs::remove_file(srv.path("locks/p")).unwrap();
    // The server acts as us (embedded) or as its own user (Debian servers, started by root).
    let acts_as_root = srv
        .owner()
        .map_or(nix::unistd::geteuid().as_raw(), |(uid, _)| uid)
        == 0;
    if acts_as_root {
        eprintln!("SKIP: permission checks do not bind root");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(srv.path("locks"), fs::Permissions::from_mode(0o555)).unwrap();
    let o = sb.output(["--wait", "0", "p"]);
    fs::set_permissions(srv.path("locks"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(code(o.status), 77, "{} {}", stdout(&o), stderr(&o));
}

#[test]
fn ftps_explicit_verifies_the_certificate() {
    ftps_verifies_the_certificate_on("explicit", |leaf, key| {
        Some(FtpServer::start_tls(leaf, key))
    });
}

/// `start(leaf chain, leaf key)` starts a server that requires explicit FTPS.
/// FTPS (`mode`: explicit or implicit) with a private CA: `ca_file` works, the system CAs
/// refuse the test leaf (69, saying why), and the server really required TLS.
pub fn ftps_verifies_the_certificate_on<S: TestFtp>(
    mode: &str,
    start: impl FnOnce(&std::path::Path, &std::path::Path) -> Option<S>,
) {
    let certs = tempfile::tempdir().unwrap();
    let Some((ca, leaf, key)) = test_certs(certs.path()) else {
        return;
    };
    let Some(srv) = start(&leaf, &key) else {
        return;
    };
    let port = srv.port();
    let user = srv.user();
    let sb = Sandbox::new(&format!(
        r#"
[profile.tls]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
tls = "{mode}"
ca_file = "{ca}"
path = "locks/p"

[profile.untrusted]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
tls = "{mode}"
path = "locks/p"

[profile.plain]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
path = "locks/p"
"#,
        ca = ca.display()
    ));
    let mut a = sb.hold(["tls"]);
    let line = a.line.clone();
    assert_eq!(
        line.as_deref(),
        Some("OK tls backend=ftp mode=exclusive token=1\n"),
        "{}",
        a.stderr_text()
    );
    assert!(srv.path("locks/p").is_dir());
    // A second locker over TLS lists the lock (a TLS data connection) and names the holder.
    let o = sb.output(["--wait", "0", "tls"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    assert!(
        stdout(&o).contains(&format!(" pid={} ", a.pid())),
        "{}",
        stdout(&o)
    );
    a.close_stdout();
    assert_eq!(code(a.wait_exit(T)), 0, "{}", a.stderr_text());
    assert!(!srv.path("locks/p").exists());
    // Without the private CA: verification fails, 69, and the message says so.
    let o = sb.output(["--wait", "0", "untrusted"]);
    assert_eq!(code(o.status), 69, "{}", stdout(&o));
    assert!(stdout(&o).contains("TLS"), "{}", stdout(&o));
    assert!(stdout(&o).contains("ca_file"), "{}", stdout(&o));
    // The server requires TLS: a plain login is refused (so the first run really used TLS).
    // (Implicit FTPS cannot be spoken to in plain at all: nothing to try there.)
    if mode == "explicit" {
        let o = sb.output(["--wait", "0", "plain"]);
        assert_ne!(code(o.status), 0, "{}", stdout(&o));
    }
}

/// `srv` closes sessions idle for 1 s.
pub fn a_hold_outlives_the_server_idle_timeout(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut a = sb.hold(["-v", "p"]);
    a.ok();
    // Three idle timeouts: the heartbeat (every 200ms) keeps the session busy.
    std::thread::sleep(Duration::from_millis(3200));
    assert!(a.exited().is_none(), "{}", a.stderr_text());
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    a.close_stdout();
    assert_eq!(code(a.wait_exit(T)), 0, "{}", a.stderr_text());
    let err = a.stderr_text();
    assert!(
        !err.contains("reconnected"),
        "the session was dropped: {err}"
    );
    assert!(!srv.path("locks/p").exists());
}

#[test]
fn ftp_profiles_are_validated_and_secrets_stay_hidden() {
    let sb = Sandbox::new(
        r#"
[profile.ok]
backend = "ftp"
host = "127.0.0.1"
port = 9
user = "u"
password_env = "SOME_VAR_THAT_IS_NOT_SET"
path = "a/b"

[profile.implicit]
backend = "ftp"
host = "h"
user = "u"
tls = "implicit"
path = "p"

[profile.cawithout]
backend = "ftp"
host = "h"
user = "u"
ca_file = "ca.pem"
path = "p"

[profile.twopw]
backend = "ftp"
host = "h"
user = "u"
password = "x"
password_env = "Y"
path = "p"

[profile.badpath]
backend = "ftp"
host = "h"
user = "u"
path = "../p"

[profile.badport]
backend = "ftp"
host = "h"
port = 70000
user = "u"
path = "p"

[profile.unknown]
backend = "ftp"
host = "h"
user = "u"
path = "p"
file_mode = "0600"
"#,
    );
    let o = sb.output(["profiles"]);
    let out = stdout(&o);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name}\t")))
            .unwrap_or_else(|| panic!("{name} missing: {out}"))
            .to_string()
    };
    assert_eq!(line("ok"), "ok\tftp", "{out}");
    assert_eq!(line("implicit"), "implicit\tftp", "{out}");
    assert!(line("cawithout").contains("ca_file"), "{out}");
    assert!(line("twopw").contains("only one"), "{out}");
    assert!(line("badpath").contains("`path`"), "{out}");
    assert!(line("badport").contains("`port`"), "{out}");
    assert!(line("unknown").contains("unknown key `file_mode`"), "{out}");
    // The password variable is read only when connecting: a clear config error then.
    let o = sb.output(["--wait", "0", "ok"]);
    assert_eq!(code(o.status), 78, "{}", stdout(&o));
    assert!(
        stdout(&o).contains("SOME_VAR_THAT_IS_NOT_SET"),
        "{}",
        stdout(&o)
    );
}

pub fn the_password_never_shows_even_verbose(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let o = sb.output(["-vvv", "run", "p", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains(PASSWORD), "{}", stderr(&o));
    assert!(!stdout(&o).contains(PASSWORD), "{}", stdout(&o));
}

pub fn a_holder_whose_lock_was_broken_says_lost(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut a = sb.hold(["p"]);
    a.ok();
    let o = sb.output(["break", "--force", "p"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let line = a.read_line(T).expect("no LOST line");
    assert!(line.starts_with("LOST "), "{line}");
    assert_eq!(code(a.wait_exit(T)), 74, "{}", a.stderr_text());
}

/// Fencing tokens over FTP (`PARENT/NAME.state/state~1~TOKEN~CLEAN`): strictly increasing,
/// `prev=crashed` after a kill -9, shown by `status`, exported by `run`, and
/// `break --token N` breaks only acquisition N.
pub fn tokens_increase_crashes_are_reported_and_break_takes_a_token(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let mut last = 0;
    let mut crashed_before = false;
    for i in 0..8 {
        let mut h = sb.hold(["-vv", "--wait", "5s", "p"]);
        if !h.line.as_deref().unwrap_or("").starts_with("OK") {
            h.wait_exit(T);
            let l = h.line.clone();
            panic!("{l:?} {}", h.stderr_text());
        }
        let line = h.ok().to_string();
        let t = token_of(&line);
        assert!(t > last, "round {i}: token {t} after {last}");
        last = t;
        assert_eq!(
            line.contains(" prev=crashed"),
            crashed_before,
            "round {i}: {line:?}"
        );
        if i == 0 {
            let o = sb.output(["status", "--json", "p"]);
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            assert_eq!(v["holders"][0]["token"], t, "{v}");
        }
        crashed_before = i % 3 == 1;
        if crashed_before {
            kill9(h.pid());
            h.wait_exit(T);
        } else {
            h.close_stdout();
            assert_eq!(code(h.wait_exit(T)), 0, "{}", h.stderr_text());
        }
    }
    assert!(
        !srv.path("locks/p").exists() || crashed_before,
        "a clean release left the lock"
    );
    // break --token: a wrong token breaks nothing; the right one breaks that acquisition.
    let mut h = sb.hold(["--wait", "5s", "p"]);
    let t = token_of(h.ok());
    kill9(h.pid());
    h.wait_exit(T);
    let o = sb.output(["break", "--token", &(t + 1).to_string(), "p"]);
    assert_eq!(code(o.status), 75, "a wrong token broke: {}", stderr(&o));
    assert!(srv.path("locks/p").exists());
    let o = sb.output(["break", "--token", &t.to_string(), "p"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(!srv.path("locks/p").exists());
    let next = sb.hold(["p"]);
    assert_eq!(
        next.ok(),
        format!(
            "OK p backend=ftp mode=exclusive token={} prev=crashed\n",
            t + 1
        )
    );
    drop(next);
    eventually(T, "the release", || !srv.path("locks/p").exists());
    let o = sb.output(["run", "p", "--", "sh", "-c", "echo $LOCKSMITH_TOKEN"]);
    assert_eq!(stdout(&o), format!("{}\n", t + 2));
}

/// Someone removes our fresh lock directory between our `MKD PATH` and `MKD PATH/marker`:
/// the refused marker is not "permission denied", and nothing of anyone's is removed: the
/// locker looks again and takes the lock.
#[test]
fn lock_directory_removed_between_our_two_mkds_is_taken_again() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fired = Arc::new(AtomicBool::new(false));
    let f = fired.clone();
    let srv = FtpServer::start_with_mkd_hook(Arc::new(move |dir: &std::path::Path| {
        if dir.ends_with("locks/p") && !f.swap(true, Ordering::SeqCst) {
            fs::remove_dir(dir).unwrap();
        }
    }));
    let sb = sandbox(&srv);
    let a = sb.hold(["--wait", "5s", "p"]);
    assert_eq!(a.ok(), "OK p backend=ftp mode=exclusive token=1\n");
    assert!(fired.load(Ordering::SeqCst), "the hook never ran");
    assert!(srv.path("locks/p").is_dir());
    assert_eq!(markers(&srv).len(), 1);
}

/// Semaphores (SPEC §3b): three slots are three lock directories `locks/p.slot-K`; a race of
/// five loops never has more than three inside, every grant has its own token from the
/// lock's one state, another number is refused (78), and nothing is left on the server.
pub fn slots_admit_n_holders_and_no_more_with_rising_tokens(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let (mut held, _) = crate::slots::three_holders(&|a| sb.cmd(a), "race");
    for k in 0..3 {
        assert!(
            srv.path(&format!("locks/p.slot-{k}")).exists(),
            "{}: slot {k} on the server",
            srv.name()
        );
    }
    crate::slots::beside_three_holders(&|a| sb.cmd(a), "race", &mut held, true);
    drop(held);
    eventually(T, "every slot free", || {
        code(sb.output(["--slots", "3", "status", "race"]).status) == 0
    });
    crate::slots::race_checked(&sb, "race", 5, 6, &[]);
    crate::slots::mixed_race_checked(&sb, "race", &["--shared"], 4, 10, &[]);
    // The readers' directory stays after the last reader (by design): a writer drains it.
    let o = sb.output(["--wait", "20s", "run", "race", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(leftovers(srv).is_empty(), "{:?}", leftovers(srv));
}

/// SPEC §3b, "the lock records N while anyone holds *or waits*", on ftp: a waiter's place in
/// `locks/p.waiting/` (made in its second busy try) keeps its number of slots while the
/// holders are gone and it has not tried again (stopped here): a newcomer of another number
/// is refused (78, naming both), the waiter then served; the room goes with its last place.
pub fn a_waiter_keeps_its_number_of_slots_and_leaves_no_place(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    crate::slots::a_stopped_waiter_keeps_its_number(&|a| sb.cmd(a), "patient");
    eventually(T, "the last holder's release", || {
        code(sb.output(["--slots", "3", "status", "patient"]).status) == 0
    });
    assert!(
        leftovers(srv).is_empty(),
        "{}: {:?}",
        srv.name(),
        leftovers(srv)
    );
}

/// A waiter killed (`kill -9`) on this host leaves its place; the next waiter removes it (its
/// name proves its maker dead) and the room goes with that waiter's own place. A waiter that
/// gives up (`--wait`) takes its place with it.
pub fn a_killed_waiter_s_place_goes_with_the_next_waiter(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let held: Vec<_> = (0..2)
        .map(|_| sb.hold(["--slots", "2", "patient"]))
        .collect();
    let o = sb.output(["--slots", "2", "--wait", "1s", "patient"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    assert!(
        !srv.path("locks/p.waiting").exists(),
        "{}: a room was left",
        srv.name()
    );
    let mut w = sb.spawn_hold(["-v", "--slots", "2", "patient"]);
    w.wait_stderr("waiting in its waiting room", T);
    w.signal(libc::SIGKILL);
    w.wait_exit(T);
    assert_eq!(
        fs::read_dir(srv.path("locks/p.waiting")).unwrap().count(),
        1,
        "{}: the killed waiter's place",
        srv.name()
    );
    let mut next = sb.spawn_hold(["-v", "--slots", "2", "patient"]);
    next.wait_stderr("removed a dead waiter's place", T);
    drop(next);
    drop(held);
    eventually(T, "the holders' release", || {
        code(sb.output(["--slots", "2", "status", "patient"]).status) == 0
    });
    assert!(
        leftovers(srv).is_empty(),
        "{}: {:?}",
        srv.name(),
        leftovers(srv)
    );
}

/// A reader (one slot, no token) looks at the room too where the lock records more slots: a
/// waiter of 2, stopped while the holders leave, makes it refused (78), and is served.
pub fn a_reader_is_refused_beside_a_waiter_of_another_number(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    let held: Vec<_> = (0..2)
        .map(|_| sb.hold(["--slots", "2", "patient"]))
        .collect();
    let mut w = sb.spawn_hold(["-v", "--slots", "2", "patient"]);
    w.wait_stderr("waiting in its waiting room", T);
    w.signal(libc::SIGSTOP);
    drop(held);
    let o = sb.output(["--shared", "--wait", "0", "run", "patient", "--", "true"]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(o.status), 78, "{}: {said}", srv.name());
    assert!(
        said.contains("waited for with 2 slot(s)"),
        "{}: {said}",
        srv.name()
    );
    w.signal(libc::SIGCONT);
    let line = w.read_line(T).expect("the waiter got nothing");
    assert_eq!(
        crate::slots::field(&line, "slots"),
        Some("2"),
        "{}: {line}",
        srv.name()
    );
    drop(w);
    eventually(T, "the waiter's release", || {
        code(sb.output(["--slots", "2", "status", "patient"]).status) == 0
    });
    // The refused reader's marker is gone; its empty `p.readers` goes with the next writer
    // of the lock itself (`shared.rs`).
    let left: Vec<String> = leftovers(srv)
        .into_iter()
        .filter(|n| n != "p.readers")
        .collect();
    assert!(left.is_empty(), "{}: {left:?}", srv.name());
    if let Ok(d) = fs::read_dir(srv.path("locks/p.readers")) {
        assert_eq!(d.count(), 0, "{}: a reader's marker stays", srv.name());
    }
}

/// SPEC §3b, "the lock records N while anyone holds or waits", where the number recorded is
/// not the waiter's: the lock records 3 from an earlier grant, a reader holds, a writer of one
/// slot waits behind it (stopped while the reader leaves). A newcomer of 3 — the number
/// recorded — is refused (78) naming both numbers, and the writer is then served. No look at
/// the room is needed for it (contenders of the number recorded do not look there: a
/// connection and a listing): the waiting writer holds the lock's own name, its mark that
/// keeps new readers off (`shared.rs`), and a slot's holder finds it there.
pub fn a_newcomer_of_the_recorded_number_is_refused_beside_a_writer_behind_readers(
    srv: &mut dyn TestFtp,
) {
    let sb = sandbox(srv);
    let o = sb.output(["--slots", "3", "run", "patient", "--", "true"]);
    assert_eq!(
        code(o.status),
        0,
        "{}: {}",
        srv.name(),
        String::from_utf8_lossy(&o.stderr)
    );
    let reader = sb.hold(["--shared", "patient"]);
    let mut w = sb.spawn_hold(["-v", "patient"]);
    w.wait_stderr("waiting in its waiting room", T);
    w.signal(libc::SIGSTOP);
    drop(reader);
    let o = sb.output([
        "--slots", "3", "--wait", "0", "run", "patient", "--", "true",
    ]);
    let said = String::from_utf8_lossy(&o.stderr);
    assert_eq!(code(o.status), 78, "{}: {said}", srv.name());
    assert!(
        said.contains("held with 1 slot") && said.contains("asks for 3"),
        "{}: {said}",
        srv.name()
    );
    w.signal(libc::SIGCONT);
    let line = w.read_line(T).expect("the writer got nothing");
    assert!(
        line.starts_with("OK patient ") && !line.contains("mode=shared"),
        "{}: {line}: {}",
        srv.name(),
        w.stderr_text()
    );
    drop(w);
    eventually(T, "the writer's release", || {
        code(sb.output(["status", "patient"]).status) == 0
    });
    // Served, the writer recorded its own number.
    let state: Vec<String> = fs::read_dir(srv.path("locks/p.state"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        state.len() == 1 && state[0].split('~').count() == 4,
        "{}: {state:?}",
        srv.name()
    );
    let left: Vec<String> = leftovers(srv)
        .into_iter()
        .filter(|n| n != "p.readers")
        .collect();
    assert!(left.is_empty(), "{}: {left:?}", srv.name());
}

/// Fair queues (SPEC §3b): waiters on an FTP lock are served in the order they came.
pub fn fair_line_is_served_in_order_and_a_killed_waiter_does_not_stall_it(srv: &mut dyn TestFtp) {
    let sb = sandbox(srv);
    crate::fair::check_fair(&sb, &|a| sb.cmd(a), "race", srv.name());
}
