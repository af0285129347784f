//! A second real network filesystem for the file backends (issue 12), of another family than
//! sshfs: GlusterFS. No mocks: a real `glusterd`, a real one-brick volume, two real FUSE mounts.
//!
//! [`Gluster`]: a private `glusterd` and the volume's brick process run in a network namespace
//! of their own (GlusterFS refuses bricks on 127.0.0.0/8, so the namespace's `lo` carries
//! [`Gluster::ADDR`]; the namespace also keeps GlusterFS's fixed ports 24007 and 49152+ private)
//! and in a mount namespace of their own, where tmpfs covers `/run/gluster`, `/var/lib/glusterd`
//! and `/var/log/glusterfs` (the brick's control socket would otherwise land in
//! `/run/gluster`). Its working directory and logs are under the fixture's temporary directory
//! (an empty hooks directory: the packaged hooks, which edit smb.conf on volume start, never
//! run). The volume is mounted twice by the FUSE client (`glusterfs -N`, in the same network
//! namespace, our mount namespace): two "hosts" with their own caches on one volume. Every
//! process lives in a pid namespace whose init we kill on drop, so nothing survives a test and
//! nothing is left for init to reap.
//!
//! Measured here (GlusterFS 10.3, the volume's default options; FACTS.md): `statfs` type FUSE
//! (0x65735546), mountinfo `fuse.glusterfs ADDR:v`; `mkdir`, `symlink`, `link`, `O_EXCL` are
//! atomic across mounts (exactly one winner, the others EEXIST); link counts are right through
//! the mount; symlink timestamps can be set; `flock(2)` and `fcntl` locks exclude across
//! mounts (GlusterFS's locks translator), released when the holder or its client process dies;
//! `renameat2(RENAME_NOREPLACE)` is EINVAL. Every cache is 1 s: a name removed or a
//! timestamp changed through one mount shows through the other after up to ~1 s, and a regular
//! file rewritten in place (pwrite + fsync + close) is read stale through the other mount for up
//! to ~1 s (replacing it by rename likewise).
//!
//! Outside CI a missing program, no root, or no `/dev/fuse` is a visible `SKIP:` and `None`;
//! under `CI` it fails (`.ci/run` installs `glusterfs-server glusterfs-client`).

use super::on_path;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long glusterd, the volume and each mount may take to come up (here: ~1.5 s in all).
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A one-brick GlusterFS volume mounted twice. Everything goes on drop: both mounts detached
/// (`umount -l`), the FUSE clients, glusterd and the brick killed with their pid namespaces,
/// the network namespace deleted, the directories removed — also when a test panics.
pub struct Gluster {
    /// The brick: the volume's files on the "server's disk". Read it for the truth past every
    /// client cache; never write into it (GlusterFS keeps its own metadata in extended
    /// attributes and in `.glusterfs/`, hidden from the mounts).
    pub server: PathBuf,
    /// Mount `a`: the FUSE client with GlusterFS's default caches.
    pub a: PathBuf,
    /// Mount `b`: the same, plus the client options given to [`Gluster::start_with`].
    pub b: PathBuf,
    /// The network namespace (`/run/netns/NAME`) the servers and clients run in.
    pub netns: String,
    /// `unshare` processes: glusterd's (first), then one per mount.
    procs: Vec<Child>,
    mounts: Vec<PathBuf>,
    /// Holds `brick/`, `a/`, `b/`, glusterd's state and the logs; removed last.
    root: Option<tempfile::TempDir>,
}

impl Gluster {
    /// The server's address, on `lo` in the fixture's network namespace.
    pub const ADDR: &'static str = "10.213.9.1";
    /// The volume's name.
    pub const VOLUME: &'static str = "v";
    // A default mount served an old answer here for at most 1.01 s (kernel attribute and
    // entry timeouts, md-cache and quick-read: 1 s each).
    /// Client options that turn the mount's own caches off. With them on mount `b` and the
    /// volume options `performance.quick-read` and `performance.stat-prefetch` off
    /// ([`Gluster::volume_set`]), a change through `a` shows through `b` at once (≤ 3 ms here)
    /// for every fresh lookup and open, in-place rewrites included; a file `b` keeps open still
    /// reads its old pages.
    pub const NO_CACHE: [&'static str; 4] = [
        "--attribute-timeout=0",
        "--entry-timeout=0",
        "--negative-timeout=0",
        "--fopen-keep-cache=off",
    ];

