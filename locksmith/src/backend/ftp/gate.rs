//! The gate: the exclusive lock directory on the server and our owner marker in it — taking
//! it (`MKD`), its heartbeat (renaming the marker), its release (the claim, then the name),
//! and its holder as the judge (`stale.rs`) sees it. A writer holds the gate; a reader holds
//! it only while registering (`shared.rs`).

use std::path::PathBuf;
use std::time::Duration;

use super::config::FtpConfig;
use super::marker::{is_marker, parse_marker};
use super::ours::{Claimed, Ours, Place};
use super::session::{self, ACQUIRE_TIMEOUT, Look, Session};
use crate::backend::lock::{Grant, Holder, Named, Tried, request_by};
use crate::backend::owner::{Parsed, Record};
use crate::backend::stale::{Evidence, Holders, Judge};
use crate::backend::wake::Wakeups;
use crate::error::{Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;

/// The gate of one lock, and our acquisition of it.
pub(super) struct Gate {
    pub(super) s: Session,
    pub(super) profile: String,
    poll: Duration,
    pub(super) ours: Option<Ours>,
    /// SPEC §6's rule (`stale.rs`), for the gate's holder and for readers alike.
    pub(super) judge: Judge,
    /// The pidfd of a same-host holder (no directory events over FTP).
    pub(super) wake: Wakeups,
    /// This acquisition's owner record, kept across tries: a marker of ours made by an `MKD`
    /// whose reply was lost is found by its nonce and taken as ours (issue 27), where a new
    /// nonce would make it look like a live holder until `stale_after`.
    rec: Option<Record>,
    /// An `MKD PATH` of ours went unanswered and may have made an empty lock directory.
    unsure_dir: bool,
    /// While waiting: the wait's deadline, which bounds each command of a try too
    /// ([`Backend::answer_by`](crate::backend::lock::Backend::answer_by)).
    pub(super) by: Option<std::time::Instant>,
}

impl Gate {
    pub(super) fn new(cfg: FtpConfig, profile: &Named) -> Gate {
        let judge = Judge::new(profile, PathBuf::from(session::url_of(&cfg)), false);
        Gate {
            s: Session::new(cfg, profile.common.stale_after, profile.common.slots),
            profile: profile.name.to_string(),
            poll: profile.common.poll,
            ours: None,
            judge,
            wake: Wakeups::default(),
            rec: None,
            unsure_dir: false,
            by: None,
        }
    }

    /// This acquisition's owner record (made once, kept across tries).
    pub(super) fn record(&mut self) -> Record {
        let profile = &self.profile;
        self.rec.get_or_insert_with(|| Record::ours(profile)).clone()
    }

    /// `MKD`, then the owner marker inside. `Ok(false)`: refused (exists, or see below).
    fn create(&mut self) -> Result<bool> {
        let path = self.s.cfg.path.clone();
        let rec = self.record();
        let was_unsure = self.unsure_dir;
        // Unanswered, it may still land: remembered until a look settles it.
        self.unsure_dir = true;
        if let Err((code, text)) = self.s.cmd("MKD", |c| c.mkdir(path.as_str()))? {
            debug!("MKD {path}: {text} (code {code})");
            self.unsure_dir = was_unsure;
            self.s.last_mkd = Some(text);
            return Ok(false);
        }
        // A new gate: no token of ours can stand in the state yet.
        self.s.issued = None;
        let ours = Ours::new(Place::Owner, rec);
        let target = ours.path(&self.s);
        match self.s.cmd("MKD", |c| c.mkdir(target.as_str())) {
            Ok(Ok(())) => {}
            Ok(Err((code, text))) => {
                // Refused right after our `MKD PATH`: look before concluding anything. Gone,
                // or holding a marker: not ours any more (removed by someone, perhaps taken
                // since) — try again as a locker would. Still there and empty: we may not
                // write inside it; remove it (an empty lock directory is nobody's lock).
                match self.s.look()? {
                    Look::Dir(names) if names.is_empty() => {
                        let _ = self.s.cmd("RMD", |c| c.rmdir(path.as_str()));
                        return Err(err!(
                            Denied,
                            "cannot create owner marker in {}: {text} (code {code})",
                            self.s.url()
                        ));
                    }
                    _ => {
                        debug!("MKD {target}: {text} (code {code}); the lock changed hands");
                        return Ok(false);
                    }
                }
            }
            Err(e) => {
                // The connection broke: leave nothing behind (the directory is ours, and
                // empty unless our marker made it).
                let _ = self.s.cmd("RMD", |c| c.rmdir(target.as_str()));
                let _ = self.s.cmd("RMD", |c| c.rmdir(path.as_str()));
                return Err(e);
            }
        }
        self.ours = Some(ours);
        self.unsure_dir = false;
        Ok(true)
    }

    /// After a refused `MKD PATH`, the lock directory as listed: our own marker, made by a
    /// try whose reply was lost, is taken as ours — renamed at once (a heartbeat: waiters
    /// count its silence from now, no earlier than this try) — `Ok(true)`. An empty directory
    /// an unanswered `MKD PATH` of ours may have made is removed (`RMD` fails if a marker
    /// appeared meanwhile; a locker between its two `MKD`s finds its directory gone and tries
    /// again) — `Ok(false)`, to try again.
    fn recognise(&mut self, names: &[String]) -> Result<Option<bool>> {
        let Some(rec) = self.rec.clone() else {
            return Ok(None);
        };
        let mine = names.iter().find_map(|n| {
            let (r, seq) = parse_marker(n)?;
            (r.nonce == rec.nonce).then(|| (n.clone(), seq))
        });
        if let Some((name, seq)) = mine {
            let mut ours = Ours::found(Place::Owner, rec, name, seq);
            ours.beat(&mut self.s)?;
            info!(
                "lock {}: an owner marker of ours whose reply was lost is there; it is ours",
                self.s.url()
            );
            self.ours = Some(ours);
            self.unsure_dir = false;
            return Ok(Some(true));
        }
        if names.is_empty() && self.unsure_dir {
            let path = self.s.cfg.path.clone();
            let r = self.s.cmd("RMD", |c| c.rmdir(path.as_str()))?;
            debug!("RMD {path} (an unanswered MKD of ours may have made it): {r:?}");
            self.unsure_dir = false;
            return Ok(Some(false));
        }
        Ok(None)
    }

    /// One heartbeat: rename our marker to the next sequence number.
    pub(super) fn beat(&mut self) -> Result<()> {
        match self.ours.as_mut() {
            Some(ours) => ours.beat(&mut self.s),
            None => Err(err!(Lost, "lock {} is not ours", self.s.url())),
        }
    }

    /// One round of attempts on the current connection.
    fn try_once(&mut self) -> Result<Tried> {
        let mut holders = Vec::new();
        let mut gone = 0;
        for _ in 0..4 {
            if self.create()? {
                self.s.set_timeout(self.s.hold_timeout());
                // Tombstones are left only by a release or break cut short: look for them
                // after a break, and now and then (a listing costs a data connection).
                if self.judge.broke || fastrand::u8(..16) == 0 {
                    self.s.tidy_leftovers();
                }
                return Ok(Tried::Took(self.judge.grant(&mut self.wake, None)));
            }
            // 550 is ambiguous (exists, missing parent, permission, a file in the way):
            // decide by looking, never by the reply's text.
            match self.s.look()? {
                Look::Dir(names) => {
                    match self.recognise(&names)? {
                        Some(true) => {
                            self.s.set_timeout(self.s.hold_timeout());
                            return Ok(Tried::Took(self.judge.grant(&mut self.wake, None)));
                        }
                        Some(false) => continue,
                        None => {}
                    }
                    match self.judge.clear_dead(
                        &mut Listing {
                            s: &mut self.s,
                            listed: Some(names),
                        },
                        &mut self.wake,
                    )? {
                        Some(h) => {
                            holders = h;
                            break;
                        }
                        None => continue,
                    }
                }
                Look::Gone => {
                    if let Some(parent) = self.s.parent().map(str::to_string)
                        && !self.s.is_dir(&parent)?
                        && self.confirm_missing(&parent)?
                    {
                        return Err(err!(
                            Config,
                            "cannot create lock directory {}: the parent directory {parent} does not exist on the server (locksmith never creates parent directories)",
                            self.s.url()
                        ));
                    }
                    // Usually released between our MKD and our look; if it keeps
                    // happening, find out whether something else refuses us.
                    gone += 1;
                    if gone >= 2
                        && let Some(e) = self.s.diagnose_refusal()?
                    {
                        return Err(e);
                    }
                }
            }
        }
        Ok(Tried::Busy(holders))
    }

    /// With the lock just taken exclusively: issue the token and put it into our marker
    /// (the rename doubles as a first heartbeat).
    pub(super) fn stamp_token(&mut self, grant: &mut Grant) -> Result<()> {
        let (token, dirty) = self.s.issue_token()?;
        if let Some(o) = self.ours.as_mut() {
            o.rec.token = Some(token);
        }
        self.beat()?;
        grant.token = Some(token);
        grant.prev_crashed |= dirty;
        Ok(())
    }

    /// Tries for the gate — the exclusive lock directory — reconnecting a few times.
    /// Confirms that `dir` is missing on three fresh sessions, a moment apart, before a
    /// config error is called: libunftp was seen to refuse a `CWD` spuriously under races and
    /// heavy load, twice in a row on one CI run.
    fn confirm_missing(&mut self, dir: &str) -> Result<bool> {
        for _ in 0..3 {
            self.s.conn = None;
            std::thread::sleep(self.poll.min(Duration::from_secs(1)));
            if self.s.is_dir(dir)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    pub(super) fn try_gate(&mut self) -> Result<Tried> {
        let bound = request_by(ACQUIRE_TIMEOUT, self.by);
        self.s
            .set_timeout(bound.saturating_duration_since(std::time::Instant::now()));
        // A connection that worked and then broke (server restart, a dropped session) is
        // re-established a few times; a server that cannot be reached at all is an error.
        let mut retries = 0;
        loop {
            let had_conn = self.s.conn.is_some();
            match self.try_once() {
                Err(e) if e.kind() == Kind::Unavailable && had_conn && retries < 3 => {
                    retries += 1;
                    debug!("{e}; reconnecting");
                    std::thread::sleep(self.poll.min(Duration::from_secs(1)));
                }
                other => return other,
            }
        }
    }

    /// Releases: remove our marker (the claim), then the name. An error other than `Lost`
    /// keeps `ours`: the caller retries until stale_after.
    pub(super) fn release_once(&mut self) -> Result<()> {
        let Some(ours) = self.ours.as_mut() else {
            return Ok(());
        };
        if let Some(t) = ours.rec.token
            && !ours.claim_sent
        {
            self.s.mark_clean(t);
        }
        let nonce = ours.rec.nonce.clone();
        match ours.claim(&mut self.s) {
            Err(e) if e.kind() != Kind::Lost => return Err(e),
            Err(e) => {
                self.ours = None;
                return Err(e);
            }
            Ok(Claimed::Now) => self.s.free_name(&nonce)?,
            // The name is not freed here: the directory we see may already be a newcomer's,
            // between its `MKD PATH` and its marker. Ours, left ownerless, is broken after
            // `stale_after` like any lock without a marker.
            Ok(Claimed::Before) => debug!(
                "our marker's removal went through unanswered; leaving {} to stale_after",
                self.s.url()
            ),
        }
        self.ours = None;
        Ok(())
    }

    /// Gives back what an unanswered try may have left (a locker giving up): our marker, found
    /// by our nonce, is claimed and its lock directory freed; an empty lock directory our
    /// unanswered `MKD` may have made is removed. Best effort, on a short bound: what stays is
    /// broken as stale later.
    pub(super) fn give_back(&mut self) {
        let Some(rec) = self.rec.clone() else {
            return;
        };
        self.s.deadline = Some(std::time::Instant::now() + Duration::from_secs(2));
        if self.ours.is_none()
            && let Ok(Look::Dir(names)) = self.s.look()
        {
            if let Some((name, seq)) = names.iter().find_map(|n| {
                let (r, seq) = parse_marker(n)?;
                (r.nonce == rec.nonce).then(|| (n.clone(), seq))
            }) {
                self.ours = Some(Ours::found(Place::Owner, rec, name, seq));
            } else if names.is_empty() && self.unsure_dir {
                let path = self.s.cfg.path.clone();
                let _ = self.s.cmd("RMD", |c| c.rmdir(path.as_str()));
            }
        }
        if self.ours.is_some() {
            match self.release_once() {
                Ok(()) => info!("gave back lock {}: a try of ours whose reply was lost had taken it", self.s.url()),
                Err(e) => info!("a try of ours whose reply was lost may have taken lock {}; it stays until it is stale ({e})", self.s.url()),
            }
        }
        self.s.deadline = None;
    }

    /// The holder of the gate (exclusive), if any.
    pub(super) fn gate_holders(&mut self) -> Result<Vec<Holder>> {
        let mut gate = Listing {
            s: &mut self.s,
            listed: None,
        };
        Ok(gate
            .holders()?
            .unwrap_or_default()
            .iter()
            .map(Evidence::holder)
            .collect())
    }
}

/// The gate's listing — the exclusive lock directory — as the judge (`stale.rs`) sees it: its holder
/// is its owner marker, whose name changes at every heartbeat (the sign is the listing).
pub(super) struct Listing<'a> {
    pub(super) s: &'a mut Session,
    /// A listing just read: the first look.
    pub(super) listed: Option<Vec<String>>,
}

impl Holders for Listing<'_> {
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        let names = match self.listed.take() {
            Some(names) => names,
            None => match self.s.look()? {
                Look::Gone => return Ok(None),
                Look::Dir(names) => names,
            },
        };
        let record = match names.iter().find(|n| is_marker(n)) {
            Some(m) => Some(match parse_marker(m) {
                Some((rec, _)) => Parsed::V1(rec),
                None => Parsed::Foreign(m.clone()),
            }),
            // Empty: a locker between its two `MKD`s, or one that died there.
            None if names.is_empty() => None,
            None => Some(Parsed::Foreign(format!(
                "no owner marker, but {} other entries: another tool's directory",
                names.len()
            ))),
        };
        let key = match &record {
            Some(Parsed::V1(r)) => r.nonce.clone(),
            _ => String::new(),
        };
        Ok(Some(vec![Evidence {
            key: key.into(),
            record,
            sign: names.join("\n").into_bytes(),
            mode: Mode::Exclusive,
            age: None,
        }]))
    }

    /// The claim on the exact marker seen; a directory without one is removed by `RMD`
    /// (which fails if a marker appeared meanwhile), or — another tool's, only with
    /// `--force` — renamed away.
    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let seen = String::from_utf8_lossy(&ev.sign).into_owned();
        match seen.lines().find(|n| is_marker(n)) {
            Some(m) => self.s.claim_and_remove(m),
            None if ev.record.is_none() => self.s.remove_ownerless(false),
            None => self.s.remove_ownerless(true),
        }
    }
}
