//! SMB for the file backends (issue 28): a private Samba server on 127.0.0.1 sharing a temp
//! directory, mounted twice with the FUSE client `smbnetfs` — two mounts, two "hosts". No
//! kernel CIFS client here (`/proc/filesystems`), and none needed: libsmbclient speaks to the
//! real `smbd`. What the mounts can do (FACTS.md): `mkdir(2)` and `O_CREAT|O_EXCL` exclusive
//! across mounts, no `symlink(2)` (ENOSYS) nor `link(2)` (EPERM), rename over a file is
//! unlink-then-rename, modes made up (the share root reads 0777).
//!
//! [`Smb::a`] and [`Smb::b`] are the subdirectory `dir` of the share through each mount (the
//! client shows it 0755; the share root is [`Smb::root_a`]). A missing program
//! (`smbd`, `smbpasswd`, `smbnetfs`, `fusermount3`) or `/dev/fuse` is [`NotStarted::Missing`]
//! (`.ci/run` installs `samba smbnetfs smbclient fuse3`); anything else is
//! [`NotStarted::Failed`]. Drop unmounts both (`fusermount3 -u -z`), ends `smbnetfs` and the
//! whole `smbd` process group, and removes the directories.

use crate::proc::on_path;
use crate::{NotStarted, free_port};
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);
/// The share's one user (smbnetfs logs in with it; never on any command line).
const USER: &str = "root";

/// One share on a private `smbd` (Samba's defaults otherwise), mounted twice.
pub struct Smb {
    /// The shared directory on the server's disk: what is really there.
    pub share: PathBuf,
    /// `share/dir` on the server's disk.
    pub server: PathBuf,
    /// `share/dir` through mount `a` and through mount `b`.
    pub a: PathBuf,
    pub b: PathBuf,
    /// The share's root through mount `a` (0777 as the client shows it).
    pub root_a: PathBuf,
    pub port: u16,
    mounts: Vec<(PathBuf, Child)>,
    smbd: Option<Child>,
    root: Option<tempfile::TempDir>,
}

