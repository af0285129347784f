//! Property-based fuzzing of the command line (issue 5, item 3), in process: [`parse`] on
//! arbitrary argv (any bytes, not only UTF-8), on argv built from the real option names,
//! subcommands and values plus junk, and on generated valid command lines that must parse to
//! exactly what they say.
//!
//! Properties: nothing panics; every rejection is a `usage` error (64) with a non-empty
//! one-line message pointing at `--help`; a bad option value names its option; a valid line
//! round-trips (options in any order and spelling: `--wait 3s`, `--wait=3s`, `-E5`, `-vv`;
//! flock(1)'s forms `PROFILE CMD...` and `PROFILE -c CMDSTRING`, issue 14).
//!
//! Bounded pass: 512 cases for each of the 4 properties (2,048 command lines, under 1 s in a
//! debug build). Failures are not persisted (`failure_persistence: None`): nothing is written
//! to the tree.

use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;

use super::*;

const CASES: u32 = 512;

/// `CASES` per property; `PROPTEST_CASES=N` asks for a longer pass by hand. (Every
/// property test of the crate runs by it.)
pub(crate) fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok());
    ProptestConfig {
        cases: cases.unwrap_or(CASES),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn os(s: &str) -> OsString {
    OsString::from(s)
}

/// The real option spellings, near misses and separators.
const OPTION_WORDS: &[&str] = &[
    "--profiles",
    "--wait",
    "--shared",
    "--watch-stdin",
    "-E",
    "--conflict-exit-code",
    "-q",
    "--quiet",
    "-v",
    "--verbose",
    "-h",
    "--help",
    "-V",
    "--version",
    "--json",
    "--force",
    "--token",
    "--peer",
    "--peer=/mnt/b",
    "--",
    "-",
    "-qv",
    "-vvv",
    "-E5",
    "-E=5",
    "-Eq",
    "-E-1",
    "--wait=3s",
    "--wait=",
    "--wait=forever",
    "--profiles=",
    "--token=7",
    "--token=-1",
    "--conflict-exit-code=300",
    "--shared=yes",
    "--bogus",
    "-x",
    "---",
    "--=",
    "-=",
];

const VALUES: &[&str] = &[
    "0",
    "forever",
    "250ms",
    "1m30s",
    "soon",
    "-5s",
    "255",
    "256",
    "18446744073709551615",
    "18446744073709551616",
    "18446744073709551615s1000ms",
    "300000000000y",
    "",
    " ",
    "demo",
    "a.b_c-1",
    "/etc/locksmith/profiles.toml",
    "true",
    "sh",
    "-c",
];

fn token() -> impl Strategy<Value = OsString> {
    prop_oneof![
        6 => select(OPTION_WORDS.to_vec()).prop_map(os),
        3 => select(SUBCOMMANDS.to_vec()).prop_map(os),
        3 => select(VALUES.to_vec()).prop_map(os),
        2 => "[A-Za-z0-9._-]{1,10}".prop_map(OsString::from),
        1 => ".{0,8}".prop_map(OsString::from),
        1 => prop::collection::vec(any::<u8>(), 0..8).prop_map(OsString::from_vec),
    ]
}

/// A rejection is a usage error with a non-empty one-line message.
fn check_usage(e: &Error, args: &[OsString]) -> Result<(), TestCaseError> {
    prop_assert_eq!(e.kind(), Kind::Usage, "{} for {:?}", e, args);
    prop_assert_eq!(e.kind().exit_code(), 64);
    let m = e.message();
    prop_assert!(!m.trim().is_empty(), "empty message for {:?}", args);
    prop_assert!(
        !m.contains(['\n', '\r']),
        "{:?} spans lines ({:?})",
        m,
        args
    );
    prop_assert!(m.ends_with("(see locksmith --help)"), "{:?}", m);
    Ok(())
}

/// What every accepted command line satisfies.
fn check_cli(cli: &Cli, args: &[OsString]) -> Result<(), TestCaseError> {
    let profile = match &cli.command {
        Command::Hold { profile, .. } | Command::Status { profile, .. } => Some(profile),
        Command::Break { profile, .. } | Command::Verify { profile, .. } => Some(profile),
        Command::Run { profile, cmd, .. } => {
            prop_assert!(!cmd.is_empty());
            Some(profile)
        }
        Command::Profiles
        | Command::Help { .. }
        | Command::Version
        | Command::Generate { .. }
        | Command::Descriptor { .. } => None,
    };
    if let Some(p) = profile {
        // The profile is one of the words given.
        prop_assert!(args.iter().any(|a| a == p.as_str()), "{p:?} from {args:?}");
    }
    if cli.conflict_exit.is_some() {
        let run = matches!(
            cli.command,
            Command::Run { .. } | Command::Help { .. } | Command::Version
        );
        prop_assert!(run, "-E without run: {:?}", args);
    }
    Ok(())
}

fn parse_and_check(args: Vec<OsString>) -> Result<(), TestCaseError> {
    let _ = looks_like_hold(&args);
    match parse(args.clone()) {
        Ok(cli) => check_cli(&cli, &args),
        Err(e) => check_usage(&e, &args),
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_argv_is_parsed_or_rejected_cleanly(
        args in prop::collection::vec(
            prop_oneof![
                prop::collection::vec(any::<u8>(), 0..12).prop_map(OsString::from_vec),
                any::<String>().prop_map(OsString::from),
            ],
            0..8,
        ),
    ) {
        parse_and_check(args)?;
    }

    #[test]
    fn argv_of_real_words_and_junk_is_parsed_or_rejected_cleanly(
        args in prop::collection::vec(token(), 0..10),
    ) {
        parse_and_check(args)?;
    }
}

/// The subcommand and its own arguments.
#[derive(Clone, Debug)]
enum Sub {
    /// Hold mode without the word `hold`.
    Implicit,
    Hold,
    /// CMD, and whether `--` separates it.
    Run(Vec<OsString>, bool),
    Status(bool),
    Break(bool, Option<u64>),
    /// `--peer DIR`, if any.
    Verify(Option<OsString>),
    Profiles,
    /// flock(1)'s forms (issue 14): `PROFILE CMD...`, or `PROFILE -c CMDSTRING` (`Some`).
    Flock(Vec<OsString>, Option<OsString>),
}

/// A valid command line and what it must parse to.
#[derive(Clone, Debug)]
struct Line {
    args: Vec<OsString>,
    want: Cli,
    /// Index of PROFILE in `args`, if any.
    profile_at: Option<usize>,
    /// The subcommand is `run` (even where `--help` makes the command Help).
    run: bool,
    /// Hold mode without the word `hold`: words after PROFILE are flock(1)'s CMD.
    implicit: bool,
}

fn wait_value() -> impl Strategy<Value = (String, Wait)> {
    prop_oneof![
        Just(("forever".to_owned(), Wait::Forever)),
        Just(("0".to_owned(), Wait::For(Duration::ZERO))),
        Just((" forever ".to_owned(), Wait::Forever)),
        (
            1u64..100_000,
            select(vec![
                ("ms", 1u64),
                ("s", 1000),
                ("m", 60_000),
                ("h", 3_600_000)
            ])
        )
            .prop_map(|(n, (u, ms))| (format!("{n}{u}"), Wait::For(Duration::from_millis(n * ms)))),
        (1u64..60, 1u64..60).prop_map(|(m, s)| {
            (
                format!("{m}m{s}s"),
                Wait::For(Duration::from_secs(m * 60 + s)),
            )
        }),
    ]
}

/// `--opt VALUE` or `--opt=VALUE`.
fn with_value(opt: &str, value: &OsString, attached: bool) -> Vec<OsString> {
    if attached {
        let mut v = format!("{opt}=").into_bytes();
        v.extend_from_slice(value.as_encoded_bytes());
        vec![OsString::from_vec(v)]
    } else {
        vec![os(opt), value.clone()]
    }
}

fn sub() -> impl Strategy<Value = Sub> {
    let cmd_word = prop_oneof![
        3 => "[a-z./]{1,8}".prop_map(OsString::from),
        2 => select(OPTION_WORDS.to_vec()).prop_map(os),
        1 => ".{0,6}".prop_map(OsString::from),
        1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(OsString::from_vec),
    ];
    prop_oneof![
        Just(Sub::Implicit),
        Just(Sub::Hold),
        (prop::collection::vec(cmd_word, 1..4), any::<bool>())
            // Without `--`, a CMD that starts with `--` would lose it, and one with `--`
            // further on would be more LOCKs before it (SPEC §3b).
            .prop_map(|(cmd, dashdash)| {
                let dashdash = dashdash || cmd.iter().any(|w| w == "--");
                Sub::Run(cmd, dashdash)
            }),
        any::<bool>().prop_map(Sub::Status),
        (any::<bool>(), prop::option::of(any::<u64>())).prop_map(|(f, t)| Sub::Break(f, t)),
        prop::option::of(prop_oneof![
            "[a-z/._-]{1,16}".prop_map(OsString::from),
            prop::collection::vec(any::<u8>(), 1..8).prop_map(OsString::from_vec),
        ])
        // lexopt takes `--peer -x` as the value only when attached; keep the value plain.
        .prop_map(|p| Sub::Verify(p.filter(|p| !p.as_encoded_bytes().starts_with(b"-")))),
        Just(Sub::Profiles),
        (
            prop::collection::vec(
                prop_oneof![
                    3 => "[a-z./]{1,8}".prop_map(OsString::from),
                    2 => select(OPTION_WORDS.to_vec()).prop_map(os),
                    1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(OsString::from_vec),
                ],
                1..4
            ),
            prop::option::of(".{0,12}".prop_map(OsString::from)),
        )
            // A first word `-c` or `--` is the other form.
            .prop_filter("CMD's first word is CMD's", |(cmd, _)| {
                !["-c", "--command", "--"].iter().any(|w| cmd[0] == *w)
            })
            .prop_map(|(cmd, c)| Sub::Flock(cmd, c)),
    ]
}

#[allow(clippy::type_complexity)]
fn line() -> impl Strategy<Value = Line> {
    let profiles = prop::option::of((
        prop_oneof![
            "[a-z/._-]{0,16}".prop_map(OsString::from),
            ".{0,8}".prop_map(OsString::from),
            prop::collection::vec(any::<u8>(), 1..8).prop_map(OsString::from_vec),
        ],
        any::<bool>(),
    ));
    let options = (
        profiles,
        prop::option::of((wait_value(), any::<bool>())),
        any::<bool>(),
        any::<bool>(),
        prop::option::of((0i32..=255, 0..5)),
        prop::option::of(any::<bool>()),
        (0u8..4, any::<bool>()),
    );
    (
        options,
        sub(),
        "[A-Za-z0-9._][A-Za-z0-9._-]{0,20}",
        any::<bool>(),
        prop::option::weighted(0.1, select(vec!["-h", "--help", "-V", "--version"])),
        any::<u64>(),
    )
        .prop_map(
            |(
                (profiles, wait, shared, watch_stdin, conflict, quiet, (verbose, joined)),
                sub,
                profile,
                sub_opts_after,
                early,
                seed,
            )| {
                let mut groups: Vec<Vec<OsString>> = Vec::new();
                if let Some((f, attached)) = &profiles {
                    groups.push(with_value("--profiles", f, *attached));
                }
                if let Some(((w, _), attached)) = &wait {
                    groups.push(with_value("--wait", &os(w), *attached));
                }
                if shared {
                    groups.push(vec![os("--shared")]);
                }
                if watch_stdin {
                    groups.push(vec![os("--watch-stdin")]);
                }
                // -E only where it belongs: run (flock(1)'s forms are run).
                let conflict = conflict.filter(|_| matches!(sub, Sub::Run(..) | Sub::Flock(..)));
                if let Some((n, style)) = conflict {
                    groups.push(match style {
                        0 => vec![os("-E"), os(&n.to_string())],
                        1 => vec![os(&format!("-E{n}"))],
                        2 => vec![os(&format!("-E={n}"))],
                        3 => vec![os("--conflict-exit-code"), os(&n.to_string())],
                        _ => vec![os(&format!("--conflict-exit-code={n}"))],
                    });
                }
                if let Some(long) = quiet {
                    groups.push(vec![os(if long { "--quiet" } else { "-q" })]);
                }
                if verbose > 0 && joined {
                    groups.push(vec![os(&format!("-{}", "v".repeat(verbose.into())))]);
                } else {
                    for i in 0..verbose {
                        groups.push(vec![os(if i % 2 == 0 { "-v" } else { "--verbose" })]);
                    }
                }
                if let Some(e) = early {
                    groups.push(vec![os(e)]);
                }
                // Global options in any order.
                let mut rng = fastrand::Rng::with_seed(seed);
                rng.shuffle(&mut groups);
                let mut args: Vec<OsString> = groups.concat();

                // Implicit hold: a PROFILE named like a subcommand would be read as one.
                let profile = if matches!(sub, Sub::Implicit | Sub::Flock(..))
                    && SUBCOMMANDS.contains(&profile.as_str())
                {
                    format!("{profile}.x")
                } else {
                    profile
                };
                let word = match &sub {
                    Sub::Implicit | Sub::Flock(..) => None,
                    Sub::Hold => Some("hold"),
                    Sub::Run(..) => Some("run"),
                    Sub::Status(_) => Some("status"),
                    Sub::Break(..) => Some("break"),
                    Sub::Verify(_) => Some("verify"),
                    Sub::Profiles => Some("profiles"),
                };
                args.extend(word.map(os));
                let mut sub_opts: Vec<OsString> = Vec::new();
                match &sub {
                    Sub::Status(true) => sub_opts.push(os("--json")),
                    Sub::Verify(Some(peer)) => {
                        sub_opts.extend(with_value("--peer", peer, sub_opts_after));
                    }
                    Sub::Break(force, token) => {
                        if *force {
                            sub_opts.push(os("--force"));
                        }
                        if let Some(t) = token {
                            sub_opts.extend(with_value(
                                "--token",
                                &os(&t.to_string()),
                                sub_opts_after,
                            ));
                        }
                    }
                    _ => {}
                }
                let mut profile_at = None;
                if !matches!(sub, Sub::Profiles) {
                    if !sub_opts_after {
                        args.append(&mut sub_opts);
                    }
                    profile_at = Some(args.len());
                    args.push(os(&profile));
                    args.append(&mut sub_opts);
                }
                if let Sub::Run(cmd, dashdash) = &sub {
                    if *dashdash {
                        args.push(os("--"));
                    }
                    args.extend(cmd.iter().cloned());
                }
                match &sub {
                    Sub::Flock(_, Some(c)) => args.extend([os("-c"), c.clone()]),
                    Sub::Flock(cmd, None) => args.extend(cmd.iter().cloned()),
                    _ => {}
                }

                let run = matches!(sub, Sub::Run(..) | Sub::Flock(..));
                let implicit = matches!(sub, Sub::Implicit | Sub::Flock(..));
                let flock_form = matches!(sub, Sub::Flock(..));
                let command = match early {
                    // Help names the subcommand it was given with.
                    Some("-h" | "--help") => Command::Help {
                        topic: word.map(str::to_string),
                    },
                    Some(_) => Command::Version,
                    None => match sub {
                        Sub::Implicit | Sub::Hold => Command::Hold {
                            profile,
                            more: Vec::new(),
                        },
                        Sub::Run(cmd, _) => Command::Run {
                            profile,
                            more: Vec::new(),
                            cmd,
                        },
                        Sub::Status(json) => Command::Status { profile, json },
                        Sub::Break(force, token) => Command::Break {
                            profile,
                            force,
                            token,
                        },
                        Sub::Verify(peer) => Command::Verify {
                            profile,
                            peer: peer.map(Into::into),
                        },
                        Sub::Profiles => Command::Profiles,
                        Sub::Flock(_, Some(c)) => Command::Run {
                            profile,
                            more: Vec::new(),
                            cmd: vec![os("sh"), os("-c"), c],
                        },
                        Sub::Flock(cmd, None) => Command::Run {
                            profile,
                            more: Vec::new(),
                            cmd,
                        },
                    },
                };
                let want = Cli {
                    profiles: profiles.map(|(f, _)| f.into()),
                    wait: wait.map(|((_, w), _)| w),
                    shared,
                    watch_stdin,
                    conflict_exit: conflict.map(|(n, _)| n),
                    quiet: quiet.is_some(),
                    verbose,
                    flock_form,
                    command,
                    ..Cli::new(Command::Profiles)
                };
                Line {
                    args,
                    want,
                    profile_at,
                    run,
                    implicit,
                }
            },
        )
}

/// Ways to break a valid command line, and a word the usage error must contain.
#[derive(Clone, Debug)]
enum Breakage {
    UnknownOption,
    BadWait(&'static str),
    BadExitCode(&'static str),
    BadToken(&'static str),
    MissingValue(&'static str),
    NonUnicodeProfile,
    ExtraArgument,
    /// One subcommand's own option (and its value) on another's line.
    Misplaced(&'static [&'static str]),
    MissingProfile,
    RunWithoutCmd,
}

fn breakage() -> impl Strategy<Value = Breakage> {
    prop_oneof![
        Just(Breakage::UnknownOption),
        select(vec![
            "soon",
            "",
            "-5s",
            "1 fortnight",
            "18446744073709551615s1000ms",
            "300000000000y",
        ])
        .prop_map(Breakage::BadWait),
        select(vec!["256", "-1", "x", "", "99999999999"]).prop_map(Breakage::BadExitCode),
        select(vec!["-1", "x", "18446744073709551616", ""]).prop_map(Breakage::BadToken),
        select(vec![
            "--wait",
            "--profiles",
            "-E",
            "--token",
            "--peer",
            "--conflict-exit-code"
        ])
        .prop_map(Breakage::MissingValue),
        Just(Breakage::NonUnicodeProfile),
        Just(Breakage::ExtraArgument),
        Just(Breakage::Misplaced(&["--json"])),
        Just(Breakage::Misplaced(&["--force"])),
        Just(Breakage::Misplaced(&["--token", "5"])),
        Just(Breakage::Misplaced(&["--peer", "/mnt/b"])),
        Just(Breakage::MissingProfile),
        Just(Breakage::RunWithoutCmd),
    ]
}

/// Whether option `opt` belongs on `sub`'s line (`--json` on status's, `--force` and `--token`
/// on break's, `--peer` on verify's).
fn at_home(opt: &str, sub: &Command) -> bool {
    match opt {
        "--json" => matches!(sub, Command::Status { .. }),
        "--force" | "--token" => matches!(sub, Command::Break { .. }),
        "--peer" => matches!(sub, Command::Verify { .. }),
        other => unreachable!("no subcommand owns {other}"),
    }
}

impl Line {
    /// Applies `b` if it fits this line; returns the broken argv and the word to expect.
    fn broken(&self, b: &Breakage) -> Option<(Vec<OsString>, String)> {
        let mut args = self.args.clone();
        let front = |args: &mut Vec<OsString>, words: &[&str]| {
            for (i, w) in words.iter().enumerate() {
                args.insert(i, os(w));
            }
        };
        let sub = &self.want.command;
        let needle = match b {
            Breakage::UnknownOption => {
                front(&mut args, &["--bogus-option"]);
                "--bogus-option"
            }
            Breakage::BadWait(v) => {
                front(&mut args, &["--wait", v]);
                "--wait"
            }
            Breakage::BadExitCode(v) => {
                front(&mut args, &["-E", v]);
                "-E"
            }
            Breakage::BadToken(v) => {
                front(&mut args, &["--token", v]);
                "--token"
            }
            Breakage::MissingValue(opt) => {
                // Only last on the line does an option lack its value (after an implicit
                // hold's PROFILE it is flock(1)'s CMD).
                if self.run || self.implicit {
                    return None;
                }
                args.push(os(opt));
                opt
            }
            Breakage::NonUnicodeProfile => {
                let at = self.profile_at?;
                args[at] = OsString::from_vec(b"bad\xffname".to_vec());
                "unicode"
            }
            Breakage::ExtraArgument => {
                // (After an implicit hold's PROFILE a word is flock(1)'s CMD; after an explicit
                // hold's, another LOCK, SPEC §3b.)
                if self.run
                    || self.implicit
                    || matches!(
                        sub,
                        Command::Help { .. } | Command::Version | Command::Hold { .. }
                    )
                {
                    return None;
                }
                args.push(os("extra"));
                "extra"
            }
            Breakage::Misplaced(words) => {
                if at_home(words[0], sub) || matches!(sub, Command::Help { .. } | Command::Version)
                {
                    return None;
                }
                front(&mut args, words);
                words[0]
            }
            Breakage::MissingProfile => {
                if self.run || matches!(sub, Command::Help { .. } | Command::Version) {
                    return None;
                }
                let at = self.profile_at?;
                args.remove(at);
                "PROFILE"
            }
            Breakage::RunWithoutCmd => {
                // (Without its CMD, flock(1)'s form is hold mode.)
                if !matches!(sub, Command::Run { .. }) || self.implicit {
                    // (With --help the command line is not judged further.)
                    return None;
                }
                args.truncate(self.profile_at? + 1);
                "command"
            }
        };
        Some((args, needle.to_owned()))
    }
}

proptest! {
    #![proptest_config(config())]

    /// Round trip: a valid command line parses to exactly the options and command it was
    /// built from.
    #[test]
    fn valid_command_lines_parse_to_what_they_say(line in line()) {
        let got = parse(line.args.clone());
        prop_assert!(got.is_ok(), "{:?} for {:?}", got, line.args);
        prop_assert_eq!(got.unwrap(), line.want, "{:?}", line.args);
    }

    /// One breakage in a valid command line is a usage error that says what is wrong.
    #[test]
    fn a_broken_command_line_is_a_usage_error_saying_why(line in line(), b in breakage()) {
        let Some((args, needle)) = line.broken(&b) else {
            return Ok(());
        };
        match parse(args.clone()) {
            Ok(cli) => prop_assert!(false, "{b:?}: {args:?} parsed as {cli:?}"),
            Err(e) => {
                check_usage(&e, &args)?;
                prop_assert!(e.message().contains(&needle), "{b:?}: {e} lacks {needle:?} ({args:?})");
            }
        }
    }
}
