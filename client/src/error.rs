//! [`Error`] and [`ErrorKind`]: what went wrong, in the words of the SPEC's exit-code table.

use std::fmt;

/// What kind of failure an [`Error`] is.
///
/// The first seven mirror the helper's `ERROR <kind>:` words and its sysexits codes; the
/// last two are failures of the client itself. New kinds may be added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The lock is held by someone else and the wait gave up (`--wait` elapsed, or a
    /// `try_*` call found it held). Exit code 75.
    ///
    /// [`NetLock::try_new`](crate::NetLock::try_new) and
    /// [`Builder::try_lock`](crate::Builder::try_lock) turn this into `Ok(None)`.
    Busy,
    /// The profiles file is missing or malformed, the profile or backend is unknown, a
    /// field is missing, file permissions are unsafe. Exit code 78.
    Config,
    /// The lock server could not be reached (connection refused, TLS failed). Exit code 69.
    Unavailable,
    /// Authentication failed, or permission was denied on the lock path. Exit code 77.
    Denied,
    /// The lock was lost while held (the helper said `LOST`, or it died), or the release
    /// could not complete. Exit code 74.
    Lost,
    /// The helper rejected its command line. Exit code 64.
    Usage,
    /// An I/O error on the lock path (EIO, ENOSPC, EROFS), or on the pipe to the helper.
    /// Exit code 74.
    Io,
    /// The helper could not be started (not found, not executable).
    Spawn,
    /// The helper said something this crate cannot parse, or exited without a status line
    /// and with an exit code outside the table.
    Protocol,
}

impl ErrorKind {
    /// The word used for this kind in messages (and, for the helper's kinds, on the wire).
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Busy => "busy",
            ErrorKind::Config => "config",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Denied => "denied",
            ErrorKind::Lost => "lost",
            ErrorKind::Usage => "usage",
            ErrorKind::Io => "io",
            ErrorKind::Spawn => "spawn",
            ErrorKind::Protocol => "protocol",
        }
    }

    /// The kind named by the word after `ERROR ` on the helper's line, if it is one the
    /// helper may send (`spawn` and `protocol` are the client's own).
    pub(crate) fn from_word(word: &str) -> Option<ErrorKind> {
        Some(match word {
            "busy" => ErrorKind::Busy,
            "config" => ErrorKind::Config,
            "unavailable" => ErrorKind::Unavailable,
            "denied" => ErrorKind::Denied,
            "lost" => ErrorKind::Lost,
            "usage" => ErrorKind::Usage,
            "io" => ErrorKind::Io,
            _ => return None,
        })
    }

    /// The kind the helper's sysexits code stands for. 74 is both `lost` and `io`; without
    /// the helper's word we call it `Lost`, as the helper does for a failed release.
    pub(crate) fn from_exit_code(code: i32) -> Option<ErrorKind> {
        Some(match code {
            64 => ErrorKind::Usage,
            69 => ErrorKind::Unavailable,
            74 => ErrorKind::Lost,
            75 => ErrorKind::Busy,
            77 => ErrorKind::Denied,
            78 => ErrorKind::Config,
            _ => return None,
        })
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from taking, holding or releasing a lock.
///
/// It carries a [`kind`](Error::kind), the human [`message`](Error::message) (the
/// helper's own words when it gave any, otherwise this crate's account of what it saw),
/// and the helper's [`exit_code`](Error::exit_code) when it had exited.
///
/// Displayed as `locksmith: <kind>: <message>`, for example
/// `locksmith: busy: held by host=build1 pid=4242 ppid=4241 since=2025-01-01T00:00:00Z`.
#[derive(Clone, Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    exit_code: Option<i32>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            exit_code: None,
        }
    }

    pub(crate) fn with_exit_code(mut self, code: Option<i32>) -> Error {
        self.exit_code = code;
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The human message: the text after `ERROR <kind>: ` or `LOST ` when the helper
    /// wrote one, otherwise a description of what the client observed.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The helper's exit code, if it had exited (and was not killed by a signal) when
    /// this error was made.
    pub fn exit_code(&self) -> Option<i32> {
        self.exit_code
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "locksmith: {}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_and_message() {
        let err = Error::new(ErrorKind::Busy, "held by host=a pid=1").with_exit_code(Some(75));
        assert_eq!(err.to_string(), "locksmith: busy: held by host=a pid=1");
        assert_eq!(err.exit_code(), Some(75));
        assert_eq!(err.message(), "held by host=a pid=1");
    }

    #[test]
    fn every_wire_word_round_trips() {
        for kind in [
            ErrorKind::Busy,
            ErrorKind::Config,
            ErrorKind::Unavailable,
            ErrorKind::Denied,
            ErrorKind::Lost,
            ErrorKind::Usage,
            ErrorKind::Io,
        ] {
            assert_eq!(ErrorKind::from_word(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_word("spawn"), None);
        assert_eq!(ErrorKind::from_word("protocol"), None);
        assert_eq!(ErrorKind::from_word("Busy"), None);
    }

    #[test]
    fn exit_codes_follow_sysexits_table() {
        assert_eq!(ErrorKind::from_exit_code(64), Some(ErrorKind::Usage));
        assert_eq!(ErrorKind::from_exit_code(69), Some(ErrorKind::Unavailable));
        assert_eq!(ErrorKind::from_exit_code(74), Some(ErrorKind::Lost));
        assert_eq!(ErrorKind::from_exit_code(75), Some(ErrorKind::Busy));
        assert_eq!(ErrorKind::from_exit_code(77), Some(ErrorKind::Denied));
        assert_eq!(ErrorKind::from_exit_code(78), Some(ErrorKind::Config));
        assert_eq!(ErrorKind::from_exit_code(0), None);
        assert_eq!(ErrorKind::from_exit_code(1), None);
        assert_eq!(ErrorKind::from_exit_code(101), None);
    }

    #[test]
    fn error_is_send_sync_and_static() {
        fn check<T: std::error::Error + Send + Sync + 'static>() {}
        check::<Error>();
    }
}
