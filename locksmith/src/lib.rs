//! locksmith: a small helper process that takes a lock on behalf of its parent and holds it
//! exactly as long as the parent wants it, and not one moment longer if the parent dies.
//!
//! # Layout
//! - [`cli`]: argv and help text.
//! - [`settings`]: what every backend shares: durations, `Wait`, `Common`, password sources,
//!   and the typed key reader both front doors (profiles, addresses) use.
//! - [`profile`]: the profiles file: where it is, loading it, precedence.
//! - [`protocol`]: the only stdout writer: `OK` / `ERROR` / `LOST` lines.
//! - [`watch`]: what ends a hold or a wait (pipe closed, parent gone, stdin EOF, signal).
//! - [`backend`]: the registry of backends (`backends!{}`), the contract (`backend::lock`),
//!   waiting (`backend::wait`), holding (`backend::hold`), one file or folder per backend.
//! - [`commands`]: hold, run, status, break, verify and profiles, glued from the above.
//! - [`companion`]: a build of the local backends hands other locks to `locksmith-net`.
//! - [`host`]: host identity and proof of death; [`sys`]: the few raw syscalls; [`spawn`]:
//!   starting `run`'s command (vfork, dying with locksmith);
//!   [`files`]: opening files by name without blocking, kind-checked, reads capped.
//! - [`error`]: error kinds and their exit codes; `tls`: rustls settings of the network backends.

pub mod backend;
pub mod cli;
pub mod commands;
pub mod companion;
pub mod error;
pub mod files;
pub mod flock1;
pub mod host;
pub mod log;
pub mod profile;
pub mod protocol;
pub mod settings;
pub mod spawn;
pub mod sys;
#[cfg(any(
    feature = "ftp",
    feature = "postgres",
    feature = "etcd",
    feature = "redis"
))]
pub mod tls;
pub mod watch;
