//! The file backends' common ground: the lock's parent directory, opened once and used for
//! everything else (`*at` calls); the names beside the lock; the state record; which
//! filesystem the lock lives on and whether the profile may use it there; and the heartbeat
//! record that carries liveness over network filesystems. Each backend keeps only its naming
//! scheme.
//!
//! # Fresh and cached reads
//! A network filesystem may answer `stat`, `readlink` and directory listings from a cache:
//! sshfs for 20 s by default, NFS for `acdirmax` (60 s), each mount on its own. A waiter that
//! judged a holder from such a read could break a live lock. Two things do reach the server
//! every time: *mutations* (`mkdir`, `link`, `symlink`, `rename`, `unlink`, `open(O_EXCL)`),
//! whose answer the server decides, and the *content* of a regular file opened anew (NFS
//! close-to-open consistency; FUSE filesystems read through to their server). So:
//! - liveness is the content of a regular *heartbeat record* ([`write_beat`]): the owner
//!   record plus a counter its holder rewrites in place every heartbeat period, read by
//!   waiters with a fresh `open` + `read` ([`LockDir::read_file`]);
//! - a waiter or breaker removes a holder only by a *claim*, a mutation on a name that carries
//!   the acquisition's nonce, or after re-reading the lock's content fresh; cached names only
//!   propose candidates (see `stale.rs`).
//!
//! Where a filesystem might cache even content (an unknown FUSE filesystem), the profile must
//! say how long with `cache_time`, and `stale_after` must exceed it ([`check`]); `locksmith
//! verify --peer` measures it. Where the mount says how long it caches, that counts unless the
//! profile states otherwise: NFS's mount options, and an sshfs mount's options read from the
//! command line of the sshfs process serving it (`sshfs.rs`).

mod config;
mod dir;
mod fs;
pub mod leftover;
pub mod netroom;
pub mod probe;
mod record;
pub mod room;
mod sshfs;
pub mod state;

/// The places of a file lock's fair queue (SPEC §3b, `fair.rs`): the places held are listed
/// in one read of the parent ([`LockDir::slots_present`]), so a line of many costs a waiter
/// one listing, not a look at each place.
pub const PLACES: u32 = 1024;

pub use config::{BESIDE, FS_KEYS, FsConfig, HEARTBEAT_KEYS, MAX_LOCK_NAME};
pub use dir::LockDir;
pub use fs::*;
pub use record::*;

/// Whether the acquisition with fencing token `token` (none: no state to issue from) looks for
/// what dead lockers left beside the lock (mkdir's unpublished `.new`, link's `.tmp`,
/// symlink's readers' groups): one in 16, the one whose token is a multiple of 16. Looking lists the parent,
/// which costs with its size — 0.81 ms per cycle with 1,000 other entries beside the lock,
/// were it every cycle (issue 28) — and a leftover costs nothing but a name until then.
pub fn tidies(token: Option<u64>) -> bool {
    token.is_none_or(|t| t % 16 == 0)
}
