//! One error type for the whole helper: a kind (which decides the exit code and the
//! `ERROR <kind>:` word of the protocol) and a human message that already carries its context.

use std::fmt;
use std::io;
use std::path::Path;

/// What went wrong, as the SPEC's exit-code table sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Bad command line (64).
    Usage,
    /// Server unreachable, connection refused, TLS failed (69).
    Unavailable,
    /// The lock was lost while held, or release failed (74).
    Lost,
    /// An I/O error on the lock path: EIO, ENOSPC, EROFS (74).
    Io,
    /// Gave up waiting, or interrupted while waiting (75).
    Busy,
    /// Authentication failed, permission denied (77).
    Denied,
    /// Profiles file missing or malformed, unknown profile/backend/key (78).
    Config,
}

impl Kind {
    /// The sysexits code for this kind.
    pub fn exit_code(self) -> i32 {
        match self {
            Kind::Usage => 64,
            Kind::Unavailable => 69,
            Kind::Lost | Kind::Io => 74,
            Kind::Busy => 75,
            Kind::Denied => 77,
            Kind::Config => 78,
        }
    }

    /// Every kind, in the order of their exit codes.
    pub const ALL: [Kind; 7] = [
        Kind::Usage,
        Kind::Unavailable,
        Kind::Lost,
        Kind::Io,
        Kind::Busy,
        Kind::Denied,
        Kind::Config,
    ];

    /// What the kind means, for the man page.
    pub fn about(self) -> &'static str {
        match self {
            Kind::Usage => "a bad command line",
            Kind::Unavailable => "the server is unreachable, refused the connection, or TLS failed",
            Kind::Lost => "the lock was lost while held (LOST), or releasing it failed",
            Kind::Io => "an I/O error on the lock's path (EIO, ENOSPC, EROFS)",
            Kind::Busy => "gave up waiting (--wait, -n), or interrupted while waiting",
            Kind::Denied => "authentication failed, or permission denied",
            Kind::Config => {
                "the profiles file is missing or malformed; an unknown profile, backend or key; \
                 a filesystem the backend is not safe on; something planted beside the lock"
            }
        }
    }

    /// The word after `ERROR ` on the protocol line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Usage => "usage",
            Kind::Unavailable => "unavailable",
            Kind::Lost => "lost",
            Kind::Io => "io",
            Kind::Busy => "busy",
            Kind::Denied => "denied",
            Kind::Config => "config",
        }
    }
}

/// An error with its kind and a complete, one-line human message.
#[derive(Debug)]
pub struct Error {
    kind: Kind,
    msg: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: Kind, msg: impl Into<String>) -> Error {
        Error {
            kind,
            msg: one_line(&msg.into(), MAX_MESSAGE),
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.msg
    }

    /// An I/O error on `path` while doing `what`, classified by errno:
    /// permission → denied, a missing parent → config, anything else → io.
    pub fn path(what: &str, path: &Path, err: io::Error) -> Error {
        let kind = match err.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => Kind::Denied,
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Kind::Config,
            Some(libc::ELOOP) => Kind::Denied,
            // A path or a name in it too long: the lock's address is wrong (SPEC §4: 78).
            Some(libc::ENAMETOOLONG) => Kind::Config,
            _ => Kind::Io,
        };
        let hint = match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => {
                " (locksmith never creates parent directories)"
            }
            Some(libc::ELOOP) => " (refusing to follow a symbolic link)",
            Some(libc::ENAMETOOLONG) => {
                " (a path is at most 4095 bytes, a name in it at most 255, names locksmith \
                 keeps beside the lock included)"
            }
            _ => "",
        };
        Error::new(kind, format!("{what} {}: {err}{hint}", shown(path)))
    }

    pub fn io(what: impl fmt::Display, err: io::Error) -> Error {
        Error::new(Kind::Io, format!("{what}: {err}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.msg)
    }
}

impl std::error::Error for Error {}

/// The longest message an ERROR line carries, in bytes; longer ones are cut in the middle.
pub const MAX_MESSAGE: usize = 2048;

/// The longest path a message shows, in bytes; longer ones are cut in the middle.
pub const MAX_PATH_SHOWN: usize = 256;

/// A message made safe for a one-line protocol and a terminal: line breaks and tabs become
/// spaces (a bare CR ends a line for many readers, Python's universal newlines among them),
/// every other control character — NUL, ESC, DEL, the C1 range — is written `\xNN` (or
/// `\u{NN}`), and a text over `max` bytes keeps its head and tail around an ellipsis.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max + 16));
    for c in text.chars() {
        match c {
            '\n' | '\r' | '\t' => out.push(' '),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    shorten(out, max)
}

/// Keeps the first and last parts of `s` (at char boundaries) if it is over `max` bytes.
fn shorten(s: String, max: usize) -> String {
    if s.len() <= max {
        return s;
    }
    let keep = max.saturating_sub(40) / 2;
    let mut head = keep;
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len() - keep;
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!("{}…[{} bytes]…{}", &s[..head], tail - head, &s[tail..])
}

/// A path as messages show it: escaped as [`one_line`] does, at most [`MAX_PATH_SHOWN`]
/// bytes (a 10 MB path in a profile must not become a 10 MB ERROR line).
pub fn shown(path: &Path) -> String {
    one_line(&path.display().to_string(), MAX_PATH_SHOWN)
}

/// Names a list for a message: at most `max` items, then "and N more".
pub fn some_of<'a>(items: impl IntoIterator<Item = &'a str>, max: usize) -> String {
    let mut v: Vec<&str> = Vec::new();
    let mut more = 0usize;
    for item in items {
        if v.len() < max {
            v.push(item);
        } else {
            more += 1;
        }
    }
    let mut s = v.join(", ");
    if more > 0 {
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// Shorthands for the kinds, so call sites read like the SPEC.
macro_rules! err {
    ($kind:ident, $($arg:tt)*) => {
        $crate::error::Error::new($crate::error::Kind::$kind, format!($($arg)*))
    };
}
pub(crate) use err;

/// The candidate `word` was most likely a typo of, for a "did you mean" hint: the closest by
/// Jaro-Winkler similarity, if close enough (as cargo and clap suggest).
pub fn closest<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_escaped_and_bounded() {
        let e = Error::new(Kind::Config, "a\0b\x1b[31mc\x7fd\u{85}e\nf");
        assert_eq!(e.message(), "a\\x00b\\x1b[31mc\\x7fd\\u{85}e f");
        let long = "é".repeat(10_000);
        let e = Error::new(Kind::Config, long);
        assert!(e.message().len() <= MAX_MESSAGE, "{}", e.message().len());
        assert!(e.message().contains("bytes]…"));
        let p = std::path::PathBuf::from(format!("/{}", "x".repeat(10_000_000)));
        assert!(shown(&p).len() <= MAX_PATH_SHOWN);
        assert_eq!(some_of(["a", "b", "c"], 2), "a, b and 1 more");
        assert_eq!(some_of(["a", "b"], 2), "a, b");
    }
}
