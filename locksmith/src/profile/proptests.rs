//! Property-based fuzzing of the profiles parser (issue 5, item 3), in process and fast:
//! [`ProfilesFile::parse`] and [`ProfilesFile::profile`] on arbitrary text, on TOML-like
//! soup, on valid TOML with random keys, values and types, and on generated valid profiles
//! whose settings must come back exactly as written.
//!
//! Properties: nothing panics; every rejection is a `config` error (78) — `usage` (64) only
//! for a bad profile name or `--shared`, both command-line input — with a non-empty one-line
//! message; a generated valid profile resolves to exactly the values it was written with,
//! precedence included.
//!
//! Durations on their own: never a panic, never above [`MAX_DURATION`], and the same value
//! or the same error as `humantime::parse_duration` wherever humantime itself cannot panic.
//!
//! Issue 14: an address and the profile section that says the same keys parse to the same
//! settings, or to the same error (78 in the file, 64 on the command line).
//!
//! Bounded pass: 512 cases for each of the 7 properties (3,584 inputs, about 2 s in a debug
//! build on 2 cores). Failures are not persisted (`failure_persistence: None`), so a failing
//! run leaves no file in the tree; proptest prints the minimal failing input instead.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use proptest::prelude::*;
use proptest::sample::select;

use super::*;
use crate::backend::BackendConfig;
use crate::backend::ftp::{FtpConfig, Tls};
use crate::backend::lockdir::FsConfig;
use crate::settings::{
    Env, MAX_DURATION, MIN_KEEPALIVE, MIN_POLL, MIN_STALE_AFTER, Password, Wait, fmt_duration,
    human_duration, parse_duration, parse_wait,
};
use std::time::Duration;

use crate::cli::proptests::config;

/// The profiles file the texts pretend to be: a file that exists, so relative lock paths
/// anchor at its directory (its own contents are never read).
fn file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")
}

fn anchor() -> PathBuf {
    file()
        .canonicalize()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf()
}

const REAL_KEYS: &[&str] = &[
    "backend",
    "path",
    "wait",
    "poll",
    "max_poll",
    "keepalive",
    "stale_after",
    "shared",
    "file_mode",
    "group",
    "local",
    "host",
    "port",
    "user",
    "password",
    "password_env",
    "password_file",
    "tls",
    "ca_file",
    "endpoints",
    "prefix",
    "url",
    "db",
    "key",
];
const BACKENDS: &[&str] = &[
    "flock", "mkdir", "link", "ftp", "symlink", "etcd", "postgres", "redis", "", "FLOCK",
];

/// A TOML value, rendered by [`V::render`]; tables keep their keys unique.
#[derive(Clone, Debug)]
enum V {
    Str(String),
    Int(i64),
    Float(&'static str),
    Bool(bool),
    Date(&'static str),
    Arr(Vec<V>),
    Tab(BTreeMap<String, V>),
}

/// A TOML basic string: quotes, backslashes and control characters escaped.
fn quote(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() && (c as u32) < 0x80 => {
                write!(out, "\\u{:04X}", c as u32).unwrap();
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn key(k: &str, always_quote: bool) -> String {
    let bare = !k.is_empty()
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if bare && !always_quote {
        k.to_owned()
    } else {
        quote(k)
    }
}

impl V {
    fn render(&self) -> String {
        match self {
            V::Str(s) => quote(s),
            V::Int(i) => i.to_string(),
            V::Float(f) | V::Date(f) => (*f).to_owned(),
            V::Bool(b) => b.to_string(),
            V::Arr(items) => {
                let items: Vec<String> = items.iter().map(V::render).collect();
                format!("[{}]", items.join(", "))
            }
            V::Tab(t) => {
                let items: Vec<String> = t
                    .iter()
                    .map(|(k, v)| format!("{} = {}", key(k, false), v.render()))
                    .collect();
                format!("{{ {} }}", items.join(", "))
            }
        }
    }
}

/// A human duration as a profile would write it, with its value: one to three terms
/// (`250ms`, `1m30s`, `2h 5min`).
fn duration() -> impl Strategy<Value = (String, Duration)> {
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    let unit = select(vec![
        ("ns", 1),
        ("us", 1_000),
        ("ms", MS),
        ("msec", MS),
        ("s", S),
        ("sec", S),
        ("secs", S),
        ("m", 60 * S),
        ("min", 60 * S),
        ("h", 3600 * S),
        ("hours", 3600 * S),
        ("d", 86400 * S),
    ]);
    (
        prop::collection::vec((1u64..1000, unit), 1..=3),
        select(vec!["", " "]),
    )
        .prop_map(|(terms, sep)| {
            let text: Vec<String> = terms.iter().map(|(n, u)| format!("{n}{}", u.0)).collect();
            let nanos = terms.iter().map(|(n, u)| n * u.1).sum();
            (text.join(sep), Duration::from_nanos(nanos))
        })
}

/// A string value: something a real key takes, a near miss, or junk.
fn string_value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => duration().prop_map(|(s, _)| s),
        3 => select(vec![
            "0", "forever", "none", "explicit", "implicit", "0660", "0o7777", "7778", "root",
            "nogroup", "", " ", "-1s", "0s", "1.5s", "1 2s", "5 days", "1M", "1y", "µs",
            "18446744073709551615s", "18446744073709551615s1000ms", "584542046090y",
            "999999999999999999999h", "1e3s", "demo.lock", "/", ".", "..", "a/..", "~/x",
            "locks/x", "/tmp/x", "ftp.example.com", "a b", "PHONE_FTP_PASSWORD",
        ])
        .prop_map(str::to_owned),
        2 => select(BACKENDS.to_vec()).prop_map(str::to_owned),
        2 => ".{0,16}",
        1 => "[a-z/._]{1,20}",
    ]
}

fn any_key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(REAL_KEYS.to_vec()).prop_map(str::to_owned),
        1 => "[a-z_]{1,10}",
        1 => ".{0,6}",
    ]
}

fn leaf() -> impl Strategy<Value = V> {
    prop_oneof![
        6 => string_value().prop_map(V::Str),
        2 => prop_oneof![any::<i64>(), -5i64..70_000].prop_map(V::Int),
        1 => select(vec!["1.5", "-0.0", "inf", "nan", "3e2", "0.0"]).prop_map(V::Float),
        1 => any::<bool>().prop_map(V::Bool),
        1 => select(vec!["1979-05-27T07:32:00Z", "1979-05-27", "07:32:00"]).prop_map(V::Date),
    ]
}

