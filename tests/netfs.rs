//! The file backends on real network filesystems (issue 12), each mounted twice so that two
//! mounts stand in for two hosts, each with its own caches: sshfs ([`Sshfs`]: one served
//! directory, mount `a` with sshfs's default 20 s cache, mount `b` with a short one) and
//! GlusterFS ([`Gluster`]: a one-brick volume, two FUSE mounts, client caches off).
//! One lock, named through mount `a` by profile `BACKEND-a` and through mount `b` by
//! `BACKEND-b`; contenders in another pid namespace have no same-host proof of death (SPEC §6).
//!
//! For each filesystem and each of `mkdir`, `link` and `symlink` (a module each, the same
//! tests):
//! - `counter_race_across_mounts`: the seed's counter race, two workers per mount, one of them
//!   in another pid namespace: count exact, no overlap, every `run` exits 0, and nothing but the
//!   lock's documented state left on the server;
//! - `live_holder_is_never_broken`: a holder on `a` (another pid namespace) is not broken by a
//!   waiter on `b` hammering for 3 × stale_after, and says no `LOST`; once it releases, a waiter
//!   on `b` gets the lock;
//! - `stale_takeover_lands_in_specs_window`: such a holder, watched by a waiter on `b` for
//!   stale_after (it must stay out), is killed with its namespace; the waiter takes over inside
//!   [stale_after − heartbeat, stale_after + max_poll + heartbeat] of the kill (the end later by
//!   the filesystem's content cache, [`Mounts::late_by`]: never the start);
//! - `handoff_across_mounts`: a holder on `a` releases, the waiter on `b` gets in;
//! - `a_waiter_keeps_its_number_across_mounts`: SPEC §3b's waiting room there — a stopped
//!   waiter of 2 on `b` refuses a newcomer of 3 on `a`; a killed waiter's place is removed by
//!   the next waiter;
//! - `kill9_soak_across_mounts`: 4 workers × 40 runs alternating mounts, kill -9 every
//!   50–450 ms (waiting, holding, releasing, breaking): never two live holders (CMD checks the
//!   record on the server names its own helper), tokens strictly increasing, exits 0 or 137,
//!   enough acquisitions, the lock recoverable at the end.
//!
//! And, per filesystem, `flock_on_fuse_is_refused_unless_local`: flock(2) on a FUSE mount
//! excludes nothing across mounts as far as locksmith can tell, so `backend = "flock"` there is
//! 78 naming the filesystem, unless `local = true`.
//!
//! Each test gathers every broken promise before failing, so one run shows them all.
//! A study switch, not for CI: `NETFS_GLUSTER_CACHES=default` runs the GlusterFS tests with
//! GlusterFS's default client caches, `NETFS_CACHE_TIME_MS` and `NETFS_STALE_AFTER_MS` set the
//! profiles' `cache_time` and `stale_after`.
//! `sshfs_fixture_mounts_twice_and_cleans_up` checks the fixture itself.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use crate::race::{Worker, race_workers};
use crate::support::*;

// A default profile (no cache_time) on sshfs: the cache read from its process (issue 28 item 6).
mod cache_time;

/// The timings of every profile here: short, so a test takes seconds.
const POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_millis(200);
const KEEPALIVE: Duration = Duration::from_millis(300);
const STALE_AFTER: Duration = Duration::from_secs(3);

/// The profiles' `stale_after`: [`STALE_AFTER`], or `NETFS_STALE_AFTER_MS` for a study (e.g.
/// GlusterFS with its default caches, [`GLUSTER_CACHES`], and the cache time verify suggests).
fn stale_after<F: Mounts>() -> Duration {
    env_ms("NETFS_STALE_AFTER_MS").unwrap_or(F::STALE_AFTER)
}

/// SPEC §5: the heartbeat runs every min(keepalive, stale_after / 3).
fn heartbeat<F: Mounts>() -> Duration {
    KEEPALIVE.min(stale_after::<F>() / 3)
}

/// The profiles' `cache_time` on `F`: [`Mounts::CACHE_TIME`], or `NETFS_CACHE_TIME_MS`.
fn cache_time<F: Mounts>() -> Duration {
    env_ms("NETFS_CACHE_TIME_MS").unwrap_or(F::CACHE_TIME)
}

/// `NETFS_GLUSTER_CACHES=default`: the GlusterFS tests mount with GlusterFS's default client
/// caches and volume options ([`Gluster::start`]) instead of with them off — locksmith refuses
/// that (78); `=fresh-names`: with only what locksmith requires off
/// ([`Gluster::start_fresh_names`]). Not for CI: studies of what locksmith does there
/// (README, network filesystems), with `NETFS_CACHE_TIME_MS` and `NETFS_STALE_AFTER_MS` set as
/// `locksmith verify --peer` suggests.
const GLUSTER_CACHES: &str = "NETFS_GLUSTER_CACHES";

/// Whether the GlusterFS mounts keep some cache on ([`GLUSTER_CACHES`]): records may show late.
fn gluster_default_caches() -> bool {
    std::env::var(GLUSTER_CACHES).is_ok_and(|v| v == "default" || v == "fresh-names")
}

/// A whole number of milliseconds from the environment variable `var`, if set.
fn env_ms(var: &str) -> Option<Duration> {
    let v = std::env::var(var).ok()?;
    let n = v
        .parse()
        .unwrap_or_else(|_| panic!("{var}={v:?}: a number of milliseconds expected"));
    Some(Duration::from_millis(n))
}
/// A profile's `wait`: nothing here hangs for ever (and an ERROR line comes within the
/// 20 s a hold's first line is waited for).
const WAIT: &str = "15s";
/// The race workers' `wait`: several of mount a's cache times.
const RACE_WAIT: &str = "180s";

/// Increments per worker in the race (4 workers): one backend's race stays under ~40 s.
const INCREMENTS: usize = 50;
/// Generous bound for anything that should take a cache time or two.
const T: Duration = Duration::from_secs(20);
/// What the measured takeover may exceed SPEC §6's upper bound by: the waiter's OK line
/// travelling to the test and scheduling on a loaded 2-core machine (never the lower bound).
const MEASURE_SLACK: Duration = Duration::from_millis(250);
/// What a takeover costs after the waiter decided to break (SPEC §6's window ends at the
/// decision): claiming the record, freeing and taking the name, writing records — some eight
/// round trips to the server, 225 ms on a quiet machine (sshfs mkdir, a `-vv` trace: the claim
/// 5.51 s after the last heartbeat, `OK` 5.73 s), several times that under CI's load (seen:
/// past the window's end + MEASURE_SLACK). Liveness only: the window's start stays exact.
const TAKEOVER_IO: Duration = Duration::from_millis(750);

/// A network filesystem mounted twice by a fixture: the tests below run on each.
pub trait Mounts: Sized {
    /// For messages.
    const NAME: &'static str;
    /// The `cache_time` every heartbeat profile on it states: how long a record file's
    /// content may be read stale through a mount (names and attributes may be cached longer;
    /// locksmith reads what it judges by fresh). sshfs reads content through to the server at
    /// every open; GlusterFS serves it up to ~1 s stale (`tests/support/fs2.rs`).
    const CACHE_TIME: Duration;
    /// The profiles' `stale_after` on it (above [`Mounts::CACHE_TIME`]).
    const STALE_AFTER: Duration = STALE_AFTER;
    /// How much later than SPEC §6's window a waiter may take over a dead holder here: it
    /// sees the holder's last heartbeat only once the content cache lets it (sshfs: at once;
    /// GlusterFS: up to ~1 s), and counts stale_after from then. Never earlier.
    fn late_by() -> Duration;
    fn start() -> Option<Self>;
    fn mount_point(&self, m: char) -> &Path;
    /// The names in the shared directory, read on the server past every client cache.
    fn server_listing(&self) -> Vec<String>;
    /// The shared directory on the server (the brick): what is really there.
    fn server_dir(&self) -> &Path;
    /// What its daemons logged last, for a failure's message (empty where nothing is kept).
    fn daemon_logs(&self) -> String {
        String::new()
    }
}

