//! The subcommands, each one readable top to bottom (as consul's `lock` command is):
//! validate → acquire → hold or run → release → exit code.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::fd::{AsFd, AsRawFd};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::backend::hold::{Hold, HoldSet, Wanted};
use crate::backend::lock::{Break, BreakOutcome, Holder};
use crate::backend::{self, Profile};
use crate::cli::{Cli, Command};
use crate::error::{Error, Kind, Result, closest, err, shown};
use crate::log::{self, debug, info};
use crate::profile::{self, ProfilesFile};
use crate::protocol::{self, Mode, OkLine};
use crate::settings::{Env, Overrides, Wait};
use crate::watch::{Cause, Event, WatchOpts, Watcher};
use crate::{spawn, sys};

/// Runs the command; `Ok(code)` is the process exit code.
pub fn dispatch(cli: &Cli) -> Result<i32> {
    match &cli.command {
        Command::Hold { profile, more } => hold(cli, &load_set(cli, profile, more)?),
        Command::Run { profile, more, cmd } => run(cli, &load_set(cli, profile, more)?, cmd),
        Command::Status { profile, json } => status(&load(cli, profile)?, *json),
        Command::Break {
            profile,
            force,
            token,
        } => break_lock(&load(cli, profile)?, *force, *token),
        Command::Verify { profile, peer } => verify(&load(cli, profile)?, peer.as_deref()),
        Command::Profiles => list_profiles(cli),
        Command::Descriptor { fd, unlock } => descriptor(cli, *fd, *unlock),
        Command::Help { .. } | Command::Version | Command::Generate { .. } => Ok(0),
    }
}

/// The lock a word names (see [`described`]), said at `-v`.
fn load(cli: &Cli, word: &str) -> Result<Profile> {
    let (p, said) = described(cli, word)?;
    debug!("{said}");
    Ok(p)
}

/// The lock a word names: a lock address (SPEC §3a: no profiles file is read), or a profile
/// of the profiles file, with what `-v` says of it. An unknown profile named like a file here
/// gets a hint.
fn described(cli: &Cli, word: &str) -> Result<(Profile, String)> {
    let overrides = Overrides {
        wait: cli.wait,
        shared: cli.shared,
        slots: cli.slots,
        fair: cli.fair,
    };
    if let Some(entry) = backend::entry_of_address(word)? {
        let p = backend::from_address(entry, word, &Env::current(), &overrides)?;
        let said = format!(
            "lock {}: backend {}, {} (an address: no profiles file read)",
            p.name,
            p.backend.name(),
            p.backend.location()
        );
        return Ok((p, said));
    }
    let hint = |e: Error| -> Error {
        let mut msg = e.message().to_string();
        // A mistyped subcommand (`locksmith staus x`) read as a profile name (issue 25).
        if let Some(sub) = closest(word, profile::SUBCOMMANDS.iter().copied()) {
            msg.push_str(&format!("; did you mean `{sub}`? (a subcommand)"));
        }
        if std::path::Path::new(word).exists() {
            msg.push_str(&format!("; to lock the file {word} here, write ./{word}"));
        }
        Error::new(e.kind(), msg)
    };
    let path = profile::locate(cli.profiles.as_deref()).map_err(hint)?;
    let file = ProfilesFile::load(&path)?;
    if !file.names().any(|n| n == word) {
        return Err(hint(file.profile(word, &overrides).unwrap_err()));
    }
    let p = file.profile(word, &overrides)?;
    let said = format!(
        "lock {}: backend {}, {} (profile of {})",
        p.name,
        p.backend.name(),
        p.backend.location(),
        shown(&path)
    );
    Ok((p, said))
}

