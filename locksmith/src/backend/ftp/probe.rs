//! `locksmith verify` on an FTP lock: the server commands the backend relies on, tried on
//! the server with the backend's own session code (issue 12).
//!
//! Every probe works in one directory beside the lock, `PARENT/NAME.verify.<nonce>` (no
//! lock, tombstone, state or readers name has that form), and never touches the lock or its
//! records. Every name is registered before it is made and removed at the end whatever
//! happened (a fresh login if the connection broke); what would not go is listed in the
//! report.
//!
//! What is measured, and why the backend needs it (see `ftp.rs`):
//! - login as configured (TLS included), and how long a fresh connect + login takes: a
//!   heartbeat after a dropped connection must reconnect, log in and rename within
//!   `stale_after`/4 (at most 10 s);
//! - `MKD` exclusive: two sessions race to make one name, [`ROUNDS`] times: exactly one may
//!   succeed, the other must get a negative reply (a lock is taken by `MKD` alone);
//! - the owner record: a marker directory named like the backend's, listed back intact by
//!   `NLST` (the record is the name);
//! - the heartbeat: `RNFR`/`RNTO` of the marker to its next name, listed back, and an `RMD` of
//!   the old name refused (a breaker acting on an old observation must fail: removal is a
//!   claim);
//! - `RMD` of a directory that is not empty refused (freeing a lock never removes a
//!   successor's marker);
//! - `CWD` tells a directory from a missing name (a lock that is gone from an empty one);
//! - the removal of every probe name, seen in a listing of the parent.
//!
//! No server clock is read: the backend needs none (a waiter watches the marker's name
//! change on its own clock).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use super::marker::marker_name;
use super::session::{ACQUIRE_TIMEOUT, HOLD_TIMEOUT_MAX, Session, url_of};
use super::config::{FtpConfig, Tls};
use crate::backend::address::Address;
use crate::backend::lock::{Backend, Named, Registered};
use crate::settings::{Fields, KeyDoc, Password};
use crate::backend::owner::Record;
use crate::backend::verify::{Report, Status, figure, median};
use crate::error::{Result, err};
use crate::settings::fmt_duration;

/// Races per `MKD` probe.
pub const ROUNDS: usize = 6;

