//! What the command line is, said once (issue 16): the subcommands and the options, with their
//! help. The parser looks options up here (an option missing from this table cannot be
//! parsed), and `--help`, `locksmith help SUBCOMMAND`, the man pages and the shell
//! completions are all rendered from it (`doc.rs`), so none of them can drift from another.

/// Where an option may be given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Before any subcommand, for all of them.
    Global,
    /// Only with these subcommands (`run` includes flock(1)'s `LOCK CMD` forms).
    Only(&'static [&'static str]),
}

/// What an option's value is, for completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    None,
    File(&'static str),
    Dir(&'static str),
    /// Free text (a duration, a number): nothing to complete.
    Text(&'static str),
    /// One of these words.
    Word(&'static str, &'static [&'static str]),
}

impl Value {
    /// The value's name in help (`FILE`, `DURATION`); `None` for a flag.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Value::None => None,
            Value::File(n) | Value::Dir(n) | Value::Text(n) | Value::Word(n, _) => Some(n),
        }
    }
}

/// The options, each with a name the parser matches on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opt {
    Profiles,
    Wait,
    Timeout,
    Nonblock,
    Shared,
    Exclusive,
    Slots,
    Fair,
    WatchStdin,
    ConflictExit,
    Quiet,
    Verbose,
    Help,
    Version,
    Generate,
    Json,
    Force,
    Token,
    Peer,
    Unlock,
    Close,
    NoFork,
    Fd,
}

/// One option: its spellings, its value, where it belongs, what it does.
pub struct OptDoc {
    pub opt: Opt,
    pub shorts: &'static [char],
    pub longs: &'static [&'static str],
    pub value: Value,
    pub scope: Scope,
    /// Lines as `--help` breaks them; the man page joins them.
    pub help: &'static str,
}

impl OptDoc {
    /// `-w, --timeout SECONDS` / `--json`: how help names it.
    pub fn spelled(&self) -> String {
        let mut names: Vec<String> = self.shorts.iter().map(|c| format!("-{c}")).collect();
        names.extend(self.longs.iter().map(|l| format!("--{l}")));
        let mut s = names.join(", ");
        if let Some(v) = self.value.name() {
            s.push(' ');
            s.push_str(v);
        }
        s
    }

    /// The first spelling, as errors name the option.
    pub fn name(&self) -> String {
        match (self.longs.first(), self.shorts.first()) {
            (Some(l), _) => format!("--{l}"),
            (None, Some(c)) => format!("-{c}"),
            (None, None) => unreachable!("every option has a spelling"),
        }
    }

    /// Whether it may be given with `sub`.
    pub fn belongs_to(&self, sub: &str) -> bool {
        match self.scope {
            Scope::Global => true,
            Scope::Only(subs) => subs.contains(&sub),
        }
    }
}

/// What `--generate` prints.
pub const GENERATE: &[&str] = &[
    "man",
    "man-profiles",
    "complete-bash",
    "complete-zsh",
    "complete-fish",
];

