//! A throwaway PostgreSQL cluster for the `--pg` section, on 127.0.0.1, stopped and removed
//! on drop: the recipe of tests/postgres.rs (`initdb` / `pg_ctl` as the postgres user, a free
//! port, a private socket directory), with the system's own tools; std only.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::proc::Result;

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

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
            port: free_port()?,
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
