//! Issue 14: lock addresses (SPEC §3a) — a lock named on the command line with no profiles
//! file anywhere (`HOME` empty, no `XDG_CONFIG_HOME`, no `LOCKSMITH_PROFILES`), on local
//! paths and against the real servers the suite starts; flock(1)'s forms and its interop;
//! query keys validated like profile keys; passwords refused and never repeated; `.netrc` and
//! `.pgpass` with their 0600 rule; the same lock by address and by profile.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::postgres::PgSandbox;
use crate::support::*;

const T: Duration = Duration::from_secs(20);

/// `locksmith ARGS` in `dir` with nothing that could name a profiles file or a password:
/// `HOME` empty, no `XDG_CONFIG_HOME`, `LOCKSMITH_PROFILES`, `LOCKSMITH_PASSWORD`,
/// `PGPASSWORD` or `PGPASSFILE`.
fn bare<S: AsRef<std::ffi::OsStr>>(dir: &Path, args: impl IntoIterator<Item = S>) -> Command {
    let mut c = Command::new(bin());
    for v in [
        "LOCKSMITH_PROFILES",
        "XDG_CONFIG_HOME",
        "LOCKSMITH_LOG",
        "LOCKSMITH_PASSWORD",
        "PGPASSWORD",
        "PGPASSFILE",
    ] {
        c.env_remove(v);
    }
    c.env("HOME", "")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null());
    c
}

fn out(c: Command) -> Output {
    output_within(c, Duration::from_secs(60))
}

fn hold(mut c: Command) -> Held {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut h = Held::spawn(c);
    h.read_line(T);
    h
}

