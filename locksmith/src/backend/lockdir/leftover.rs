//! What a locker killed in the middle of a try leaves beside the lock — mkdir's unpublished
//! `.NAME.<nonce>….new/`, link's would-be lock file `.NAME.<nonce>….tmp` — and how a later
//! acquisition removes it: named with its maker (`<host tag>.<pid>.<start>`), so that a
//! listing alone proves the maker dead, and found for **every slot** of the lock in one listing
//! of the parent (`.NAME.slot-K.…`): a waiter of slot 1 killed in its try left its name where
//! only slot 1's holders looked, and only the one of them in 16 that looks — contenders start
//! at a random slot, so that took many times 16 acquisitions (CI: a GlusterFS mkdir test found
//! one at its end).

use std::ffi::{OsStr, OsString};
use std::ops::ControlFlow;
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};

use nix::fcntl::OFlag;

use super::LockDir;
use crate::backend::owner::{Parsed, Record};
use crate::backend::stale;
use crate::log::{debug, trace};

/// The most leftovers one look removes: names planted to look like dead makers' cost an
/// acquisition little.
pub const LEFTOVERS: usize = 8;

/// What a leftover's name says once `.NAME.` (with `slot-K.`) and its suffix are taken off:
/// its nonce, and its maker's host tag, pid and start time where named
/// ([`LockDir::unpublished_name`]).
#[derive(Debug, PartialEq, Eq)]
pub struct Unpublished {
    pub nonce: String,
    pub maker: Option<(String, i32, u64)>,
}

impl Unpublished {
    /// `<16 hex>` or `<16 hex>.<16 hex>.<pid>.<start>` (decimal, as written: no sign, no
    /// leading zero); anything else is no leftover of this lock's (another lock's name may
    /// share the prefix).
    pub fn parse(middle: &[u8]) -> Option<Unpublished> {
        let text = std::str::from_utf8(middle).ok()?;
        let (nonce, maker) = match text.split_once('.') {
            None => (text, None),
            Some((nonce, maker)) => (nonce, Some(parse_maker(maker)?)),
        };
        hex(nonce).then(|| Unpublished {
            nonce: nonce.into(),
            maker,
        })
    }
}

