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
        let mut msg = msg.into();
        // The protocol is line based: a message never spans lines (a bare CR ends a line
        // for many readers too, Python's universal newlines among them).
        if msg.contains(['\n', '\r']) {
            msg = msg.replace(['\n', '\r'], " ");
        }
        Error { kind, msg }
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
            _ => Kind::Io,
        };
        let hint = match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => {
                " (locksmith never creates parent directories)"
            }
            Some(libc::ELOOP) => " (refusing to follow a symbolic link)",
            _ => "",
        };
        Error::new(kind, format!("{what} {}: {err}{hint}", path.display()))
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

/// Shorthands for the kinds, so call sites read like the SPEC.
macro_rules! err {
    ($kind:ident, $($arg:tt)*) => {
        $crate::error::Error::new($crate::error::Kind::$kind, format!($($arg)*))
    };
}
pub(crate) use err;
