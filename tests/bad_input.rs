//! Bad input (SPEC §4.2): one `ERROR kind: message` line, the SPEC's exit code, and nothing
//! of the lock left behind.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;

use crate::support::*;

/// Runs hold mode on `toml`'s profile `p`; asserts exit `want`, one ERROR line on stdout
/// whose text contains `needle`, and an unchanged sandbox listing. Returns the line.
fn rejects(toml: &str, args: &[&str], want: i32, needle: &str) -> String {
    let sb = Sandbox::new(toml);
    let before = sb.listing();
    let o = sb.output(args);
    let out = stdout(&o);
    assert_eq!(code(o.status), want, "{args:?}: {out} {}", stderr(&o));
    assert_eq!(out.lines().count(), 1, "exactly one line: {out:?}");
    assert!(out.starts_with("ERROR "), "{out:?}");
    assert!(out.contains(needle), "{out:?} should mention {needle:?}");
    assert_eq!(sb.listing(), before, "something was left behind");
    out
}

const GOOD: &str = "[profile.p]\nbackend = \"mkdir\"\npath = \"{dir}/p.lock\"\n";

#[test]
fn malformed_toml() {
    let l = rejects("[profile.p\nbackend = ", &["p"], 78, "malformed TOML");
    assert!(l.starts_with("ERROR config: "), "{l}");
    assert!(
        l.contains("profiles.toml: line 1"),
        "names file and line: {l}"
    );
}

#[test]
fn unknown_profile_backend_key_and_missing_field() {
    rejects(GOOD, &["nope"], 78, "unknown profile `nope`");
    rejects(
        "[profile.p]\nbackend = \"carrier-pigeon\"\npath = \"x\"\n",
        &["p"],
        78,
        "unknown backend `carrier-pigeon`",
    );
    let l = rejects(
        &format!("{GOOD}colour = \"blue\"\n"),
        &["p"],
        78,
        "unknown key `colour`",
    );
    assert!(l.contains("profile `p`"), "names the profile: {l}");
    rejects(
        "[profile.p]\nbackend = \"mkdir\"\n",
        &["p"],
        78,
        "missing required key `path`",
    );
    rejects(
        "[defaults]\nwait = \"forever\"\nretries = 3\n[profile.p]\nbackend = \"flock\"\npath = \"x\"\n",
        &["p"],
        78,
        "unknown key `retries`",
    );
    // flock takes `local` (it admits a network filesystem), not `cache_time` (no heartbeat).
    rejects(
        "[profile.p]\nbackend = \"flock\"\npath = \"x\"\ncache_time = \"1s\"\n",
        &["p"],
        78,
        "`cache_time` applies to backends mkdir, link and symlink",
    );
}

#[test]
fn bad_durations_and_timing_rules() {
    rejects(&format!("{GOOD}poll = \"soon\"\n"), &["p"], 78, "`poll`");
    rejects(&format!("{GOOD}poll = \"0\"\n"), &["p"], 78, "`poll`");
    rejects(
        &format!("{GOOD}keepalive = \"60s\"\n"),
        &["p"],
        78,
        "must be below `stale_after`",
    );
    rejects(
        &format!("[defaults]\nkeepalive = \"3s\"\n{GOOD}stale_after = \"3s\"\n"),
        &["p"],
        78,
        "must be below `stale_after`",
    );
    rejects(GOOD, &["--wait", "soon", "p"], 64, "--wait");
}

#[test]
fn inline_password_in_a_readable_file() {
    let sb =
        Sandbox::new("[profile.p]\nbackend = \"flock\"\npath = \"x\"\npassword = \"hunter2\"\n");
    fs::set_permissions(&sb.profiles, fs::Permissions::from_mode(0o644)).unwrap();
    let o = sb.output(["p"]);
    assert_eq!(code(o.status), 78);
    let out = stdout(&o);
    assert!(
        out.contains("mode is 0644") && out.contains("chmod 600"),
        "{out}"
    );
    assert!(
        !out.contains("hunter2") && !stderr(&o).contains("hunter2"),
        "the secret leaked"
    );
}

