//! The pipe protocol (SPEC §4): the only place that writes to stdout.
//!
//! ```text
//! OK <profile> backend=<b> mode=<m> [token=<n>] [prev=crashed] [key=value ...]
//! ERROR <kind>: <message>
//! LOST <reason>
//! ```
//! Each line is written with one `write(2)` and flushed at once.
#![allow(clippy::disallowed_methods)] // this module is the stdout choke point

use std::io::{self, Write};

use crate::error::Error;

pub use crate::settings::Mode;

/// Everything the OK line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OkLine {
    pub profile: String,
    /// A set's values are comma-separated (SPEC §3b).
    pub backend: String,
    pub mode: String,
    pub token: Option<String>,
    pub prev_crashed: bool,
    /// Further `key=value` pairs, in order.
    pub extra: Vec<(&'static str, String)>,
}

impl OkLine {
    /// The line, newline included. Values never contain spaces.
    pub fn render(&self) -> String {
        let mut line = format!(
            "OK {} backend={} mode={}",
            self.profile, self.backend, self.mode
        );
        if let Some(t) = &self.token {
            line.push_str(&format!(" token={t}"));
        }
        if self.prev_crashed {
            line.push_str(" prev=crashed");
        }
        for (k, v) in &self.extra {
            line.push_str(&format!(" {k}={}", no_spaces(v)));
        }
        line.push('\n');
        line
    }
}

fn no_spaces(v: &str) -> String {
    v.chars()
        .map(|c| if c.is_whitespace() { '_' } else { c })
        .collect()
}

/// Renders `ERROR <kind>: <message>\n`.
pub fn error_line(err: &Error) -> String {
    format!("ERROR {}: {}\n", err.kind().as_str(), err.message())
}

/// Writes the OK line to stdout. An error (EPIPE) means the parent is gone already.
pub fn ok(line: &OkLine) -> io::Result<()> {
    write_stdout(&line.render())
}

/// Writes the LOST line to stdout (hold mode), ignoring a closed pipe.
pub fn lost(reason: &str) {
    let _ = write_stdout(&format!(
        "LOST {}\n",
        crate::error::one_line(reason, crate::error::MAX_MESSAGE)
    ));
}

/// Reports a failure: on stdout in hold mode (the parent reads it), else on stderr.
pub fn error(err: &Error, on_stdout: bool) {
    let line = error_line(err);
    if on_stdout {
        let _ = write_stdout(&line);
    } else {
        let _ = io::stderr().write_all(line.as_bytes());
    }
}

/// Writes a report (status, profiles) to stdout.
pub fn report(text: &str) -> io::Result<()> {
    write_stdout(text)
}

/// `--verbose`'s two lines, as flock(1) prints them: through stdio, so on a terminal at
/// once, and into a pipe or a file only when flock exits — after the command's own output,
/// and never after `-F` (the buffer goes with the process image at exec). Returns the lines
/// still to print once the command has ended.
pub fn flock_verbose(took: std::time::Duration, cmd: &std::ffi::OsStr) -> Option<String> {
    let text = format!(
        "flock: getting lock took {}.{:06} seconds\nflock: executing {}\n",
        took.as_secs(),
        took.subsec_micros(),
        cmd.to_string_lossy()
    );
    if stdout_is_terminal() {
        let _ = report(&text);
        None
    } else {
        Some(text)
    }
}

/// The stdout handle, for `watch.rs` to poll (never to write).
pub fn stdout_for_polling() -> io::Stdout {
    io::stdout()
}

fn write_stdout(s: &str) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_all(s.as_bytes())?;
    out.flush()
}

/// Whether stdout is a terminal (a person, not a parent's pipe, reads it).
pub fn stdout_is_terminal() -> bool {
    use std::io::IsTerminal;
    io::stdout().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    #[test]
    fn ok_line_is_byte_exact() {
        let mut l = OkLine {
            profile: "counter".into(),
            backend: "flock".into(),
            mode: Mode::Exclusive.as_str().into(),
            token: None,
            prev_crashed: false,
            extra: vec![],
        };
        assert_eq!(l.render(), "OK counter backend=flock mode=exclusive\n");
        l.token = Some("7".into());
        l.prev_crashed = true;
        l.extra.push(("since", "2026-11-22T05:00:00Z".into()));
        assert_eq!(
            l.render(),
            "OK counter backend=flock mode=exclusive token=7 prev=crashed since=2026-11-22T05:00:00Z\n"
        );
    }

    #[test]
    fn error_line_is_byte_exact() {
        let e = Error::new(Kind::Busy, "held by host=a pid=1\nsecond line");
        assert_eq!(
            error_line(&e),
            "ERROR busy: held by host=a pid=1 second line\n"
        );
    }
}
