//! Crash-safe locks held by a `locksmith` helper process.
//!
//! A [`NetLock`] is a lock — a `flock(2)` file, a lock directory on NFS or on an FTP server,
//! an etcd key, a PostgreSQL advisory lock, an S3 object, a Redis key — taken and held by a small helper process,
//! `locksmith`, on behalf of this one. The helper releases it when the guard is dropped or
//! [unlocked](NetLock::unlock), and also **at once if this process dies**, however it dies.
//! This crate only names a *profile*, or a *lock address*: a profile's backend, server and
//! credentials are written in the profiles file the helper reads; an address
//! (`"/var/lock/x.lock"`, `"mkdir:/srv/locks/x"`, `"ftp://locker@host/locks/x"`, `"s3://bucket/locks/x"`,
//! `"redis://host/?key=locks:x"`, ...; see
//! the helper's `--help`) needs no profiles file and never carries a password (the helper
//! refuses one), so no password ever travels on a command line.
//!
//! ```no_run
//! let lock = netlock::NetLock::new("phonestuff")?; // blocks until the lock is ours
//! // ... upload phone.tsv ...
//! lock.unlock()?;                                  // returns once the lock is really gone
//!
//! let lock = netlock::NetLock::new("mkdir:/srv/locks/x")?; // by address, no profiles file
//! # Ok::<(), netlock::Error>(())
//! ```
//!
//! Not waiting, or waiting a while:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! if let Some(lock) = netlock::NetLock::try_new("nightly")? {
//!     // ... run the job ...
//!     lock.unlock()?;
//! }
//!
//! let lock = netlock::NetLock::builder("deploy")
//!     .profiles("deploy/locks.toml")
//!     .wait(Duration::from_secs(60))
//!     .lock()?; // a `Busy` error if it is still held after a minute
//! println!("fencing token: {:?}", lock.token());
//! # Ok::<(), netlock::Error>(())
//! ```
//!
//! Several locks at once, all held or none ([`Builder::also`]):
//!
//! ```no_run
//! let locks = netlock::NetLock::builder("mkdir:/srv/locks/db")
//!     .also("/var/lock/cache.lock")
//!     .lock()?;
//! println!("fencing tokens, in the order named: {:?}", locks.tokens());
//! # Ok::<(), netlock::Error>(())
//! ```
//!
//! A semaphore: up to N holders at once, each in its own slot ([`Builder::slots`]):
//!
//! ```no_run
//! let lock = netlock::NetLock::builder("/var/lock/gpu").slots(2).lock()?;
//! println!("GPU {:?}", lock.slot()); // Some(0) or Some(1)
//! # Ok::<(), netlock::Error>(())
//! ```
//!
//! A fair queue: waiters served in the order they began to wait ([`Builder::fair`]; every
//! contender of the lock should ask for it):
//!
//! ```no_run
//! let lock = netlock::NetLock::builder("mkdir:/shared/locks/deploy").fair(true).lock()?;
//! # Ok::<(), netlock::Error>(())
//! ```
//!
//! Errors keep the helper's classification ([`ErrorKind`]: busy, config, unavailable,
//! denied, lost, ...) and its message; `try_*` calls return `Ok(None)` rather than a busy
//! error.
//!
//! # Layout
//!
//! - `guard.rs`: [`NetLock`] and [`Builder`]; holding, watching for `LOST`, releasing.
//! - `spawn.rs`: finding the helper and starting it with its pipes.
//! - `protocol.rs`: reading and parsing the helper's `OK` / `ERROR` / `LOST` lines.
//! - `error.rs`: [`Error`] and [`ErrorKind`].
//!
//! # How it works
//!
//! The guard runs
//! `locksmith --watch-stdin [--profiles FILE] [--wait D] [--shared] [--slots N] [--fair] hold TAG [TAG...]`
//! with stdin and stdout on pipes it keeps and stderr inherited (the helper's waiting
//! message and logs appear on this process's stderr). The helper writes one line:
//! `OK <profile> backend=<name> mode=<exclusive|shared> [token=<n>] [prev=crashed]
//! [slot=<k> slots=<n>] ...` (for several locks, `backend=`, `mode=`, `token=`, `slot=` and
//! `slots=` hold one comma-separated value per lock, and `locks=N` follows), or
//! `ERROR <kind>: <message>` and exits with a sysexits code (64 usage, 69 unavailable, 74
//! lost/io, 75 busy, 77 denied, 78 config). While held it writes nothing more, except
//! `LOST <reason>` if the lock is lost (then it exits 74). The guard releases by closing the
//! helper's stdin and waiting for it to exit.
//!
//! ## Finding the helper
//!
//! In this order:
//! 1. [`Builder::helper`], as given;
//! 2. `$LOCKSMITH_BIN` (set but empty counts as unset), as given;
//! 3. `locksmith` in the directory of [`std::env::current_exe`];
//! 4. `locksmith` in that directory's parent, **only** when that directory is cargo's `deps`
//!    (so test binaries in `target/debug/deps` find `target/debug/locksmith`);
//! 5. `locksmith` in each absolute `$PATH` entry, in order (empty and relative entries are
//!    skipped: no implicit current directory).
//!
//! Steps 3–5 skip a candidate unless its directory is owned by root or by this user and is
//! not writable by group or others (a sticky bit is not enough: anyone may still create the
//! name `locksmith` in `/tmp`), every directory above it is owned by root or this user and
//! is not writable by others unless sticky, and the file itself is owned by root or this
//! user and not writable by group or others. With no candidate left the lock fails with a
//! [spawn error](ErrorKind::Spawn) naming what was skipped; `locksmith` is never handed to
//! `execvp` to look up on its own.
//!
//! # Resource leaking
//!
//! - `Drop` releases the lock and reaps the helper; it never panics, and reports a failed
//!   release on stderr. Use [`NetLock::unlock`] to get that error instead.
//! - **If this process is `SIGKILL`ed** (or exits, or aborts), the helper notices its
//!   stdout/stdin pipes closing and its parent's pidfd, and releases at once.
//! - **If the helper is `SIGKILL`ed**, nobody releases the lock: it becomes breakable as
//!   the backend allows — `flock` at once (the kernel drops it), `postgres` and `etcd` when
//!   the session or lease ends, the directory and link backends at once on same-host proof
//!   of death, else after `stale_after` without a heartbeat. [`NetLock::is_held`] turns
//!   false and [`NetLock::unlock`] returns a [`Lost`](ErrorKind::Lost) error.
//! - This does **not** guarantee mutual exclusion for a holder that is paused (`SIGSTOP`,
//!   a VM pause) longer than `stale_after`: its lock can be broken under it. Pass the
//!   [fencing token](NetLock::token) to whatever you write to, and let it refuse old ones.
//! - Each guard owns one helper process and one small thread, which both end with it.
//!   More in [`NetLock`]'s own `# Resource leaking` section.
//!
//! # Security
//!
//! - Whoever can set `$LOCKSMITH_BIN` or write to the helper it names decides which program
//!   runs as you and can fake a lock. The other lookups trust only directories that root or
//!   you alone can write (see "Finding the helper"): a `locksmith` planted by another user in
//!   `/tmp` or in a group-writable build directory is never run. Programs that matter should
//!   still pin the binary with [`Builder::helper`].
//! - Only the profile name, the profiles path, the wait, `--shared`, `--slots` and `--fair` go
//!   on the helper's command line (visible in `ps`). Credentials stay in the profiles file or in the
//!   environment variables it names; the helper inherits this process's environment.
//! - The helper refuses a profiles file holding an inline `password`, or any
//!   `password_file`, that is readable by group or others.
//! - Profile names are checked here (`[A-Za-z0-9._-]{1,64}`, no leading `-`) before
//!   anything is spawned, so a name can never be read as an option.

#![warn(missing_docs)]

mod error;
mod guard;
mod protocol;
mod spawn;

pub use error::{Error, ErrorKind};
pub use guard::{Builder, NetLock};

/// The README's examples, compiled as doctests so that they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeExamples;
