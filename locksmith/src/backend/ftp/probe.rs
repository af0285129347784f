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

use super::config::{FtpConfig, Tls};
use super::marker::marker_name;
use super::session::{ACQUIRE_TIMEOUT, HOLD_TIMEOUT_MAX, Session, url_of};
use crate::backend::address::Address;
use crate::backend::lock::{Backend, Named, Registered};
use crate::backend::owner::Record;
use crate::backend::verify::{self, Found, Probing, Property, Report, either, figure, median};
use crate::error::{Result, err};
use crate::settings::fmt_duration;
use crate::settings::{Fields, KeyDoc, Password};

/// Races per `MKD` probe.
pub const ROUNDS: usize = 6;

/// Probes the FTP server of lock `cfg` (profile `p`). `Err` where nothing could be probed:
/// the login (69, 77, 78 as for taking the lock), a missing parent directory (78), no right
/// to make a directory beside the lock (77).
pub fn verify(p: &Named, cfg: &FtpConfig) -> Result<Report> {
    verify::run(Site::open(p, cfg)?)
}

/// `verify`'s probing session on an FTP server: two sessions, the probe directory `base`
/// and every name made in it (registered before it is made).
struct Site {
    p: Named,
    url: String,
    /// The first session (it made `base`) and a second, for races.
    s: Session,
    second: Session,
    /// `PARENT/NAME.verify.<nonce>`.
    base: String,
    made: Vec<String>,
    /// How long each login took (the first session's, then the second's).
    logins: Vec<Duration>,
    /// The `login` line.
    login: String,
    /// The owner record and its first marker name (`owner record`).
    rec: Record,
    first: String,
    /// Whether the heartbeat renamed the marker (else an old name's claim is not probed).
    renamed: bool,
    /// Whether the clean-up removed every probe name.
    swept: bool,
}

