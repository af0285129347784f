//! `locksmith verify [--peer DIR] PROFILE` (issue 12, item 2): the report's lines, its verdict
//! and exit code, on a local directory and on real network filesystems (sshfs mounted twice,
//! GlusterFS mounted twice: the fixtures of `tests/netfs.rs`). No mocks, no sleeps: every figure
//! is what verify measured on a real mount.
//!
//! - local: every file backend is safe (exit 0) with the lines its backend relies on `ok`;
//!   nothing is left beside the lock; a peer on the lock's own mount measures nothing across;
//!   a directory anyone may write is `FAIL` (78); a wrong `--peer` is 64;
//! - sshfs: `mkdir`, `link`, `symlink` with `cache_time = "1s"` pass through the peer (content
//!   delays measured within it), with a too-small `stale_after` fail (78) naming what to set;
//!   `flock` fails across the mounts even with `local = true`; through the peer with sshfs's
//!   default 20 s cache, names and readlink show late (measured) while records do not;
//! - GlusterFS: records show through the other mount up to ~1 s late, so `cache_time = "1s"`
//!   is refused with a measured suggestion, and a larger one passes;
//! - the server backends against the suite's real servers (libunftp, pure-ftpd, vsftpd,
//!   PostgreSQL, etcd): 0 with every relied-on line `ok`, by profile and by address, nothing
//!   left on the server; a wrong password 77, a closed port 69, a missing parent or database
//!   78; PostgreSQL ending idle sessions sooner than the heartbeat and etcd granting leases
//!   longer than `stale_after` are `FAIL` (78) naming what to set.
//! - over TLS (FTPS explicit on libunftp, implicit on vsftpd; etcd `https://`) with a private
//!   CA as `ca_file`: 0 as in plain, nothing left; the system CAs instead refuse the test leaf:
//!   69 in one `ERROR unavailable:` line naming `ca_file`, the password shown nowhere.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use crate::postgres::PgSandbox;
use crate::support::*;

/// `status` and `detail` of the report line for `property`.
fn line<'a>(out: &'a str, property: &str) -> Option<(&'a str, &'a str)> {
    out.lines().find_map(|l| {
        let rest = l.trim_start().strip_prefix(property)?;
        if !rest.starts_with("  ") {
            return None;
        }
        let rest = rest.trim_start();
        let (status, detail) = rest.split_once(' ').unwrap_or((rest, ""));
        Some((status, detail.trim_start()))
    })
}

/// A figure of the report (`4ms`, `1.92s`) at the start of `detail`.
fn figure(detail: &str) -> Option<Duration> {
    let word = detail.split([' ', ':']).next()?;
    if let Some(ms) = word.strip_suffix("ms") {
        return ms.parse().ok().map(Duration::from_millis);
    }
    word.strip_suffix('s')?
        .parse()
        .ok()
        .map(Duration::from_secs_f64)
}

/// Checks `property`'s status; a problem (with the whole report) if it differs.
fn expect(out: &str, property: &str, status: &str, problems: &mut Vec<String>) {
    match line(out, property) {
        Some((s, _)) if s == status => {}
        got => problems.push(format!("{property}: {got:?}, {status} expected")),
    }
}

fn verdict(what: &str, o: &Output, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n- {}\nexit {}, stdout:\n{}stderr:\n{}",
        problems.len(),
        problems.join("\n- "),
        code(o.status),
        stdout(o),
        stderr(o)
    );
}

/// Probe names left in `dir` (the names verify makes contain `.verify.`).
fn probes_left(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let n = e.ok()?.file_name().to_string_lossy().into_owned();
            n.contains(".verify.").then_some(n)
        })
        .collect()
}

/// The property each backend takes its lock name by.
fn taking(backend: &str) -> &'static str {
    match backend {
        "flock" | "f" => "flock on this mount",
        "mkdir" | "m" => "mkdir exclusive",
        "link" | "l" => "link exclusive",
        _ => "symlink exclusive",
    }
}

#[test]
fn verify_on_a_local_directory_passes_every_file_backend() {
    let sb = Sandbox::standard();
    let before = sb.listing();
    for p in LOCAL {
        let o = sb.output(["verify", p]);
        let out = stdout(&o);
        let mut problems = Vec::new();
        if code(o.status) != 0 {
            problems.push(format!("exit {} (0 expected)", code(o.status)));
        }
        match line(&out, "filesystem") {
            Some(("info", d)) if d.ends_with(": local") => {}
            got => problems.push(format!("filesystem: {got:?}")),
        }
        for (property, status) in [
            ("directory", "ok"),
            (taking(p), "ok"),
            ("rename over a name", "ok"),
            ("token state moves", "ok"),
            ("rename atomicity", "info"),
            ("peer", "unmeasured"),
            ("cross-mount delays", "unmeasured"),
            ("profile", "ok"),
        ] {
            expect(&out, property, status, &mut problems);
        }
        match p {
            // Their heartbeat on a local filesystem: a symlink's times (and mkdir's record).
            "m" | "s" => expect(&out, "symlink times", "ok", &mut problems),
            "l" => {
                expect(&out, "record rewrite", "ok", &mut problems);
                expect(&out, "link count", "info", &mut problems);
            }
            _ => expect(&out, "flock across mounts", "unmeasured", &mut problems),
        }
        if p == "m" {
            expect(&out, "record rewrite", "ok", &mut problems);
            // Measured, relied on only without RENAME_NOREPLACE and symlinks (SMB).
            expect(&out, "rename onto a full dir", "info", &mut problems);
        }
        if !out
            .lines()
            .last()
            .unwrap_or("")
            .starts_with("verdict: ok — ")
        {
            problems.push("the last line is not `verdict: ok — …`".into());
        }
        if out.contains("FAIL") || !stderr(&o).is_empty() {
            problems.push("a FAIL or a word on stderr".into());
        }
        verdict(&format!("verify {p}"), &o, &problems);
    }
    assert_eq!(
        sb.listing(),
        before,
        "verify left something beside the locks"
    );
}

