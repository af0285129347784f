//! The bench's profiles on testkit's throwaway servers (the fixtures the tests start too):
//! - `--pg` on [`Pg`]: a PostgreSQL cluster on 127.0.0.1 (trust auth);
//! - `--redis` on [`Redis`]: a redis-server on 127.0.0.1;
//! - `--sshfs` on [`Sshfs`]: one directory served over SFTP and mounted twice.

use testkit::postgres::Pg;
use testkit::redis::Redis;
use testkit::sshfs::Sshfs;

/// Profile `pg` (advisory lock `bench`) over TCP to 127.0.0.1, on a cluster started with
/// [`Pg::start_trusting`] (no password to carry in the profile).
pub fn pg_profiles(pg: &Pg) -> String {
    format!(
        "[profile.pg]\nbackend = \"postgres\"\nhost = \"127.0.0.1\"\nport = {}\n\
         dbname = \"app\"\nuser = \"locker\"\nlock = \"bench\"\n",
        pg.port
    )
}

/// Profile `rd` (key `bench`) on a throwaway [`Redis`].
pub fn redis_profiles(r: &Redis) -> String {
    format!(
        "[profile.rd]\nbackend = \"redis\"\nhost = \"127.0.0.1\"\nport = {}\nkey = \"bench\"\n",
        r.port
    )
}

/// Timings of every heartbeat profile on the sshfs mounts: those that pass tests/netfs.rs
/// (`cache_time = "1s"`: sshfs reads file content through to the server at every open).
const NETFS_TIMING: &str = "poll = \"20ms\"\nmax_poll = \"200ms\"\nkeepalive = \"300ms\"\n\
                            stale_after = \"3s\"\ncache_time = \"1s\"\n";

/// SPEC §6's takeover window for [`NETFS_TIMING`], in ms: [stale_after − heartbeat,
/// stale_after + max_poll + heartbeat], heartbeat = min(keepalive, stale_after / 3) = 300 ms.
pub const NETFS_WINDOW_MS: (f64, f64) = (2700.0, 3500.0);

/// Profiles `nm-a`/`nm-b` (mkdir), `nl-a`/`nl-b` (link), `ns-a`/`ns-b` (symlink): one lock
/// `NAME.lock` in the served directory, through mount `a` and through mount `b`, with
/// [`NETFS_TIMING`]; and `nf-a`: flock on mount `a` with `local = true` (flock(2) through
/// FUSE excludes nothing across mounts, so locksmith refuses it otherwise).
pub fn sshfs_profiles(fx: &Sshfs) -> String {
    let mut t = String::new();
    for (p, backend) in [("nm", "mkdir"), ("nl", "link"), ("ns", "symlink")] {
        for (m, dir) in [("a", &fx.a), ("b", &fx.b)] {
            t += &format!(
                "[profile.{p}-{m}]\nbackend = \"{backend}\"\npath = \"{}/{p}.lock\"\n{NETFS_TIMING}\n",
                dir.display()
            );
        }
    }
    t += &format!(
        "[profile.nf-a]\nbackend = \"flock\"\npath = \"{}/nf.lock\"\nlocal = true\n",
        fx.a.display()
    );
    t
}
