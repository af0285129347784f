//! The command line (SPEC §3): global options, then an optional subcommand, then PROFILE.
//! A first word that is not a subcommand is the profile of hold mode.

use std::ffi::OsString;
use std::path::PathBuf;

use lexopt::prelude::*;

use crate::error::{Error, Kind, Result};
use crate::profile::SUBCOMMANDS;
use crate::settings::{Wait, parse_wait};

pub const HELP: &str = "\
locksmith - take a lock for your parent process and hold it exactly as long as it wants it

Usage:
  locksmith [OPTIONS] PROFILE                  hold mode: print OK, hold until the pipe closes
  locksmith [OPTIONS] run PROFILE -- CMD...    take the lock, run CMD, release when CMD ends
  locksmith [OPTIONS] status [--json] PROFILE  is it held? by whom? (exit 0 free, 1 held)
  locksmith [OPTIONS] break [--force] [--token N] PROFILE
                                               remove a stale lock (refuses a live holder)
  locksmith [OPTIONS] verify [--peer DIR] PROFILE
                                               probe the lock's filesystem for what the
                                               backend relies on (exit 0 only if safe there)
  locksmith [OPTIONS] profiles                 list the profiles found, with their backend

Hold mode prints one line, `OK <profile> backend=... mode=...`, or `ERROR <kind>: <message>`
with a sysexits code (64 usage, 69 unavailable, 74 lost/io, 75 busy, 77 denied, 78 config).
It releases the lock and exits 0 the moment every reader of its stdout is gone, its parent
process dies, it gets SIGTERM/SIGINT/SIGHUP, or (with --watch-stdin) stdin hits end-of-file.

Options:
      --profiles FILE   profiles file [default: $LOCKSMITH_PROFILES, else
                        $XDG_CONFIG_HOME/locksmith/profiles.toml, else /etc/locksmith/profiles.toml]
      --wait DURATION   give up after this long: `0` tries once, `forever` never gives up
                        [default: the profile's `wait`, else forever, as flock(1)]
      --shared          take a shared (reader) lock; refused (64) where the backend cannot
      --watch-stdin     hold mode: also release when stdin (a pipe) reaches end-of-file
                        [default: off, since a parent's own stdin is inherited]
  -E, --conflict-exit-code N
                        run mode: exit N instead of 75 when the lock is busy [default: 75]
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
                cli.wait = Some(parse_wait(&v).map_err(|m| usage(format!("--wait: {m}")))?);
            }
            Long("shared") => cli.shared = true,
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
        assert_eq!(p(&["a", "b"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--wait", "soon", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--json", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(p(&["--peer", "/m", "x"]).unwrap_err().kind(), Kind::Usage);
        assert_eq!(
            p(&["status", "--peer", "/m", "x"]).unwrap_err().kind(),
            Kind::Usage
        );
        assert_eq!(p(&["verify"]).unwrap_err().kind(), Kind::Usage);
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
