//! Under the name `flock` (SPEC §3c): util-linux's flock(1), 2.41's man page being the
//! contract — its grammar (getopt's, stopping at the first word that is not an option), its
//! forms, options, exit codes and words on stderr/stdout. A FILE or DIRECTORY is locked as
//! flock(1) locks it (open, create a missing file, flock(2) the descriptor, nothing beside
//! it); a NUMBER is the caller's descriptor. The one thing added: a lock address of §3a in
//! place of FILE (`flock mkdir:/nfs/locks/x backup.sh`), taken by locksmith's `run`.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::cli::{AsFlock, Cli, Command};
use crate::settings::{Wait, decimal_seconds};
use crate::sys::{self, LockOp};

/// flock(1)'s exit codes (sysexits.h).
const EX_USAGE: i32 = 64;
const EX_DATAERR: i32 = 65;
const EX_NOINPUT: i32 = 66;
const EX_UNAVAILABLE: i32 = 69;
const EX_OSERR: i32 = 71;
const EX_CANTCREAT: i32 = 73;

/// What the options said.
#[derive(Debug)]
struct Opts {
    op: LockOp,
    nonblock: bool,
    timeout: Option<Duration>,
    conflict: i32,
    close: bool,
    no_fork: bool,
    verbose: bool,
    fcntl: bool,
}

/// How a run ends early: an exit code, its message already said.
type Exit = i32;

/// `flock: MSG` on stderr.
fn say(msg: impl std::fmt::Display) {
    eprintln!("flock: {msg}");
}

/// argv[0] as given: getopt's messages name the program so.
static PROG: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A usage error as getopt and errtryhelp say it: 64.
fn try_help(msg: impl std::fmt::Display) -> Exit {
    eprintln!("{}: {msg}", PROG.get().map_or("flock", String::as_str));
    eprintln!("Try 'flock --help' for more information.");
    EX_USAGE
}

/// The long options, as getopt_long knows them (`true`: takes a value).
const LONGS: &[(&str, bool)] = &[
    ("shared", false),
    ("exclusive", false),
    ("unlock", false),
    ("nonblocking", false),
    ("nb", false),
    ("timeout", true),
    ("wait", true),
    ("conflict-exit-code", true),
    ("close", false),
    ("no-fork", false),
    ("verbose", false),
    ("fcntl", false),
    ("help", false),
    ("version", false),
];

/// `-w`'s value: seconds, decimal fractions allowed (leading blanks skipped, as strtod does).
fn seconds(v: &str) -> Option<Duration> {
    Duration::try_from_secs_f64(decimal_seconds(v.trim_start())?).ok()
}

/// Applies one option (by its long name) to `o`; `Err(code)` ends the run.
fn apply(o: &mut Opts, name: &str, value: Option<&str>) -> Result<(), Exit> {
    match name {
        "shared" => o.op = LockOp::Shared,
        "exclusive" => o.op = LockOp::Exclusive,
        "unlock" => o.op = LockOp::Unlock,
        "nonblocking" | "nb" => o.nonblock = true,
        "timeout" | "wait" => {
            let v = value.unwrap_or_default();
            o.timeout = Some(seconds(v).ok_or_else(|| {
                say(format!("invalid timeout value: '{v}'"));
                EX_USAGE
            })?);
        }
        "conflict-exit-code" => {
            let v = value.unwrap_or_default();
            let n: i64 = v.trim().parse().map_err(|_| {
                say(format!("invalid exit code: '{v}'"));
                EX_USAGE
            })?;
            if !(0..=255).contains(&n) {
                say("exit code out of range (expected 0 to 255)");
                return Err(EX_USAGE);
            }
            o.conflict = n as i32;
        }
        "close" => o.close = true,
        "no-fork" => o.no_fork = true,
        "verbose" => o.verbose = true,
        "fcntl" => o.fcntl = true,
        "help" => {
            let _ = crate::protocol::report(&usage());
            return Err(0);
        }
        "version" => {
            let _ = crate::protocol::report(&format!(
                "flock from locksmith {} (util-linux flock(1) 2.41 compatible)\n",
                env!("CARGO_PKG_VERSION")
            ));
            return Err(0);
        }
        _ => unreachable!("only names of LONGS"),
    }
    Ok(())
}

