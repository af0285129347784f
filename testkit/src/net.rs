//! Private networks (issue 13's partition harness): network namespaces on a bridge, one per
//! "host", with cuts and heals. The PostgreSQL fixture starts its server in one.

use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::missing;
use crate::proc::{eventually, kill9, stderr, stdout};

/// A private network of our own (issue 13's partition harness): a server namespace holding a
/// Linux bridge at [`Net::SERVER`] on a private test subnet, and one namespace per "host",
/// attached to the bridge by a veth pair. Servers run in the server namespace bound to its
/// address; each host's processes run in their host's namespace and in a pid namespace of
/// their own (no same-host proof of death between hosts). One kernel, so one CLOCK_MONOTONIC
/// orders events across them all. Everything — processes and namespaces — goes on drop.
pub struct Net {
    /// The namespaces' name stem: `<id>-s` (server), `<id>-<host>`.
    id: String,
    hosts: Vec<char>,
}

impl Net {
    /// The server namespace's address.
    pub const SERVER: &'static str = "10.213.0.1";

    /// A network with hosts `hosts` (their addresses 10.213.0.2, .3, ... in order); `None`
    /// (a SKIP outside CI) without root or `ip`.
    pub fn new(hosts: &[char]) -> Option<Net> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let usable = nix::unistd::geteuid().is_root()
            && Command::new("ip")
                .args(["netns", "list"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        if !usable {
            missing(
                "network namespaces need root and `ip` (iproute2)",
                ".ci/run installs iproute2 and runs as root",
            );
            return None;
        }
        let net = Net {
            id: format!(
                "lsm{}n{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ),
            hosts: hosts.to_vec(),
        };
        let s = net.ns('s');
        net.ip(&["netns", "add", &s]);
        net.ip(&["-n", &s, "link", "set", "lo", "up"]);
        net.ip(&["-n", &s, "link", "add", "br0", "type", "bridge"]);
        net.ip(&[
            "-n",
            &s,
            "addr",
            "add",
            &format!("{}/24", Net::SERVER),
            "dev",
            "br0",
        ]);
        net.ip(&["-n", &s, "link", "set", "br0", "up"]);
        for (i, &h) in hosts.iter().enumerate() {
            let ns = net.ns(h);
            let port = Net::port(h);
            net.ip(&["netns", "add", &ns]);
            net.ip(&["-n", &ns, "link", "set", "lo", "up"]);
            net.ip(&[
                "link", "add", &port, "netns", &s, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ]);
            net.ip(&["-n", &s, "link", "set", &port, "master", "br0"]);
            net.ip(&["-n", &s, "link", "set", &port, "up"]);
            let addr = format!("10.213.0.{}/24", i + 2);
            net.ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]);
            net.ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        Some(net)
    }

    fn ns(&self, h: char) -> String {
        format!("{}-{h}", self.id)
    }

    /// The server namespace's name (for `ip netns exec`).
    pub fn server_ns(&self) -> String {
        self.ns('s')
    }

    /// Host `h`'s port on the bridge (in the server namespace).
    fn port(h: char) -> String {
        format!("p{h}")
    }

    fn ip(&self, args: &[&str]) {
        let o = Command::new("ip").args(args).output().expect("run ip");
        assert!(o.status.success(), "ip {args:?}: {}", stderr(&o));
    }

    /// `prog` run in the server namespace.
    pub fn in_server(&self, prog: impl AsRef<OsStr>) -> Command {
        command_in(Some(&self.ns('s')), prog)
    }

    /// `prog` run on host `h`: its network namespace, a pid namespace of its own.
    pub fn on_host(&self, h: char, prog: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(h)])
            .args(["unshare", "--pid", "--fork", "--kill-child"])
            .arg(prog);
        c
    }

    /// A silent cut: host `h`'s bridge port stops forwarding (no RST, no ICMP; the host keeps
    /// its carrier).
    pub fn cut_silent(&self, h: char) {
        self.port_state(h, "0");
    }

    /// Host `h`'s bridge port: 0 disabled, 3 forwarding.
    fn port_state(&self, h: char, state: &str) {
        let o = self.try_port_state(h, state);
        assert!(o.status.success(), "bridge: {}", stderr(&o));
    }

    fn try_port_state(&self, h: char, state: &str) -> std::process::Output {
        self.in_server("bridge")
            .args(["link", "set", "dev", &Net::port(h), "state", state])
            .output()
            .unwrap()
    }

    /// A hard cut: host `h`'s link goes down.
    pub fn cut_hard(&self, h: char) {
        self.ip(&["-n", &self.ns('s'), "link", "set", &Net::port(h), "down"]);
    }

    /// Undoes either cut: the port forwards again, the host's link has its carrier back, and
    /// neither side remembers an address it could not resolve meanwhile.
    pub fn heal(&self, h: char) {
        self.ip(&["-n", &self.ns('s'), "link", "set", &Net::port(h), "up"]);
        // The kernel refuses a port state while the port is not yet operationally up
        // (ENETDOWN, "Network is down"): after a hard cut the link comes up through the
        // asynchronous link watch, so `link set up` returning does not mean it is up yet.
        let mut last = String::new();
        let waited = crate::proc::poll_until(
            "the bridge port forwards again",
            Duration::from_secs(10),
            Duration::from_millis(5),
            || {
                let o = self.try_port_state(h, "3");
                last = stderr(&o);
                o.status.success()
            },
        );
        if let Err(e) = waited {
            panic!("{e}; bridge said: {last}");
        }
        eventually(Duration::from_secs(10), "the host's link is up", || {
            let o = Command::new("ip")
                .args(["-n", &self.ns(h), "link", "show", "eth0"])
                .output()
                .unwrap();
            let s = stdout(&o);
            s.contains("LOWER_UP") && !s.contains("NO-CARRIER")
        });
        for ns in [self.ns('s'), self.ns(h)] {
            self.ip(&["-n", &ns, "neigh", "flush", "all"]);
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let all: Vec<String> = std::iter::once('s')
            .chain(self.hosts.iter().copied())
            .map(|h| self.ns(h))
            .collect();
        for ns in &all {
            if let Ok(o) = Command::new("ip").args(["netns", "pids", ns]).output() {
                for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    if let Ok(p) = pid.parse::<i32>() {
                        kill9(p);
                    }
                }
            }
        }
        for ns in &all {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// `prog`, run in network namespace `ns` when there is one (`ip netns exec`).
pub fn command_in(ns: Option<&str>, prog: impl AsRef<OsStr>) -> Command {
    match ns {
        None => Command::new(prog),
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(prog);
            c
        }
    }
}
