//! The FTP backend's names: an owner marker's, a reader's and the token state's name *is*
//! the record (`NLST` alone reads it; see `docs/LAYOUT.md`).

use crate::backend::owner::Record;

/// First word of an owner marker's name; the format version follows.
pub const MARKER: &str = "owner";
pub const SEP: char = '~';
pub const FORMAT: &str = "1";

/// First word of a reader marker (the rest is an owner marker's record).
pub const READER: &str = "reader";

/// The marker name of an acquisition at heartbeat `seq`.
pub fn marker_name(rec: &Record, seq: u64) -> String {
    let since = rec.since.replace(['-', ':'], "");
    let pidns = rec
        .pidns
        .trim_start_matches("pid:[")
        .trim_end_matches(']')
        .to_string();
    let fields = [
        MARKER.to_string(),
        FORMAT.to_string(),
        rec.nonce.clone(),
        seq.to_string(),
        word(&rec.host, 40),
        rec.pid.to_string(),
        rec.ppid.to_string(),
        rec.start.to_string(),
        word(&rec.boot_id, 40),
        word(&pidns, 24),
        since,
        word(&rec.profile, 64),
    ];
    let mut name = fields.join(&SEP.to_string());
    // Field 13, once the acquisition has its fencing token (older markers stop at 12).
    if let Some(t) = rec.token {
        name.push(SEP);
        name.push_str(&t.to_string());
    }
    name
}

/// A field safe in a file name on any server: no separator, slash, space or control.
fn word(s: &str, max: usize) -> String {
    let w: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect();
    if w.is_empty() { "_".into() } else { w }
}

pub fn is_marker(name: &str) -> bool {
    name.starts_with(MARKER) && name[MARKER.len()..].starts_with(SEP)
}

/// Reads a marker name: the record and its heartbeat sequence number; `None` for another
/// format version or a name locksmith cannot read (counts as held, `--force` breaks it).
pub fn parse_marker(name: &str) -> Option<(Record, u64)> {
    let f: Vec<&str> = name.split(SEP).collect();
    if f.len() < 12 || f[0] != MARKER || f[1] != FORMAT || f[2].is_empty() {
        return None;
    }
    let seq = f[3].parse().ok()?;
    let pid: i32 = f[5].parse().ok().filter(|p| *p > 0)?;
    let since = unsquash_time(f[10]);
    let rec = Record {
        host: f[4].to_string(),
        pid,
        ppid: f[6].parse().unwrap_or(0),
        start: f[7].parse().unwrap_or(0),
        boot_id: f[8].to_string(),
        pidns: format!("pid:[{}]", f[9]),
        since,
        profile: f[11].to_string(),
        nonce: f[2].to_string(),
        token: f.get(12).and_then(|t| t.parse().ok()),
    };
    Some((rec, seq))
}

/// The state entry's name is the one every backend keeping its state as a name uses.
pub use crate::backend::owner::{parse_state_entry as parse_state, state_entry as state_name};

/// `20261122T055000Z` → `2026-11-22T05:50:00Z`.
fn unsquash_time(s: &str) -> String {
    let b = s.as_bytes();
    if b.len() == 16 && b[8] == b'T' && s.is_ascii() {
        format!(
            "{}-{}-{}T{}:{}:{}Z",
            &s[0..4],
            &s[4..6],
            &s[6..8],
            &s[9..11],
            &s[11..13],
            &s[13..15]
        )
    } else {
        s.to_string()
    }
}

pub fn reader_name(rec: &Record, seq: u64) -> String {
    let owner = marker_name(rec, seq);
    format!("{READER}{}", &owner[MARKER.len()..])
}

pub fn is_reader(name: &str) -> bool {
    name.starts_with(READER) && name[READER.len()..].starts_with(SEP)
}

pub fn parse_reader(name: &str) -> Option<(Record, u64)> {
    if !is_reader(name) {
        return None;
    }
    parse_marker(&format!("{}{}", MARKER, &name[READER.len()..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::owner::Record;

    #[test]
    fn marker_round_trips() {
        let rec = Record::ours("phone.stuff-1");
        let name = marker_name(&rec, 7);
        assert!(is_marker(&name));
        assert!(name.len() < 255, "{name}");
        assert!(!name.contains('/') && !name.contains(' '), "{name}");
        let (back, seq) = parse_marker(&name).expect("parses");
        assert_eq!(seq, 7);
        assert_eq!(back.nonce, rec.nonce);
        assert_eq!(back.pid, rec.pid);
        assert_eq!(back.since, rec.since);
        assert_eq!(back.pidns, rec.pidns);
        assert!(back.same_host());
        assert_eq!(back.holder().alive, Some(true));
    }

    #[test]
    fn other_formats_are_foreign() {
        let name = marker_name(&Record::ours("p"), 0).replacen("owner~1~", "owner~2~", 1);
        assert!(is_marker(&name));
        assert!(parse_marker(&name).is_none());
        assert!(!is_marker("ownerless"));
    }

    #[test]
    fn tokens_ride_in_marker_and_state_names() {
        let mut rec = Record::ours("p");
        assert_eq!(parse_marker(&marker_name(&rec, 3)).unwrap().0.token, None);
        rec.token = Some(41);
        let (back, seq) = parse_marker(&marker_name(&rec, 3)).unwrap();
        assert_eq!((back.token, seq), (Some(41), 3));
        for (t, clean) in [(1, false), (77, true)] {
            let st = parse_state(&state_name(crate::backend::owner::State::one(t, clean))).unwrap();
            assert_eq!((st.token, st.clean), (t, clean));
        }
        for bad in [
            "state~1~x~1",
            "state~2~5~1",
            "state~1~5~2",
            "state~1~5",
            "owner~1~5~1",
        ] {
            assert!(parse_state(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn reader_names_round_trip_and_are_not_owner_markers() {
        let rec = Record::ours("downloads");
        let n = reader_name(&rec, 7);
        assert!(n.starts_with("reader~1~"), "{n}");
        assert!(is_reader(&n));
        assert!(!is_marker(&n));
        let (back, seq) = parse_reader(&n).unwrap();
        assert_eq!(seq, 7);
        assert_eq!(back.nonce, rec.nonce);
        assert_eq!(back.pid, rec.pid);
        assert!(parse_reader(&marker_name(&rec, 7)).is_none());
    }
}