pub static OPTIONS: &[OptDoc] = &[
    OptDoc {
        opt: Opt::Profiles,
        shorts: &[],
        longs: &["profiles"],
        value: Value::File("FILE"),
        scope: Scope::Global,
        help: "profiles file [default: $LOCKSMITH_PROFILES, else\n\
               $XDG_CONFIG_HOME/locksmith/profiles.toml, else /etc/locksmith/profiles.toml]",
    },
    OptDoc {
        opt: Opt::Wait,
        shorts: &[],
        longs: &["wait"],
        value: Value::Text("DURATION"),
        scope: Scope::Global,
        help: "give up after this long: `0` tries once, `forever` never gives up;\n\
               a bare number is seconds, as flock(1)'s -w\n\
               [default: the profile's `wait`, else forever, as flock(1)]",
    },
    OptDoc {
        opt: Opt::Timeout,
        shorts: &['w'],
        longs: &["timeout"],
        value: Value::Text("SECONDS"),
        scope: Scope::Global,
        help: "the same as --wait (flock(1)'s spelling)",
    },
    OptDoc {
        opt: Opt::Nonblock,
        shorts: &['n'],
        longs: &["nonblock", "nonblocking", "nb"],
        value: Value::None,
        scope: Scope::Global,
        help: "the same as --wait 0: try once",
    },
    OptDoc {
        opt: Opt::Shared,
        shorts: &['s'],
        longs: &["shared"],
        value: Value::None,
        scope: Scope::Global,
        help: "take a shared (reader) lock; refused (64) where the backend cannot",
    },
    OptDoc {
        opt: Opt::Exclusive,
        shorts: &['x', 'e'],
        longs: &["exclusive"],
        value: Value::None,
        scope: Scope::Global,
        help: "take an exclusive lock [default]",
    },
    OptDoc {
        opt: Opt::Slots,
        shorts: &[],
        longs: &["slots"],
        value: Value::Text("N"),
        scope: Scope::Global,
        help: "a semaphore: up to N holders at once, each in its own slot (1 to 1024)\n\
               [default: 1, the profile's `slots`]",
    },
    OptDoc {
        opt: Opt::Fair,
        shorts: &[],
        longs: &["fair"],
        value: Value::None,
        scope: Scope::Global,
        help: "a fair queue: waiters are served in the order they began to wait\n\
               [default: the profile's `fair`]",
    },
    OptDoc {
        opt: Opt::WatchStdin,
        shorts: &[],
        longs: &["watch-stdin"],
        value: Value::None,
        scope: Scope::Global,
        help: "hold mode: also release when stdin (a pipe) reaches end-of-file\n\
               [default: off, since a parent's own stdin is inherited]",
    },
    OptDoc {
        opt: Opt::ConflictExit,
        shorts: &['E'],
        longs: &["conflict-exit-code"],
        value: Value::Text("N"),
        scope: Scope::Only(&["run"]),
        help: "run (and --fd): exit N instead of 75 when the lock is busy\n\
               [default: 75; flock(1) exits 1: -E 1 mimics it]",
    },
    OptDoc {
        opt: Opt::Close,
        shorts: &['o'],
        longs: &["close"],
        value: Value::None,
        scope: Scope::Only(&["run"]),
        help: "run: CMD does not inherit the locked descriptor (flock): locksmith\n\
               holds the lock until CMD ends, CMD's own children do not",
    },
    OptDoc {
        opt: Opt::NoFork,
        shorts: &['F'],
        longs: &["no-fork"],
        value: Value::None,
        scope: Scope::Only(&["run"]),
        help: "run: exec CMD in place of locksmith, holding the lock by the\n\
               descriptor it inherits (flock locks only: others need locksmith alive)",
    },
    OptDoc {
        opt: Opt::Fd,
        shorts: &[],
        longs: &["fd"],
        value: Value::Text("N"),
        scope: Scope::Global,
        help: "lock the caller's open descriptor N with flock(2) and exit, as\n\
               `flock N` (`exec 4<>f; locksmith -n --fd 4`); takes no LOCK",
    },
    OptDoc {
        opt: Opt::Unlock,
        shorts: &['u'],
        longs: &["unlock"],
        value: Value::None,
        scope: Scope::Global,
        help: "with --fd N: drop the lock held on descriptor N (flock -u N)",
    },
    OptDoc {
        opt: Opt::Quiet,
        shorts: &['q'],
        longs: &["quiet"],
        value: Value::None,
        scope: Scope::Global,
        help: "say nothing on stderr but the final error (run: not even a\n\
               busy one: the exit code says it, as `flock -n` is silent)",
    },
    OptDoc {
        opt: Opt::Verbose,
        shorts: &['v'],
        longs: &["verbose"],
        value: Value::None,
        scope: Scope::Global,
        help: "say more on stderr: the backend, lock and profiles file in use, then\n\
               each step (repeat for more; $LOCKSMITH_LOG also sets it)",
    },
    OptDoc {
        opt: Opt::Help,
        shorts: &['h'],
        longs: &["help"],
        value: Value::None,
        scope: Scope::Global,
        help: "print this help (after a subcommand: that subcommand's) and exit",
    },
    OptDoc {
        opt: Opt::Version,
        shorts: &['V'],
        longs: &["version"],
        value: Value::None,
        scope: Scope::Global,
        help: "print the version and the backends built in, and exit",
    },
    OptDoc {
        opt: Opt::Generate,
        shorts: &[],
        longs: &["generate"],
        value: Value::Word("KIND", GENERATE),
        scope: Scope::Global,
        help: "print a man page or a completion script and exit: man (locksmith(1)),\n\
               man-profiles (locksmith-profiles(5)), complete-bash, complete-zsh,\n\
               complete-fish",
    },
    OptDoc {
        opt: Opt::Json,
        shorts: &[],
        longs: &["json"],
        value: Value::None,
        scope: Scope::Only(&["status"]),
        help: "status: print JSON",
    },
    OptDoc {
        opt: Opt::Force,
        shorts: &[],
        longs: &["force"],
        value: Value::None,
        scope: Scope::Only(&["break"]),
        help: "break: break even a live holder",
    },
    OptDoc {
        opt: Opt::Token,
        shorts: &[],
        longs: &["token"],
        value: Value::Text("N"),
        scope: Scope::Only(&["break"]),
        help: "break: only break the acquisition with fencing token N",
    },
    OptDoc {
        opt: Opt::Peer,
        shorts: &[],
        longs: &["peer"],
        value: Value::Dir("DIR"),
        scope: Scope::Only(&["verify"]),
        help: "verify: the lock's directory seen through a second mount of the\n\
               same server directory (as another host sees it): also measure\n\
               flock across mounts and how late changes show through it\n\
               [default: none; cross-mount delays are then unmeasured]",
    },
];

