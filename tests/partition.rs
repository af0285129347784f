//! Issue 13: the engines under real network partitions. Two "hosts" and a server, each in a
//! network namespace of its own on a private bridge ([`Net`]); each host's locksmith also in
//! a pid namespace of its own, so no same-host proof of death applies. Holder A runs a command
//! under the lock on host `a`; waiter B queues on host `b`; then A's link is cut — silently
//! (its bridge port stops forwarding: no RST, no ICMP) or hard (the link goes down). Checked
//! with CLOCK_MONOTONIC stamps (one kernel, one clock): A declares LOST and its command is
//! gone — SIGKILLed if it ignores SIGTERM — before B's command starts; B holds within
//! `stale_after` + `max_poll` + a heartbeat of the cut; tokens rise; after the heal a third
//! contender on host `a` gets the lock at once and nothing of A is left on the server.
//!
//! Real servers (pure-ftpd, etcd, PostgreSQL, Redis, SeaweedFS) bound to the server namespace's address; root,
//! `ip`/`bridge` (iproute2), `unshare` and `perl` are needed (a SKIP outside CI).

use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use crate::support::*;

const STALE: f64 = 3.0;
const HEARTBEAT: f64 = 1.0;
const MAX_POLL: f64 = 0.5;
/// The lock's settings, on every host.
const TIMING: &str =
    "stale_after = \"3s\"\nkeepalive = \"1s\"\npoll = \"100ms\"\nmax_poll = \"500ms\"\n";

/// The command run under the lock: writes `<pid as the host sees it> <CLOCK_MONOTONIC>
/// <LOCKSMITH_TOKEN>` to the file `$ARGV[0]` (atomically), then holds for `$ARGV[1]` seconds
/// (0: for ever); with `$ARGV[2]` it ignores SIGTERM.
const STAMP: &str = r#"
use Time::HiRes qw(clock_gettime CLOCK_MONOTONIC);
my ($out, $hold, $deaf) = @ARGV;
$SIG{TERM} = 'IGNORE' if $deaf;
open my $s, '<', '/proc/self/stat' or die; my ($pid) = split / /, <$s>; close $s;
open my $f, '>', "$out.tmp" or die;
printf $f "%d %.6f %s\n", $pid, clock_gettime(CLOCK_MONOTONIC), $ENV{LOCKSMITH_TOKEN} // '';
close $f; rename "$out.tmp", $out or die;
if ($hold > 0) { select(undef, undef, undef, $hold) } else { sleep 1000 while 1 }
"#;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    Silent,
    Hard,
    /// Not a cut: A's locksmith is SIGSTOPped for stale_after + 2 s, then SIGCONTinued.
    Paused,
}

/// Starts locksmith on a host with these arguments, optionally running [`STAMP`] (its file,
/// its hold time) under the lock.
type Spawner<'a> = dyn Fn(char, &[&str], Option<(&Path, &str)>) -> Held + 'a;

/// What a [`STAMP`] command wrote.
struct Stamp {
    /// Its pid in the initial pid namespace (`/proc` is the host's).
    pid: i32,
    at: f64,
    token: u64,
}

fn read_stamp(path: &Path) -> Stamp {
    let text = fs::read_to_string(path).unwrap();
    let mut w = text.split_whitespace();
    Stamp {
        pid: w.next().unwrap().parse().unwrap(),
        at: w.next().unwrap().parse().unwrap(),
        token: w.next().and_then(|t| t.parse().ok()).unwrap_or(0),
    }
}