impl Smb {
    /// Starts `smbd` and both mounts, waiting (bounded) until both show the share.
    pub fn start() -> Result<Smb, NotStarted> {
        let missing: Vec<&str> = ["smbd", "smbpasswd", "smbnetfs", "fusermount3"]
            .into_iter()
            .filter(|p| on_path(p).is_none() && !Path::new("/usr/sbin").join(p).exists())
            .collect();
        if !missing.is_empty() {
            return Err(skip(format!(
                "SMB needs {} (Debian: samba smbnetfs smbclient fuse3)",
                missing.join(", ")
            )));
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(skip("smbnetfs needs /dev/fuse".into()));
        }
        let root = tempfile::Builder::new()
            .prefix("locksmith-smb-")
            .tempdir()
            .map_err(|e| failed(format!("tempdir: {e}")))?;
        let r = root.path().to_path_buf();
        let share = r.join("share");
        let server = share.join("dir");
        for d in [
            "share",
            "share/dir",
            "priv",
            "lock",
            "state",
            "cache",
            "pid",
            "ncalrpc",
            "ma",
            "mb",
            "home/.smb",
        ] {
            fs::create_dir_all(r.join(d)).map_err(|e| failed(format!("mkdir {d}: {e}")))?;
        }
        fs::set_permissions(r.join("share"), fs::Permissions::from_mode(0o755))
            .map_err(|e| failed(format!("chmod share: {e}")))?;
        let port = free_port();
        let conf = r.join("smb.conf");
        let p = |d: &str| r.join(d).display().to_string();
        let text = format!(
            "[global]\n  smb ports = {port}\n  interfaces = 127.0.0.1\n  bind interfaces only = yes\n  disable netbios = yes\n  server role = standalone server\n  private dir = {}\n  lock directory = {}\n  state directory = {}\n  cache directory = {}\n  pid directory = {}\n  ncalrpc dir = {}\n  passdb backend = tdbsam:{}/passdb.tdb\n  log file = {}/log.%m\n[share]\n  path = {}\n  read only = no\n",
            p("priv"),
            p("lock"),
            p("state"),
            p("cache"),
            p("pid"),
            p("ncalrpc"),
            p("priv"),
            p("."),
            share.display()
        );
        fs::write(&conf, text).map_err(|e| failed(format!("smb.conf: {e}")))?;
        // A password of our own, on stdin only.
        let password = format!("pw-{port}-{}", std::process::id());
        let mut add = Command::new(sbin("smbpasswd"))
            .arg("-c")
            .arg(&conf)
            .args(["-s", "-a", USER])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(format!("cannot spawn smbpasswd: {e}")))?;
        let _ = write!(add.stdin.take().expect("piped"), "{password}\n{password}\n");
        let out = add
            .wait_with_output()
            .map_err(|e| failed(format!("smbpasswd: {e}")))?;
        if !out.status.success() {
            return Err(failed(format!(
                "smbpasswd -a {USER}: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let log = fs::File::create(r.join("smbd.out")).map_err(|e| failed(format!("{e}")))?;
        // A process group of its own: its shutdown signals its process group.
        let mut c = Command::new(sbin("smbd"));
        c.args(["--foreground", "--no-process-group", "--debug-stdout"])
            .arg(format!("--configfile={}", conf.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| failed(format!("{e}")))?)
            .stderr(log)
            .process_group(0);
        let smbd = c
            .spawn()
            .map_err(|e| failed(format!("cannot spawn smbd: {e}")))?;
        let home = r.join("home");
        fs::write(
            home.join(".smb/smb.conf"),
            "[global]\n  disable netbios = yes\n  name resolve order = host\n  client min protocol = SMB2_02\n",
        )
        .map_err(|e| failed(format!("client smb.conf: {e}")))?;
        let netfs_conf = home.join(".smb/smbnetfs.conf");
        fs::write(
            &netfs_conf,
            format!("smb_query_browsers \"false\"\nauth \"{USER}\" \"{password}\"\n"),
        )
        .and_then(|()| fs::set_permissions(&netfs_conf, fs::Permissions::from_mode(0o600)))
        .map_err(|e| failed(format!("smbnetfs.conf: {e}")))?;
        let at = format!("127.0.0.1:{port}/share");
        let mut fx = Smb {
            a: r.join("ma").join(&at).join("dir"),
            b: r.join("mb").join(&at).join("dir"),
            root_a: r.join("ma").join(&at),
            share,
            server,
            port,
            mounts: Vec::new(),
            smbd: Some(smbd),
            root: Some(root),
        };
        let t0 = Instant::now();
        while !crate::sshfs::listening(port) {
            if let Some(Ok(Some(st))) = fx.smbd.as_mut().map(Child::try_wait) {
                return Err(failed(format!(
                    "smbd exited ({st}): {}",
                    fx.log("smbd.out")
                )));
            }
            if t0.elapsed() > TIMEOUT {
                return Err(failed(format!("smbd did not listen on 127.0.0.1:{port}")));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        for m in ["ma", "mb"] {
            fx.mount(m)?;
        }
        Ok(fx)
    }

    fn mount(&mut self, name: &str) -> Result<(), NotStarted> {
        let r = self.root_path().to_path_buf();
        let mnt = r.join(name);
        let logname = format!("smbnetfs-{name}.log");
        let child = Command::new("smbnetfs")
            .arg(&mnt)
            .arg("-f")
            .arg("-o")
            .arg(format!(
                "config={}",
                r.join("home/.smb/smbnetfs.conf").display()
            ))
            .env("HOME", r.join("home"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                fs::File::create(r.join(&logname))
                    .map_err(|e| failed(format!("{logname}: {e}")))?,
            )
            .spawn()
            .map_err(|e| failed(format!("cannot spawn smbnetfs: {e}")))?;
        self.mounts.push((mnt.clone(), child));
        let probe = format!(".mounted-{name}");
        fs::write(self.server.join(&probe), name).map_err(|e| failed(format!("{probe}: {e}")))?;
        let seen = mnt
            .join(format!("127.0.0.1:{}/share/dir", self.port))
            .join(&probe);
        let t0 = Instant::now();
        while !(mounted(&mnt) && seen.exists()) {
            if let Some((_, c)) = self.mounts.last_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                let why = format!("smbnetfs exited ({st}): {}", self.log(&logname));
                self.mounts.pop();
                return Err(NotStarted::Missing {
                    why,
                    installed: "smbnetfs must mount under CI",
                });
            }
            if t0.elapsed() > TIMEOUT {
                return Err(failed(format!(
                    "smbnetfs did not show the share at {} within {TIMEOUT:?}: {}",
                    mnt.display(),
                    self.log(&logname)
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        fs::remove_file(self.server.join(&probe)).map_err(|e| failed(format!("{probe}: {e}")))
    }

    fn root_path(&self) -> &Path {
        self.root.as_ref().expect("until drop").path()
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.root_path().join(name)).unwrap_or_default()
    }

    /// The last lines of every daemon's log (both smbnetfs, smbd's own and its per-client
    /// `log.*`), for a failed test's message: an error the mounts answered (CI once saw
    /// ECONNABORTED from one mount's `mkdir`) is explained there if anywhere.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut names: Vec<String> = fs::read_dir(self.root_path())
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| {
                        n.starts_with("smbnetfs-") || n.starts_with("log.") || n == "smbd.out"
                    })
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
            .iter()
            .map(|n| {
                let text = self.log(n);
                let all: Vec<&str> = text.lines().collect();
                let tail = all[all.len().saturating_sub(lines)..].join("\n    ");
                format!(
                    "{n} (last {} of {} lines):\n    {tail}",
                    lines.min(all.len()),
                    all.len()
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// `share/dir` through mount `m` (`'a'` or `'b'`).
    pub fn mount_point(&self, m: char) -> &Path {
        match m {
            'a' => &self.a,
            'b' => &self.b,
            _ => panic!("no mount {m:?}"),
        }
    }

    /// Names in `share/dir`, read on the server.
    pub fn server_listing(&self) -> Vec<String> {
        crate::fuse::listing(&self.server)
    }

    /// The fixture's processes: both smbnetfs, smbd and its children.
    pub fn processes(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self.mounts.iter().map(|(_, c)| c.id() as i32).collect();
        if let Some(s) = &self.smbd {
            v.push(s.id() as i32);
            v.extend(crate::proc::group_members(s.id() as i32));
        }
        v
    }
}

impl Drop for Smb {
    fn drop(&mut self) {
        crate::fuse::unmount(&mut self.mounts);
        if let Some(mut smbd) = self.smbd.take() {
            // smbd leads its own group: its children (one per connection) go too.
            let pg = nix::unistd::Pid::from_raw(smbd.id() as i32);
            let members = crate::proc::group_members(smbd.id() as i32);
            let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while smbd.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
            let _ = smbd.wait();
            // The other members are not our children and die when the kernel gets to them
            // (the clean-clone CI on 8227266 found one still running right after drop):
            // gone, within bounds, before drop returns.
            let deadline = Instant::now() + Duration::from_secs(5);
            while members.iter().any(|&p| !crate::proc::exited(p as u32))
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        crate::fuse::remove_root(&mut self.root, &self.mounts, FSTYPE);
    }
}

/// `smbd` and `smbpasswd` live in /usr/sbin, which a user's PATH may lack.
fn sbin(p: &str) -> PathBuf {
    on_path(p).unwrap_or_else(|| Path::new("/usr/sbin").join(p))
}

fn skip(why: String) -> NotStarted {
    NotStarted::Missing {
        why,
        installed: ".ci/run installs samba smbnetfs smbclient fuse3",
    }
}

fn failed(why: String) -> NotStarted {
    NotStarted::Failed(why)
}

/// Whether an smbnetfs mount sits at `mnt`.
pub fn mounted(mnt: &Path) -> bool {
    crate::fuse::mounted(mnt, FSTYPE)
}

const FSTYPE: &str = "fuse.smbnetfs";