/// `stale_after` 5 s: the stop's CI on 3e427a2 saw one sshfs heartbeat of the symlink race
/// not return for 2.55 s (single-threaded sftp-server, 2 loaded cores), and the holder rightly
/// said LOST (74) before the 3 s profile's point of no return.
impl Mounts for Sshfs {
    const NAME: &'static str = "sshfs";
    const CACHE_TIME: Duration = Duration::from_secs(1);
    const STALE_AFTER: Duration = Duration::from_secs(5);
    fn late_by() -> Duration {
        Duration::ZERO
    }
    fn start() -> Option<Self> {
        NotStarted::or_skip(Sshfs::start())
    }
    fn mount_point(&self, m: char) -> &Path {
        Sshfs::mount_point(self, m)
    }
    fn server_listing(&self) -> Vec<String> {
        Sshfs::server_listing(self)
    }
    fn server_dir(&self) -> &Path {
        &self.server
    }
}

/// GlusterFS with its client caches off (both mounts, [`Gluster::start_uncached`]). With its
/// default 1 s caches ([`GLUSTER_CACHES`]) a mount resolves a name to the inode it cached for
/// up to 1 s, and `link(2)` links that inode: a pin of a state record renamed over reads the
/// old record whenever the old inode still has another name (another contender's pin), so a
/// fencing token is issued again (`fs2_smoke::gluster_pins_read_fresh_only_with_the_settings_locksmith_requires`). Seen with
/// `cache_time` 2 s (verify's suggestion) and `stale_after` 4 s: races, live holder, takeover
/// and handoff pass; the kill -9 soaks fail (tokens going back for mkdir and symlink, a CMD
/// outliving its lock for link).
impl Mounts for Gluster {
    const NAME: &'static str = "glusterfs";
    const CACHE_TIME: Duration = Duration::from_secs(1);
    /// With the default caches ([`GLUSTER_CACHES`]) a heartbeat shows through the other
    /// mount up to the cache time late.
    fn late_by() -> Duration {
        if gluster_default_caches() {
            cache_time::<Self>()
        } else {
            Duration::ZERO
        }
    }
    fn start() -> Option<Self> {
        match std::env::var(GLUSTER_CACHES).as_deref() {
            Ok("default") => {
                eprintln!("{GLUSTER_CACHES}=default: GlusterFS with its default client caches");
                Gluster::start()
            }
            Ok("fresh-names") => {
                eprintln!(
                    "{GLUSTER_CACHES}=fresh-names: GlusterFS with only the caches locksmith requires off"
                );
                Gluster::start_fresh_names()
            }
            _ => Gluster::start_uncached(),
        }
    }
    fn mount_point(&self, m: char) -> &Path {
        Gluster::mount_point(self, m)
    }
    fn server_listing(&self) -> Vec<String> {
        Gluster::server_listing(self)
    }
    fn server_dir(&self) -> &Path {
        &self.server
    }
}

/// SMB: a private Samba share mounted twice with smbnetfs ([`Smb`]). No symbolic or hard
/// links there: only `mkdir` can lock (link and symlink refuse, 78). A record rewritten in
/// place through one mount showed through the other up to ~2.1 s late (in 3–5 of 24–32
/// `verify --peer` runs, with or without oplocks; else within 10 ms): `verify` asks for a
/// cache time of 3 s, so the profiles state it, and a `stale_after` of 5 s.
impl Mounts for Smb {
    const NAME: &'static str = "smb";
    const CACHE_TIME: Duration = Duration::from_secs(3);
    const STALE_AFTER: Duration = Duration::from_secs(5);
    fn late_by() -> Duration {
        Duration::ZERO
    }
    fn start() -> Option<Self> {
        NotStarted::or_skip(Smb::start())
    }
    fn mount_point(&self, m: char) -> &Path {
        Smb::mount_point(self, m)
    }
    fn server_listing(&self) -> Vec<String> {
        Smb::server_listing(self)
    }
    fn server_dir(&self) -> &Path {
        &self.server
    }
    fn daemon_logs(&self) -> String {
        self.logs_tail(30)
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

/// The profiles file for `fx`. For each backend B: `B-a` and `B-b`, the same lock `B.lock` in
/// the served directory, through mount `a` and through mount `b`; and `flock-a-local`.
/// Every profile is written by [`profile`].
fn profiles<F: Mounts>(fx: &F) -> String {
    let mut t = String::new();
    for backend in ["mkdir", "link", "symlink", "flock"] {
        for m in ['a', 'b'] {
            t += &profile(fx, &format!("{backend}-{m}"), backend, m, &[]);
            // The race's: a mount with sshfs's default cache shows a removed lock name for up
            // to 20 s (its lookups and mkdir/link/symlink answer EEXIST from the cache), so
            // a waiter there may wait that long after each release it misses.
            let wait = format!("wait = \"{RACE_WAIT}\"");
            t += &profile(fx, &format!("race-{backend}-{m}"), backend, m, &[&wait]);
        }
    }
    t += &profile(fx, "flock-a-local", "flock", 'a', &["local = true"]);
    t
}

/// One profile: `backend` at `B.lock` through mount `m`, the timings above, `keys`.
/// The one place that writes a profile: a key every network-mount profile needs goes here.
fn profile<F: Mounts>(fx: &F, name: &str, backend: &str, m: char, keys: &[&str]) -> String {
    let path = fx.mount_point(m).join(format!("{backend}.lock"));
    let mut s = String::new();
    writeln!(s, "[profile.{name}]").unwrap();
    writeln!(s, "backend = \"{backend}\"").unwrap();
    writeln!(s, "path = \"{}\"", path.display()).unwrap();
    if !keys.iter().any(|k| k.starts_with("wait")) {
        writeln!(s, "wait = \"{WAIT}\"").unwrap();
    }
    writeln!(s, "poll = \"{}\"", ms(POLL)).unwrap();
    writeln!(s, "max_poll = \"{}\"", ms(MAX_POLL)).unwrap();
    writeln!(s, "keepalive = \"{}\"", ms(KEEPALIVE)).unwrap();
    writeln!(s, "stale_after = \"{}\"", ms(stale_after::<F>())).unwrap();
    // ---- EXTRA KEYS for every profile on a network mount: see `extra_keys` ----------------
    for k in extra_keys::<F>(backend) {
        writeln!(s, "{k}").unwrap();
    }
    // -------------------------------------------------------------------------------------
    for k in keys {
        writeln!(s, "{k}").unwrap();
    }
    s.push('\n');
    s
}

/// Keys added to every profile (see [`profile`]) on filesystem `F`.
fn extra_keys<F: Mounts>(backend: &str) -> Vec<String> {
    if backend == "flock" {
        return Vec::new(); // no heartbeat, no cache_time
    }
    // locksmith judges liveness by the *content* of record files read fresh: the user states
    // the content's delay, which `locksmith verify --peer` measures.
    vec![format!("cache_time = \"{}\"", ms(cache_time::<F>()))]
}

/// A fresh pair of mounts and a sandbox whose profiles point into it; `None` is a SKIP.
fn setup<F: Mounts>() -> Option<(F, Sandbox)> {
    let fx = F::start()?;
    let sb = Sandbox::new(&profiles(&fx));
    Some((fx, sb))
}

/// What the served directory holds beyond the lock's documented state (docs/LAYOUT.md:
/// `.NAME.state`, `.NAME.waiting.d`), read on the server; the lock itself must be gone too.
/// The waiting room (`.NAME.waiting.d`) stays too; a place left in it is listed.
fn leftovers<F: Mounts>(fx: &F, backend: &str) -> Vec<String> {
    let state = format!(".{backend}.lock.state");
    let room = format!(".{backend}.lock.waiting.d");
    let places = fs::read_dir(fx.server_dir().join(&room))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| format!("{room}/{}", e.file_name().to_string_lossy()));
    fx.server_listing()
        .into_iter()
        .filter(|n| *n != state && *n != room)
        .chain(places)
        .collect()
}

/// Fails with every problem found, each with its evidence.
fn verdict(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n- {}",
        problems.len(),
        problems.join("\n- ")
    );
}