/// The locks of `hold`/`run` (SPEC §3b): each word loaded, the same lock named twice kept once
/// (its first naming), in command-line order. flock(1)'s forms and `-F` leave nothing beside
/// a flock lock's file: no token state (`-F`'s CMD outlives us, so its release could never be
/// marked clean), no gate.
///
/// What `-v` says of them is said once all are loaded: loading a lock of a backend this build
/// lacks hands the whole command to the companion executable (`companion.rs`), which loads
/// and says them all again.
fn load_set(cli: &Cli, first: &str, more: &[String]) -> Result<Vec<Profile>> {
    let mut locks: Vec<Profile> = Vec::new();
    let mut said = Vec::new();
    for word in std::iter::once(first).chain(more.iter().map(String::as_str)) {
        let (mut p, line) = match described(cli, word) {
            Ok(d) => d,
            Err(e) => {
                // Not handed over: what was loaded is said before the error.
                for line in said {
                    debug!("{line}");
                }
                return Err(e);
            }
        };
        said.push(line);
        // A plain path in flock(1)'s forms is flock(1)'s lock; an explicit `flock:` address
        // or a profile keeps locksmith's tokens.
        let plain_path = word.contains('/') && !word.starts_with("flock:");
        p.common.flock1 = cli.no_fork || (cli.flock_form && plain_path);
        if let Some(same) = locks.iter().find(|q| canonical(q) == canonical(&p)) {
            said.push(format!(
                "{word} names the lock of {}: taken once",
                same.name
            ));
            continue;
        }
        locks.push(p);
    }
    for line in said {
        debug!("{line}");
    }
    Ok(locks)
}

/// A lock's canonical name: its backend, then the location it locks. Sets are taken in this
/// order, so that two callers naming the same locks in different orders never deadlock.
fn canonical(p: &Profile) -> (&'static str, String) {
    (p.backend.name(), p.backend.location())
}

/// What [`HoldSet::acquire`] takes: `locks` in canonical order.
fn wanted(locks: &[Profile]) -> Vec<Wanted<'_>> {
    let mut wanted: Vec<Wanted<'_>> = locks
        .iter()
        .enumerate()
        .map(|(given, p)| Wanted {
            given,
            name: &p.name,
            common: p.common.clone(),
            open: Box::new(move || backend::open(p)),
        })
        .collect();
    wanted.sort_by_key(|w| canonical(&locks[w.given]));
    wanted
}

/// The OK line of a set: one lock's line as before; for several, each field's values in
/// command-line order, comma-separated (a lock without a token leaves its place empty), and
/// `locks=N`.
fn ok_line(locks: &[Profile], held: &HoldSet) -> OkLine {
    let holds = held.as_given();
    let each = |f: &dyn Fn(&Profile, &Hold) -> String| {
        locks
            .iter()
            .zip(&holds)
            .map(|(p, h)| f(p, h))
            .collect::<Vec<_>>()
            .join(",")
    };
    OkLine {
        profile: locks[0].name.clone(),
        backend: each(&|_, h| h.backend().to_string()),
        mode: each(&|p, _| mode_of(p).as_str().to_string()),
        token: tokens(&holds),
        prev_crashed: holds.iter().any(|h| h.grant().prev_crashed),
        extra: {
            let mut extra = Vec::new();
            // A semaphore's slot and number of slots (SPEC §3b); a lock of one slot leaves
            // its place empty.
            if locks.iter().any(|p| p.common.slots > 1) {
                extra.push(("slot", each(&|_, h| slot_of(h).unwrap_or_default())));
                extra.push((
                    "slots",
                    each(&|p, _| match p.common.slots {
                        1 => String::new(),
                        n => n.to_string(),
                    }),
                ));
            }
            // A token that starts a missing state again from the clock (file backends):
            // above every earlier one only if the wall clock was not set back meanwhile.
            if holds.iter().any(|h| h.grant().token_from_clock) {
                extra.push((
                    "token_from",
                    each(&|_, h| {
                        if h.grant().token_from_clock {
                            "clock"
                        } else {
                            ""
                        }
                        .to_string()
                    }),
                ));
            }
            if locks.len() > 1 {
                extra.push(("locks", locks.len().to_string()));
            }
            extra
        },
    }
}