fn usage() -> String {
    "\nUsage:\n \
     flock [options] <file>|<directory> <command> [<argument>...]\n \
     flock [options] <file>|<directory> -c <command>\n \
     flock [options] <file descriptor number>\n\n\
     Manage file locks from shell scripts.\n\
     In place of <file> also a locksmith lock address: mkdir:PATH, link:PATH, symlink:PATH,\n\
     flock:PATH, ftp://..., postgres://..., etcd://..., redis://... (see locksmith(1)).\n\n\
     Options:\n \
     -s, --shared             get a shared lock\n \
     -x, --exclusive          get an exclusive lock (default)\n \
     -u, --unlock             remove a lock\n \
     -n, --nb, --nonblocking  fail rather than wait\n \
     -w, --timeout <secs>     wait for a limited amount of time\n \
     -E, --conflict-exit-code <number>  exit code after conflict or timeout\n \
     -o, --close              close file descriptor before running command\n \
     -c, --command <command>  run a single command string through the shell\n \
     -F, --no-fork            execute command without forking\n     \
     --wait               same as --timeout\n     \
     --fcntl              use fcntl(F_OFD_SETLK) rather than flock()\n     \
     --verbose            increase verbosity\n\n \
     -h, --help               display this help\n \
     -V, --version            display version\n\n\
     For more details see flock(1) and locksmith(1).\n"
        .to_string()
}

/// getopt_long with `+sexnoFuw:E:hV?`: options up to the first word that is not one (or
/// `--`); the index of that word.
fn parse(args: &[OsString], o: &mut Opts) -> Result<usize, Exit> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_bytes();
        if a == b"--" {
            return Ok(i + 1);
        }
        if a.len() < 2 || a[0] != b'-' {
            return Ok(i);
        }
        let text = String::from_utf8_lossy(a).into_owned();
        if let Some(long) = text.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            // getopt_long: an exact name, else a prefix of one option (spellings of one
            // option count once).
            let mut found: Vec<&(&str, bool)> = match LONGS.iter().find(|(l, _)| *l == name) {
                Some(exact) => vec![exact],
                None => LONGS.iter().filter(|(l, _)| l.starts_with(name)).collect(),
            };
            fn same(l: &'static str) -> &'static str {
                match l {
                    "nb" => "nonblocking",
                    "wait" => "timeout",
                    other => other,
                }
            }
            let mut seen = Vec::new();
            found.retain(|(l, _)| {
                let s = same(l);
                let new = !seen.contains(&s);
                seen.push(s);
                new
            });
            let (full, takes) = match found.as_slice() {
                [one] => **one,
                [] => return Err(try_help(format!("unrecognized option '--{name}'"))),
                many => {
                    let list: Vec<String> = many.iter().map(|(l, _)| format!("'--{l}'")).collect();
                    return Err(try_help(format!(
                        "option '--{name}' is ambiguous; possibilities: {}",
                        list.join(" ")
                    )));
                }
            };
            let value = match (takes, inline) {
                (false, Some(_)) => {
                    return Err(try_help(format!(
                        "option '--{full}' doesn't allow an argument"
                    )));
                }
                (false, None) => None,
                (true, Some(v)) => Some(v),
                (true, None) => {
                    i += 1;
                    match args.get(i) {
                        Some(v) => Some(v.to_string_lossy().into_owned()),
                        None => {
                            return Err(try_help(format!(
                                "option '--{full}' requires an argument"
                            )));
                        }
                    }
                }
            };
            apply(o, full, value.as_deref())?;
            i += 1;
            continue;
        }
        // A cluster of short options: `-sn`, `-w5`, `-E 3`.
        let chars: Vec<char> = text[1..].chars().collect();
        let mut k = 0;
        while k < chars.len() {
            let c = chars[k];
            let name = match c {
                's' => "shared",
                'x' | 'e' => "exclusive",
                'u' => "unlock",
                'n' => "nonblocking",
                'o' => "close",
                'F' => "no-fork",
                'h' => "help",
                'V' => "version",
                'w' => "timeout",
                'E' => "conflict-exit-code",
                _ => return Err(try_help(format!("invalid option -- '{c}'"))),
            };
            if c == 'w' || c == 'E' {
                let rest: String = chars[k + 1..].iter().collect();
                let value = if !rest.is_empty() {
                    rest
                } else {
                    i += 1;
                    match args.get(i) {
                        Some(v) => v.to_string_lossy().into_owned(),
                        None => {
                            return Err(try_help(format!("option requires an argument -- '{c}'")));
                        }
                    }
                };
                apply(o, name, Some(&value))?;
                break;
            }
            apply(o, name, None)?;
            k += 1;
        }
        i += 1;
    }
    Ok(i)
}

/// Whether `word` begins with the scheme of a lock address (known or not: an unknown one is
/// the address parser's usage error, never a file).
fn is_address(word: &OsStr) -> bool {
    let Some(word) = word.to_str() else {
        return false;
    };
    let known = crate::backend::schemes();
    match word.split_once(':') {
        Some((scheme, rest)) => {
            known.iter().any(|s| s.eq_ignore_ascii_case(scheme))
                || (crate::backend::address::is_scheme(scheme) && rest.starts_with("//"))
        }
        None => false,
    }
}