/// The holder's first line, or a problem.
fn holder_ok(h: &mut Held, who: &str, problems: &mut Vec<String>) -> bool {
    match h.line.clone() {
        Some(l) if l.starts_with("OK ") => true,
        l => {
            let st = h.exited().map(code);
            problems.push(format!(
                "{who} got no OK: {l:?}, exit {st:?}, stderr: {}",
                digest(&h.stderr_text())
            ));
            false
        }
    }
}

/// Waits for the waiter `w` to say it waits; a line on its stdout first (it got the lock
/// while the holder holds it, or gave up) is a problem.
fn until_waiting(w: &mut Held, problems: &mut Vec<String>) -> bool {
    let deadline = Instant::now() + T;
    while Instant::now() < deadline {
        if let Some(l) = w.read_line(Duration::from_millis(10)) {
            problems.push(format!(
                "the waiter said {l:?} instead of waiting; stderr: {}",
                digest(&w.stderr_text())
            ));
            return false;
        }
        if w.stderr_within("waiting for lock", Duration::from_millis(10))
            .is_some()
        {
            return true;
        }
        if let Some(st) = w.exited() {
            problems.push(format!(
                "the waiter exited {} without waiting; stderr: {}",
                code(st),
                digest(&w.stderr_text())
            ));
            return false;
        }
    }
    problems.push(format!(
        "the waiter did not say it waits within {T:?}; stderr: {}",
        digest(&w.stderr_text())
    ));
    false
}

/// 4 workers × INCREMENTS: two through mount a, two through mount b, the last in another pid
/// namespace (no same-host proof of death).
fn counter_race_across_mounts<F: Mounts>(backend: &str) {
    let Some((fx, sb)) = setup::<F>() else { return };
    let Some(pidns) = other_pidns() else { return };
    let _heavy = heavy();
    let (pa, pb) = (format!("race-{backend}-a"), format!("race-{backend}-b"));
    let workers = [
        Worker::new(Some(&pa)),
        Worker::new(Some(&pa)),
        Worker::new(Some(&pb)),
        Worker {
            profile: Some(&pb),
            prefix: pidns,
        },
    ];
    let t0 = Instant::now();
    let r = race_workers(&sb, &workers, INCREMENTS, &[]);
    let want = workers.len() * INCREMENTS;
    eprintln!(
        "netfs {} {backend}: race of {want} increments in {:.1?}: count {}, overlaps {}, failed workers {}",
        F::NAME,
        t0.elapsed(),
        r.count,
        r.overlaps,
        r.failures.len()
    );
    let mut problems = Vec::new();
    if r.overlaps != 0 {
        problems.push(format!("{} overlapping critical sections", r.overlaps));
    }
    if r.count != want {
        problems.push(format!("count {} instead of {want}", r.count));
    }
    if !r.token_regressions.is_empty() {
        problems.push(format!(
            "fencing tokens went backwards {} time(s): {:?}",
            r.token_regressions.len(),
            &r.token_regressions[..r.token_regressions.len().min(5)]
        ));
    }
    problems.extend(r.failures);
    let left = leftovers(&fx, backend);
    if !left.is_empty() {
        problems.push(format!(
            "left on the server: {} name(s): {:?}{}",
            left.len(),
            &left[..left.len().min(10)],
            if left.len() > 10 { " …" } else { "" }
        ));
    }
    if !problems.is_empty() {
        problems.push(format!(
            "(not a problem) the daemons' logs:\n{}",
            fx.daemon_logs()
        ));
    }
    verdict(
        &format!("{} {backend} counter race across mounts", F::NAME),
        &problems,
    );
}

/// kill -9 at random moments (waiting, holding, releasing, breaking) while 4 workers take the
/// lock through both mounts (two each, alternating): never two live holders (the critical
/// section's marker, and the lock's record read on the server naming CMD's own helper),
/// fencing tokens strictly increasing, exits only 0 or 137, and the lock recoverable at the end.
fn kill9_soak_across_mounts<F: Mounts>(backend: &str) {
    let Some((fx, sb)) = setup::<F>() else { return };
    let (pa, pb) = (format!("race-{backend}-a"), format!("race-{backend}-b"));
    // What CMD reads to see that the lock still names its helper: the record on the server
    // itself, past every client cache (mkdir's NAME/beat, link's NAME).
    let server = fx.server_dir().to_path_buf();
    let held = |_: &str| match backend {
        "mkdir" => Some(server.join("mkdir.lock/beat")),
        "link" => Some(server.join("link.lock")),
        _ => None,
    };
    // The liveness floor is one acquisition, then the lock taken again after the storm: on
    // a filesystem without RENAME_NOREPLACE (sshfs, SMB) a kill between mkdir's making the
    // name and its records leaves a lock no proof of death can break, and SPEC §6 lets only a
    // waiter that itself watched it silent for stale_after break it — while the killer strikes
    // one of at most four live processes every 50–450 ms, few live that long. Two clean-clone
    // CI runs (sessions 22, 23) had exactly 4 of 160 runs through on sshfs mkdir, session 17's
    // 8: the old floor (more than 4) measured that luck, not a property.
    crate::soak::soak_in(&sb, &[&pa, &pb], 40, 1, 50..450, &held);
}

/// A holder on mount a in another pid namespace; a waiter on mount b for 3 × stale_after.
fn live_holder_is_never_broken<F: Mounts>(backend: &str) {
    let Some((_fx, sb)) = setup::<F>() else {
        return;
    };
    let (pa, pb) = (format!("{backend}-a"), format!("{backend}-b"));
    let Some(mut holder) = other_host_holder(&sb, &pa) else {
        return;
    };
    let mut problems = Vec::new();
    if !holder_ok(&mut holder, "the holder on mount a", &mut problems) {
        return verdict(&format!("{} {backend} live holder", F::NAME), &problems);
    }
    let wait = stale_after::<F>() * 3;
    let t0 = Instant::now();
    let o = sb.output(["--wait", &ms(wait), &pb]);
    let took = t0.elapsed();
    if code(o.status) != 75 {
        problems.push(format!(
            "the waiter on mount b exited {} after {took:.1?} (75 expected: the holder is alive): stdout {:?}, stderr:\n    {}",
            code(o.status),
            stdout(&o),
            digest(&stderr(&o))
        ));
    }
    if let Some(l) = holder.read_line(Duration::from_millis(1)) {
        problems.push(format!("the live holder said {l:?}"));
    }
    if let Some(st) = holder.exited() {
        problems.push(format!(
            "the live holder exited {} while holding; stderr: {}",
            code(st),
            digest(&holder.stderr_text())
        ));
    }
    // Released: the parent closes the pipe.
    holder.close_stdout();
    let st = holder.wait_exit(T);
    if code(st) != 0 {
        problems.push(format!(
            "the holder's release exited {}; stderr: {}",
            code(st),
            digest(&holder.stderr_text())
        ));
    }
    let t0 = Instant::now();
    let mut next = sb.hold(["--wait", &ms(T), &pb]);
    if holder_ok(&mut next, "the next locker on mount b", &mut problems) {
        eprintln!(
            "netfs {} {backend}: the lock freed on mount a was taken on mount b in {:.1?}",
            F::NAME,
            t0.elapsed()
        );
    }
    next.close_stdout();
    let st = next.wait_exit(T);
    if code(st) != 0 {
        problems.push(format!(
            "the next locker's release exited {}; stderr: {}",
            code(st),
            digest(&next.stderr_text())
        ));
    }
    verdict(&format!("{} {backend} live holder", F::NAME), &problems);
}

