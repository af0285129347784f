//! The reader side of the pipe protocol (SPEC §4): reading one line from the helper's
//! stdout and parsing `OK`, `ERROR` and `LOST` lines.
//!
//! The grammar, as this module accepts it (fields are separated by ASCII whitespace, so a
//! stray trailing space or `\r` does not break a parent):
//!
//! ```text
//! OK <profile> key=value ...      <profile>: the first word, always (a name, or a lock
//!                                 address such as `mkdir:/x?stale_after=30s`, `=` and all);
//!                                 backend= required; token= a u64; mode= exclusive|shared
//!                                 With locks=N (several locks, SPEC §3b): backend=, mode=
//!                                 and token= hold N comma-separated values, one per lock
//!                                 in the order named; a token may be empty (that lock
//!                                 keeps none); <profile> is the first lock named
//!                                 slot=K slots=N (a semaphore, SPEC §3b): both or neither,
//!                                 K < N; for several locks one value each, both empty for
//!                                 a lock of one slot
//! ERROR <kind>: <message>         kind: usage unavailable lost io busy denied config
//! LOST [<reason>]                 only after OK
//! ```
//!
//! Anything else is a [`Protocol`](ErrorKind::Protocol) error.

use std::borrow::Cow;
use std::io::{self, BufRead, Read};

use crate::error::{Error, ErrorKind};

/// Longest line accepted from the helper, newline included. A real `OK` line is a few
/// hundred bytes; the cap keeps a wrong program from making us buffer without end.
pub(crate) const MAX_LINE: u64 = 64 * 1024;

/// One parsed line from the helper.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Line {
    /// `OK <profile> key=value ...`: the lock is held.
    Ok(OkLine),
    /// `ERROR <kind>: <message>`. `kind` is `None` for a word this crate does not know
    /// (the caller then falls back on the exit code); `word` keeps it as written.
    Error {
        kind: Option<ErrorKind>,
        word: String,
        message: String,
    },
    /// `LOST <reason>`: the lock was lost while held.
    Lost { reason: String },
}

/// The fields of an `OK` line.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OkLine {
    /// The whole line, without its newline.
    raw: String,
    profile: String,
    /// `key=value` pairs in the order the helper wrote them.
    fields: Vec<(String, String)>,
    /// One entry per lock held (`locks=N`, else 1), in the order the locks were named.
    locks: Vec<Held>,
}

/// What the `OK` line says about one lock of the set.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) backend: String,
    pub(crate) shared: bool,
    pub(crate) token: Option<u64>,
    /// `slot=K`: the semaphore slot held (0-based), for a lock of more than one slot.
    pub(crate) slot: Option<u32>,
    /// `slots=N`: that lock's number of slots, with `slot`.
    pub(crate) slots: Option<u32>,
}

impl OkLine {
    pub(crate) fn raw(&self) -> &str {
        &self.raw
    }

    pub(crate) fn profile(&self) -> &str {
        &self.profile
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `backend=` as written (comma-separated for several locks); [`parse`] guarantees it is
    /// present.
    pub(crate) fn backend(&self) -> &str {
        self.get("backend").unwrap_or_default()
    }

    /// The locks held, one entry each (at least one), in the order they were named.
    pub(crate) fn locks(&self) -> &[Held] {
        &self.locks
    }

    /// The token of a single lock; `None` for several (see [`OkLine::locks`]).
    pub(crate) fn token(&self) -> Option<u64> {
        match self.locks.as_slice() {
            [one] => one.token,
            _ => None,
        }
    }

    /// The slot of a single lock; `None` for several, or for a lock of one slot.
    pub(crate) fn slot(&self) -> Option<u32> {
        match self.locks.as_slice() {
            [one] => one.slot,
            _ => None,
        }
    }

    /// The number of slots of a single lock (`slots=N`); `None` as for [`OkLine::slot`].
    pub(crate) fn slot_count(&self) -> Option<u32> {
        match self.locks.as_slice() {
            [one] => one.slots,
            _ => None,
        }
    }

    /// Whether every lock held is shared (`mode=shared`).
    pub(crate) fn shared(&self) -> bool {
        self.locks.iter().all(|l| l.shared)
    }

    pub(crate) fn prev_crashed(&self) -> bool {
        self.get("prev") == Some("crashed")
    }
}

/// Reads one `\n`-terminated line of at most [`MAX_LINE`] bytes and returns it without
/// the newline. `Ok(None)` means end-of-file before any byte.
///
/// A line cut short by end-of-file, a line over the cap and a line that is not UTF-8 are
/// [`Protocol`](ErrorKind::Protocol) errors; a failing `read(2)` is an
/// [`Io`](ErrorKind::Io) error.
pub(crate) fn read_line<R: BufRead>(reader: &mut R) -> Result<Option<String>, Error> {
    let mut buf = Vec::new();
    // `read_until` retries on EINTR.
    let n = reader
        .by_ref()
        .take(MAX_LINE)
        .read_until(b'\n', &mut buf)
        .map_err(|e| io_error(&e))?;
    if n == 0 {
        return Ok(None);
    }
    if buf.pop() != Some(b'\n') {
        let why = if n as u64 >= MAX_LINE {
            format!("helper wrote a line longer than {MAX_LINE} bytes")
        } else {
            format!(
                "helper's stdout ended in the middle of a line: {:?}",
                String::from_utf8_lossy(&buf)
            )
        };
        return Err(Error::new(ErrorKind::Protocol, why));
    }
    String::from_utf8(buf).map(Some).map_err(|e| {
        Error::new(
            ErrorKind::Protocol,
            format!(
                "helper wrote a line that is not UTF-8: {:?}",
                String::from_utf8_lossy(e.as_bytes())
            ),
        )
    })
}

fn io_error(err: &io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("reading the helper's stdout: {err}"))
}