/// 16 hex digits (a nonce, a host tag).
pub fn hex(s: &str) -> bool {
    s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Who made an entry, as a leftover's name and mkdir's short owner entry say it:
/// `<host tag>.<pid>.<start>` ([`crate::host::Host::tag`]); `None` where this host cannot be
/// tagged.
pub fn maker_of(rec: &Record) -> Option<String> {
    let tag = crate::host::this().tag()?;
    Some(format!("{tag}.{}.{}", rec.pid, rec.start))
}

/// [`maker_of`]'s form read back: the tag, a pid above 0 and the start time (decimal, as
/// written: no sign, no leading zero); anything else is `None`.
pub fn parse_maker(text: &str) -> Option<(String, i32, u64)> {
    let number = |s: &str| s.parse::<u64>().ok().filter(|n| n.to_string() == s);
    match text.split('.').collect::<Vec<_>>()[..] {
        [tag, pid, start] if hex(tag) => {
            let pid = i32::try_from(number(pid)?).ok().filter(|p| *p > 0)?;
            Some((tag.into(), pid, number(start)?))
        }
        _ => None,
    }
}

/// `pid=… host=…` of a record, for messages.
pub fn describe_maker(rec: &Parsed) -> String {
    match rec {
        Parsed::V1(r) => format!("pid {} on {}", r.pid, r.host),
        Parsed::Foreign(_) => "a record of another format".into(),
    }
}

/// A name beside the lock that [`LockDir::leftovers`] found.
pub struct Leftover {
    pub name: OsString,
    /// Which of the suffixes asked for it ends with.
    pub suffix: &'static str,
    /// Between `.NAME.` (or `.NAME.slot-K.`) and the suffix.
    pub middle: Vec<u8>,
}

impl LockDir {
    /// The private name a would-be lock is made under:
    /// `.NAME.<nonce>.<host tag>.<pid>.<start><suffix>`, its maker's identity for proof of
    /// death in the name, so that a listing alone says whether its maker is dead (on a network
    /// filesystem nothing else of another mount's may be looked at); `.NAME.<nonce><suffix>`
    /// where that name would be longer than the filesystem takes (its `statfs` name length:
    /// 255 bytes on most, 143 on eCryptfs) or this host cannot be named.
    pub fn unpublished_name(&mut self, rec: &Record, suffix: &str) -> OsString {
        if let Some(maker) = maker_of(rec) {
            let named = self.beside(&format!(".{}.{maker}{suffix}", rec.nonce));
            if named.len() <= self.name_max() {
                return named;
            }
        }
        self.beside(&format!(".{}{suffix}", rec.nonce))
    }

    /// One listing of the parent: every `.NAME.<middle><suffix>` and `.NAME.slot-K.<middle><suffix>`
    /// for each of `suffixes`, where NAME is the lock's (a slot's: its lock's), in random
    /// order — names planted to stay (another user's in a sticky directory, something foreign
    /// inside) cannot keep the others from ever being looked at. Best effort: what was listed
    /// before a failure is returned, the failure said at debug level.
    pub fn leftovers(&mut self, suffixes: &[&'static str]) -> Vec<Leftover> {
        let mut prefix = b".".to_vec();
        prefix.extend_from_slice(self.lock_name().as_bytes());
        prefix.push(b'.');
        let mut found = Vec::new();
        let Ok(parent) = self.fd() else {
            return found;
        };
        let listed = crate::files::each_name(parent, ".", OFlag::empty(), |e| {
            let n = e.to_bytes();
            let Some(rest) = n.strip_prefix(prefix.as_slice()) else {
                return ControlFlow::Continue(());
            };
            let rest = without_slot(rest);
            for &suffix in suffixes {
                if let Some(middle) = rest.strip_suffix(suffix.as_bytes()) {
                    found.push(Leftover {
                        name: OsString::from_vec(n.to_vec()),
                        suffix,
                        middle: middle.to_vec(),
                    });
                    break;
                }
            }
            ControlFlow::Continue(())
        });
        if let Err(e) = listed {
            debug!("cannot list {} for leftovers: {e}", self.parent.display());
        }
        fastrand::shuffle(&mut found);
        found
    }

    /// Removes up to [`LEFTOVERS`] of `left` (not `ours`) whose maker is provably dead: judged
    /// by the maker its name carries (this host, its process gone or its pid reused), else —
    /// on a local filesystem only — by the record `record` reads in it. Another host's is
    /// left, and so is one whose maker may be alive: an unpublished name has no heartbeat to
    /// fall silent. `remove` removes one, once. Best effort: what fails is said at debug level
    /// and left.
    pub fn remove_dead_makers(
        &mut self,
        left: Vec<(OsString, Unpublished)>,
        ours: &str,
        record: impl Fn(BorrowedFd<'_>, &OsStr, &str) -> Option<Parsed>,
        remove: impl Fn(BorrowedFd<'_>, &OsString) -> nix::Result<()>,
    ) {
        let at = self.parent.clone();
        let Ok((parent, remote)) = self.fd_remote() else {
            return;
        };
        let left = left.into_iter().filter(|(_, u)| u.nonce != ours);
        for (name, u) in left.take(LEFTOVERS) {
            let shown = at.join(&name);
            let dead = match &u.maker {
                Some((tag, pid, start)) => crate::host::tagged_alive(tag, *pid, *start)
                    .is_some_and(|alive| !alive)
                    .then(|| format!("pid {pid} on this host")),
                None if remote => None,
                None => record(parent, &name, &u.nonce)
                    .filter(stale::provably_dead)
                    .map(|rec| describe_maker(&rec)),
            };
            match dead {
                Some(maker) => match remove(parent, &name) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => debug!(
                        "removed {}, left by a locker that died in its try ({maker})",
                        shown.display(),
                    ),
                    Err(e) => debug!("cannot remove {}: {e}", shown.display()),
                },
                None => trace!("left {}: its maker may be alive", shown.display()),
            }
        }
    }
}

/// `rest` without a leading `slot-K.` (K decimal digits).
fn without_slot(rest: &[u8]) -> &[u8] {
    let Some(after) = rest.strip_prefix(b"slot-") else {
        return rest;
    };
    let digits = after.iter().take_while(|b| b.is_ascii_digit()).count();
    match after[digits..].strip_prefix(b".") {
        Some(tail) if digits > 0 => tail,
        _ => rest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_s_name_is_its_lock_s() {
        assert_eq!(without_slot(b"slot-1.abc.new"), b"abc.new");
        assert_eq!(without_slot(b"slot-1024.abc.new"), b"abc.new");
        assert_eq!(without_slot(b"slot-.abc.new"), b"slot-.abc.new");
        assert_eq!(without_slot(b"slot-1abc.new"), b"slot-1abc.new");
        assert_eq!(without_slot(b"abc.new"), b"abc.new");
    }

    #[test]
    fn an_unpublished_name_says_its_nonce_and_maker_or_is_not_ours() {
        let nonce = "0123456789abcdef";
        let tag = "fedcba9876543210";
        let parse = |s: &str| Unpublished::parse(s.as_bytes());
        assert_eq!(
            parse(nonce),
            Some(Unpublished {
                nonce: nonce.into(),
                maker: None
            })
        );
        assert_eq!(
            parse(&format!("{nonce}.{tag}.4242.1189467")),
            Some(Unpublished {
                nonce: nonce.into(),
                maker: Some((tag.into(), 4242, 1189467))
            })
        );
        // Another lock's names (`NAME.x`, `NAME.<16 hex>`), odd numbers, a short nonce.
        for other in [
            format!("x.{nonce}"),
            format!("{nonce}.{nonce}"),
            format!("{nonce}.{tag}.04242.1"),
            format!("{nonce}.{tag}.0.1"),
            format!("{nonce}.{tag}.+5.1"),
            format!("{nonce}.{tag}.99999999999.1"),
            format!("{nonce}.{tag}.5"),
            format!("{nonce}.{tag}.5.1.2"),
            "0123".into(),
        ] {
            assert_eq!(parse(&other), None, "{other}");
        }
    }
}
