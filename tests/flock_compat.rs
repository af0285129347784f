//! SPEC §3c (issue 25): locksmith under the name `flock` is util-linux's flock(1). Every form
//! and option runs against both `/usr/bin/flock` and locksmith-as-`flock` (a symlink named
//! `flock` to the helper) with the same expectations; then util-linux's own flock test
//! script (tests/ts/misc/flock of 2.41), ported, against both; then what only locksmith
//! adds: lock addresses in place of FILE, and the same long options under its own name.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::*;

const T: Duration = Duration::from_secs(20);

/// A flock(1) under test: util-linux's, or locksmith under the name `flock`.
struct Flock {
    label: &'static str,
    path: PathBuf,
    /// Keeps the symlink's directory alive.
    _dir: Option<tempfile::TempDir>,
}

impl Flock {
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.path);
        c.stdin(Stdio::null());
        c
    }

    /// Runs with `args` (cwd `dir`), with a deadline.
    fn run(&self, dir: &Path, args: &[&str]) -> Output {
        let mut c = self.cmd();
        c.current_dir(dir).args(args);
        output_within(c, T)
    }

    /// Whether it knows `--fcntl` (util-linux 2.38 does not).
    fn has_fcntl(&self) -> bool {
        let d = tempfile::tempdir().unwrap();
        code(self.run(d.path(), &["--fcntl", "f", "true"]).status) == 0
    }
}

/// The system's flock(1), if installed, and ours.
fn flocks() -> Vec<Flock> {
    let mut v = Vec::new();
    if Path::new("/usr/bin/flock").exists() {
        v.push(Flock {
            label: "util-linux",
            path: "/usr/bin/flock".into(),
            _dir: None,
        });
    } else {
        eprintln!("no /usr/bin/flock: only locksmith-as-flock is tested");
    }
    v.push(ours());
    v
}

/// locksmith under the name `flock`.
fn ours() -> Flock {
    let dir = tempfile::Builder::new()
        .prefix("locksmith-flock-")
        .tempdir()
        .unwrap();
    let path = dir.path().join("flock");
    std::os::unix::fs::symlink(bin(), &path).unwrap();
    Flock {
        label: "locksmith",
        path,
        _dir: Some(dir),
    }
}

/// A lock held by `flock ARGS... LOCK sh -c 'echo locked; exec cat'` until [`Holder::release`]
/// (its stdin closed).
struct Holder {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Holder {
    fn new(f: &Flock, dir: &Path, args: &[&str], lock: &str) -> Holder {
        let mut c = Command::new(&f.path);
        c.current_dir(dir)
            .args(args)
            .args([lock, "sh", "-c", "echo locked; exec cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut l = String::new();
            let _ = BufReader::new(out).read_line(&mut l);
            let _ = tx.send(l);
        });
        let line = rx.recv_timeout(T).expect("holder took its lock");
        assert_eq!(line, "locked\n", "{}: holder", f.label);
        let stdin = child.stdin.take();
        Holder { child, stdin }
    }

    fn release(mut self) {
        drop(self.stdin.take());
        let s = self.child.wait().unwrap();
        assert!(s.success(), "holder: {s:?}");
    }
}

fn sandbox() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("locksmith-flock1-")
        .tempdir()
        .unwrap()
}

#[test]
fn conflict_exits_1_or_e_and_says_nothing() {
    for f in flocks() {
        let d = sandbox();
        let h = Holder::new(&f, d.path(), &[], "lock");
        for opts in [
            &["-n"][..],
            &["--nb"],
            &["--nonblock"],
            &["--nonblocking"],
            &["-w", "0"],
            &["-x", "-n"],
            &["-e", "-n"],
            &["--exclusive", "-n"],
            &["-s", "-n"],
            &["-w", "0.05"],
        ] {
            let mut args = opts.to_vec();
            args.extend(["lock", "echo", "ran"]);
            let o = f.run(d.path(), &args);
            assert_eq!(code(o.status), 1, "{}: {args:?}: {}", f.label, stderr(&o));
            assert_eq!(stdout(&o), "", "{}: {args:?} ran the command", f.label);
            assert_eq!(stderr(&o), "", "{}: {args:?} is silent", f.label);
        }
        for args in [
            &["-n", "-E", "123", "lock", "true"][..],
            &["-nE123", "lock", "true"],
            &["--conflict-exit-code=123", "-n", "lock", "true"],
            &["--conflict-exit-code", "123", "-w", ".01", "lock", "true"],
            &["-E", "123", "-n", "lock", "-c", "true"],
        ] {
            let o = f.run(d.path(), args);
            assert_eq!(code(o.status), 123, "{}: {args:?}: {}", f.label, stderr(&o));
            assert_eq!(stderr(&o), "", "{}: {args:?}", f.label);
        }
        h.release();
        let o = f.run(d.path(), &["-n", "lock", "echo", "ran"]);
        assert_eq!(
            (code(o.status), stdout(&o)),
            (0, "ran\n".into()),
            "{}",
            f.label
        );
    }
}