/// The slot a hold has, as the OK line and `LOCKSMITH_SLOT` say it.
fn slot_of(h: &Hold) -> Option<String> {
    h.grant().slot.map(|k| k.to_string())
}

/// The fencing tokens of a set in command-line order (`LOCKSMITH_TOKEN`, `token=`); `None`
/// if no lock has one.
fn tokens(holds: &[&Hold]) -> Option<String> {
    holds.iter().any(|h| h.grant().token.is_some()).then(|| {
        holds
            .iter()
            .map(|h| h.grant().token.map(|t| t.to_string()).unwrap_or_default())
            .collect::<Vec<_>>()
            .join(",")
    })
}

fn mode_of(p: &Profile) -> Mode {
    if p.common.shared {
        Mode::Shared
    } else {
        Mode::Exclusive
    }
}

/// Hold mode (SPEC §4): OK on stdout, then sleep in `poll` until a release cause.
fn hold(cli: &Cli, locks: &[Profile]) -> Result<i32> {
    let p = &locks[0];
    let mut watcher = Watcher::new(WatchOpts {
        stdout: true,
        stdin: cli.watch_stdin,
        parent: true,
    })?;
    // The lease runs from the winning attempt: heartbeat while the OK line waits for the pipe.
    let mut held = HoldSet::acquire(wanted(locks), &mut watcher)?;
    let line = ok_line(locks, &held);
    // The OK line goes out only when the pipe can take it: a parent that does not read
    // must not hold us in write(2), deaf to signals (issue 15).
    let written = loop {
        match watcher.wait_writable_for(held.timeout())? {
            Event::Release(cause) => break Written::Stopped(cause),
            Event::Ready => break Written::Done(protocol::ok(&line)),
            Event::Timeout => {
                if let Err(e) = held.beat(|_| {}) {
                    held.abandon();
                    return Err(e);
                }
            }
        }
    };
    // Nothing is spawned in hold mode: what the wait left to close can go now.
    sys::close_parked();
    match written {
        Written::Done(Ok(())) => {
            // A person at a terminal has no pipe to close: say how to let go.
            if protocol::stdout_is_terminal() {
                info!(
                    "holding {} until Ctrl-C (a parent releases it by closing the pipe it reads)",
                    p.name
                );
            }
        }
        Written::Done(Err(e)) => {
            debug!("cannot write OK ({e}): the parent is gone; releasing");
            return Ok(after_release(held.release(), Some(&mut watcher)));
        }
        Written::Stopped(cause) => {
            debug!(
                "releasing lock `{}` before OK could be written: {cause}",
                p.name
            );
            let code = after_release(held.release(), Some(&mut watcher));
            if code != 0 {
                return Ok(code);
            }
            // A signal before OK is a wait interrupted (SPEC §4.5: 75); a parent gone is
            // what a closed pipe at the write says (0).
            return Ok(match cause {
                Cause::Signal(_) => {
                    protocol::error(
                        &err!(
                            Busy,
                            "lock `{}` released unreported: stdout did not take the OK line before {cause}",
                            p.name
                        ),
                        false,
                    );
                    Kind::Busy.exit_code()
                }
                _ => 0,
            });
        }
    }
    debug!("holding lock `{}`", p.name);
    loop {
        match watcher.wait(&held.alarms(), held.timeout())? {
            Event::Release(cause) => {
                debug!("releasing lock `{}`: {cause}", p.name);
                return Ok(after_release(held.release(), Some(&mut watcher)));
            }
            Event::Ready | Event::Timeout => {
                let said = |e: &Error| {
                    let _ = write_line(&mut watcher, || {
                        protocol::lost(e.message());
                        Ok(())
                    });
                    info!("{e}");
                };
                if held.beat(said).is_err() {
                    held.abandon();
                    return Ok(Kind::Lost.exit_code());
                }
            }
        }
    }
}

/// What [`write_line`] did.
enum Written {
    /// The write ran, with this result.
    Done(std::io::Result<()>),
    /// A release cause came first; nothing was written.
    Stopped(Cause),
}