/// Probes the FTP server of lock `cfg` (profile `p`). `Err` where nothing could be probed:
/// the login (69, 77, 78 as for taking the lock), a missing parent directory (78), no right
/// to make a directory beside the lock (77).
pub fn verify(p: &Named, cfg: &FtpConfig) -> Result<Report> {
    let url = url_of(cfg);
    let mut r = Report::new(
        format!("locksmith verify {}: backend ftp, lock {url}", p.name),
        url.clone(),
    );
    let stale_after = p.common.stale_after;
    let mut s = Session::new(cfg.clone(), stale_after);
    s.set_timeout(ACQUIRE_TIMEOUT);
    let t0 = Instant::now();
    s.conn()?;
    let mut logins = vec![t0.elapsed()];
    let tls = match cfg.tls {
        Tls::None => "plain FTP (no TLS)",
        Tls::Explicit => "explicit FTPS (AUTH TLS), certificate verified",
        Tls::Implicit => "implicit FTPS, certificate verified",
    };
    r.add(
        "login",
        Status::Ok,
        format!(
            "user {} at {}:{}, {tls}, in {}",
            cfg.user,
            cfg.host,
            cfg.port,
            figure(logins[0])
        ),
    );
    if let Some(parent) = s.parent().map(str::to_string)
        && !s.is_dir(&parent)?
    {
        return Err(err!(
            Config,
            "the parent directory {parent} of lock {url} does not exist on the server (locksmith never creates parent directories)"
        ));
    }
    let base = {
        let n = format!("{}.verify.{}", s.name(), crate::host::nonce());
        match s.parent() {
            Some(p) => format!("{p}/{n}"),
            None => n,
        }
    };
    if let Err((code, text)) = s.cmd("MKD", |c| c.mkdir(base.as_str()))? {
        return Err(err!(
            Denied,
            "cannot make a probe directory beside lock {url}: {text} (code {code}): permission denied"
        ));
    }
    let mut made = vec![base.clone()];
    let mut second = Session::new(cfg.clone(), stale_after);
    second.set_timeout(ACQUIRE_TIMEOUT);
    let probed = probe(
        p,
        &mut s,
        &mut second,
        &base,
        &mut made,
        &mut r,
        &mut logins,
    );
    second.quit();
    let left = sweep(&mut s, &made);
    match (&probed, left.is_empty()) {
        (Ok(()), true) => {
            // The release: the probe directory is gone from the parent's listing.
            let parent = s.parent().map(str::to_string).unwrap_or_default();
            let listed = s.entries(if parent.is_empty() { "." } else { &parent });
            let name = base.rsplit('/').next().unwrap_or(&base).to_string();
            match listed {
                Ok(names) if names.contains(&name) => r.add(
                    "release (RMD)",
                    Status::Fail,
                    format!("{base} is still listed after its RMD was answered"),
                ),
                Ok(_) => r.add(
                    "release (RMD)",
                    Status::Ok,
                    format!(
                        "{} probe directories removed; none listed after",
                        made.len()
                    ),
                ),
                Err(e) => r.add(
                    "release (RMD)",
                    Status::Fail,
                    format!("could not list the parent: {e}"),
                ),
            }
        }
        (Ok(()), false) => r.add(
            "release (RMD)",
            Status::Fail,
            "the server refused to remove probe directories",
        ),
        (Err(_), _) => {}
    }
    s.quit();
    r.left = left;
    probed?;

    // A heartbeat after a dropped connection reconnects, logs in and renames within this.
    let hold = s.hold_timeout();
    let login = logins.iter().copied().max().unwrap_or_default();
    let needs = (login * 2).max(Duration::from_millis(50));
    let accept = round_up(needs * 4);
    if needs > HOLD_TIMEOUT_MAX {
        r.add(
            "reconnect",
            Status::Fail,
            format!(
                "a login took up to {} (of {}): a heartbeat after a dropped connection must reconnect, log in and rename within {} whatever stale_after is; ask for a faster login (the server's password hashing)",
                figure(login),
                logins.len(),
                fmt_duration(HOLD_TIMEOUT_MAX)
            ),
        );
    } else if needs > hold {
        r.add(
            "reconnect",
            Status::Fail,
            format!(
                "a login took up to {} (of {}), but a heartbeat after a dropped connection must reconnect, log in and rename within stale_after/4 = {}: set stale_after to at least {}",
                figure(login),
                logins.len(),
                fmt_duration(hold),
                fmt_duration(accept)
            ),
        );
    } else {
        r.add(
            "reconnect",
            Status::Ok,
            format!(
                "a login took up to {} (of {}), within the {} a heartbeat after a dropped connection may take (stale_after/4, at most {})",
                figure(login),
                logins.len(),
                fmt_duration(hold),
                fmt_duration(HOLD_TIMEOUT_MAX)
            ),
        );
    }
    r.add(
        "server clock",
        Status::Info,
        "not read: liveness is the marker's name changing, watched on each waiter's own clock",
    );
    r.add(
        "idle timeout",
        Status::Info,
        format!(
            "not measured: each heartbeat (every {}) is a command, which resets it; a shorter one costs a reconnect",
            // In whole milliseconds: a third of 10s is 3s333ms, not 3s333ms333us333ns.
            fmt_duration(Duration::from_millis(p.common.heartbeat().as_millis() as u64))
        ),
    );
    r.accepts = format!(
        "backend ftp keeps SPEC §6 here; it accepts stale_after of {} or more (now {}: four logins with room to spare)",
        fmt_duration(accept),
        fmt_duration(stale_after)
    );
    Ok(r)
}

/// Up to the next 100 ms.
fn round_up(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().div_ceil(100) as u64 * 100)
}

