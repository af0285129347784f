//! Who we are and whether another process is alive: host identity (boot id, pid namespace)
//! and proof of death from `/proc` (a zombie counts as dead; a reused pid is caught by its
//! start time).

use std::fs;
use std::sync::OnceLock;

/// The identity of this host and pid namespace, as recorded in owner records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// For display only: two hosts may share a name.
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: changes at every boot.
    pub boot_id: String,
    /// `/proc/self/ns/pid` link text, e.g. `pid:[4026531836]`.
    pub pidns: String,
}

/// This host, read once.
pub fn this() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| Host {
        hostname: nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "unknown".into()),
        boot_id: read_proc("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        pidns: fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
    })
}

/// Whether `/proc` is of our own pid namespace (`/proc/self` names the pid `getpid` gives).
/// Not so after `unshare -p -f` without `--mount-proc`: `/proc/PID` then shows the process
/// the outer namespace numbers PID, not ours — a dead holder's pid could name a live kernel
/// thread there (its lock never breakable), or a live one's nothing (broken at once). Read once.
fn own_proc() -> bool {
    static OWN_PROC: OnceLock<bool> = OnceLock::new();
    *OWN_PROC.get_or_init(|| {
        fs::read_link("/proc/self")
            .is_ok_and(|p| p.as_os_str() == std::process::id().to_string().as_str())
    })
}

impl Host {
    /// Same host for proof-of-death purposes: equal boot id and pid namespace (SPEC §6), and
    /// a `/proc` that shows that namespace's processes ([`own_proc`]); otherwise a record of
    /// our own namespace is judged as another host's is, by its heartbeat.
    pub fn same_as(&self, boot_id: &str, pidns: &str) -> bool {
        !self.boot_id.is_empty() && self.boot_id == boot_id && self.pidns == pidns && own_proc()
    }

    /// This host as [`same_as`](Self::same_as) knows it, in 16 hex digits for a file name
    /// (FNV-1a of the boot id and the pid namespace: a name alone then says whether its maker
    /// is provably dead, [`tagged_alive`]); `None` without a boot id, or where `/proc` is not
    /// of our pid namespace ([`own_proc`]: a live maker could be judged dead).
    pub fn tag(&self) -> Option<String> {
        if self.boot_id.is_empty() || !own_proc() {
            return None;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in self.boot_id.bytes().chain([0]).chain(self.pidns.bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        Some(format!("{h:016x}"))
    }
}

/// Whether the process (`pid`, `start`) named with host tag `tag` ([`Host::tag`]) lives:
/// `Some` only for this host's (proof of death), `None` for another's.
pub fn tagged_alive(tag: &str, pid: i32, start: u64) -> Option<bool> {
    (this().tag().as_deref() == Some(tag)).then(|| alive(pid, start))
}

/// What `/proc/PID/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    /// The state of the process's *main thread* (field 3).
    pub state: char,
    pub ppid: i32,
    /// Threads not yet gone, the main thread included (field 20).
    pub threads: u64,
    /// Start time in clock ticks after boot (field 22).
    pub start: u64,
}

/// `/proc/PID/stat`: state, parent, threads and start time. `None` if there is no such
/// process.
pub fn stat(pid: i32) -> Option<ProcStat> {
    parse_stat(&read_proc(&format!("/proc/{pid}/stat"))?)
}

/// A small `/proc` file, read in one `read(2)` of up to 4 KiB (and one more that says the
/// end): `fs::read_to_string` first `statx`es it, then reads in growing steps — eight calls
/// for `/proc/PID/stat`, at every start and every look at a holder (issue 29).
fn read_proc(path: &str) -> Option<String> {
    use std::io::Read;
    let mut f = fs::File::open(path).ok()?;
    let mut buf = Vec::with_capacity(4096);
    (&mut f).take(4096).read_to_end(&mut buf).ok()?;
    if buf.len() == 4096 {
        f.read_to_end(&mut buf).ok()?;
    }
    String::from_utf8(buf).ok()
}

fn parse_stat(text: &str) -> Option<ProcStat> {
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    // Fields 3, 4, … from here: field N is fields[N - 3].
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        threads: fields.get(17)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// Our own start time, for the owner record: from `/proc/self`, which is this process
/// whichever pid namespace `/proc` is of (`/proc/<getpid>` is not, [`own_proc`]).
pub fn own_start() -> u64 {
    read_proc("/proc/self/stat")
        .and_then(|t| parse_stat(&t))
        .map_or(0, |s| s.start)
}

/// Whether a process recorded as (`pid`, `start`) on this host is still running.
/// A zombie is dead (it holds nothing; `kill(pid, 0)` would wrongly say alive), and so is
/// a different process that reused the pid (its start time differs).
///
/// "Zombie" is the state of the *main thread* only: a process whose main thread exited
/// (killed, its other threads not yet gone — one waiting out a grace period in the kernel,
/// say) shows `Z` while its other threads still run, and a child it spawned receives its
/// parent-death signal only when the last of them exits. A `run` helper killed between
/// `fork` and its child's `PR_SET_PDEATHSIG` was such a process, and its CMD ran on beside
/// the next holder's. So a zombie is dead only once it is the last thread left (SPEC §6:
/// provably dead).
pub fn alive(pid: i32, start: u64) -> bool {
    match stat(pid) {
        None => false,
        Some(s) if start != 0 && s.start != start => false,
        Some(s) => !(matches!(s.state, 'Z' | 'X') && s.threads <= 1),
    }
}

/// 64 bits from the kernel's random source (`getrandom(2)`). fastrand seeds itself from the
/// clock and a thread id only, and processes started close together drew equal numbers
/// (9 duplicates in 6,000 runs here): nonces that must differ between processes come from
/// here. Should the kernel refuse, std's randomly keyed hasher stands in.
pub fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new()
            .hash_one((std::process::id(), std::time::SystemTime::now()))
    })
}