/// Runs `write` (one protocol line to stdout) once stdout can take it without blocking,
/// unless a release cause comes first.
fn write_line(
    watcher: &mut Watcher,
    write: impl FnOnce() -> std::io::Result<()>,
) -> Result<Written> {
    Ok(match watcher.wait_writable()? {
        Event::Release(cause) => Written::Stopped(cause),
        Event::Ready | Event::Timeout => Written::Done(write()),
    })
}

/// Maps the outcome of a release to an exit code; after OK nothing but LOST goes to stdout
/// (hold mode: `watcher` given, and LOST written only if stdout can take it).
fn after_release(r: Result<()>, hold_mode: Option<&mut Watcher>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            if let Some(w) = hold_mode
                && e.kind() == Kind::Lost
            {
                let _ = write_line(w, || {
                    protocol::lost(e.message());
                    Ok(())
                });
            }
            protocol::error(&e, false);
            e.kind().exit_code()
        }
    }
}

/// Run mode: take the lock, run CMD, release when it ends; CMD never outlives the lock.
fn run(cli: &Cli, locks: &[Profile], cmd: &[OsString]) -> Result<i32> {
    let p = &locks[0];
    if cli.no_fork && locks.len() > 1 {
        return Err(err!(
            Usage,
            "-F/--no-fork holds one flock lock by the descriptor CMD inherits, not {} locks",
            locks.len()
        ));
    }
    if cli.no_fork && p.backend.name() != "flock" {
        return Err(err!(
            Usage,
            "-F/--no-fork holds the lock by the descriptor CMD inherits: flock locks only (a {} lock needs locksmith alive beside CMD)",
            p.backend.name()
        ));
    }
    let mut watcher = Watcher::new(WatchOpts {
        stdout: false,
        stdin: false,
        parent: true,
    })?;
    let began = Instant::now();
    // flock(1)'s forms wait in silence, as flock(1) does (issue 25 finding 1): only -v
    // (or, as `flock`, --verbose in flock(1)'s words) speaks.
    let level = log::level();
    if cli.flock_form && cli.verbose == 0 {
        log::set_level(log::QUIET);
    }
    let acquired = HoldSet::acquire(wanted(locks), &mut watcher);
    log::set_level(level);
    let flock_verbose = cli.as_flock.is_some_and(|f| f.verbose);
    let mut held = match acquired {
        Ok(t) => t,
        // `-q` and flock(1)'s forms: busy is said by the exit code alone, as `flock -n` is
        // silent (issues 15, 25).
        Err(e)
            if e.kind() == Kind::Busy
                && (cli.quiet || cli.flock_form || cli.conflict_exit.is_some()) =>
        {
            if flock_verbose {
                crate::log::line(&format!(
                    "flock: {}",
                    if p.common.wait == Wait::For(Duration::ZERO) {
                        "failed to get lock"
                    } else {
                        "timeout while waiting to get lock"
                    }
                ));
            } else if !cli.quiet && !cli.flock_form {
                protocol::error(&e, false);
            }
            return Ok(cli.conflict_exit.unwrap_or(Kind::Busy.exit_code()));
        }
        Err(e) => return Err(e),
    };
    // flock(1)'s --verbose lines: at once on a terminal, else once CMD has ended.
    let later = flock_verbose
        .then(|| protocol::flock_verbose(began.elapsed(), &cmd[0]))
        .flatten();
    // From here CMD's life decides, as with flock(1), not the caller's.
    watcher.forget_parent();

    let mut command = std::process::Command::new(&cmd[0]);
    command.args(&cmd[1..]).env("LOCKSMITH_PROFILE", &p.name);
    let holds = held.as_given();
    match tokens(&holds) {
        Some(t) => command.env("LOCKSMITH_TOKEN", t),
        None => command.env_remove("LOCKSMITH_TOKEN"),
    };
    if holds.iter().any(|h| h.grant().slot.is_some()) {
        let slots: Vec<String> = holds
            .iter()
            .map(|h| slot_of(h).unwrap_or_default())
            .collect();
        command.env("LOCKSMITH_SLOT", slots.join(","));
    } else {
        command.env_remove("LOCKSMITH_SLOT");
    }
    if holds.iter().any(|h| h.grant().prev_crashed) {
        command.env("LOCKSMITH_PREV", "crashed");
    } else {
        command.env_remove("LOCKSMITH_PREV");
    }
    // The variables that hold the server secrets are locksmith's, not CMD's (issues 15, 27).
    for var in locks.iter().flat_map(|p| p.backend.secret_env()) {
        command.env_remove(var);
    }
    if cli.no_fork {
        // flock -F: CMD replaces locksmith and holds the lock by the descriptor it inherits.
        if let Some(fd) = held.inherit_fd() {
            sys::set_cloexec(fd.as_raw_fd(), false)
                .map_err(|e| Error::io("preparing the command", e))?;
        }
        let e = std::os::unix::process::CommandExt::exec(&mut command);
        if let Some(text) = &later {
            let _ = protocol::report(text);
        }
        return Ok(cannot_run(cli, &cmd[0], &e));
    }
    // An interactive CMD keeps the terminal; otherwise it gets a process group of its own,
    // so that signals reach its whole group.
    let own_group = !std::io::stdin().is_terminal();
    // -o: CMD does not inherit the lock; locksmith holds it until CMD ends.
    let inherit = if cli.close { None } else { held.inherit_fd() };
    // flock: CMD inherits the locked descriptor, so the lock lives exactly as long as CMD.
    // Others: CMD dies with locksmith (PR_SET_PDEATHSIG; only this thread ever spawns).
    if let Some(fd) = inherit {
        // Cleared in locksmith itself: it execs nothing else, and the command must inherit it.
        sys::set_cloexec(fd.as_raw_fd(), false)
            .map_err(|e| Error::io("preparing the command", e))?;
    }
    let mut child = match spawn::spawn(&command, own_group, inherit.is_none()) {
        Ok(c) => c,
        Err(e) => {
            let _ = held.release();
            if let Some(text) = &later {
                let _ = protocol::report(text);
            }
            return Ok(cannot_run(cli, &cmd[0], &e));
        }
    };
    // CMD has exec'd (the spawn waited for it): what the wait left to close can go now.
    sys::close_parked();
    let pid = child.id() as i32;
    let target = Pid::from_raw(if own_group { -pid } else { pid });
    let pidfd = sys::pidfd_open(pid).ok();
    let status = loop {
        let fds: Vec<_> = pidfd
            .iter()
            .map(|f| f.as_fd())
            .chain(held.alarms())
            .collect();
        let mut timeout = held.timeout();
        if pidfd.is_none() {
            timeout = Some(timeout.map_or(Duration::from_millis(100), |t| {
                t.min(Duration::from_millis(100))
            }));
        }
        match watcher.wait(&fds, timeout)? {
            Event::Release(Cause::Signal(sig)) => {
                debug!("forwarding {sig} to the command");
                let _ = kill(target, sig);
            }
            Event::Release(_) => {}
            Event::Ready | Event::Timeout => {
                match child.try_wait() {
                    Ok(Some(status)) => break status,
                    Ok(None) => {}
                    Err(e) => {
                        // CMD's status is out of reach: it is stopped and the lock freed,
                        // never left behind for proof of death to break.
                        let e = Error::io("waiting for the command", e);
                        let grace = held.grace();
                        stop_child(&mut child, target, pidfd.as_ref(), grace, &mut watcher);
                        if let Err(r) = held.release() {
                            protocol::error(&r, false);
                        }
                        return Err(e);
                    }
                }
                let grace = held.grace();
                let stop = |e: &Error| {
                    protocol::error(e, false);
                    stop_child(&mut child, target, pidfd.as_ref(), grace, &mut watcher);
                };
                if held.beat(stop).is_err() {
                    held.abandon();
                    return Ok(Kind::Lost.exit_code());
                }
            }
        }
    };
    let code = exit_code(status);
    if let Some(text) = &later {
        let _ = protocol::report(text);
    }
    match held.release() {
        Ok(()) => Ok(code),
        Err(e) => {
            protocol::error(&e, false);
            Ok(e.kind().exit_code())
        }
    }
}