/// The probes inside `base` (registered in `made` before each is made).
fn probe(
    p: &Named,
    s: &mut Session,
    second: &mut Session,
    base: &str,
    made: &mut Vec<String>,
    r: &mut Report,
    logins: &mut Vec<Duration>,
) -> Result<()> {
    let t0 = Instant::now();
    second.conn()?;
    logins.push(t0.elapsed());

    // MKD exclusive: two sessions race for one name.
    let mut refusals = Vec::new();
    let mut broken = None;
    for round in 0..ROUNDS {
        let name = format!("{base}/race.{round}");
        made.push(name.clone());
        let barrier = Barrier::new(2);
        let (a, b) = std::thread::scope(|sc| {
            let (name, barrier) = (&name, &barrier);
            let ha = sc.spawn(|| {
                barrier.wait();
                s.cmd("MKD", |c| c.mkdir(name.as_str()))
            });
            let hb = sc.spawn(|| {
                barrier.wait();
                second.cmd("MKD", |c| c.mkdir(name.as_str()))
            });
            (ha.join(), hb.join())
        });
        let mut winners = 0;
        for res in [a, b] {
            match res {
                Ok(Ok(Ok(()))) => winners += 1,
                Ok(Ok(Err((code, _)))) => refusals.push(code),
                Ok(Err(e)) => broken = Some(e.message().to_string()),
                Err(_) => broken = Some("a contender panicked".into()),
            }
        }
        if broken.is_some() {
            break;
        }
        if winners != 1 {
            r.add(
                "mkd exclusive",
                Status::Fail,
                format!(
                    "round {} of {ROUNDS}: {winners} sessions were told they made {name}",
                    round + 1
                ),
            );
            break;
        }
    }
    if let Some(why) = broken {
        r.add(
            "mkd exclusive",
            Status::Fail,
            format!("could not probe: {why}"),
        );
    } else if r.status("mkd exclusive").is_none() {
        let mut codes: Vec<String> = refusals.iter().map(u32::to_string).collect();
        codes.sort();
        codes.dedup();
        let again = format!("{base}/race.0");
        let seq = s.cmd("MKD", |c| c.mkdir(again.as_str()))?;
        if refusals.iter().all(|c| (500..600).contains(c)) && seq.is_err() {
            r.add(
                "mkd exclusive",
                Status::Ok,
                format!(
                    "{ROUNDS} races of 2 sessions: one winner each, the other refused ({}); an existing name refused",
                    codes.join(", ")
                ),
            );
        } else {
            r.add(
                "mkd exclusive",
                Status::Fail,
                format!(
                    "refusals answered {} (5xx expected); an MKD of an existing name {}",
                    codes.join(", "),
                    if seq.is_ok() {
                        "succeeded"
                    } else {
                        "was refused"
                    }
                ),
            );
        }
    }

    // The owner record is the marker's name, read back by NLST.
    let rec = Record::ours(&p.name);
    let first = marker_name(&rec, 0);
    let first_path = format!("{base}/{first}");
    made.push(first_path.clone());
    if let Err((code, text)) = s.cmd("MKD", |c| c.mkdir(first_path.as_str()))? {
        r.add(
            "owner record (NLST)",
            Status::Fail,
            format!("cannot make a marker directory: {text} (code {code})"),
        );
        return Ok(());
    }
    let names = s.entries(base)?;
    if names.contains(&first) {
        r.add(
            "owner record (NLST)",
            Status::Ok,
            format!(
                "a marker directory ({} characters) listed back intact",
                first.len()
            ),
        );
    } else {
        r.add(
            "owner record (NLST)",
            Status::Fail,
            format!("a marker directory made by MKD is not listed as {first:?}: {names:?}"),
        );
    }

    // The heartbeat renames the marker; the old name must then be gone for a claim.
    let mut current = first.clone();
    let mut rtts = Vec::new();
    let mut renamed = true;
    for seq in 1..=3u64 {
        let next = marker_name(&rec, seq);
        let (from, to) = (format!("{base}/{current}"), format!("{base}/{next}"));
        made.push(to.clone());
        let t = Instant::now();
        match s.cmd("RNFR/RNTO", |c| c.rename(from.as_str(), to.as_str()))? {
            Ok(()) => {
                rtts.push(t.elapsed());
                current = next;
            }
            Err((code, text)) => {
                r.add(
                    "heartbeat (RNFR/RNTO)",
                    Status::Fail,
                    format!("cannot rename the marker: {text} (code {code})"),
                );
                renamed = false;
                break;
            }
        }
    }
    if renamed {
        let names = s.entries(base)?;
        let seen_new = names.contains(&current);
        let seen_old = names.contains(&first);
        if seen_new && !seen_old {
            r.add(
                "heartbeat (RNFR/RNTO)",
                Status::Ok,
                format!(
                    "the marker renamed 3 times, listed under its new name only; {} per rename (median)",
                    figure(median(rtts))
                ),
            );
        } else {
            r.add(
                "heartbeat (RNFR/RNTO)",
                Status::Fail,
                format!(
                    "after the renames the listing {} the new name and {} the old one",
                    if seen_new { "shows" } else { "lacks" },
                    if seen_old { "still shows" } else { "lacks" }
                ),
            );
        }
        // Removal is a claim: an RMD of the name seen before the heartbeat must fail.
        let old = first_path.clone();
        match s.cmd("RMD", |c| c.rmdir(old.as_str()))? {
            Err((code, _)) => r.add(
                "claim of an old name",
                Status::Ok,
                format!("RMD of the marker's name before the heartbeat refused ({code})"),
            ),
            Ok(()) => r.add(
                "claim of an old name",
                Status::Fail,
                "RMD of the marker's name before the heartbeat succeeded: a breaker acting on an old observation could remove a live holder's marker",
            ),
        }
    }

    // RMD of a directory that is not empty must fail.
    let b = base.to_string();
    match s.cmd("RMD", |c| c.rmdir(b.as_str()))? {
        Err((code, _)) => r.add(
            "rmd not empty",
            Status::Ok,
            format!("RMD of a directory holding a marker refused ({code})"),
        ),
        Ok(()) => r.add(
            "rmd not empty",
            Status::Fail,
            "RMD removed a directory that was not empty: freeing a lock could remove a successor's marker",
        ),
    }

    // CWD tells a directory from a missing name.
    let missing = format!("{base}/missing");
    let (dir, gone) = (s.is_dir(base)?, s.is_dir(&missing)?);
    r.add(
        "directory test (CWD)",
        if dir && !gone {
            Status::Ok
        } else {
            Status::Fail
        },
        match (dir, gone) {
            (true, false) => "CWD enters a directory and refuses a missing name".to_string(),
            (false, _) => "CWD refused an existing directory".to_string(),
            (true, true) => "CWD accepted a missing name".to_string(),
        },
    );
    Ok(())
}