/// `verify ADDRESS` on a local directory: the same probes and verdict as by profile, the
/// header naming the address, with no profiles file anywhere (issue 12 item 2 with issue 14).
#[test]
fn verify_by_address_of_every_file_backend_needs_no_profiles_file() {
    let dir = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    for (address, taking) in [
        (
            format!("{}/f.lock", dir.path().display()),
            "flock on this mount",
        ),
        (
            format!("mkdir:{}/m.lock?stale_after=30s", dir.path().display()),
            "mkdir exclusive",
        ),
        (format!("link:{}/l.lock", dir.path().display()), taking("l")),
        (
            format!("symlink:{}/s.lock", dir.path().display()),
            taking("s"),
        ),
    ] {
        let mut c = std::process::Command::new(bin());
        c.args(["verify", &address])
            .env_remove("LOCKSMITH_PROFILES")
            .env_remove("XDG_CONFIG_HOME")
            .env("HOME", home.path());
        let o = output_within(c, Duration::from_secs(60));
        let out = stdout(&o);
        let mut problems = Vec::new();
        if !out.starts_with(&format!("locksmith verify {address}: backend ")) {
            problems.push("the header does not name the address".into());
        }
        expect(&out, taking, "ok", &mut problems);
        expect(&out, "profile", "ok", &mut problems);
        if !out
            .lines()
            .last()
            .unwrap_or("")
            .starts_with("verdict: ok — ")
        {
            problems.push("the last line is not `verdict: ok — …`".into());
        }
        verdict(&format!("verify {address}"), &o, &problems);
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "verify left {left:?}");
}

/// verify never touches the lock: a holder keeps it, says nothing, and releases cleanly.
#[test]
fn verify_beside_a_held_lock_leaves_it_alone() {
    let sb = Sandbox::standard();
    for p in ["m", "l", "s"] {
        let mut holder = sb.hold([p]);
        holder.ok();
        let o = sb.output(["verify", p]);
        assert_eq!(
            code(o.status),
            0,
            "verify {p} beside its held lock: {}",
            stdout(&o)
        );
        let st = sb.output(["status", p]);
        assert_eq!(
            code(st.status),
            1,
            "{p} is no longer held after verify: {}",
            stdout(&st)
        );
        assert_eq!(
            holder.read_line(Duration::from_millis(1)),
            None,
            "{p}: the holder spoke"
        );
        holder.close_stdout();
        assert_eq!(
            code(holder.wait_exit(Duration::from_secs(10))),
            0,
            "{p}: release"
        );
    }
    assert!(probes_left(sb.path()).is_empty());
}

#[test]
fn verify_with_a_peer_on_the_same_mount_measures_nothing_across() {
    let sb = Sandbox::standard();
    let dir = sb.path().display().to_string();
    let o = sb.output(["verify", "--peer", &dir, "m"]);
    let out = stdout(&o);
    let mut problems = Vec::new();
    if code(o.status) != 0 {
        problems.push(format!("exit {} (0 expected)", code(o.status)));
    }
    match line(&out, "peer") {
        Some(("unmeasured", d)) if d.contains("own mount") => {}
        got => problems.push(format!("peer: {got:?}")),
    }
    expect(&out, "cross-mount delays", "unmeasured", &mut problems);
    verdict("verify --peer <the lock's own directory>", &o, &problems);
    assert!(probes_left(sb.path()).is_empty());
}

/// A wrong `--peer` is 64; so is a `--peer` for a server backend (every host sees its server
/// alike); a server backend whose server does not answer is 69, as for taking the lock.
#[test]
fn verify_refuses_a_wrong_peer_with_64_and_a_silent_server_with_69() {
    let sb = Sandbox::new(
        r#"
[profile.m]
backend = "mkdir"
path = "{dir}/locks/m.lock"

[profile.e]
backend = "etcd"
endpoints = ["http://127.0.0.1:1"]
prefix = "/locks/x"
"#,
    );
    std::fs::create_dir(sb.join("locks")).unwrap();
    std::fs::create_dir(sb.join("elsewhere")).unwrap();
    let elsewhere = sb.join("elsewhere").display().to_string();
    let missing = sb.join("missing").display().to_string();
    for (args, want, needle) in [
        (
            vec!["verify", "--peer", &elsewhere, "m"],
            64,
            "another directory",
        ),
        (vec!["verify", "--peer", &missing, "m"], 64, "--peer"),
        (
            vec!["verify", "--peer", &elsewhere, "e"],
            64,
            "file backends",
        ),
        (vec!["status", "--peer", &elsewhere, "m"], 64, "--peer"),
        (vec!["verify", "e"], 69, "127.0.0.1:1"),
    ] {
        let o = sb.output(&args);
        let err = stderr(&o);
        let kind = if want == 64 {
            "ERROR usage: "
        } else {
            "ERROR unavailable: "
        };
        assert!(
            code(o.status) == want && err.starts_with(kind) && err.contains(needle),
            "{args:?}: exit {}, stderr {err:?} ({want} and an {kind:?} line naming {needle:?} expected)",
            code(o.status)
        );
    }
    assert!(probes_left(&sb.join("locks")).is_empty());
}

#[test]
fn verify_fails_a_directory_anyone_may_write() {
    use std::os::unix::fs::PermissionsExt;
    let sb = Sandbox::new(
        r#"
[profile.m]
backend = "mkdir"
path = "{dir}/open/m.lock"
"#,
    );
    let open = sb.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = sb.output(["verify", "m"]);
    let out = stdout(&o);
    let mut problems = Vec::new();
    expect(&out, "directory", "FAIL", &mut problems);
    if code(o.status) != 78 || !stderr(&o).starts_with("ERROR config: ") {
        problems.push("exit 78 with an ERROR config line expected".into());
    }
    if !out.contains("verdict: FAIL — ") {
        problems.push("no `verdict: FAIL — …` line".into());
    }
    verdict("verify on a directory anyone may write", &o, &problems);
    assert!(probes_left(&open).is_empty());
}

// ---- sshfs ---------------------------------------------------------------------------------

/// A profile on mount `m` of `fx`: `backend`, lock `B.lock`, short timings, `keys`.
fn profile(fx: &Sshfs, name: &str, backend: &str, m: char, keys: &[&str]) -> String {
    let mut s = String::new();
    writeln!(s, "[profile.{name}]").unwrap();
    writeln!(s, "backend = \"{backend}\"").unwrap();
    let path = fx.mount_point(m).join(format!("{backend}.lock"));
    writeln!(s, "path = \"{}\"", path.display()).unwrap();
    writeln!(s, "keepalive = \"300ms\"").unwrap();
    for k in keys {
        writeln!(s, "{k}").unwrap();
    }
    s.push('\n');
    s
}

/// The profiles of the sshfs tests, for every heartbeat backend B on mount `a` and `b`:
/// `B-a` / `B-b` with `cache_time = "1s"` and `stale_after = "3s"` (as `tests/netfs.rs`),
/// `B-a-nocache` without cache_time, `B-a-short` with stale_after no longer than it;
/// `flock-a`, `flock-a-local`.
fn sshfs_profiles(fx: &Sshfs) -> String {
    let mut t = String::new();
    for b in ["mkdir", "link", "symlink"] {
        for m in ['a', 'b'] {
            t += &profile(
                fx,
                &format!("{b}-{m}"),
                b,
                m,
                &["cache_time = \"1s\"", "stale_after = \"3s\""],
            );
        }
        t += &profile(
            fx,
            &format!("{b}-a-nocache"),
            b,
            'a',
            &["stale_after = \"3s\""],
        );
        t += &profile(
            fx,
            &format!("{b}-a-short"),
            b,
            'a',
            &["cache_time = \"1s\"", "stale_after = \"1s\""],
        );
    }
    t += &profile(fx, "flock-a", "flock", 'a', &[]);
    t += &profile(fx, "flock-a-local", "flock", 'a', &["local = true"]);
    t
}