fn value() -> impl Strategy<Value = V> {
    leaf().prop_recursive(2, 12, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(V::Arr),
            prop::collection::btree_map(any_key(), inner, 0..4).prop_map(V::Tab),
        ]
    })
}

/// A plausible value for a real key: mostly right type and shape, sometimes a near miss.
fn plausible(key: &'static str) -> BoxedStrategy<V> {
    let st = |v: Vec<&'static str>| select(v).prop_map(|s| V::Str(s.to_owned())).boxed();
    match key {
        "wait" => prop_oneof![
            4 => duration().prop_map(|(s, _)| V::Str(s)),
            1 => st(vec!["0", "forever", "never", "-1s", "0s"]),
            1 => Just(V::Int(0)),
        ]
        .boxed(),
        "poll" | "max_poll" | "keepalive" | "stale_after" => prop_oneof![
            6 => duration().prop_map(|(s, _)| V::Str(s)),
            1 => st(vec!["0", "0ms", "forever", "300000000000y", "1.5s", "5"]),
        ]
        .boxed(),
        "shared" | "local" => prop_oneof![
            6 => any::<bool>().prop_map(V::Bool),
            1 => st(vec!["true", "yes"]),
        ]
        .boxed(),
        "path" => prop_oneof![
            6 => "[a-z]{1,8}(/[a-z]{1,8}){0,2}(\\.lock)?".prop_map(V::Str),
            1 => st(vec!["", "/", ".", "..", "a/..", "/tmp/x", "~/x", "a//b", "a/./b"]),
        ]
        .boxed(),
        "file_mode" => prop_oneof![
            4 => (0u32..=0o7777).prop_map(|m| V::Str(format!("{m:04o}"))),
            1 => st(vec!["0o640", "8", "77777", "", "rw-r-----", "0x1ff"]),
            1 => Just(V::Int(660)),
        ]
        .boxed(),
        "group" => prop_oneof![
            2 => any::<u32>().prop_map(|g| V::Str(g.to_string())),
            1 => st(vec!["root", "nogroup", "no-such-group-x", "", "-1"]),
        ]
        .boxed(),
        "host" => prop_oneof![
            4 => "[a-z][a-z0-9.-]{0,12}".prop_map(V::Str),
            1 => st(vec!["", "a b", "a/b", "127.0.0.1", "::1"]),
        ]
        .boxed(),
        "port" => prop_oneof![
            4 => (1i64..=65535).prop_map(V::Int),
            1 => prop_oneof![Just(0i64), Just(-1), Just(65536), any::<i64>()].prop_map(V::Int),
            1 => st(vec!["21"]),
        ]
        .boxed(),
        "user" => "[a-z]{0,8}".prop_map(V::Str).boxed(),
        "password_env" => "[A-Z_]{0,12}".prop_map(V::Str).boxed(),
        "password_file" | "ca_file" => "[a-z]{0,8}(\\.pem)?".prop_map(V::Str).boxed(),
        "password" => ".{0,8}".prop_map(V::Str).boxed(),
        "tls" => st(vec!["none", "explicit", "implicit", "", "ssl"]),
        _ => string_value().prop_map(V::Str).boxed(),
    }
}

/// A profile body: a backend, plausible values for some of the keys a profile takes (those
/// of its backend, mostly), and a few random keys of random types over them.
fn body() -> impl Strategy<Value = BTreeMap<String, V>> {
    // Each key with the chance a real profile has it.
    const FS: &[(&str, f64)] = &[
        ("path", 0.9),
        ("file_mode", 0.3),
        ("group", 0.2),
        ("local", 0.3),
    ];
    const FTP: &[(&str, f64)] = &[
        ("host", 0.9),
        ("port", 0.4),
        ("user", 0.9),
        ("password", 0.02),
        ("password_env", 0.2),
        ("password_file", 0.1),
        ("tls", 0.4),
        ("ca_file", 0.1),
        ("path", 0.9),
    ];
    const COMMON: &[(&str, f64)] = &[
        ("wait", 0.2),
        ("poll", 0.2),
        ("max_poll", 0.2),
        ("keepalive", 0.2),
        ("stale_after", 0.2),
        ("shared", 0.2),
    ];
    let entries = |keys: &'static [(&'static str, f64)]| {
        keys.iter()
            .map(|(k, p)| prop::option::weighted(*p, plausible(k).prop_map(move |v| (*k, v))))
            .collect::<Vec<_>>()
    };
    let backend = prop_oneof![
        8 => select(vec!["flock", "mkdir", "link", "ftp"]),
        1 => select(BACKENDS.to_vec()),
    ];
    (
        prop::option::weighted(0.95, backend),
        entries(FS),
        entries(FTP),
        entries(COMMON),
        0..20,
        prop::collection::btree_map(any_key(), value(), 0..3),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(backend, fs, ftp, common, mix, random, junk)| {
            let mut t = BTreeMap::new();
            if let Some(b) = backend {
                t.insert("backend".to_owned(), V::Str(b.into()));
            }
            // Mostly the keys of the profile's own backend, as a real profile has.
            let ftp_side = backend == Some("ftp");
            let sides = match mix {
                0 => vec![fs, ftp],
                1 if ftp_side => vec![fs],
                1 => vec![ftp],
                _ if ftp_side => vec![ftp],
                _ => vec![fs],
            };
            for (k, v) in sides.into_iter().flatten().chain(common).flatten() {
                t.insert(k.to_owned(), v);
            }
            if junk {
                t.extend(random);
            }
            t
        })
}

fn profile_name() -> impl Strategy<Value = String> {
    prop_oneof![
        40 => "[A-Za-z0-9._-]{1,12}",
        1 => select(SUBCOMMANDS.to_vec()).prop_map(str::to_owned),
        1 => ".{0,8}",
        1 => "[a-z]{65}",
    ]
}

/// A whole file as TOML values: `[defaults]`, `[profile.NAME]` sections, stray top-level
/// keys; each section usually a table, sometimes not.
#[derive(Clone, Debug)]
struct Doc {
    junk: BTreeMap<String, V>,
    defaults: Option<V>,
    profiles: Option<Result<BTreeMap<String, V>, V>>,
    quote_keys: bool,
}