/// Both streams of an output, for "never shows" checks.
fn both(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn private(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

#[test]
fn a_path_is_a_flock_lock_with_no_profiles_file_anywhere() {
    let sb = Sandbox::new("");
    fs::remove_file(&sb.profiles).unwrap();
    let dir = sb.path();
    let abs = sb.join("x.lock");
    let o = out(bare(dir, ["run", abs.to_str().unwrap(), "--", "true"]));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(abs.is_file(), "flock(1) creates the file");
    // A relative path, and what CMD is told.
    let o = out(bare(
        dir,
        [
            "run",
            "./y.lock",
            "--",
            "sh",
            "-c",
            "echo $LOCKSMITH_PROFILE",
        ],
    ));
    assert_eq!((code(o.status), stdout(&o)), (0, "./y.lock\n".into()));
    assert!(sb.join("y.lock").is_file());
    // Hold mode: the OK line names the address, spaces written %20.
    let spaced = sb.join("a b.lock");
    let h = hold(bare(dir, [spaced.to_str().unwrap()]));
    let want = format!(
        "OK {}/a%20b.lock backend=flock mode=exclusive",
        dir.display()
    );
    assert!(h.ok().starts_with(&want), "{}", h.ok());
    let o = out(bare(dir, ["-n", spaced.to_str().unwrap(), "true"]));
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    drop(h);
    let o = out(bare(dir, ["-n", spaced.to_str().unwrap(), "true"]));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}

#[test]
fn every_file_scheme_holds_excludes_and_releases() {
    let sb = Sandbox::new("");
    let dir = sb.path();
    for scheme in ["flock", "mkdir", "link", "symlink"] {
        let addr = format!("{scheme}:{}/{scheme}.lock", dir.display());
        let mut h = hold(bare(dir, [&addr]));
        let line = h.line.clone().unwrap_or_default();
        assert!(
            line.starts_with(&format!("OK {addr} backend={scheme} mode=exclusive")),
            "{line:?} {}",
            h.stderr_text()
        );
        let o = out(bare(dir, ["-n", &addr, "true"]));
        assert_eq!(code(o.status), 75, "{scheme}: {}", stderr(&o));
        // flock(1)'s form is as quiet as flock(1) (issue 25); `run` names the holder.
        assert_eq!(stderr(&o), "", "{scheme}");
        let o = out(bare(dir, ["-n", "run", &addr, "--", "true"]));
        assert_eq!(code(o.status), 75, "{scheme}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("lock `{addr}` is held by")),
            "{}",
            stderr(&o)
        );
        drop(h);
        let o = out(bare(dir, ["-n", &addr, "true"]));
        assert_eq!(code(o.status), 0, "{scheme}: {}", stderr(&o));
    }
    // A relative PATH after the scheme is relative to the current directory.
    let h = hold(bare(dir, ["mkdir:rel.lock"]));
    assert!(
        h.ok().starts_with("OK mkdir:rel.lock backend=mkdir"),
        "{}",
        h.ok()
    );
    assert!(sb.join("rel.lock").is_dir());
    drop(h);
    eventually(T, "rel.lock removed", || !sb.join("rel.lock").exists());
}

#[test]
fn the_same_lock_by_address_and_by_profile() {
    let sb = Sandbox::standard();
    let dir = sb.path().display().to_string();
    // profile m is mkdir at {dir}/m.lock, f is flock at {dir}/f.lock
    for (profile, address) in [
        ("m", format!("mkdir:{dir}/m.lock")),
        ("f", format!("{dir}/f.lock")),
        ("s", format!("symlink:{dir}/s.lock")),
    ] {
        let h = sb.hold([profile]);
        assert!(h.ok().starts_with(&format!("OK {profile} ")), "{}", h.ok());
        let o = out(bare(sb.path(), ["-n", &address, "true"]));
        assert_eq!(code(o.status), 75, "{address}: {}", stderr(&o));
        drop(h);
        let h = hold(bare(sb.path(), [&address]));
        assert!(h.ok().starts_with("OK "), "{}", h.ok());
        let o = sb.output(["--wait", "0", profile]);
        assert_eq!(code(o.status), 75, "{profile}: {}", stdout(&o));
    }
    // A profile that says `url = "ADDRESS"`: its relative path is the profiles file's.
    sb.write_profiles(
        "[profile.u]\nurl = \"mkdir:m.lock?stale_after=30s\"\nstale_after = \"40s\"\n",
    );
    let h = sb.hold(["u"]);
    assert!(h.ok().starts_with("OK u backend=mkdir"), "{}", h.ok());
    let o = out(bare(
        sb.path(),
        ["-n", &format!("mkdir:{dir}/m.lock"), "true"],
    ));
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
}

#[test]
fn query_keys_are_validated_like_profile_keys() {
    let sb = Sandbox::new("");
    let dir = sb.path();
    let base = format!("mkdir:{}/q.lock", dir.display());
    let h = hold(bare(
        dir,
        [format!(
            "{base}?stale_after=30s&keepalive=2s&local=true&wait=0"
        )],
    ));
    assert!(h.ok().starts_with("OK "), "{}", h.ok());
    drop(h);
    // A short `stale_after` alone is a working lock: the `keepalive` nobody gave follows it
    // (a third of it), so the built-in 5s is not "not below stale_after" (issue 28). A
    // `keepalive` given is checked as given.
    for query in ["?stale_after=5s", "?stale_after=2s&wait=0"] {
        let h = hold(bare(dir, [format!("{base}{query}")]));
        assert!(h.ok().starts_with("OK "), "{query}: {}", h.ok());
    }
    for (query, needle) in [
        (
            "?stale_after=5s&keepalive=5s",
            "`keepalive` (5s) must be below `stale_after` (5s)",
        ),
        ("?bogus=1", "unknown key `bogus`"),
        ("?poll=0", "`poll`"),
        ("?keepalive=2m", "`keepalive`"),
        ("?local=yes", "`local`"),
        ("?shared=true", "cannot take a shared lock"),
        ("?file_mode=7777", "`file_mode`"),
        ("?path=/x", "part of the address"),
        ("?wait", "no value"),
    ] {
        let before = sb.listing();
        let o = out(bare(dir, [format!("{base}{query}")]));
        let line = stdout(&o);
        assert_eq!(code(o.status), 64, "{query}: {line}");
        assert!(
            line.starts_with("ERROR usage: ") && line.contains(needle),
            "{query}: {line}"
        );
        assert_eq!(line.lines().count(), 1);
        assert_eq!(sb.listing(), before, "{query}: something was left behind");
    }
    // Without a command: a `:` word with no known scheme, and a missing ?lock=.
    let o = out(bare(dir, ["nfs:share"]));
    assert_eq!(code(o.status), 64);
    assert!(
        stdout(&o).contains("mkdir"),
        "names the schemes: {}",
        stdout(&o)
    );
    let o = out(bare(dir, ["postgres://127.0.0.1/app"]));
    assert_eq!(code(o.status), 64);
    assert!(stdout(&o).contains("?lock=NAME"), "{}", stdout(&o));
    // The same mistakes inside a profile's url are config errors (78).
    for (url, needle) in [
        ("mkdir:q.lock?bogus=1", "unknown key `bogus`"),
        ("mkdir:q.lock?poll=0", "`poll`"),
        ("nfs:share", "not a lock address scheme"),
        ("ftp://u:pw@h/p", "never carries a password"),
    ] {
        sb.write_profiles(&format!("[profile.u]\nurl = \"{url}\"\n"));
        let o = sb.output(["u"]);
        assert_eq!(code(o.status), 78, "{url}: {}", stdout(&o));
        assert!(stdout(&o).contains(needle), "{url}: {}", stdout(&o));
    }
    sb.write_profiles("[profile.u]\nurl = \"mkdir:q.lock\"\npath = \"other\"\n");
    let o = sb.output(["u"]);
    assert_eq!(code(o.status), 78, "{}", stdout(&o));
    assert!(stdout(&o).contains("part of the address"), "{}", stdout(&o));
}

#[test]
fn a_password_in_an_address_is_refused_and_never_repeated() {
    let sb = Sandbox::new("");
    for addr in [
        "ftp://joe:hunter2@127.0.0.1/locks/x",
        "ftps://joe:@127.0.0.1/locks/x",
        "ftp://joe:hunter2/with/slash@127.0.0.1/locks/x",
        "postgres://joe:hunter2@127.0.0.1/app?lock=x",
        "postgresql://127.0.0.1/app?lock=x&password=hunter2",
        "etcd://joe:hunter2@127.0.0.1:2379/locks/x",
        "redis://:hunter2@127.0.0.1:6379/0?key=x",
        "rediss://joe:hunter2@127.0.0.1?key=x",
        "redis://127.0.0.1?key=x&password=hunter2",
        "mkdir:/tmp/x?password=hunter2",
    ] {
        for args in [
            vec![addr],
            vec!["run", addr, "--", "true"],
            vec!["status", addr],
        ] {
            let o = out(bare(sb.path(), &args));
            assert_eq!(code(o.status), 64, "{args:?}: {}", both(&o));
            assert!(both(&o).contains("ERROR usage: "), "{args:?}: {}", both(&o));
            assert!(
                !both(&o).contains("hunter2"),
                "{args:?}: the password was repeated: {}",
                both(&o)
            );
        }
        let o = out(bare(sb.path(), [addr]));
        let line = stdout(&o);
        assert!(
            line.contains("never carries a password") || line.contains("ERROR usage"),
            "{line}"
        );
    }
    let o = out(bare(sb.path(), ["ftp://joe:hunter2@127.0.0.1/locks/x"]));
    assert!(
        stdout(&o).contains("password_env") && stdout(&o).contains(".netrc"),
        "names the safe ways: {}",
        stdout(&o)
    );
}

#[test]
fn an_unknown_profile_named_like_a_file_here_gets_a_hint() {
    let sb = Sandbox::new("[profile.p]\nbackend = \"mkdir\"\npath = \"{dir}/p.lock\"\n");
    fs::write(sb.join("demo.lock"), "").unwrap();
    // No profiles file at all.
    let o = out(bare(sb.path(), ["demo.lock"]));
    assert_eq!(code(o.status), 78, "{}", stdout(&o));
    assert!(stdout(&o).contains("no profiles file"), "{}", stdout(&o));
    assert!(stdout(&o).contains("write ./demo.lock"), "{}", stdout(&o));
    // With one that does not define it.
    let mut c = sb.cmd(["demo.lock"]);
    c.current_dir(sb.path());
    let o = out(c);
    assert_eq!(code(o.status), 78, "{}", stdout(&o));
    assert!(
        stdout(&o).contains("unknown profile `demo.lock`"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("write ./demo.lock"), "{}", stdout(&o));
    // No hint when there is no such file.
    let mut c = sb.cmd(["nope"]);
    c.current_dir(sb.path());
    assert!(!stdout(&out(c)).contains("write ./"));
}

#[test]
fn status_and_break_name_the_address() {
    let sb = Sandbox::new("");
    let dir = sb.path();
    let addr = format!("mkdir:{}/st.lock", dir.display());
    let o = out(bare(dir, ["status", &addr]));
    assert_eq!(code(o.status), 0);
    assert_eq!(stdout(&o), format!("{addr}: free (backend mkdir)\n"));
    let h = hold(bare(dir, [&addr]));
    let o = out(bare(dir, ["status", "--json", &addr]));
    assert_eq!(code(o.status), 1);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["profile"], addr.as_str());
    assert_eq!(v["holders"][0]["pid"], h.pid());
    let o = out(bare(dir, ["break", &addr]));
    assert_eq!(
        code(o.status),
        75,
        "a live holder is not broken: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("st.lock is held by"), "{}", stderr(&o));
}

fn have(tool: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        missing(&format!("no {tool}"), ".ci/run installs it");
    }
    found
}

#[test]
fn flock_interop_with_flock_1_on_the_same_path() {
    if !have("flock") {
        return;
    }
    let sb = Sandbox::new("");
    let dir = sb.path();
    let path = sb.join("shared.lock");
    let p = path.to_str().unwrap();
    // flock(1) holds it: locksmith is busy, and `-E 1` answers as flock -n would.
    // (-o: flock(1) itself holds the lock, not the command, so killing it frees the lock.)
    let mut f = Command::new("flock")
        .args(["-o", p, "-c", "echo held; exec sleep 60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(f.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line, "held\n");
    let o = out(bare(dir, ["-n", p, "true"]));
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    let o = out(bare(dir, ["-n", "-E", "1", p, "true"]));
    assert_eq!(code(o.status), 1, "{}", stderr(&o));
    let o = out(bare(dir, ["-s", "-n", p, "true"]));
    assert_eq!(code(o.status), 75, "a reader waits for flock(1)'s writer");
    f.kill().unwrap();
    f.wait().unwrap();
    // locksmith holds it: flock(1) is busy; released, flock(1) gets it.
    let h = hold(bare(dir, [p]));
    assert!(h.ok().starts_with("OK "), "{}", h.ok());
    let st = Command::new("flock")
        .args(["-n", p, "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1), "flock(1) must see locksmith's lock");
    drop(h);
    let st = Command::new("flock")
        .args(["-n", p, "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    // A shared locksmith beside a shared flock(1).
    let h = hold(bare(dir, ["-s", p]));
    let st = Command::new("flock")
        .args(["-s", "-n", p, "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
    let st = Command::new("flock")
        .args(["-x", "-n", p, "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(1));
    drop(h);
}

#[test]
fn flock_1_forms_and_their_exit_codes() {
    let sb = Sandbox::new("");
    let dir = sb.path();
    let p = sb.join("forms.lock").display().to_string();
    // LOCK CMD ARGS... : CMD's status; options of CMD stay CMD's.
    let o = out(bare(dir, [p.as_str(), "sh", "-c", "exit 3"]));
    assert_eq!(code(o.status), 3, "{}", stderr(&o));
    let o = out(bare(dir, [p.as_str(), "echo", "-n", "--wait"]));
    assert_eq!((code(o.status), stdout(&o)), (0, "--wait".into()));
    // LOCK -c CMDSTRING
    let o = out(bare(dir, [p.as_str(), "-c", "echo hi; exit 4"]));
    assert_eq!((code(o.status), stdout(&o)), (4, "hi\n".into()));
    // An address works the same way.
    let o = out(bare(dir, ["mkdir:forms.dir", "-c", "test -d forms.dir"]));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    // Busy: -n, -w SECONDS (fractions), -E 1 as flock(1), -s / -x.
    let h = hold(bare(dir, [p.as_str()]));
    let o = out(bare(dir, ["-n", p.as_str(), "true"]));
    assert_eq!(code(o.status), 75);
    let o = out(bare(dir, ["--nonblock", "-E", "1", p.as_str(), "true"]));
    assert_eq!(code(o.status), 1);
    let t = Instant::now();
    let o = out(bare(dir, ["-w", "0.3", p.as_str(), "true"]));
    let took = t.elapsed();
    assert_eq!(code(o.status), 75);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let o = out(bare(dir, ["--timeout", "0.2", p.as_str(), "-c", "true"]));
    assert_eq!((code(o.status), stderr(&o)), (75, String::new()));
    let o = out(bare(
        dir,
        ["--timeout", "0.2", "run", p.as_str(), "--", "true"],
    ));
    assert_eq!(code(o.status), 75);
    assert!(
        stderr(&o).contains("gave up after waiting 200ms"),
        "{}",
        stderr(&o)
    );
    drop(h);
    let r = hold(bare(dir, ["-s", p.as_str()]));
    assert!(r.ok().contains("mode=shared"), "{}", r.ok());
    let o = out(bare(dir, ["-s", "-n", p.as_str(), "true"]));
    assert_eq!(code(o.status), 0, "readers share: {}", stderr(&o));
    let o = out(bare(dir, ["-s", "-x", "-n", p.as_str(), "true"]));
    assert_eq!(code(o.status), 75, "-x after -s is exclusive");
    let o = out(bare(dir, ["-e", "-n", p.as_str(), "true"]));
    assert_eq!(code(o.status), 75);
    drop(r);
    // mkdir has no shared lock: 64 from the command line.
    let o = out(bare(dir, ["-s", "mkdir:m.dir", "true"]));
    assert_eq!(code(o.status), 64, "{}", stderr(&o));
}

/// FTP by address against `srv`: with `?password_env=`, `$LOCKSMITH_PASSWORD` and `~/.netrc`
/// (its 0600 rule), the same lock as a profile's, and nothing of the password in any output.
fn ftp_by_address(srv: &dyn crate::ftp_server::TestFtp) {
    use crate::ftp_server::PASSWORD;
    let sb = crate::ftp::sandbox(srv);
    let dir = sb.path();
    let (port, user) = (srv.port(), srv.user());
    let addr = format!("ftp://{user}@127.0.0.1:{port}/locks/p?password_env=FTPPW");
    let mut c = bare(dir, [&addr]);
    c.env("FTPPW", PASSWORD);
    let mut h = hold(c);
    let line = h.line.clone().unwrap_or_default();
    assert!(
        line.starts_with(&format!("OK {addr} backend=ftp mode=exclusive token=")),
        "{line:?} {}",
        h.stderr_text()
    );
    assert!(srv.path("locks/p").is_dir());
    // The same lock as profile p (path locks/p).
    let o = sb.output(["--wait", "0", "p"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    drop(h);
    eventually(T, "lock directory removed", || {
        !srv.path("locks/p").exists()
    });
    // $LOCKSMITH_PASSWORD.
    let addr = format!("ftp://{user}@127.0.0.1:{port}/locks/p");
    let mut c = bare(
        dir,
        [
            "run",
            &addr,
            "--",
            "sh",
            "-c",
            "test -z \"$LOCKSMITH_PASSWORD\"",
        ],
    );
    c.env("LOCKSMITH_PASSWORD", PASSWORD);
    let o = out(c);
    assert_eq!(
        code(o.status),
        0,
        "CMD does not see the password: {}",
        stderr(&o)
    );
    // ~/.netrc: user and password for the host; readable by others: 78.
    let home = tempfile::tempdir().unwrap();
    let netrc = home.path().join(".netrc");
    private(
        &netrc,
        &format!(
            "machine other.example login x password y\n\nmachine 127.0.0.1\n  login {user}\n  password {PASSWORD}\n"
        ),
    );
    let bare_addr = format!("ftp://127.0.0.1:{port}/locks/p");
    let mut c = bare(dir, ["-v", "run", &bare_addr, "--", "true"]);
    c.env("HOME", home.path());
    let o = out(c);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(!both(&o).contains(PASSWORD));
    fs::set_permissions(&netrc, fs::Permissions::from_mode(0o644)).unwrap();
    let mut c = bare(dir, [&bare_addr]);
    c.env("HOME", home.path());
    let o = out(c);
    assert_eq!(code(o.status), 78, "{}", stdout(&o));
    assert!(
        stdout(&o).contains(".netrc") && stdout(&o).contains("chmod 600"),
        "{}",
        stdout(&o)
    );
    assert!(!both(&o).contains(PASSWORD));
    // A wrong password is denied; the address names no password.
    let mut c = bare(dir, [&addr]);
    c.env("LOCKSMITH_PASSWORD", "not-the-password");
    let o = out(c);
    assert_eq!(code(o.status), 77, "{}", stdout(&o));
    assert!(!both(&o).contains("not-the-password"));
    // No password anywhere (no query, no $LOCKSMITH_PASSWORD, no ~/.netrc): denied, and the
    // one line names where passwords are looked for, even at -q (issue 25 finding 8).
    let o = out(bare(dir, ["-q", "--wait", "0", &addr]));
    assert_eq!(code(o.status), 77, "{}", stdout(&o));
    let line = stdout(&o);
    assert!(line.starts_with("ERROR denied: "), "{line}");
    for needle in [
        "no password was found",
        "password_env",
        "LOCKSMITH_PASSWORD",
        ".netrc",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
}

#[test]
fn ftp_by_address_on_libunftp() {
    ftp_by_address(&crate::ftp_server::FtpServer::start());
}

#[test]
fn ftp_by_address_on_pure_ftpd() {
    use crate::ftp_debian::{DebianFtp, Server};
    if let Some(srv) = DebianFtp::start(Server::PureFtpd) {
        ftp_by_address(&srv);
    }
}

#[test]
fn ftps_by_address_verifies_the_certificate() {
    use crate::ftp_server::{FtpServer, PASSWORD, TestFtp};
    let certs = tempfile::tempdir().unwrap();
    let Some((ca, leaf, key)) = test_certs(certs.path()) else {
        return;
    };
    let srv = FtpServer::start_tls(&leaf, &key);
    let sb = Sandbox::new("");
    let base = format!("ftps://{}@127.0.0.1:{}/locks/t", srv.user(), srv.port());
    let mut c = bare(sb.path(), [format!("{base}?ca_file={}", ca.display())]);
    c.env("LOCKSMITH_PASSWORD", PASSWORD);
    let h = hold(c);
    assert!(h.ok().contains(" backend=ftp mode=exclusive"), "{}", h.ok());
    assert!(srv.path("locks/t").is_dir());
    drop(h);
    // Without the private CA the server is not trusted: 69.
    let mut c = bare(sb.path(), ["--wait", "0", &base]);
    c.env("LOCKSMITH_PASSWORD", PASSWORD);
    let o = out(c);
    assert_eq!(code(o.status), 69, "{}", stdout(&o));
    // `ftps://` with `?tls=none` contradicts itself.
    let o = out(bare(sb.path(), [format!("{base}?tls=none")]));
    assert_eq!(code(o.status), 64, "{}", stdout(&o));
}

#[test]
fn postgres_by_address() {
    let Some(pg) = NotStarted::or_skip(crate::postgres::Pg::start()) else {
        return;
    };
    let sb = pg.sandbox();
    let dir = sb.path();
    let base = format!("postgres://locker@{}:{}/app", pg.host, pg.port);
    let pw = sb.join("pw");
    let addr = format!("{base}?lock=pg&password_file={}", pw.display());
    let h = hold(bare(dir, [&addr]));
    assert!(
        h.ok()
            .starts_with(&format!("OK {addr} backend=postgres mode=exclusive token=")),
        "{}",
        h.ok()
    );
    // The same lock as profile pg (lock "pg").
    let o = sb.output(["--wait", "0", "pg"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    drop(h);
    // PGPASSWORD, as libpq.
    let mut c = bare(dir, ["run", &format!("{base}?lock=pg"), "--", "true"]);
    c.env("PGPASSWORD", "lockpw");
    assert_eq!(code(out(c).status), 0);
    // ~/.pgpass, as libpq; readable by others: 78.
    let home = tempfile::tempdir().unwrap();
    let pgpass = home.path().join(".pgpass");
    private(
        &pgpass,
        &format!(
            "# comment\nother:*:*:*:nope\n{}:{}:app:locker:lockpw\n",
            pg.host, pg.port
        ),
    );
    let mut c = bare(
        dir,
        [
            "run",
            &format!("postgresql://locker@{}:{}/app?lock=pg", pg.host, pg.port),
            "--",
            "true",
        ],
    );
    c.env("HOME", home.path());
    let o = out(c);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    fs::set_permissions(&pgpass, fs::Permissions::from_mode(0o640)).unwrap();
    let mut c = bare(dir, [&format!("{base}?lock=pg")]);
    c.env("HOME", home.path());
    let o = out(c);
    assert_eq!(code(o.status), 78, "{}", stdout(&o));
    assert!(!both(&o).contains("lockpw"));
    // No password at all: the server refuses (77).
    let o = out(bare(dir, [&format!("{base}?lock=pg")]));
    assert_eq!(code(o.status), 77, "{}", stdout(&o));
}

#[test]
fn etcd_by_address() {
    let Some(etcd) = crate::etcd::Etcd::start() else {
        return;
    };
    let sb = etcd.sandbox();
    let addr = format!("etcd://{}:{}/t/e", etcd.host, etcd.port);
    let h = hold(bare(sb.path(), [&addr]));
    assert!(
        h.ok()
            .starts_with(&format!("OK {addr} backend=etcd mode=exclusive token=")),
        "{}",
        h.ok()
    );
    // The same lock as profile e (prefix /t/e).
    let o = sb.output(["--wait", "0", "e"]);
    assert_eq!(code(o.status), 75, "{}", stdout(&o));
    drop(h);
    let o = out(bare(
        sb.path(),
        [&format!("etcd://{}:{}", etcd.host, etcd.port)],
    ));
    assert_eq!(
        code(o.status),
        64,
        "an address names its PREFIX: {}",
        stdout(&o)
    );
    let o = sb.output(["--wait", "0", "run", "e", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}

#[test]
fn netlock_takes_an_address() {
    let sb = Sandbox::new("");
    let addr = format!("mkdir:{}/client.lock", sb.path().display());
    let lock = netlock::NetLock::builder(&addr)
        .helper(bin())
        .lock()
        .expect("lock by address");
    assert!(sb.join("client.lock").is_dir());
    assert!(
        netlock::NetLock::builder(&addr)
            .helper(bin())
            .try_lock()
            .unwrap()
            .is_none()
    );
    lock.unlock().unwrap();
    assert!(!sb.join("client.lock").exists());
}

/// Issue 25 finding 3: `SCHEME://…` with a scheme locksmith does not know (`gs://`, Google
/// Cloud Storage's) is a usage error naming the known schemes — never a relative flock path, and never
/// repeating a secret — on every command line that takes a LOCK, and under the name `flock`.
/// A word with a `/` before any `scheme://` stays a flock path, colons and all. (A redis
/// address with a password: `a_password_in_an_address_is_refused_and_never_repeated`.)
#[test]
fn unknown_schemes_are_usage_errors_without_secrets() {
    let sb = Sandbox::new("");
    let dir = sb.path();
    let flock = dir.join("flock");
    std::os::unix::fs::symlink(bin(), &flock).unwrap();
    for addr in [
        "sftp://host/x",
        "http://example.com/lock",
        "file:///tmp/x.lock",
        "GS://bucket/key",
        "gs://AKIAKEY:SECRETSAUCE@bucket/key",
    ] {
        let forms: [&[&str]; 5] = [
            &["run", addr, "--", "true"],
            &[addr, "true"],
            &["status", addr],
            &["break", addr],
            &[addr],
        ];
        for args in forms {
            let o = out(bare(dir, args));
            assert_eq!(code(o.status), 64, "{args:?}: {}", both(&o));
            let text = both(&o);
            assert!(text.starts_with("ERROR usage: "), "{args:?}: {text}");
            assert!(
                text.contains("mkdir") && text.contains("ftp") && text.contains("etcd"),
                "{args:?} names the known schemes: {text}"
            );
            for secret in ["SECRETSAUCE", "HUNTER2PASSWORD", "AKIAKEY"] {
                assert!(!text.contains(secret), "{args:?} repeats a secret: {text}");
            }
        }
        let mut c = Command::new(&flock);
        c.current_dir(dir).args([addr, "true"]);
        let o = out(c);
        assert_eq!(code(o.status), 64, "flock {addr}: {}", both(&o));
        assert!(!both(&o).contains("SECRETSAUCE") && !both(&o).contains("HUNTER2"));
        assert!(!dir.join("sftp:").exists() && !dir.join("http:").exists());
    }
    for path in ["./x:y", "/tmp/locksmith-colon:test.lock"] {
        let o = out(bare(dir, ["-n", path, "true"]));
        assert_eq!(code(o.status), 0, "{path} is a flock path: {}", both(&o));
    }
    assert!(dir.join("x:y").exists());
}

/// Issue 25 finding 11: a bare number is seconds everywhere, fractions allowed — in an
/// address's query, in a profile (as a string or a TOML number) and on the command line —
/// and `0` still means "try once" for `wait`.
#[test]
fn bare_numbers_are_seconds_everywhere() {
    let sb = Sandbox::new(
        "[profile.w]\nbackend = \"mkdir\"\npath = \"{dir}/w.lock\"\nwait = 1\nstale_after = 30\n\
         [profile.s]\nbackend = \"mkdir\"\npath = \"{dir}/s.lock\"\nwait = \"0.3\"\nstale_after = 2.5\nkeepalive = \"1\"\n\
         [profile.z]\nbackend = \"mkdir\"\npath = \"{dir}/w.lock\"\nwait = 0\n",
    );
    let dir = sb.path();
    let addr = format!("mkdir:{}/a.lock?stale_after=30&wait=0.3", dir.display());
    let h = hold(bare(dir, [&addr]));
    assert!(h.ok().starts_with("OK "), "{}", h.ok());
    let t = Instant::now();
    let o = out(bare(dir, ["run", &addr, "--", "true"]));
    assert_eq!(code(o.status), 75, "{}", stderr(&o));
    assert!(t.elapsed() >= Duration::from_millis(300));
    drop(h);
    let h = sb.hold(["w"]);
    assert!(h.ok().starts_with("OK "), "{}", h.ok());
    let t = Instant::now();
    let o = sb.output(["run", "w", "--", "true"]);
    assert_eq!(code(o.status), 75, "wait = 1: {}", stderr(&o));
    assert!(t.elapsed() >= Duration::from_secs(1), "{:?}", t.elapsed());
    let t = Instant::now();
    let o = sb.output(["run", "z", "--", "true"]);
    assert_eq!(code(o.status), 75, "wait = 0 tries once: {}", stderr(&o));
    assert!(t.elapsed() < Duration::from_secs(1));
    drop(h);
    let o = sb.output(["--wait", "30", "run", "s", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let o = sb.output(["profiles"]);
    assert!(!stdout(&o).contains("invalid"), "{}", stdout(&o));
}