fn sshfs() -> Option<(Sshfs, Sandbox)> {
    let fx = NotStarted::or_skip(Sshfs::start())?;
    let sb = Sandbox::new(&sshfs_profiles(&fx));
    Some((fx, sb))
}

/// The lines every heartbeat backend relies on through a peer on a network filesystem.
const FRESH: [&str; 3] = [
    "content delay (rewrite)",
    "content delay (rename)",
    "pinned read delay",
];

/// Through mount b (1 s cache) from mount a: every heartbeat backend with cache_time = "1s"
/// is safe; its records showed through the peer within that; the link count sshfs
/// misreports is measured (info: link judges by content); a symlink's own times cannot be set
/// (info: the heartbeat there is a record file).
#[test]
fn sshfs_heartbeat_backends_with_cache_time_pass_through_the_peer() {
    let Some((fx, sb)) = sshfs() else { return };
    let peer = fx.b.display().to_string();
    for b in ["mkdir", "link", "symlink"] {
        let o = sb.output(["verify", "--peer", &peer, &format!("{b}-a")]);
        let out = stdout(&o);
        let mut problems = Vec::new();
        if code(o.status) != 0 {
            problems.push(format!("exit {} (0 expected)", code(o.status)));
        }
        match line(&out, "filesystem") {
            Some(("info", d)) if d.contains("fuse.sshfs") => {}
            got => problems.push(format!("filesystem: {got:?}")),
        }
        for p in [
            "directory",
            "peer",
            taking(b),
            "rename over a name",
            "token state moves",
            "pin (link a symlink)",
            "record rewrite",
            "profile",
        ] {
            expect(&out, p, "ok", &mut problems);
        }
        let mut figures = Vec::new();
        for p in FRESH.iter().chain(&[
            "name delay (create)",
            "name delay (remove)",
            "readlink delay",
        ]) {
            match line(&out, p).map(|(s, d)| (s, figure(d))) {
                Some(("ok" | "info", Some(d)))
                    if FRESH.contains(p) && d > Duration::from_millis(750) =>
                {
                    problems.push(format!(
                        "{p}: {d:?}, no room within cache_time 1s, yet not FAIL"
                    ));
                }
                Some((s, Some(d))) => figures.push(format!("{p} {s} {d:.2?}")),
                got => problems.push(format!("{p}: {got:?} (a figure expected)")),
            }
        }
        eprintln!(
            "verify sshfs {b} on mount a, peer b: {}",
            figures.join(", ")
        );
        match (b, line(&out, "link count")) {
            ("link", Some(("info", d))) => eprintln!("verify sshfs link count: {d}"),
            ("link", got) => problems.push(format!("link count: {got:?}")),
            _ => {}
        }
        if b != "link" {
            expect(&out, "symlink times", "info", &mut problems);
        }
        let last = out.lines().last().unwrap_or("");
        if !(last.starts_with("verdict: ok — ") && last.contains("accepts stale_after above 1s"))
        {
            problems.push(format!(
                "last line {last:?}: an ok verdict accepting stale_after above 1s expected"
            ));
        }
        verdict(&format!("verify {b}-a --peer b"), &o, &problems);
        let left: Vec<String> = fx
            .server_listing()
            .into_iter()
            .filter(|n| n.contains(".verify."))
            .collect();
        assert!(left.is_empty(), "verify {b}-a left {left:?} on the server");
    }
}

/// The rule's refusals, with what to set: no cache_time with stale_after 3 s (mount a's sshfs
/// process runs with sshfs's defaults: 20 s + 1 s for its whole-second clock + the kernel's
/// 1 s = 22 s) → 78 naming stale_after and the measured cache_time; stale_after not above cache_time →
/// 78 naming stale_after. Without --peer the delays are unmeasured, said so.
#[test]
fn sshfs_too_small_stale_after_fails_naming_what_to_set() {
    let Some((fx, sb)) = sshfs() else { return };
    let peer = fx.b.display().to_string();
    for b in ["mkdir", "link", "symlink"] {
        let o = sb.output(["verify", "--peer", &peer, &format!("{b}-a-nocache")]);
        let (out, err) = (stdout(&o), stderr(&o));
        let mut problems = Vec::new();
        expect(&out, "profile", "FAIL", &mut problems);
        for p in FRESH {
            expect(&out, p, "ok", &mut problems);
        }
        if code(o.status) != 78
            || !err.starts_with("ERROR config: ")
            || !err.contains("stale_after above 22s")
            || !err.contains("sshfs's defaults")
            || !err.contains("cache_time = \"1s\"")
        {
            problems.push(
                "78 naming `stale_after above 22s` (sshfs's defaults) and the measured `cache_time = \"1s\"` expected"
                    .into(),
            );
        }
        verdict(&format!("verify {b}-a-nocache --peer b"), &o, &problems);

        let o = sb.output(["verify", &format!("{b}-a-short")]);
        let (out, err) = (stdout(&o), stderr(&o));
        let mut problems = Vec::new();
        expect(&out, "profile", "FAIL", &mut problems);
        match line(&out, "cross-mount delays") {
            Some(("unmeasured", d)) if d.contains("no --peer") => {}
            got => problems.push(format!("cross-mount delays: {got:?}")),
        }
        if code(o.status) != 78 || !err.contains("stale_after above 1s") {
            problems.push("78 naming `stale_after above 1s` expected".into());
        }
        verdict(&format!("verify {b}-a-short"), &o, &problems);
    }
    let left: Vec<String> = fx
        .server_listing()
        .into_iter()
        .filter(|n| n.contains(".verify."))
        .collect();
    assert!(left.is_empty(), "verify left {left:?} on the server");
}

