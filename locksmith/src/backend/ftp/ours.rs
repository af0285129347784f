//! Our marker on the server — the owner marker inside the lock directory (a writer's gate), or
//! a reader's registration in `NAME.readers` — renamed every heartbeat, found again by its
//! nonce when a reply was lost, and removed as the claim at release. The two differ only in
//! where the marker lives and how it is named ([`Place`]).

use super::marker::{marker_name, parse_marker, parse_reader, reader_name};
use super::session::{Look, Session};
use crate::backend::owner::Record;
use crate::error::{Result, err};

/// Where our marker lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Place {
    /// `PATH/owner~…`: the gate's owner marker.
    Owner,
    /// `PARENT/NAME.readers/reader~…`: a reader's registration.
    Reader,
}

impl Place {
    fn path(self, s: &Session, name: &str) -> String {
        match self {
            Place::Owner => s.inside(name),
            Place::Reader => format!("{}/{name}", s.readers_dir()),
        }
    }

    fn name(self, rec: &Record, seq: u64) -> String {
        match self {
            Place::Owner => marker_name(rec, seq),
            Place::Reader => reader_name(rec, seq),
        }
    }

    /// The names beside our marker; `None`: its directory is gone.
    fn list(self, s: &mut Session) -> Result<Option<Vec<String>>> {
        match self {
            Place::Owner => Ok(match s.look()? {
                Look::Dir(names) => Some(names),
                Look::Gone => None,
            }),
            Place::Reader => {
                let dir = s.readers_dir();
                s.entries(&dir).map(Some)
            }
        }
    }

    fn parse(self, name: &str) -> Option<(Record, u64)> {
        match self {
            Place::Owner => parse_marker(name),
            Place::Reader => parse_reader(name),
        }
    }

    /// How messages name the lock and the marker.
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Place::Owner => ("lock", "owner marker"),
            Place::Reader => ("shared lock", "reader marker"),
        }
    }
}

/// One acquisition's marker on the server.
pub(super) struct Ours {
    pub(super) rec: Record,
    pub(super) seq: u64,
    /// The marker's current name.
    pub(super) marker: String,
    /// Its `RMD` was sent for release; the reply may have been lost.
    pub(super) claim_sent: bool,
    place: Place,
}

/// What the claim found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Claimed {
    /// We removed our marker now: the acquisition is ours to end.
    Now,
    /// An earlier `RMD` of ours went through unanswered: the marker is gone, and what is at
    /// its place now may be a newcomer's.
    Before,
}

impl Ours {
    /// The marker just made (`seq` 0).
    pub(super) fn new(place: Place, rec: Record) -> Ours {
        Ours {
            marker: place.name(&rec, 0),
            rec,
            seq: 0,
            claim_sent: false,
            place,
        }
    }

    /// A marker of ours found on the server by its nonce (made by a request whose reply was
    /// lost), named `marker` at `seq`.
    pub(super) fn found(place: Place, rec: Record, marker: String, seq: u64) -> Ours {
        Ours {
            marker,
            rec,
            seq,
            claim_sent: false,
            place,
        }
    }

    /// Where it is on the server.
    pub(super) fn path(&self, s: &Session) -> String {
        self.place.path(s, &self.marker)
    }

    /// One heartbeat: rename our marker to the next sequence number. A refused rename whose
    /// marker is still there (renamed by an earlier request whose reply was lost) is adopted
    /// and retried soon; a marker gone is `Lost`.
    pub(super) fn beat(&mut self, s: &mut Session) -> Result<()> {
        let next = self.place.name(&self.rec, self.seq + 1);
        let (from, to) = (self.path(s), self.place.path(s, &next));
        let Err((code, text)) = s.cmd("heartbeat (RNFR/RNTO)", |c| {
            c.rename(from.as_str(), to.as_str())
        })?
        else {
            self.seq += 1;
            self.marker = next;
            return Ok(());
        };
        let (lock, what) = self.place.words();
        match self.find_twice(s)? {
            Some((name, seq)) => {
                self.marker = name;
                self.seq = seq;
                let of = if self.place == Place::Reader {
                    "reader of "
                } else {
                    ""
                };
                Err(err!(
                    Unavailable,
                    "heartbeat of {of}{} refused: {text} (code {code})",
                    s.url()
                ))
            }
            None => Err(err!(
                Lost,
                "{lock} {} was broken: our {what} is gone",
                s.url()
            )),
        }
    }

    /// The claim of a release: `RMD` of our marker. An error keeps the marker ours (its name
    /// found again): the caller may retry.
    pub(super) fn claim(&mut self, s: &mut Session) -> Result<Claimed> {
        let claim_was_sent = self.claim_sent;
        self.claim_sent = true;
        let target = self.path(s);
        if s.remove_marker(&target)? {
            return Ok(Claimed::Now);
        }
        let (lock, what) = self.place.words();
        match self.find(s)? {
            Some((name, seq)) => {
                self.marker = name;
                self.seq = seq;
                self.claim_sent = false;
                Err(err!(
                    Io,
                    "cannot release {lock} {}: the server refused to remove our {what}",
                    s.url()
                ))
            }
            // Our RMD went through but its reply was lost.
            None if claim_was_sent => Ok(Claimed::Before),
            None => Err(err!(
                Lost,
                "{lock} {} was broken while held: our {what} is gone",
                s.url()
            )),
        }
    }

    /// Our marker's current name on the server, found by our nonce (`None`: it is gone).
    pub(super) fn find(&self, s: &mut Session) -> Result<Option<(String, u64)>> {
        let Some(names) = self.place.list(s)? else {
            return Ok(None);
        };
        Ok(names.into_iter().find_map(|n| {
            let (rec, seq) = self.place.parse(&n)?;
            (rec.nonce == self.rec.nonce).then_some((n, seq))
        }))
    }

    /// [`Self::find`], and when it says gone, once more on a fresh session: a server under
    /// load has answered a listing without entries that were there (libunftp), and a false
    /// "gone" would make a live holder give its lock up.
    fn find_twice(&self, s: &mut Session) -> Result<Option<(String, u64)>> {
        if let Some(found) = self.find(s)? {
            return Ok(Some(found));
        }
        s.quit();
        self.find(s)
    }
}