/// A holder on mount a killed with its pid namespace while a waiter on mount b waits.
fn stale_takeover_lands_in_specs_window<F: Mounts>(backend: &str) {
    let Some((_fx, sb)) = setup::<F>() else {
        return;
    };
    let _heavy = heavy();
    let (pa, pb) = (format!("{backend}-a"), format!("{backend}-b"));
    let Some(mut holder) = other_host_holder(&sb, &pa) else {
        return;
    };
    let mut problems = Vec::new();
    let what = format!("{} {backend} stale takeover", F::NAME);
    if !holder_ok(&mut holder, "the holder on mount a", &mut problems) {
        return verdict(&what, &problems);
    }
    let mut w = sb.spawn_hold(["--wait", &ms(T), &pb]);
    if !until_waiting(&mut w, &mut problems) {
        return verdict(&what, &problems);
    }
    // The waiter watches the live holder for stale_after first: a waiter that cannot see its
    // heartbeats breaks in meanwhile, or (its silence counted from its first look) too early
    // after the kill.
    if let Some(l) = w.read_line(stale_after::<F>()) {
        problems.push(format!(
            "the waiter on mount b said {l:?} while the holder lived; stderr:\n    {}",
            digest(&w.stderr_text())
        ));
        return verdict(&what, &problems);
    }
    if let Some(l) = holder.read_line(Duration::from_millis(1)) {
        problems.push(format!("the holder said {l:?} before it was killed"));
    }
    let (t0, wall) = (Instant::now(), SystemTime::now());
    kill9(holder.pid());
    // SPEC §6 counts from the holder's last sign of life: its last heartbeat, which a loaded
    // machine may have run later than every period — not from the kill.
    let age = beat_age(&_fx, backend, wall);
    let line = w.read_line(T);
    let took = t0.elapsed();
    let (lo, hi) = (
        age.map_or(stale_after::<F>() - heartbeat::<F>(), |a| {
            stale_after::<F>().saturating_sub(a)
        }),
        stale_after::<F>() + MAX_POLL + heartbeat::<F>() + F::late_by(),
    );
    eprintln!(
        "netfs {} {backend}: kill -9 → OK on the other mount in {took:.2?} (SPEC §6 window [{lo:?}, {hi:?}]; the last heartbeat {age:.2?} before the kill)",
        F::NAME
    );
    match line {
        Some(l) if l.starts_with("OK ") => {
            if took < lo {
                problems.push(format!(
                    "taken over {took:.2?} after the kill: before the window's start {lo:?}"
                ));
            }
            if took > hi + MEASURE_SLACK + TAKEOVER_IO {
                problems.push(format!(
                    "taken over {took:.2?} after the kill: past the window's end {hi:?} (+{MEASURE_SLACK:?} to measure, +{TAKEOVER_IO:?} for the takeover's round trips)"
                ));
            }
        }
        l => problems.push(format!(
            "the waiter said {l:?} within {T:?} of the kill; stderr: {}",
            digest(&w.stderr_text())
        )),
    }
    verdict(&what, &problems);
}

/// How long before `at` the heartbeat record of `backend`'s lock (`B.lock`, [`profiles`]) was
/// last written, by its mtime on the server (whose clock is this machine's): the holder's last
/// sign of life. `None` if it cannot be read.
fn beat_age<F: Mounts>(fx: &F, backend: &str, at: SystemTime) -> Option<Duration> {
    let record = match backend {
        "mkdir" => "mkdir.lock/beat".to_string(),
        "link" => "link.lock".to_string(),
        b => format!(".{b}.lock.beat"),
    };
    let written = fs::metadata(fx.server_dir().join(record))
        .ok()?
        .modified()
        .ok()?;
    Some(at.duration_since(written).unwrap_or(Duration::ZERO))
}