fn doc() -> impl Strategy<Value = Doc> {
    const TIMING: &[&str] = &["wait", "poll", "max_poll", "keepalive", "stale_after"];
    let valid_defaults = TIMING
        .iter()
        .map(|k| prop::option::weighted(0.3, plausible(k).prop_map(move |v| (k.to_string(), v))))
        .collect::<Vec<_>>()
        .prop_map(|e| V::Tab(e.into_iter().flatten().collect()));
    let defaults = prop_oneof![
        12 => valid_defaults,
        2 => prop::collection::btree_map(any_key(), value(), 0..3).prop_map(V::Tab),
        1 => leaf(),
    ];
    let profile_body = prop_oneof![20 => body().prop_map(V::Tab), 1 => leaf()];
    let profiles = prop_oneof![
        20 => prop::collection::btree_map(profile_name(), profile_body, 1..4).prop_map(Ok),
        1 => leaf().prop_map(Err),
    ];
    (
        prop::option::weighted(
            0.05,
            prop::collection::btree_map("[a-z]{1,8}", leaf(), 1..3),
        ),
        prop::option::weighted(0.6, defaults),
        prop::option::weighted(0.97, profiles),
        any::<bool>(),
    )
        .prop_map(|(junk, defaults, profiles, quote_keys)| {
            let mut junk = junk.unwrap_or_default();
            junk.remove("defaults");
            junk.remove("profile");
            Doc {
                junk,
                defaults,
                profiles,
                quote_keys,
            }
        })
}