/// The option spelled `--long` (without its dashes).
pub fn long(name: &str) -> Option<&'static OptDoc> {
    OPTIONS.iter().find(|o| o.longs.contains(&name))
}

/// The option spelled `-c`.
pub fn short(c: char) -> Option<&'static OptDoc> {
    OPTIONS.iter().find(|o| o.shorts.contains(&c))
}

/// One subcommand: how it is written, what it does.
pub struct SubDoc {
    pub name: &'static str,
    /// Its forms after `locksmith [OPTIONS] `, each with what help says beside it; the
    /// first is the usual one.
    pub forms: &'static [(&'static str, &'static str)],
    /// One line (`help SUB`'s title, completions' description).
    pub about: &'static str,
    /// Paragraphs for `locksmith help SUB` and the man page.
    pub text: &'static str,
}

/// The subcommands, in the order help lists them; their names are
/// [`crate::profile::SUBCOMMANDS`] (a profile may not be called like one).
pub static SUBCOMMANDS: &[SubDoc] = &[
    SubDoc {
        name: "hold",
        forms: &[
            ("LOCK", "hold mode: print OK, hold until the pipe closes"),
            (
                "hold LOCK LOCK...",
                "the same for several locks at once, all or none",
            ),
        ],
        about: "hold mode: print OK, hold until the pipe closes",
        text: "Takes the lock and prints one line on stdout, `OK <lock> backend=... mode=...`,\n\
               or `ERROR <kind>: <message>` with a sysexits code. It then holds the lock and\n\
               releases it, exiting 0, the moment every reader of its stdout is gone, its parent\n\
               process dies, it gets SIGTERM/SIGINT/SIGHUP, or (with --watch-stdin) stdin hits\n\
               end-of-file. If the lock is lost while held it prints `LOST <message>` and exits 74.\n\
               A parent opens it as a pipe: `open L, \"locksmith phonestuff |\"` in Perl,\n\
               `exec 9< <(locksmith phonestuff)` in bash; closing the pipe releases the lock.\n\
               On a terminal it says how to release (Ctrl-C).\n\
               Several LOCKs (`hold A B ...`) are taken as one: in one canonical order (by backend,\n\
               then location), so callers naming them in different orders never deadlock; one\n\
               --wait deadline for all; OK only once all are held (else those taken are given back);\n\
               one lost is all lost. The OK line lists each lock's backend, mode and token\n\
               comma-separated in command-line order and adds `locks=N`.",
    },
    SubDoc {
        name: "run",
        forms: &[
            (
                "run LOCK -- CMD...",
                "take the lock, run CMD, release when CMD ends",
            ),
            (
                "run LOCK LOCK... -- CMD...",
                "the same with several locks at once, all or none",
            ),
            ("LOCK CMD [ARGS...]", "the same, as flock(1) says it"),
            ("LOCK -c 'CMD ARGS'", "the same with `sh -c 'CMD ARGS'`"),
        ],
        about: "take the lock, run CMD, release when CMD ends",
        text: "Takes the lock, runs CMD with its arguments (the second form is flock(1)'s; the\n\
               third runs `sh -c 'CMD ARGS'`), and releases the lock when CMD ends. The exit\n\
               status and output are CMD's; locksmith's own failures are its exit codes (busy:\n\
               75, or -E N). CMD gets LOCKSMITH_TOKEN, the fencing token of this acquisition,\n\
               in its environment, and is killed (SIGTERM, then SIGKILL) if the lock is lost.\n\
               With several LOCKs before `--`, CMD runs only once all are held (see hold);\n\
               LOCKSMITH_TOKEN lists their tokens comma-separated in command-line order.",
    },
    SubDoc {
        name: "status",
        forms: &[(
            "status [--json] LOCK",
            "is it held? by whom? (exit 0 free, 1 held)",
        )],
        about: "is it held? by whom? (exit 0 free, 1 held)",
        text: "Says whether the lock is held, by whom (host, pid, since, fencing token), and\n\
               whether a holder looks alive or stale. Exit 0: free, 1: held.",
    },
    SubDoc {
        name: "break",
        forms: &[(
            "break [--force] [--token N] LOCK",
            "remove a stale lock (refuses a live holder)",
        )],
        about: "remove a stale lock (refuses a live holder)",
        text: "Removes the lock of a holder that is provably dead, or silent for stale_after.\n\
               A live holder is refused unless --force; --token N breaks only the acquisition\n\
               with that fencing token. flock locks are never broken: the kernel releases them.",
    },
    SubDoc {
        name: "verify",
        forms: &[(
            "verify [--peer DIR] LOCK",
            "probe the lock's filesystem or server for what\n\
             its backend relies on (exit 0 only if safe there)",
        )],
        about: "probe the lock's filesystem or server for what its backend relies on",
        text: "Probes, beside the lock and never the lock itself, what its backend relies on: for\n\
               flock, mkdir, link and symlink the filesystem (atomic create, link counts, record\n\
               updates, rename over an existing name, flock across mounts, how late a change\n\
               shows through a second mount given with --peer); for ftp, postgres, etcd, s3 and\n\
               redis the server (atomic MKD and renames; advisory locks between sessions and how\n\
               long the server keeps a cut-off holder; lease TTLs, keepalive and revoke; 16 racing\n\
               If-None-Match creators, If-Match and conditional DELETE, the server's clock;\n\
               durability, replicas and eviction). Prints one line per property and a verdict\n\
               with the stale_after it accepts. Exit 0 only if the backend is safe there, 78\n\
               naming what to set, 69/77 as for taking the lock.",
    },
    SubDoc {
        name: "profiles",
        forms: &[("profiles", "list the profiles found, with their backend")],
        about: "list the profiles found, with their backend",
        text: "Lists the profiles of the profiles file in use, one per line: name, a tab, the\n\
               backend, and why it is invalid if it is. Stderr names the file it read.",
    },
    SubDoc {
        name: "help",
        forms: &[("help [SUBCOMMAND]", "this help, or a subcommand's")],
        about: "this help, or a subcommand's",
        text: "Prints the help, or the help of one subcommand.",
    },
];