/// Says that CMD could not be started; the exit code: 127 not found, 126 not executable
/// (as a shell), or as `flock` 69 (`EX_UNAVAILABLE`, 71 for ENOMEM), as flock(1) says.
fn cannot_run(cli: &Cli, cmd: &OsString, e: &std::io::Error) -> i32 {
    let cmd = cmd.to_string_lossy();
    if cli.as_flock.is_some() {
        crate::log::line(&format!(
            "flock: failed to execute {cmd}: {}",
            sys::strerror(e)
        ));
        return if e.raw_os_error() == Some(libc::ENOMEM) {
            71
        } else {
            69
        };
    }
    crate::log::emit(&format!("cannot run {cmd}: {e}"));
    match e.kind() {
        std::io::ErrorKind::NotFound => 127,
        _ => 126,
    }
}

/// `--fd N` (flock(1)'s `flock N`): flock(2) on the caller's descriptor N, or `-u` to drop
/// its lock, then exit: 0 done, 75 (or -E N) busy — silently, as `flock -n 4`.
fn descriptor(cli: &Cli, fd: i32, unlock: bool) -> Result<i32> {
    let op = if unlock {
        sys::LockOp::Unlock
    } else if cli.shared {
        sys::LockOp::Shared
    } else {
        sys::LockOp::Exclusive
    };
    let timeout = match cli.wait {
        None | Some(Wait::Forever) => None,
        Some(Wait::For(d)) => Some(d),
    };
    match sys::lock_fd(fd, op, false, timeout) {
        Ok(true) => Ok(0),
        Ok(false) => Ok(cli.conflict_exit.unwrap_or(Kind::Busy.exit_code())),
        Err(e) if e.raw_os_error() == Some(libc::EBADF) => Err(err!(
            Usage,
            "--fd {fd}: not a descriptor open in this process ({})",
            sys::strerror(&e)
        )),
        Err(e) => Err(Error::io(format!("flock on descriptor {fd}"), e)),
    }
}