/// A fresh nonce: 16 hex digits of [`random_u64`].
pub fn nonce() -> String {
    format!("{:016x}", random_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn we_are_alive_and_described() {
        let me = std::process::id() as i32;
        let s = stat(me).expect("own stat");
        assert_eq!(s.ppid as u32, std::os::unix::process::parent_id());
        assert!(alive(me, s.start));
        assert!(
            !alive(me, s.start + 1),
            "a different start time means pid reuse"
        );
        assert!(!this().boot_id.is_empty());
        assert!(this().pidns.starts_with("pid:["));
    }

    #[test]
    fn a_zombie_main_thread_with_threads_left_is_a_live_process() {
        // Field 2 with spaces and parentheses; fields 3 (state), 4 (ppid), 20 (threads),
        // 22 (start).
        let line = |state: &str, threads: u32| {
            format!(
                "4242 (a (b) c) {state} 1 4242 4242 0 -1 4194624 0 0 0 0 0 0 0 0 20 0 {threads} 0 987654 0 0"
            )
        };
        let s = parse_stat(&line("Z", 2)).unwrap();
        assert_eq!((s.state, s.ppid, s.threads, s.start), ('Z', 1, 2, 987654));
        assert_eq!(parse_stat(&line("S", 3)).unwrap().threads, 3);
        assert!(parse_stat("4242 (x) Z 1").is_none());
    }

    #[test]
    fn a_host_tag_is_of_the_boot_and_the_pid_namespace() {
        let h = |boot: &str, ns: &str| Host {
            hostname: "h".into(),
            boot_id: boot.into(),
            pidns: ns.into(),
        };
        let a = h("b1", "pid:[1]").tag().unwrap();
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(h("b1", "pid:[1]").tag(), Some(a.clone()));
        assert_ne!(
            h("b1", "pid:[2]").tag(),
            Some(a.clone()),
            "another pid namespace"
        );
        assert_ne!(h("b2", "pid:[1]").tag(), Some(a), "another boot");
        assert_eq!(h("", "pid:[1]").tag(), None, "no boot id");
    }

    #[test]
    fn nonces_differ() {
        let a: std::collections::HashSet<String> = (0..1000).map(|_| nonce()).collect();
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|n| n.len() == 16));
    }
}