/// A symlink taker on mount a (another pid namespace) stalls just after taking its fencing
/// token, longer than stale_after (`LOCKSMITH_TEST_STALL_TAKEN_MS`); a waiter on mount b breaks
/// in and runs a command that outlasts the stall. When the stalled one wakes, its first
/// heartbeat record must not replace the successor's: the successor keeps its lock (no false
/// LOST) and exits 0, and the stalled one gives the lock back and gets it after it. (Its
/// record used to be renamed over `.NAME.beat`; its give-back then removed it, and the
/// successor said LOST at its next heartbeat.)
fn stalled_taker_never_stops_its_successor<F: Mounts>() {
    let Some((fx, sb)) = setup::<F>() else {
        return;
    };
    let Some(pidns) = other_pidns() else { return };
    let what = format!("{} symlink stalled taker", F::NAME);
    let stall = stale_after::<F>() * 2;
    let log = sb.join("tokens");
    let cs =
        r#"echo "start $LOCKSMITH_TOKEN" >> "$0"; sleep "$1"; echo "end $LOCKSMITH_TOKEN" >> "$0""#;
    let mut h = sb.cmd_via(
        pidns,
        [
            "-v",
            // Generous: after giving the lock back it retakes through mount a, whose default
            // 20 s sshfs name cache may show the freed lock as held that long — more than once
            // when a retake under load comes too late to keep (seen in CI: 30 s ran out).
            "--wait",
            "90s",
            "run",
            "symlink-a",
            "--",
            "sh",
            "-c",
            cs,
        ],
    );
    h.arg(&log)
        .arg("0")
        .env(
            "LOCKSMITH_TEST_STALL_TAKEN_MS",
            stall.as_millis().to_string(),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let h = h.spawn().unwrap();
    let lock = fx.mount_point('a').join("symlink.lock");
    let t0 = Instant::now();
    while fs::symlink_metadata(&lock).is_err() {
        assert!(
            t0.elapsed() < T,
            "{what}: the stalled taker never got going"
        );
        std::thread::sleep(POLL);
    }
    // The successor's command runs until well after the stalled one wakes.
    let mut w = sb.cmd(["--wait", "30s", "run", "symlink-b", "--", "sh", "-c", cs]);
    w.arg(&log).arg(format!("{}", stall.as_secs() + 2));
    let w = output_within(w, Duration::from_secs(60));
    let h = h.wait_with_output().unwrap();
    let herr = String::from_utf8_lossy(&h.stderr).into_owned();
    let mut problems = Vec::new();
    if code(w.status) != 0 {
        problems.push(format!(
            "the successor on mount b: exit {} (0 expected): {}",
            code(w.status),
            digest(&stderr(&w))
        ));
    }
    if code(h.status) != 0 {
        problems.push(format!(
            "the stalled taker: exit {}: {}",
            code(h.status),
            digest(&herr)
        ));
    }
    let text = fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let sections: Vec<(&str, &str)> = lines
        .chunks(2)
        .map(|p| (p[0], p.get(1).copied().unwrap_or("")))
        .collect();
    let in_order = sections.len() == 2
        && sections.iter().all(|(s, e)| {
            s.strip_prefix("start ").is_some() && s.strip_prefix("start ") == e.strip_prefix("end ")
        });
    if !in_order {
        problems.push(format!(
            "two critical sections one after the other expected: {lines:?}"
        ));
    }
    verdict(&what, &problems);
}

#[test]
fn sshfs_stalled_symlink_taker_never_stops_its_successor() {
    stalled_taker_never_stops_its_successor::<crate::support::Sshfs>();
}

#[test]
fn gluster_stalled_symlink_taker_never_stops_its_successor() {
    stalled_taker_never_stops_its_successor::<crate::support::Gluster>();
}

/// A holder on mount a releases; the waiter on mount b gets in.
fn handoff_across_mounts<F: Mounts>(backend: &str) {
    let Some((_fx, sb)) = setup::<F>() else {
        return;
    };
    let (pa, pb) = (format!("{backend}-a"), format!("{backend}-b"));
    let mut problems = Vec::new();
    let what = format!("{} {backend} handoff across mounts", F::NAME);
    let mut holder = sb.hold([&pa]);
    if !holder_ok(&mut holder, "the holder on mount a", &mut problems) {
        return verdict(&what, &problems);
    }
    let mut w = sb.spawn_hold([&pb]);
    if !until_waiting(&mut w, &mut problems) {
        return verdict(&what, &problems);
    }
    let t0 = Instant::now();
    holder.close_stdout();
    let line = w.read_line(T);
    let took = t0.elapsed();
    eprintln!(
        "netfs {} {backend}: handoff from mount a to mount b in {took:.2?}",
        F::NAME
    );
    match line {
        Some(l) if l.starts_with("OK ") => {}
        l => problems.push(format!(
            "the waiter on mount b said {l:?} within {T:?} of the release; stderr: {}",
            digest(&w.stderr_text())
        )),
    }
    let st = holder.wait_exit(T);
    if code(st) != 0 {
        problems.push(format!(
            "the holder's release exited {}; stderr: {}",
            code(st),
            digest(&holder.stderr_text())
        ));
    }
    verdict(&what, &problems);
}

/// SPEC §3b, "the lock records N while anyone holds *or waits*", on a network filesystem
/// (`lockdir/netroom.rs`): a waiter of 2 slots through mount b keeps one place in
/// `.B.lock.waiting.d/` past twice `stale_after` (renamed every heartbeat period); stopped
/// while the holders leave, it makes a newcomer of 3 through mount a refused (78, naming
/// both), and is then served. A waiter killed (`kill -9`) through mount a leaves its place;
/// the next waiter, through mount b, removes it (its name proves its maker dead) and not a
/// live waiter's. Nothing but the empty room is left on the server at the end.
fn a_waiter_keeps_its_number_across_mounts<F: Mounts>(backend: &str) {
    let Some((fx, sb)) = setup::<F>() else {
        return;
    };
    let (pa, pb) = (format!("{backend}-a"), format!("{backend}-b"));
    let what = format!("{} {backend}: a waiter's number of slots", F::NAME);
    let room = fx.server_dir().join(format!(".{backend}.lock.waiting.d"));
    // The places of process `pid` in the room, read on the server.
    let places_of = |pid: i32| -> usize {
        fs::read_dir(&room)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.split('~').nth(3) == Some(pid.to_string().as_str())
            })
            .count()
    };
    let mut problems = Vec::new();
    let mut holders: Vec<Held> = (0..2).map(|_| sb.hold(["--slots", "2", &pa])).collect();
    for h in &mut holders {
        if !holder_ok(h, "a holder of 2 slots on mount a", &mut problems) {
            return verdict(&what, &problems);
        }
    }
    let mut w = sb.spawn_hold(["-v", "--slots", "2", &pb]);
    w.wait_stderr("waiting in its waiting room", T);
    // Time passing is what is tested: the place outlives its first stamp's window.
    std::thread::sleep(2 * stale_after::<F>() + Duration::from_secs(1));
    if places_of(w.pid()) != 1 {
        problems.push(format!(
            "the waiter has {} place(s) after 2 × stale_after: {:?}",
            places_of(w.pid()),
            fx.server_listing()
        ));
    }
    w.signal(libc::SIGSTOP);
    for mut h in holders {
        h.close_stdout();
        assert_eq!(code(h.wait_exit(T)), 0, "{what}: a holder's release");
    }
    let o = output_within(
        sb.cmd(["--slots", "3", "--wait", "0", "run", &pa, "--", "true"]),
        T,
    );
    let said = stderr(&o);
    if code(o.status) != 78 || !said.contains("waited for with 2 slot(s)") {
        problems.push(format!(
            "a newcomer of 3 beside a stopped waiter of 2 exited {}: {said}",
            code(o.status)
        ));
    }
    w.signal(libc::SIGCONT);
    match w.read_line(T) {
        Some(l) if crate::slots::field(&l, "slots") == Some("2") => {}
        l => problems.push(format!(
            "the waiter said {l:?}; stderr: {}",
            digest(&w.stderr_text())
        )),
    }
    // Both slots held again (the waiter and one more); a waiter through mount b waits, one
    // through mount a is killed waiting; the next, through mount b, removes the killed one's
    // place only (b: sshfs's mount a caches a listing for 20 s, and would show the room as it
    // was).
    let mut second = sb.hold(["--slots", "2", &pa]);
    if !holder_ok(&mut second, "a second holder on mount a", &mut problems) {
        return verdict(&what, &problems);
    }
    let mut live = sb.spawn_hold(["-v", "--slots", "2", &pb]);
    live.wait_stderr("waiting in its waiting room", T);
    let mut killed = sb.spawn_hold(["-v", "--slots", "2", &pa]);
    killed.wait_stderr("waiting in its waiting room", T);
    let killed_pid = killed.pid();
    killed.signal(libc::SIGKILL);
    killed.wait_exit(T);
    let mut next = sb.spawn_hold(["-v", "--slots", "2", &pb]);
    if next
        .stderr_within("removed a dead waiter's place", T)
        .is_none()
    {
        problems.push(format!(
            "the next waiter did not remove the killed one's place; stderr: {}",
            digest(&next.stderr_text())
        ));
    }
    next.wait_stderr("waiting in its waiting room", T);
    let (k, l, n) = (
        places_of(killed_pid),
        places_of(live.pid()),
        places_of(next.pid()),
    );
    if (k, l, n) != (0, 1, 1) {
        problems.push(format!(
            "after tidying: {k} place(s) of the killed waiter, {l} of the live one, {n} of the \
             next: {:?}",
            fs::read_dir(&room).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        ));
    }
    drop(next);
    drop(live);
    for mut h in [w, second] {
        h.close_stdout();
        h.wait_exit(T);
    }
    // The killed waiter may have died in a try, its would-be lock under its private name
    // (`.B.lock.slot-K.<nonce>.<host>.<pid>.<start>.new` or `.tmp`, as a CI run found): one
    // acquisition in 16 removes it, whichever slot it takes.
    let of_killed = format!(".{killed_pid}.");
    for tries in 1.. {
        if !leftovers(&fx, backend)
            .iter()
            .any(|n| n.contains(&of_killed))
        {
            break;
        }
        let o = output_within(
            sb.cmd(["--slots", "2", "--wait", "30s", "run", &pa, "--", "true"]),
            T,
        );
        assert_eq!(code(o.status), 0, "{what}: {}", stderr(&o));
        if tries == 16
            && leftovers(&fx, backend)
                .iter()
                .any(|n| n.contains(&of_killed))
        {
            problems.push(format!(
                "the killed waiter's leftover after 16 acquisitions: {:?}",
                fx.server_listing()
            ));
            break;
        }
    }
    // The room stays (`.B.lock.waiting.d`, docs/LAYOUT.md), empty.
    let left = leftovers(&fx, backend);
    if !left.is_empty() {
        problems.push(format!("left on the server: {left:?}"));
    }
    verdict(&what, &problems);
}

