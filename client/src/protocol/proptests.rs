//! Property-based fuzzing of the pipe-protocol reader (issue 5, item 3): [`read_line`] on
//! arbitrary bytes through buffers of every small size, and [`parse`] on arbitrary strings,
//! on lines built from the protocol's own words plus junk, and on the helper's real `OK`,
//! `ERROR` and `LOST` lines, which must come back field for field.
//!
//! Properties: nothing panics; every rejection is a typed error (`Protocol` for what the
//! helper said, never anything else) with a non-empty message; an accepted line satisfies
//! the grammar in the module docs; real lines round-trip (`OK name backend=x mode=exclusive
//! token=N` yields token N), and so do lines whose profile field is a lock address with `?`,
//! `=`, `:` and `%20` in it (SPEC §3a, issue 25: the first word after `OK` is always the
//! profile field), and semaphore lines (`slot=K slots=N`, per lock for a set, SPEC §3b).
//!
//! Bounded pass: 512 cases for each of the 9 properties (4,608 inputs, about 1.5 s in a debug
//! build). Failures are not persisted (`failure_persistence: None`): nothing is written to
//! the tree.

use std::io::BufReader;

use proptest::prelude::*;
use proptest::sample::select;

use super::*;

const CASES: u32 = 512;

/// `CASES` per property; `PROPTEST_CASES=N` asks for a longer pass by hand.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok());
    ProptestConfig {
        cases: cases.unwrap_or(CASES),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

const KINDS: &[&str] = &[
    "usage",
    "unavailable",
    "lost",
    "io",
    "busy",
    "denied",
    "config",
];

/// Protocol words, near misses, separators and junk.
const WORDS: &[&str] = &[
    "OK",
    "ERROR",
    "LOST",
    "ok",
    "Ok",
    "OKAY",
    "Error",
    "ERRORS",
    "LOSTX",
    "demo",
    "a.b_c-1",
    "backend=",
    "backend=flock",
    "backend=mkdir",
    "mode=exclusive",
    "mode=shared",
    "mode=",
    "mode=sideways",
    "token=",
    "token=0",
    "token=7",
    "token=-1",
    "token=18446744073709551615",
    "token=18446744073709551616",
    "token=+1",
    "prev=crashed",
    "since=2025-01-01T00:00:00Z",
    "=",
    "==",
    "=x",
    "x=y=z",
    ":",
    "::",
    "busy:",
    "config:",
    "usage:",
    "weird:",
    "spawn:",
    "protocol:",
    " ",
    "  ",
    "\t",
    "\r",
    "\x0b",
    "\x0c",
    "\u{a0}",
    "\u{2028}",
    "é",
    "😀",
    "\0",
];

fn field_value() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        3 => select(vec![
            "flock", "mkdir", "exclusive", "shared", "sideways", "crashed", "0", "7", "-1", "+1",
            "18446744073709551615", "18446744073709551616", "1.5", "=", "x=y", "é",
            "2", "flock,mkdir", "4,9", "4,", ",", "exclusive,shared",
        ]),
        1 => Just(""),
    ]
}

/// A field of an `OK` line: real keys and values, near misses, junk.
fn field() -> impl Strategy<Value = String> {
    let key = select(vec![
        "backend", "mode", "token", "prev", "since", "host", "", "x", "é", "locks", "slot", "slots",
    ]);
    prop_oneof![
        6 => (key, select(vec!["=", "=", "=", "==", ""]), field_value())
            .prop_map(|(k, e, v)| format!("{k}{e}{v}")),
        3 => select(WORDS.to_vec()).prop_map(str::to_owned),
        1 => select(KINDS.to_vec()).prop_map(|k| format!("{k}:")),
        1 => ".{0,4}",
    ]
}

/// What to do to one word of a valid line.
#[derive(Clone, Debug)]
enum Mutation {
    /// The value of a `key=value` word.
    SetValue(prop::sample::Index, &'static str),
    Replace(prop::sample::Index, String),
    Insert(prop::sample::Index, String),
    Remove(prop::sample::Index),
    Duplicate(prop::sample::Index),
}

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    let m = prop_oneof![
        3 => (any::<prop::sample::Index>(), field_value()).prop_map(|(i, v)| Mutation::SetValue(i, v)),
        3 => (any::<prop::sample::Index>(), field()).prop_map(|(i, f)| Mutation::Replace(i, f)),
        2 => (any::<prop::sample::Index>(), field()).prop_map(|(i, f)| Mutation::Insert(i, f)),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Remove),
        1 => any::<prop::sample::Index>().prop_map(Mutation::Duplicate),
    ];
    prop::collection::vec(m, 0..3)
}

