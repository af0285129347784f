//! Owner records of the filesystem backends (format documented in `docs/LAYOUT.md`).
//!
//! A record is one line of `key=value` words, version first:
//! `locksmith v=1 host=H pid=P ppid=PP start=S boot=B pidns=N since=T profile=NAME nonce=X`.
//! It is stored as the *target of a symbolic link* (`readlink(2)` reads it whole and
//! atomically, and never opens a file inside the lock directory: no `.nfsXXXX` trap).

use std::ffi::{OsStr, OsString};
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::SystemTime;

use nix::fcntl::{AtFlags, readlinkat};
use nix::sys::stat::{FileStat, fstatat};

use super::lock::Holder;
use crate::error::{Error, err};
use crate::host;

/// The record format this build writes and understands.
pub const VERSION: u32 = 1;

/// The most of the `profile` field a record carries, in bytes: the field is for display, and
/// a whole lock address (up to 4,095 bytes of path, more once escaped) would make the record
/// longer than a symbolic link's target may be (`PATH_MAX`, mkdir and symlink) or than a
/// reader takes (link; issue 28). A longer one keeps its two ends around `...`.
pub const PROFILE_SHOWN: usize = 1024;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub host: String,
    pub pid: i32,
    pub ppid: i32,
    /// Start time of `pid` in clock ticks after boot (defeats pid reuse).
    pub start: u64,
    pub boot_id: String,
    pub pidns: String,
    pub since: String,
    pub profile: String,
    /// Unique per acquisition: names the owner entry, so removing it is a claim.
    pub nonce: String,
    /// Fencing token of this acquisition, where the backend keeps one.
    pub token: Option<u64>,
}

/// What a stored record turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    V1(Record),
    /// Another version or unreadable: counts as held, broken only by `--force`.
    Foreign(String),
}

impl Record {
    /// A record describing this process, now.
    pub fn ours(profile: &str) -> Record {
        let h = host::this();
        Record {
            host: h.hostname.clone(),
            pid: std::process::id() as i32,
            ppid: nix::unistd::getppid().as_raw(),
            start: host::own_start(),
            boot_id: h.boot_id.clone(),
            pidns: h.pidns.clone(),
            since: now_rfc3339(),
            profile: profile.to_string(),
            nonce: crate::host::nonce(),
            token: None,
        }
    }

    /// A holder known only by its host tag ([`host::Host::tag`]), pid and start time, and
    /// the nonce its entry's name carries (mkdir's short owner entry): of this host and pid
    /// namespace where the tag is ours (proof of death applies), else of an unknown one
    /// (judged by its heartbeat).
    pub fn tagged(tag: &str, pid: i32, start: u64, nonce: &str) -> Record {
        let h = host::this();
        let ours = h.tag().as_deref() == Some(tag);
        let known = |s: &String| if ours { s.clone() } else { String::new() };
        Record {
            host: if ours {
                h.hostname.clone()
            } else {
                format!("host {tag}")
            },
            pid,
            ppid: 0,
            start,
            boot_id: known(&h.boot_id),
            pidns: known(&h.pidns),
            since: String::new(),
            profile: String::new(),
            nonce: nonce.into(),
            token: None,
        }
    }

    pub fn render(&self) -> String {
        let token = self
            .token
            .map(|t| format!(" token={t}"))
            .unwrap_or_default();
        format!(
            "locksmith v={VERSION} host={} pid={} ppid={} start={} boot={} pidns={} since={} profile={} nonce={}{token}",
            clean(&self.host),
            self.pid,
            self.ppid,
            self.start,
            clean(&self.boot_id),
            clean(&self.pidns),
            self.since,
            shown_profile(&self.profile),
            self.nonce
        )
    }

    /// The record as the content of a heartbeat record file: beat `n` added, fixed width, so
    /// that every heartbeat rewrites the same bytes in place.
    pub fn render_beat(&self, n: u64) -> String {
        format!("{} beat={:010}\n", self.render(), n % 10_000_000_000)
    }

    /// A record as one whole write stores it (an S3 object's body: one request, ending in
    /// a newline). `None` where no whole record is there — nothing, or the start of one of
    /// ours without its end: a writer killed mid-request on a server that kept what it got
    /// (SeaweedFS does, the S3 kill -9 soak found). Such a lock has no owner record, and the
    /// rule for one without applies (silent for `stale_after`): read as a record of another
    /// format it was held until `--force`.
    pub fn parse_whole(text: &str) -> Option<Parsed> {
        (!cut_short(text, "locksmith ")).then(|| Record::parse(text))
    }

