//! Issue 15: hostile input. Another local user plants a FIFO or a device where locksmith
//! opens a file by name; secrets, CA and profiles files that never end; a parent that does
//! not read its pipe; a planted helper for `netlock`; values that would make root create a
//! setuid file or spin; ERROR lines that would carry megabytes or raw control bytes.
//!
//! The planting cases run the planter as `nobody` (via `setpriv`) in a sticky, world-writable
//! directory, against root's locksmith. They need root: outside CI a visible SKIP, under
//! `CI=true` a failure.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::*;

/// Generous: what must not happen is a hang, and an answer takes milliseconds.
const BOUND: Duration = Duration::from_secs(10);

/// Whether we are root; else a visible SKIP (a failure under `CI=true`).
fn root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    missing(
        &format!("{test}: needs root"),
        "it plants files as `nobody` with setpriv",
    );
    false
}

/// Runs `argv` as `nobody` (and group `nogroup`), as another local user would.
fn as_nobody(argv: &[&str]) {
    let st = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .args(argv)
        .status()
        .expect("setpriv");
    assert!(st.success(), "as nobody: {argv:?}: {st}");
}

/// A sandbox whose `shared/` directory is sticky and world-writable, like `/tmp` or
/// `/var/lock`: anyone may create a name in it, nobody may remove another's.
fn shared_sandbox(toml: &str) -> Sandbox {
    let sb = Sandbox::new(toml);
    fs::set_permissions(sb.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let shared = sb.join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    sb
}

/// The one stderr line of a failed run: `ERROR config: ...` naming what it says.
fn assert_config_error(o: &std::process::Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(code(o.status), 78, "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("ERROR config: "), "{err}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {err}");
    }
}

/// Issue 15 item 1: a FIFO planted by another user at a flock profile's `path` made root's
/// `locksmith --wait 1s run` sit in open(2) forever, deaf to `--wait` and SIGTERM.
#[test]
fn a_fifo_planted_at_the_lock_path_is_refused_at_once() {
    if !root("a_fifo_planted_at_the_lock_path_is_refused_at_once") {
        return;
    }
    let sb = shared_sandbox("[profile.f]\nbackend = \"flock\"\npath = \"{dir}/shared/f.lock\"\n");
    let fifo = sb.join("shared/f.lock");
    as_nobody(&["mkfifo", "-m", "0666", fifo.to_str().unwrap()]);
    let before = fs::read_dir(sb.join("shared")).unwrap().count();
    let t = Instant::now();
    let o = output_within(sb.cmd(["--wait", "1s", "run", "f", "--", "true"]), BOUND);
    assert_config_error(&o, &["lock file", "is a FIFO (named pipe)", "uid 65534"]);
    // Hold mode: the same on stdout, nothing else.
    let o = output_within(sb.cmd(["--wait", "1s", "f"]), BOUND);
    assert_eq!(code(o.status), 78);
    assert!(
        stdout(&o).starts_with("ERROR config: lock file "),
        "{}",
        stdout(&o)
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(fs::read_dir(sb.join("shared")).unwrap().count(), before);
}

/// The same at the writer-preference gate beside the lock file (`.NAME.gate`), which a
/// reader opens before taking its lock.
#[test]
fn a_fifo_planted_at_the_gate_is_refused_at_once() {
    if !root("a_fifo_planted_at_the_gate_is_refused_at_once") {
        return;
    }
    let sb = shared_sandbox("[profile.f]\nbackend = \"flock\"\npath = \"{dir}/shared/f.lock\"\n");
    let gate = sb.join("shared/.f.lock.gate");
    as_nobody(&["mkfifo", "-m", "0666", gate.to_str().unwrap()]);
    let o = output_within(
        sb.cmd(["--shared", "--wait", "1s", "run", "f", "--", "true"]),
        BOUND,
    );
    assert_config_error(&o, &["gate", ".f.lock.gate", "is a FIFO (named pipe)"]);
}

/// A device (here a character device that reads as zeros, like /dev/zero) at the lock path:
/// refused, never read.
#[test]
fn a_device_at_the_lock_path_is_refused() {
    if !root("a_device_at_the_lock_path_is_refused") {
        return;
    }
    let sb = shared_sandbox("[profile.f]\nbackend = \"flock\"\npath = \"{dir}/shared/f.lock\"\n");
    let dev = sb.join("shared/f.lock");
    let st = Command::new("mknod")
        .args(["-m", "0666", dev.to_str().unwrap(), "c", "1", "5"])
        .status()
        .unwrap();
    assert!(st.success());
    let o = output_within(sb.cmd(["--wait", "1s", "run", "f", "--", "true"]), BOUND);
    assert_config_error(&o, &["is a character device"]);
}

/// Runs locksmith under an address-space limit, so that reading a file that never ends
/// fails fast (before the fix: an abort) instead of growing until the OOM killer comes.
fn limited(sb: &Sandbox, args: &[&str]) -> std::process::Output {
    let mut c = Command::new("prlimit");
    c.arg("--as=1500000000")
        .arg("--")
        .arg(bin())
        .arg("--profiles")
        .arg(&sb.profiles)
        .args(args)
        .env_remove("LOCKSMITH_PROFILES")
        .env_remove("LOCKSMITH_LOG")
        .stdin(std::process::Stdio::null());
    output_within(c, Duration::from_secs(60))
}

/// Issue 15 item 2: `password_file` naming a FIFO (hang) or a private device that yields
/// zeros (24 GB, then the OOM killer), `ca_file = "/dev/zero"`, `--profiles /dev/zero`.
#[test]
fn secret_ca_and_profiles_files_are_opened_without_blocking_and_read_capped() {
    if !root("secret_ca_and_profiles_files_are_opened_without_blocking_and_read_capped") {
        return;
    }
    let sb = shared_sandbox(
        "[profile.pwfifo]\nbackend = \"ftp\"\nhost = \"127.0.0.1\"\nport = 1\nuser = \"u\"\n\
         password_file = \"pw.fifo\"\npath = \"lock\"\n\n\
         [profile.pwdev]\nbackend = \"ftp\"\nhost = \"127.0.0.1\"\nport = 1\nuser = \"u\"\n\
         password_file = \"pw.dev\"\npath = \"lock\"\n\n\
         [profile.pwbig]\nbackend = \"ftp\"\nhost = \"127.0.0.1\"\nport = 1\nuser = \"u\"\n\
         password_file = \"pw.big\"\npath = \"lock\"\n\n\
         [profile.cazero]\nbackend = \"etcd\"\nendpoints = [\"https://127.0.0.1:1\"]\n\
         ca_file = \"/dev/zero\"\n",
    );
    // Root's own private files: they pass the owner and mode rule, only the kind is wrong.
    nix::unistd::mkfifo(
        &sb.join("pw.fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let st = Command::new("mknod")
        .args([
            "-m",
            "0600",
            sb.join("pw.dev").to_str().unwrap(),
            "c",
            "1",
            "5",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    fs::write(sb.join("pw.big"), vec![b'x'; 100 * 1024]).unwrap();
    fs::set_permissions(sb.join("pw.big"), fs::Permissions::from_mode(0o600)).unwrap();

    let o = limited(&sb, &["--wait", "0", "run", "pwfifo", "--", "true"]);
    assert_config_error(&o, &["pw.fifo", "is a FIFO (named pipe)"]);
    let o = limited(&sb, &["--wait", "0", "run", "pwdev", "--", "true"]);
    assert_config_error(&o, &["pw.dev", "is a character device"]);
    let o = limited(&sb, &["--wait", "0", "run", "pwbig", "--", "true"]);
    assert_config_error(&o, &["pw.big", "102400 bytes, over the limit of 64 KiB"]);
    let o = limited(&sb, &["--wait", "0", "run", "cazero", "--", "true"]);
    assert_config_error(&o, &["ca_file /dev/zero is a character device"]);

    for profiles in ["/dev/zero", sb.join("pw.fifo").to_str().unwrap()] {
        let mut c = Command::new("prlimit");
        c.args(["--as=1500000000", "--", bin(), "--profiles", profiles])
            .args(["run", "x", "--", "true"])
            .stdin(std::process::Stdio::null());
        let o = output_within(c, Duration::from_secs(60));
        assert_config_error(&o, &["profiles file", "not a regular file"]);
    }
}

/// A FIFO as `password_file` made by an unprivileged user for its own profile: the same,
/// without root (the kind is checked on the descriptor, not by a `stat` before).
#[test]
fn a_fifo_as_password_file_is_refused_for_anyone() {
    let sb = Sandbox::new(
        "[profile.p]\nbackend = \"ftp\"\nhost = \"127.0.0.1\"\nport = 1\nuser = \"u\"\n\
         password_file = \"pw\"\npath = \"lock\"\n",
    );
    nix::unistd::mkfifo(
        &sb.join("pw"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let o = output_within(sb.cmd(["--wait", "0", "run", "p", "--", "true"]), BOUND);
    assert_config_error(&o, &["password_file", "is a FIFO (named pipe)"]);
    assert!(Path::new(&sb.join("pw")).exists());
}

/// A pipe whose buffer (shrunk to one page) is already full, and its unread read end: a
/// parent that does not read.
fn full_pipe() -> (std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    use nix::fcntl::{F_GETFL, F_SETFL, F_SETPIPE_SZ, OFlag, fcntl};
    let (r, w) = nix::unistd::pipe().unwrap();
    let _ = fcntl(&w, F_SETPIPE_SZ(4096));
    let fl = OFlag::from_bits_truncate(fcntl(&w, F_GETFL).unwrap());
    fcntl(&w, F_SETFL(fl | OFlag::O_NONBLOCK)).unwrap();
    let chunk = [b'.'; 512];
    while nix::unistd::write(&w, &chunk).is_ok() {}
    // Blocking again, as a parent's pipe is: the child inherits this open file description.
    fcntl(&w, F_SETFL(fl)).unwrap();
    (r, w)
}

/// Issue 15 item 4: a parent that does not read its pipe blocked the `OK` write, and SIGTERM
/// went unheeded until the pipe drained. Now the line waits for room in `poll` beside the
/// release causes: SIGTERM ends the helper at once, the lock released, exit 75 (OK was never
/// delivered: a wait interrupted). The ERROR line of a busy lock likewise.
#[test]
fn a_parent_that_does_not_read_cannot_keep_the_helper_from_a_signal() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let (r, w) = full_pipe();
        let mut c = sb.cmd([p]);
        c.stdout(std::process::Stdio::from(w))
            .stderr(std::process::Stdio::piped());
        let mut h = Held::spawn(c);
        eventually(BOUND, "the lock taken", || {
            code(sb.output(["status", p]).status) == 1
        });
        h.signal(libc::SIGTERM);
        let t = Instant::now();
        let st = h.wait_exit(BOUND);
        assert_eq!(code(st), 75, "{p}: {}", h.stderr_text());
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "{p}: {:?}",
            t.elapsed()
        );
        let o = sb.output(["status", p]);
        assert_eq!(code(o.status), 0, "{p}: released: {}", stdout(&o));

        drop(r);

        // The busy ERROR line to a full pipe: once nothing is held, SIGTERM still ends it.
        let holder = sb.hold([p]);
        holder.ok();
        let (r, w) = full_pipe();
        let mut c = sb.cmd(["--wait", "0", p]);
        c.stdout(std::process::Stdio::from(w))
            .stderr(std::process::Stdio::piped());
        let mut h = Held::spawn(c);
        let pid = h.pid();
        eventually(BOUND, "blocked writing its ERROR line", || {
            fs::read_to_string(format!("/proc/{pid}/wchan"))
                .is_ok_and(|w| w.ends_with("pipe_write"))
        });
        h.signal(libc::SIGTERM);
        let st = h.wait_exit(BOUND);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGTERM),
            "{p}: {st:?}"
        );
        drop(r);
        drop(holder);
    }
}

/// Issue 15 item 7: `file_mode = "4777"` made root create a setuid, world-writable file.
#[test]
fn file_mode_with_setuid_setgid_or_sticky_bits_is_refused() {
    for mode in ["4777", "2770", "1777", "04660"] {
        let sb = Sandbox::new(&format!(
            "[profile.f]\nbackend = \"flock\"\npath = \"{{dir}}/f.lock\"\nfile_mode = \"{mode}\"\n"
        ));
        let o = output_within(sb.cmd(["--wait", "0", "run", "f", "--", "true"]), BOUND);
        assert_config_error(&o, &["file_mode", "setuid, setgid or sticky"]);
        assert!(!sb.join("f.lock").exists(), "{mode}: nothing created");
    }
    let sb = Sandbox::new(
        "[profile.f]\nbackend = \"flock\"\npath = \"{dir}/f.lock\"\nfile_mode = \"0777\"\n",
    );
    let o = output_within(sb.cmd(["--wait", "0", "run", "f", "--", "true"]), BOUND);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}

/// `stale_after = "3ns"` with `keepalive = "1ns"` spun a holder at 100% CPU; a `poll` of
/// nanoseconds spins a waiter. Below the floors (poll 1 ms, keepalive 10 ms, stale_after
/// 100 ms) a value is a clear 78; at them it works.
#[test]
fn timings_below_the_floors_are_refused() {
    for (key, value, rest) in [
        ("stale_after", "3ns", "keepalive = \"1ns\"\n"),
        ("keepalive", "1ns", "stale_after = \"3ns\"\n"),
        ("poll", "500us", ""),
        ("keepalive", "9ms", ""),
        ("stale_after", "99ms", "keepalive = \"10ms\"\n"),
    ] {
        let sb = Sandbox::new(&format!(
            "[profile.m]\nbackend = \"mkdir\"\npath = \"{{dir}}/m.lock\"\n{key} = \"{value}\"\n{rest}"
        ));
        let o = output_within(sb.cmd(["--wait", "0", "run", "m", "--", "true"]), BOUND);
        assert_config_error(&o, &["below the floor"]);
    }
    let sb = Sandbox::new(
        "[profile.m]\nbackend = \"mkdir\"\npath = \"{dir}/m.lock\"\npoll = \"1ms\"\nmax_poll = \"1ms\"\n\
         keepalive = \"10ms\"\nstale_after = \"100ms\"\n",
    );
    let o = output_within(sb.cmd(["--wait", "0", "run", "m", "--", "true"]), BOUND);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
}

/// CMD inherited the variable a profile's `password_env` names: the server password.
#[test]
fn cmd_never_sees_the_password_variable() {
    let srv = crate::ftp_server::FtpServer::start();
    let sb = crate::ftp::sandbox(&srv);
    let text = fs::read_to_string(&sb.profiles).unwrap();
    let user = crate::ftp_server::TestFtp::user(&srv);
    let port = crate::ftp_server::TestFtp::port(&srv);
    sb.write_profiles(&format!(
        "{text}\n[profile.envpw]\nbackend = \"ftp\"\nhost = \"127.0.0.1\"\nport = {port}\n\
         user = \"{user}\"\npassword_env = \"HOSTILE_FTP_PW\"\npath = \"locks/e\"\n"
    ));
    let mut c = sb.cmd(["--wait", "5s", "run", "envpw", "--", "env"]);
    c.env("HOSTILE_FTP_PW", crate::ftp_server::PASSWORD)
        .env("HOSTILE_OTHER", "kept");
    let o = output_within(c, Duration::from_secs(30));
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let env = stdout(&o);
    assert!(env.contains("HOSTILE_OTHER=kept"), "{env}");
    assert!(env.contains("LOCKSMITH_PROFILE=envpw"), "{env}");
    assert!(!env.contains("HOSTILE_FTP_PW"), "{env}");
}

/// An unknown profile among 200k listed all 1.7 MB of names on one ERROR line; a 10 MB path
/// (here 2 MB: a profiles file is capped at 4 MiB) was echoed whole (and exited 74); a NUL or an escape sequence in a path was printed raw.
#[test]
fn error_lines_are_bounded_and_escaped() {
    let mut toml = String::new();
    for i in 0..2000 {
        toml.push_str(&format!(
            "[profile.p{i:05}]\nbackend = \"flock\"\npath = \"{{dir}}/p.lock\"\n"
        ));
    }
    toml.push_str(&format!(
        "[profile.long]\nbackend = \"flock\"\npath = \"{{dir}}/{}\"\n",
        "x/".repeat(1024 * 1024)
    ));
    toml.push_str("[profile.nul]\nbackend = \"flock\"\npath = \"{dir}/a\\u0000b\"\n");
    toml.push_str("[profile.esc]\nbackend = \"flock\"\npath = \"{dir}/no-such\\u001b[31m/x\"\n");
    let sb = Sandbox::new(&toml);
    let one_line = |o: &std::process::Output| {
        let err = stderr(o);
        assert!(err.len() < 4096, "{} bytes: {}", err.len(), &err[..200]);
        assert!(
            !o.stderr
                .iter()
                .any(|&b| (b < 0x20 && b != b'\n') || b == 0x7f),
            "raw control bytes: {err:?}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    let o = output_within(sb.cmd(["--wait", "0", "run", "nope", "--", "true"]), BOUND);
    assert_eq!(code(o.status), 78);
    let err = one_line(&o);
    assert!(
        err.contains("p00000, p00001") && err.contains("and 1993 more"),
        "{err}"
    );

    let o = output_within(sb.cmd(["--wait", "0", "run", "long", "--", "true"]), BOUND);
    assert_eq!(
        code(o.status),
        78,
        "{}",
        &stderr(&o)[..200.min(o.stderr.len())]
    );
    let err = one_line(&o);
    assert!(err.contains("bytes long") && err.contains('…'), "{err}");

    let o = output_within(sb.cmd(["--wait", "0", "run", "nul", "--", "true"]), BOUND);
    assert_eq!(code(o.status), 78);
    let err = one_line(&o);
    assert!(err.contains("a\\x00b"), "{err}");

    let o = output_within(sb.cmd(["--wait", "0", "run", "esc", "--", "true"]), BOUND);
    assert_eq!(code(o.status), 78);
    let err = one_line(&o);
    assert!(err.contains("no-such\\x1b[31m"), "{err}");
}

/// A directory as a flock `path` exited 74 (io); it is a configuration mistake.
#[test]
fn a_directory_as_a_flock_path_is_a_config_error() {
    let sb = Sandbox::new("[profile.f]\nbackend = \"flock\"\npath = \"{dir}/d\"\n");
    fs::create_dir(sb.join("d")).unwrap();
    let o = output_within(sb.cmd(["--wait", "0", "run", "f", "--", "true"]), BOUND);
    assert_config_error(&o, &["is a directory"]);
}

/// `-q --wait 0 -E 0 run` still printed `ERROR busy`, so cron mailed every skipped run;
/// `flock -n` is silent. The exit code still says it.
#[test]
fn quiet_run_says_busy_by_its_exit_code_alone() {
    let sb = Sandbox::standard();
    for p in LOCAL {
        let holder = sb.hold([p]);
        holder.ok();
        let o = output_within(
            sb.cmd(["-q", "--wait", "0", "-E", "0", "run", p, "--", "true"]),
            BOUND,
        );
        assert_eq!((code(o.status), stderr(&o)), (0, String::new()), "{p}");
        let o = output_within(sb.cmd(["-q", "--wait", "0", "run", p, "--", "true"]), BOUND);
        assert_eq!((code(o.status), stderr(&o)), (75, String::new()), "{p}");
        // Without -q the line is there.
        let o = output_within(sb.cmd(["--wait", "0", "run", p, "--", "true"]), BOUND);
        assert_eq!(code(o.status), 75);
        assert!(stderr(&o).starts_with("ERROR busy: "), "{}", stderr(&o));
    }
}

/// The name of the planted-helper test, for the copy of this binary to run it again.
const PROBE_TEST: &str = "hostile::netlock_never_runs_a_helper_planted_where_others_can_write";

/// Issue 15 item 6: `netlock` looked for `locksmith` beside the program and then in the
/// directory above it, so a program at `/tmp/build/app` ran `/tmp/locksmith`, which any user
/// can create. Here this test binary, hard-linked to `shared/build/app` (root's directory in
/// a sticky, world-writable one), runs itself as that program: the `locksmith` that `nobody`
/// planted in `shared/` must not run (it would leave a mark), and with no trusted helper on
/// `$PATH` either, the lock is a spawn error.
#[test]
fn netlock_never_runs_a_helper_planted_where_others_can_write() {
    if let Some(profiles) = std::env::var_os("HOSTILE_PROBE") {
        // The copy: lock through the client as any program would, and say what happened.
        let r = netlock::NetLock::builder("f")
            .profiles(profiles)
            .wait(Duration::ZERO)
            .lock();
        eprintln!("probe: {:?}", r.as_ref().err().map(|e| e.kind()));
        if let Err(e) = r {
            eprintln!("probe error: {e}");
        }
        return;
    }
    if !root(PROBE_TEST) {
        return;
    }
    let sb = shared_sandbox("[profile.f]\nbackend = \"flock\"\npath = \"{dir}/f.lock\"\n");
    let shared = sb.join("shared");
    let mark = shared.join("planted-ran");
    let script = format!(
        "#!/bin/sh\ntouch {}\necho 'OK f backend=flock mode=exclusive'\nexec sleep 5\n",
        mark.display()
    );
    let planted = shared.join("locksmith");
    as_nobody(&[
        "sh",
        "-c",
        &format!(
            "printf '%s' \"$1\" > {p} && chmod 0755 {p}",
            p = planted.display()
        ),
        "sh",
        &script,
    ]);
    let build = shared.join("build");
    fs::create_dir(&build).unwrap();
    let app = build.join("app");
    fs::hard_link(std::env::current_exe().unwrap(), &app).unwrap();
    let mut c = Command::new(&app);
    c.args(["--exact", PROBE_TEST, "--nocapture", "--test-threads=1"])
        .env("HOSTILE_PROBE", &sb.profiles)
        .env_remove("LOCKSMITH_BIN")
        .env("PATH", "/usr/bin:/bin");
    let o = output_within(c, Duration::from_secs(30));
    let out = format!("{}{}", stdout(&o), stderr(&o));
    assert!(!mark.exists(), "the planted helper ran: {out}");
    assert!(out.contains("probe: Some(Spawn)"), "{out}");
}

/// The file backends, each with a lock in the sticky `shared/` directory.
const FILE_BACKENDS: &str = "\
[defaults]
stale_after = \"1s\"
keepalive = \"300ms\"
poll = \"50ms\"
[profile.f]
backend = \"flock\"
path = \"{dir}/shared/f.lock\"
[profile.m]
backend = \"mkdir\"
path = \"{dir}/shared/m.lock\"
[profile.l]
backend = \"link\"
path = \"{dir}/shared/l.lock\"
[profile.s]
backend = \"symlink\"
path = \"{dir}/shared/s.lock\"
";

/// Removes everything in `shared/` (root may, whoever planted it).
fn clear_shared(sb: &Sandbox) {
    for e in fs::read_dir(sb.join("shared")).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            fs::remove_dir_all(&p).unwrap();
        } else {
            fs::remove_file(&p).unwrap();
        }
    }
}

/// Root's `run P -- touch ran` with something planted: one config line naming the file and
/// its owner, CMD never run, and no lock left (the next run, the plant removed, holds).
fn refused_naming(sb: &Sandbox, p: &str, needles: &[&str]) {
    let ran = sb.join("ran");
    let o = output_within(
        sb.cmd([
            "--wait",
            "3s",
            "run",
            p,
            "--",
            "touch",
            ran.to_str().unwrap(),
        ]),
        BOUND,
    );
    assert_config_error(&o, needles);
    assert!(!ran.exists(), "{p}: CMD ran beside a planted file");
}

/// Issue 15 item 5: a `.NAME.state` planted by another user made mkdir/link/symlink exit 74
/// (`Invalid argument`) and flock silently drop its fencing token. Now every file backend
/// answers the same: 78, naming the file, what it is, its owner and what to do — tokens are
/// never issued from it, nor silently restarted.
#[test]
fn a_planted_token_state_is_refused_the_same_way_by_every_file_backend() {
    if !root("a_planted_token_state_is_refused_the_same_way_by_every_file_backend") {
        return;
    }
    let sb = shared_sandbox(FILE_BACKENDS);
    let max = format!("locksmith-state v=1 token={} clean=1", u64::MAX);
    for p in ["f", "m", "l", "s"] {
        let state = sb.join(&format!("shared/.{p}.lock.state"));
        let s = state.to_str().unwrap();
        let plants: [(&[&str], &[&str]); 6] = [
            (
                &["sh", "-c", &format!("echo 7 > {s}")],
                &["is a regular file"],
            ),
            (&["mkdir", s], &["is a directory"]),
            (&["mkfifo", s], &["is a FIFO (named pipe)"]),
            (&["ln", "-s", "garbage", s], &["is a symbolic link"]),
            // A state of a pre-release format (one symlink): in the way as any other.
            (&["ln", "-s", &max, s], &["is a symbolic link"]),
            (
                &[
                    "sh",
                    "-c",
                    &format!("mkdir {s} && ln -s x {s}/state~1~{}~1", u64::MAX),
                ],
                &["cannot issue a fencing token after it"],
            ),
        ];
        for (plant, what) in plants {
            clear_shared(&sb);
            as_nobody(plant);
            let mut needles = vec![
                "lock state",
                s,
                "owned by user nobody (uid 65534)",
                "remove it",
            ];
            needles.extend_from_slice(what);
            refused_naming(&sb, p, &needles);
            assert!(
                !sb.join(&format!("shared/{p}.lock")).exists() || p == "f",
                "{p}: lock left behind after {plant:?}"
            );
        }
        // The plant gone, the lock works and tokens start at the clock's floor (a new
        // state, issue 28).
        clear_shared(&sb);
        let o = sb.output(["run", p, "--", "sh", "-c", "echo $LOCKSMITH_TOKEN"]);
        assert_eq!(code(o.status), 0, "{p}: {}", stderr(&o));
        let t: u64 = stdout(&o).trim().parse().unwrap();
        assert!(t > 1_000_000_000_000_000, "{p}: {t}");
    }
}

/// A symbolic link planted at the lock path: flock answered 77 (`Permission denied`), mkdir
/// and link 78 in words of their own. Now one answer, naming the link and its owner. (For
/// the symlink backend a symbolic link *is* a lock: one it did not write is a lock of
/// another format, busy until `break --force`.)
#[test]
fn a_symlink_planted_at_the_lock_path_gets_one_answer() {
    if !root("a_symlink_planted_at_the_lock_path_gets_one_answer") {
        return;
    }
    let sb = shared_sandbox(FILE_BACKENDS);
    for (p, expected) in [
        ("f", "not a regular file"),
        ("m", "not a directory (backend `mkdir`)"),
        ("l", "not a lock record (a regular file)"),
    ] {
        clear_shared(&sb);
        let lock = sb.join(&format!("shared/{p}.lock"));
        let l = lock.to_str().unwrap();
        as_nobody(&["ln", "-s", "/etc/passwd", l]);
        refused_naming(
            &sb,
            p,
            &[
                l,
                "is a symbolic link owned by user nobody (uid 65534)",
                expected,
                "remove it",
            ],
        );
    }
}

/// A holder of `p` killed with SIGKILL: its lock stays behind for a waiter to break.
/// A holder of `p` killed while holding; its token.
fn dead_holder(sb: &Sandbox, p: &str) -> u64 {
    let mut h = sb.hold([p]);
    assert!(h.ok().starts_with("OK "), "{p}: {:?}", h.line);
    kill9(h.pid());
    h.wait_exit(BOUND);
    token_of(h.ok())
}

/// A `.NAME.break` guard planted by another user blocked breaking a dead holder for ever
/// (link: 77; symlink: EIO, 74). Now: a guard of the right kind that nobody updates is
/// abandoned after stale_after and removed, so the dead holder is broken; one of another
/// kind is refused, naming it and its owner.
#[test]
fn a_planted_break_guard_never_blocks_breaking_silently() {
    if !root("a_planted_break_guard_never_blocks_breaking_silently") {
        return;
    }
    let sb = shared_sandbox(FILE_BACKENDS);
    for (p, right_kind, wrong_kind, expected) in [
        ("l", "file", "symlink", "not a lock record (a regular file)"),
        (
            "s",
            "symlink",
            "file",
            "not a symbolic link (backend `symlink`)",
        ),
    ] {
        let guard = sb.join(&format!("shared/.{p}.lock.break"));
        let g = guard.to_str().unwrap();
        let plant = |kind: &str| match kind {
            "file" => as_nobody(&["sh", "-c", &format!("echo junk > {g}")]),
            "dir" => as_nobody(&["mkdir", g]),
            _ => as_nobody(&["ln", "-s", "junk", g]),
        };
        // The right kind, junk inside: removed once silent for stale_after, lock broken.
        clear_shared(&sb);
        let dead = dead_holder(&sb, p);
        plant(right_kind);
        let o = output_within(
            sb.cmd([
                "--wait",
                "8s",
                "run",
                p,
                "--",
                "sh",
                "-c",
                "echo $LOCKSMITH_TOKEN",
            ]),
            BOUND,
        );
        assert_eq!(code(o.status), 0, "{p}: {}", stderr(&o));
        assert_eq!(stdout(&o).trim(), (dead + 1).to_string(), "{p}");
        assert!(
            stderr(&o).contains("removed the abandoned break guard"),
            "{p}: {}",
            stderr(&o)
        );
        // Another kind (and a directory): refused, named.
        for kind in [wrong_kind, "dir"] {
            clear_shared(&sb);
            dead_holder(&sb, p);
            plant(kind);
            refused_naming(
                &sb,
                p,
                &[
                    "break guard",
                    g,
                    "owned by user nobody (uid 65534)",
                    expected,
                ],
            );
        }
    }
}