/// The subcommand called `name`.
pub fn subcommand(name: &str) -> Option<&'static SubDoc> {
    SUBCOMMANDS.iter().find(|s| s.name == name)
}

/// What LOCK is (help, man page).
pub const LOCK_TEXT: &str = "\
LOCK is a profile's name (a section of the profiles file) or a lock address, which needs
no profiles file:
  /var/lock/x.lock  ./x.lock                 flock(2) on that file, as flock(1) takes it
  flock:PATH  mkdir:PATH  link:PATH  symlink:PATH
  ftp://[USER@]HOST[:PORT]/PATH              ftps:// for explicit TLS, ?tls=implicit
  postgres://[USER@]HOST[:PORT]/DB?lock=NAME advisory lock NAME
  etcd://HOST:PORT[,HOST:PORT...]/PREFIX     etcds:// for https endpoints
  s3://BUCKET/KEY                            ?endpoint=URL (S3-compatible), ?region=
  redis://[USER@]HOST[:PORT][/DB]?key=NAME   the key NAME on one Redis server; rediss:// TLS
Query parameters are the backend's profile keys: ?stale_after=30s&wait=0&shared=true.
An address never holds a password: ?password_env=VAR or ?password_file=PATH, else
$LOCKSMITH_PASSWORD, else ~/.netrc (ftp), $PGPASSWORD / ~/.pgpass (postgres) or
$REDISCLI_AUTH (redis); s3 takes credentials only as the AWS tools do ($AWS_ACCESS_KEY_ID...,
~/.aws/credentials).
";