    pub fn parse(text: &str) -> Parsed {
        let foreign = || Parsed::Foreign(text.chars().take(200).collect());
        let mut words = text.split_ascii_whitespace();
        if words.next() != Some("locksmith") {
            return foreign();
        }
        let mut r = Record {
            host: String::new(),
            pid: 0,
            ppid: 0,
            start: 0,
            boot_id: String::new(),
            pidns: String::new(),
            since: String::new(),
            profile: String::new(),
            nonce: String::new(),
            token: None,
        };
        let mut version = None;
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                return foreign();
            };
            match k {
                "v" => version = v.parse::<u32>().ok(),
                "host" => r.host = v.into(),
                "pid" => r.pid = v.parse().unwrap_or(0),
                "ppid" => r.ppid = v.parse().unwrap_or(0),
                "start" => r.start = v.parse().unwrap_or(0),
                "boot" => r.boot_id = v.into(),
                "pidns" => r.pidns = v.into(),
                "since" => r.since = v.into(),
                "profile" => r.profile = v.into(),
                "nonce" => r.nonce = v.into(),
                "token" => r.token = v.parse().ok(),
                // The heartbeat counter of a record file: evidence, not identity.
                "beat" => {}
                // Unknown keys of the same version are additions: ignore them.
                _ => {}
            }
        }
        if version != Some(VERSION) || r.pid <= 0 || r.nonce.is_empty() {
            return foreign();
        }
        Parsed::V1(r)
    }

    /// Whether the record comes from this host and pid namespace.
    pub fn same_host(&self) -> bool {
        host::this().same_as(&self.boot_id, &self.pidns)
    }

    /// Alive per proof of death: `Some` only when it can be known at once (same host).
    pub fn alive(&self) -> Option<bool> {
        self.same_host().then(|| host::alive(self.pid, self.start))
    }

    pub fn holder(&self) -> Holder {
        Holder {
            host: Some(self.host.clone()),
            pid: Some(self.pid),
            ppid: Some(self.ppid),
            since: Some(self.since.clone()),
            token: self.token,
            mode: None,
            alive: self.alive(),
            foreign: None,
            slot: None,
        }
    }
}

impl Parsed {
    pub fn holder(&self) -> Holder {
        match self {
            Parsed::V1(r) => r.holder(),
            Parsed::Foreign(text) => Holder {
                foreign: Some(text.clone()),
                ..Holder::default()
            },
        }
    }
}

/// The `profile` field as a record carries it: at most [`PROFILE_SHOWN`] bytes, a longer one
/// cut in the middle (at character boundaries) with `...`.
fn shown_profile(p: &str) -> std::borrow::Cow<'_, str> {
    if p.len() <= PROFILE_SHOWN {
        return p.into();
    }
    let half = (PROFILE_SHOWN - 3) / 2;
    let mut head = half;
    while !p.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = p.len() - half;
    while !p.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}...{}", &p[..head], &p[tail..]).into()
}

fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_whitespace() || c == '=' {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// Now, RFC 3339 UTC with seconds.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips() {
        let mut r = Record::ours("demo");
        assert_eq!(Record::parse(&r.render()), Parsed::V1(r.clone()));
        r.token = Some(42);
        assert_eq!(Record::parse(&r.render()), Parsed::V1(r.clone()));
        assert_eq!(r.alive(), Some(true));
        assert!(r.same_host());
    }

    #[test]
    fn long_profiles_are_cut_in_the_middle() {
        let long = format!("link:/{}/é{}/x.lock", "a".repeat(3000), "b".repeat(2000));
        let r = Record::ours(&long);
        let text = r.render();
        let Parsed::V1(back) = Record::parse(&text) else {
            panic!("not parsed: {text}");
        };
        assert!(
            back.profile.len() <= PROFILE_SHOWN,
            "{}",
            back.profile.len()
        );
        assert!(back.profile.starts_with("link:/aaa") && back.profile.ends_with("bb/x.lock"));
        assert!(back.profile.contains("..."));
        assert_eq!(back.nonce, r.nonce);
        // A record of the longest profile stays a valid symbolic link target.
        assert!(r.render_beat(0).len() < 2048, "{}", r.render_beat(0).len());
        let short = Record::ours("demo");
        assert!(short.render().contains(" profile=demo "));
    }

    #[test]
    fn other_versions_are_foreign() {
        let text = Record::ours("demo").render().replace("v=1", "v=2");
        assert!(matches!(Record::parse(&text), Parsed::Foreign(_)));
        assert!(matches!(Record::parse("garbage"), Parsed::Foreign(_)));
        // Stored by one write: nothing, or a record cut short, is no record at all.
        let whole = Record::ours("demo").render_beat(7);
        assert!(matches!(Record::parse_whole(&whole), Some(Parsed::V1(_))));
        assert_eq!(Record::parse_whole(""), None);
        assert_eq!(Record::parse_whole(&whole[..whole.len() - 1]), None);
        assert_eq!(Record::parse_whole(&whole[..20]), None);
        assert!(matches!(
            Record::parse_whole("garbage\n"),
            Some(Parsed::Foreign(_))
        ));
        assert!(matches!(
            Record::parse_whole("garbage"),
            Some(Parsed::Foreign(_))
        ));
        assert_eq!(Record::parse_whole("locksmi"), None);
        assert!(cut_short("state~1~7", "state~") && cut_short("sta", "state~"));
        assert!(!cut_short("state~1~7~1\n", "state~") && !cut_short("other", "state~"));
    }
}