/// Runs as flock(1); the process's exit code.
pub fn main(prog: &OsStr, args: Vec<OsString>) -> i32 {
    let _ = PROG.set(prog.to_string_lossy().into_owned());
    if args.is_empty() {
        say("not enough arguments");
        eprintln!("Try 'flock --help' for more information.");
        return EX_USAGE;
    }
    let mut o = Opts {
        op: LockOp::Exclusive,
        nonblock: false,
        timeout: None,
        conflict: 1,
        close: false,
        no_fork: false,
        verbose: false,
        fcntl: false,
    };
    let at = match parse(&args, &mut o) {
        Ok(at) => at,
        Err(code) => return code,
    };
    if o.no_fork && o.close {
        say("the --no-fork and --close options are incompatible");
        return EX_USAGE;
    }
    // -w 0 is -n, as flock(1) says.
    if o.timeout == Some(Duration::ZERO) {
        o.timeout = None;
        o.nonblock = true;
    }
    let rest = &args[at..];
    let cmd: Option<Vec<OsString>> = match rest {
        [] => {
            say("requires file descriptor, file or directory");
            return EX_USAGE;
        }
        [_] => None,
        [_, c, tail @ ..] if c == "-c" || c == "--command" => {
            let [command] = tail else {
                say(format!(
                    "{} requires exactly one command argument",
                    c.to_string_lossy()
                ));
                return EX_USAGE;
            };
            let shell = std::env::var_os("SHELL")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "/bin/sh".into());
            Some(vec![shell, "-c".into(), command.clone()])
        }
        [_, tail @ ..] => Some(tail.to_vec()),
    };
    match cmd {
        None => descriptor(&o, &rest[0]),
        Some(cmd) if is_address(&rest[0]) => address(&o, &rest[0], cmd),
        Some(cmd) => file(&o, &rest[0], cmd),
    }
}

/// `flock [options] NUMBER`.
fn descriptor(o: &Opts, word: &OsStr) -> i32 {
    let text = word.to_string_lossy();
    let Ok(fd) = text.trim().parse::<i32>() else {
        say(format!("bad file descriptor: '{text}'"));
        return EX_USAGE;
    };
    match try_lock(o, fd) {
        Ok(true) => 0,
        Ok(false) => conflict(o),
        Err(e) => lock_failed(&fd.to_string(), &e),
    }
}

/// Takes (or drops) the lock on `fd` as flock(1) does: `Ok(false)` on a conflict or timeout.
fn try_lock(o: &Opts, fd: RawFd) -> std::io::Result<bool> {
    let timeout = if o.nonblock {
        Some(Duration::ZERO)
    } else {
        o.timeout
    };
    sys::lock_fd(fd, o.op, o.fcntl, timeout)
}

/// A conflict (or `-w` elapsed): the -E code, said only with `--verbose`.
fn conflict(o: &Opts) -> Exit {
    if o.verbose {
        say(if o.nonblock {
            "failed to get lock"
        } else {
            "timeout while waiting to get lock"
        });
    }
    o.conflict
}

/// flock(1)'s other lock errors: `flock: WHAT: strerror`, 71 for ENOLCK/ENOMEM, else 65.
fn lock_failed(what: &str, e: &std::io::Error) -> Exit {
    say(format!("{what}: {}", sys::strerror(e)));
    match e.raw_os_error() {
        Some(libc::ENOLCK | libc::ENOMEM) => EX_OSERR,
        _ => EX_DATAERR,
    }
}

/// flock(1)'s open: created if missing (mode 0666 less the umask), a directory read-only;
/// write access only for `--fcntl`'s exclusive lock (or the NFSv4 retry). Not close-on-exec:
/// the command inherits it.
fn open(path: &OsStr, flags: OFlag) -> Result<(OwnedFd, OFlag), Exit> {
    let base = OFlag::O_NOCTTY;
    let r = nix::fcntl::open(
        path,
        flags | base | OFlag::O_CREAT,
        Mode::from_bits_truncate(0o666),
    );
    let r = match r {
        Err(Errno::EISDIR) => nix::fcntl::open(path, OFlag::O_RDONLY | base, Mode::empty())
            .map(|fd| (fd, OFlag::O_RDONLY)),
        r => r.map(|fd| (fd, flags)),
    };
    r.map_err(|e| {
        say(format!(
            "cannot open lock file {}: {}",
            path.to_string_lossy(),
            sys::strerror(&std::io::Error::from(e))
        ));
        match e {
            Errno::ENOMEM | Errno::EMFILE | Errno::ENFILE => EX_OSERR,
            Errno::EROFS | Errno::ENOSPC => EX_CANTCREAT,
            _ => EX_NOINPUT,
        }
    })
}

