//! The command line (SPEC §3, §3a): global options, then an optional subcommand, then LOCK
//! (a profile's name or a lock address: `commands` tells them apart). A first word that is
//! not a subcommand is the LOCK of hold mode; words after it are flock(1)'s forms, a CMD to
//! run (`LOCK CMD ARGS...`, `LOCK -c CMDSTRING`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use lexopt::prelude::*;

use crate::error::{Error, Kind, Result, closest};
use crate::profile::SUBCOMMANDS;
use crate::settings::{Wait, parse_wait_arg};

pub mod doc;
pub mod usage;

use usage::{GENERATE, Opt, OptDoc};

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `more`: further LOCKs, taken with the first as one (SPEC §3b).
    Hold {
        profile: String,
        more: Vec<String>,
    },
    Run {
        profile: String,
        more: Vec<String>,
        cmd: Vec<OsString>,
    },
    Status {
        profile: String,
        json: bool,
    },
    Break {
        profile: String,
        force: bool,
        token: Option<u64>,
    },
    /// Probe the lock's filesystem (issue 12); `peer`: the lock's directory through
    /// another mount.
    Verify {
        profile: String,
        peer: Option<PathBuf>,
    },
    Profiles,
    /// `--fd N`: flock(2) on the caller's descriptor N (`-u`: unlock it), then exit — flock(1)'s
    /// `flock N` form.
    Descriptor {
        fd: i32,
        unlock: bool,
    },
    /// `--help`, `help [SUB]`, `SUB --help`.
    Help {
        topic: Option<String>,
    },
    Version,
    /// `--generate KIND`: a man page or a completion script.
    Generate {
        kind: String,
    },
}

impl Command {
    /// Whether errors go to stdout (hold mode: the parent reads them there).
    pub fn errors_on_stdout(&self) -> bool {
        matches!(self, Command::Hold { .. })
    }
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cli {
    pub profiles: Option<PathBuf>,
    pub wait: Option<Wait>,
    pub shared: bool,
    /// `--slots N` (SPEC §3b).
    pub slots: Option<u32>,
    /// `--fair` (SPEC §3b).
    pub fair: bool,
    pub watch_stdin: bool,
    pub conflict_exit: Option<i32>,
    pub quiet: bool,
    pub verbose: u8,
    /// `-o`: CMD does not inherit the locked descriptor.
    pub close: bool,
    /// `-F`: exec CMD in place of locksmith (a lock held by a descriptor only).
    pub no_fork: bool,
    /// One of flock(1)'s forms (`LOCK CMD`, `LOCK -c`, `--fd N`, anything under the name
    /// `flock`): as quiet as flock(1) — no waiting message, no `ERROR busy` line.
    pub flock_form: bool,
    /// Invoked under the name `flock` (SPEC §3c): flock(1)'s exit codes and words.
    pub as_flock: Option<AsFlock>,
    pub command: Command,
}

/// What changes under the name `flock`: `--verbose` says flock(1)'s lines, and a command
/// that cannot be executed is 69 (`EX_UNAVAILABLE`), as flock(1) says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsFlock {
    pub verbose: bool,
}

impl Cli {
    /// A command line with nothing given: hold mode's defaults.
    pub fn new(command: Command) -> Cli {
        Cli {
            profiles: None,
            wait: None,
            shared: false,
            slots: None,
            fair: false,
            watch_stdin: false,
            conflict_exit: None,
            quiet: false,
            verbose: 0,
            close: false,
            no_fork: false,
            flock_form: false,
            as_flock: None,
            command,
        }
    }
}

fn usage(msg: impl std::fmt::Display) -> Error {
    Error::new(Kind::Usage, format!("{msg} (see locksmith --help)"))
}