#[test]
fn verbose_says_what_flock_says() {
    for f in flocks() {
        let d = sandbox();
        let h = Holder::new(&f, d.path(), &[], "lock");
        let o = f.run(d.path(), &["--verbose", "-n", "lock", "true"]);
        assert_eq!(code(o.status), 1, "{}", f.label);
        assert_eq!(stderr(&o), "flock: failed to get lock\n", "{}", f.label);
        let o = f.run(d.path(), &["--verbose", "-w", "0.1", "lock", "true"]);
        assert_eq!(code(o.status), 1, "{}", f.label);
        assert_eq!(
            stderr(&o),
            "flock: timeout while waiting to get lock\n",
            "{}",
            f.label
        );
        h.release();
        let o = f.run(d.path(), &["--verbose", "lock", "echo", "hi"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        let out = stdout(&o);
        // Into a pipe flock(1)'s stdio buffer reaches it only at exit: after CMD's output.
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{}: {out}", f.label);
        assert_eq!(lines[0], "hi", "{}: {out}", f.label);
        assert_eq!(lines[2], "flock: executing echo", "{}", f.label);
        let took = lines[1]
            .strip_prefix("flock: getting lock took ")
            .and_then(|t| t.strip_suffix(" seconds"))
            .unwrap_or_else(|| panic!("{}: {out}", f.label));
        let (s, us) = took.split_once('.').unwrap();
        assert!(
            s.parse::<u64>().is_ok() && us.len() == 6,
            "{}: {took}",
            f.label
        );
        assert_eq!(stderr(&o), "", "{}", f.label);
        // -F: the buffer goes with the process image at exec.
        let o = f.run(d.path(), &["--verbose", "-F", "lock", "echo", "hi"]);
        assert_eq!(stdout(&o), "hi\n", "{}", f.label);
    }
}

#[test]
fn wait_and_timeout() {
    for f in flocks() {
        let d = sandbox();
        let h = Holder::new(&f, d.path(), &[], "lock");
        let t0 = Instant::now();
        let o = f.run(d.path(), &["-w", "0.3", "lock", "true"]);
        assert_eq!(code(o.status), 1, "{}", f.label);
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "{}: -w 0.3 took {took:?}",
            f.label
        );
        // Waiters (forever, --timeout, --wait) get it once it is free, silently.
        let mut waiters: Vec<(&str, Child)> = [
            &["lock", "echo", "forever"][..],
            &["--timeout", "30", "lock", "echo", "timeout"],
            &["--wait=30", "lock", "echo", "wait"],
        ]
        .iter()
        .map(|args| {
            let mut c = f.cmd();
            c.current_dir(d.path())
                .args(*args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            (args[args.len() - 1], c.spawn().unwrap())
        })
        .collect();
        // Each is blocked (still running) while the lock is held.
        let proc_locks = || std::fs::read_to_string("/proc/locks").unwrap();
        eventually(T, "three waiters blocked in the kernel", || {
            proc_locks().lines().filter(|l| l.contains("->")).count() >= 3
        });
        for (_, w) in waiters.iter_mut() {
            assert!(
                w.try_wait().unwrap().is_none(),
                "{}: waiter gave up",
                f.label
            );
        }
        h.release();
        for (word, w) in waiters.drain(..) {
            let o = w.wait_with_output().unwrap();
            assert_eq!(code(o.status), 0, "{}: {word}", f.label);
            assert_eq!(stdout(&o), format!("{word}\n"), "{}", f.label);
            assert_eq!(stderr(&o), "", "{}: waiting is silent", f.label);
        }
    }
}

#[test]
fn shared_and_exclusive() {
    for f in flocks() {
        let d = sandbox();
        let h = Holder::new(&f, d.path(), &["-s"], "lock");
        for (args, want) in [
            (&["-s", "-n", "lock", "true"][..], 0),
            (&["--shared", "-n", "lock", "true"], 0),
            (&["-n", "lock", "true"], 1),
            (&["-x", "-n", "lock", "true"], 1),
            (&["-s", "-x", "-n", "lock", "true"], 1),
            (&["-x", "-s", "-n", "lock", "true"], 0),
        ] {
            let o = f.run(d.path(), args);
            assert_eq!(code(o.status), want, "{}: {args:?}", f.label);
        }
        h.release();
    }
}

#[test]
fn the_command_forms_and_their_status() {
    for f in flocks() {
        let d = sandbox();
        let o = f.run(d.path(), &["lock", "sh", "-c", "echo out; exit 7"]);
        assert_eq!(
            (code(o.status), stdout(&o)),
            (7, "out\n".into()),
            "{}",
            f.label
        );
        let o = f.run(d.path(), &["lock", "-c", "echo a b; exit 3"]);
        assert_eq!(
            (code(o.status), stdout(&o)),
            (3, "a b\n".into()),
            "{}",
            f.label
        );
        let o = f.run(d.path(), &["lock", "--command", "echo c"]);
        assert_eq!(
            (code(o.status), stdout(&o)),
            (0, "c\n".into()),
            "{}",
            f.label
        );
        let o = f.run(d.path(), &["lock", "sh", "-c", "kill -9 $$"]);
        assert_eq!(code(o.status), 128 + 9, "{}", f.label);
        // A command that cannot be executed: 69 (EX_UNAVAILABLE), as flock(1) says.
        let o = f.run(d.path(), &["lock", "/nonexistent/cmd"]);
        assert_eq!(code(o.status), 69, "{}", f.label);
        assert_eq!(
            stderr(&o),
            "flock: failed to execute /nonexistent/cmd: No such file or directory\n",
            "{}",
            f.label
        );
        // The lock file is created, and nothing else is left beside it.
        let names: Vec<String> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["lock"], "{}", f.label);
        // A file without `#!` runs by /bin/sh (execvp(3)), with or without -F.
        let script = d.path().join("plain");
        std::fs::write(&script, "echo \"plain $1\"\n").unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        for form in [
            &["lock", "./plain", "x"][..],
            &["-F", "lock", "./plain", "x"],
        ] {
            let o = f.run(d.path(), form);
            assert_eq!(
                (code(o.status), stdout(&o)),
                (0, "plain x\n".into()),
                "{} {form:?}: {}",
                f.label,
                stderr(&o)
            );
        }
        // -c runs $SHELL (else /bin/sh).
        let mut c = f.cmd();
        c.current_dir(d.path()).env("SHELL", "/bin/bash").args([
            "lock",
            "-c",
            "echo $BASH_VERSION",
        ]);
        let o = output_within(c, T);
        assert_ne!(stdout(&o).trim(), "", "{}: -c runs $SHELL", f.label);
    }
}

#[test]
fn descriptor_form_from_a_real_shell() {
    for f in flocks() {
        let d = sandbox();
        let script = r#"
            exec 4<>lock
            "$FLOCK" -n 4 || exit 9
            echo locked
            "$FLOCK" -n lock true; echo other=$?
            "$FLOCK" -s -n lock true; echo shared=$?
            "$FLOCK" -u 4; echo unlock=$?
            "$FLOCK" -n lock true; echo after=$?
            "$FLOCK" -s 4; echo shared4=$?
            "$FLOCK" -n lock true; echo exclusive=$?
            "$FLOCK" -s -n lock true; echo shared2=$?
            ( "$FLOCK" -n 9 || exit 1; echo in-subshell ) 9>lock2
            "$FLOCK" -w 5 -E 3 5 5>lock2; echo fd5=$?
        "#;
        let mut c = Command::new("bash");
        c.current_dir(d.path())
            .env("FLOCK", &f.path)
            .args(["-c", script])
            .stdin(Stdio::null());
        let o = output_within(c, T);
        assert_eq!(
            stdout(&o),
            "locked\nother=1\nshared=1\nunlock=0\nafter=0\nshared4=0\nexclusive=1\nshared2=0\nin-subshell\nfd5=0\n",
            "{}: {}",
            f.label,
            stderr(&o)
        );
        assert_eq!(stderr(&o), "", "{}", f.label);
        // No file named like the descriptor.
        assert!(!d.path().join("4").exists(), "{}", f.label);
        // A descriptor not open, a word that is not a number.
        let o = f.run(d.path(), &["-n", "99"]);
        assert_eq!(code(o.status), 65, "{}", f.label);
        assert_eq!(
            stderr(&o),
            "flock: 99: Bad file descriptor\n",
            "{}",
            f.label
        );
        let o = f.run(d.path(), &["-n", "abc"]);
        assert_eq!(code(o.status), 64, "{}", f.label);
        assert_eq!(
            stderr(&o),
            "flock: bad file descriptor: 'abc'\n",
            "{}",
            f.label
        );
    }
}

#[test]
fn directories_are_locked_as_flock_locks_them() {
    let all = flocks();
    for f in &all {
        let d = sandbox();
        let dir = d.path().join("dir");
        std::fs::create_dir(&dir).unwrap();
        let o = f.run(d.path(), &["dir", "-c", "echo in-dir"]);
        assert_eq!(
            (code(o.status), stdout(&o)),
            (0, "in-dir\n".into()),
            "{}",
            f.label
        );
        // Held by either implementation, refused by both.
        for g in &all {
            let h = Holder::new(g, d.path(), &[], "dir");
            let o = f.run(d.path(), &["-w", ".007", "dir", "-c", "echo"]);
            assert_eq!(code(o.status), 1, "{} vs holder {}", f.label, g.label);
            let o = f.run(d.path(), &["-s", "-n", "dir", "true"]);
            assert_eq!(code(o.status), 1, "{} vs holder {}", f.label, g.label);
            h.release();
        }
        let h = Holder::new(f, d.path(), &["-s"], "dir");
        let o = f.run(d.path(), &["-s", "-w", ".007", "dir", "-c", "echo"]);
        assert_eq!(code(o.status), 0, "{}: shared on a directory", f.label);
        h.release();
        let names: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert!(
            names.is_empty(),
            "{}: nothing made in the directory",
            f.label
        );
    }
}

/// The descriptors a command has open, by what they name.
const FDS: &str = "ls -l /proc/$$/fd";

#[test]
fn close_and_no_fork() {
    for f in flocks() {
        let d = sandbox();
        let lock = d.path().join("lock");
        let lock = lock.to_str().unwrap();
        let o = f.run(d.path(), &["lock", "sh", "-c", FDS]);
        assert!(
            stdout(&o).contains(lock),
            "{}: CMD inherits the lock",
            f.label
        );
        let o = f.run(d.path(), &["-o", "lock", "sh", "-c", FDS]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        assert!(
            !stdout(&o).contains(lock),
            "{}: -o: {}",
            f.label,
            stdout(&o)
        );
        let o = f.run(d.path(), &["--close", "lock", "sh", "-c", FDS]);
        assert!(!stdout(&o).contains(lock), "{}: --close", f.label);
        // -o: the lock is still held while CMD runs (by flock itself).
        let script = format!("\"{}\" -n lock true; echo $?", f.path.display());
        let o = f.run(d.path(), &["-o", "lock", "sh", "-c", &script]);
        assert_eq!(stdout(&o), "1\n", "{}", f.label);
        // -F: CMD is flock's own process, holding the lock.
        let mut c = f.cmd();
        c.current_dir(d.path())
            .args(["-F", "lock", "sh", "-c", "echo $$; exit 5"])
            .stdout(Stdio::piped());
        let child = c.spawn().unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        assert_eq!(code(o.status), 5, "{}", f.label);
        assert_eq!(stdout(&o), format!("{pid}\n"), "{}: -F execs CMD", f.label);
        let o = f.run(d.path(), &["--no-fork", "lock", "sh", "-c", &script]);
        assert_eq!(stdout(&o), "1\n", "{}: -F: CMD holds the lock", f.label);
        let o = f.run(d.path(), &["-F", "-o", "lock", "true"]);
        assert_eq!(code(o.status), 64, "{}", f.label);
        assert_eq!(
            stderr(&o),
            "flock: the --no-fork and --close options are incompatible\n",
            "{}",
            f.label
        );
    }
}

#[test]
fn unlock_on_a_file_runs_the_command() {
    for f in flocks() {
        let d = sandbox();
        let o = f.run(d.path(), &["-u", "lock", "echo", "u"]);
        assert_eq!(
            (code(o.status), stdout(&o)),
            (0, "u\n".into()),
            "{}",
            f.label
        );
        let o = f.run(d.path(), &["--unlock", "lock", "true"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
    }
}

#[test]
fn usage_errors_help_and_version() {
    for f in flocks() {
        let d = sandbox();
        let name = f.path.display().to_string();
        for (args, want, err) in [
            (
                &[][..],
                64,
                "flock: not enough arguments\nTry 'flock --help' for more information.\n"
                    .to_string(),
            ),
            (
                &["--bogus", "lock", "true"],
                64,
                format!(
                    "{name}: unrecognized option '--bogus'\nTry 'flock --help' for more information.\n"
                ),
            ),
            (
                &["-z", "lock", "true"],
                64,
                format!(
                    "{name}: invalid option -- 'z'\nTry 'flock --help' for more information.\n"
                ),
            ),
            (
                &["--shared=1", "lock", "true"],
                64,
                format!(
                    "{name}: option '--shared' doesn't allow an argument\nTry 'flock --help' for more information.\n"
                ),
            ),
            (
                &["--timeout"],
                64,
                format!(
                    "{name}: option '--timeout' requires an argument\nTry 'flock --help' for more information.\n"
                ),
            ),
            (
                &["-w"],
                64,
                format!(
                    "{name}: option requires an argument -- 'w'\nTry 'flock --help' for more information.\n"
                ),
            ),
            (
                &["--n", "lock", "true"],
                64,
                format!(
                    "{name}: option '--n' is ambiguous; possibilities: '--nonblocking' '--no-fork'\nTry 'flock --help' for more information.\n"
                ),
            ),
            (
                &["-w", "soon", "lock", "true"],
                64,
                "flock: invalid timeout value: 'soon'\n".into(),
            ),
            (
                &["-E", "x", "lock", "true"],
                64,
                "flock: invalid exit code: 'x'\n".into(),
            ),
            (
                &["-E", "256", "lock", "true"],
                64,
                "flock: exit code out of range (expected 0 to 255)\n".into(),
            ),
            (
                &["-n"],
                64,
                "flock: requires file descriptor, file or directory\n".into(),
            ),
            (
                &["lock", "-c"],
                64,
                "flock: -c requires exactly one command argument\n".into(),
            ),
            (
                &["lock", "-c", "a", "b"],
                64,
                "flock: -c requires exactly one command argument\n".into(),
            ),
            (
                &["/nonexistent/dir/lock", "true"],
                66,
                "flock: cannot open lock file /nonexistent/dir/lock: No such file or directory\n"
                    .into(),
            ),
        ] {
            let o = f.run(d.path(), args);
            assert_eq!(
                code(o.status),
                want,
                "{}: {args:?}: {}",
                f.label,
                stderr(&o)
            );
            assert_eq!(stderr(&o), err, "{}: {args:?}", f.label);
        }
        let o = f.run(d.path(), &["-h"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        assert!(
            stdout(&o).contains("Usage:\n flock [options] <file>|<directory> <command>"),
            "{}",
            f.label
        );
        let o = f.run(d.path(), &["--version"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        assert!(
            stdout(&o).starts_with("flock from "),
            "{}: {}",
            f.label,
            stdout(&o)
        );
    }
}

/// util-linux's tests/ts/misc/flock (2.41), ported: a shared lock held for a while by a
/// background flock, then the sub-tests, for flock(2) and for `--fcntl`. Returns the names
/// of the sub-tests that pass (and says the others).
fn util_linux_script(f: &Flock) -> (Vec<String>, Vec<String>) {
    const HOLD: f64 = 1.0;
    let (mut pass, mut fail) = (Vec::new(), Vec::new());
    for api in ["flock", "fcntl"] {
        let d = sandbox();
        let (prefix, api_arg): (&str, &[&str]) = match api {
            "flock" => ("", &[]),
            _ => ("fcntl-", &["--fcntl"]),
        };
        let mut check = |name: &str, ok: bool| {
            let n = format!("{prefix}{name}");
            if ok { pass.push(n) } else { fail.push(n) }
        };
        let start = Instant::now();
        let mut general = f.cmd();
        general
            .current_dir(d.path())
            .args(api_arg)
            .args(["--shared", "lockfile", "bash", "-c"])
            .arg(format!(
                "echo 'API: {api}(2)'; echo Locking; sleep {HOLD}; echo Unlocking"
            ))
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut general = general.spawn().unwrap();
        let pid = general.id();
        // "the lock should be established when flock has a child"
        let children = format!("/proc/{pid}/task/{pid}/children");
        let mut started = false;
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && general.try_wait().unwrap().is_none() {
            if std::fs::read_to_string(&children).is_ok_and(|c| !c.trim().is_empty()) {
                started = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if !started {
            // ts_die: every sub-test of this api fails.
            let _ = general.kill();
            let _ = general.wait();
            for n in [
                "non-block",
                "no-fork",
                "shared",
                "exclusive",
                "fd",
                "timeout",
                "time-check",
            ] {
                check(n, false);
            }
            if api == "fcntl" {
                check("vs-flock", false);
            }
            continue;
        }
        let do_lock = |opts: &[&str], rc: i32, mesg: &str| -> bool {
            let mut a: Vec<&str> = api_arg.to_vec();
            a.extend_from_slice(opts);
            a.extend(["lockfile", "echo", mesg]);
            let o = f.run(d.path(), &a);
            code(o.status) == rc && (rc != 0 || stdout(&o) == format!("{mesg}\n"))
        };
        check(
            "non-block",
            do_lock(
                &["--nonblock", "--conflict-exit-code", "123"],
                123,
                "You will never see this!",
            ),
        );
        check(
            "no-fork",
            do_lock(
                &["--no-fork", "--nonblock", "--conflict-exit-code", "123"],
                123,
                "You will never see this!",
            ),
        );
        check("shared", do_lock(&["--shared"], 0, "Have shared lock"));
        check(
            "exclusive",
            do_lock(
                &["--nonblock", "--exclusive", "--conflict-exit-code", "123"],
                123,
                "You will never see this!",
            ),
        );
        let mut c = Command::new("bash");
        c.current_dir(d.path()).env("FLOCK", &f.path).arg("-c").arg(format!(
            "exec 4<>lockfile || exit 99; \"$FLOCK\" {} --nonblock --exclusive --conflict-exit-code 123 4",
            api_arg.join(" ")
        ));
        let o = output_within(c, T);
        check("fd", code(o.status) == 123 && !d.path().join("4").exists());
        if api == "fcntl" {
            // fcntl locks are independent of flock locks.
            let o = f.run(
                d.path(),
                &[
                    "--nonblock",
                    "--exclusive",
                    "lockfile",
                    "echo",
                    "flock vs fcntl",
                ],
            );
            let ok = code(o.status) == 0 && stdout(&o) == "flock vs fcntl\n";
            if ok {
                pass.push("fcntl-vs-flock".into())
            } else {
                fail.push("fcntl-vs-flock".into())
            }
        }
        let mut check = |name: &str, ok: bool| {
            let n = format!("{prefix}{name}");
            if ok { pass.push(n) } else { fail.push(n) }
        };
        check(
            "timeout",
            do_lock(
                &["--timeout", "5", "--conflict-exit-code", "5"],
                0,
                "After timeout.",
            ),
        );
        let took = start.elapsed().as_secs_f64();
        check("time-check", (HOLD..=HOLD + 2.0).contains(&took));
        let out = general.wait_with_output().unwrap();
        let want = format!("API: {api}(2)\nLocking\nUnlocking\n");
        if stdout(&out) != want {
            eprintln!("{}: general lock said {:?}", f.label, stdout(&out));
        }
    }
    (pass, fail)
}

#[test]
fn util_linux_flock_test_script() {
    let _g = heavy();
    let mut ours_passed = 0;
    for f in flocks() {
        let (pass, fail) = util_linux_script(&f);
        eprintln!(
            "util-linux tests/ts/misc/flock against {} ({}): {} of {} sub-tests pass; failing: {fail:?}",
            f.label,
            f.path.display(),
            pass.len(),
            pass.len() + fail.len()
        );
        if f.label == "locksmith" {
            assert!(fail.is_empty(), "locksmith-as-flock fails {fail:?}");
            ours_passed = pass.len();
        } else if !f.has_fcntl() {
            // util-linux before 2.40 has no --fcntl: its flock(2) half must pass.
            assert!(
                fail.iter().all(|n| n.starts_with("fcntl-")),
                "{} fails {fail:?}",
                f.label
            );
        }
    }
    assert_eq!(ours_passed, 15);
}

#[test]
fn fcntl_locks_are_not_flock_locks() {
    let f = ours();
    let d = sandbox();
    let h = Holder::new(&f, d.path(), &["--fcntl"], "lock");
    let o = f.run(d.path(), &["--fcntl", "-n", "lock", "true"]);
    assert_eq!(code(o.status), 1, "an OFD lock excludes an OFD lock");
    let o = f.run(d.path(), &["-n", "lock", "true"]);
    assert_eq!(code(o.status), 0, "a flock(2) lock is another lock");
    h.release();
    let _ = std::io::stderr().flush();
}

/// What only locksmith-as-flock adds: a lock address in place of FILE, taken as quietly,
/// with flock(1)'s conflict code and `--verbose` lines.
#[test]
fn addresses_in_place_of_file() {
    let f = ours();
    let d = sandbox();
    let addr = format!("mkdir:{}/m.lock", d.path().display());
    let o = f.run(d.path(), &[&addr, "sh", "-c", "echo in; exit 4"]);
    assert_eq!(
        (code(o.status), stdout(&o)),
        (4, "in\n".into()),
        "{}",
        stderr(&o)
    );
    assert_eq!(stderr(&o), "");
    let h = Holder::new(&f, d.path(), &[], &addr);
    let o = f.run(d.path(), &["-n", &addr, "true"]);
    assert_eq!((code(o.status), stderr(&o)), (1, String::new()));
    let o = f.run(d.path(), &["-E", "9", "-w", "0.2", &addr, "true"]);
    assert_eq!((code(o.status), stderr(&o)), (9, String::new()));
    let o = f.run(d.path(), &["--verbose", "-n", &addr, "true"]);
    assert_eq!(
        (code(o.status), stderr(&o).as_str()),
        (1, "flock: failed to get lock\n")
    );
    // A waiter is silent too, and runs once the holder lets go.
    let mut c = f.cmd();
    c.current_dir(d.path())
        .args([&addr, "echo", "waited"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let w = c.spawn().unwrap();
    h.release();
    let o = w.wait_with_output().unwrap();
    assert_eq!(
        (code(o.status), stdout(&o), stderr(&o)),
        (0, "waited\n".into(), String::new())
    );
    let o = f.run(d.path(), &["--verbose", &addr, "echo", "v"]);
    assert!(
        stdout(&o).contains("flock: executing echo\n"),
        "{}",
        stdout(&o)
    );
    // -F and -u need a descriptor: a usage error for a lock address.
    for opt in ["-F", "-u", "--fcntl"] {
        let o = f.run(d.path(), &[opt, &addr, "true"]);
        assert_eq!(code(o.status), 64, "{opt}: {}", stderr(&o));
    }
    // flock: addresses keep locksmith's flock (tokens), and interoperate with flock(1).
    let faddr = format!("flock:{}/f.lock", d.path().display());
    let o = f.run(d.path(), &[&faddr, "sh", "-c", "echo $LOCKSMITH_TOKEN"]);
    // The first token of a new flock state is the clock's floor (issue 28).
    assert!(
        stdout(&o).trim().parse::<u64>().is_ok_and(|t| t > 1),
        "{}",
        stderr(&o)
    );
    let h = Holder::new(&f, d.path(), &[], "f.lock");
    let o = f.run(d.path(), &["-n", &faddr, "true"]);
    assert_eq!(code(o.status), 1);
    h.release();
}

/// Under its own name the §3a forms take the same long options, with locksmith's codes.
#[test]
fn locksmith_takes_flock_options() {
    let d = sandbox();
    let f = ours();
    let h = Holder::new(&f, d.path(), &[], "lock");
    let ls = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.current_dir(d.path()).args(args).stdin(Stdio::null());
        output_within(c, T)
    };
    for opt in ["-n", "--nb", "--nonblock", "--nonblocking"] {
        let o = ls(&[opt, "./lock", "true"]);
        assert_eq!((code(o.status), stderr(&o)), (75, String::new()), "{opt}");
    }
    let script = format!(
        r#"exec 4<>lock; "{b}" -n --fd 4; echo fd=$?; "{b}" -E 1 -n --fd 4; echo fd1=$?"#,
        b = bin()
    );
    let mut c = Command::new("bash");
    c.current_dir(d.path()).args(["-c", &script]);
    let o = output_within(c, T);
    assert_eq!(stdout(&o), "fd=75\nfd1=1\n", "{}", stderr(&o));
    h.release();
    let script = format!(
        r#"exec 4<>lock; "{b}" --fd 4; echo fd=$?; "{f}" -n lock true; echo other=$?; "{b}" -u --fd 4; echo unlock=$?; "{f}" -n lock true; echo after=$?"#,
        b = bin(),
        f = f.path.display()
    );
    let mut c = Command::new("bash");
    c.current_dir(d.path()).args(["-c", &script]);
    let o = output_within(c, T);
    assert_eq!(
        stdout(&o),
        "fd=0\nother=1\nunlock=0\nafter=0\n",
        "{}",
        stderr(&o)
    );
    let lock = d.path().join("lock");
    let lock = lock.to_str().unwrap();
    let o = ls(&["-o", "./lock", "sh", "-c", FDS]);
    assert!(!stdout(&o).contains(lock), "-o: {}", stdout(&o));
    let o = ls(&["./lock", "sh", "-c", FDS]);
    assert!(stdout(&o).contains(lock));
    let o = ls(&["-F", "./lock", "sh", "-c", "exit 6"]);
    assert_eq!(code(o.status), 6, "{}", stderr(&o));
    let m = format!("mkdir:{}/m.lock", d.path().display());
    let o = ls(&["-F", &m, "true"]);
    assert_eq!(code(o.status), 64, "{}", stderr(&o));
    assert!(stderr(&o).starts_with("ERROR usage: "), "{}", stderr(&o));
    for bad in [
        &["-u", "./lock", "true"][..],
        &["--fd", "4", "./lock"],
        &["--fd", "x"],
        &["-F", "-o", "./lock", "true"],
    ] {
        let o = ls(bad);
        assert_eq!(code(o.status), 64, "{bad:?}: {}", stderr(&o));
    }
    let o = ls(&["--fd", "99"]);
    assert_eq!(code(o.status), 64, "{}", stderr(&o));
}

/// Issue 25 finding 1: flock(1)'s forms under locksmith's name (`LOCK CMD`, `LOCK -c`) are as
/// quiet as flock(1) — no `ERROR busy` line, no waiting message — while `run` and hold mode
/// keep SPEC §4.5's.
#[test]
fn flock_forms_are_quiet_run_keeps_its_messages() {
    let d = sandbox();
    let f = ours();
    let ls = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.current_dir(d.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    for lock in [
        "./lock".to_string(),
        format!("mkdir:{}/m.lock", d.path().display()),
    ] {
        let h = Holder::new(&f, d.path(), &[], &lock);
        for args in [
            &["-n", &lock, "true"][..],
            &["-w", "0.1", &lock, "-c", "true"],
        ] {
            let o = output_within(ls(args), T);
            assert_eq!(
                (code(o.status), stderr(&o)),
                (75, String::new()),
                "{args:?}"
            );
        }
        let o = output_within(ls(&["-n", "-E", "1", &lock, "true"]), T);
        assert_eq!((code(o.status), stderr(&o)), (1, String::new()));
        let o = output_within(ls(&["-n", "run", &lock, "--", "true"]), T);
        assert_eq!(code(o.status), 75);
        assert!(
            stderr(&o).starts_with("ERROR busy: "),
            "run keeps it: {}",
            stderr(&o)
        );
        let o = output_within(ls(&["-n", &lock]), T);
        assert_eq!(code(o.status), 75);
        assert!(
            stdout(&o).starts_with("ERROR busy: "),
            "hold keeps it: {}",
            stdout(&o)
        );
        // A waiter: silent in the flock form, said once in `run`.
        let quiet = ls(&[&lock, "echo", "got"]).spawn().unwrap();
        let mut said = Held::spawn(ls(&["run", &lock, "--", "echo", "got"]));
        said.wait_stderr("waiting for lock", T);
        h.release();
        let o = quiet.wait_with_output().unwrap();
        assert_eq!(
            (code(o.status), stdout(&o), stderr(&o)),
            (0, "got\n".into(), String::new()),
            "{lock}"
        );
        assert_eq!(code(said.wait_exit(T)), 0);
    }
}

/// The names in `d`, sorted.
fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Issue 25 finding 12: flock(1) leaves nothing but the lock file — exclusive, shared,
/// contended (a waiter), `-F` — and so does locksmith in flock(1)'s forms.
#[test]
fn nothing_but_the_file_is_left_beside_it() {
    for f in flocks() {
        let d = sandbox();
        let o = f.run(d.path(), &["lock", "true"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        let o = f.run(d.path(), &["-s", "lock", "true"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        let o = f.run(d.path(), &["-F", "lock", "true"]);
        assert_eq!(code(o.status), 0, "{}", f.label);
        // A writer that waits, and a reader that waits behind a holder.
        let h = Holder::new(&f, d.path(), &[], "lock");
        let o = f.run(d.path(), &["-w", "0.3", "lock", "true"]);
        assert_eq!(code(o.status), 1, "{}", f.label);
        let o = f.run(d.path(), &["-s", "-w", "0.3", "lock", "true"]);
        assert_eq!(code(o.status), 1, "{}", f.label);
        h.release();
        assert_eq!(names(d.path()), ["lock"], "{}", f.label);
    }
    // The same as `locksmith LOCK CMD`.
    let d = sandbox();
    let mut c = Command::new(bin());
    c.current_dir(d.path())
        .args(["./lock", "true"])
        .stdin(Stdio::null());
    assert_eq!(code(output_within(c, T).status), 0);
    assert_eq!(names(d.path()), ["lock"]);
}

/// `locksmith -F run` (the lock held by CMD's descriptor past locksmith's exec) issues no
/// token, so the next holder is not told the previous one crashed; an uncontended reader
/// makes no writer-preference gate.
#[test]
fn no_fork_leaves_no_unclean_state_and_readers_no_gate() {
    let d = sandbox();
    let profiles = d.path().join("profiles.toml");
    std::fs::write(
        &profiles,
        format!(
            "[profile.f]\nbackend = \"flock\"\npath = \"{}/f.lock\"\n",
            d.path().display()
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.current_dir(d.path())
            .env_remove("LOCKSMITH_PROFILES")
            .arg("--profiles")
            .arg(&profiles)
            .args(args)
            .stdin(Stdio::null());
        output_within(c, T)
    };
    let o = run(&[
        "-F",
        "run",
        "f",
        "--",
        "sh",
        "-c",
        "echo ${LOCKSMITH_TOKEN-none}",
    ]);
    assert_eq!(stdout(&o), "none\n", "{}", stderr(&o));
    let o = run(&[
        "run",
        "f",
        "--",
        "sh",
        "-c",
        "echo $LOCKSMITH_TOKEN ${LOCKSMITH_PREV-clean}",
    ]);
    // The first token of a new flock state is the clock's floor (issue 28).
    let out = stdout(&o);
    let (token, prev) = out.trim().split_once(' ').unwrap_or(("", ""));
    assert!(
        token.parse::<u64>().is_ok_and(|t| t > 1) && prev == "clean",
        "{out}: {}",
        stderr(&o)
    );
    let o = run(&["--shared", "run", "f", "--", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert!(
        !d.path().join(".f.lock.gate").exists(),
        "{:?}",
        names(d.path())
    );
}

/// flock(1)'s man-page example `flock /tmp -c cat` under the name `locksmith`: a directory
/// is locked as flock(1) locks it (issue 25), with locksmith's exit codes.
#[test]
fn locksmith_locks_a_directory_as_flock_does() {
    let f = ours();
    let d = sandbox();
    std::fs::create_dir(d.path().join("dir")).unwrap();
    let locksmith = |args: &[&str]| {
        let mut c = Command::new(bin());
        c.current_dir(d.path()).args(args).stdin(Stdio::null());
        output_within(c, T)
    };
    let o = locksmith(&["./dir", "-c", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    let h = Holder::new(&f, d.path(), &[], "dir");
    let o = locksmith(&["-n", "./dir", "true"]);
    assert_eq!(
        code(o.status),
        75,
        "the same lock as flock(1)'s: {}",
        stderr(&o)
    );
    h.release();
    let o = locksmith(&["-n", "./dir", "true"]);
    assert_eq!(code(o.status), 0, "{}", stderr(&o));
    assert_eq!(names(d.path()), ["dir"]);
    // Outside flock(1)'s forms a directory is still not a flock lock file.
    let o = locksmith(&["run", "./dir", "--", "true"]);
    assert_eq!(code(o.status), 78, "{}", stderr(&o));
}
