//! The command line (SPEC §3, §3a): global options, then an optional subcommand, then LOCK
//! (a profile's name or a lock address: `commands` tells them apart). A first word that is
//! not a subcommand is the LOCK of hold mode; words after it are flock(1)'s forms, a CMD to
//! run (`LOCK CMD ARGS...`, `LOCK -c CMDSTRING`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use lexopt::prelude::*;

use crate::error::{Error, Kind, Result};
use crate::profile::SUBCOMMANDS;
use crate::settings::{Wait, parse_wait_arg};

pub const HELP: &str = "\
locksmith - take a lock for your parent process and hold it exactly as long as it wants it

Usage:
  locksmith [OPTIONS] LOCK                     hold mode: print OK, hold until the pipe closes
  locksmith [OPTIONS] run LOCK -- CMD...       take the lock, run CMD, release when CMD ends
  locksmith [OPTIONS] LOCK CMD [ARGS...]       the same, as flock(1) says it
  locksmith [OPTIONS] LOCK -c 'CMD ARGS'       the same with `sh -c 'CMD ARGS'`
  locksmith [OPTIONS] status [--json] LOCK     is it held? by whom? (exit 0 free, 1 held)
  locksmith [OPTIONS] break [--force] [--token N] LOCK
                                               remove a stale lock (refuses a live holder)
  locksmith [OPTIONS] verify [--peer DIR] LOCK
                                               probe the lock's filesystem for what the
                                               backend relies on (exit 0 only if safe there)
  locksmith [OPTIONS] profiles                 list the profiles found, with their backend

LOCK is a profile's name (a section of the profiles file) or a lock address, which needs
no profiles file:
  /var/lock/x.lock  ./x.lock                 flock(2) on that file, as flock(1) takes it
  flock:PATH  mkdir:PATH  link:PATH  symlink:PATH
  ftp://[USER@]HOST[:PORT]/PATH              ftps:// for explicit TLS, ?tls=implicit
  postgres://[USER@]HOST[:PORT]/DB?lock=NAME advisory lock NAME
  etcd://HOST:PORT[,HOST:PORT...]/PREFIX     etcds:// for https endpoints
Query parameters are the backend's profile keys: ?stale_after=30s&wait=0&shared=true.
An address never holds a password: ?password_env=VAR or ?password_file=PATH, else
$LOCKSMITH_PASSWORD, else ~/.netrc (ftp) or $PGPASSWORD / ~/.pgpass (postgres).

Hold mode prints one line, `OK <profile> backend=... mode=...`, or `ERROR <kind>: <message>`
with a sysexits code (64 usage, 69 unavailable, 74 lost/io, 75 busy, 77 denied, 78 config).
It releases the lock and exits 0 the moment every reader of its stdout is gone, its parent
process dies, it gets SIGTERM/SIGINT/SIGHUP, or (with --watch-stdin) stdin hits end-of-file.