/// flock(2) through FUSE is node-local: across the mounts it excludes nothing. FAIL (78)
/// through the peer, whether or not the profile says local = true; without a peer, local =
/// true passes (every contender on this host and this mount), and across is unmeasured.
#[test]
fn sshfs_flock_fails_across_mounts() {
    let Some((fx, sb)) = sshfs() else { return };
    let peer = fx.b.display().to_string();
    for p in ["flock-a", "flock-a-local"] {
        let o = sb.output(["verify", "--peer", &peer, p]);
        let out = stdout(&o);
        let mut problems = Vec::new();
        expect(&out, "flock on this mount", "ok", &mut problems);
        expect(&out, "flock across mounts", "FAIL", &mut problems);
        expect(
            &out,
            "profile",
            if p == "flock-a" { "FAIL" } else { "ok" },
            &mut problems,
        );
        if code(o.status) != 78 || !stderr(&o).contains("node-local") {
            problems.push("78 saying flock is node-local expected".into());
        }
        verdict(&format!("verify {p} --peer b"), &o, &problems);
    }
    let o = sb.output(["verify", "flock-a-local"]);
    let out = stdout(&o);
    let mut problems = Vec::new();
    expect(&out, "flock across mounts", "unmeasured", &mut problems);
    if code(o.status) != 0 {
        problems.push(format!("exit {} (0 expected)", code(o.status)));
    }
    verdict("verify flock-a-local", &o, &problems);
}

/// Through mount a (sshfs's default cache, 20 s) from mount b: a removed name and a replaced
/// symlink's readlink show late — measured, beyond mount b's whole cache — while the records
/// locksmith reads fresh show within cache_time = "1s": safe (0).
#[test]
fn sshfs_peer_with_the_default_cache_shows_names_late_but_records_fresh() {
    let Some((fx, sb)) = sshfs() else { return };
    let peer = fx.a.display().to_string();
    let o = sb.output(["verify", "--peer", &peer, "mkdir-b"]);
    let out = stdout(&o);
    let mut problems = Vec::new();
    if code(o.status) != 0 {
        problems.push(format!("exit {} (0 expected)", code(o.status)));
    }
    let mut figures = Vec::new();
    for p in [
        "name delay (create)",
        "name delay (remove)",
        "readlink delay",
    ]
    .iter()
    .chain(&FRESH)
    {
        match line(&out, p).map(|(s, d)| (s, figure(d))) {
            Some((s, Some(d))) => {
                figures.push(format!("{p} {s} {d:.2?}"));
                let late = ["name delay (remove)", "readlink delay"].contains(p);
                if late && d <= Sshfs::B_CACHE {
                    problems.push(format!(
                        "{p}: {d:?} through mount a, whose cache is 20 s: not beyond {:?}",
                        Sshfs::B_CACHE
                    ));
                }
                if FRESH.contains(p) && s != "ok" {
                    problems.push(format!("{p}: {s}"));
                }
            }
            got => problems.push(format!("{p}: {got:?} (a figure expected)")),
        }
    }
    eprintln!(
        "verify sshfs mkdir on mount b, peer a: {}",
        figures.join(", ")
    );
    verdict("verify mkdir-b --peer a", &o, &problems);
    let left: Vec<String> = fx
        .server_listing()
        .into_iter()
        .filter(|n| n.contains(".verify."))
        .collect();
    assert!(left.is_empty(), "verify left {left:?} on the server");
}

// ---- GlusterFS -----------------------------------------------------------------------------