/// SIGTERM, a grace period, then SIGKILL; always reaped.
fn stop_child(
    child: &mut spawn::Child,
    target: Pid,
    pidfd: Option<&std::os::fd::OwnedFd>,
    grace: Duration,
    watcher: &mut Watcher,
) {
    let _ = kill(target, Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let fds: Vec<_> = pidfd.iter().map(|f| f.as_fd()).collect();
        let left = deadline.saturating_duration_since(Instant::now());
        let step = if pidfd.is_some() {
            left
        } else {
            left.min(Duration::from_millis(50))
        };
        if watcher.wait(&fds, Some(step)).is_err() {
            break;
        }
    }
    let _ = kill(target, Signal::SIGKILL);
    let _ = child.wait();
}

/// CMD's status as a shell reports it: its code, or 128+N for signal N.
fn exit_code(status: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// `status`: exit 0 free, 1 held (stale or not).
fn status(p: &Profile, json: bool) -> Result<i32> {
    // A file lock in a directory that does not exist is no free lock: taking it is 78, and
    // so is asking about it (issue 25).
    if ["flock", "mkdir", "link", "symlink"].contains(&p.backend.name()) {
        let path = std::path::PathBuf::from(p.backend.location());
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && let Err(e) = std::fs::metadata(dir)
            && e.kind() == std::io::ErrorKind::NotFound
        {
            return Err(err!(
                Config,
                "the directory {} of lock {} does not exist (locksmith never creates parent directories)",
                shown(dir),
                p.name
            ));
        }
    }
    let mut lock = backend::open(p)?;
    let holders = lock.status()?;
    let held = !holders.is_empty();
    // A fair queue's waiters, in their order (SPEC §3b).
    let waiters = backend::waiters(p)?;
    let mode = holders
        .iter()
        .find_map(|h| h.mode)
        .unwrap_or(Mode::Exclusive);
    let text = if json {
        let list: Vec<serde_json::Value> = holders.iter().map(holder_json).collect();
        let v = serde_json::json!({
            "profile": p.name,
            "backend": lock.name(),
            "held": held,
            "mode": if held { Some(mode.as_str()) } else { None },
            "slots": p.common.slots,
            "holders": list,
            "fair": p.common.fair,
            "waiters": waiters.iter().map(holder_json).collect::<Vec<_>>(),
        });
        format!("{v}\n")
    } else if !held {
        match p.common.slots {
            1 => format!("{}: free (backend {})\n", p.name, lock.name()),
            n => format!("{}: free, {n} slots (backend {})\n", p.name, lock.name()),
        }
    } else {
        let mut s = String::new();
        for h in &holders {
            let state = match h.alive {
                Some(true) => "alive",
                Some(false) => "stale",
                None => "alive unknown",
            };
            s.push_str(&format!(
                "{}: held ({}, backend {}) by {h} [{state}]\n",
                p.name,
                mode.as_str(),
                lock.name()
            ));
        }
        s
    };
    let mut text = text;
    if !json {
        for (i, w) in waiters.iter().enumerate() {
            text.push_str(&format!("{}: waiting {} in line: {w}\n", p.name, i + 1));
        }
    }
    protocol::report(&text).map_err(|e| Error::io("writing status", e))?;
    Ok(if held { 1 } else { 0 })
}

fn holder_json(h: &Holder) -> serde_json::Value {
    serde_json::json!({
        "host": h.host,
        "pid": h.pid,
        "ppid": h.ppid,
        "since": h.since,
        "token": h.token,
        "alive": h.alive,
        "slot": h.slot,
    })
}

/// `break`: removes a stale lock; refuses a live holder unless `--force`.
fn break_lock(p: &Profile, force: bool, token: Option<u64>) -> Result<i32> {
    let mut watcher = Watcher::new(WatchOpts::default())?;
    let mut lock = backend::open(p)?;
    let text = match lock.break_lock(Break { force, token }, &mut watcher)? {
        BreakOutcome::Free => format!("{}: free, nothing to break\n", p.name),
        BreakOutcome::Broken(h) => format!("{}: broke the lock of {h}\n", p.name),
    };
    protocol::report(&text).map_err(|e| Error::io("writing report", e))?;
    Ok(0)
}

/// `verify`: probes the lock's filesystem or server for what the backend relies on, prints
/// one line per property and a verdict; 0 only if the backend is safe there, else 78 naming
/// why. Each backend's probe lives beside it; the report is shared (`backend::verify`).
fn verify(p: &Profile, peer: Option<&std::path::Path>) -> Result<i32> {
    let report = backend::verify(p, peer)?;
    protocol::report(&report.render()).map_err(|e| Error::io("writing report", e))?;
    if report.safe() {
        return Ok(0);
    }
    Err(err!(
        Config,
        "backend {} is not safe for lock {}: {}",
        p.backend.name(),
        report.lock,
        report.problems.join("; ")
    ))
}

/// `profiles`: each profile with its backend, and whether it validates.
fn list_profiles(cli: &Cli) -> Result<i32> {
    let path = profile::locate(cli.profiles.as_deref())?;
    let file = ProfilesFile::load(&path)?;
    let mut out = String::new();
    for name in file.names() {
        let backend = file.backend_of(name).unwrap_or("?");
        match file.profile(name, &Overrides::default()) {
            Ok(_) => out.push_str(&format!("{name}\t{backend}\n")),
            Err(e) => out.push_str(&format!("{name}\t{backend}\tinvalid: {}\n", e.message())),
        }
    }
    // Which file it read: on stderr, so that stdout stays one profile per line. Said after
    // reading every profile, which may hand this process to the companion (said once).
    info!("profiles of {}", shown(&path));
    protocol::report(&out).map_err(|e| Error::io("writing report", e))?;
    Ok(0)
}
