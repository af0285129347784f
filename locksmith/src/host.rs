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
        boot_id: fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        pidns: fs::read_link("/proc/self/ns/pid")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
    })
}

impl Host {
    /// Same host for proof-of-death purposes: equal boot id and pid namespace (SPEC §6).
    pub fn same_as(&self, boot_id: &str, pidns: &str) -> bool {
        !self.boot_id.is_empty() && self.boot_id == boot_id && self.pidns == pidns
    }
}

/// What `/proc/PID/stat` says about a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub ppid: i32,
    /// Start time in clock ticks after boot (field 22).
    pub start: u64,
}

/// `/proc/PID/stat`: state, parent and start time. `None` if there is no such process.
pub fn stat(pid: i32) -> Option<ProcStat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    // After state (3) and ppid (4), field 22 is the 18th further on.
    let start = fields.nth(17)?.parse().ok()?;
    Some(ProcStat { state, ppid, start })
}

/// Our own start time, for the owner record.
pub fn own_start() -> u64 {
    stat(std::process::id() as i32).map_or(0, |s| s.start)
}

/// Whether a process recorded as (`pid`, `start`) on this host is still running.
/// A zombie is dead (it holds nothing; `kill(pid, 0)` would wrongly say alive), and so is
/// a different process that reused the pid (its start time differs).
pub fn alive(pid: i32, start: u64) -> bool {
    match stat(pid) {
        None => false,
        Some(s) => s.state != 'Z' && s.state != 'X' && (start == 0 || s.start == start),
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
    fn nonces_differ() {
        let a: std::collections::HashSet<String> = (0..1000).map(|_| nonce()).collect();
        assert_eq!(a.len(), 1000);
        assert!(a.iter().all(|n| n.len() == 16));
    }
}
