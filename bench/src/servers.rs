//! Throwaway servers for the network sections, std only, each torn down on drop:
//! - [`Pg`] (`--pg`): a PostgreSQL cluster on 127.0.0.1, the recipe of tests/postgres.rs
//!   (`initdb` / `pg_ctl` as the postgres user, a free port, a private socket directory);
//! - [`Sshfs`] (`--sshfs`): one directory served over SFTP and mounted twice, the recipe of
//!   tests/support/netfs.rs.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use testkit::free_port;
use testkit::proc::Result;

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

/// The SFTP server socat runs for each connection (Debian `openssh-sftp-server`).
pub const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";

/// How long socat may take to listen, and a mount to answer.
const MOUNT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// Timings of every heartbeat profile on the sshfs mounts: those that pass tests/netfs.rs
/// (`cache_time = "1s"`: sshfs reads file content through to the server at every open).
const NETFS_TIMING: &str = "poll = \"20ms\"\nmax_poll = \"200ms\"\nkeepalive = \"300ms\"\n\
                            stale_after = \"3s\"\ncache_time = \"1s\"\n";

/// SPEC §6's takeover window for [`NETFS_TIMING`], in ms: [stale_after − heartbeat,
/// stale_after + max_poll + heartbeat], heartbeat = min(keepalive, stale_after / 3) = 300 ms.
pub const NETFS_WINDOW_MS: (f64, f64) = (2700.0, 3500.0);

/// One served directory mounted twice over SFTP (the recipe of tests/support/netfs.rs, std
/// only): OpenSSH's `sftp-server` behind `socat` on 127.0.0.1 (no sshd, no keys), mounted at
/// `a` with sshfs's default caches and at `b` with a short directory cache. Each mount has its
/// own caches, like two NFS clients: two "hosts" looking at one directory. On drop both mounts
/// are detached (`fusermount3 -u -z`), the sshfs processes reaped, socat and every
/// `sftp-server` it forked killed, and the directories removed.
pub struct Sshfs {
    root: PathBuf,
    /// The served directory (the "server's disk"): the truth, past every client cache.
    pub server: PathBuf,
    pub a: PathBuf,
    pub b: PathBuf,
    mounts: Vec<(PathBuf, std::process::Child)>,
    socat: Option<std::process::Child>,
}

impl Sshfs {
    /// The sshfs options of mount `b` beside `directport` (mount `a`: sshfs's defaults).
    pub const B_OPTIONS: &'static str = "dcache_timeout=1";