/// GlusterFS with its default caches: a mount may resolve a name renamed through the other to
/// the inode it cached (the kernel's entry cache, the volume's md-cache), so a waiter could
/// break a live holder on an old record (`fs2_smoke::gluster_pins_read_fresh_only_with_the_settings_locksmith_requires`). Every
/// heartbeat backend is refused there, by verify and by the lock itself — 78, one line naming
/// both settings — whatever `cache_time` and `stale_after` say, and nothing is left; `local =
/// true` still locks.
#[test]
fn gluster_default_caches_are_refused_naming_what_to_set() {
    let Some(fx) = Gluster::start() else { return };
    let mut t = String::new();
    for b in ["mkdir", "link", "symlink"] {
        t += &format!(
            "[profile.{b}]\nbackend = \"{b}\"\npath = \"{}\"\ncache_time = \"2s\"\nstale_after = \"10s\"\n\n",
            fx.a.join(format!("{b}.lock")).display()
        );
    }
    t += &format!(
        "[profile.local]\nbackend = \"mkdir\"\npath = \"{}\"\nlocal = true\n",
        fx.a.join("local.lock").display()
    );
    let sb = Sandbox::new(&t);
    let peer = fx.b.display().to_string();
    let mut problems = Vec::new();
    for b in ["mkdir", "link", "symlink"] {
        for args in [
            vec!["verify", "--peer", &peer, b],
            vec!["--wait", "0", "run", b, "--", "true"],
        ] {
            let o = sb.output(args.iter().copied());
            let err = stderr(&o);
            let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("ERROR")).collect();
            let named = err.contains("-o entry-timeout=0,fopen-keep-cache=off")
                && err.contains("performance.stat-prefetch off, performance.quick-read off");
            if code(o.status) != 78
                || lines.len() != 1
                || !lines[0].starts_with("ERROR config:")
                || !named
            {
                problems.push(format!("{args:?}: exit {}, stderr {err:?}", code(o.status)));
            }
            if args[0] == "verify"
                && line(&stdout(&o), "client caches").map(|(st, _)| st) != Some("FAIL")
            {
                problems.push(format!(
                    "{args:?}: no `client caches FAIL` line: {}",
                    stdout(&o)
                ));
            }
        }
    }
    let o = sb.output(["--wait", "0", "run", "local", "--", "true"]);
    if code(o.status) != 0 {
        problems.push(format!(
            "local = true: exit {}: {}",
            code(o.status),
            stderr(&o)
        ));
    }
    let left: Vec<String> = fx
        .server_listing()
        .into_iter()
        .filter(|n| !n.contains("local.lock"))
        .collect();
    if !left.is_empty() {
        problems.push(format!("left on the server: {left:?}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

/// GlusterFS as locksmith requires it ([`Gluster::start_fresh_names`]: the kernel's attribute
/// cache left at 1 s) shows records through the other mount within milliseconds here; verify
/// passes `cache_time = "1s"` then, or, should they ever show later, FAILs (78) with a
/// measured suggestion — and a looser profile passes.
#[test]
fn gluster_as_required_verify_passes_or_says_what_to_set() {
    let Some(fx) = Gluster::start_fresh_names() else {
        return;
    };
    let mk = |name: &str, cache: &str, stale: &str| {
        format!(
            "[profile.{name}]\nbackend = \"mkdir\"\npath = \"{}\"\nkeepalive = \"300ms\"\ncache_time = \"{cache}\"\nstale_after = \"{stale}\"\n\n",
            fx.a.join("mkdir.lock").display()
        )
    };
    let sb = Sandbox::new(&(mk("tight", "1s", "3s") + &mk("loose", "3s", "5s")));
    let peer = fx.b.display().to_string();
    let o = sb.output(["verify", "--peer", &peer, "tight"]);
    let out = stdout(&o);
    let figures: Vec<String> = FRESH
        .iter()
        .filter_map(|p| line(&out, p).map(|(s, d)| format!("{p} {s} {d}")))
        .collect();
    eprintln!(
        "verify gluster mkdir, cache_time 1s: {}",
        figures.join("; ")
    );
    let worst = FRESH
        .iter()
        .filter_map(|p| line(&out, p).and_then(|(_, d)| figure(d)))
        .max();
    let mut problems = Vec::new();
    if line(&out, "client caches").map(|(st, _)| st) != Some("ok") {
        problems.push(format!("no `client caches ok` line: {out}"));
    }
    // verify's room to spare: a quarter of the delay, at least 250 ms.
    let room = |w: Duration| w + (w / 4).max(Duration::from_millis(250));
    match worst {
        // Within the stated cache time with room: then verify must pass it.
        Some(w) if room(w) <= Duration::from_secs(1) => {
            if code(o.status) != 0 {
                problems.push(format!(
                    "records within 1s ({w:?}), yet exit {}",
                    code(o.status)
                ));
            }
        }
        Some(_) => {
            if code(o.status) != 78 || !stderr(&o).contains("set cache_time = ") {
                problems.push(
                    "records later than cache_time: 78 suggesting a cache_time expected".into(),
                );
            }
        }
        None => problems.push("no delay figures".into()),
    }
    verdict("verify tight --peer b (gluster)", &o, &problems);
    let o = sb.output(["verify", "--peer", &peer, "loose"]);
    let out = stdout(&o);
    let fails: Vec<&str> = out.lines().filter(|l| l.contains(" FAIL ")).collect();
    // GlusterFS with its default caches was seen (1 run in ~3 under load) to answer a racing
    // mkdir with EEXIST/EPERM to *both* contenders while one of them made the directory: a
    // lock nobody holds, which only `break --force` removes (issue 12's note). verify saying
    // so is right; every other FAIL is a problem.
    let lost_race = |l: &&str| l.contains("mkdir exclusive") && l.contains("0 contenders");
    let problems = match code(o.status) {
        0 => Vec::new(),
        78 if !fails.is_empty() && fails.iter().all(lost_race) => {
            eprintln!("verify gluster mkdir: the lost race was seen: {}", fails[0]);
            Vec::new()
        }
        c => vec![format!("exit {c} (0 expected), FAIL lines {fails:?}")],
    };
    verdict("verify loose --peer b (gluster)", &o, &problems);
}

// ---- server backends -----------------------------------------------------------------------

/// Runs `cmd` (a verify) with a bound; its output.
fn verify_out(mut c: std::process::Command, env: &[(&str, &str)]) -> Output {
    for (k, v) in env {
        c.env(k, v);
    }
    output_within(c, Duration::from_secs(120))
}

/// The report is 0, every `ok` property ok, every `info` one info, the verdict ok, and
/// nothing on stderr; the problems otherwise.
fn passes(o: &Output, ok: &[&str], info: &[&str]) -> Vec<String> {
    let out = stdout(o);
    let mut problems = Vec::new();
    if code(o.status) != 0 {
        problems.push(format!("exit {} (0 expected)", code(o.status)));
    }
    for p in ok {
        expect(&out, p, "ok", &mut problems);
    }
    for p in info {
        expect(&out, p, "info", &mut problems);
    }
    if !out
        .lines()
        .last()
        .unwrap_or("")
        .starts_with("verdict: ok — ")
    {
        problems.push("the last line is not `verdict: ok — …`".into());
    }
    if out.contains("FAIL") || !stderr(o).is_empty() {
        problems.push("a FAIL or a word on stderr".into());
    }
    problems
}

/// Exit `want` with an `ERROR <kind>: ` line on stderr naming `needle`.
fn refused(what: &str, o: &Output, want: i32, kind: &str, needle: &str) {
    let err = stderr(o);
    assert!(
        code(o.status) == want
            && err.starts_with(&format!("ERROR {kind}: "))
            && err.contains(needle),
        "{what}: exit {}, stderr {err:?} ({want}, `ERROR {kind}:` naming {needle:?} expected); stdout:\n{}",
        code(o.status),
        stdout(o)
    );
}

/// The FTP report's relied-on lines.
const FTP_OK: [&str; 9] = [
    "login",
    "mkd exclusive",
    "owner record (NLST)",
    "heartbeat (RNFR/RNTO)",
    "claim of an old name",
    "rmd not empty",
    "directory test (CWD)",
    "release (RMD)",
    "reconnect",
];

/// Nothing verify made is left in the FTP server's `locks` (which held `before` entries), and
/// the lock `locks/p` was never taken.
fn ftp_left_nothing(srv: &dyn crate::ftp_server::TestFtp, before: usize) {
    let left: Vec<String> = std::fs::read_dir(srv.path("locks"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".verify."))
        .collect();
    assert!(left.is_empty(), "{}: verify left {left:?}", srv.name());
    assert_eq!(
        std::fs::read_dir(srv.path("locks")).unwrap().count(),
        before,
        "{}: verify left something beside the lock",
        srv.name()
    );
    assert!(!srv.path("locks/p").exists(), "verify took the lock");
}

/// verify on `srv` by profile and by address: 0, every line ok, nothing left beside the
/// lock; a wrong password 77 (never shown), a closed port 69, a missing parent 78.
fn ftp_verify(srv: &dyn crate::ftp_server::TestFtp) {
    use crate::ftp_server::PASSWORD;
    let sb = crate::ftp::sandbox(srv);
    // Profile `p` with stale_after 10 s: a reconnecting heartbeat may take 2.5 s, room for a
    // PAM login on a loaded machine (with `p`'s 1.5 s, a login over 187 ms is rightly FAIL).
    let text = std::fs::read_to_string(&sb.profiles).unwrap();
    let pv = text
        .split("\n[profile.")
        .find(|s| s.starts_with("p]"))
        .unwrap()
        .replacen("p]", "pv]", 1);
    sb.write_profiles(&format!("{text}\n[profile.{pv}stale_after = \"10s\"\n"));
    let before = std::fs::read_dir(srv.path("locks")).unwrap().count();
    let o = verify_out(sb.cmd(["verify", "pv"]), &[]);
    let mut problems = passes(&o, &FTP_OK, &["server clock", "idle timeout"]);
    match line(&stdout(&o), "reconnect") {
        Some(("ok", d)) if d.contains("within the 2s500ms a heartbeat") => {}
        got => problems.push(format!("reconnect: {got:?}")),
    }
    verdict(&format!("verify pv on {}", srv.name()), &o, &problems);
    let (port, user) = (srv.port(), srv.user());
    let addr = format!("ftp://{user}@127.0.0.1:{port}/locks/p");
    let o = verify_out(
        sb.cmd(["verify", &addr]),
        &[("LOCKSMITH_PASSWORD", PASSWORD)],
    );
    let problems = passes(&o, &FTP_OK, &[]);
    verdict(&format!("verify {addr} on {}", srv.name()), &o, &problems);
    assert!(
        stdout(&o).starts_with(&format!("locksmith verify {addr}: backend ftp")),
        "{}",
        stdout(&o)
    );
    ftp_left_nothing(srv, before);

    let o = verify_out(sb.cmd(["verify", "wrongpw"]), &[]);
    refused("verify wrongpw", &o, 77, "denied", "refused the login");
    assert!(!stdout(&o).contains("not-the-password") && !stderr(&o).contains("not-the-password"));
    let o = verify_out(sb.cmd(["verify", "closed"]), &[]);
    refused("verify closed", &o, 69, "unavailable", "cannot connect");
    let o = verify_out(sb.cmd(["verify", "noparent"]), &[]);
    refused("verify noparent", &o, 78, "config", "parent directory");
    assert!(!srv.path("missing").exists());
}

#[test]
fn ftp_libunftp_verify_passes_by_profile_and_address_and_leaves_nothing() {
    ftp_verify(&crate::ftp_server::FtpServer::start());
}

#[test]
fn ftp_pure_ftpd_verify_passes_by_profile_and_address_and_leaves_nothing() {
    use crate::ftp_debian::{DebianFtp, Server};
    let Some(srv) = DebianFtp::start(Server::PureFtpd) else {
        return;
    };
    ftp_verify(&srv);
}

#[test]
fn ftp_vsftpd_verify_passes_by_profile_and_address_and_leaves_nothing() {
    use crate::ftp_debian::{DebianFtp, Server};
    let Some(srv) = DebianFtp::start(Server::Vsftpd) else {
        return;
    };
    ftp_verify(&srv);
}

/// A directory the FTP user may not write beside the lock: 77, as for taking the lock
/// (pure-ftpd, which acts as its own user: permissions do not bind the root we run as).
#[test]
fn ftp_verify_without_the_right_to_write_beside_the_lock_is_denied() {
    use crate::ftp_debian::{DebianFtp, Server};
    use crate::ftp_server::TestFtp;
    use std::os::unix::fs::PermissionsExt;
    let Some(srv) = DebianFtp::start(Server::PureFtpd) else {
        return;
    };
    let acts_as = srv
        .owner()
        .map_or(nix::unistd::geteuid().as_raw(), |(uid, _)| uid);
    if acts_as == 0 {
        eprintln!("SKIP: the server acts as root: permissions do not bind it");
        return;
    }
    let sb = crate::ftp::sandbox(&srv);
    let locks = srv.path("locks");
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o555)).unwrap();
    let o = verify_out(sb.cmd(["verify", "p"]), &[]);
    std::fs::set_permissions(&locks, std::fs::Permissions::from_mode(0o755)).unwrap();
    refused(
        "verify p in a read-only directory",
        &o,
        77,
        "denied",
        "permission denied",
    );
    assert!(probes_left(&locks).is_empty());
}

/// A server whose certificate the trust given does not verify: 69 in exactly one
/// `ERROR unavailable:` line on stderr naming `ca_file`, and `secret` shown nowhere.
fn refused_untrusted(what: &str, o: &Output, secret: &str) {
    refused(what, o, 69, "unavailable", "ca_file");
    assert_eq!(
        stderr(o).lines().count(),
        1,
        "{what}: more than one line on stderr: {}",
        stderr(o)
    );
    assert!(
        !stdout(o).contains(secret) && !stderr(o).contains(secret),
        "{what}: the password shows: stdout {} stderr {}",
        stdout(o),
        stderr(o)
    );
}

/// verify over FTPS (`mode`: explicit or implicit) against `start(leaf chain, leaf key)`, a
/// server that requires TLS with a leaf of a private CA: with that CA as `ca_file`, by profile
/// and by address, 0 with every line ok, the login over TLS, nothing left beside the lock;
/// without `ca_file` the system CAs (the machine's bundle, or `$SSL_CERT_FILE` naming an
/// unrelated CA) refuse the leaf: 69 in one `ERROR unavailable:` line naming `ca_file`,
/// the password shown nowhere.
fn ftps_verify<S: crate::ftp_server::TestFtp>(
    mode: &str,
    start: impl FnOnce(&Path, &Path) -> Option<S>,
) {
    use crate::ftp_server::PASSWORD;
    let Some(pki) = TestPki::new() else {
        return;
    };
    let Some(srv) = start(&pki.leaf, &pki.key) else {
        return;
    };
    let (port, user, ca) = (srv.port(), srv.user(), pki.ca.display());
    // stale_after 10 s, as `ftp_verify`'s `pv`: room for a TLS login on a loaded machine.
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
stale_after = "10s"

[profile.untrusted]
backend = "ftp"
host = "127.0.0.1"
port = {port}
user = "{user}"
password = "{PASSWORD}"
tls = "{mode}"
path = "locks/p"
stale_after = "10s"
"#
    ));
    let before = std::fs::read_dir(srv.path("locks")).unwrap().count();
    let login = match mode {
        "explicit" => "explicit FTPS (AUTH TLS), certificate verified",
        _ => "implicit FTPS, certificate verified",
    };
    let o = verify_out(sb.cmd(["verify", "tls"]), &[]);
    let mut problems = passes(&o, &FTP_OK, &["server clock", "idle timeout"]);
    match line(&stdout(&o), "login") {
        Some(("ok", d)) if d.contains(login) => {}
        got => problems.push(format!("login: {got:?}, {login:?} expected")),
    }
    if stdout(&o).contains(PASSWORD) {
        problems.push("the password shows in the report".into());
    }
    // The lock is named by what it is: an ftps:// URL, never a plain ftp:// one.
    if !stdout(&o).contains("ftps://") || stdout(&o).contains("ftp://") {
        problems.push("the report does not name the lock by an ftps:// URL".into());
    }
    verdict(
        &format!("verify tls ({mode}) on {}", srv.name()),
        &o,
        &problems,
    );
    let query = match mode {
        "explicit" => format!("ca_file={ca}"),
        _ => format!("tls=implicit&ca_file={ca}"),
    };
    let addr = format!("ftps://{user}@127.0.0.1:{port}/locks/p?{query}");
    let o = verify_out(
        sb.cmd(["verify", &addr]),
        &[("LOCKSMITH_PASSWORD", PASSWORD)],
    );
    let mut problems = passes(&o, &FTP_OK, &[]);
    if !stdout(&o).starts_with(&format!("locksmith verify {addr}: backend ftp")) {
        problems.push("the header does not name the address".into());
    }
    if stdout(&o).contains(PASSWORD) {
        problems.push("the password shows in the report".into());
    }
    verdict(&format!("verify {addr} on {}", srv.name()), &o, &problems);
    ftp_left_nothing(&srv, before);

    // The wrong trust: the machine's own CA bundle, then one that holds an unrelated CA.
    let mut c = sb.cmd(["verify", "untrusted"]);
    c.env_remove("SSL_CERT_FILE");
    let o = verify_out(c, &[]);
    refused_untrusted(&format!("verify untrusted ({mode})"), &o, PASSWORD);
    let addr = format!("ftps://{user}@127.0.0.1:{port}/locks/p");
    let addr = match mode {
        "explicit" => addr,
        _ => format!("{addr}?tls=implicit"),
    };
    let o = verify_out(
        sb.cmd(["verify", &addr]),
        &[
            ("LOCKSMITH_PASSWORD", PASSWORD),
            ("SSL_CERT_FILE", &pki.other_ca.display().to_string()),
        ],
    );
    refused_untrusted(&format!("verify {addr} (another CA)"), &o, PASSWORD);
    assert_eq!(
        std::fs::read_dir(srv.path("locks")).unwrap().count(),
        before,
        "{}: an untrusted verify left something beside the lock",
        srv.name()
    );
}