    /// A fresh volume, mounted twice with the default caches. `None` (after a visible `SKIP:`
    /// line) outside CI when it cannot run here.
    pub fn start() -> Option<Gluster> {
        Gluster::start_with(&[])
    }

    /// The same, mount `b` with the extra `glusterfs` client options `b_options` (e.g.
    /// [`Gluster::NO_CACHE`]).
    pub fn start_with(b_options: &[&str]) -> Option<Gluster> {
        Gluster::start_full(&[], b_options, &[])
    }

    /// A fresh volume as locksmith requires it (`lockdir::gluster_caches`): both mounts with
    /// `--entry-timeout=0 --fopen-keep-cache=off`, the volume with `performance.stat-prefetch`
    /// (md-cache) and `performance.quick-read` off, every other cache at its default (the
    /// kernel's attribute cache, 1 s). Names and records showed through the other mount within
    /// milliseconds here.
    pub fn start_fresh_names() -> Option<Gluster> {
        Gluster::start_full(
            &["--entry-timeout=0", "--fopen-keep-cache=off"],
            &["--entry-timeout=0", "--fopen-keep-cache=off"],
            &[
                ("performance.stat-prefetch", "off"),
                ("performance.quick-read", "off"),
            ],
        )
    }

    /// A fresh volume with every client cache off: both mounts with [`Gluster::NO_CACHE`],
    /// the volume with `performance.quick-read` and `performance.stat-prefetch` off. A change
    /// through one mount shows through the other at once for every fresh lookup and open.
    pub fn start_uncached() -> Option<Gluster> {
        Gluster::start_full(
            &Gluster::NO_CACHE,
            &Gluster::NO_CACHE,
            &[
                ("performance.quick-read", "off"),
                ("performance.stat-prefetch", "off"),
            ],
        )
    }

    /// A fresh volume: mount `a` with the client options `a_options`, `b` with `b_options`,
    /// the volume with the options `volume` set.
    pub fn start_full(
        a_options: &[&str],
        b_options: &[&str],
        volume: &[(&str, &str)],
    ) -> Option<Gluster> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let missing: Vec<&str> = [
            "glusterd",
            "gluster",
            "glusterfs",
            "ip",
            "nsenter",
            "unshare",
        ]
        .into_iter()
        // (`.ci/run` puts /usr/sbin on PATH: glusterd, gluster, ip.)
        .filter(|p| on_path(p).is_none())
        .collect();
        if !missing.is_empty() {
            return skip(&format!(
                "GlusterFS tests need {} (Debian: glusterfs-server glusterfs-client)",
                missing.join(", ")
            ));
        }
        if !nix::unistd::geteuid().is_root() {
            return skip("GlusterFS tests need root (network namespaces, glusterd, mounts)");
        }
        if !Path::new("/dev/fuse").exists() {
            return skip("GlusterFS tests need /dev/fuse");
        }
        let root = tempfile::Builder::new()
            .prefix("locksmith-gluster-")
            .tempdir_in(testkit::scratch())
            .expect("tempdir");
        let r = root.path().to_path_buf();
        for d in ["brick", "a", "b", "wd", "run", "log"] {
            fs::create_dir(r.join(d)).unwrap();
        }
        let netns = format!(
            "lsm{}g{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let mut fx = Gluster {
            server: r.join("brick"),
            a: r.join("a"),
            b: r.join("b"),
            netns,
            procs: Vec::new(),
            mounts: Vec::new(),
            root: Some(root),
        };
        let t0 = Instant::now();
        fx.ip(&["netns", "add", &fx.netns]);
        fx.ip(&["-n", &fx.netns, "link", "set", "lo", "up"]);
        let addr = format!("{}/32", Gluster::ADDR);
        fx.ip(&["-n", &fx.netns, "addr", "add", &addr, "dev", "lo"]);