impl Site {
    /// Logs in, checks the parent directory and makes the probe directory beside the lock.
    fn open(p: &Named, cfg: &FtpConfig) -> Result<Site> {
        let url = url_of(cfg);
        let stale_after = p.common.stale_after;
        let mut s = Session::new(cfg.clone(), stale_after, 1);
        s.set_timeout(ACQUIRE_TIMEOUT);
        let t0 = Instant::now();
        s.conn()?;
        let logins = vec![t0.elapsed()];
        let tls = match cfg.tls {
            Tls::None => "plain FTP (no TLS)",
            Tls::Explicit => "explicit FTPS (AUTH TLS), certificate verified",
            Tls::Implicit => "implicit FTPS, certificate verified",
        };
        let login = format!(
            "user {} at {}:{}, {tls}, in {}",
            cfg.user,
            cfg.host,
            cfg.port,
            figure(logins[0])
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
        let mut second = Session::new(cfg.clone(), stale_after, 1);
        second.set_timeout(ACQUIRE_TIMEOUT);
        Ok(Site {
            p: p.clone(),
            url,
            s,
            second,
            made: vec![base.clone()],
            base,
            logins,
            login,
            rec: Record::ours(&p.name),
            first: String::new(),
            renamed: false,
            swept: false,
        })
    }

    /// `MKD` exclusive: the two sessions race for one name, [`ROUNDS`] times; then an `MKD`
    /// of an existing name.
    fn mkd_exclusive(&mut self) -> Result<Found> {
        let t0 = Instant::now();
        self.second.conn()?;
        self.logins.push(t0.elapsed());
        let mut refusals = Vec::new();
        for round in 0..ROUNDS {
            let name = format!("{}/race.{round}", self.base);
            self.made.push(name.clone());
            let (mut winners, mut broken) = (0, None);
            for res in self.race(&name) {
                match res {
                    Ok(Ok(Ok(()))) => winners += 1,
                    Ok(Ok(Err((code, _)))) => refusals.push(code),
                    Ok(Err(e)) => broken = Some(e.message().to_string()),
                    Err(_) => broken = Some("a contender panicked".into()),
                }
            }
            if let Some(why) = broken {
                return Ok(Found::Breaks(format!("could not probe: {why}")));
            }
            if winners != 1 {
                return Ok(Found::Breaks(format!(
                    "round {} of {ROUNDS}: {winners} sessions were told they made {name}",
                    round + 1
                )));
            }
        }
        let mut codes: Vec<String> = refusals.iter().map(u32::to_string).collect();
        codes.sort();
        codes.dedup();
        let again = format!("{}/race.0", self.base);
        let seq = self.s.cmd("MKD", |c| c.mkdir(again.as_str()))?;
        Ok(if refusals.iter().all(|c| (500..600).contains(c)) && seq.is_err() {
            Found::Holds(format!(
                "{ROUNDS} races of 2 sessions: one winner each, the other refused ({}); an existing name refused",
                codes.join(", ")
            ))
        } else {
            Found::Breaks(format!(
                "refusals answered {} (5xx expected); an MKD of an existing name {}",
                codes.join(", "),
                either(seq.is_ok(), "succeeded", "was refused")
            ))
        })
    }

    /// Both sessions `MKD name` at once: what each was answered.
    fn race(&mut self, name: &str) -> [RaceResult; 2] {
        let barrier = Barrier::new(2);
        let (s, second) = (&mut self.s, &mut self.second);
        std::thread::scope(|sc| {
            let barrier = &barrier;
            let ha = sc.spawn(move || {
                barrier.wait();
                s.cmd("MKD", |c| c.mkdir(name))
            });
            let hb = sc.spawn(move || {
                barrier.wait();
                second.cmd("MKD", |c| c.mkdir(name))
            });
            [ha.join(), hb.join()]
        })
    }

    /// The owner record is the marker's name, read back by `NLST`. A marker that cannot be
    /// made halts the probes after it.
    fn owner_record(&mut self) -> Result<Found> {
        self.first = marker_name(&self.rec, 0);
        let first_path = format!("{}/{}", self.base, self.first);
        self.made.push(first_path.clone());
        if let Err((code, text)) = self.s.cmd("MKD", |c| c.mkdir(first_path.as_str()))? {
            return Ok(Found::Halts(format!(
                "cannot make a marker directory: {text} (code {code})"
            )));
        }
        let names = self.s.entries(&self.base)?;
        Ok(if names.contains(&self.first) {
            Found::Holds(format!(
                "a marker directory ({} characters) listed back intact",
                self.first.len()
            ))
        } else {
            Found::Breaks(format!(
                "a marker directory made by MKD is not listed as {:?}: {names:?}",
                self.first
            ))
        })
    }

    /// The heartbeat renames the marker 3 times; listed under its new name only.
    fn heartbeat(&mut self) -> Result<Found> {
        let base = self.base.clone();
        let mut current = self.first.clone();
        let mut rtts = Vec::new();
        for seq in 1..=3u64 {
            let next = marker_name(&self.rec, seq);
            let (from, to) = (format!("{base}/{current}"), format!("{base}/{next}"));
            self.made.push(to.clone());
            let t = Instant::now();
            if let Err((code, text)) = self
                .s
                .cmd("RNFR/RNTO", |c| c.rename(from.as_str(), to.as_str()))?
            {
                return Ok(Found::Breaks(format!(
                    "cannot rename the marker: {text} (code {code})"
                )));
            }
            rtts.push(t.elapsed());
            current = next;
        }
        self.renamed = true;
        let names = self.s.entries(&base)?;
        let seen_new = names.contains(&current);
        let seen_old = names.contains(&self.first);
        Ok(if seen_new && !seen_old {
            Found::Holds(format!(
                "the marker renamed 3 times, listed under its new name only; {} per rename (median)",
                figure(median(rtts))
            ))
        } else {
            Found::Breaks(format!(
                "after the renames the listing {} the new name and {} the old one",
                either(seen_new, "shows", "lacks"),
                either(seen_old, "still shows", "lacks")
            ))
        })
    }

    /// Removal is a claim: an `RMD` of the name seen before the heartbeat must fail.
    fn claim_of_an_old_name(&mut self) -> Result<Found> {
        if !self.renamed {
            return Ok(Found::Skipped);
        }
        let old = format!("{}/{}", self.base, self.first);
        self.rmd_refused(
            &old,
            "RMD of the marker's name before the heartbeat refused",
            "RMD of the marker's name before the heartbeat succeeded: a breaker acting on an old observation could remove a live holder's marker",
        )
    }

    /// `RMD` of a directory that is not empty must fail.
    fn rmd_not_empty(&mut self) -> Result<Found> {
        let base = self.base.clone();
        self.rmd_refused(
            &base,
            "RMD of a directory holding a marker refused",
            "RMD removed a directory that was not empty: freeing a lock could remove a successor's marker",
        )
    }

    /// `RMD path`, which must be refused: `refused` (with the code), else `removed`.
    fn rmd_refused(&mut self, path: &str, refused: &str, removed: &str) -> Result<Found> {
        Ok(match self.s.cmd("RMD", |c| c.rmdir(path))? {
            Err((code, _)) => Found::Holds(format!("{refused} ({code})")),
            Ok(()) => Found::Breaks(removed.to_string()),
        })
    }

    /// `CWD` tells a directory from a missing name.
    fn directory_test(&mut self) -> Result<Found> {
        let missing = format!("{}/missing", self.base);
        let (dir, gone) = (self.s.is_dir(&self.base)?, self.s.is_dir(&missing)?);
        Ok(match (dir, gone) {
            (true, false) => {
                Found::Holds("CWD enters a directory and refuses a missing name".to_string())
            }
            (false, _) => Found::Breaks("CWD refused an existing directory".to_string()),
            (true, true) => Found::Breaks("CWD accepted a missing name".to_string()),
        })
    }

    /// The release: every probe directory removed, none listed in the parent after.
    fn release(&mut self) -> Result<Found> {
        if !self.swept {
            return Ok(Found::Breaks(
                "the server refused to remove probe directories".into(),
            ));
        }
        let parent = self.s.parent().map(str::to_string).unwrap_or_default();
        let listed = self
            .s
            .entries(if parent.is_empty() { "." } else { &parent });
        let base = &self.base;
        let name = base.rsplit('/').next().unwrap_or(base).to_string();
        Ok(match listed {
            Ok(names) if names.contains(&name) => Found::Breaks(format!(
                "{base} is still listed after its RMD was answered"
            )),
            Ok(_) => Found::Holds(format!(
                "{} probe directories removed; none listed after",
                self.made.len()
            )),
            Err(e) => Found::Breaks(format!("could not list the parent: {e}")),
        })
    }

    /// The longest login, and the `stale_after` that leaves a heartbeat after a dropped
    /// connection room to reconnect, log in and rename (four logins with room to spare).
    fn longest_login(&self) -> (Duration, Duration, Duration) {
        let login = self.logins.iter().copied().max().unwrap_or_default();
        let needs = (login * 2).max(Duration::from_millis(50));
        (login, needs, round_up(needs * 4))
    }

    /// A heartbeat after a dropped connection reconnects, logs in and renames within
    /// `stale_after`/4 (at most [`HOLD_TIMEOUT_MAX`]).
    fn reconnect(&mut self) -> Result<Found> {
        let hold = self.s.hold_timeout();
        let (login, needs, accept) = self.longest_login();
        let (took, of) = (figure(login), self.logins.len());
        Ok(if needs > HOLD_TIMEOUT_MAX {
            Found::Breaks(format!(
                "a login took up to {took} (of {of}): a heartbeat after a dropped connection must reconnect, log in and rename within {} whatever stale_after is; ask for a faster login (the server's password hashing)",
                fmt_duration(HOLD_TIMEOUT_MAX)
            ))
        } else if needs > hold {
            Found::Breaks(format!(
                "a login took up to {took} (of {of}), but a heartbeat after a dropped connection must reconnect, log in and rename within stale_after/4 = {}: set stale_after to at least {}",
                fmt_duration(hold),
                fmt_duration(accept)
            ))
        } else {
            Found::Holds(format!(
                "a login took up to {took} (of {of}), within the {} a heartbeat after a dropped connection may take (stale_after/4, at most {})",
                fmt_duration(hold),
                fmt_duration(HOLD_TIMEOUT_MAX)
            ))
        })
    }
}

/// What one session was answered in a race: a join error if its thread panicked.
type RaceResult = std::thread::Result<Result<std::result::Result<(), (u32, String)>>>;

/// The FTP backend's declaration: the server commands it relies on, in the order they are
/// tried.
impl Probing for Site {
    fn header(&self) -> (String, String) {
        (
            format!(
                "locksmith verify {}: backend ftp, lock {}",
                self.p.name, self.url
            ),
            self.url.clone(),
        )
    }