/// Shared symlink locks on a network filesystem are refused (78) through either mount,
/// saying why and what to do instead — a reader's entry is a symlink, whose times a network
/// filesystem may not set, so it could not heartbeat — and leave nothing on the server; an
/// exclusive one through the same profile still works.
fn shared_symlink_is_refused_on_a_network_filesystem<F: Mounts>() {
    let Some((fx, sb)) = setup::<F>() else {
        return;
    };
    for p in ["symlink-a", "symlink-b"] {
        let o = output_within(
            sb.cmd(["--wait", "5s", "--shared", "run", p, "--", "true"]),
            T,
        );
        let err = stderr(&o);
        assert_eq!(code(o.status), 78, "{p}: {err}");
        assert!(
            err.starts_with("ERROR config: ")
                && err.contains("shared symlink locks cannot heartbeat there")
                && err.contains("take it exclusively"),
            "{p}: {err}"
        );
        let o = output_within(sb.cmd(["--wait", "5s", "run", p, "--", "true"]), T);
        assert_eq!(code(o.status), 0, "{p} exclusive: {}", stderr(&o));
    }
    let left = leftovers(&fx, "symlink");
    assert!(left.is_empty(), "left on the server: {left:?}");
}

/// What another user may plant in the lock's directory at the waiting room's names fails
/// nothing and hangs nothing (`lockdir/netroom.rs`): a FIFO at `.mkdir.lock.waiting.d` — a
/// waiter says at `-v` that it cannot wait there and is served, a contender of another number
/// looks past it — and, that gone, a room holding files named like dead places (which
/// `rmdir` cannot remove): a waiter passes them over, takes its place and is served.
fn planted_waiting_room_fails_nothing<F: Mounts>() {
    let Some((fx, sb)) = setup::<F>() else {
        return;
    };
    let what = format!("{} mkdir: a planted waiting room", F::NAME);
    // Planted through mount a where the filesystem makes FIFOs (GlusterFS; a brick is not to
    // be written behind its back), else on the server's disk (sshfs: SFTP makes none).
    let name = ".mkdir.lock.waiting.d";
    let fifo = nix::sys::stat::Mode::from_bits_truncate(0o666);
    let room = if nix::unistd::mkfifo(&fx.mount_point('a').join(name), fifo).is_ok() {
        fx.mount_point('a').join(name)
    } else {
        let room = fx.server_dir().join(name);
        nix::unistd::mkfifo(&room, fifo).unwrap();
        room
    };
    let seen_by_b = fx.mount_point('b').join(name);
    let mut problems = Vec::new();
    for (phase, said) in [
        (
            "a FIFO at the room's name",
            "cannot wait in its waiting room",
        ),
        (
            "dead places nobody can remove",
            "waiting in its waiting room",
        ),
    ] {
        let mut h = sb.hold(["--slots", "2", "mkdir-a"]);
        let mut h2 = sb.hold(["--slots", "2", "mkdir-a"]);
        if !holder_ok(&mut h, "a holder", &mut problems)
            || !holder_ok(&mut h2, "a holder", &mut problems)
        {
            return verdict(&what, &problems);
        }
        let mut w = sb.spawn_hold(["-v", "--slots", "2", "mkdir-b"]);
        if w.stderr_within(said, T).is_none() {
            problems.push(format!(
                "{phase}: the waiter did not say {said:?}; stderr: {}",
                digest(&w.stderr_text())
            ));
        }
        drop(h);
        match w.read_line(T) {
            Some(l) if crate::slots::field(&l, "slots") == Some("2") => {}
            l => problems.push(format!(
                "{phase}: the waiter said {l:?}; stderr: {}",
                digest(&w.stderr_text())
            )),
        }
        drop(w);
        drop(h2);
        // Nobody holds or waits: a contender of 3 looks (the record says 2) and is served.
        let o = output_within(
            sb.cmd([
                "--slots", "3", "--wait", "10s", "run", "mkdir-a", "--", "true",
            ]),
            T,
        );
        if code(o.status) != 0 {
            problems.push(format!(
                "{phase}: a contender of 3 exited {}: {}",
                code(o.status),
                stderr(&o)
            ));
        }
        if phase.starts_with("a FIFO") {
            fs::remove_file(&room).unwrap();
            fs::create_dir(&room).unwrap();
            for k in 0..20 {
                fs::write(room.join(format!("place~2~-~{k}~1~planted~1")), "").unwrap();
            }
            eventually(T, "the room a directory through mount b", || {
                seen_by_b.is_dir()
            });
        }
    }
    verdict(&what, &problems);
}

#[test]
fn sshfs_planted_waiting_room_fails_nothing() {
    planted_waiting_room_fails_nothing::<crate::support::Sshfs>();
}

#[test]
fn gluster_planted_waiting_room_fails_nothing() {
    planted_waiting_room_fails_nothing::<crate::support::Gluster>();
}

#[test]
fn sshfs_shared_symlink_is_refused() {
    shared_symlink_is_refused_on_a_network_filesystem::<crate::support::Sshfs>();
}

#[test]
fn gluster_shared_symlink_is_refused() {
    shared_symlink_is_refused_on_a_network_filesystem::<crate::support::Gluster>();
}

/// Issue 28 item 6 on GlusterFS: a mount as locksmith requires it (`--entry-timeout=0
/// --fopen-keep-cache=off`, no md-cache or quick-read: names and content read fresh) takes a
/// profile that states no `cache_time` the first time — its cache time is the kernel's
/// attribute (1 s by default) and negative caches, read from the client's command line — and a
/// `stale_after` not above that is refused (78) saying on whose word. Before, 60 s was assumed
/// and a default profile refused.
#[test]
fn gluster_cache_time_comes_from_the_clients_command_line() {
    let Some(g) = Gluster::start_fresh_names() else {
        return;
    };
    let sb = Sandbox::new("");
    for b in ["mkdir", "link", "symlink"] {
        let a = format!("{b}:{}/d-{b}.lock", g.mount_point('a').display());
        let o = output_within(sb.cmd(["--wait", "5s", "run", &a, "--", "true"]), T);
        assert_eq!(code(o.status), 0, "{b}: {}", stderr(&o));
        let short = format!("{a}?stale_after=1s&keepalive=200ms");
        let o = output_within(sb.cmd(["--wait", "0", "run", &short, "--", "true"]), T);
        let err = stderr(&o);
        assert_eq!(code(o.status), 78, "{b}: {err}");
        assert!(err.contains("client's command line"), "{b}: {err}");
    }
    let left: Vec<String> = g
        .server_listing()
        .into_iter()
        .filter(|n| n.starts_with("d-") || n.ends_with(".new") || n.ends_with(".tomb"))
        .collect();
    assert!(left.is_empty(), "left on the server: {left:?}");
}