#[test]
fn lock_path_whose_directory_does_not_exist() {
    for backend in ["flock", "mkdir"] {
        let toml =
            format!("[profile.p]\nbackend = \"{backend}\"\npath = \"{{dir}}/missing/p.lock\"\n");
        rejects(&toml, &["p"], 78, "never creates parent directories");
    }
}

#[test]
fn subcommand_named_profile_and_bad_names() {
    rejects(
        &format!("{GOOD}[profile.run]\nbackend = \"flock\"\npath = \"x\"\n"),
        &["p"],
        78,
        "named like a subcommand",
    );
    // A word with `/` is a lock address (a flock path), not a bad name (issue 14).
    rejects(GOOD, &["a b"], 64, "must match");
    rejects(GOOD, &[&"x".repeat(65)], 64, "must match");
    rejects(GOOD, &["nfs:x"], 64, "not a lock address scheme");
}

#[test]
fn usage_errors_and_help() {
    rejects(GOOD, &[], 64, "missing PROFILE");
    rejects(GOOD, &["--bogus", "p"], 64, "bogus");
    // (`locksmith p extra` is flock(1)'s form: run `extra` under the lock; `hold p extra`
    // takes both locks, SPEC §3b; `status p extra` is 64 on stderr: tests/several.rs.)
    // Shared where the backend cannot: 64 from the command line, 78 from the profile.
    rejects(GOOD, &["--shared", "p"], 64, "cannot take a shared lock");
    rejects(
        &format!("{GOOD}shared = true\n"),
        &["p"],
        78,
        "cannot take a shared lock",
    );
    // In other modes the ERROR line goes to stderr.
    let sb = Sandbox::new(GOOD);
    let o = sb.output(["run", "nope", "--", "true"]);
    assert_eq!(code(o.status), 78);
    assert_eq!(stdout(&o), "");
    assert!(stderr(&o).starts_with("ERROR config: "), "{}", stderr(&o));
    let o = sb.output(["--help"]);
    assert_eq!(code(o.status), 0);
    assert!(stdout(&o).starts_with("locksmith - "));
}

#[test]
fn profiles_env_naming_a_missing_file() {
    let sb = Sandbox::new(GOOD);
    let mut c = std::process::Command::new(bin());
    c.arg("p").env("LOCKSMITH_PROFILES", sb.join("nope.toml"));
    let o = output_within(c, std::time::Duration::from_secs(30));
    assert_eq!(code(o.status), 78);
    assert!(stdout(&o).contains("nope.toml"), "{}", stdout(&o));
}

/// No write permission on the lock's directory: 77 (denied), nothing created. As root the
/// helper runs as `nobody`, since root bypasses permissions.
#[test]
fn no_write_permission_is_denied() {
    let root = nix::unistd::geteuid().is_root();
    for backend in ["flock", "mkdir"] {
        let sb = Sandbox::new("");
        let locked = sb.join("locked");
        fs::create_dir(&locked).unwrap();
        let toml = format!(
            "[profile.p]\nbackend = \"{backend}\"\npath = \"{}/p.lock\"\n",
            locked.display()
        );
        sb.write_profiles(&toml);
        fs::set_permissions(sb.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&sb.profiles, fs::Permissions::from_mode(0o644)).unwrap();
        fs::set_permissions(
            &locked,
            fs::Permissions::from_mode(if root { 0o755 } else { 0o555 }),
        )
        .unwrap();
        let mut c = sb.cmd(["p"]);
        if root {
            c.uid(65534).gid(65534);
        }
        let o = output_within(c, std::time::Duration::from_secs(30));
        assert_eq!(code(o.status), 77, "{backend}: {}", stdout(&o));
        assert!(stdout(&o).starts_with("ERROR denied: "), "{}", stdout(&o));
        assert_eq!(
            fs::read_dir(&locked).unwrap().count(),
            0,
            "{backend}: left something"
        );
    }
}