    /// Serves a fresh directory and mounts it twice, waiting (bounded) until both mounts
    /// answer. An error says what is missing or what failed (the section is then skipped).
    pub fn start() -> Result<Sshfs> {
        let mut missing: Vec<&str> = ["sshfs", "socat", "fusermount3"]
            .into_iter()
            .filter(|p| testkit::proc::on_path(p).is_none())
            .collect();
        if !Path::new(SFTP_SERVER).exists() {
            missing.push(SFTP_SERVER);
        }
        if !Path::new("/dev/fuse").exists() {
            missing.push("/dev/fuse");
        }
        if !missing.is_empty() {
            return Err(format!(
                "needs {} (Debian: sshfs socat openssh-sftp-server fuse3)",
                missing.join(", ")
            ));
        }
        let root =
            std::env::temp_dir().join(format!("locksmith-bench-sshfs.{}", std::process::id()));
        fs::create_dir(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        // From here on, drop tears down whatever was started.
        let mut fx = Sshfs {
            server: root.join("server"),
            a: root.join("a"),
            b: root.join("b"),
            root,
            mounts: Vec::new(),
            socat: None,
        };
        let port = free_port();
        let log = fs::File::create(fx.root.join("socat.log")).map_err(|e| e.to_string())?;
        // Its own process group: drop kills socat and every child it forked at once.
        let socat = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("EXEC:{SFTP_SERVER}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn();
        fx.socat = Some(socat.map_err(|e| format!("cannot spawn socat: {e}"))?);
        for d in [&fx.server, &fx.a, &fx.b] {
            fs::create_dir(d).map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        // Ready when the kernel lists its listening socket (a probe would fork a server).
        let t0 = std::time::Instant::now();
        while !listening(port) {
            let socat = fx.socat.as_mut().ok_or("no socat")?;
            if let Ok(Some(st)) = socat.try_wait() {
                return Err(format!("socat exited ({st}): {}", fx.log("socat.log")));
            }
            if t0.elapsed() > MOUNT_TIMEOUT {
                return Err(format!("socat did not listen on 127.0.0.1:{port}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let (a, b) = (fx.a.clone(), fx.b.clone());
        fx.mount(&a, "a", &format!("directport={port}"))?;
        fx.mount(&b, "b", &format!("directport={port},{}", Self::B_OPTIONS))?;
        Ok(fx)
    }

    /// `sshfs -f` (foreground: our child, reaped on drop) at `mnt`; returns once the mount is
    /// in `/proc/self/mountinfo` and shows a name that exists only on the server.
    fn mount(&mut self, mnt: &Path, name: &str, opts: &str) -> Result<()> {
        let logname = format!("sshfs-{name}.log");
        let log = fs::File::create(self.root.join(&logname)).map_err(|e| e.to_string())?;
        let child = Command::new("sshfs")
            .args(["-f", "-o", opts])
            .arg(format!("127.0.0.1:{}", self.server.display()))
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot spawn sshfs: {e}"))?;
        self.mounts.push((mnt.to_path_buf(), child));
        let probe = format!(".mounted-{name}");
        fs::write(self.server.join(&probe), name).map_err(|e| e.to_string())?;
        let t0 = std::time::Instant::now();
        while !(mounted(mnt) && mnt.join(&probe).exists()) {
            if let Some((_, c)) = self.mounts.last_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                self.mounts.pop();
                return Err(format!(
                    "sshfs -o {opts} exited ({st}) before mounting {}: {}",
                    mnt.display(),
                    self.log(&logname).trim()
                ));
            }
            if t0.elapsed() > MOUNT_TIMEOUT {
                return Err(format!("sshfs did not mount {}", mnt.display()));
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        fs::remove_file(self.server.join(&probe)).map_err(|e| e.to_string())
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.root.join(name)).unwrap_or_default()
    }

    /// Profiles `nm-a`/`nm-b` (mkdir), `nl-a`/`nl-b` (link), `ns-a`/`ns-b` (symlink): one lock
    /// `NAME.lock` in the served directory, through mount `a` and through mount `b`, with
    /// [`NETFS_TIMING`]; and `nf-a`: flock on mount `a` with `local = true` (flock(2) through
    /// FUSE excludes nothing across mounts, so locksmith refuses it otherwise).
    pub fn profiles(&self) -> String {
        let mut t = String::new();
        for (p, backend) in [("nm", "mkdir"), ("nl", "link"), ("ns", "symlink")] {
            for (m, dir) in [("a", &self.a), ("b", &self.b)] {
                t += &format!(
                    "[profile.{p}-{m}]\nbackend = \"{backend}\"\npath = \"{}/{p}.lock\"\n{NETFS_TIMING}\n",
                    dir.display()
                );
            }
        }
        t += &format!(
            "[profile.nf-a]\nbackend = \"flock\"\npath = \"{}/nf.lock\"\nlocal = true\n",
            self.a.display()
        );
        t
    }

    /// sshfs's version line (`sshfs -V` prints fusermount3's first).
    pub fn version() -> String {
        Command::new("sshfs")
            .arg("-V")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .find(|l| l.starts_with("SSHFS"))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "sshfs ?".into())
    }
}

impl Drop for Sshfs {
    fn drop(&mut self) {
        let quiet = |c: &mut Command| {
            let _ = c
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        // Lazy: detached at once even if something still has a file open in it.
        for (mnt, _) in &self.mounts {
            quiet(Command::new("fusermount3").arg("-u").arg("-z").arg(mnt));
        }
        for (_, child) in &mut self.mounts {
            quiet(Command::new("kill").args(["-TERM", &child.id().to_string()]));
            let t0 = std::time::Instant::now();
            while matches!(child.try_wait(), Ok(None)) && t0.elapsed() < MOUNT_TIMEOUT / 3 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(mut socat) = self.socat.take() {
            // With the clients gone each sftp-server ends and socat reaps it; past a bound
            // the whole group goes at once.
            let pg = socat.id();
            let t0 = std::time::Instant::now();
            while group_has_members(pg) && t0.elapsed() < MOUNT_TIMEOUT / 3 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            quiet(Command::new("kill").args(["-KILL", "--", &format!("-{pg}")]));
            let _ = socat.wait();
        }
        // Only once nothing is mounted in it (else removing it would walk into a mount).
        if self.mounts.iter().any(|(m, _)| mounted(m)) {
            eprintln!(
                "locksmith-bench: a mount under {} is still there; leaving it",
                self.root.display()
            );
        } else {
            let _ = fs::remove_dir_all(&self.root);
        }
    }
}

/// Whether process group `pg` has a member other than its leader.
fn group_has_members(pg: u32) -> bool {
    let Ok(dir) = fs::read_dir("/proc") else {
        return false;
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != pg)
        .any(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
                // After the command's ")": state, ppid, pgrp.
                s.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(2)?.parse::<u32>().ok())
                    == Some(pg)
            })
        })
}

/// Whether a socket listens on 127.0.0.1:`port` (`/proc/net/tcp`, state 0A).
fn listening(port: u16) -> bool {
    let want = format!("0100007F:{port:04X}");
    fs::read_to_string("/proc/net/tcp").is_ok_and(|t| {
        t.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        })
    })
}

/// Whether an sshfs mount sits at `mnt` (`/proc/self/mountinfo`: mount point and type).
fn mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(&*want) && l.contains(" - fuse.sshfs "))
    })
}