/// When process `pid` stops running (exits or turns zombie), by CLOCK_MONOTONIC: polled every
/// millisecond — a measurement, not a synchronisation.
fn watch_death(pid: i32) -> std::thread::JoinHandle<f64> {
    std::thread::spawn(move || {
        let stat = format!("/proc/{pid}/stat");
        loop {
            let gone = match fs::read_to_string(&stat) {
                Err(_) => true,
                Ok(s) => s
                    .rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
            };
            if gone {
                return monotonic();
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    })
}

fn tools_present() -> bool {
    let ok = ["perl", "unshare", "bridge"].iter().all(|t| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !ok {
        missing(
            "perl, unshare or bridge (iproute2) missing",
            ".ci/run installs perl, util-linux and iproute2",
        );
    }
    ok
}

/// One run of the scenario for a lock profile `x` in `sb` (reachable from every host).
/// `leftovers` describes what is on the server: after the heal it must be what it was after
/// a clean warm-up cycle.
#[allow(clippy::too_many_arguments)]
fn scenario(
    net: &Net,
    sb: &Sandbox,
    name: &str,
    cut: Cut,
    deaf: bool,
    server_frees: bool,
    env: &[(&str, &str)],
    leftovers: &dyn Fn() -> String,
) {
    let run = |host: char, args: &[&str], stamp: Option<(&Path, &str)>| {
        let mut c = net.on_host(host, bin());
        c.envs(env.iter().copied());
        c.arg("--profiles").arg(&sb.profiles).args(args);
        if let Some((out, hold)) = stamp {
            c.args(["--", "perl", "-e", STAMP])
                .arg(out)
                .arg(hold)
                .arg(if deaf && host == 'a' { "1" } else { "" });
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Held::spawn(c)
    };
    // Both hosts reach the server.
    for h in ['a', 'b'] {
        let mut w = run(h, &["run", "x", "--", "true"], None);
        assert_eq!(
            code(w.wait_exit(Duration::from_secs(30))),
            0,
            "{name}: warm-up on {h}: {}",
            w.stderr_text()
        );
    }
    let clean = leftovers();
    let sa = sb.join("a.stamp");
    let sbb = sb.join("b.stamp");
    let sc = sb.join("c.stamp");
    let mut a = run('a', &["run", "x"], Some((&sa, "0")));
    eventually(Duration::from_secs(20), "A's command runs", || sa.exists());
    let a_cmd = read_stamp(&sa);
    let mut b = run('b', &["--wait", "60s", "run", "x"], Some((&sbb, "0.2")));
    b.wait_stderr("waiting for lock", Duration::from_secs(20));
    // A heartbeat or two while both are in place.
    std::thread::sleep(Duration::from_millis(1500));

    let gone = watch_death(a_cmd.pid);
    let t_cut = monotonic();
    match cut {
        Cut::Silent => net.cut_silent('a'),
        Cut::Hard => net.cut_hard('a'),
        Cut::Paused => {
            paused(name, a_cmd.pid, &sbb, server_frees, t_cut);
            if !server_frees {
                // SPEC §6's honest limit: a waiter broke the paused holder's lock while its
                // CMD ran on; the token is what tells them apart.
                a.wait_stderr("ERROR lost", Duration::from_secs(30));
                assert_eq!(code(a.wait_exit(Duration::from_secs(30))), 74);
                assert_eq!(code(b.wait_exit(Duration::from_secs(30))), 0);
                let b_cmd = read_stamp(&sbb);
                assert!(b_cmd.token > a_cmd.token, "{name}: tokens did not rise");
                eprintln!(
                    "partition {name}: the waiter's CMD started +{:.3}s into the pause (tokens {} -> {}); A said LOST once resumed",
                    b_cmd.at - t_cut,
                    a_cmd.token,
                    b_cmd.token
                );
                after_heal(net, &run, name, &sc, b_cmd.token, leftovers, &clean);
                return;
            }
            // postgres: the lock stayed A's all along (the server kept the session), and A
            // confirms it once resumed and goes on holding. Its CMD ends; then B gets in.
            assert!(
                a.exited().is_none(),
                "{name}: A gave up a lock that was still its own"
            );
            let gone = watch_death(a_cmd.pid);
            kill9(a_cmd.pid);
            let t_gone = gone.join().unwrap();
            assert_eq!(code(a.wait_exit(Duration::from_secs(30))), 137);
            assert_eq!(code(b.wait_exit(Duration::from_secs(30))), 0);
            let b_cmd = read_stamp(&sbb);
            assert!(t_gone < b_cmd.at, "{name}: two holders");
            assert!(b_cmd.token > a_cmd.token, "{name}: tokens did not rise");
            eprintln!(
                "partition {name}: the waiter stayed out for the whole pause; in {:.3}s after A's CMD ended",
                b_cmd.at - t_gone
            );
            after_heal(net, &run, name, &sc, b_cmd.token, leftovers, &clean);
            return;
        }
    }
    a.wait_stderr("ERROR lost", Duration::from_secs(30));
    let t_lost = monotonic();
    let t_gone = gone.join().unwrap();
    assert_eq!(
        code(a.wait_exit(Duration::from_secs(30))),
        74,
        "{name}: {}",
        a.stderr_text()
    );
    assert_eq!(
        code(b.wait_exit(Duration::from_secs(60))),
        0,
        "{name}: B: {}",
        b.stderr_text()
    );
    let b_cmd = read_stamp(&sbb);
    let margin = b_cmd.at - t_gone;
    eprintln!(
        "partition {name}: LOST +{:.3}s, CMD gone +{:.3}s, waiter's CMD starts +{:.3}s (margin {:.3}s); tokens {} -> {}",
        t_lost - t_cut,
        t_gone - t_cut,
        b_cmd.at - t_cut,
        margin,
        a_cmd.token,
        b_cmd.token
    );
    assert!(
        t_gone < b_cmd.at,
        "{name}: A's command was still running when B's started (margin {margin:.3}s)"
    );
    let bound = STALE + MAX_POLL + HEARTBEAT + 1.0;
    assert!(
        b_cmd.at - t_cut <= bound,
        "{name}: B held only {:.3}s after the cut (bound {bound}s)",
        b_cmd.at - t_cut
    );
    assert!(b_cmd.token > a_cmd.token, "{name}: tokens did not rise");
    after_heal(net, &run, name, &sc, b_cmd.token, leftovers, &clean);
}

/// A's locksmith stopped for stale_after + 2 s. Where the server frees the lock
/// (`server_frees`: postgres, whose kernel keeps a stopped process's connection alive), the
/// waiter must not get in meanwhile; where waiters judge by silence (ftp, etcd) or the server
/// expires the holder's key (redis), it must — but
/// not before SPEC §6's window opens.
fn paused(name: &str, a_cmd: i32, b_stamp: &Path, server_frees: bool, t0: f64) {
    let stat = fs::read_to_string(format!("/proc/{a_cmd}/stat")).unwrap();
    let ppid: i32 = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let a = nix::unistd::Pid::from_raw(ppid);
    nix::sys::signal::kill(a, nix::sys::signal::Signal::SIGSTOP).unwrap();
    // The pause is the scenario itself, not a synchronisation.
    std::thread::sleep(Duration::from_secs_f64(STALE + 2.0));
    let b_in = b_stamp.exists();
    nix::sys::signal::kill(a, nix::sys::signal::Signal::SIGCONT).unwrap();
    if server_frees {
        assert!(
            !b_in,
            "{name}: the waiter got in while the holder was only paused"
        );
    } else {
        assert!(
            b_in,
            "{name}: the waiter did not break a holder silent for stale_after + 2 s"
        );
        let at = read_stamp(b_stamp).at - t0;
        assert!(
            at >= STALE - HEARTBEAT,
            "{name}: broken {at:.3}s into the pause"
        );
    }
}

/// The heal, then a third contender on host `a` gets the lock at once (its token above
/// `last`), and the server is as a clean cycle leaves it.
fn after_heal(
    net: &Net,
    run: &Spawner,
    name: &str,
    sc: &Path,
    last: u64,
    leftovers: &dyn Fn() -> String,
    clean: &str,
) {
    net.heal('a');
    // A third contender on the healed host gets the lock at once.
    let mut c = run('a', &["--wait", "0", "run", "x"], Some((sc, "0.1")));
    assert_eq!(
        code(c.wait_exit(Duration::from_secs(30))),
        0,
        "{name}: C: {}",
        c.stderr_text()
    );
    assert!(read_stamp(sc).token > last, "{name}: tokens did not rise");
    eventually(
        Duration::from_secs(10),
        "nothing of A left on the server",
        || leftovers() == clean,
    );
}

/// Runs `scenario` under both cuts, each on a fresh network and server: `start` starts the
/// server in the network's server namespace, `profiles` writes profile `x` for it,
/// `leftovers` describes what is on the server.
fn both_cuts<S>(
    name: &str,
    start: impl Fn(&Net) -> Option<S>,
    profiles: impl Fn(&S) -> Sandbox,
    leftovers: impl Fn(&S) -> String,
) {
    both_cuts_env(name, start, profiles, leftovers, &[]);
}

/// [`both_cuts`], every locksmith started with `env` added (the s3 backend's AWS credentials).
fn both_cuts_env<S>(
    name: &str,
    start: impl Fn(&Net) -> Option<S>,
    profiles: impl Fn(&S) -> Sandbox,
    leftovers: impl Fn(&S) -> String,
    env: &[(&str, &str)],
) {
    let _g = heavy();
    if !tools_present() {
        return;
    }
    for (cut, deaf) in [
        (Cut::Silent, true),
        (Cut::Hard, false),
        (Cut::Paused, false),
    ] {
        let Some(net) = Net::new(&['a', 'b']) else {
            return;
        };
        let Some(server) = start(&net) else { return };
        let sb = profiles(&server);
        let label = format!(
            "{name} {cut:?}{}",
            if deaf { " (CMD ignores SIGTERM)" } else { "" }
        );
        let server_frees = name == "postgres";
        scenario(&net, &sb, &label, cut, deaf, server_frees, env, &|| {
            leftovers(&server)
        });
        // The server first (a clean stop), then the namespaces and whatever is left in them.
        drop(server);
        drop(net);
    }
}

#[test]
fn partition_postgres() {
    both_cuts(
        "postgres",
        |net| NotStarted::or_skip(crate::postgres::Pg::start_in(net)),
        |pg| {
            let sb = Sandbox::new("");
            fs::write(sb.join("pw"), "lockpw\n").unwrap();
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(sb.join("pw"), fs::Permissions::from_mode(0o600)).unwrap();
            sb.write_profiles(&format!(
                "[profile.x]\nbackend = \"postgres\"\nhost = \"{}\"\nport = {}\ndbname = \"app\"\n\
                 user = \"locker\"\npassword_file = \"pw\"\nlock = \"x\"\n{TIMING}",
                pg.host, pg.port
            ));
            sb
        },
        // Sessions from host a (10.213.0.2): the server must have ended the cut one.
        |pg| pg.sql("SELECT count(*) FROM pg_stat_activity WHERE client_addr = '10.213.0.2'"),
    );
}

#[test]
fn partition_etcd() {
    both_cuts(
        "etcd",
        crate::etcd::Etcd::start_in,
        |e| {
            Sandbox::new(&format!(
                "[profile.x]\nbackend = \"etcd\"\nendpoints = [\"http://{}:{}\"]\nprefix = \"/t/x\"\n{TIMING}",
                e.host, e.port
            ))
        },
        |e| e.keys("/t/x/"),
    );
}

#[test]
fn partition_redis() {
    both_cuts(
        "redis",
        |net| {
            NotStarted::or_skip(testkit::redis::Redis::start_with(testkit::redis::Options {
                net: Some(net),
                ..Default::default()
            }))
        },
        |r| {
            Sandbox::new(&format!(
                "[profile.x]\nbackend = \"redis\"\nhost = \"{}\"\nport = {}\nkey = \"t:x\"\n{TIMING}",
                r.host, r.port
            ))
        },
        // The holders' keys (the counter and state stay by design).
        |r| r.cli(&["EXISTS", "t:x", "t:x.readers", "t:x.writer"]),
    );
}

#[test]
fn partition_ftp() {
    use crate::ftp_server::{PASSWORD, TestFtp};
    both_cuts(
        "ftp",
        crate::ftp_debian::DebianFtp::start_in,
        |srv| {
            Sandbox::new(&format!(
                "[profile.x]\nbackend = \"ftp\"\nhost = \"{}\"\nport = {}\nuser = \"{}\"\n\
                 password = \"{PASSWORD}\"\npath = \"locks/x\"\n{TIMING}",
                srv.host,
                srv.port(),
                srv.user()
            ))
        },
        // The lock directory's parent: names only (a lock left behind, a marker, a tombstone).
        |srv| {
            let mut v: Vec<String> = fs::read_dir(srv.path("locks"))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v.join(" ")
        },
    );
}

/// SeaweedFS in the server namespace, and the locksmith that reads the lock's state there.
struct Seaweed {
    sw: testkit::seaweed::Seaweed,
    ns: String,
}

const S3_ENV: [(&str, &str); 2] = [
    ("AWS_ACCESS_KEY_ID", testkit::seaweed::Seaweed::ACCESS),
    ("AWS_SECRET_ACCESS_KEY", testkit::seaweed::Seaweed::SECRET),
];

impl Seaweed {
    fn address(&self) -> String {
        format!("s3://locks/t/x?endpoint={}", self.sw.endpoint())
    }

    /// `locksmith BEFORE ADDRESS AFTER` in the server namespace.
    fn locksmith(&self, before: &[&str], after: &[&str]) -> std::process::Output {
        let mut c = command_in(Some(&self.ns), bin());
        c.envs(S3_ENV).args(before).arg(self.address()).args(after);
        output_within(c, Duration::from_secs(30))
    }
}

#[test]
fn partition_s3() {
    both_cuts_env(
        "s3",
        |net| {
            let sw = NotStarted::or_skip(testkit::seaweed::Seaweed::start_in(Some(net)))?;
            let s = Seaweed {
                sw,
                ns: net.server_ns(),
            };
            // Ready once a lock can be taken (the bucket is made on first use).
            eventually(Duration::from_secs(20), "SeaweedFS takes a lock", || {
                s.locksmith(&["--wait", "0", "run"], &["--", "true"])
                    .status
                    .success()
            });
            Some(s)
        },
        |s| {
            Sandbox::new(&format!(
                "[profile.x]\nbackend = \"s3\"\nendpoint = \"{}\"\nbucket = \"locks\"\nkey = \"t/x\"\n{TIMING}",
                s.sw.endpoint()
            ))
        },
        // What `status` says of the lock (free after a clean cycle: nothing of A left).
        |s| stdout(&s.locksmith(&["status", "--json"], &[])),
        &S3_ENV,
    );
}