/// Hold mode's protocol in short (help, man page).
pub const PROTOCOL_TEXT: &str = "\
Hold mode prints one line, `OK <profile> backend=... mode=...`, or `ERROR <kind>: <message>`
with a sysexits code (64 usage, 69 unavailable, 74 lost/io, 75 busy, 77 denied, 78 config).
It releases the lock and exits 0 the moment every reader of its stdout is gone, its parent
process dies, it gets SIGTERM/SIGINT/SIGHUP, or (with --watch-stdin) stdin hits end-of-file.
";

/// Help's last lines.
pub const TAIL_TEXT: &str = "\
Options come before LOCK; only -c comes after it, as in flock(1).
Durations are human strings: 250ms, 3s, 1m30s, 10m, 1h; a bare number is seconds (2.5).
`locksmith help SUBCOMMAND` says more of one; man locksmith, man locksmith-profiles.
";

/// The environment locksmith reads (man page).
pub const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "LOCKSMITH_PROFILES",
        "the profiles file, unless --profiles names one (a missing file is an error, 78)",
    ),
    (
        "XDG_CONFIG_HOME",
        "the profiles file is $XDG_CONFIG_HOME/locksmith/profiles.toml when neither of the above says",
    ),
    (
        "LOCKSMITH_LOG",
        "how much to say on stderr: quiet, normal, verbose, trace (as -q and -v)",
    ),
    (
        "LOCKSMITH_PASSWORD",
        "the password of an address that names none (ftp, postgres, redis, and etcd with a user)",
    ),
    (
        "AWS_ACCESS_KEY_ID",
        "with AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN): the credentials of an s3 lock; else the AWS_PROFILE (default `default`) section of AWS_SHARED_CREDENTIALS_FILE or ~/.aws/credentials",
    ),
    (
        "AWS_REGION",
        "an s3 lock's signing region when the lock says none (then AWS_DEFAULT_REGION; us-east-1 with an endpoint)",
    ),
    (
        "PGPASSWORD",
        "a postgres address's password when neither password_env nor password_file says",
    ),
    (
        "REDISCLI_AUTH",
        "a redis address's password when neither password_env, password_file nor $LOCKSMITH_PASSWORD says (as redis-cli reads it)",
    ),
    (
        "HOME",
        "where ~/.netrc (ftp) and ~/.pgpass (postgres) are looked up; both must be 0600",
    ),
    (
        "LOCKSMITH_NET",
        "a build with the local backends only (the Debian package's) hands every other lock to this executable; default: locksmith-net beside it",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The subcommands documented are the ones a profile may not be called.
    #[test]
    fn every_subcommand_is_documented_once() {
        let documented: Vec<&str> = SUBCOMMANDS.iter().map(|s| s.name).collect();
        assert_eq!(documented, crate::profile::SUBCOMMANDS);
    }

    /// No spelling names two options; every scope names real subcommands.
    #[test]
    fn spellings_are_unique_and_scopes_real() {
        let mut seen = std::collections::HashSet::new();
        for o in OPTIONS {
            for s in o.shorts {
                assert!(seen.insert(format!("-{s}")), "-{s} twice");
            }
            for l in o.longs {
                assert!(seen.insert(format!("--{l}")), "--{l} twice");
            }
            if let Scope::Only(subs) = o.scope {
                for s in subs {
                    assert!(
                        subcommand(s).is_some(),
                        "{} belongs to unknown {s}",
                        o.name()
                    );
                }
            }
        }
    }
}