        let vol = format!(
            "volume management\n    type mgmt/glusterd\n    option working-directory {wd}\n    \
             option run-directory {run}\n    option logging-directory {log}\n    \
             option glusterd-sockfile {run}/glusterd.socket\n    option transport-type socket\n    \
             option transport.socket.bind-address {addr}\n    option ping-timeout 0\n    \
             option event-threads 1\nend-volume\n",
            wd = r.join("wd").display(),
            run = r.join("run").display(),
            log = r.join("log").display(),
            addr = Gluster::ADDR,
        );
        fs::write(r.join("glusterd.vol"), vol).unwrap();
        // tmpfs over glusterd's fixed directories, in its own mount namespace only.
        let server_sh = "set -e; for d in /run/gluster /var/lib/glusterd /var/log/glusterfs; do \
             mkdir -p $d; mount -t tmpfs -o size=16m,mode=755 tmpfs $d; done; \
             exec glusterd -N -f \"$1\" -l \"$2\"";
        let glusterd = fx
            .in_netns("unshare")
            .args(["--pid", "--fork", "--kill-child", "--mount"])
            .args(["--propagation", "private", "sh", "-c", server_sh, "sh"])
            .arg(r.join("glusterd.vol"))
            .arg(r.join("log/glusterd.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fx.log_file("glusterd.out"))
            .spawn()
            .expect("spawn glusterd");
        fx.procs.push(glusterd);
        let sock = r.join("run/glusterd.socket");
        fx.wait("glusterd's socket", |fx| sock.exists() && fx.procs_alive());

        // The CLI may find the socket before glusterd answers on it: retry, bounded.
        let brick = format!("{}:{}", Gluster::ADDR, fx.server.display());
        let mut last = String::new();
        let created = loop {
            let o = fx.cli(&["volume", "create", Gluster::VOLUME, &brick, "force"]);
            if o.status.success() {
                break true;
            }
            last = format!("{}{}", super::stdout(&o), super::stderr(&o));
            if t0.elapsed() > START_TIMEOUT || !fx.procs_alive() {
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(created, "gluster volume create: {last}\n{}", fx.logs());
        let o = fx.cli(&["volume", "start", Gluster::VOLUME]);
        assert!(
            o.status.success(),
            "gluster volume start: {}{}\n{}",
            super::stdout(&o),
            super::stderr(&o),
            fx.logs()
        );

        for (k, v) in volume {
            fx.volume_set(k, v);
        }
        let (a, b) = (fx.a.clone(), fx.b.clone());
        fx.mount(&a, "a", a_options);
        fx.mount(&b, "b", b_options);
        Some(fx)
    }

    /// `prog` in the fixture's network namespace, our mount namespace (`nsenter --net`, not
    /// `ip netns exec`, whose private mount namespace would hide a FUSE mount from us).
    fn in_netns(&self, prog: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.netns)).arg(prog);
        c
    }

    /// `glusterfs -N` (foreground, in a pid namespace of its own) mounting the volume at `mnt`;
    /// returns once the mount is in `/proc/self/mountinfo` and answers.
    fn mount(&mut self, mnt: &Path, name: &str, extra: &[&str]) {
        let log = self.root_path().join(format!("log/{name}.log"));
        let child = self
            .in_netns("unshare")
            .args(["--pid", "--fork", "--kill-child", "glusterfs", "-N"])
            .arg(format!("--volfile-server={}", Gluster::ADDR))
            .arg(format!("--volfile-id={}", Gluster::VOLUME))
            .arg("-l")
            .arg(&log)
            .args(extra)
            .arg(mnt)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(self.log_file(&format!("{name}.out")))
            .spawn()
            .expect("spawn glusterfs");
        self.procs.push(child);
        self.mounts.push(mnt.to_path_buf());
        self.wait(&format!("the mount at {}", mnt.display()), |fx| {
            fx.procs_alive() && gluster_mounted(mnt) && fs::read_dir(mnt).is_ok()
        });
        let fuse = nix::sys::statfs::statfs(mnt)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::FUSE_SUPER_MAGIC);
        assert!(fuse, "{}: statfs does not say FUSE", mnt.display());
    }