/// A lock directory writable by others is refused unless sticky (anyone could remove the
/// lock); a symlink planted at the lock path is never followed.
#[test]
fn unsafe_lock_directory_and_planted_symlink() {
    for backend in ["flock", "mkdir", "link", "symlink"] {
        let sb = Sandbox::new("");
        let open = sb.join("open");
        fs::create_dir(&open).unwrap();
        sb.write_profiles(&format!(
            "[profile.p]\nbackend = \"{backend}\"\npath = \"{}/p.lock\"\n",
            open.display()
        ));
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let o = sb.output(["p"]);
        assert_eq!(code(o.status), 78, "{backend}: {}", stdout(&o));
        assert!(
            stdout(&o).contains("writable by others and not sticky"),
            "{}",
            stdout(&o)
        );
        fs::set_permissions(&open, fs::Permissions::from_mode(0o1777)).unwrap();
        let o = sb.output(["run", "p", "--", "true"]);
        assert_eq!(
            code(o.status),
            0,
            "{backend}: sticky is fine: {}",
            stderr(&o)
        );

        // A symlink planted at the lock path: never written through.
        let target = sb.join("victim");
        fs::write(&target, "precious").unwrap();
        let _ = fs::remove_dir(open.join("p.lock"));
        let _ = fs::remove_file(open.join("p.lock"));
        std::os::unix::fs::symlink(&target, open.join("p.lock")).unwrap();
        let o = sb.output(["--wait", "0", "p"]);
        assert_ne!(code(o.status), 0, "{backend}: {}", stdout(&o));
        assert!(stdout(&o).starts_with("ERROR "), "{}", stdout(&o));
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
    }
}

/// TLS settings that cannot be honoured are refused before any connection is tried.
#[test]
fn engine_tls_settings_that_contradict_each_other() {
    let etcd = "[profile.p]\nbackend = \"etcd\"\n";
    rejects(
        &format!("{etcd}endpoints = [\"http://127.0.0.1:1\"]\nca_file = \"ca.pem\"\n"),
        &["p"],
        78,
        "`ca_file` needs https:// endpoints",
    );
    rejects(
        &format!("{etcd}endpoints = [\"https://127.0.0.1:1\", \"127.0.0.1:2\"]\n"),
        &["p"],
        78,
        "mix http:// and https://",
    );
    rejects(
        &format!("{etcd}endpoints = [\"ftp://127.0.0.1:1\"]\n"),
        &["p"],
        78,
        "expected host:port, http://host:port or https://host:port",
    );
    let pg = "[profile.p]\nbackend = \"postgres\"\n";
    rejects(
        &format!("{pg}host = \"127.0.0.1\"\nca_file = \"ca.pem\"\n"),
        &["p"],
        78,
        "`ca_file` needs `sslmode`",
    );
    rejects(
        &format!("{pg}host = \"127.0.0.1\"\nsslmode = \"verify\"\n"),
        &["p"],
        78,
        "expected disable, prefer, require, verify-ca or verify-full",
    );
    rejects(
        &format!(
            "{pg}url = \"postgresql://u@127.0.0.1/app?sslmode=disable\"\nsslmode = \"verify-full\"\n"
        ),
        &["p"],
        78,
        "the `url` says sslmode=disable",
    );
}

/// Issue 25 finding 2: a mistyped subcommand is not left to read as a profile name: the
/// error says which subcommand was meant, with or without a profiles file.
#[test]
fn a_mistyped_subcommand_gets_a_suggestion() {
    let sb = Sandbox::new("[profile.other]\nbackend = \"mkdir\"\npath = \"{dir}/o.lock\"\n");
    let home = tempfile::tempdir().unwrap();
    for (typo, meant) in [
        ("staus", "status"),
        ("brek", "break"),
        ("profils", "profiles"),
    ] {
        let x = sb.join("x.lock");
        let x = x.to_str().unwrap();
        // No profiles file at all.
        let o = std::process::Command::new(bin())
            .args([typo, x])
            .env_remove("LOCKSMITH_PROFILES")
            .env_remove("XDG_CONFIG_HOME")
            .env("HOME", home.path())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let said = format!("did you mean `{meant}`");
        assert!(stderr(&o).contains(&said), "{typo}: {}", stderr(&o));
        assert_ne!(code(o.status), 0);
        // A profiles file without such a profile: in hold mode the line is on stdout.
        let o = sb.output([typo, x]);
        assert!(stderr(&o).contains(&said), "{typo}: {}", stderr(&o));
        let o = sb.output([typo]);
        assert!(stdout(&o).contains(&said), "{typo}: {}", stdout(&o));
    }
    // A real profile named like a typo is taken, no hint.
    let o = sb.output(["-n", "other", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}