    fn properties(&self) -> Vec<Property<Site>> {
        vec![
            Property::known(
                "login",
                verify::Reliance::Relied,
                Found::Holds(self.login.clone()),
            ),
            Property::relied("mkd exclusive", Site::mkd_exclusive),
            Property::relied("owner record (NLST)", Site::owner_record),
            Property::relied("heartbeat (RNFR/RNTO)", Site::heartbeat),
            Property::relied("claim of an old name", Site::claim_of_an_old_name),
            Property::relied("rmd not empty", Site::rmd_not_empty),
            Property::relied("directory test (CWD)", Site::directory_test),
        ]
    }

    /// Removes every registered name, newest first; the second session ends first.
    fn clean_up(&mut self) -> Vec<String> {
        self.second.quit();
        let left = sweep(&mut self.s, &self.made);
        self.swept = left.is_empty();
        left
    }

    fn afterwards(&self) -> Vec<Property<Site>> {
        vec![
            Property::relied("release (RMD)", Site::release),
            Property::relied("reconnect", Site::reconnect),
            Property::stated(
                "server clock",
                "not read: liveness is the marker's name changing, watched on each waiter's own clock",
            ),
            Property::stated(
                "idle timeout",
                format!(
                    "not measured: each heartbeat (every {}) is a command, which resets it; a shorter one costs a reconnect",
                    // In whole milliseconds: a third of 10s is 3s333ms, not 3s333ms333us333ns.
                    fmt_duration(Duration::from_millis(
                        self.p.common.heartbeat().as_millis() as u64
                    ))
                ),
            ),
        ]
    }

    fn accepts(&mut self, _: &mut Report) -> String {
        let (_, _, accept) = self.longest_login();
        format!(
            "backend ftp keeps SPEC §6 here; it accepts stale_after of {} or more (now {}: four logins with room to spare)",
            fmt_duration(accept),
            fmt_duration(self.p.common.stale_after)
        )
    }
}

impl Drop for Site {
    /// Ends the first session politely once all is said (or an error ends `verify`).
    fn drop(&mut self) {
        self.s.quit();
    }
}

/// Up to the next 100 ms.
fn round_up(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis().div_ceil(100) as u64 * 100)
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
    const SLOTS: bool = true;
    fn parse(f: &mut Fields) -> Result<FtpConfig> {
        super::config::config(f)
    }
    fn slot(cfg: &FtpConfig, k: u32) -> FtpConfig {
        cfg.slot(k)
    }
    fn queue(cfg: &FtpConfig) -> Option<FtpConfig> {
        Some(cfg.queue())
    }
    fn room(cfg: &FtpConfig, lock: &Named) -> Option<crate::backend::room::Room> {
        let room = super::room::FtpRoom::new(cfg, lock);
        Some(crate::backend::room::Room::new(room))
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