/// The state kept *beside* a lock (never inside it), changed only while holding the lock:
/// the last fencing token issued and whether that acquisition ended in a clean release.
/// Kept as a name, [`state_entry`] (`lockdir::state`, FTP's `tokens`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub token: u64,
    pub clean: bool,
    /// The number of slots its issuer asked for (SPEC §3b); 0 and 1 both mean one (the
    /// mutex), which the name leaves out.
    pub slots: u32,
}

impl State {
    /// A state of a lock without several slots.
    pub fn one(token: u64, clean: bool) -> State {
        State {
            token,
            clean,
            slots: 1,
        }
    }

    /// The number of slots it records: at least 1.
    pub fn slots(&self) -> u32 {
        self.slots.max(1)
    }
}

/// The name of a state *entry*, `state~1~TOKEN~CLEAN`, or `state~1~TOKEN~CLEAN~SLOTS` for a
/// lock with several slots: the state where it is kept as a name (the file backends'
/// `.NAME.state/` directory, FTP's `NAME.state/`), advanced by renaming that exact name.
pub fn state_entry(st: State) -> String {
    let (token, clean) = (st.token, st.clean as u8);
    match st.slots() {
        1 => format!("state~{VERSION}~{token}~{clean}"),
        n => format!("state~{VERSION}~{token}~{clean}~{n}"),
    }
}

/// The state a [`state_entry`] name says; `None` for any other name.
pub fn parse_state_entry(name: &str) -> Option<State> {
    let f: Vec<&str> = name.split('~').collect();
    let (v, token, clean, slots) = match f.as_slice() {
        ["state", v, token, clean] => (v, token, clean, 1),
        ["state", v, token, clean, text] => match text.parse::<u32>().ok()? {
            n @ 2..=crate::settings::MAX_SLOTS if n.to_string() == *text => (v, token, clean, n),
            _ => return None,
        },
        _ => return None,
    };
    if *v != VERSION.to_string() {
        return None;
    }
    Some(State {
        token: token.parse().ok()?,
        clean: match *clean {
            "1" => true,
            "0" => false,
            _ => return None,
        },
        slots,
    })
}

/// What a look at a name beside the lock found: its `lstat`, and its text if it is a
/// symbolic link.
pub type Look = (FileStat, Option<OsString>);

/// `lstat` of `name` in `parent`, and its text if it is a symbolic link.
pub fn look(parent: BorrowedFd<'_>, name: &OsStr) -> nix::Result<Look> {
    let st = fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFLNK {
        return Ok((st, None));
    }
    Ok((st, Some(readlinkat(parent, name)?)))
}

/// The config error for a lock state (at `shown`, owned by `uid`) that `says` something no
/// token can follow: a format this build cannot read, or the last token there is.
pub fn no_token_after(shown: &Path, uid: u32, says: &str) -> Error {
    err!(
        Config,
        "lock state {}, owned by {}, says {says}: this locksmith cannot issue a fencing token \
         after it; if no other locksmith version uses this lock, remove it (tokens then start \
         again above the clock's microseconds)",
        shown.display(),
        crate::files::owner_name(uid)
    )
}

/// Whether `text`, stored by one write of ours whose every form begins with `head` and ends
/// with a newline, is one cut short: nothing, or a beginning of that form without its end (a
/// write killed mid-request on a server that kept what it got). Text of another form is not.
pub fn cut_short(text: &str, head: &str) -> bool {
    !text.ends_with('\n') && (text.starts_with(head) || head.starts_with(text))
}

/// The token after `state` on a server no cleaner touches (FTP's and S3's states): 1 for none.
/// The file backends' states start at the clock (`lockdir::state::next_token`).
pub fn next_token(state: Option<State>) -> u64 {
    // state_of refuses u64::MAX: no overflow here.
    state.map_or(1, |s| s.token + 1)
}

#[cfg(test)]
mod state_tests {
    use super::*;

    #[test]
    fn state_entries_round_trip() {
        for (token, clean, slots) in [
            (0, true, 1),
            (7, false, 1),
            (u64::MAX, true, 1),
            (9, false, 3),
        ] {
            let st = State {
                token,
                clean,
                slots,
            };
            let name = state_entry(st);
            assert_eq!(parse_state_entry(&name), Some(st));
        }
        assert_eq!(state_entry(State::one(7, true)), "state~1~7~1");
        assert_eq!(
            state_entry(State {
                token: 7,
                clean: true,
                slots: 3
            }),
            "state~1~7~1~3"
        );
        assert_eq!(parse_state_entry("state~2~7~1"), None);
        assert_eq!(parse_state_entry("state~1~7~2"), None);
        // One spelling per number of slots: 1 is left out, no leading zeros, at most 1024.
        for bad in [
            "state~1~7~1~1",
            "state~1~7~1~03",
            "state~1~7~1~1025",
            "state~1~7~1~x",
        ] {
            assert_eq!(parse_state_entry(bad), None, "{bad}");
        }
    }
}