    /// Polls `ready` until it holds; panics with the logs past [`START_TIMEOUT`].
    fn wait(&mut self, what: &str, ready: impl Fn(&mut Gluster) -> bool) {
        let t0 = Instant::now();
        while !ready(self) {
            assert!(
                t0.elapsed() < START_TIMEOUT && self.procs_alive(),
                "GlusterFS fixture: no {what} within {START_TIMEOUT:?} (or a process exited)\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether every process the fixture started is still running.
    fn procs_alive(&mut self) -> bool {
        self.procs
            .iter_mut()
            .all(|c| c.try_wait().ok().flatten().is_none())
    }

    /// The `gluster` CLI, talking to the fixture's glusterd over its private socket.
    /// It runs in glusterd's mount namespace: the CLI writes
    /// `/var/lib/glusterd/geo-replication/gsyncd_template.conf` whenever it runs, and there that
    /// is glusterd's tmpfs.
    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        let r = self.root_path();
        let glusterd = first_child(self.procs[0].id() as i32).expect("glusterd is running");
        Command::new("nsenter")
            .arg(format!("--target={glusterd}"))
            .args(["--mount", "gluster"])
            .arg(format!(
                "--glusterd-sock={}",
                r.join("run/glusterd.socket").display()
            ))
            .arg(format!("--log-file={}", r.join("log/cli.log").display()))
            .arg("--mode=script")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run gluster")
    }

    /// `gluster volume set v KEY VALUE` (e.g. `performance.quick-read off`); the clients pick
    /// the new graph up by themselves.
    pub fn volume_set(&self, key: &str, value: &str) {
        let o = self.cli(&["volume", "set", Gluster::VOLUME, key, value]);
        assert!(
            o.status.success(),
            "gluster volume set {key} {value}: {}{}",
            super::stdout(&o),
            super::stderr(&o)
        );
    }

    /// The mount point `m` (`'a'` or `'b'`).
    pub fn mount_point(&self, m: char) -> &Path {
        match m {
            'a' => &self.a,
            'b' => &self.b,
            _ => panic!("no mount {m:?}"),
        }
    }

    /// Names in the brick, read on the server (no client cache in the way; GlusterFS's own
    /// `.glusterfs` left out).
    pub fn server_listing(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.server)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != ".glusterfs")
            .collect();
        v.sort();
        v
    }

    fn ip(&self, args: &[&str]) {
        let o = Command::new("ip").args(args).output().expect("run ip");
        assert!(o.status.success(), "ip {args:?}: {}", super::stderr(&o));
    }

    fn root_path(&self) -> &Path {
        self.root.as_ref().unwrap().path()
    }

    fn log_file(&self, name: &str) -> fs::File {
        fs::File::create(self.root_path().join("log").join(name)).unwrap()
    }

    /// The last lines of every log, for a failure message.
    fn logs(&self) -> String {
        let Ok(dir) = fs::read_dir(self.root_path().join("log")) else {
            return String::new();
        };
        let mut out = String::new();
        for e in dir.flatten() {
            let Ok(text) = fs::read_to_string(e.path()) else {
                continue;
            };
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out += &format!("--- {}\n{}\n", e.path().display(), tail.join("\n"));
        }
        out
    }
}

impl Drop for Gluster {
    fn drop(&mut self) {
        // Lazy: detached at once even if a test still has a file open in it.
        for mnt in &self.mounts {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(mnt)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        // Clients first, then glusterd. Each `unshare` ignores SIGTERM; SIGKILL its child
        // instead, the init of its pid namespace: the kernel kills and reaps everything else in
        // that namespace (the brick, the clients' helpers), unshare reaps the init, we reap
        // unshare. Were unshare killed first, its child would be left to init to reap.
        for child in self.procs.iter_mut().rev() {
            if let Some(init) = first_child(child.id() as i32) {
                super::kill9(init);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.netns])
            .stderr(Stdio::null())
            .status();
        // Only once nothing is mounted in it (else removing it would walk into a mount).
        if let Some(root) = self.root.take()
            && self.mounts.iter().any(|m| gluster_mounted(m))
        {
            eprintln!(
                "GlusterFS fixture: a mount under {} is still there; leaving it",
                root.path().display()
            );
            let _ = root.keep();
        }
    }
}

/// The first child of `pid` (`/proc/PID/task/PID/children`).
fn first_child(pid: i32) -> Option<i32> {
    fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Whether a GlusterFS FUSE mount sits at `mnt` (`/proc/self/mountinfo`).
fn gluster_mounted(mnt: &Path) -> bool {
    let want = mnt.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split(' ').nth(4) == Some(&*want) && l.contains(" - fuse.glusterfs "))
    })
}

/// Outside CI: a visible SKIP line and `None`; under CI: a failure.
fn skip<T>(why: &str) -> Option<T> {
    super::missing(why, ".ci/run installs glusterfs-server glusterfs-client");
    None
}