/// `flock [options] FILE|DIRECTORY COMMAND...` (and `-c`).
fn file(o: &Opts, path: &OsStr, cmd: Vec<OsString>) -> i32 {
    let flags = if o.fcntl && o.op == LockOp::Exclusive {
        OFlag::O_WRONLY
    } else {
        OFlag::O_RDONLY
    };
    let (mut fd, mut flags) = match open(path, flags) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let began = Instant::now();
    loop {
        match try_lock(o, fd.as_raw_fd()) {
            Ok(true) => break,
            Ok(false) => return conflict(o),
            // flock(2) on NFSv4 is emulated by fcntl locks: an exclusive one wants the file
            // open for writing. flock(1) reopens it read-write and tries again; so do we.
            Err(e)
                if matches!(e.raw_os_error(), Some(libc::EIO | libc::EBADF))
                    && !flags.contains(OFlag::O_RDWR)
                    && o.op != LockOp::Shared
                    && nix::unistd::access(
                        path,
                        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
                    )
                    .is_ok() =>
            {
                (fd, flags) = match open(path, OFlag::O_RDWR) {
                    Ok(x) => x,
                    Err(code) => return code,
                };
                if !flags.contains(OFlag::O_RDWR) {
                    return lock_failed(&path.to_string_lossy(), &e);
                }
            }
            Err(e) => return lock_failed(&path.to_string_lossy(), &e),
        }
    }
    run(o, fd, began, cmd)
}

/// Runs the command with the lock held by `fd`: forked (the command inherits `fd` unless
/// `-o`), or `-F` exec'd in our place. The command's status, or 128+N for signal N.
fn run(o: &Opts, fd: OwnedFd, began: Instant, cmd: Vec<OsString>) -> i32 {
    let later = o
        .verbose
        .then(|| crate::protocol::flock_verbose(began.elapsed(), &cmd[0]))
        .flatten();
    let said_later = || {
        if let Some(text) = &later {
            let _ = crate::protocol::report(text);
        }
    };
    if o.close
        && let Err(e) = sys::set_cloexec(fd.as_raw_fd(), true)
    {
        say(format!("{}: {}", fd.as_raw_fd(), sys::strerror(&e)));
        return EX_OSERR;
    }
    let mut command = std::process::Command::new(&cmd[0]);
    command.args(&cmd[1..]);
    let failed = |e: &std::io::Error| -> i32 {
        said_later();
        say(format!(
            "failed to execute {}: {}",
            cmd[0].to_string_lossy(),
            sys::strerror(e)
        ));
        if e.raw_os_error() == Some(libc::ENOMEM) {
            EX_OSERR
        } else {
            EX_UNAVAILABLE
        }
    };
    if o.no_fork {
        let e = command.exec();
        return failed(&e);
    }
    // As flock(1)'s fork + execvp: a file without `#!` runs by /bin/sh (std's posix_spawn
    // would refuse it with ENOEXEC).
    let status = match crate::spawn::spawn(&command, false, false).and_then(|mut c| c.wait()) {
        Ok(s) => s,
        Err(e) => return failed(&e),
    };
    said_later();
    drop(fd);
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(EX_OSERR)
}

/// A lock address in place of FILE: locksmith's `run`, as quiet as flock(1), with its
/// conflict code (1, or -E) and `--verbose`'s lines; other failures keep locksmith's codes.
fn address(o: &Opts, word: &OsStr, cmd: Vec<OsString>) -> i32 {
    let refuse = |what: &str| {
        say(format!(
            "{what} works on a file or a descriptor, not on a lock address ({})",
            crate::backend::shown_address(&word.to_string_lossy())
        ));
        EX_USAGE
    };
    if o.op == LockOp::Unlock {
        return refuse("--unlock");
    }
    if o.fcntl {
        return refuse("--fcntl");
    }
    let Some(lock) = word.to_str() else {
        say("a lock address is UTF-8");
        return EX_USAGE;
    };
    let mut cli = Cli::new(Command::Run {
        profile: lock.to_string(),
        more: Vec::new(),
        cmd,
    });
    cli.wait = if o.nonblock {
        Some(Wait::For(Duration::ZERO))
    } else {
        o.timeout.map(Wait::For)
    };
    cli.shared = o.op == LockOp::Shared;
    cli.conflict_exit = Some(o.conflict);
    cli.close = o.close;
    cli.no_fork = o.no_fork;
    cli.flock_form = true;
    cli.as_flock = Some(AsFlock { verbose: o.verbose });
    match crate::commands::dispatch(&cli) {
        Ok(code) => code,
        Err(e) => {
            say(e.message());
            e.kind().exit_code()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_files() {
        assert!(is_address(OsStr::new("mkdir:/x")));
        assert!(is_address(OsStr::new("sftp://h/x")));
        assert!(!is_address(OsStr::new("/tmp/a:b")));
        assert!(!is_address(OsStr::new("local-lock-file")));
        assert!(!is_address(OsStr::new("a:b")));
    }
}
