//! A lock's waiting room (SPEC §3b: "the lock records N while anyone holds or waits"): the
//! handle a waiter (`waiting.rs`) and the lock's say (`slots.rs`'s `agreement`) share, over
//! the room a backend keeps — its mechanism only: how a place is taken, kept and given back,
//! and how the room is looked at (`lockdir/room.rs`: a byte-range lock of a local file;
//! `lockdir/netroom.rs` and `ftp/room.rs`: a directory per place, its name stamped;
//! `s3/room.rs`: an object per place). `waiting.rs`
//! says what a room is for and which backends keep one (redis keeps its own, in its taking
//! script).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::error::Result;
use crate::log::debug;

/// A backend's waiting room: its mechanism.
pub trait Keeper: Send + Sync {
    /// Takes a place for a waiter of `n` slots, its requests answered by `by` (the wait's
    /// deadline, if any). `Ok(None)`: no place taken here — the lock's own backend takes it in
    /// its tries (ftp: `ftp/room.rs`).
    fn join(&self, n: u32, by: Option<Instant>) -> Result<Option<Box<dyn Place>>>;

    /// The number of slots of a live waiter in the room other than `n`, if any. A room that
    /// cannot be looked at shows nobody (it is a courtesy to waiters, and must not keep the
    /// lock's number from changing for ever): said at `-v` by the keeper.
    fn other_than(&self, n: u32, lock: &str, by: Option<Instant>) -> Option<u32>;

    /// Whether a look costs nothing worth counting (a local file): then a contender looks at
    /// every issue, over its own number too; else only when another number is recorded
    /// (a look over one's own number would cost a request at every acquisition).
    fn cheap(&self) -> bool;
}

/// A waiter's place in a room; dropped, it is given back (a request, where the room is on a
/// server, bounded by the keeper).
pub trait Place: Send {
    /// Keeps the place alive where it expires (a server's), once due; by `by`.
    fn keep(&mut self, _by: Option<Instant>) -> Result<()> {
        Ok(())
    }

    /// How soon [`Place::keep`] must be called again; `None`: never.
    fn keep_within(&self) -> Option<Duration> {
        None
    }

    /// Whether giving it back takes a request (a server's): a waiter that took the lock then
    /// gives it back beside its OK line, not before it.
    fn leaves_slowly(&self) -> bool {
        false
    }
}

/// A lock's room, as one acquisition sees it: the keeper, and whether this acquisition
/// waits there now (a waiter of the number recorded, taking the lock, is no newcomer: it need
/// not look — with 1,000 waiters in a room, a look reads the 1,000 places at every handoff).
#[derive(Clone)]
pub struct Room {
    keeper: Arc<dyn Keeper>,
    joined: Arc<AtomicBool>,
    /// The wait's deadline, told by the waiter (`waiting.rs`), which bounds a look's requests.
    by: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Room {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Room")
            .field("joined", &self.waited())
            .finish_non_exhaustive()
    }
}

impl Room {
    pub fn new(keeper: impl Keeper + 'static) -> Room {
        Room {
            keeper: Arc::new(keeper),
            joined: Arc::new(AtomicBool::new(false)),
            by: Arc::new(Mutex::new(None)),
        }
    }

    /// Whether this acquisition waited in the room, and still does.
    pub fn waited(&self) -> bool {
        self.joined.load(Ordering::SeqCst)
    }

    /// Said by the waiter as it joins and leaves.
    pub fn set_joined(&self, joined: bool) {
        self.joined.store(joined, Ordering::SeqCst);
    }

    /// The wait's deadline, told before each try.
    pub fn answer_by(&self, by: Option<Instant>) {
        *self.by.lock().unwrap_or_else(|e| e.into_inner()) = by;
    }

