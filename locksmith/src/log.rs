//! Diagnostics on stderr. stdout is the protocol (see `protocol.rs`); everything a human
//! reads goes here, one line per message, prefixed `locksmith:`.
//!
//! Levels: 0 quiet (nothing but the final error line), 1 normal (the waiting notice and
//! warnings), 2 verbose (what the helper decides and why), 3 trace.

use std::sync::atomic::{AtomicU8, Ordering};

static LEVEL: AtomicU8 = AtomicU8::new(1);

pub const QUIET: u8 = 0;
pub const NORMAL: u8 = 1;
pub const VERBOSE: u8 = 2;
pub const TRACE: u8 = 3;

pub fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

pub fn level() -> u8 {
    LEVEL.load(Ordering::Relaxed)
}

/// Parses `$LOCKSMITH_LOG`: `quiet`, `info`/`normal`, `debug`/`verbose`, `trace` (or 0–3).
pub fn level_from_env(value: &str) -> Option<u8> {
    match value.trim().to_ascii_lowercase().as_str() {
        "0" | "quiet" | "error" | "off" => Some(QUIET),
        "1" | "normal" | "info" | "warn" => Some(NORMAL),
        "2" | "verbose" | "debug" => Some(VERBOSE),
        "3" | "trace" => Some(TRACE),
        _ => None,
    }
}

/// Writes `locksmith: MESSAGE` and its newline in one `write(2)`: `eprintln!` writes the
/// prefix, the message and the newline apart, so a helper killed between them (the kill -9
/// soaks' logs showed bare `locksmith: ` lines) or a CMD sharing stderr could cut or split it.
pub fn emit(message: &str) {
    line(&format!("locksmith: {message}"));
}

/// Writes `text` and a newline to stderr in one `write(2)` (see [`emit`]).
pub fn line(text: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{text}\n").as_bytes());
}

macro_rules! log_at {
    ($lvl:expr, $($arg:tt)*) => {
        if $crate::log::level() >= $lvl {
            // One line, no raw control bytes: messages quote records and paths.
            $crate::log::emit(&$crate::error::one_line(
                &format!($($arg)*),
                4 * $crate::error::MAX_MESSAGE,
            ));
        }
    };
}
macro_rules! info { ($($arg:tt)*) => { $crate::log::log_at!($crate::log::NORMAL, $($arg)*) }; }
macro_rules! debug { ($($arg:tt)*) => { $crate::log::log_at!($crate::log::VERBOSE, $($arg)*) }; }
macro_rules! trace { ($($arg:tt)*) => { $crate::log::log_at!($crate::log::TRACE, $($arg)*) }; }
pub(crate) use {debug, info, log_at, trace};
