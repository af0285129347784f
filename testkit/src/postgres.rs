//! A real, throwaway PostgreSQL cluster, for the tests (tests/postgres.rs and the partition,
//! address, fault and verify tests) and the bench (`--pg`): `initdb` as the postgres user into
//! a temp dir, `pg_ctl` on a free port with a private socket directory, `fsync=off`; stopped
//! (`pg_ctl -m immediate stop`) and removed on drop. Role `locker` (password `lockpw`) owns
//! database `app`.
//!
//! No server binaries under /usr/lib/postgresql or no `postgres` user is
//! [`NotStarted::Missing`] (`.ci/run` installs PostgreSQL); a step that fails is
//! [`NotStarted::Failed`] with its stderr.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::net::{Net, command_in};
use crate::{NotStarted, free_port};

/// How TCP clients log in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Auth {
    /// `scram-sha-256`: `locker` with password `lockpw` (the tests).
    Password,
    /// `trust`: no password to carry in a profile (the bench: a throwaway on loopback).
    Trust,
}

pub struct Pg {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    /// The address it listens on (loopback, or the server namespace's of a [`Net`]).
    pub host: String,
}

fn missing(why: &str) -> NotStarted {
    NotStarted::Missing {
        why: why.to_string(),
        installed: ".ci/run installs PostgreSQL",
    }
}

/// Runs `c` to its end; its stdout, or what failed with its stderr.
fn run(what: &str, c: &mut Command) -> Result<String, NotStarted> {
    let o = c
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NotStarted::Failed(format!("cannot run {what}: {e}")))?;
    if !o.status.success() {
        return Err(NotStarted::Failed(format!(
            "{what} failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

fn as_postgres(bin: &Path, tool: &str) -> Command {
    as_postgres_in(None, bin, tool)
}

/// [`as_postgres`] in network namespace `ns`.
fn as_postgres_in(ns: Option<&str>, bin: &Path, tool: &str) -> Command {
    let mut c = command_in(ns, "runuser");
    c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
    c.current_dir("/");
    c
}

impl Pg {
    /// A fresh cluster on loopback, [`Auth::Password`].
    pub fn start() -> Result<Pg, NotStarted> {
        Pg::start_full(Auth::Password, None, None)
    }

    /// A fresh cluster on loopback, [`Auth::Trust`].
    pub fn start_trusting() -> Result<Pg, NotStarted> {
        Pg::start_full(Auth::Trust, None, None)
    }

    /// As [`Pg::start`], with `ssl = on` serving `leaf` (chain) and `key`, and TCP clients
    /// admitted over TLS only (`hostssl` in pg_hba.conf).
    pub fn start_with(tls: Option<(&Path, &Path)>) -> Result<Pg, NotStarted> {
        Pg::start_full(Auth::Password, tls, None)
    }

    /// As [`Pg::start`], in the server namespace of `net`, listening on its address.
    pub fn start_in(net: &Net) -> Result<Pg, NotStarted> {
        Pg::start_full(Auth::Password, None, Some(net))
    }

    fn start_full(
        auth: Auth,
        tls: Option<(&Path, &Path)>,
        net: Option<&Net>,
    ) -> Result<Pg, NotStarted> {
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
            .ok_or_else(|| {
                missing("PostgreSQL server binaries not found under /usr/lib/postgresql")
            })?;
        if nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .is_none()
        {
            return Err(missing("no `postgres` user"));
        }
        let out = run(
            "mktemp",
            Command::new("mktemp")
                .arg("-d")
                .arg("-p")
                .arg(crate::scratch())
                .arg("locksmith-pg.XXXXXX"),
        )?;
        let dir = PathBuf::from(out.trim());
        // From here on, drop stops and removes whatever was started.
        let pg = Pg {
            bin,
            dir,
            port: free_port(),
            host: net.map_or("127.0.0.1", |_| Net::SERVER).to_string(),
        };
        let failed = |what: &str, e: std::io::Error| NotStarted::Failed(format!("{what}: {e}"));
        run(
            "chown",
            Command::new("chown").arg("postgres:postgres").arg(&pg.dir),
        )?;
        let pw = pg.dir.join("pw");
        fs::write(&pw, "super\n").map_err(|e| failed("superuser password file", e))?;
        run("chown", Command::new("chown").arg("postgres").arg(&pw))?;
        let data = pg.dir.join("data");
        let host_auth = match auth {
            Auth::Password => "--auth-host=scram-sha-256",
            Auth::Trust => "--auth-host=trust",
        };
        run(
            "initdb",
            as_postgres(&pg.bin, "initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-E", "UTF8", "--no-sync"])
                .args(["--auth-local=trust", host_auth])
                .arg(format!("--pwfile={}", pw.display())),
        )?;
        let mut opts = format!(
            "-p {} -k {} -c listen_addresses={} -c fsync=off -c max_connections=300",
            pg.port,
            pg.dir.display(),
            pg.host
        );
        let hba = data.join("pg_hba.conf");
        let hba_error = |e| failed("pg_hba.conf", e);
        if net.is_some() {
            // The hosts of the private network log in like loopback clients.
            let mut conf = fs::read_to_string(&hba).map_err(hba_error)?;
            conf.push_str("host all all 10.213.0.0/24 scram-sha-256\n");
            fs::write(&hba, conf).map_err(hba_error)?;
        }
        if let Some((leaf, key)) = tls {
            for (from, to) in [(leaf, "server.crt"), (key, "server.key")] {
                let to = data.join(to);
                fs::copy(from, &to).map_err(|e| failed("copy the certificate", e))?;
                fs::set_permissions(&to, fs::Permissions::from_mode(0o600))
                    .map_err(|e| failed("chmod the certificate", e))?;
                run("chown", Command::new("chown").arg("postgres").arg(&to))?;
            }
            let conf = fs::read_to_string(&hba).map_err(hba_error)?;
            let conf: String = conf
                .lines()
                .map(|l| match l.strip_prefix("host ") {
                    Some(rest) => format!("hostssl {rest}\n"),
                    None => format!("{l}\n"),
                })
                .collect();
            fs::write(&hba, conf).map_err(hba_error)?;
            opts.push_str(" -c ssl=on");
        }
        let ns = net.map(Net::server_ns);
        run(
            "pg_ctl start",
            as_postgres_in(ns.as_deref(), &pg.bin, "pg_ctl")
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(pg.dir.join("log"))
                .arg("-w")
                .arg("-o")
                .arg(&opts)
                .arg("start"),
        )?;
        for q in [
            "CREATE ROLE locker LOGIN PASSWORD 'lockpw'",
            "CREATE DATABASE app OWNER locker",
        ] {
            pg.try_sql_in("postgres", q)?;
        }
        Ok(pg)
    }

    /// Runs `q` as the superuser over the private socket; the output, unaligned.
    fn try_sql_in(&self, db: &str, q: &str) -> Result<String, NotStarted> {
        run(
            &format!("psql {q}"),
            as_postgres(&self.bin, "psql")
                .arg("-h")
                .arg(&self.dir)
                .args(["-p", &self.port.to_string(), "-U", "postgres", "-d", db])
                .args(["-v", "ON_ERROR_STOP=1", "-Atc", q]),
        )
    }

    /// [`Pg::try_sql_in`]; a failure panics (the tests).
    pub fn sql_in(&self, db: &str, q: &str) -> String {
        self.try_sql_in(db, q).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Pg::sql_in`] database `app`.
    pub fn sql(&self, q: &str) -> String {
        self.sql_in("app", q)
    }

    /// `postgres --version`.
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