impl Doc {
    fn render(&self) -> String {
        let q = self.quote_keys;
        let mut out = String::new();
        let lines = |out: &mut String, t: &BTreeMap<String, V>| {
            for (k, v) in t {
                writeln!(out, "{} = {}", key(k, q), v.render()).unwrap();
            }
        };
        // Top-level keys first: after a section header they would belong to it.
        lines(&mut out, &self.junk);
        if let Some(d) = self.defaults.as_ref().filter(|d| !matches!(d, V::Tab(_))) {
            writeln!(out, "defaults = {}", d.render()).unwrap();
        }
        if let Some(Err(p)) = &self.profiles {
            writeln!(out, "profile = {}", p.render()).unwrap();
        }
        if let Some(V::Tab(t)) = &self.defaults {
            out.push_str("\n[defaults]\n");
            lines(&mut out, t);
        }
        if let Some(Ok(profiles)) = &self.profiles {
            let scalars: BTreeMap<String, V> = profiles
                .iter()
                .filter(|(_, v)| !matches!(v, V::Tab(_)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !scalars.is_empty() {
                out.push_str("\n[profile]\n");
                lines(&mut out, &scalars);
            }
            for (name, v) in profiles {
                if let V::Tab(t) = v {
                    writeln!(out, "\n[profile.{}]", key(name, q)).unwrap();
                    lines(&mut out, t);
                }
            }
        }
        out
    }
}

/// Fragments of TOML and of real profiles, glued at random: near-valid text that reaches
/// deeper into the TOML parser's error paths than uniform random strings.
fn soup() -> impl Strategy<Value = String> {
    let fragment = prop_oneof![
        4 => select(vec![
            "[profile.", "[profile.demo]", "[defaults]", "[[profile]]", "]", "\n", "\r\n", " = ",
            "=", "\"", "'", "\"\"\"", "'''", "{", "}", "[", ",", "#", ".", "\\", "\\u00e9",
            "\\U0001F600", "é", "µ", "😀", "\t", " ", "backend", "flock", "mkdir", "ftp", "path",
            "wait", "\"0\"", "0", "forever", "\"250ms\"", "true", "1979-05-27T07:32:00Z",
            "0x1f", "inf", "1_000", "-", "+", "shared", "password",
        ]).prop_map(str::to_owned),
        1 => ".{0,4}",
    ];
    prop::collection::vec(fragment, 0..40).prop_map(|f| f.concat())
}

/// A rejection is one of the allowed kinds, with a non-empty message on one line (the pipe
/// protocol is line based, and a bare CR splits lines for many readers).
fn check_error(e: &Error, allowed: &[Kind], input: &str) -> Result<(), TestCaseError> {
    prop_assert!(
        allowed.contains(&e.kind()),
        "kind {:?} not in {allowed:?}: {e} (input {input:?})",
        e.kind()
    );
    prop_assert!(
        !e.message().trim().is_empty(),
        "empty message for {input:?}"
    );
    prop_assert!(
        !e.message().contains(['\n', '\r']),
        "message spans lines: {:?} (input {input:?})",
        e.message()
    );
    Ok(())
}

/// The invariants of every profile that resolves.
fn check_profile(p: &Profile, name: &str) -> Result<(), TestCaseError> {
    let c = &p.common;
    prop_assert_eq!(&p.name, name);
    prop_assert!(!c.poll.is_zero());
    prop_assert!(c.max_poll >= c.poll);
    prop_assert!(c.keepalive < c.stale_after);
    prop_assert!(!c.shared || p.backend.supports_shared());
    if let BackendConfig::Flock(fs) | BackendConfig::Mkdir(fs) | BackendConfig::Link(fs) =
        &p.backend
    {
        prop_assert!(fs.path.is_absolute() && fs.path.file_name().is_some());
        prop_assert!(fs.file_mode.is_none_or(|m| m <= 0o777));
    }
    prop_assert!(c.poll >= MIN_POLL && c.keepalive >= MIN_KEEPALIVE);
    prop_assert!(c.stale_after >= MIN_STALE_AFTER);
    if let BackendConfig::Ftp(ftp) = &p.backend {
        prop_assert!(ftp.port != 0);
        prop_assert!(!ftp.host.is_empty() && !ftp.host.contains([' ', '/']));
        let path = ftp.path.strip_prefix('/').unwrap_or(&ftp.path);
        prop_assert!(
            path.split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..")
        );
        prop_assert!(ftp.ca_file.is_none() || ftp.tls != Tls::None);
    }
    Ok(())
}

/// Parses `text` and resolves every profile it defines (and a few it does not).
fn parse_and_resolve(text: &str, extra_names: &[String]) -> Result<(), TestCaseError> {
    let path = file();
    let pf = match ProfilesFile::parse(&path, text) {
        Ok(pf) => pf,
        Err(e) => return check_error(&e, &[Kind::Config], text),
    };
    let names: Vec<String> = pf.names().map(str::to_owned).collect();
    for name in names.iter().chain(extra_names) {
        let _ = pf.backend_of(name);
        for shared in [false, true] {
            let overrides = Overrides {
                wait: None,
                shared,
                slots: None,
                fair: false,
            };
            match pf.profile(name, &overrides) {
                Ok(p) => {
                    check_profile(&p, name)?;
                    prop_assert_eq!(Some(p.backend.name()), pf.backend_of(name));
                }
                Err(e) => {
                    // usage: a name no profile can have, or --shared on a backend without it.
                    let allowed: &[Kind] = if !valid_name(name) || shared {
                        &[Kind::Config, Kind::Usage]
                    } else {
                        &[Kind::Config]
                    };
                    check_error(&e, allowed, text)?;
                    if !valid_name(name) {
                        prop_assert_eq!(e.kind(), Kind::Usage);
                    } else if !names.contains(name) {
                        prop_assert!(e.message().contains("unknown profile"), "{}", e);
                    }
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_is_parsed_or_rejected_cleanly(text in any::<String>()) {
        parse_and_resolve(&text, &["demo".to_owned()])?;
    }

    #[test]
    fn toml_soup_is_parsed_or_rejected_cleanly(text in soup(), name in profile_name()) {
        parse_and_resolve(&text, &[name, "demo".to_owned()])?;
    }

    #[test]
    fn valid_toml_with_random_keys_and_types_is_judged_cleanly(
        doc in doc(),
        name in profile_name(),
    ) {
        let text = doc.render();
        // The generator writes valid TOML: whatever is wrong is wrong with the profiles.
        if let Err(e) = ProfilesFile::parse(&file(), &text) {
            prop_assert!(!e.message().contains("malformed TOML"), "{e}\n{text}");
        }
        parse_and_resolve(&text, &[name])?;
    }
}

/// Where a setting is written: nowhere (built-in), `[defaults]`, the profile, or both (the
/// profile's value wins).
#[derive(Clone, Debug)]
enum Place<T> {
    Builtin,
    Defaults(T),
    Profile(T),
    Both(T, T),
}

impl<T: Clone + std::fmt::Debug + 'static> Place<T> {
    fn strategy(s: BoxedStrategy<T>) -> BoxedStrategy<Place<T>> {
        prop_oneof![
            Just(Place::Builtin),
            s.clone().prop_map(Place::Defaults),
            s.clone().prop_map(Place::Profile),
            (s.clone(), s).prop_map(|(d, p)| Place::Both(d, p)),
        ]
        .boxed()
    }

    fn in_defaults(&self) -> Option<&T> {
        match self {
            Place::Defaults(d) | Place::Both(d, _) => Some(d),
            _ => None,
        }
    }

    fn in_profile(&self) -> Option<&T> {
        match self {
            Place::Profile(p) | Place::Both(_, p) => Some(p),
            _ => None,
        }
    }
}

/// The `wait` value as written (a string, or the integer 0) and what it means.
fn wait_value() -> BoxedStrategy<(V, Wait)> {
    prop_oneof![
        Just((V::Str("forever".into()), Wait::Forever)),
        Just((V::Str("0".into()), Wait::For(Duration::ZERO))),
        Just((V::Int(0), Wait::For(Duration::ZERO))),
        duration().prop_map(|(s, d)| (V::Str(s), Wait::For(d))),
    ]
    .boxed()
}

fn dur_value() -> BoxedStrategy<(V, Duration)> {
    duration().prop_map(|(s, d)| (V::Str(s), d)).boxed()
}

#[derive(Clone, Debug)]
enum BackendSpec {
    Fs(FsSpec),
    Ftp(FtpSpec),
}

#[derive(Clone, Debug)]
struct FsSpec {
    backend: &'static str,
    path: String,
    file_mode: Option<(String, u32)>,
    group: Option<u32>,
    local: Option<bool>,
}

#[derive(Clone, Debug)]
struct FtpSpec {
    host: String,
    port: Option<u16>,
    user: String,
    password: Password,
    explicit_tls: Option<bool>,
    ca_file: Option<String>,
    path: String,
}

fn fs_backend() -> impl Strategy<Value = BackendSpec> {
    let path = prop_oneof![
        "[a-zA-Z0-9_ äé-]{1,8}(/[a-zA-Z0-9_-]{1,8}){0,2}(\\.lock)?",
        "/[a-z]{1,8}/[a-z]{1,8}\\.sem",
    ];
    let mode = (0u32..=0o777, 0..3).prop_map(|(m, style)| {
        let s = match style {
            0 => format!("{m:04o}"),
            1 => format!("0o{m:o}"),
            _ => format!("{m:o}"),
        };
        (s, m)
    });
    (
        select(vec!["flock", "mkdir", "link"]),
        path,
        prop::option::of(mode),
        prop::option::of(any::<u32>()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(|(backend, path, file_mode, group, local)| {
            BackendSpec::Fs(FsSpec {
                backend,
                path,
                file_mode,
                group,
                // flock takes `local` too: it admits a network or FUSE filesystem.
                local,
            })
        })
}

fn ftp_backend() -> impl Strategy<Value = BackendSpec> {
    let password = prop_oneof![
        Just(Password::None),
        "[A-Z_]{1,12}".prop_map(Password::Env),
        "[a-z]{1,8}\\.pw".prop_map(|p| Password::File(PathBuf::from(p))),
    ];
    (
        prop_oneof![
            "[a-z][a-z0-9-]{0,10}(\\.[a-z]{2,5}){0,2}",
            Just("127.0.0.1".to_owned())
        ],
        prop::option::of(1u16..=65535),
        "[a-z][a-z0-9_]{0,8}",
        password,
        prop::option::of(any::<bool>()),
        prop::option::of("[a-z]{1,8}\\.pem"),
        "/?[a-z_]{1,8}(/[a-z_-]{1,8}){0,2}",
    )
        .prop_map(
            |(host, port, user, password, explicit_tls, ca_file, path)| {
                BackendSpec::Ftp(FtpSpec {
                    host,
                    port,
                    user,
                    password,
                    // A CA file needs TLS.
                    ca_file: ca_file.filter(|_| explicit_tls == Some(true)),
                    explicit_tls,
                    path,
                })
            },
        )
}

/// A valid profile, with every setting placed somewhere, and the command-line overrides.
#[derive(Clone, Debug)]
struct Spec {
    name: String,
    backend: BackendSpec,
    wait: Place<(V, Wait)>,
    timing: [Place<(V, Duration)>; 4],
    shared: Option<bool>,
    over_wait: Option<Wait>,
    over_shared: bool,
    quote_keys: bool,
    other: bool,
}

const TIMING: [&str; 4] = ["poll", "max_poll", "keepalive", "stale_after"];

prop_compose! {
    fn spec()(
        name in "[A-Za-z0-9._-]{1,64}".prop_filter("a subcommand or the neighbour", |n| {
            !SUBCOMMANDS.contains(&n.as_str()) && n != "zz-other"
        }),
        backend in prop_oneof![3 => fs_backend(), 1 => ftp_backend()],
        wait in Place::strategy(wait_value()),
        timing in [(); 4].map(|()| Place::strategy(dur_value())),
        shared in prop::option::of(any::<bool>()),
        over_wait in prop::option::of(wait_value().prop_map(|(_, w)| w)),
        over_shared in prop::bool::weighted(0.2),
        quote_keys in any::<bool>(),
        other in any::<bool>(),
        tidy in prop_oneof![7 => Just(Tidy::Fix), 2 => Just(Tidy::Edge), 1 => Just(Tidy::No)],
    ) -> Spec {
        Spec { name, backend, wait, timing, shared, over_wait, over_shared, quote_keys, other }
            .tidy(tidy)
    }
}

fn effective(place: &Place<(V, Duration)>, builtin: Duration) -> Duration {
    match place {
        Place::Builtin => builtin,
        Place::Defaults((_, d)) | Place::Profile((_, d)) | Place::Both(_, (_, d)) => *d,
    }
}

/// What to do about the cross-key rules (`max_poll` >= `poll`, `keepalive` <
/// `stale_after`), which random durations break more often than not.
#[derive(Clone, Copy, Debug)]
enum Tidy {
    /// Leave the values as drawn.
    No,
    /// Fix what breaks a rule, so that most profiles pass.
    Fix,
    /// Set both pairs equal: `max_poll` = `poll` passes, `stale_after` = `keepalive` fails.
    Edge,
}

impl Spec {
    /// Applies `tidy`; new values are written as `fmt_duration` says them, which must read
    /// back as the same duration.
    fn tidy(mut self, tidy: Tidy) -> Spec {
        let b = Common::builtin();
        let written = |d: Duration| Place::Profile((V::Str(fmt_duration(d)), d));
        let poll = effective(&self.timing[0], b.poll);
        let keepalive = effective(&self.timing[2], b.keepalive);
        match tidy {
            Tidy::No => {}
            Tidy::Fix => {
                // The floors first (poll, keepalive, stale_after), then the cross-key rules.
                let builtin = [b.poll, b.max_poll, b.keepalive, b.stale_after];
                for (i, floor) in [(0, MIN_POLL), (2, MIN_KEEPALIVE), (3, MIN_STALE_AFTER)] {
                    if effective(&self.timing[i], builtin[i]) < floor {
                        self.timing[i] = written(floor);
                    }
                }
                let poll = effective(&self.timing[0], b.poll);
                let keepalive = effective(&self.timing[2], b.keepalive);
                if effective(&self.timing[1], b.max_poll) < poll {
                    self.timing[1] = written(poll);
                }
                if effective(&self.timing[3], b.stale_after) <= keepalive {
                    self.timing[3] = written(keepalive * 2);
                }
            }
            Tidy::Edge => {
                self.timing[1] = written(poll);
                self.timing[3] = written(keepalive);
            }
        }
        self
    }

    fn render(&self) -> String {
        let q = self.quote_keys;
        let mut defaults: Vec<(&str, V)> = Vec::new();
        let mut profile: Vec<(&str, V)> = Vec::new();
        if let Some((v, _)) = self.wait.in_defaults() {
            defaults.push(("wait", v.clone()));
        }
        if let Some((v, _)) = self.wait.in_profile() {
            profile.push(("wait", v.clone()));
        }
        for (key, place) in TIMING.iter().zip(&self.timing) {
            if let Some((v, _)) = place.in_defaults() {
                defaults.push((key, v.clone()));
            }
            if let Some((v, _)) = place.in_profile() {
                profile.push((key, v.clone()));
            }
        }
        if let Some(s) = self.shared {
            profile.push(("shared", V::Bool(s)));
        }
        let s = |x: &str| V::Str(x.to_owned());
        match &self.backend {
            BackendSpec::Fs(f) => {
                profile.push(("backend", s(f.backend)));
                profile.push(("path", s(&f.path)));
                if let Some((m, _)) = &f.file_mode {
                    profile.push(("file_mode", s(m)));
                }
                if let Some(g) = f.group {
                    profile.push(("group", s(&g.to_string())));
                }
                if let Some(l) = f.local {
                    profile.push(("local", V::Bool(l)));
                }
            }
            BackendSpec::Ftp(f) => {
                profile.push(("backend", s("ftp")));
                profile.push(("host", s(&f.host)));
                if let Some(p) = f.port {
                    profile.push(("port", V::Int(i64::from(p))));
                }
                profile.push(("user", s(&f.user)));
                match &f.password {
                    Password::Env(v) => profile.push(("password_env", s(v))),
                    Password::File(p) => profile.push(("password_file", s(p.to_str().unwrap()))),
                    _ => {}
                }
                if let Some(e) = f.explicit_tls {
                    profile.push(("tls", s(if e { "explicit" } else { "none" })));
                }
                if let Some(c) = &f.ca_file {
                    profile.push(("ca_file", s(c)));
                }
                profile.push(("path", s(&f.path)));
            }
        }
        let mut out = String::new();
        if !defaults.is_empty() {
            out.push_str("[defaults]\n");
            for (k, v) in &defaults {
                writeln!(out, "{} = {}", key(k, q), v.render()).unwrap();
            }
        }
        if self.other {
            // A neighbour that must not leak into this profile.
            out.push_str("\n[profile.zz-other]\nbackend = \"mkdir\"\npath = \"elsewhere\"\n");
            out.push_str("wait = \"3s\"\nshared = false\nlocal = true\n");
        }
        writeln!(out, "\n[profile.{}]", key(&self.name, q)).unwrap();
        for (k, v) in &profile {
            writeln!(out, "{} = {}", key(k, q), v.render()).unwrap();
        }
        out
    }

    /// What `profile()` must return: the profile, or the kind and a word of the error.
    fn expected(&self) -> Result<Profile, (Kind, &'static str)> {
        let builtin = Common::builtin();
        let [poll, max_poll, keepalive, stale_after] = &self.timing;
        let wait = match &self.wait {
            Place::Builtin => builtin.wait,
            Place::Defaults((_, w)) | Place::Profile((_, w)) | Place::Both(_, (_, w)) => *w,
        };
        let shared_from_profile = self.shared.unwrap_or(false);
        let common = Common {
            wait: self.over_wait.unwrap_or(wait),
            poll: effective(poll, builtin.poll),
            max_poll: effective(max_poll, builtin.max_poll),
            // A keepalive nobody gave follows stale_after (Common::settle).
            keepalive: match keepalive {
                Place::Builtin => builtin
                    .keepalive
                    .min(effective(stale_after, builtin.stale_after) / 3)
                    .max(MIN_KEEPALIVE),
                given => effective(given, builtin.keepalive),
            },
            stale_after: effective(stale_after, builtin.stale_after),
            shared: shared_from_profile || self.over_shared,
            slots: 1,
            fair: false,
            flock1: false,
            keepalive_given: !matches!(keepalive, Place::Builtin),
        };
        let backend = match &self.backend {
            BackendSpec::Fs(f) => {
                let fs = FsConfig {
                    slot_of: None,
                    path: anchor().join(&f.path),
                    file_mode: f.file_mode.as_ref().map(|(_, m)| *m),
                    group: f.group,
                    local: f.local.unwrap_or(false),
                    cache_time: None,
                };
                match f.backend {
                    "flock" => BackendConfig::Flock(fs),
                    "mkdir" => BackendConfig::Mkdir(fs),
                    _ => BackendConfig::Link(fs),
                }
            }
            BackendSpec::Ftp(f) => BackendConfig::Ftp(FtpConfig {
                slot_of: None,
                host: f.host.clone(),
                port: f.port.unwrap_or(21),
                user: f.user.clone(),
                password: match &f.password {
                    Password::File(p) => Password::File(anchor().join(p)),
                    other => other.clone(),
                },
                tls: if f.explicit_tls == Some(true) {
                    Tls::Explicit
                } else {
                    Tls::None
                },
                ca_file: f.ca_file.as_ref().map(|c| anchor().join(c)),
                path: f.path.clone(),
            }),
        };
        for (v, floor) in [
            (common.poll, MIN_POLL),
            (common.keepalive, MIN_KEEPALIVE),
            (common.stale_after, MIN_STALE_AFTER),
        ] {
            if v < floor {
                return Err((Kind::Config, "below the floor"));
            }
        }
        if common.max_poll < common.poll {
            return Err((Kind::Config, "`max_poll`"));
        }
        if common.keepalive >= common.stale_after {
            return Err((Kind::Config, "`keepalive`"));
        }
        if common.shared && !backend.supports_shared() {
            let kind = if shared_from_profile {
                Kind::Config
            } else {
                Kind::Usage
            };
            return Err((kind, "shared lock"));
        }
        Ok(Profile {
            name: self.name.clone(),
            backend,
            common,
            shared_from_profile,
        })
    }
}

proptest! {
    #![proptest_config(config())]

    /// Acceptance and round trip: a generated valid profile resolves to exactly what was
    /// written (durations like "250ms" or "1m 30s" included), with command line > profile >
    /// [defaults] > built-in; the only refusals are the cross-key rules of SPEC §3/§5.
    #[test]
    fn generated_profiles_resolve_to_what_they_say(spec in spec()) {
        let text = spec.render();
        let pf = ProfilesFile::parse(&file(), &text)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let overrides = Overrides { wait: spec.over_wait, shared: spec.over_shared, slots: None, fair: false };
        match (pf.profile(&spec.name, &overrides), spec.expected()) {
            (Ok(got), Ok(want)) => prop_assert_eq!(got, want, "\n{}", text),
            (Err(e), Err((kind, word))) => {
                check_error(&e, &[kind], &text)?;
                prop_assert!(e.message().contains(word), "{e} lacks {word:?}\n{text}");
            }
            (got, want) => prop_assert!(false, "got {got:?}, want {want:?}\n{text}"),
        }
        prop_assert_eq!(pf.backend_of(&spec.name), Some(match &spec.backend {
            BackendSpec::Fs(f) => f.backend,
            BackendSpec::Ftp(_) => "ftp",
        }));
    }

    /// One wrong value in an otherwise valid profile is a config error naming its key.
    #[test]
    fn one_bad_value_is_a_config_error_naming_the_key(
        spec in spec(),
        bad in prop_oneof![
            Just(("poll", V::Str("0".into()))),
            Just(("poll", V::Str("0ms".into()))),
            Just(("stale_after", V::Str("soon".into()))),
            Just(("keepalive", V::Int(-5))),
            Just(("wait", V::Str("never".into()))),
            Just(("wait", V::Int(-10))),
            Just(("stale_after", V::Int(0))),
            Just(("max_poll", V::Str("-1s".into()))),
            Just(("shared", V::Str("yes".into()))),
            Just(("backend", V::Str("nfs".into()))),
            Just(("backend", V::Bool(true))),
            Just(("bogus_key", V::Str("x".into()))),
            Just(("poll", V::Str("1 fortnight".into()))),
            Just(("poll", V::Str("300000000000y".into()))),
            Just(("port", V::Int(0))),
            Just(("port", V::Int(65536))),
            Just(("file_mode", V::Str("77777".into()))),
            Just(("group", V::Str("no-such-group-x".into()))),
            Just(("path", V::Str("a/..".into()))),
            Just(("path", V::Str(String::new()))),
        ],
    ) {
        let text = spec.render();
        // Replace or add the bad key in the profile's own section (the last one).
        let bad_line = format!("{} = {}", bad.0, bad.1.render());
        let (head, section) = text.rsplit_once("\n[profile.").unwrap();
        let section: Vec<&str> = section
            .lines()
            .filter(|l| !l.starts_with(&format!("{} =", bad.0)) && !l.starts_with(&format!("{:?} =", bad.0)))
            .collect();
        let text = format!("{head}\n[profile.{}\n{bad_line}\n", section.join("\n"));
        let pf = ProfilesFile::parse(&file(), &text)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let e = pf.profile(&spec.name, &Overrides::default()).unwrap_err();
        check_error(&e, &[Kind::Config], &text)?;
        prop_assert!(e.message().contains(bad.0), "{e} does not name {}\n{text}", bad.0);
    }
}

/// Digits, units, dots, whitespace and junk: near-valid durations.
fn duration_soup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => "[0-9]{1,3}",
        4 => select(vec![
            "ns", "us", "µs", "ms", "msec", "s", "sec", "m", "min", "h", "hr", "d", "w", "M",
            "y", "years", "x", "",
        ])
        .prop_map(str::to_owned),
        2 => select(vec![" ", "  ", "\t", ".", "é", "-", "+", "0", ":"]).prop_map(str::to_owned),
        1 => "[0-9]{15,20}",
    ];
    prop::collection::vec(piece, 0..8).prop_map(|p| p.concat())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn durations_never_panic_and_agree_with_humantime(s in duration_soup()) {
        let ours = human_duration(&s);
        // With at most 9 digits the terms cannot add up to humantime's panic (u64::MAX s).
        if s.bytes().filter(u8::is_ascii_digit).count() <= 9 {
            let theirs = humantime::parse_duration(&s);
            match (&ours, &theirs) {
                (Ok(Some(a)), Ok(b)) => prop_assert_eq!(a, b, "{:?}", s),
                (Ok(None), Ok(b)) => prop_assert!(*b > MAX_DURATION, "{:?}", s),
                // Too long already before a later term's error.
                (Ok(None), Err(_)) => {}
                (Err(a), Err(b)) => prop_assert_eq!(a, b, "{:?}", s),
                _ => prop_assert!(false, "{:?}: ours {:?}, humantime {:?}", s, ours, theirs),
            }
        }
        match parse_duration(&s) {
            Ok(d) => prop_assert!(!d.is_zero() && d <= MAX_DURATION),
            Err(m) => prop_assert!(m.contains(&format!("{s:?}")) || m.contains(&s), "{m}"),
        }
        match parse_wait(&s) {
            Ok(Wait::For(d)) => prop_assert!(d <= MAX_DURATION),
            Ok(Wait::Forever) => prop_assert_eq!(s.trim(), "forever"),
            Err(m) => prop_assert!(!m.is_empty()),
        }
    }
}

/// Issue 14: one lock written as an address and as a profile section.
#[derive(Clone, Debug)]
struct AddressCase {
    backend: &'static str,
    /// Keys the address says in its own parts (typed as a profile writes them).
    parts: Vec<(&'static str, V)>,
    /// Keys given in the query (the same values, as a profile writes them).
    query: Vec<(&'static str, V)>,
}

/// `%`-escapes what an address's query or path cannot hold as it is.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~/:".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl AddressCase {
    fn part(&self, key: &str) -> Option<String> {
        self.parts
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| match v {
                V::Str(s) => s.clone(),
                other => other.render(),
            })
    }

    fn address(&self) -> String {
        let p = |k| self.part(k).unwrap_or_default();
        // `:PORT` and `USER@`, where given.
        let port = self
            .part("port")
            .map(|p| format!(":{p}"))
            .unwrap_or_default();
        let user = self
            .part("user")
            .map(|u| format!("{}@", escape(&u)))
            .unwrap_or_default();
        let mut text = match self.backend {
            "ftp" => {
                let path = p("path");
                let path = match path.strip_prefix('/') {
                    Some(abs) => format!("%2F{}", escape(abs)),
                    None => escape(&path),
                };
                format!("ftp://{}@{}{port}/{path}", escape(&p("user")), p("host"))
            }
            "postgres" => {
                format!(
                    "postgres://{user}{}{port}/{}",
                    p("host"),
                    escape(&p("dbname"))
                )
            }
            "etcd" => {
                format!(
                    "etcd://{user}{}/{}",
                    p("endpoints"),
                    escape(p("prefix").trim_start_matches('/'))
                )
            }
            "redis" => {
                let db = self.part("db").map(|d| format!("/{d}")).unwrap_or_default();
                format!("redis://{user}{}{port}{db}", p("host"))
            }
            fs => format!("{fs}:{}", escape(&p("path"))),
        };
        let query: Vec<String> = self
            .query
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    V::Str(s) => s.clone(),
                    other => other.render(),
                };
                format!("{k}={}", escape(&v))
            })
            .collect();
        if !query.is_empty() {
            text.push('?');
            text.push_str(&query.join("&"));
        }
        text
    }

    fn profile(&self) -> String {
        let mut out = format!("[profile.x]\nbackend = \"{}\"\n", self.backend);
        for (k, v) in self.parts.iter().chain(&self.query) {
            let v = match (*k, v) {
                ("endpoints", V::Str(s)) => V::Arr(vec![V::Str(format!("http://{s}"))]),
                _ => v.clone(),
            };
            writeln!(out, "{k} = {}", v.render()).unwrap();
        }
        out
    }
}

fn address_case() -> impl Strategy<Value = AddressCase> {
    let s = |v: Vec<&'static str>| select(v).prop_map(|s| V::Str(s.to_owned())).boxed();
    let common = prop::collection::vec(
        prop_oneof![
            plausible("wait").prop_map(|v| ("wait", v)),
            plausible("poll").prop_map(|v| ("poll", v)),
            plausible("max_poll").prop_map(|v| ("max_poll", v)),
            plausible("keepalive").prop_map(|v| ("keepalive", v)),
            plausible("stale_after").prop_map(|v| ("stale_after", v)),
            any::<bool>().prop_map(|b| ("shared", V::Bool(b))),
            Just(("bogus", V::Str("1".into()))),
        ],
        0..4,
    );
    let path = "[a-z]{1,8}(/[a-z]{1,8}){0,2}";
    let fs = (
        select(vec!["flock", "mkdir", "link", "symlink"]),
        prop_oneof![
            path.prop_map(V::Str),
            path.prop_map(|p| V::Str(format!("/tmp/{p}")))
        ],
        prop::collection::vec(
            prop_oneof![
                plausible("file_mode")
                    .prop_filter("a string", |v| matches!(v, V::Str(_)))
                    .prop_map(|v| ("file_mode", v)),
                any::<bool>().prop_map(|b| ("local", V::Bool(b))),
                s(vec!["30s", "0", "soon"]).prop_map(|v| ("cache_time", v)),
            ],
            0..3,
        ),
    )
        .prop_map(|(backend, path, query)| (backend, vec![("path", path)], query));
    let host = "[a-z][a-z0-9.-]{0,12}".prop_map(V::Str);
    let port = prop::option::of((1i64..=65535).prop_map(V::Int));
    let ftp = (
        host.clone(),
        port.clone(),
        "[a-z]{1,8}".prop_map(V::Str),
        prop_oneof![
            path.prop_map(V::Str),
            path.prop_map(|p| V::Str(format!("/{p}")))
        ],
        prop::collection::vec(
            prop_oneof![
                s(vec!["none", "explicit", "implicit", "ssl"]).prop_map(|v| ("tls", v)),
                s(vec!["FTP_PW", ""]).prop_map(|v| ("password_env", v)),
                s(vec!["ca.pem"]).prop_map(|v| ("ca_file", v)),
            ],
            0..3,
        ),
    )
        .prop_map(|(host, port, user, path, query)| {
            let mut parts = vec![("host", host), ("user", user), ("path", path)];
            parts.extend(port.map(|p| ("port", p)));
            ("ftp", parts, query)
        });
    let postgres = (
        host.clone(),
        port,
        prop::option::of("[a-z]{1,8}".prop_map(V::Str)),
        "[a-z]{1,8}".prop_map(V::Str),
        prop::collection::vec(
            prop_oneof![
                s(vec!["locksmith", "Bad-Schema"]).prop_map(|v| ("schema", v)),
                s(vec!["disable", "require", "verify-full", "maybe"]).prop_map(|v| ("sslmode", v)),
                s(vec!["PG_PW"]).prop_map(|v| ("password_env", v)),
                s(vec!["ca.pem"]).prop_map(|v| ("ca_file", v)),
            ],
            0..3,
        ),
        "[a-z]{1,8}".prop_map(V::Str),
    )
        .prop_map(|(host, port, user, db, mut query, lock)| {
            let mut parts = vec![("host", host), ("dbname", db)];
            parts.extend(port.map(|p| ("port", p)));
            parts.extend(user.map(|u| ("user", u)));
            query.push(("lock", lock));
            ("postgres", parts, query)
        });
    let etcd = (
        ("[a-z][a-z0-9.-]{0,12}", 1u16..=65535).prop_map(|(h, p)| V::Str(format!("{h}:{p}"))),
        "(/[a-z]{1,8}){1,3}".prop_map(V::Str),
        prop::option::of("[a-z]{1,8}".prop_map(V::Str)),
        prop::collection::vec(s(vec!["ETCD_PW"]).prop_map(|v| ("password_env", v)), 0..2),
    )
        .prop_map(|(endpoints, prefix, user, query)| {
            let mut parts = vec![("endpoints", endpoints), ("prefix", prefix)];
            parts.extend(user.map(|u| ("user", u)));
            ("etcd", parts, query)
        });
    let redis = (
        host.clone(),
        prop::option::of((1i64..=65535).prop_map(V::Int)),
        prop::option::of("[a-z]{1,8}".prop_map(V::Str)),
        prop::option::of((0i64..=15).prop_map(V::Int)),
        prop::collection::vec(
            prop_oneof![
                any::<bool>().prop_map(|b| ("tls", V::Bool(b))),
                s(vec!["REDIS_PW"]).prop_map(|v| ("password_env", v)),
                s(vec!["ca.pem"]).prop_map(|v| ("ca_file", v)),
            ],
            0..3,
        ),
        "[a-z][a-z:]{0,8}".prop_map(V::Str),
    )
        .prop_map(|(host, port, user, db, mut query, key)| {
            let mut parts = vec![("host", host)];
            parts.extend(port.map(|p| ("port", p)));
            parts.extend(user.map(|u| ("user", u)));
            parts.extend(db.map(|d| ("db", d)));
            query.push(("key", key));
            ("redis", parts, query)
        });
    (
        prop_oneof![4 => fs, 2 => ftp, 2 => postgres, 1 => etcd, 1 => redis],
        common,
    )
        .prop_map(|((backend, parts, mut query), common)| {
            // One value per key, as a profile section holds it.
            for (k, v) in common {
                if !query.iter().any(|(q, _)| *q == k) {
                    query.push((k, v));
                }
            }
            query.dedup_by_key(|(k, _)| *k);
            let mut seen = Vec::new();
            query.retain(|(k, _)| {
                let new = !seen.contains(k);
                seen.push(*k);
                new
            });
            AddressCase {
                backend,
                parts,
                query,
            }
        })
}

proptest! {
    #![proptest_config(config())]

    /// Issue 14: an address and the profile section that says the same keys parse to the
    /// same settings, or fail with the same words (78 in the file, 64 on the command line).
    #[test]
    fn an_address_and_the_same_profile_parse_alike(case in address_case(), over_shared in any::<bool>()) {
        use crate::backend;
        let text = case.profile();
        let address = case.address();
        let overrides = Overrides { wait: None, shared: over_shared, slots: None, fair: false };
        let pf = ProfilesFile::parse(&file(), &text)
            .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        let by_profile = pf.profile("x", &overrides);
        let env = Env { cwd: anchor(), ..Env::default() };
        let entry = backend::entry_of_address(&address)
            .map_err(|e| TestCaseError::fail(format!("{e}: {address}")))?
            .ok_or_else(|| TestCaseError::fail(format!("not an address: {address}")))?;
        prop_assert_eq!(entry.name, case.backend);
        let by_address = backend::from_address(entry, &address, &env, &overrides);
        match (&by_profile, &by_address) {
            (Ok(p), Ok(a)) => {
                prop_assert_eq!(&p.backend, &a.backend, "\n{}\n{}", text, address);
                prop_assert_eq!(&p.common, &a.common);
                prop_assert_eq!(p.shared_from_profile, a.shared_from_profile);
                prop_assert_eq!(&a.name, &address);
            }
            (Err(p), Err(a)) => {
                let p_tail = p.message().split_once("profile `x`: ").map(|(_, t)| t);
                let a_tail = a.message().split_once(&format!("address `{address}`: ")).map(|(_, t)| t);
                match (p_tail, a_tail) {
                    (Some(pt), Some(at)) => prop_assert_eq!(pt, at, "\n{}\n{}", text, address),
                    _ => {
                        // --shared or `shared = true` on a backend without shared locks.
                        prop_assert!(p.message().contains("cannot take a shared lock"), "{p}");
                        prop_assert!(a.message().contains("cannot take a shared lock"), "{a}");
                    }
                }
                if p.kind() == Kind::Config {
                    prop_assert_eq!(a.kind(), Kind::Usage, "{}", a);
                } else {
                    prop_assert_eq!((p.kind(), a.kind()), (Kind::Usage, Kind::Usage));
                }
            }
            _ => prop_assert!(false, "profile {by_profile:?}\naddress {by_address:?}\n{text}\n{address}"),
        }
    }
}
