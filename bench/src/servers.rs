//! Throwaway servers for the network sections, std only, each torn down on drop:
//! - [`Pg`] (`--pg`): a PostgreSQL cluster on 127.0.0.1, the recipe of tests/postgres.rs
//!   (`initdb` / `pg_ctl` as the postgres user, a free port, a private socket directory);
//! - the profiles of `--sshfs` on testkit's [`Sshfs`] (one directory served over SFTP and
//!   mounted twice, the fixture tests/netfs.rs uses too).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::free_port;
use testkit::proc::Result;
use testkit::sshfs::Sshfs;

fn run(what: &str, c: &mut Command) -> Result<String> {
    let o = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "{what} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
    c.current_dir("/");
    c
}

/// A cluster with role `locker` owning database `app`; local and TCP auth `trust` (a
/// throwaway on loopback: no password to carry in the profile).
pub struct Pg {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
}

impl Pg {
    /// Needs root (runuser), the `postgres` user and /usr/lib/postgresql/*/bin.
    pub fn start() -> Result<Pg> {
        let bin = fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| {
                let mut v: Vec<PathBuf> = d
                    .filter_map(|e| Some(e.ok()?.path().join("bin")))
                    .filter(|p| p.join("initdb").is_file())
                    .collect();
                v.sort();
                v.pop()
            })
            .ok_or("PostgreSQL server binaries not found under /usr/lib/postgresql")?;
        let out = run(
            "mktemp",
            Command::new("mktemp").args(["-d", "/tmp/locksmith-bench-pg.XXXXXX"]),
        )?;
        let dir = PathBuf::from(out.trim());
        run(
            "chown",
            Command::new("chown").arg("postgres:postgres").arg(&dir),
        )?;
        let pg = Pg {
            bin,
            dir,
            port: free_port(),
        };
        let data = pg.dir.join("data");
        run(
            "initdb",
            as_postgres(&pg.bin, "initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-E", "UTF8", "--no-sync"])
                .args(["--auth-local=trust", "--auth-host=trust"]),
        )?;
        run(
            "pg_ctl start",
            as_postgres(&pg.bin, "pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(pg.dir.join("log"))
                .arg("-w")
                .arg("-o")
                .arg(format!(
                    "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
                    pg.port,
                    pg.dir.display()
                ))
                .arg("start"),
        )?;
        for q in [
            "CREATE ROLE locker LOGIN",
            "CREATE DATABASE app OWNER locker",
        ] {
            run(
                "psql",
                as_postgres(&pg.bin, "psql")
                    .arg("-h")
                    .arg(&pg.dir)
                    .args([
                        "-p",
                        &pg.port.to_string(),
                        "-U",
                        "postgres",
                        "-d",
                        "postgres",
                    ])
                    .args(["-v", "ON_ERROR_STOP=1", "-Atc", q]),
            )?;
        }
        Ok(pg)
    }

    /// Profile `pg` (advisory lock `bench`) over TCP to 127.0.0.1.
    pub fn profiles(&self) -> String {
        format!(
            "[profile.pg]\nbackend = \"postgres\"\nhost = \"127.0.0.1\"\nport = {}\n\
             dbname = \"app\"\nuser = \"locker\"\nlock = \"bench\"\n",
            self.port
        )
    }

    pub fn version(&self) -> String {
        run(
            "postgres --version",
            Command::new(self.bin.join("postgres")).arg("--version"),
        )
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "PostgreSQL ?".into())
    }
}

impl Drop for Pg {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let _ = fs::remove_dir_all(&self.dir);
    }
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