/// The command of flock(1)'s forms, from the words after LOCK: `-c CMDSTRING` (or
/// `--command`) is `sh -c CMDSTRING`, anything else is the command itself (a leading `--`
/// dropped); none: hold mode.
fn flock_command(mut rest: Vec<OsString>) -> Result<Vec<OsString>> {
    match rest.first().and_then(|w| w.to_str()) {
        Some("-c" | "--command") => {
            if rest.len() != 2 {
                return Err(usage(
                    "-c takes exactly one command string after LOCK: locksmith LOCK -c 'CMD ARGS'",
                ));
            }
            Ok(vec![
                "sh".into(),
                "-c".into(),
                rest.pop().expect("two words"),
            ])
        }
        Some("--") => {
            rest.remove(0);
            if rest.is_empty() {
                return Err(usage("a command must follow `--` after LOCK"));
            }
            Ok(rest)
        }
        _ => Ok(rest),
    }
}

/// A further LOCK of `run LOCK1 LOCK2 ... -- CMD`: a lock name, never an option (options come
/// before the subcommand).
fn lock_word(w: OsString) -> Result<String> {
    let w = w
        .into_string()
        .map_err(|w| usage(format!("LOCK {w:?} is not UTF-8")))?;
    if w.starts_with('-') || w.is_empty() {
        return Err(usage(format!(
            "`{w}` before `--` is not a LOCK (options come before the subcommand)"
        )));
    }
    Ok(w)
}

/// Guesses, for an unparsable command line, whether it was meant for hold mode (whose
/// errors go to stdout) or for another subcommand (stderr).
pub fn looks_like_hold(args: &[OsString]) -> bool {
    !args
        .iter()
        .any(|a| SUBCOMMANDS.iter().any(|s| *s != "hold" && a == *s))
}

pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cli> {
    let mut p = lexopt::Parser::from_args(args);
    let mut cli = Cli::new(Command::Profiles);
    let (mut fd, mut unlock) = (None, false);
    let mut sub: Option<String> = None;
    let mut profile: Option<String> = None;
    let mut more: Vec<String> = Vec::new();
    let (mut json, mut force, mut token) = (false, false, None);
    let mut peer: Option<PathBuf> = None;
    let mut cmd: Vec<OsString> = Vec::new();
    let mut help = false;
    let mut version = false;
    let mut generate: Option<String> = None;
    let mut topic: Option<String> = None;
    // The subcommand word as given (flock(1)'s forms are `run` without it).
    let mut typed: Option<String> = None;
    // Options that belong to some subcommands only, as given (checked once the subcommand
    // is known).
    let mut scoped: Vec<(&'static OptDoc, String)> = Vec::new();
    let err = |e: lexopt::Error| usage(e);
    // lexopt's "cannot parse argument" does not say for which option.
    let of = |opt: &'static str| move |e: lexopt::Error| usage(format!("{opt}: {e}"));
    while let Some(arg) = p.next().map_err(err)? {
        let (doc, given) = match arg {
            Long(l) => (usage::long(l), format!("--{l}")),
            Short(c) => (usage::short(c), format!("-{c}")),
            Value(v) => {
                let v = v.string().map_err(err)?;
                if sub.is_none() && profile.is_none() && SUBCOMMANDS.contains(&v.as_str()) {
                    typed = Some(v.clone());
                    sub = Some(v);
                    continue;
                }
                match sub.as_deref() {
                    Some("profiles") => {
                        return Err(usage(format!("`profiles` takes no argument, got `{v}`")));
                    }
                    Some("help") => {
                        if topic.is_some() {
                            return Err(usage(format!("unexpected argument `{v}`")));
                        }
                        topic = Some(v);
                        continue;
                    }
                    _ => {}
                }
                if profile.is_some() {
                    // `hold LOCK1 LOCK2 ...` (SPEC §3b).
                    if sub.as_deref() == Some("hold") {
                        more.push(v);
                        continue;
                    }
                    return Err(usage(format!("unexpected argument `{v}`")));
                }
                profile = Some(v);
                if sub.as_deref() == Some("run") {
                    cmd = p.raw_args().map_err(err)?.collect();
                    // `run LOCK1 LOCK2 ... -- CMD`: the words before `--` are more LOCKs;
                    // without `--`, every word after LOCK is CMD.
                    if let Some(dash) = cmd.iter().position(|a| a == "--") {
                        for w in cmd.drain(..dash) {
                            more.push(lock_word(w)?);
                        }
                        cmd.remove(0);
                    }
                    break;
                }
                if sub.is_none() {
                    // flock(1)'s forms: `LOCK CMD [ARGS...]` and `LOCK -c CMDSTRING` are
                    // `run LOCK -- CMD...`; every word after LOCK belongs to CMD.
                    let rest: Vec<OsString> = p.raw_args().map_err(err)?.collect();
                    cmd = flock_command(rest)?;
                    if !cmd.is_empty() {
                        sub = Some("run".into());
                        cli.flock_form = true;
                    }
                    break;
                }
                continue;
            }
        };
        // Only options of usage::OPTIONS exist.
        let Some(doc) = doc else {
            return Err(usage(format!("invalid option '{given}'")));
        };
        if doc.scope != usage::Scope::Global {
            scoped.push((doc, given));
        }
        match doc.opt {
            Opt::Profiles => cli.profiles = Some(p.value().map_err(err)?.into()),
            Opt::Wait => {
                let v = p.value().map_err(err)?.string().map_err(of("--wait"))?;
                cli.wait = Some(parse_wait_arg(&v).map_err(|m| usage(format!("--wait: {m}")))?);
            }
            // flock(1)'s spellings (SPEC §3a).
            Opt::Timeout => {
                let opt = "-w/--timeout";
                let v = p.value().map_err(err)?.string().map_err(of(opt))?;
                cli.wait = Some(parse_wait_arg(&v).map_err(|m| usage(format!("{opt}: {m}")))?);
            }
            Opt::Nonblock => cli.wait = Some(Wait::For(Duration::ZERO)),
            Opt::Shared => cli.shared = true,
            Opt::Exclusive => cli.shared = false,
            Opt::Slots => {
                let v = p.value().map_err(err)?.string().map_err(of("--slots"))?;
                cli.slots = Some(
                    crate::settings::parse_slots(&v).map_err(|m| usage(format!("--slots: {m}")))?,
                );
            }
            Opt::Fair => cli.fair = true,
            Opt::WatchStdin => cli.watch_stdin = true,
            Opt::ConflictExit => {
                let opt = "-E/--conflict-exit-code";
                let v: i32 = p.value().map_err(err)?.parse().map_err(of(opt))?;
                if !(0..=255).contains(&v) {
                    return Err(usage(format!("{opt} must be 0..255, not {v}")));
                }
                cli.conflict_exit = Some(v);
            }
            Opt::Quiet => cli.quiet = true,
            Opt::Verbose => cli.verbose = cli.verbose.saturating_add(1),
            Opt::Help => help = true,
            Opt::Version => version = true,
            Opt::Generate => {
                let v = p.value().map_err(err)?.string().map_err(of("--generate"))?;
                if !GENERATE.contains(&v.as_str()) {
                    return Err(usage(format!(
                        "--generate {v}: expected one of {}",
                        GENERATE.join(", ")
                    )));
                }
                generate = Some(v);
            }
            Opt::Json => json = true,
            Opt::Force => force = true,
            Opt::Token => {
                token = Some(p.value().map_err(err)?.parse().map_err(of("--token"))?);
            }
            Opt::Close => cli.close = true,
            Opt::NoFork => cli.no_fork = true,
            Opt::Unlock => unlock = true,
            Opt::Fd => {
                let v: i32 = p.value().map_err(err)?.parse().map_err(of("--fd"))?;
                if v < 0 {
                    return Err(usage(format!("--fd: {v} is not a descriptor")));
                }
                fd = Some(v);
            }
            Opt::Peer => {
                let v = p.value().map_err(err)?;
                if v.is_empty() {
                    return Err(usage("--peer: empty directory name"));
                }
                peer = Some(v.into());
            }
        }
    }
    if help || sub.as_deref() == Some("help") {
        let topic = match (topic, typed.as_deref()) {
            (Some(t), _) => Some(t),
            (None, Some(s)) if help || s != "help" => Some(s.to_string()),
            (None, _) => None,
        };
        if let Some(t) = &topic
            && usage::subcommand(t).is_none()
        {
            let hint = closest(t, SUBCOMMANDS.iter().copied())
                .map(|c| format!("; did you mean `{c}`?"))
                .unwrap_or_default();
            return Err(usage(format!(
                "no subcommand `{t}` (subcommands: {}){hint}",
                SUBCOMMANDS.join(", ")
            )));
        }
        cli.command = Command::Help { topic };
        return Ok(cli);
    }
    if version {
        cli.command = Command::Version;
        return Ok(cli);
    }
    if let Some(kind) = generate {
        cli.command = Command::Generate { kind };
        return Ok(cli);
    }
    if cli.no_fork && cli.close {
        return Err(usage(
            "-F/--no-fork and -o/--close exclude each other (as in flock(1))",
        ));
    }
    if let Some(fd) = fd {
        // flock(1)'s `flock N`: no LOCK, no subcommand; -E says its busy code.
        if let Some(s) = &typed {
            return Err(usage(format!("--fd takes no subcommand (got `{s}`)")));
        }
        if let Some(l) = &profile {
            return Err(usage(format!(
                "--fd locks a descriptor and takes no LOCK (got `{l}`)"
            )));
        }
        if let Some((_, given)) = scoped.iter().find(|(d, _)| d.opt != Opt::ConflictExit) {
            return Err(usage(format!("{given} does not go with --fd")));
        }
        cli.flock_form = true;
        cli.command = Command::Descriptor { fd, unlock };
        return Ok(cli);
    }
    if unlock {
        return Err(usage(
            "-u/--unlock unlocks a descriptor: give it with --fd N (a LOCK is released by its holder ending)",
        ));
    }
    let sub = sub.unwrap_or_else(|| "hold".into());
    // Options given with a subcommand they do not belong to (flock(1)'s forms are `run`).
    if let Some((doc, given)) = scoped.iter().find(|(doc, _)| !doc.belongs_to(&sub)) {
        let usage::Scope::Only(owners) = doc.scope else {
            unreachable!("only scoped options are kept")
        };
        let owners: Vec<String> = owners.iter().map(|o| format!("`{o}`")).collect();
        return Err(usage(format!("{given} belongs to {}", owners.join(", "))));
    }
    if sub == "profiles" {
        cli.command = Command::Profiles;
        return Ok(cli);
    }
    let Some(profile) = profile else {
        return Err(usage(format!("missing PROFILE for `{sub}`")));
    };
    cli.command = match sub.as_str() {
        "hold" => Command::Hold { profile, more },
        "run" => {
            if cmd.is_empty() {
                return Err(usage("`run` needs a command after `--`"));
            }
            Command::Run { profile, more, cmd }
        }
        "status" => Command::Status { profile, json },
        "break" => Command::Break {
            profile,
            force,
            token,
        },
        "verify" => Command::Verify { profile, peer },
        _ => unreachable!("subcommands are checked above"),
    };
    Ok(cli)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Cli> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn hold_is_implicit_and_explicit() {
        assert_eq!(
            p(&["phonestuff"]).unwrap().command,
            Command::Hold {
                profile: "phonestuff".into(),
                more: Vec::new()
            }
        );
        assert_eq!(
            p(&["--wait", "0", "hold", "x"]).unwrap().command,
            Command::Hold {
                profile: "x".into(),
                more: Vec::new()
            }
        );
    }

    /// SPEC §3b: `hold` and `run` take several LOCKs (`run`'s before `--`).
    #[test]
    fn several_locks() {
        assert_eq!(
            p(&["hold", "a", "b", "c"]).unwrap().command,
            Command::Hold {
                profile: "a".into(),
                more: vec!["b".into(), "c".into()]
            }
        );
        assert_eq!(
            p(&["run", "a", "b", "--", "cmd", "--", "x"])
                .unwrap()
                .command,
            Command::Run {
                profile: "a".into(),
                more: vec!["b".into()],
                cmd: ["cmd", "--", "x"].map(OsString::from).to_vec()
            }
        );
        // Without `--` the words after LOCK are CMD, as before.
        assert_eq!(
            p(&["run", "a", "b", "c"]).unwrap().command,
            Command::Run {
                profile: "a".into(),
                more: Vec::new(),
                cmd: ["b", "c"].map(OsString::from).to_vec()
            }
        );
        assert_eq!(
            p(&["run", "a", "-v", "--", "c"]).unwrap_err().kind(),
            Kind::Usage
        );
        // The implicit form stays flock(1)'s `LOCK CMD`.
        assert!(matches!(
            p(&["a", "b"]).unwrap().command,
            Command::Run { ref more, .. } if more.is_empty()
        ));
    }

    #[test]
    fn run_takes_the_rest() {
        let c = p(&["-E", "3", "run", "nightly", "--", "backup.sh", "-v", "--x"]).unwrap();
        assert_eq!(c.conflict_exit, Some(3));
        assert_eq!(
            c.command,
            Command::Run {
                profile: "nightly".into(),
                more: Vec::new(),
                cmd: ["backup.sh", "-v", "--x"].map(OsString::from).to_vec()
            }
        );
        assert!(p(&["run", "nightly", "--"]).is_err());
    }

    #[test]
    fn usage_errors() {
        assert_eq!(p(&[]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--bogus", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["status", "a", "b"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--wait", "soon", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--json", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--peer", "/m", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(
            p(&["status", "--peer", "/m", "x"]).unwrap_err().kind(),
            Kind::Usage
        );
        assert_eq!(p(&["verify"]).unwrap_err().kind(), Kind::Usage);
    }

    /// Issue 14: flock(1)'s forms are `run`, and its options mean what they mean there.
    #[test]
    fn flock_forms() {
        let run = |lock: &str, cmd: &[&str]| Command::Run {
            profile: lock.into(),
            more: Vec::new(),
            cmd: cmd.iter().map(OsString::from).collect(),
        };
        let c = p(&["/tmp/x.lock", "ls", "-l", "--wait"]).unwrap();
        assert_eq!(c.command, run("/tmp/x.lock", &["ls", "-l", "--wait"]));
        let c = p(&["-n", "-E", "1", "mkdir:/p", "-c", "echo a; echo b"]).unwrap();
        assert_eq!(c.command, run("mkdir:/p", &["sh", "-c", "echo a; echo b"]));
        assert_eq!(
            (c.wait, c.conflict_exit),
            (Some(Wait::For(Duration::ZERO)), Some(1))
        );
        assert_eq!(
            p(&["x", "--", "true"]).unwrap().command,
            run("x", &["true"])
        );
        let c = p(&["-w", "2.5", "-s", "x", "true"]).unwrap();
        assert_eq!(c.wait, Some(Wait::For(Duration::from_millis(2500))));
        assert!(c.shared);
        let c = p(&["--timeout=3", "-s", "-x", "x", "true"]).unwrap();
        assert_eq!(c.wait, Some(Wait::For(Duration::from_secs(3))));
        assert!(!c.shared);
        assert!(p(&["-e", "--exclusive", "--nonblock", "x"]).is_ok());
        assert_eq!(
            p(&["--wait", "0.5", "x"]).unwrap().wait,
            Some(Wait::For(Duration::from_millis(500)))
        );
        // Without a command: hold mode, and -E stays run's.
        assert_eq!(
            p(&["-n", "/tmp/x"]).unwrap().command,
            Command::Hold {
                profile: "/tmp/x".into(),
                more: Vec::new()
            }
        );
        assert_eq!(p(&["-E", "1", "/tmp/x"]).unwrap_err().kind(), Kind::Usage);
        for bad in [
            &["x", "-c"][..],
            &["x", "-c", "a", "b"],
            &["x", "--"],
            &["-w", "soon", "x", "true"],
            &["-w", "-1", "x", "true"],
        ] {
            assert_eq!(p(bad).unwrap_err().kind(), Kind::Usage, "{bad:?}");
        }
    }

    #[test]
    fn verify_takes_a_peer_before_or_after_the_profile() {
        let want = Command::Verify {
            profile: "x".into(),
            peer: Some(PathBuf::from("/mnt/b")),
        };
        assert_eq!(
            p(&["verify", "--peer", "/mnt/b", "x"]).unwrap().command,
            want
        );
        assert_eq!(p(&["verify", "x", "--peer=/mnt/b"]).unwrap().command, want);
        assert_eq!(
            p(&["verify", "x"]).unwrap().command,
            Command::Verify {
                profile: "x".into(),
                peer: None
            }
        );
    }
}

#[cfg(test)]
pub(crate) mod proptests;
