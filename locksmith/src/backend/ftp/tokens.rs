//! Fencing tokens over FTP: the state entry `PARENT/NAME.state/state~1~TOKEN~CLEAN`, an
//! empty directory whose name is the record, advanced by renaming its exact name (a
//! compare-and-swap) while holding the gate.

use super::marker::{parse_state, state_name};
use super::session::Session;
use crate::backend::owner::State;
use crate::error::{Result, err};
use crate::log::debug;

impl Session {
    /// The state entry (`state~1~TOKEN~CLEAN`): its name, the last token issued and whether
    /// that acquisition ended in a clean release. `None`: no token issued yet. Several
    /// entries (never made by locksmith) count by the highest token.
    pub(super) fn read_state(&mut self) -> Result<Option<(String, State)>> {
        let dir = self.state_dir();
        // `STAT DIR` lists on the control connection (`ls -l` lines: vsftpd, pure-ftpd),
        // saving the data connection of `NLST`, which some servers answer slowly. A reply
        // without a state entry (an unsupported `STAT`, or none yet) is checked by `NLST`.
        let stat = format!("STAT {dir}");
        let listed = self.cmd("STAT", |c| {
            c.custom_command(
                stat.as_str(),
                // Not 211: suppaftp then takes "211-" for FEAT's opener and would stop
                // reading after the first line, leaving the rest of the reply behind.
                &[suppaftp::Status::Directory, suppaftp::Status::File],
            )
        })?;
        if let Ok(r) = &listed {
            debug!("STAT {dir}: {:?}", String::from_utf8_lossy(&r.body));
        }
        let mut names: Vec<String> = match listed {
            Ok(r) => String::from_utf8_lossy(&r.body)
                .split_whitespace()
                .filter(|w| parse_state(w).is_some())
                .map(str::to_string)
                .collect(),
            Err(_) => Vec::new(),
        };
        if names.is_empty() {
            names = self.entries(&dir)?;
        }
        let mut best: Option<(String, State)> = None;
        for n in names {
            if let Some(st) = parse_state(&n)
                && best.as_ref().is_none_or(|(_, b)| st.token > b.token)
            {
                best = Some((n, st));
            }
        }
        Ok(best)
    }

    /// Issues the next fencing token, holding the gate: renames the state entry to TOKEN+1,
    /// marked not clean until our release. Returns the token and whether the previous
    /// acquisition ended uncleanly. The rename of the exact old name is a compare-and-swap
    /// (a holder broken as stale and still running cannot interleave a stale write).
    /// With several slots (SPEC §3b) every slot's holder issues from the lock's one state,
    /// which records the issuer's number of slots: another number recorded is the lock's say
    /// first ([`Agree`](crate::backend::lock::Agree)); a lost rename is another slot's
    /// holder's, and we read again.
    pub(super) fn issue_token(&mut self) -> Result<(u64, bool)> {
        let dir = self.state_dir();
        let several = self.slots > 1;
        let rounds = if several { 50 } else { 4 };
        for round in 0..rounds {
            if several && round > 0 {
                std::thread::sleep(std::time::Duration::from_millis(fastrand::u64(1..20)));
            }
            match self.read_state()? {
                // Ours: an issue of ours whose reply was lost went through (no one else
                // issues while our gate marker stands — but for slots, whose holders share the
                // counter: never remembered there).
                Some((name, _)) if self.issued.as_ref().is_some_and(|(to, _, _)| *to == name) => {
                    let (_, token, dirty) = self.issued.clone().expect("matched above");
                    return Ok((token, dirty));
                }
                Some((name, st)) => {
                    if st.slots() != self.slots.max(1)
                        && let Some(agree) = &self.agree
                    {
                        agree(st.slots())?;
                    }
                    let next = state_name(State {
                        token: st.token + 1,
                        // Slots carry the clean mark over (see lockdir/state.rs).
                        clean: several && st.clean,
                        slots: self.slots,
                    });
                    // Unanswered, it may still land: remembered until an answer settles it.
                    self.issued = (!several).then(|| (next.clone(), st.token + 1, !st.clean));
                    let (from, to) = (format!("{dir}/{name}"), format!("{dir}/{next}"));
                    match self.cmd("RNFR/RNTO", |c| c.rename(from.as_str(), to.as_str()))? {
                        Ok(()) => return Ok((st.token + 1, !several && !st.clean)),
                        Err((code, text)) => {
                            self.issued = None;
                            debug!("state {from} → {to}: {text} (code {code}); reading again");
                        }
                    }
                }
                None => {
                    // A new state directory only when `MKD` says it was missing: an empty
                    // listing alone (a server's hiccup) must never restart the tokens at 1.
                    let made = self.cmd("MKD", |c| c.mkdir(dir.as_str()))?.is_ok();
                    if made || self.entries(&dir)?.is_empty() && self.is_dir(&dir)? {
                        let name = state_name(State {
                            token: 1,
                            clean: false,
                            slots: self.slots,
                        });
                        self.issued = (!several).then(|| (name.clone(), 1, false));
                        let first = format!("{dir}/{name}");
                        if self.cmd("MKD", |c| c.mkdir(first.as_str()))?.is_ok() {
                            return Ok((1, false));
                        }
                        self.issued = None;
                    }
                }
            }
        }
        Err(err!(
            Io,
            "cannot issue a fencing token for {}: the state in {dir} keeps changing or cannot be written",
            self.url()
        ))
    }

    /// Marks our acquisition's state entry clean (before the release removes our marker).
    /// A failure only makes the next holder say `prev=crashed`.
    pub(super) fn mark_clean(&mut self, token: u64) {
        if self.slots > 1 {
            // Never marked (see `issue_token`).
            return;
        }
        let dir = self.state_dir();
        let (from, to) = (
            format!("{dir}/{}", state_name(State::one(token, false))),
            format!("{dir}/{}", state_name(State::one(token, true))),
        );
        match self.cmd("RNFR/RNTO", |c| c.rename(from.as_str(), to.as_str())) {
            Ok(Ok(())) => {}
            Ok(Err((_, text))) => debug!("state {from} not marked clean: {text}"),
            Err(e) => debug!("state {from} not marked clean: {e}"),
        }
    }
}