/// Lines shaped like the protocol's: real `OK` and `ERROR` lines with up to two words
/// replaced, inserted, removed or repeated, and free soup of the protocol's words, joined by
/// whitespace of every ASCII kind and some that is not ASCII.
fn soup() -> impl Strategy<Value = String> {
    let error = (
        select(KINDS.to_vec()),
        select(vec![": ", ":", " : ", " ", ": :"]),
        "[^\n]{0,12}",
    )
        .prop_map(|(k, colon, m)| format!("ERROR {k}{colon}{m}"));
    let valid = prop_oneof![
        3 => ok_spec().prop_map(|s| s.render().trim_end_matches('\n').to_owned()),
        1 => error,
        1 => "LOST [^\n]{0,12}",
    ];
    let sep = prop_oneof![
        8 => Just(" ".to_owned()),
        2 => select(vec!["\t", "  ", "\r", "\x0b", "\x0c", "\u{a0}", ""]).prop_map(str::to_owned),
    ];
    let near = (valid, mutations(), prop::collection::vec(sep.clone(), 12)).prop_map(
        |(line, mutations, seps)| {
            let mut words: Vec<String> = line.split(' ').map(str::to_owned).collect();
            for m in mutations {
                let n = words.len();
                match m {
                    Mutation::SetValue(i, v) if n > 0 => {
                        let w = &mut words[i.index(n)];
                        if let Some((k, _)) = w.split_once('=') {
                            *w = format!("{k}={v}");
                        }
                    }
                    Mutation::Replace(i, f) if n > 0 => words[i.index(n)] = f,
                    Mutation::Insert(i, f) => words.insert(i.index(n + 1), f),
                    Mutation::Remove(i) if n > 0 => {
                        words.remove(i.index(n));
                    }
                    Mutation::Duplicate(i) if n > 0 => {
                        let w = words[i.index(n)].clone();
                        words.insert(i.index(n), w);
                    }
                    _ => {}
                }
            }
            let mut line = String::new();
            for (i, w) in words.iter().enumerate() {
                if i > 0 {
                    line.push_str(&seps[i % seps.len()]);
                }
                line.push_str(w);
            }
            line
        },
    );
    let free = (
        select(vec!["OK", "ERROR", "LOST", "ok", "OKAY", ""]),
        prop::collection::vec((sep, field()), 0..8),
    )
        .prop_map(|(first, fields)| {
            let mut line = first.to_owned();
            for (sep, field) in fields {
                line.push_str(&sep);
                line.push_str(&field);
            }
            line
        });
    prop_oneof![3 => near, 1 => free]
}

