//! A real network filesystem for the file backends (issue 12), for the tests (tests/netfs.rs,
//! tests/verify.rs) and the bench (`--sshfs`). No mocks: a real SFTP server and real FUSE
//! mounts.
//!
//! [`Sshfs`]: one server directory, served by OpenSSH's `sftp-server` behind `socat` on
//! 127.0.0.1 (no sshd, no keys), mounted twice with `sshfs -o directport=PORT`. Each mount has
//! its own caches, like two NFS clients: two "hosts" looking at one directory. Mount `a` keeps
//! sshfs's default caches, mount `b` a short one ([`Sshfs::start_with`]: options of one's own).
//! The two are mounted with sshfs's two argument orders (mount `a`: `-o OPTS HOST MNT`; mount
//! `b`: `HOST MNT -oOPTS`, as mount.fuse3 runs it): locksmith reads the caches of an sshfs
//! mount from its daemon's command line (issue 28 item 6).
//!
//! A missing program (sshfs, socat, sftp-server, fusermount3) or a mount that cannot be made
//! (no `/dev/fuse`) is [`NotStarted::Missing`] (`.ci/run` installs `sshfs socat
//! openssh-sftp-server fuse3`); anything else that goes wrong is [`NotStarted::Failed`].

use crate::proc::on_path;
use crate::{NotStarted, free_port};
use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The SFTP server socat runs for each connection.
pub const SFTP_SERVER: &str = "/usr/lib/openssh/sftp-server";

/// How long a mount may take to answer.
const MOUNT_TIMEOUT: Duration = Duration::from_secs(15);

/// One server directory mounted twice over SFTP. Everything goes on drop: both mounts are
/// detached (`fusermount3 -u -z`), the sshfs processes reaped, socat and every
/// `sftp-server` it forked killed, the directories removed — also when a test panics.
pub struct Sshfs {
    /// The served directory itself (the "server's disk"): read it here for the truth, past
    /// every client cache.
    pub server: PathBuf,
    /// Mount `a`: with [`Sshfs::start`], sshfs's default caches (directory cache 20 s, kernel
    /// attributes 1 s).
    pub a: PathBuf,
    /// Mount `b`: with [`Sshfs::start`], a short directory cache (`dcache_timeout=1`; kernel
    /// attributes 1 s).
    pub b: PathBuf,
    /// The TCP port socat listens on (127.0.0.1).
    pub port: u16,
    /// Mount points whose sshfs process is running (unmounted on drop).
    mounts: Vec<(PathBuf, Child)>,
    socat: Option<Child>,
    /// Holds `server/`, `a/`, `b/` and the logs; removed last.
    root: Option<tempfile::TempDir>,
}

impl Sshfs {
    /// The longest either cache of mount `b` may serve an old answer: `dcache_timeout=1` plus
    /// the kernel's FUSE attribute/entry cache (1 s). (Mount `a` keeps sshfs's default
    /// directory cache, 20 s, plus the kernel's 1 s.)
    pub const B_CACHE: Duration = Duration::from_secs(2);
    /// The sshfs options of mount `b` (beside `directport`).
    pub const B_OPTIONS: &'static str = "dcache_timeout=1";

    /// Starts a fresh server directory and both mounts, waiting (bounded) until both answer.
    pub fn start() -> Result<Sshfs, NotStarted> {
        Self::start_with("", Self::B_OPTIONS)
    }