#[test]
fn ftps_explicit_libunftp_verify_passes_with_ca_file_and_the_system_cas_are_69() {
    ftps_verify("explicit", |leaf, key| {
        Some(crate::ftp_server::FtpServer::start_tls(leaf, key))
    });
}

#[test]
fn ftps_implicit_vsftpd_verify_passes_with_ca_file_and_the_system_cas_are_69() {
    use crate::ftp_debian::{DebianFtp, Server};
    ftps_verify("implicit", |leaf, key| {
        DebianFtp::start_implicit_tls(Server::Vsftpd, leaf, key)
    });
}

/// The PostgreSQL report's relied-on lines.
const PG_OK: [&str; 7] = [
    "connect",
    "advisory exclusive",
    "advisory shared",
    "freed on session end",
    "heartbeat",
    "dead holder detection",
    "idle_session_timeout",
];

/// Advisory locks and locksmith sessions on `pg`'s server.
fn pg_leftovers(pg: &crate::postgres::Pg) -> String {
    pg.sql(
        "SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory') || ' ' || \
                (SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'locksmith %')",
    )
    .trim()
    .to_string()
}

#[test]
fn postgres_verify_passes_by_profile_and_address_and_leaves_nothing() {
    let Some(pg) = NotStarted::or_skip(crate::postgres::Pg::start()) else {
        return;
    };
    let sb = pg.sandbox();
    let o = verify_out(sb.cmd(["verify", "pg"]), &[]);
    let mut problems = passes(
        &o,
        &PG_OK,
        &["wait timeouts", "fencing tokens", "server clock"],
    );
    // The backend's keepalives for stale_after 60 s: the server gives up after 60 s.
    match line(&stdout(&o), "dead holder detection") {
        Some(("ok", d)) if d.contains("within 1m ") && d.contains("tcp_user_timeout 1m") => {}
        got => problems.push(format!("dead holder detection: {got:?}")),
    }
    verdict("verify pg", &o, &problems);
    let addr = format!("postgres://locker@127.0.0.1:{}/app?lock=pg", pg.port);
    let o = verify_out(
        sb.cmd(["verify", &addr]),
        &[("LOCKSMITH_PASSWORD", "lockpw")],
    );
    let problems = passes(&o, &PG_OK, &[]);
    verdict(&format!("verify {addr}"), &o, &problems);
    assert!(!stdout(&o).contains("lockpw") && !stderr(&o).contains("lockpw"));
    eventually(Duration::from_secs(10), "verify's sessions gone", || {
        pg_leftovers(&pg) == "0 0"
    });

    let o = verify_out(sb.cmd(["verify", "pgbad"]), &[]);
    refused("verify pgbad", &o, 77, "denied", "password");
    let o = verify_out(sb.cmd(["verify", "pgclosed"]), &[]);
    refused("verify pgclosed", &o, 69, "unavailable", "cannot connect");
    let o = verify_out(sb.cmd(["verify", "pgnodb"]), &[]);
    refused("verify pgnodb", &o, 78, "config", "nosuchdb");
}