/// Removes every registered name, newest first (`RMD`, else `DELE`; a name already gone is
/// fine); a broken connection is replaced once. The names that would not go.
fn sweep(s: &mut Session, made: &[String]) -> Vec<String> {
    let mut left = Vec::new();
    for name in made.iter().rev() {
        let mut gone = false;
        for _ in 0..2 {
            match s.remove_marker(name) {
                Ok(true) => {
                    gone = true;
                    break;
                }
                // Refused both ways: already gone (or truly stuck: checked below).
                Ok(false) => break,
                Err(_) => continue, // the next try reconnects
            }
        }
        if !gone {
            let (parent, base) = name.rsplit_once('/').unwrap_or((".", name.as_str()));
            match s.entries(parent) {
                Ok(names) if !names.iter().any(|n| n == base) => {}
                _ => left.push(name.clone()),
            }
        }
    }
    left
}

/// The registry's view of the backend (`backend/mod.rs`): here, beside its probe, so that the
/// backend's own file never names the probe that uses it.
impl Registered for super::Ftp {
    type Config = FtpConfig;
    const KEYS: &'static [&'static [KeyDoc]] = &[super::config::KEYS, crate::settings::PASSWORD_KEYS];
    const SHARED: bool = true;
    fn parse(f: &mut Fields) -> Result<FtpConfig> {
        super::config::config(f)
    }
    fn parts(a: &Address) -> std::result::Result<toml::Table, String> {
        super::config::address(a)
    }
    fn open(cfg: &FtpConfig, lock: &Named) -> Box<dyn Backend> {
        Box::new(super::Ftp::new(cfg.clone(), lock))
    }
    fn verify(cfg: &FtpConfig, lock: &Named, _peer: Option<&std::path::Path>) -> Result<Report> {
        verify(lock, cfg)
    }
    fn location(c: &FtpConfig) -> String {
        format!("{}@{}:{}, directory {}", c.user, c.host, c.port, c.path)
    }
    fn password(c: &FtpConfig) -> Option<&Password> {
        Some(&c.password)
    }
}
