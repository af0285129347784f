//! What the integration tests (`tests/`, a dev-dependency) and the bench (`bench/`) share, so
//! that each is written once.
//!
//! # Layout
//! - [`proc`]: the process harness. [`proc::Proc`] (every wait armed on a watchdog, errors as
//!   values: the bench) and [`proc::Held`] (a line reader with `poll(2)` deadlines and a
//!   parent's ending on drop: the tests), and the `/proc` readings both make.
//! - this file: [`missing`] (the one rule for what a machine lacks), [`free_port`],
//!   [`token_of`].

pub mod proc;

/// The one rule for what a test needs and this machine lacks (a real server, a tool, root):
/// outside CI a visible `SKIP: why` line, and the caller returns without testing; under
/// `CI=true` (`.ci/run` installs everything, `installed`) the absence fails the test.
pub fn missing(why: &str, installed: &str) {
    assert!(std::env::var("CI").is_err(), "CI=true: {why} ({installed})");
    eprintln!("SKIP: {why}");
}

/// A loopback port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The fencing token of an OK line (`token=N`); panics if it has none.
pub fn token_of(line: &str) -> u64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("token="))
        .unwrap_or_else(|| panic!("no token in {line:?}"))
        .parse()
        .unwrap()
}