/// A server that ends sessions idle for 1 s would free a held lock between two heartbeats
/// of 5 s: FAIL (78) naming `keepalive`; with a 200 ms heartbeat the same server passes.
#[test]
fn postgres_verify_fails_an_idle_session_timeout_shorter_than_the_heartbeat() {
    let Some(pg) = NotStarted::or_skip(crate::postgres::Pg::start()) else {
        return;
    };
    pg.sql_in(
        "postgres",
        "ALTER ROLE locker SET idle_session_timeout = '1s'",
    );
    let sb = pg.sandbox();
    let o = verify_out(sb.cmd(["verify", "pg"]), &[]);
    let out = stdout(&o);
    let mut problems = Vec::new();
    match line(&out, "idle_session_timeout") {
        Some(("FAIL", d)) if d.contains("set keepalive to 500ms or less") => {}
        got => problems.push(format!("idle_session_timeout: {got:?}")),
    }
    for p in ["connect", "advisory exclusive", "freed on session end"] {
        expect(&out, p, "ok", &mut problems);
    }
    if !out.contains("verdict: FAIL — ") {
        problems.push("no `verdict: FAIL — …` line".into());
    }
    verdict("verify pg with idle_session_timeout 1s", &o, &problems);
    refused(
        "verify pg with idle_session_timeout 1s",
        &o,
        78,
        "config",
        "keepalive",
    );
    let o = verify_out(sb.cmd(["verify", "pgfast"]), &[]);
    let problems = passes(&o, &PG_OK, &[]);
    verdict("verify pgfast with idle_session_timeout 1s", &o, &problems);
    assert!(
        line(&stdout(&o), "idle_session_timeout").is_some_and(|(_, d)| d.starts_with("1s: ")),
        "{}",
        stdout(&o)
    );
}

/// The etcd report's relied-on lines.
const ETCD_OK: [&str; 9] = [
    "endpoints",
    "leader",
    "linearizable read",
    "lease TTL",
    "lease keepalive",
    "queue order",
    "revoke and watch",
    "release transaction",
    "lease expiry",
];