    /// [`Sshfs::start`] with sshfs options `a` and `b` (comma-separated, beside `directport`;
    /// empty: sshfs's defaults) for mounts `a` and `b`.
    pub fn start_with(a_options: &str, b_options: &str) -> Result<Sshfs, NotStarted> {
        let missing: Vec<&str> = ["sshfs", "socat", "fusermount3"]
            .into_iter()
            .filter(|p| on_path(p).is_none())
            .chain((!Path::new(SFTP_SERVER).exists()).then_some(SFTP_SERVER))
            .collect();
        if !missing.is_empty() {
            return Err(skip(format!(
                "sshfs needs {} (Debian: sshfs socat openssh-sftp-server fuse3)",
                missing.join(", ")
            )));
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(skip("sshfs needs /dev/fuse".into()));
        }
        let root = tempfile::Builder::new()
            .prefix("locksmith-sshfs-")
            .tempdir_in(crate::scratch())
            .map_err(|e| failed(format!("tempdir: {e}")))?;
        let server = root.path().join("server");
        let a = root.path().join("a");
        let b = root.path().join("b");
        for d in [&server, &a, &b] {
            fs::create_dir(d).map_err(|e| failed(format!("mkdir {}: {e}", d.display())))?;
        }
        let port = free_port();
        let log = fs::File::create(root.path().join("socat.log"))
            .map_err(|e| failed(format!("socat.log: {e}")))?;
        // Its own process group, so that drop can kill socat and every child it forked
        // (one socat and one sftp-server per connection) at once.
        let socat = Command::new("socat")
            .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"))
            .arg(format!("EXEC:{SFTP_SERVER}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .process_group(0)
            .spawn()
            .map_err(|e| failed(format!("cannot spawn socat: {e}")))?;
        let mut fx = Sshfs {
            server,
            a,
            b,
            port,
            mounts: Vec::new(),
            socat: Some(socat),
            root: Some(root),
        };
        // socat is ready when the kernel lists its listening socket (no probe connection:
        // that would fork a server for nothing).
        let t0 = Instant::now();
        while !listening(port) {
            if let Ok(Some(st)) = fx.socat.as_mut().map_or(Ok(None), Child::try_wait) {
                return Err(failed(format!(
                    "socat exited ({st}) before listening on 127.0.0.1:{port}: {}",
                    fx.log("socat.log")
                )));
            }
            if t0.elapsed() > MOUNT_TIMEOUT {
                return Err(failed(format!(
                    "socat did not listen on 127.0.0.1:{port} within {MOUNT_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let (a, b) = (fx.a.clone(), fx.b.clone());
        fx.mount(&a, "a", a_options)?;
        fx.mount(&b, "b", b_options)?;
        Ok(fx)
    }

    /// `sshfs -f` (foreground: our child, reaped on drop) at `mnt`; returns once the mount is
    /// in `/proc/self/mountinfo` and answers `stat` with the served directory's contents. An
    /// sshfs that exits first is [`NotStarted::Missing`] (FUSE unusable here?). Mount `a`
    /// gives its options first (`-o OPTS`), the others after the mount point (`-oOPTS`).
    fn mount(&mut self, mnt: &Path, name: &str, extra: &str) -> Result<(), NotStarted> {
        let logname = format!("sshfs-{name}.log");
        let mut opts = format!("directport={}", self.port);
        if !extra.is_empty() {
            opts = format!("{opts},{extra}");
        }
        let host = format!("127.0.0.1:{}", self.server.display());
        let mut c = Command::new("sshfs");
        c.arg("-f");
        if name == "a" {
            c.arg("-o").arg(&opts).arg(&host).arg(mnt);
        } else {
            c.arg(&host).arg(mnt).arg(format!("-o{opts}"));
        }
        c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(
            fs::File::create(self.root_path().join(&logname))
                .map_err(|e| failed(format!("{logname}: {e}")))?,
        );
        let child = c
            .spawn()
            .map_err(|e| failed(format!("cannot spawn sshfs: {e}")))?;
        self.mounts.push((mnt.to_path_buf(), child));
        // A probe name that exists only on the server: seen through the mount, the mount is
        // sshfs's and it answers.
        let probe = format!(".mounted-{name}");
        let probe_error = |e: std::io::Error| failed(format!("{probe}: {e}"));
        fs::write(self.server.join(&probe), name).map_err(probe_error)?;
        let t0 = Instant::now();
        loop {
            if mounted(mnt) && mnt.join(&probe).exists() {
                break;
            }
            if let Some((_, child)) = self.mounts.last_mut()
                && let Ok(Some(st)) = child.try_wait()
            {
                let why = format!(
                    "sshfs -o {opts} exited ({st}) before mounting {}: {}",
                    mnt.display(),
                    self.log(&logname)
                );
                self.mounts.pop();
                return Err(NotStarted::Missing {
                    why,
                    installed: "sshfs must mount under CI",
                });
            }
            if t0.elapsed() > MOUNT_TIMEOUT {
                return Err(failed(format!(
                    "sshfs did not mount {} within {MOUNT_TIMEOUT:?}: {}",
                    mnt.display(),
                    self.log(&logname)
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        fs::remove_file(self.server.join(&probe)).map_err(probe_error)
    }

    fn root_path(&self) -> &Path {
        self.root.as_ref().unwrap().path()
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.root_path().join(name)).unwrap_or_default()
    }

    /// The mount point `m` (`'a'` or `'b'`).
    pub fn mount_point(&self, m: char) -> &Path {
        match m {
            'a' => &self.a,
            'b' => &self.b,
            _ => panic!("no mount {m:?}"),
        }
    }

    /// The fixture's processes: both sshfs, socat and everything socat forked.
    pub fn processes(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.mounts.iter().map(|(_, c)| c.id() as i32).collect();
        if let Some(socat) = &self.socat {
            v.push(socat.id() as i32);
            v.extend(crate::proc::group_members(socat.id() as i32));
        }
        v
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

    /// Names in the served directory, read on the server (no client cache in the way).
    pub fn server_listing(&self) -> Vec<String> {
        crate::fuse::listing(&self.server)
    }
}

impl Drop for Sshfs {
    fn drop(&mut self) {
        crate::fuse::unmount(&mut self.mounts);
        if let Some(mut socat) = self.socat.take() {
            // With the clients gone each sftp-server ends, and socat reaps its forks: wait for
            // that (orphans would stay zombies where init does not reap), then end socat. Past
            // the bound, the whole group goes at once.
            let pg = socat.id() as i32;
            let deadline = Instant::now() + Duration::from_secs(5);
            while !crate::proc::group_members(pg).is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pg),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = socat.wait();
        }
        crate::fuse::remove_root(&mut self.root, &self.mounts, FSTYPE);
    }
}

/// A program or device this machine lacks.
fn skip(why: String) -> NotStarted {
    NotStarted::Missing {
        why,
        installed: ".ci/run installs sshfs socat openssh-sftp-server fuse3",
    }
}

fn failed(why: String) -> NotStarted {
    NotStarted::Failed(why)
}

/// Whether a socket listens on 127.0.0.1:`port` (`/proc/net/tcp`, state 0A).
pub(crate) fn listening(port: u16) -> bool {
    let want = format!("0100007F:{port:04X}");
    fs::read_to_string("/proc/net/tcp").is_ok_and(|t| {
        t.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == want && f[3] == "0A"
        })
    })
}

/// Whether an sshfs mount sits at `mnt` (`/proc/self/mountinfo`, field 5 and the type).
pub fn mounted(mnt: &Path) -> bool {
    crate::fuse::mounted(mnt, FSTYPE)
}

const FSTYPE: &str = "fuse.sshfs";