    fn by(&self) -> Option<Instant> {
        *self.by.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Keeper::join`].
    pub fn join(&self, n: u32) -> Result<Option<Box<dyn Place>>> {
        self.keeper.join(n, self.by())
    }

    /// Whether a contender that holds its lock and finds `before` recorded, asking for `n`,
    /// looks at the room (the rule of `slots.rs`'s `agreement`): not a waiter of the number
    /// recorded that waits here itself (no newcomer); over its own number only where a look
    /// is cheap.
    pub fn looks(&self, before: u32, n: u32) -> bool {
        if before == n {
            !self.waited() && self.keeper.cheap()
        } else {
            true
        }
    }

    /// [`Keeper::other_than`].
    pub fn other_than(&self, n: u32, lock: &str) -> Option<u32> {
        self.keeper.other_than(n, lock, self.by())
    }
}

/// What a look at a room kept on a server found, as [`Keeper::other_than`] says it: the
/// number of the first live place (its name, number, whether it lives) of a number other than `n`. A room
/// that could not be read shows nobody (said at `-v`).
pub fn other_number<P>(found: Result<Vec<(P, u32, bool)>>, n: u32, lock: &str) -> Option<u32> {
    match found {
        Ok(places) => places
            .into_iter()
            .find_map(|(_, m, live)| (live && m != n).then_some(m)),
        Err(e) => {
            debug!("lock {lock}: its waiting room: {e}; looked at as empty");
            None
        }
    }
}

/// The most dead places one join removes from a room kept on a server (the rest go with the
/// next joiners).
pub const TIDIED: usize = 16;

/// A joiner's tidying of a room kept on a server: `remove` each place of `found` that does
/// not live — `Ok(true)` removed, `Ok(false)` not (renamed since by a live waiter, something
/// else at its name), `Err` the server failed (tidying stops) — until [`TIDIED`] are removed
/// or four times as many tried: names nobody can remove do not use up every join's tidying.
pub fn tidy<P>(
    found: Vec<(P, u32, bool)>,
    mut remove: impl FnMut(&P) -> Result<bool>,
) -> Result<()> {
    let mut removed = 0;
    for (name, _, _) in found.iter().filter(|p| !p.2).take(4 * TIDIED) {
        if removed == TIDIED {
            break;
        }
        if remove(name)? {
            removed += 1;
        }
    }
    Ok(())
}

/// A place in a room with no clock of its own (an FTP server, a network filesystem) is named
/// `place~N~TAG~PID~START~NONCE~T`: a waiter of N slots, of host tag TAG
/// ([`Host::tag`](crate::host::Host::tag), `-` without one), its pid and start time (so that
/// the name alone says whether a waiter of this host is provably dead), its acquisition's
/// nonce, and T, the second (its own clock, since the epoch) it last renamed the place. This
/// is the name but for its T.
pub fn stamped_stem(n: u32, acquisition: &str) -> String {
    format!(
        "place~{n}~{}~{}~{}~{acquisition}",
        crate::host::this().tag().unwrap_or_else(|| "-".into()),
        std::process::id(),
        crate::host::own_start(),
    )
}

/// A place's name from its stem ([`stamped_stem`]), stamped now.
pub fn stamped(stem: &str) -> String {
    format!("{stem}~{}", unix_now() / 1000)
}

/// What a name in such a room says: the place's number of slots and whether it lives;
/// `None`: not a place's name. Its age is judged by the looker's clock against T, with
/// `stale_after` of slack for the two clocks: a place lives while T is less than twice
/// `stale_after` away, either way (a clock far ahead does not keep a place for ever), and its
/// maker is not proven dead on this host. A clock set wrong by more than `stale_after` only
/// loses a waiter's number or keeps a dead one's a while longer: a room is a courtesy to
/// waiters, never mutual exclusion.
pub fn judge_stamped(name: &str, stale_after: Duration) -> Option<(u32, bool)> {
    let p = parse_stamped(name)?;
    let now = unix_now();
    let window = 2 * stale_after.as_millis().max(1000);
    let t = u128::from(p.t) * 1000;
    let heard = t > now.saturating_sub(window) && t < now + window;
    Some((p.n, heard && !maker_dead(p.maker)))
}

/// The milliseconds since the epoch on our clock.
fn unix_now() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// A place's maker: its host tag, pid and start time.
pub type Maker<'a> = (&'a str, i32, u64);

/// A place's fields as every room kept on a server names them: its number of slots (1 to
/// `MAX_SLOTS`) and its maker (`None` for the tag `-`: a host without one). `None`: they do
/// not parse, or the nonce is empty — not a place.
pub fn place_fields<'a>(
    n: &str,
    tag: &'a str,
    pid: &str,
    start: &str,
    nonce: &str,
) -> Option<(u32, Option<Maker<'a>>)> {
    let n = n
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=crate::settings::MAX_SLOTS).contains(n))?;
    let pid: i32 = pid.parse().ok()?;
    let start: u64 = start.parse().ok()?;
    if nonce.is_empty() || tag.is_empty() {
        return None;
    }
    Some((n, (tag != "-").then_some((tag, pid, start))))
}

/// Whether a place's maker is proven dead: on this host only (SPEC §6's proof of death).
pub fn maker_dead(maker: Option<Maker<'_>>) -> bool {
    maker.is_some_and(|(tag, pid, start)| crate::host::tagged_alive(tag, pid, start) == Some(false))
}

/// A place's name, read.
#[derive(Debug, PartialEq, Eq)]
struct Stamped<'a> {
    n: u32,
    /// Its maker (where it has a host tag).
    maker: Option<Maker<'a>>,
    /// When its maker last renamed it (its own clock).
    t: u64,
}

/// `place~N~TAG~PID~START~NONCE~T`; `None`: not a place's name.
fn parse_stamped(name: &str) -> Option<Stamped<'_>> {
    let ["place", n, tag, pid, start, nonce, t] = name.split('~').collect::<Vec<_>>()[..] else {
        return None;
    };
    let (n, maker) = place_fields(n, tag, pid, start, nonce)?;
    let t: u64 = t.parse().ok()?;
    Some(Stamped { n, maker, t })
}

#[cfg(test)]
mod tests {
    use super::{Stamped, judge_stamped, parse_stamped, stamped, stamped_stem};
    use std::time::Duration;

    #[test]
    fn only_a_place_s_name_is_a_place() {
        assert_eq!(
            parse_stamped("place~2~0123456789abcdef~42~7~n1~1700000000"),
            Some(Stamped {
                n: 2,
                maker: Some(("0123456789abcdef", 42, 7)),
                t: 1_700_000_000
            })
        );
        assert_eq!(
            parse_stamped("place~1024~-~42~7~n1~5"),
            Some(Stamped {
                n: 1024,
                maker: None,
                t: 5
            })
        );
        for bad in [
            "place~0~-~42~7~n1~5",
            "place~1025~-~42~7~n1~5",
            "owner~2~-~42~7~n1~5",
            "place~2~-~42~7~~5",
            "place~2~-~42~7~n1~x",
            "place~2~-~42~7~n1~5~more",
            "place~2~-~42~7~n1",
            "",
        ] {
            assert_eq!(parse_stamped(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_place_lives_while_renewed_within_twice_stale_after_and_its_maker_lives() {
        let stale = Duration::from_secs(5);
        let ours = stamped(&stamped_stem(3, "n1"));
        assert_eq!(judge_stamped(&ours, stale), Some((3, true)));
        let now = super::unix_now() / 1000;
        let at = |t: u128| format!("place~2~-~1~1~n1~{t}");
        assert_eq!(judge_stamped(&at(now - 9), stale), Some((2, true)));
        assert_eq!(judge_stamped(&at(now - 11), stale), Some((2, false)));
        assert_eq!(judge_stamped(&at(now + 9), stale), Some((2, true)));
        assert_eq!(judge_stamped(&at(now + 11), stale), Some((2, false)));
        // A maker of this host proven dead: pid 0 is never a locksmith's.
        let tag = crate::host::this().tag();
        if let Some(tag) = tag {
            let dead = format!("place~2~{tag}~0~1~n1~{now}");
            assert_eq!(judge_stamped(&dead, stale), Some((2, false)));
        }
    }
}