Options:
      --profiles FILE   profiles file [default: $LOCKSMITH_PROFILES, else
                        $XDG_CONFIG_HOME/locksmith/profiles.toml, else /etc/locksmith/profiles.toml]
      --wait DURATION   give up after this long: `0` tries once, `forever` never gives up;
                        a bare number is seconds, as flock(1)'s -w
                        [default: the profile's `wait`, else forever, as flock(1)]
  -w, --timeout SECONDS the same as --wait (flock(1)'s spelling)
  -n, --nonblock        the same as --wait 0: try once
  -s, --shared          take a shared (reader) lock; refused (64) where the backend cannot
  -x, -e, --exclusive   take an exclusive lock [default]
      --watch-stdin     hold mode: also release when stdin (a pipe) reaches end-of-file
                        [default: off, since a parent's own stdin is inherited]
  -E, --conflict-exit-code N
                        run mode: exit N instead of 75 when the lock is busy [default: 75;
                        flock(1) exits 1: -E 1 mimics it]
  -q, --quiet           say nothing on stderr but the final error (run: not even a
                        busy one: the exit code says it, as `flock -n` is silent)
  -v, --verbose         say more on stderr (repeat for more; $LOCKSMITH_LOG also sets it)
  -h, --help            print this help and exit
  -V, --version         print the version and exit

Subcommand options:
      --json            status: print JSON
      --force           break: break even a live holder
      --token N         break: only break the acquisition with fencing token N
      --peer DIR        verify: the lock's directory seen through a second mount of the
                        same server directory (as another host sees it): also measure
                        flock across mounts and how late changes show through it
                        [default: none; cross-mount delays are then unmeasured]

Options come before LOCK; only -c comes after it, as in flock(1).
Durations are human strings: 250ms, 3s, 1m30s, 10m, 1h.
See the README and SPEC for the profiles file, backends and the pipe protocol.
";

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    Hold {
        profile: String,
    },
    Run {
        profile: String,
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
    Help,
    Version,
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
    pub watch_stdin: bool,
    pub conflict_exit: Option<i32>,
    pub quiet: bool,
    pub verbose: u8,
    pub command: Command,
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

/// Guesses, for an unparsable command line, whether it was meant for hold mode (whose
/// errors go to stdout) or for another subcommand (stderr).
pub fn looks_like_hold(args: &[OsString]) -> bool {
    !args
        .iter()
        .any(|a| SUBCOMMANDS.iter().any(|s| *s != "hold" && a == *s))
}

pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Cli> {
    let mut p = lexopt::Parser::from_args(args);
    let mut cli = Cli {
        profiles: None,
        wait: None,
        shared: false,
        watch_stdin: false,
        conflict_exit: None,
        quiet: false,
        verbose: 0,
        command: Command::Profiles,
    };
    let mut sub: Option<String> = None;
    let mut profile: Option<String> = None;
    let (mut json, mut force, mut token) = (false, false, None);
    let mut peer: Option<PathBuf> = None;
    let mut cmd: Vec<OsString> = Vec::new();
    let mut help = false;
    let mut version = false;
    let err = |e: lexopt::Error| usage(e);
    // lexopt's "cannot parse argument" does not say for which option.
    let of = |opt: &'static str| move |e: lexopt::Error| usage(format!("{opt}: {e}"));
    while let Some(arg) = p.next().map_err(err)? {
        match arg {
            Long("profiles") => cli.profiles = Some(p.value().map_err(err)?.into()),
            Long("wait") => {
                let v = p.value().map_err(err)?.string().map_err(of("--wait"))?;
                cli.wait = Some(parse_wait_arg(&v).map_err(|m| usage(format!("--wait: {m}")))?);
            }
            // flock(1)'s spellings (SPEC §3a).
            Short('w') | Long("timeout") => {
                let opt = "-w/--timeout";
                let v = p.value().map_err(err)?.string().map_err(of(opt))?;
                cli.wait = Some(parse_wait_arg(&v).map_err(|m| usage(format!("{opt}: {m}")))?);
            }
            Short('n') | Long("nonblock") => cli.wait = Some(Wait::For(Duration::ZERO)),
            Short('s') | Long("shared") => cli.shared = true,
            Short('x') | Short('e') | Long("exclusive") => cli.shared = false,
            Long("watch-stdin") => cli.watch_stdin = true,
            Short('E') | Long("conflict-exit-code") => {
                let opt = "-E/--conflict-exit-code";
                let v: i32 = p.value().map_err(err)?.parse().map_err(of(opt))?;
                if !(0..=255).contains(&v) {
                    return Err(usage(format!("{opt} must be 0..255, not {v}")));
                }
                cli.conflict_exit = Some(v);
            }
            Short('q') | Long("quiet") => cli.quiet = true,
            Short('v') | Long("verbose") => cli.verbose = cli.verbose.saturating_add(1),
            Short('h') | Long("help") => help = true,
            Short('V') | Long("version") => version = true,
            Long("json") => json = true,
            Long("force") => force = true,
            Long("token") => token = Some(p.value().map_err(err)?.parse().map_err(of("--token"))?),
            Long("peer") => {
                let v = p.value().map_err(err)?;
                if v.is_empty() {
                    return Err(usage("--peer: empty directory name"));
                }
                peer = Some(v.into());
            }
            Value(v) => {
                let v = v.string().map_err(err)?;
                if sub.is_none() && profile.is_none() && SUBCOMMANDS.contains(&v.as_str()) {
                    if v == "profiles" {
                        sub = Some(v);
                        continue;
                    }
                    sub = Some(v);
                    continue;
                }
                if sub.as_deref() == Some("profiles") {
                    return Err(usage(format!("`profiles` takes no argument, got `{v}`")));
                }
                if profile.is_some() {
                    return Err(usage(format!("unexpected argument `{v}`")));
                }
                profile = Some(v);
                if sub.as_deref() == Some("run") {
                    cmd = p.raw_args().map_err(err)?.collect();
                    if cmd.first().is_some_and(|a| a == "--") {
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
                    }
                    break;
                }
            }
            _ => return Err(usage(arg.unexpected())),
        }
    }
    if help {
        cli.command = Command::Help;
        return Ok(cli);
    }
    if version {
        cli.command = Command::Version;
        return Ok(cli);
    }
    let sub = sub.unwrap_or_else(|| "hold".into());
    if json && sub != "status" {
        return Err(usage("--json belongs to `status`"));
    }
    if (force || token.is_some()) && sub != "break" {
        return Err(usage("--force and --token belong to `break`"));
    }
    if peer.is_some() && sub != "verify" {
        return Err(usage("--peer belongs to `verify`"));
    }
    if cli.conflict_exit.is_some() && sub != "run" {
        return Err(usage("--conflict-exit-code belongs to `run`"));
    }
    if sub == "profiles" {
        cli.command = Command::Profiles;
        return Ok(cli);
    }
    let Some(profile) = profile else {
        return Err(usage(format!("missing PROFILE for `{sub}`")));
    };
    cli.command = match sub.as_str() {
        "hold" => Command::Hold { profile },
        "run" => {
            if cmd.is_empty() {
                return Err(usage("`run` needs a command after `--`"));
            }
            Command::Run { profile, cmd }
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
                profile: "phonestuff".into()
            }
        );
        assert_eq!(
            p(&["--wait", "0", "hold", "x"]).unwrap().command,
            Command::Hold {
                profile: "x".into()
            }
        );
    }

    #[test]
    fn run_takes_the_rest() {
        let c = p(&["-E", "3", "run", "nightly", "--", "backup.sh", "-v", "--x"]).unwrap();
        assert_eq!(c.conflict_exit, Some(3));
        assert_eq!(
            c.command,
            Command::Run {
                profile: "nightly".into(),
                cmd: ["backup.sh", "-v", "--x"].map(OsString::from).to_vec()
            }
        );
        assert!(p(&["run", "nightly", "--"]).is_err());
    }

    #[test]
    fn usage_errors() {
        assert_eq!(p(&[]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--bogus", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["hold", "a", "b"]).unwrap_err().kind(), Kind::Usage);
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
                profile: "/tmp/x".into()
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
mod proptests;