macro_rules! on_each_backend {
    // `#[…]` before a backend goes on its kill -9 soak (an `ignore` with its reason).
    ($fs:ident: $F:ty; $($(#[$soak:meta])* $backend:ident),*) => {
        mod $fs {
            #[test]
            fn flock_on_fuse_is_refused_unless_local() {
                super::flock_on_fuse_is_refused_unless_local::<$F>();
            }

            $(
            mod $backend {
                const B: &str = stringify!($backend);

                #[test]
                fn counter_race_across_mounts() {
                    super::super::counter_race_across_mounts::<$F>(B);
                }

                $(#[$soak])*
                #[test]
                fn kill9_soak_across_mounts() {
                    super::super::kill9_soak_across_mounts::<$F>(B);
                }

                #[test]
                fn live_holder_is_never_broken() {
                    super::super::live_holder_is_never_broken::<$F>(B);
                }

                #[test]
                fn stale_takeover_lands_in_specs_window() {
                    super::super::stale_takeover_lands_in_specs_window::<$F>(B);
                }

                #[test]
                fn handoff_across_mounts() {
                    super::super::handoff_across_mounts::<$F>(B);
                }

                #[test]
                fn a_waiter_keeps_its_number_across_mounts() {
                    super::super::a_waiter_keeps_its_number_across_mounts::<$F>(B);
                }
            }
            )*
        }
    };
}

// mkdir's soak across sshfs mounts gets fewer acquisitions through than link's and symlink's
// (20–31 of 160; the bound is 8): a lock released through mount b stays visible to mkdir(2)
// through mount a for up to sshfs's default 20 s name cache (measured with plain mkdir(2):
// 20.1–20.4 s on mount a, 1.1–1.4 s on mount b), and mkdir's waiter, unlike link's and
// symlink's, makes no successful call on NAME that would empty that cache (their fresh reads
// link NAME to a pin). Safe, slow; README says which mount options avoid it.
on_each_backend!(sshfs: crate::support::Sshfs; mkdir, link, symlink);
// The symlink race here once caught a real break of a live holder under CI load (tokens
// 160 → 159): an acquisition stalled past stale_after between making the lock and writing its
// records. Such an acquisition now gives the lock back (crash::holder_stalled_…).
on_each_backend!(gluster: crate::support::Gluster; mkdir, link, symlink);
// SMB (Samba + smbnetfs): only mkdir can lock there (`smb_link_and_symlink_refuse_naming_the_call`).
// Its soak used to get as few as 5–7 of 160 acquisitions through (the floor is > 4; 58–61 in
// other runs): with no RENAME_NOREPLACE, mkdir was `mkdir(NAME)` then its records — several SMB
// round trips — and a locker killed in between left a lock without a record, broken only after
// stale_after (5 s here) while kills come every 50–450 ms. Now the lock directory is prepared
// complete and published by a plain rename(2), which never replaces a directory that is not
// empty (mkdir.rs, `create_published`): a killed locker leaves a lock proof of death breaks at
// once. Measured with `CI=true` on two loaded cores: before, 7 of 160 (153 kills, most of them
// of waiters stuck behind such locks); after, 120, 121, 120, 121, 126, 127, 132, 130, 137, 133
// of 160 in 10 runs alone, 108 beside the other SMB tests (27–59 kills each: a run now takes
// 8–15 s, not 45 s). The safety checks are the soak's own, unchanged.
on_each_backend!(smb: crate::support::Smb; mkdir);

/// flock(2) through FUSE is node-local as far as locksmith can know (sshfs: it is; GlusterFS
/// forwards it to its locks translator): refused (78, naming the filesystem) unless the
/// profile says every contender is on this host.
fn flock_on_fuse_is_refused_unless_local<F: Mounts>() {
    let Some((_fx, sb)) = setup::<F>() else {
        return;
    };
    let mut problems = Vec::new();
    let o = sb.output(["--wait", "0", "run", "flock-a", "--", "true"]);
    let err = stderr(&o);
    let line = err.lines().find(|l| l.starts_with("ERROR ")).unwrap_or("");
    if code(o.status) != 78 || !line.to_lowercase().contains("fuse") {
        problems.push(format!(
            "flock on mount a: exit {} (78 expected), stderr {err:?} (an ERROR line naming FUSE / fuse.sshfs expected)",
            code(o.status)
        ));
    }
    let o = sb.output(["--wait", "0", "run", "flock-a-local", "--", "true"]);
    if code(o.status) != 0 {
        problems.push(format!(
            "flock on mount a with local = true: exit {} (0 expected), stderr {:?}",
            code(o.status),
            stderr(&o)
        ));
    }
    verdict("flock on FUSE", &problems);
}

/// The fixture itself: both mounts show the served directory, a write through a mount lands on
/// the server, and drop leaves nothing behind (no mount, no process, no directory).
#[test]
fn sshfs_fixture_mounts_twice_and_cleans_up() {
    let Some(fx) = NotStarted::or_skip(Sshfs::start()) else {
        return;
    };
    std::fs::write(fx.server.join("hello"), "hi").unwrap();
    for m in ['a', 'b'] {
        let seen = std::fs::read_to_string(fx.mount_point(m).join("hello"));
        assert_eq!(seen.ok().as_deref(), Some("hi"), "through mount {m}");
    }
    std::fs::write(fx.b.join("from-b"), "b").unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.server.join("from-b")).unwrap(),
        "b"
    );
    let (a, b) = (fx.a.clone(), fx.b.clone());
    let root = a.parent().unwrap().to_path_buf();
    let pids = fx.processes();
    assert!(
        pids.len() >= 5,
        "sshfs ×2, socat, a fork per mount: {pids:?}"
    );
    drop(fx);
    assert!(!mounted(&a) && !mounted(&b), "a mount outlived the fixture");
    let left: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes outlived the fixture: {left:?}");
    assert!(!root.exists(), "{} outlived the fixture", root.display());
}

/// The SMB fixture itself: both mounts show the share's `dir`, a write through one mount
/// lands on the server and shows through the other, and drop leaves nothing behind.
#[test]
fn smb_fixture_mounts_twice_and_cleans_up() {
    let Some(fx) = NotStarted::or_skip(Smb::start()) else {
        return;
    };
    std::fs::write(fx.server.join("hello"), "hi").unwrap();
    for m in ['a', 'b'] {
        let seen = std::fs::read_to_string(fx.mount_point(m).join("hello"));
        assert_eq!(seen.ok().as_deref(), Some("hi"), "through mount {m}");
    }
    std::fs::write(fx.b.join("from-b"), "b").unwrap();
    assert_eq!(
        std::fs::read_to_string(fx.server.join("from-b")).unwrap(),
        "b"
    );
    assert_eq!(std::fs::read_to_string(fx.a.join("from-b")).unwrap(), "b");
    let root = fx.share.parent().unwrap().to_path_buf();
    let mounts = [root.join("ma"), root.join("mb")];
    let pids = fx.processes();
    assert!(pids.len() >= 3, "smbnetfs ×2, smbd: {pids:?}");
    drop(fx);
    assert!(
        !mounts.iter().any(|m| testkit::smb::mounted(m)),
        "a mount outlived the fixture"
    );
    let left: Vec<i32> = pids.into_iter().filter(|&p| alive(p)).collect();
    assert!(left.is_empty(), "processes outlived the fixture: {left:?}");
    assert!(!root.exists(), "{} outlived the fixture", root.display());
}

/// On SMB (no `link(2)`: EPERM; no `symlink(2)`: ENOSYS) the link and symlink backends refuse
/// with 78 naming the missing call and leave nothing on the server; mkdir at the share's root
/// (0777 as smbnetfs shows it, whatever the server allows) is refused with what to do instead.
#[test]
fn smb_link_and_symlink_refuse_naming_the_call() {
    let Some((fx, sb)) = setup::<Smb>() else {
        return;
    };
    let mut problems = Vec::new();
    for (backend, call) in [("link", "link(2)"), ("symlink", "symlink(2)")] {
        let o = sb.output(["--wait", "0", "run", &format!("{backend}-a"), "--", "true"]);
        let err = stderr(&o);
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("ERROR ")).collect();
        if code(o.status) != 78
            || errors.len() != 1
            || !errors[0].starts_with("ERROR config: ")
            || !errors[0].contains(call)
            || !errors[0].contains("\"mkdir\"")
        {
            problems.push(format!(
                "{backend} on SMB: exit {} (78 expected), stderr {err:?} (one ERROR config line naming {call} and backend \"mkdir\" expected)",
                code(o.status)
            ));
        }
    }
    let left = fx.server_listing();
    if !left.is_empty() {
        problems.push(format!("left on the server: {left:?}"));
    }
    let at_root = format!(
        "mkdir:{}/x.lock?cache_time=1s&stale_after=3s&keepalive=300ms",
        fx.root_a.display()
    );
    let o = sb.output(["--wait", "0", "run", &at_root, "--", "true"]);
    let err = stderr(&o);
    if code(o.status) != 78 || !err.contains("subdirectory") || !err.contains("fuse.smbnetfs") {
        problems.push(format!(
            "mkdir at the share's root: exit {} (78 expected), stderr {err:?} (the filesystem and a subdirectory to use expected)",
            code(o.status)
        ));
    }
    verdict("SMB link and symlink", &problems);
}