/// verify left no key of its own and no lease on `e`'s cluster.
fn etcd_left_nothing(e: &crate::etcd::Etcd) {
    let o = e.ctl(&["get", "--prefix", "--keys-only", ""]);
    assert!(o.status.success(), "etcdctl get: {}", stderr(&o));
    let keys: Vec<String> = stdout(&o)
        .lines()
        .filter(|l| l.contains(".verify."))
        .map(str::to_string)
        .collect();
    assert!(keys.is_empty(), "verify left keys {keys:?}");
    let o = e.ctl(&["lease", "list"]);
    assert!(o.status.success(), "etcdctl lease list: {}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "found 0 leases", "verify left leases");
}

#[test]
fn etcd_verify_passes_by_profile_and_address_and_leaves_nothing() {
    let Some(e) = crate::etcd::Etcd::start() else {
        return;
    };
    let sb = e.sandbox();
    let o = verify_out(sb.cmd(["verify", "e"]), &[]);
    let mut problems = passes(&o, &ETCD_OK, &["leader change", "server clock"]);
    match line(&stdout(&o), "lease TTL") {
        Some(("ok", d))
            if d.starts_with("asked 60s for stale_after 1m") && d.ends_with("granted 60s") => {}
        got => problems.push(format!("lease TTL: {got:?}")),
    }
    verdict("verify e", &o, &problems);
    let addr = format!(
        "etcd://127.0.0.1:{}/t/e?stale_after=3s&keepalive=500ms",
        e.port
    );
    let o = verify_out(sb.cmd(["verify", &addr]), &[]);
    let problems = passes(&o, &ETCD_OK, &[]);
    verdict(&format!("verify {addr}"), &o, &problems);
    etcd_left_nothing(&e);
    assert_eq!(e.keys("/t/e"), "", "verify touched the lock's prefix");
    let o = verify_out(sb.cmd(["verify", "eclosed"]), &[]);
    refused("verify eclosed", &o, 69, "unavailable", "cannot connect");
}

/// A cluster whose election timeout is 5 s grants leases of at least 8 s: a lock with
/// stale_after 2 s would outlive a dead holder by 6 s, so verify fails naming the
/// stale_after it accepts; with stale_after 10 s the same cluster passes.
#[test]
fn etcd_verify_fails_a_minimum_lease_longer_than_stale_after() {
    let Some(e) = crate::etcd::Etcd::start_flags(&[
        "--election-timeout",
        "5000",
        "--heartbeat-interval",
        "500",
    ]) else {
        return;
    };
    let sb = e.sandbox();
    let short = format!(
        "etcd://127.0.0.1:{}/t/short?stale_after=2s&keepalive=500ms",
        e.port
    );
    let o = verify_out(sb.cmd(["verify", &short]), &[]);
    let out = stdout(&o);
    let mut problems = Vec::new();
    match line(&out, "lease TTL") {
        Some(("FAIL", d))
            if d.contains("granted 8s") && d.contains("set stale_after to at least 8s") => {}
        got => problems.push(format!("lease TTL: {got:?}")),
    }
    for p in ["endpoints", "leader", "lease keepalive", "revoke and watch"] {
        expect(&out, p, "ok", &mut problems);
    }
    verdict(
        "verify with stale_after 2s, minimum lease 8s",
        &o,
        &problems,
    );
    refused(
        "verify with stale_after 2s",
        &o,
        78,
        "config",
        "stale_after to at least 8s",
    );
    let long = format!("etcd://127.0.0.1:{}/t/long?stale_after=10s", e.port);
    let o = verify_out(sb.cmd(["verify", &long]), &[]);
    let problems = passes(&o, &ETCD_OK, &[]);
    verdict(
        "verify with stale_after 10s, minimum lease 8s",
        &o,
        &problems,
    );
    assert!(
        stdout(&o).contains("it accepts stale_after of 8s or more"),
        "{}",
        stdout(&o)
    );
    etcd_left_nothing(&e);
}

/// `https://` endpoints with the private CA as `ca_file`, by profile and by address
/// (`etcds://`): 0 with every line ok, no key or lease left; without `ca_file` the system CAs
/// (the machine's bundle, or `$SSL_CERT_FILE` naming an unrelated CA) refuse the member's
/// leaf: 69 in one `ERROR unavailable:` line naming `ca_file`, the password shown nowhere.
#[test]
fn etcd_tls_verify_passes_with_ca_file_and_the_system_cas_are_69() {
    const SECRET: &str = "etcd-pw-do-not-log";
    let Some(pki) = TestPki::new() else {
        return;
    };
    let Some(e) = crate::etcd::Etcd::start_with(Some((&pki.ca, &pki.leaf, &pki.key))) else {
        return;
    };
    let (port, ca) = (e.port, pki.ca.display());
    let sb = Sandbox::new(&format!(
        r#"
[profile.tls]
backend = "etcd"
endpoints = ["https://127.0.0.1:{port}"]
prefix = "/t/e"
ca_file = "{ca}"

[profile.untrusted]
backend = "etcd"
endpoints = ["https://127.0.0.1:{port}"]
prefix = "/t/e"
user = "root"
password = "{SECRET}"
"#
    ));
    let o = verify_out(sb.cmd(["verify", "tls"]), &[]);
    let mut problems = passes(&o, &ETCD_OK, &["leader change", "server clock"]);
    if !stdout(&o).contains(&format!("https://127.0.0.1:{port}")) {
        problems.push("the report does not name the https:// endpoint".into());
    }
    verdict("verify tls (etcd over https)", &o, &problems);
    let addr = format!("etcds://127.0.0.1:{port}/t/e?ca_file={ca}&stale_after=3s&keepalive=500ms");
    let o = verify_out(sb.cmd(["verify", &addr]), &[]);
    let problems = passes(&o, &ETCD_OK, &[]);
    verdict(&format!("verify {addr}"), &o, &problems);
    etcd_left_nothing(&e);
    assert_eq!(e.keys("/t/e"), "", "verify touched the lock's prefix");

    // The wrong trust: the machine's own CA bundle, then one that holds an unrelated CA.
    let mut c = sb.cmd(["verify", "untrusted"]);
    c.env_remove("SSL_CERT_FILE");
    let o = verify_out(c, &[]);
    refused_untrusted("verify untrusted (etcd)", &o, SECRET);
    let addr = format!("etcds://root@127.0.0.1:{port}/t/e");
    let o = verify_out(
        sb.cmd(["verify", &addr]),
        &[
            ("LOCKSMITH_PASSWORD", SECRET),
            ("SSL_CERT_FILE", &pki.other_ca.display().to_string()),
        ],
    );
    refused_untrusted(&format!("verify {addr} (another CA)"), &o, SECRET);
    etcd_left_nothing(&e);
}