/// Whatever `parse` says about `line` is consistent with the grammar.
fn check_parse(line: &str) -> Result<(), TestCaseError> {
    match parse(line) {
        Err(e) => {
            prop_assert_eq!(e.kind(), ErrorKind::Protocol, "{} for {:?}", e, line);
            prop_assert!(!e.message().trim().is_empty());
            prop_assert!(e.exit_code().is_none());
        }
        Ok(Line::Ok(ok)) => {
            prop_assert!(line.starts_with("OK"));
            prop_assert_eq!(ok.raw(), line);
            // The first word after `OK`, whatever it holds (an address's `?k=v` included).
            let p = ok.profile();
            prop_assert!(!p.is_empty() && !p.contains(|c: char| c.is_ascii_whitespace()));
            let words: Vec<&str> = line.split_ascii_whitespace().collect();
            prop_assert_eq!(words.get(1).copied(), Some(p));
            prop_assert_eq!(ok.fields.len(), words.len() - 2);
            prop_assert!(!ok.backend().is_empty());
            prop_assert!(matches!(
                ok.get("mode"),
                None | Some("exclusive" | "shared")
            ));
            match ok.get("locks") {
                // One lock: the line as it always was.
                None => {
                    prop_assert_eq!(ok.locks().len(), 1);
                    prop_assert_eq!(
                        ok.token(),
                        ok.get("token").map(|t| t.parse::<u64>().unwrap())
                    );
                    prop_assert_eq!(ok.shared(), ok.get("mode") == Some("shared"));
                }
                // Several (SPEC §3b): N values each, and no single token for the set.
                Some(n) => {
                    let n: usize = n.parse().unwrap();
                    prop_assert_eq!(ok.locks().len(), n);
                    prop_assert_eq!(ok.backend().split(',').count(), n);
                    if n > 1 {
                        prop_assert_eq!(ok.token(), None);
                    }
                }
            }
            // Semaphores (SPEC §3b): a slot with its number of slots, below it; no single
            // slot for a set.
            for l in ok.locks() {
                match (l.slot, l.slots) {
                    (None, None) => {}
                    (Some(k), Some(n)) => prop_assert!(k < n),
                    other => prop_assert!(false, "slot/slots {:?} for {:?}", other, line),
                }
            }
            if ok.locks().len() > 1 {
                prop_assert_eq!(ok.slot(), None);
            }
            for (i, (k, v)) in ok.fields.iter().enumerate() {
                prop_assert!(!k.is_empty() && !k.contains('='));
                prop_assert!(ok.fields[..i].iter().all(|(k2, _)| k2 != k), "{} twice", k);
                prop_assert!(!(k.clone() + v).contains(|c: char| c.is_ascii_whitespace()));
            }
        }
        Ok(Line::Error {
            kind,
            word,
            message,
        }) => {
            prop_assert!(line.starts_with("ERROR"));
            prop_assert!(!word.is_empty() && !word.contains(':'));
            prop_assert_eq!(word.trim_ascii(), word.as_str());
            prop_assert_eq!(message.trim_ascii(), message.as_str());
            prop_assert_eq!(kind, ErrorKind::from_word(&word));
        }
        Ok(Line::Lost { reason }) => {
            prop_assert!(line.starts_with("LOST"));
            prop_assert_eq!(reason.trim_ascii(), reason.as_str());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_lines_are_parsed_or_rejected_cleanly(line in any::<String>()) {
        check_parse(&line)?;
    }

    #[test]
    fn lines_of_protocol_words_and_junk_are_parsed_or_rejected_cleanly(line in soup()) {
        check_parse(&line)?;
    }

    /// `read_line` splits any byte stream into exactly its lines, whatever the buffer size,
    /// and ends in `None` (clean end) or a typed error (a cut or non-UTF-8 line).
    #[test]
    fn read_line_splits_any_bytes_exactly(
        bytes in prop::collection::vec(
            prop_oneof![
                4 => any::<u8>(),
                1 => Just(b'\n'),
                1 => Just(b'\r'),
                1 => select(vec![b'O', b'K', b' ', 0xC3, 0xA9, 0xFF]),
            ],
            0..200,
        ),
        capacity in 1usize..16,
    ) {
        let mut reader = BufReader::with_capacity(capacity, &bytes[..]);
        let mut rest: &[u8] = &bytes;
        // Each call consumes at least one byte, so this ends.
        for _ in 0..=bytes.len() {
            match read_line(&mut reader) {
                Ok(None) => {
                    prop_assert!(rest.is_empty());
                    break;
                }
                Ok(Some(line)) => {
                    let n = line.len();
                    prop_assert_eq!(line.as_bytes(), &rest[..n]);
                    prop_assert_eq!(rest[n], b'\n');
                    rest = &rest[n + 1..];
                    check_parse(&line)?;
                }
                Err(e) => {
                    prop_assert_eq!(e.kind(), ErrorKind::Protocol);
                    prop_assert!(!e.message().is_empty());
                    let end = rest.iter().position(|&b| b == b'\n');
                    match end {
                        // A complete line that is not UTF-8.
                        Some(n) => {
                            prop_assert!(std::str::from_utf8(&rest[..n]).is_err());
                            prop_assert!(e.message().contains("not UTF-8"), "{}", e);
                            rest = &rest[n + 1..];
                        }
                        // The stream ends inside a line: nothing more to read.
                        None => {
                            prop_assert!(e.message().contains("middle of a line"), "{}", e);
                            prop_assert!(read_line(&mut reader).unwrap().is_none());
                            break;
                        }
                    }
                }
            }
        }
    }

    /// Lines around the length cap: accepted up to MAX_LINE bytes with the newline, a
    /// protocol error beyond.
    #[test]
    fn read_line_enforces_the_cap_exactly(extra in -3i64..=3, fill in select(vec![b'x', b' ', b'=', 0xC3])) {
        let len = (MAX_LINE as i64 + extra - 1) as usize; // without the newline
        let mut bytes = vec![fill; len];
        if fill == 0xC3 {
            // Valid UTF-8: pairs of "é".
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = if i % 2 == 0 { 0xC3 } else { 0xA9 };
            }
        }
        bytes.push(b'\n');
        let got = read_line(&mut &bytes[..]);
        let utf8 = std::str::from_utf8(&bytes[..len]).is_ok();
        // len bytes and the newline fit in MAX_LINE.
        if (len as u64) < MAX_LINE && utf8 {
            prop_assert_eq!(got.unwrap().map(|l| l.len()), Some(len));
        } else {
            let e = got.unwrap_err();
            prop_assert_eq!(e.kind(), ErrorKind::Protocol);
        }
    }
}

/// Whitespace between fields: what the helper writes (one space) and what a parent
/// should tolerate (several, tabs).
fn sep() -> impl Strategy<Value = String> {
    prop_oneof![4 => Just(" ".to_owned()), 1 => "[ \t]{1,3}"]
}

/// A word without ASCII whitespace, as the helper's values are (SPEC §4).
fn value() -> impl Strategy<Value = String> {
    "[^ \t\n\x0C\r]{0,12}"
}

/// A lock address as the helper echoes it in the `OK` line's profile field (SPEC §3a: the
/// address as given, spaces written `%20`): a scheme or a bare path, a path or authority
/// with `:`, `%20` and `=` in it, and often a query, `?k=v&k=v`, whose values hold `=`,
/// `:`, `?` and `%20` too.
fn address() -> impl Strategy<Value = String> {
    let scheme = select(vec![
        "mkdir:",
        "flock:",
        "link:",
        "symlink:",
        "postgres://",
        "postgresql://",
        "ftp://",
        "ftps://",
        "etcd://",
        "s3://",
        "redis://",
        "/",
        "./",
    ]);
    let part = prop_oneof![
        4 => select(vec![
            "tmp", "a", "x.lock", "/", "%20", ":", "=", "db.example:5432", "h:2379,h2:2379",
            "app", "locks", "%2F", "a%20b", "x=y", "é", "@", "-", "_",
        ])
        .prop_map(str::to_owned),
        1 => "[A-Za-z0-9._%:=/@-]{1,6}",
    ];
    let key = select(vec![
        "lock",
        "stale_after",
        "wait",
        "shared",
        "slots",
        "fair",
        "key",
        "endpoint",
        "region",
        "tls",
        "password_env",
        "ca_file",
        "",
        "k",
    ]);
    let val = prop_oneof![
        4 => select(vec![
            "30s", "0", "true", "py", "3", "implicit", "http://127.0.0.1:9000", "/etc/ca.pem",
            "a%20b", "x=y", "==", "?", ":", "", "PGPASS",
        ])
        .prop_map(str::to_owned),
        1 => "[A-Za-z0-9._%:=?/-]{0,6}",
    ];
    let query = prop::option::of((
        select(vec!["?", "?", "?", "??", "?&"]),
        prop::collection::vec((key, select(vec!["=", "=", "=", "", "=="]), val), 0..4),
    ))
    .prop_map(|q| match q {
        None => String::new(),
        Some((mark, pairs)) => {
            let pairs: Vec<String> = pairs
                .into_iter()
                .map(|(k, eq, v)| format!("{k}{eq}{v}"))
                .collect();
            format!("{mark}{}", pairs.join("&"))
        }
    });
    (scheme, prop::collection::vec(part, 1..5), query)
        .prop_map(|(scheme, parts, query)| format!("{scheme}{}{query}", parts.concat()))
}

/// One lock of a generated set: backend, shared, token, (slot, slots) of a semaphore.
type SetLock = (String, bool, Option<u64>, Option<(u32, u32)>);

/// A semaphore's `(slot, slots)`: 1 to 1024 slots, the slot below that (SPEC §3b).
fn slot_pair() -> impl Strategy<Value = (u32, u32)> {
    (1u32..=1024).prop_flat_map(|n| (0..n, Just(n)))
}

#[derive(Clone, Debug)]
struct OkSpec {
    profile: String,
    backend: String,
    mode: Option<&'static str>,
    token: Option<u64>,
    prev_crashed: bool,
    /// A semaphore's `slot=K slots=N`.
    slot: Option<(u32, u32)>,
    extra: Vec<(String, String)>,
    seps: Vec<String>,
    trailing: &'static str,
}

fn ok_spec() -> impl Strategy<Value = OkSpec> {
    (
        // A profile's name, or a lock address (issue 25: `?` and `=` in it).
        prop_oneof![1 => "[A-Za-z0-9._-]{1,64}", 1 => address()],
        "[a-z]{1,8}",
        prop::option::of(select(vec!["exclusive", "shared"])),
        prop::option::of(any::<u64>()),
        any::<bool>(),
        prop::option::of(slot_pair()),
        prop::collection::btree_map("[a-z_][a-z0-9_.-]{0,8}", value(), 0..4),
        prop::collection::vec(sep(), 8),
        select(vec!["", " ", "\r", " \r", "\t"]),
    )
        .prop_map(
            |(profile, backend, mode, token, prev_crashed, slot, extra, seps, trailing)| OkSpec {
                profile,
                backend,
                mode,
                token,
                prev_crashed,
                slot,
                extra: extra
                    .into_iter()
                    .filter(|(k, _)| {
                        !["backend", "mode", "token", "prev", "locks", "slot", "slots"]
                            .contains(&k.as_str())
                    })
                    .collect(),
                seps,
                trailing,
            },
        )
}

impl OkSpec {
    /// The line as the helper writes it (SPEC §4 order: backend, mode, token, prev,
    /// others), with the generated separators, newline included.
    fn render(&self) -> String {
        let mut fields = vec![format!("backend={}", self.backend)];
        if let Some(m) = self.mode {
            fields.push(format!("mode={m}"));
        }
        if let Some(t) = self.token {
            fields.push(format!("token={t}"));
        }
        if self.prev_crashed {
            fields.push("prev=crashed".to_owned());
        }
        if let Some((k, n)) = self.slot {
            fields.push(format!("slot={k}"));
            fields.push(format!("slots={n}"));
        }
        fields.extend(self.extra.iter().map(|(k, v)| format!("{k}={v}")));
        let mut line = format!("OK{}{}", self.seps[0], self.profile);
        for (i, f) in fields.iter().enumerate() {
            line.push_str(&self.seps[(i + 1) % self.seps.len()]);
            line.push_str(f);
        }
        line.push_str(self.trailing);
        line.push('\n');
        line
    }
}

proptest! {
    #![proptest_config(config())]

    /// `OK <profile> backend=x mode=m token=N prev=crashed k=v...` yields every field; the
    /// profile is a name or a lock address (with `?`, `=`, `:`, `%20`).
    #[test]
    fn ok_lines_round_trip(spec in ok_spec()) {
        let text = spec.render();
        let line = read_line(&mut text.as_bytes()).unwrap().unwrap();
        prop_assert_eq!(format!("{line}\n"), text.clone());
        let Ok(Line::Ok(ok)) = parse(&line) else {
            return Err(TestCaseError::fail(format!("{text:?} parsed as {:?}", parse(&line))));
        };
        prop_assert_eq!(ok.raw(), line.as_str());
        prop_assert_eq!(ok.profile(), spec.profile.as_str());
        prop_assert_eq!(ok.backend(), spec.backend.as_str());
        prop_assert_eq!(ok.token(), spec.token);
        prop_assert_eq!(ok.shared(), spec.mode == Some("shared"));
        prop_assert_eq!(ok.get("mode"), spec.mode);
        prop_assert_eq!(ok.prev_crashed(), spec.prev_crashed);
        prop_assert_eq!(ok.slot(), spec.slot.map(|p| p.0));
        prop_assert_eq!(ok.slot_count(), spec.slot.map(|p| p.1));
        for (k, v) in &spec.extra {
            prop_assert_eq!(ok.get(k), Some(v.as_str()));
        }
        // Nothing but the fields the helper wrote: the address's query is not read as one.
        let expected = 1
            + usize::from(spec.mode.is_some())
            + usize::from(spec.token.is_some())
            + usize::from(spec.prev_crashed)
            + 2 * usize::from(spec.slot.is_some())
            + spec.extra.len();
        prop_assert_eq!(ok.fields.len(), expected);
    }

    /// Whatever the tag, the helper's profile field for it (`shown_tag`) is one word that
    /// parses back as the profile: what the guard compares the `OK` line against.
    #[test]
    fn shown_tag_is_one_word_that_parses_back(tag in prop_oneof![
        2 => address().prop_map(|a| a.replace("%20", " ")),
        1 => "[^\n]{1,20}",
    ]) {
        let shown = shown_tag(&tag);
        prop_assert!(!shown.contains(|c: char| c.is_whitespace() || c.is_control()));
        let line = format!("OK {shown} backend=mkdir");
        let Ok(Line::Ok(ok)) = parse(&line) else {
            return Err(TestCaseError::fail(format!("{line:?} parsed as {:?}", parse(&line))));
        };
        prop_assert_eq!(ok.profile(), &*shown);
        if !tag.contains(|c: char| c.is_whitespace() || c.is_control()) {
            prop_assert_eq!(&*shown, tag.as_str());
        }
    }

    /// An address-shaped profile field, the issue-25 case on its own: every generated
    /// address comes back as the profile, with the helper's usual fields after it.
    #[test]
    fn ok_lines_naming_an_address_round_trip(addr in address(), token in any::<u64>()) {
        let line = format!("OK {addr} backend=mkdir mode=exclusive token={token}");
        let Ok(Line::Ok(ok)) = parse(&line) else {
            return Err(TestCaseError::fail(format!("{line:?} parsed as {:?}", parse(&line))));
        };
        prop_assert_eq!(ok.profile(), addr.as_str());
        prop_assert_eq!(ok.backend(), "mkdir");
        prop_assert_eq!(ok.token(), Some(token));
        prop_assert_eq!(ok.fields.len(), 3);
    }

    /// Several locks (SPEC §3b), as the helper writes them: each lock's backend, mode, token
    /// and semaphore slot come back in order, an empty token or slot place as `None`, and no
    /// single token or slot.
    #[test]
    fn ok_lines_for_several_locks_round_trip(
        profile in prop_oneof![1 => "[A-Za-z0-9._-]{1,64}", 1 => address()],
        locks in prop::collection::vec(
            (
                "[a-z]{1,8}",
                any::<bool>(),
                prop::option::of(any::<u64>()),
                prop::option::of(slot_pair()),
            ),
            2..6,
        ),
    ) {
        let join = |f: &dyn Fn(&SetLock) -> String| {
            locks.iter().map(f).collect::<Vec<_>>().join(",")
        };
        let mut line = format!(
            "OK {profile} backend={} mode={}",
            join(&|l| l.0.clone()),
            join(&|l| if l.1 { "shared" } else { "exclusive" }.to_owned()),
        );
        if locks.iter().any(|l| l.2.is_some()) {
            line.push_str(&format!(" token={}", join(&|l| l.2.map(|t| t.to_string()).unwrap_or_default())));
        }
        if locks.iter().any(|l| l.3.is_some()) {
            line.push_str(&format!(" slot={}", join(&|l| l.3.map(|p| p.0.to_string()).unwrap_or_default())));
            line.push_str(&format!(" slots={}", join(&|l| l.3.map(|p| p.1.to_string()).unwrap_or_default())));
        }
        line.push_str(&format!(" locks={}", locks.len()));
        let Ok(Line::Ok(ok)) = parse(&line) else {
            return Err(TestCaseError::fail(format!("{line:?} parsed as {:?}", parse(&line))));
        };
        prop_assert_eq!(ok.profile(), profile.as_str());
        let got: Vec<SetLock> = ok
            .locks()
            .iter()
            .map(|l| (l.backend.clone(), l.shared, l.token, l.slot.zip(l.slots)))
            .collect();
        prop_assert_eq!(&got, &locks);
        prop_assert!(ok.locks().iter().all(|l| l.slot.is_some() == l.slots.is_some()));
        prop_assert_eq!(ok.token(), None);
        prop_assert_eq!(ok.slot(), None);
        prop_assert_eq!(ok.shared(), locks.iter().all(|l| l.1));
    }

    /// `ERROR <kind>: <message>` yields the kind (a known word, or none for an unknown one)
    /// and the message as written; `LOST <reason>` yields the reason.
    #[test]
    fn error_and_lost_lines_round_trip(
        word in prop_oneof![
            4 => select(KINDS.to_vec()).prop_map(str::to_owned),
            1 => "[a-z]{1,10}",
        ],
        message in "[^\n]{0,40}",
        sep in sep(),
        lost in any::<bool>(),
    ) {
        if lost {
            let line = format!("LOST{sep}{message}");
            prop_assert_eq!(
                parse(&line).unwrap(),
                Line::Lost { reason: message.trim_ascii().to_owned() }
            );
        } else {
            let line = format!("ERROR{sep}{word}: {message}");
            prop_assert_eq!(
                parse(&line).unwrap(),
                Line::Error {
                    kind: ErrorKind::from_word(&word),
                    word: word.clone(),
                    message: message.trim_ascii().to_owned(),
                }
            );
            if KINDS.contains(&word.as_str()) {
                prop_assert!(ErrorKind::from_word(&word).is_some());
            }
        }
    }
}