/// The `OK` line's profile field for `tag`, as the helper writes it (SPEC §3a): the tag as
/// given, with each whitespace or control character written `%XX` per UTF-8 byte (a space is
/// `%20`), so that it stays one word.
pub(crate) fn shown_tag(tag: &str) -> Cow<'_, str> {
    let escaped = |c: char| c.is_whitespace() || c.is_control();
    if !tag.contains(escaped) {
        return Cow::Borrowed(tag);
    }
    let mut out = String::with_capacity(tag.len() + 8);
    for c in tag.chars() {
        if escaped(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Parses one line (without its newline).
pub(crate) fn parse(line: &str) -> Result<Line, Error> {
    let bad = |why: &str| {
        Error::new(
            ErrorKind::Protocol,
            format!("unexpected line from helper ({why}): {line:?}"),
        )
    };
    let (first, rest) = match line.split_once(|c: char| c.is_ascii_whitespace()) {
        Some((first, rest)) => (first, rest.trim_ascii()),
        None => (line, ""),
    };
    match first {
        "OK" => parse_ok(line, rest).map_err(|why| bad(&why)),
        "ERROR" => {
            let Some((word, message)) = rest.split_once(':') else {
                return Err(bad("ERROR without `<kind>:`"));
            };
            let word = word.trim_ascii();
            if word.is_empty() {
                return Err(bad("ERROR with an empty kind"));
            }
            Ok(Line::Error {
                kind: ErrorKind::from_word(word),
                word: word.to_owned(),
                message: message.trim_ascii().to_owned(),
            })
        }
        "LOST" => Ok(Line::Lost {
            reason: rest.to_owned(),
        }),
        _ => Err(bad("expected OK, ERROR or LOST")),
    }
}

fn parse_ok(line: &str, rest: &str) -> Result<Line, String> {
    let mut words = rest.split_ascii_whitespace();
    // The first word is always the profile field (SPEC §4), whatever it holds: for a lock
    // address it is the address as given (SPEC §3a), `?k=v&...` included.
    let Some(profile) = words.next().map(str::to_owned) else {
        return Err("OK without a profile name".into());
    };
    let mut fields: Vec<(String, String)> = Vec::new();
    for word in words {
        let Some((key, value)) = word.split_once('=') else {
            return Err(format!("`{word}` is not key=value"));
        };
        if key.is_empty() {
            return Err(format!("`{word}` has an empty key"));
        }
        if fields.iter().any(|(k, _)| k == key) {
            return Err(format!("`{key}=` appears twice"));
        }
        fields.push((key.to_owned(), value.to_owned()));
    }
    let get = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    // One lock unless `locks=N` says more (SPEC §3b); then each of backend=, mode= and
    // token= has N comma-separated values.
    let n = match get("locks") {
        None => None,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n >= 1 && v.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(format!("locks={v} is not a positive integer")),
        },
    };
    let each = |key: &str, value: &str| -> Result<Vec<String>, String> {
        let parts: Vec<String> = match n {
            None => vec![value.to_owned()],
            Some(_) => value.split(',').map(str::to_owned).collect(),
        };
        match n {
            Some(n) if parts.len() != n => Err(format!(
                "{key}={value} has {} values for locks={n}",
                parts.len()
            )),
            _ => Ok(parts),
        }
    };
    let backends = match get("backend") {
        Some(b) if !b.is_empty() => each("backend", b)?,
        _ => return Err("OK without backend=".into()),
    };
    if backends.iter().any(String::is_empty) {
        return Err("backend= with an empty value".into());
    }
    let count = backends.len();
    let modes = match get("mode") {
        None => vec![String::from("exclusive"); count],
        Some(m) => each("mode", m)?,
    };
    if let Some(other) = modes
        .iter()
        .find(|m| !matches!(m.as_str(), "exclusive" | "shared"))
    {
        return Err(format!("mode={other} is neither exclusive nor shared"));
    }
    let tokens = match get("token") {
        None => vec![None; count],
        Some(t) => {
            let parts = each("token", t)?;
            let mut tokens = Vec::with_capacity(count);
            for part in parts {
                // Several locks: a lock without a token leaves its place empty.
                if part.is_empty() && n.is_some() {
                    tokens.push(None);
                    continue;
                }
                tokens.push(Some(part.parse::<u64>().map_err(|_| {
                    format!("token={t} is not an unsigned 64-bit integer")
                })?));
            }
            tokens
        }
    };
    // Semaphores (SPEC §3b): `slot=K slots=N`, one value per lock, both empty for a lock of
    // one slot.
    let numbers = |key: &str| -> Result<Vec<Option<u32>>, String> {
        let Some(v) = get(key) else {
            return Ok(vec![None; count]);
        };
        each(key, v)?
            .into_iter()
            .map(|part| match part.as_str() {
                "" if n.is_some() => Ok(None),
                p if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p
                    .parse::<u32>()
                    .map(Some)
                    .map_err(|_| format!("{key}={v} is out of range")),
                _ => Err(format!("{key}={v} is not a number")),
            })
            .collect()
    };
    let (slot, slots) = (numbers("slot")?, numbers("slots")?);
    for (k, n) in slot.iter().zip(&slots) {
        match (k, n) {
            (None, None) => {}
            (Some(k), Some(n)) if k < n => {}
            _ => {
                return Err(format!(
                    "slot={} slots={}: a slot needs its number of slots, and below it",
                    get("slot").unwrap_or_default(),
                    get("slots").unwrap_or_default()
                ));
            }
        }
    }
    let locks = backends
        .into_iter()
        .zip(modes)
        .zip(tokens)
        .zip(slot.into_iter().zip(slots))
        .map(|(((backend, mode), token), (slot, slots))| Held {
            backend,
            shared: mode == "shared",
            token,
            slot,
            slots,
        })
        .collect();
    Ok(Line::Ok(OkLine {
        raw: line.to_owned(),
        profile,
        fields,
        locks,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> OkLine {
        match parse(line) {
            Ok(Line::Ok(ok)) => ok,
            other => panic!("{line:?} parsed as {other:?}"),
        }
    }

    fn protocol_error(line: &str) -> String {
        match parse(line) {
            Err(e) if e.kind() == ErrorKind::Protocol => e.message().to_owned(),
            other => panic!("{line:?} should be a protocol error, got {other:?}"),
        }
    }

    #[test]
    fn ok_with_token() {
        let line = "OK deploy backend=etcd mode=exclusive token=18446744073709551615 \
                    since=2025-01-02T03:04:05Z";
        let ok = ok(line);
        assert_eq!(ok.raw(), line);
        assert_eq!(ok.profile(), "deploy");
        assert_eq!(ok.backend(), "etcd");
        assert_eq!(ok.token(), Some(u64::MAX));
        assert!(!ok.shared());
        assert!(!ok.prev_crashed());
        assert_eq!(ok.get("since"), Some("2025-01-02T03:04:05Z"));
        assert_eq!(ok.get("nope"), None);
    }

    #[test]
    fn ok_without_token() {
        let ok = ok("OK counter backend=flock mode=shared");
        assert_eq!(ok.profile(), "counter");
        assert_eq!(ok.backend(), "flock");
        assert_eq!(ok.token(), None);
        assert!(ok.shared());
    }

    #[test]
    fn ok_prev_crashed_and_minimal() {
        let ok1 = ok("OK config backend=mkdir mode=exclusive token=7 prev=crashed");
        assert!(ok1.prev_crashed());
        assert_eq!(ok1.token(), Some(7));
        // `mode` is optional: an OK line with only backend= is exclusive.
        let ok2 = ok("OK a.b_c-1 backend=link");
        assert!(!ok2.shared());
        assert_eq!(ok2.profile(), "a.b_c-1");
        // Empty values are allowed.
        assert_eq!(ok("OK x backend=flock note=").get("note"), Some(""));
    }

    #[test]
    fn ok_tolerates_extra_whitespace() {
        let ok = ok("OK  demo  backend=flock token=3 \r");
        assert_eq!(ok.profile(), "demo");
        assert_eq!(ok.token(), Some(3));
    }

    /// SPEC §3a/§4: for a lock address the profile field is the address as given (spaces
    /// written `%20`), query and all: the first word after `OK` is the profile field even
    /// when it holds `?`, `=`, `:` or `%20` (issue 25).
    #[test]
    fn ok_profile_is_the_first_word_even_for_an_address_with_a_query() {
        for (line, profile) in [
            (
                "OK mkdir:/x?stale_after=30s backend=mkdir mode=exclusive token=1",
                "mkdir:/x?stale_after=30s",
            ),
            (
                "OK postgres://db.example:5432/app?lock=py backend=postgres mode=exclusive",
                "postgres://db.example:5432/app?lock=py",
            ),
            (
                "OK mkdir:/tmp/a%20b?stale_after=30s&wait=0 backend=mkdir token=2",
                "mkdir:/tmp/a%20b?stale_after=30s&wait=0",
            ),
            ("OK backend=flock backend=flock", "backend=flock"),
            ("OK = backend=flock", "="),
            ("OK /tmp/a:b?c=d backend=flock mode=shared", "/tmp/a:b?c=d"),
        ] {
            let ok = ok(line);
            assert_eq!(ok.profile(), profile, "{line}");
            assert!(!ok.backend().is_empty(), "{line}");
            // The profile word is not also read as a field.
            assert_eq!(ok.fields.len(), line.split(' ').count() - 2, "{line}");
        }
        assert_eq!(
            ok("OK mkdir:/x?stale_after=30s backend=mkdir").get("stale_after"),
            None
        );
    }

    #[test]
    fn shown_tag_writes_whitespace_as_percent_bytes() {
        assert!(matches!(
            shown_tag("phonestuff"),
            Cow::Borrowed("phonestuff")
        ));
        assert_eq!(
            shown_tag("mkdir:/x?stale_after=30s"),
            "mkdir:/x?stale_after=30s"
        );
        assert_eq!(shown_tag("/tmp/a b.lock"), "/tmp/a%20b.lock");
        assert_eq!(shown_tag("mkdir:/a  b?x=1"), "mkdir:/a%20%20b?x=1");
        assert_eq!(shown_tag("/tmp/a\u{a0}b\tc"), "/tmp/a%C2%A0b%09c");
        assert_eq!(shown_tag("/tmp/a%20b"), "/tmp/a%20b");
    }

    #[test]
    fn ok_rejects_malformed_fields() {
        protocol_error("OK");
        protocol_error("OK backend=flock");
        protocol_error("OK demo");
        protocol_error("OK demo mode=exclusive");
        protocol_error("OK demo backend=");
        protocol_error("OK demo backend=flock junk");
        protocol_error("OK demo backend=flock =x");
        protocol_error("OK demo backend=flock backend=mkdir");
        protocol_error("OK demo backend=flock mode=sideways");
        assert!(protocol_error("OK demo backend=flock token=-1").contains("token=-1"));
        protocol_error("OK demo backend=flock token=18446744073709551616");
        protocol_error("OK demo backend=flock token=");
    }

    /// SPEC §3b: several locks' values are comma-separated in the order named, a lock
    /// without a token leaves its place empty, and `locks=N` counts them.
    #[test]
    fn ok_for_several_locks() {
        let ok1 = ok(
            "OK a backend=mkdir,flock,etcd mode=exclusive,shared,exclusive \
                      token=4,9, prev=crashed locks=3",
        );
        assert_eq!(ok1.profile(), "a");
        let held: Vec<_> = ok1
            .locks()
            .iter()
            .map(|l| (l.backend.as_str(), l.shared, l.token))
            .collect();
        assert_eq!(
            held,
            [
                ("mkdir", false, Some(4)),
                ("flock", true, Some(9)),
                ("etcd", false, None)
            ]
        );
        // One token for the set would be some lock's, not the set's.
        assert_eq!(ok1.token(), None);
        assert!(!ok1.shared());
        assert!(ok1.prev_crashed());
        assert_eq!(ok1.backend(), "mkdir,flock,etcd");
        // No token= at all: no lock keeps one. No mode=: all exclusive.
        let ok2 = ok("OK /tmp/x backend=flock,flock locks=2");
        assert_eq!(ok2.locks().len(), 2);
        assert!(ok2.locks().iter().all(|l| l.token.is_none() && !l.shared));
        let ok3 = ok("OK r backend=flock,flock mode=shared,shared token=,7 locks=2");
        assert!(ok3.shared());
        assert_eq!(ok3.locks()[1].token, Some(7));
        // A single lock's line is unchanged.
        let one = ok("OK a backend=mkdir mode=exclusive token=4");
        assert_eq!(one.locks().len(), 1);
        assert_eq!(one.token(), Some(4));
    }

    #[test]
    fn ok_for_several_locks_rejects_what_does_not_add_up() {
        protocol_error("OK a backend=mkdir,flock mode=exclusive,exclusive token=1,2");
        protocol_error("OK a backend=mkdir token=4,9");
        protocol_error("OK a backend=mkdir,flock token=1,2,3 locks=2");
        protocol_error("OK a backend=mkdir,flock mode=exclusive locks=2");
        protocol_error("OK a backend=mkdir, locks=2");
        protocol_error("OK a backend=mkdir,flock mode=exclusive,sideways locks=2");
        protocol_error("OK a backend=mkdir,flock token=1,x locks=2");
        protocol_error("OK a backend=mkdir,flock token=1,-2 locks=2");
        for bad in ["0", "-2", "+2", "two", ""] {
            protocol_error(&format!("OK a backend=mkdir,flock locks={bad}"));
        }
    }

    /// SPEC §3b semaphores: `slot=K slots=N` after the usual fields; for several locks one
    /// value each, both empty for a lock of one slot.
    #[test]
    fn ok_with_slots() {
        let one = ok("OK /tmp/x backend=flock mode=exclusive token=2 slot=1 slots=2");
        assert_eq!((one.slot(), one.slot_count()), (Some(1), Some(2)));
        assert_eq!(one.token(), Some(2));
        let plain = ok("OK /tmp/x backend=flock mode=exclusive token=2");
        assert_eq!((plain.slot(), plain.slot_count()), (None, None));
        let set = ok(
            "OK a backend=mkdir,flock mode=exclusive,exclusive token=1,2 \
                      slot=1, slots=2, locks=2",
        );
        let got: Vec<_> = set.locks().iter().map(|l| (l.slot, l.slots)).collect();
        assert_eq!(got, [(Some(1), Some(2)), (None, None)]);
        assert_eq!((set.slot(), set.slot_count()), (None, None));
        let both = ok("OK a backend=flock,flock token=3,1 slot=0,1023 slots=3,1024 locks=2");
        assert_eq!(both.locks()[1].slot, Some(1023));
        assert_eq!(both.locks()[1].slots, Some(1024));
    }

    #[test]
    fn ok_with_slots_rejects_what_does_not_add_up() {
        for bad in [
            "OK a backend=flock slot=1",
            "OK a backend=flock slots=2",
            "OK a backend=flock slot=2 slots=2",
            "OK a backend=flock slot= slots=2",
            "OK a backend=flock slot=x slots=2",
            "OK a backend=flock slot=-1 slots=2",
            "OK a backend=flock slot=+1 slots=2",
            "OK a backend=flock slot=0 slots=4294967296",
            "OK a backend=flock slot=0 slots=0",
            "OK a backend=flock,flock slot=0 slots=2, locks=2",
            "OK a backend=flock,flock slot=0, slots=2 locks=2",
            "OK a backend=flock,flock slot=0,1 slots=2,2,2 locks=2",
            "OK a backend=flock,flock slot=,1 slots=2, locks=2",
        ] {
            protocol_error(bad);
        }
    }

    #[test]
    fn error_lines_of_every_kind() {
        for (word, kind) in [
            ("usage", ErrorKind::Usage),
            ("unavailable", ErrorKind::Unavailable),
            ("lost", ErrorKind::Lost),
            ("io", ErrorKind::Io),
            ("busy", ErrorKind::Busy),
            ("denied", ErrorKind::Denied),
            ("config", ErrorKind::Config),
        ] {
            let line = format!("ERROR {word}: something: with colons");
            assert_eq!(
                parse(&line).unwrap(),
                Line::Error {
                    kind: Some(kind),
                    word: word.to_owned(),
                    message: "something: with colons".to_owned(),
                },
            );
        }
    }

    #[test]
    fn error_busy_names_holder() {
        let line = "ERROR busy: gave up after 0s; held by host=h1 pid=42 ppid=41 \
                    since=2025-01-01T00:00:00Z";
        let Line::Error { kind, message, .. } = parse(line).unwrap() else {
            panic!()
        };
        assert_eq!(kind, Some(ErrorKind::Busy));
        assert_eq!(
            message,
            "gave up after 0s; held by host=h1 pid=42 ppid=41 since=2025-01-01T00:00:00Z"
        );
    }

    #[test]
    fn error_with_unknown_kind_keeps_word() {
        assert_eq!(
            parse("ERROR weird: x").unwrap(),
            Line::Error {
                kind: None,
                word: "weird".to_owned(),
                message: "x".to_owned()
            },
        );
        assert_eq!(
            parse("ERROR busy:").unwrap(),
            Line::Error {
                kind: Some(ErrorKind::Busy),
                word: "busy".to_owned(),
                message: String::new()
            },
        );
    }

    #[test]
    fn error_without_kind_is_protocol() {
        protocol_error("ERROR");
        protocol_error("ERROR no colon here");
        protocol_error("ERROR : empty kind");
    }

    #[test]
    fn lost_lines() {
        assert_eq!(
            parse("LOST lease expired after 60s").unwrap(),
            Line::Lost {
                reason: "lease expired after 60s".to_owned()
            }
        );
        assert_eq!(
            parse("LOST").unwrap(),
            Line::Lost {
                reason: String::new()
            }
        );
    }

    #[test]
    fn garbage_is_protocol() {
        protocol_error("");
        protocol_error("ok demo backend=flock");
        protocol_error("OKAY demo backend=flock");
        protocol_error(" OK demo backend=flock");
        protocol_error("Error busy: x");
        protocol_error("hello world");
        protocol_error(".");
    }

    #[test]
    fn read_line_is_byte_exact() {
        let mut r: &[u8] = b"OK demo backend=flock\nLOST gone\n";
        assert_eq!(
            read_line(&mut r).unwrap().as_deref(),
            Some("OK demo backend=flock")
        );
        assert_eq!(read_line(&mut r).unwrap().as_deref(), Some("LOST gone"));
        assert_eq!(read_line(&mut r).unwrap(), None);
        assert_eq!(read_line(&mut r).unwrap(), None);
    }

    #[test]
    fn read_line_keeps_cr_for_parse_to_judge() {
        let mut r: &[u8] = b"OK demo backend=flock\r\n";
        assert_eq!(
            read_line(&mut r).unwrap().as_deref(),
            Some("OK demo backend=flock\r")
        );
    }

    #[test]
    fn read_line_rejects_truncated_long_and_non_utf8() {
        let mut r: &[u8] = b"OK demo backend=fl";
        let e = read_line(&mut r).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol);
        assert!(e.message().contains("middle of a line"), "{e}");

        let long = vec![b'x'; MAX_LINE as usize + 10];
        let mut r: &[u8] = &long;
        let e = read_line(&mut r).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol);
        assert!(e.message().contains("longer than"), "{e}");

        let mut r: &[u8] = b"OK \xff\n";
        let e = read_line(&mut r).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Protocol);
        assert!(e.message().contains("not UTF-8"), "{e}");
    }

    #[test]
    fn read_line_accepts_line_of_exactly_max_len() {
        let mut line = vec![b'x'; MAX_LINE as usize - 1];
        line.push(b'\n');
        let mut r: &[u8] = &line;
        assert_eq!(
            read_line(&mut r).unwrap().map(|s| s.len()),
            Some(MAX_LINE as usize - 1)
        );
    }
}

#[cfg(test)]
mod proptests;