/// Issue 28 item 7: `verify` (with `--peer` through the other mount) leaves the directory on
/// the SMB server as it found it, run after run — SMB refuses to remove a name another
/// client still has open (and through FUSE a file closed a moment ago may still be open
/// there), and such names were left before. Its verdict for mkdir is ok: nothing it relies on
/// there needs a symbolic link.
#[test]
fn smb_verify_leaves_nothing_on_the_server() {
    let Some((fx, sb)) = setup::<Smb>() else {
        return;
    };
    let before = fx.server_listing();
    let peer = fx.b.display().to_string();
    let mut problems = Vec::new();
    for run in 0..4 {
        let o = sb.output(["verify", "--peer", &peer, "mkdir-a"]);
        let left: Vec<String> = fx
            .server_listing()
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        // mkdir relies on nothing SMB lacks: the verdict is ok (exit 0). It publishes its
        // lock there by a rename onto NAME, refused while NAME holds a lock: checked and relied on.
        let onto_full = stdout(&o)
            .lines()
            .any(|l| l.trim_start().starts_with("rename onto a full dir") && l.contains(" ok "));
        if code(o.status) != 0
            || !stdout(&o).contains("verdict: ok")
            || !onto_full
            || !left.is_empty()
            || stdout(&o).contains("could not remove")
        {
            problems.push(format!(
                "run {run}: exit {}, left on the server {left:?}; stdout:\n{}",
                code(o.status),
                stdout(&o)
            ));
        }
    }
    verdict("verify on SMB", &problems);
}

/// On SMB a holder whose lock is removed (on the server, as a cleaner or an admin would)
/// says LOST within a few heartbeats and exits 74; the next holder, through the other mount,
/// gets a greater fencing token.
#[test]
fn smb_mkdir_holder_is_lost_when_its_lock_is_removed() {
    let Some((fx, sb)) = setup::<Smb>() else {
        return;
    };
    let mut h = sb.hold(["mkdir-a"]);
    let first = token_of(h.ok());
    // A few heartbeats go by unnoticed: no LOST while the lock is there.
    assert_eq!(
        h.read_line(heartbeat::<Smb>() * 4),
        None,
        "the holder said something while holding: {}",
        h.stderr_text()
    );
    let removed = Instant::now();
    fs::remove_dir_all(fx.server.join("mkdir.lock")).unwrap();
    let bound = heartbeat::<Smb>() * 2 + cache_time::<Smb>() + Duration::from_secs(1);
    let lost = h.read_line(bound);
    let took = removed.elapsed();
    let lost = lost.unwrap_or_else(|| {
        panic!(
            "no LOST line within {bound:?} of the removal: {}",
            h.stderr_text()
        )
    });
    assert!(lost.starts_with("LOST "), "{lost:?}");
    assert_eq!(code(h.wait_exit(T)), 74, "{}", h.stderr_text());
    eprintln!("netfs smb mkdir: LOST {took:.2?} after the lock was removed on the server");
    let mut next = sb.hold(["mkdir-b"]);
    let second = token_of(next.ok());
    assert!(second > first, "token {second} after {first}");
    next.close_stdout();
    assert_eq!(code(next.wait_exit(T)), 0, "{}", next.stderr_text());
    let left = leftovers(&fx, "mkdir");
    assert!(left.is_empty(), "left on the server: {left:?}");
}

/// On SMB a locker killed while making its lock — its directory made, its records not yet
/// written (`LOCKSMITH_TEST_STALL_MAKING_MS`) — blocks nobody: the lock directory is published
/// complete by rename (mkdir.rs, `create_published`), so what the killed locker made is
/// private and the next locker, through the other mount, gets in at once. With `mkdir(NAME)`
/// then the records (the path NFS takes, `LOCKSMITH_MKDIR_PLAIN=1`) the next locker waited
/// out stale_after: 5.1 s here (54–79 ms now, median 61 ms in 6 runs), and the kill -9 soak
/// got 5–7 of 160 acquisitions through.
#[test]
fn smb_mkdir_locker_killed_while_making_its_lock_blocks_nobody() {
    let Some((fx, sb)) = setup::<Smb>() else {
        return;
    };
    let mut c = sb.cmd(["-v", "--wait", "0", "run", "mkdir-a", "--", "true"]);
    c.env("LOCKSMITH_TEST_STALL_MAKING_MS", "60000")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut locker = c.spawn().unwrap();
    // Its stderr, read as it comes: a locker's first `.mkdir.lock.<nonce>.new` on SMB is
    // made before it learns there is no RENAME_NOREPLACE (and removed at once, unstalled);
    // the one it stalls on comes after it says so (a CI run killed it on the first, and
    // found nothing left).
    let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let said = said.clone();
        let mut err = locker.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = std::io::Read::read(&mut err, &mut buf) {
                if n == 0 {
                    break;
                }
                said.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let learnt = || said.lock().unwrap().contains("publishing by rename");
    // Stalled once its directory is on the server (`.mkdir.lock.<nonce>.new`) after that.
    let made = || {
        fs::read_dir(&fx.server).unwrap().flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(".mkdir.lock.") && n.ends_with(".new")
        })
    };
    let t0 = Instant::now();
    while !(learnt() && made()) {
        if t0.elapsed() > T {
            kill9(locker.id() as i32);
            let _ = locker.wait();
            panic!(
                "the locker made no directory within {T:?}: {}",
                said.lock().unwrap()
            );
        }
        std::thread::sleep(POLL);
    }
    kill9(locker.id() as i32);
    let _ = locker.wait();
    let _ = reader.join();
    let unpublished = || -> Vec<String> {
        leftovers(&fx, "mkdir")
            .into_iter()
            .filter(|n| n.starts_with(".mkdir.lock.") && n.ends_with(".new"))
            .collect()
    };
    // Counted before the next locker: its own acquisition may be the one in 16 that tidies.
    assert_eq!(unpublished().len(), 1, "{:?}", fx.server_listing());
    let killed = Instant::now();
    let o = output_within(
        sb.cmd(["--wait", "30s", "run", "mkdir-b", "--", "true"]),
        Duration::from_secs(60),
    );
    let took = killed.elapsed();
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    eprintln!("netfs smb mkdir: the next locker got in {took:.2?} after the kill");
    assert!(
        took < stale_after::<Smb>() / 2,
        "the next locker waited {took:?} after a locker was killed while making the lock (stale_after {:?}): {}",
        stale_after::<Smb>(),
        stderr(&o)
    );
    // What it made (`.mkdir.lock.<nonce>.<host>.<pid>.<start>.new`, no record inside yet) is
    // tidied within 16 acquisitions, through either mount: its name says its maker is dead,
    // and nothing of it is looked into (issue 28).
    for tries in 1.. {
        if unpublished().is_empty() {
            break;
        }
        let p = if tries % 2 == 0 { "mkdir-a" } else { "mkdir-b" };
        let o = output_within(
            sb.cmd(["--wait", "30s", "run", p, "--", "true"]),
            Duration::from_secs(60),
        );
        assert_eq!(code(o.status), 0, "{}", stderr(&o));
        assert!(
            tries < 16 || unpublished().is_empty(),
            "left after {tries}: {:?}",
            fx.server_listing()
        );
    }
    let left = leftovers(&fx, "mkdir");
    assert!(left.is_empty(), "left on the server: {left:?}");
}
