//! `backend = "redis"`: a key with an expiry on **one** Redis (or Valkey) server.
//!
//! **Layout** (`docs/LAYOUT.md`, "redis"), for the lock key `K`:
//! - `K`: the exclusive holder's owner record (`locksmith v=1 host=… pid=… nonce=… token=N`),
//!   set with `SET K record NX PX stale_after`; the record is unique per grant (its nonce).
//! - `K.readers`: a sorted set of shared holders, each member a reader's owner record, its
//!   score the moment (the server's clock, ms) that reader expires; the set itself expires
//!   with its last reader.
//! - `K.writer`: a writer waiting behind readers (its nonce, `PX` one heartbeat period,
//!   renewed every half period while it waits): no new reader enters while it is there, so
//!   writers are not starved; a waiting writer killed (`kill -9`) lets readers in again
//!   within one heartbeat period, not `stale_after`.
//! - `K.token`: the fencing-token counter (`INCR`), never deleted: every exclusive grant's
//!   token is greater than every earlier one's.
//! - `K.state`: `dirty N by=NONCE was=…` while writer N holds, `clean N` after its release;
//!   a writer that finds `dirty` (not its own acquisition's) says `prev=crashed`.
//! - `K.slots`, `K.slot-J`: the number of slots recorded, and slot J of a semaphore (SPEC §3b).
//! - `K.waiting`: the lock's waiting room, a sorted set of waiters' places `"N NONCE"`, each
//!   scored by its expiry ([`ACQUIRE`] says how it is kept and looked at).
//!
//! Every step is one Lua script (`EVAL`), so each is atomic on the server: taking the lock
//! (`SET NX PX`, `INCR`, the state) happens at once or not at all; a heartbeat (`PEXPIRE`)
//! and a release (`DEL`) first compare the value with the holder's own unique record, so a
//! holder that was paused past `stale_after` never extends or removes its successor's key.
//!
//! **Holding:** a heartbeat every min(`keepalive`, `stale_after`/3) renews the expiry to
//! `stale_after`; a heartbeat that finds the value gone or changed is `LOST` (74), one that
//! is not answered by the lease's deadline too. The server expires a silent holder's key
//! `stale_after` after its last heartbeat: it, not any waiter, decides on its own clock.
//!
//! **Waiting** polls with backoff (`poll` … `max_poll`); a holder on this host (same boot id
//! and pid namespace in its record) is watched by its pidfd, and once provably dead its key
//! is removed at once (compare-and-delete on its record).
//!
//! **Honest limits:** one server only. Redis acknowledges a write before it is on disk unless
//! `appendfsync always`, and a replica promoted by failover may not have it: either can grant
//! one lock twice. `verify` says so (78) and names the setting. No Redlock: a majority of
//! independent servers does not give safety without bounded clocks and pauses, while the
//! fencing token (`token=`), checked by the resource, does — see the README.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::address::Address;
use super::lock::{
    Attempt, Backend, Beats, Break, BreakOutcome, Grant, Holder, Named, Tried, WaitHint,
    request_by,
};
use super::owner::{Parsed, Record};
use super::wake::{Blocking, Wakeups};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::settings::{Fields, KeyDoc, Password};
use crate::watch::Watcher;

pub mod probe;
mod resp;

use resp::{Conn, Value};

/// Settings of the `redis` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    pub host: String,
    pub port: u16,
    /// The database (`SELECT`).
    pub db: u32,
    /// An ACL user (Redis 6+); `None`: the default user.
    pub user: Option<String>,
    pub password: Password,
    /// TLS (`rediss://`), the server's certificate verified.
    pub tls: bool,
    pub ca_file: Option<PathBuf>,
    /// The lock's key (the others are named after it).
    pub key: String,
    /// A slot of a lock with several (SPEC §3b): the lock's own key, whose token counter and
    /// number of slots every slot uses. `None`: the lock itself.
    pub slot_of: Option<String>,
}

impl RedisConfig {
    /// Slot `k` of the lock: the key `KEY.slot-K` (docs/LAYOUT.md).
    pub fn slot(&self, k: u32) -> RedisConfig {
        RedisConfig {
            key: format!("{}.slot-{k}", self.key),
            slot_of: Some(self.key.clone()),
            ..self.clone()
        }
    }

    /// The lock's fair queue: the key `KEY.line`, whose slots its waiters hold
    /// (docs/LAYOUT.md).
    pub fn queue(&self) -> RedisConfig {
        RedisConfig {
            key: format!("{}.line", self.key),
            slot_of: None,
            ..self.clone()
        }
    }
}

/// The keys [`config`] takes (besides the common and password keys).
pub static KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "host",
        example: "\"redis.example.com\"",
        doc: "the Redis or Valkey server (required)",
    },
    KeyDoc {
        key: "port",
        example: "6379",
        doc: "[default: 6379]",
    },
    KeyDoc {
        key: "db",
        example: "2",
        doc: "the database number (SELECT) [default: 0]",
    },
    KeyDoc {
        key: "user",
        example: "\"locker\"",
        doc: "an ACL user (Redis 6 and later; needs a password) [default: the default user]",
    },
    KeyDoc {
        key: "tls",
        example: "true",
        doc: "TLS, the server's certificate verified (rediss:// says it) [default: false]",
    },
    KeyDoc {
        key: "ca_file",
        example: "\"/etc/locksmith/redis-ca.pem\"",
        doc: "PEM file of the CA(s) that sign the server's certificate (needs tls)",
    },
    KeyDoc {
        key: "key",
        example: "\"locks:deploy\"",
        doc: "the lock's key; KEY.readers, KEY.writer, KEY.token and KEY.state live beside it [default: the profile's name]",
    },
];

/// The keys of `backend = "redis"`. `key` defaults to the profile's name (an address on the
/// command line has none: it must say `?key=NAME`). From an address the password defaults
/// to `$LOCKSMITH_PASSWORD`, else `$REDISCLI_AUTH` (redis-cli's convention).
pub fn config(f: &mut Fields) -> Result<RedisConfig> {
    let host = f.required("host", Fields::string)?;
    if host.is_empty() {
        return Err(f.error("`host` is empty"));
    }
    let port = f.port("port")?.unwrap_or(6379);
    let db = f.number("db", 0, i64::from(u32::MAX))?.unwrap_or(0) as u32;
    let user = f.string("user")?;
    let tls = f.bool("tls")?.unwrap_or(false);
    let ca_file = f.path("ca_file")?;
    if ca_file.is_some() && !tls {
        return Err(f.error("`ca_file` needs `tls = true` (or a rediss:// address)"));
    }
    let key = match (f.string("key")?, &f.origin().profile) {
        (Some(k), _) => k,
        (None, Some(profile)) => profile.clone(),
        (None, None) => {
            return Err(f.error(
                "a redis address needs `?key=NAME`: it has no profile name to default to",
            ));
        }
    };
    if key.is_empty() {
        return Err(f.error("`key` is empty"));
    }
    let mut password = f.password()?;
    if let Some(env) = &f.origin().address
        && password == Password::None
    {
        if env.locksmith_password {
            password = Password::Env("LOCKSMITH_PASSWORD".into());
        } else if env.rediscli_auth {
            password = Password::Env("REDISCLI_AUTH".into());
        }
    }
    if user.is_some() && password == Password::None {
        return Err(f.error(
            "an ACL user needs a password: password_env or password_file (an address: also \
             $LOCKSMITH_PASSWORD or $REDISCLI_AUTH)",
        ));
    }
    Ok(RedisConfig {
        host,
        port,
        db,
        user,
        password,
        tls,
        ca_file,
        key,
        slot_of: None,
    })
}

/// `redis://[USER@]HOST[:PORT][/DB]?key=NAME` (`rediss://`: TLS).
pub fn address(a: &Address) -> std::result::Result<toml::Table, String> {
    let mut t = super::address::one_host_keys(a, "a redis")?;
    let db = a.path.strip_prefix('/').unwrap_or(&a.path);
    if !db.is_empty() {
        let n: u32 = db
            .parse()
            .map_err(|_| format!("the path of a redis address is its DB number, not {db:?}"))?;
        t.insert("db".into(), i64::from(n).into());
    }
    if a.scheme == "rediss" {
        t.insert("tls".into(), true.into());
    }
    Ok(t)
}

/// Takes the lock: exclusive (`w`) or shared (`r`), in one step. KEYS: the lock, its readers,
/// its token counter, its state, its waiting writer, the lock's number of slots (`"N
/// VERSION"`, SPEC §3b), the lock's waiting room. ARGV: mode, owner record, stale_after in ms,
/// our nonce, our number of slots, the record we were told to take over (empty: only our own
/// number), the waiting writer's mark's expiry in ms (one heartbeat period:
/// [`Redis::try_within`] renews it), the room (`''`: none, a fair line's place; `look`: look
/// only — `--wait 0`, a first try; `join`: look, and take a place if busy), this
/// acquisition's nonce.
/// `{"took", value, prev state, token}` (a reader's adds the record of the number of slots),
/// `{"busy", "marked" or "", "joined"?}` (`marked`: a writer behind readers, its mark set;
/// `joined`: our place in the room taken or renewed), `{"ask", record}` (another number
/// recorded: nothing taken), `{"again"}` (the record changed since) or `{"waited", M}` (a
/// waiter of M slots is in the room: nothing taken).
///
/// **The waiting room** (SPEC §3b: the lock records N while anyone holds *or waits*;
/// `waiting.rs` says why, docs/LAYOUT.md how): the sorted set `LOCK.waiting` of the lock
/// (whatever the slot), member `"N NONCE"` (a waiter of N slots, this acquisition), score the
/// moment it expires (the server's clock, `stale_after` from its last busy try: a waiter
/// tries within every heartbeat period, [`Redis::try_within`]). A busy try of a waiter takes
/// or renews its place in the same step — once a whole busy try judged its number (its
/// slots' `prepare_wait`: the try made at once after the first busy one), so that a
/// contender refused at a later slot never stood in the room — and its take gives it back; a
/// waiter that gives up deletes it ([`GIVE_BACK`]), a killed one's expires. Before a token is
/// issued, and before a reader enters, a live place of another number refuses the take
/// (`waited`) — unless this acquisition waits there itself with the number recorded: no
/// newcomer (`room::Room::looks`'s rule, the same here in one atomic step).
///
/// **Ours already** (issue 27): a take of this acquisition whose answer was lost may have
/// landed. The owner record is unique per acquisition (its nonce), so a key whose value is our
/// record plus ` token=N`, or a live member of the readers that is our record, is ours: taken
/// again as it is — the same token, its expiry renewed from now (the holder's lease counts
/// from this try), `prev` as the landed take found it (the state keeps it: `dirty N
/// by=NONCE was=crashed|clean`). Nothing is taken twice, no token is drawn twice. A landed
/// take of ours whose key expired before the next try is known by the state's `by=` (our
/// nonce): that try takes the lock anew (a second token) with `prev` as the landed take found
/// it, not `prev=crashed` for a crash that was only our lost answer.
const ACQUIRE: &str = r"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local px = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local place = ARGV[5] .. ' ' .. ARGV[9]
local function took(r)
  if ARGV[8] ~= '' then redis.call('ZREM', KEYS[7], place) end
  return r
end
local function busy(r)
  if ARGV[8] == 'join' then
    redis.call('ZADD', KEYS[7], now + px, place)
    if redis.call('PTTL', KEYS[7]) < px then redis.call('PEXPIRE', KEYS[7], px) end
    table.insert(r, 'joined')
  end
  return r
end
local function waited(n)
  if ARGV[8] == '' then return nil end
  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)
  if n == ARGV[5] and redis.call('ZSCORE', KEYS[7], place) then return nil end
  for _, m in ipairs(redis.call('ZRANGE', KEYS[7], 0, -1)) do
    local k = string.match(m, '^(%d+) ')
    if k and k ~= ARGV[5] then return k end
  end
  return nil
end
local mine = ARGV[2] .. ' token='
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == 'w' and cur and string.sub(cur, 1, #mine) == mine then
  redis.call('PEXPIRE', KEYS[1], px)
  local st = redis.call('GET', KEYS[4]) or ''
  local prev = string.match(st, ' was=crashed$') and 'dirty' or ''
  return took({'took', cur, prev, string.sub(cur, #mine + 1)})
end
if ARGV[1] == 'r' and redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  redis.call('ZADD', KEYS[2], 'XX', now + px, ARGV[2])
  if redis.call('PTTL', KEYS[2]) < px then redis.call('PEXPIRE', KEYS[2], px) end
  return took({'took', ARGV[2], '', redis.call('GET', KEYS[3]) or '', redis.call('GET', KEYS[6]) or ''})
end
if cur then return busy({'busy', ''}) end
if ARGV[1] == 'w' then
  if redis.call('ZCARD', KEYS[2]) > 0 then
    local mark = redis.call('GET', KEYS[5])
    if (not mark) or mark == ARGV[4] then
      redis.call('SET', KEYS[5], ARGV[4], 'PX', tonumber(ARGV[7]))
      return busy({'busy', 'marked'})
    end
    return busy({'busy', ''})
  end
  local rec = redis.call('GET', KEYS[6]) or '1 0'
  local n, ver = string.match(rec, '^(%d+) (%d+)$')
  if ARGV[6] == '' then
    if n ~= ARGV[5] then return {'ask', rec} end
  elseif rec ~= ARGV[6] then
    return {'again'}
  end
  local w = waited(n)
  if w then return {'waited', w} end
  local tok = redis.call('INCR', KEYS[3])
  local v = mine .. tok
  if not redis.call('SET', KEYS[1], v, 'NX', 'PX', px) then return busy({'busy', ''}) end
  redis.call('SET', KEYS[6], ARGV[5] .. ' ' .. (tonumber(ver or '0') + 1))
  local prev = redis.call('GET', KEYS[4]) or ''
  local was = (prev ~= '' and string.sub(prev, 1, 6) ~= 'clean ') and 'crashed' or 'clean'
  if string.find(prev, ' by=' .. ARGV[4] .. ' ', 1, true) then
    was = string.match(prev, ' was=crashed$') and 'crashed' or 'clean'
    if was == 'clean' then prev = '' end
  end
  redis.call('SET', KEYS[4], 'dirty ' .. tok .. ' by=' .. ARGV[4] .. ' was=' .. was)
  if redis.call('GET', KEYS[5]) == ARGV[4] then redis.call('DEL', KEYS[5]) end
  return took({'took', v, prev, tostring(tok)})
end
if redis.call('EXISTS', KEYS[5]) == 1 then return busy({'busy', ''}) end
local w = waited(string.match(redis.call('GET', KEYS[6]) or '1 0', '^(%d+) '))
if w then return {'waited', w} end
redis.call('ZADD', KEYS[2], now + px, ARGV[2])
if redis.call('PTTL', KEYS[2]) < px then redis.call('PEXPIRE', KEYS[2], px) end
return took({'took', ARGV[2], '', redis.call('GET', KEYS[3]) or '', redis.call('GET', KEYS[6]) or ''})
";

/// Renews our expiry if the value is still ours: 1, else 0. ARGV: mode, our value, ms.
const HEARTBEAT: &str = r"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local px = tonumber(ARGV[3])
if ARGV[1] == 'w' then
  if redis.call('GET', KEYS[1]) == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], px)
    return 1
  end
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local s = redis.call('ZSCORE', KEYS[2], ARGV[2])
if (not s) or tonumber(s) <= now then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 0
end
redis.call('ZADD', KEYS[2], 'XX', now + px, ARGV[2])
if redis.call('PTTL', KEYS[2]) < px then redis.call('PEXPIRE', KEYS[2], px) end
return 1
";

/// Frees the lock if the value is still ours: 1, else 0, and tells the waiters (a user whose
/// ACL forbids the channel frees it all the same: its waiters poll). ARGV: mode, our value,
/// our token.
const RELEASE: &str = r"
if ARGV[1] == 'w' then
  if redis.call('GET', KEYS[1]) == ARGV[2] then
    redis.call('DEL', KEYS[1])
    redis.call('SET', KEYS[4], 'clean ' .. ARGV[3])
    redis.pcall('PUBLISH', KEYS[1] .. '.released', '1')
    return 1
  end
  return 0
end
local n = redis.call('ZREM', KEYS[2], ARGV[2])
if n == 1 then redis.pcall('PUBLISH', KEYS[1] .. '.released', '1') end
return n
";

/// Removes one holder (a dead one, or `break`), only if it still holds: 1, else 0.
/// ARGV: its value (the key's value or a reader's member).
const REMOVE: &str = r"
local n = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  n = 1
else
  n = redis.call('ZREM', KEYS[2], ARGV[1])
end
if n == 1 then redis.pcall('PUBLISH', KEYS[1] .. '.released', '1') end
return n
";

/// Whether the lock looks free to us now: `EXISTS` of what blocks a writer (the key, any
/// reader) or a reader (the key, a waiting writer). ARGV: mode.
const LOOKS_FREE: &str = r"
if ARGV[1] == 'w' then
  return redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 and 1 or 0
end
return redis.call('EXISTS', KEYS[1], KEYS[5]) == 0 and 1 or 0
";

/// A waiter that gives up takes away what it may have left (issue 27): its waiting writer's
/// mark, and a take of its own whose answer was lost (the key whose value is our record plus
/// ` token=N`, or our member of the readers) — given back as the landed take found the state:
/// `clean N`, unless that take found a crash (`was=crashed`: the state stays `dirty`, the next
/// writer says `prev=crashed`) — and its place in the waiting room. ARGV: our owner record,
/// our nonce, our place (`"N NONCE"`). 1 if a take was given back.
const GIVE_BACK: &str = r"
local n = 0
redis.call('ZREM', KEYS[7], ARGV[3])
local mine = ARGV[1] .. ' token='
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #mine) == mine then
  redis.call('DEL', KEYS[1])
  local st = redis.call('GET', KEYS[4]) or ''
  if not string.match(st, ' was=crashed$') then
    redis.call('SET', KEYS[4], 'clean ' .. string.sub(cur, #mine + 1))
  end
  n = 1
elseif redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  n = 1
end
if redis.call('GET', KEYS[5]) == ARGV[2] then redis.call('DEL', KEYS[5]) end
if n == 1 then redis.pcall('PUBLISH', KEYS[1] .. '.released', '1') end
return n
";

/// The lock's number of slots as recorded (`"N VERSION"`, `''` before any), read only.
const RECORDED: &str = "return redis.call('GET', KEYS[6]) or ''";

/// The number of slots a record of [`RECORDED`] says: 1 before any.
fn recorded(rec: &str) -> u32 {
    rec.split(' ')
        .next()
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1)
}

/// The holders, read only: `{writer's value or '', token counter or '', readers...}`.
const HOLDERS: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now, '+inf')
table.insert(r, 1, redis.call('GET', KEYS[1]) or '')
table.insert(r, 2, redis.call('GET', KEYS[3]) or '')
return r
";

/// Which slots are present, read only: `KEYS` are each slot's key and its readers' key, in
/// slot order; the answer is the (0-based) slots with either.
const PRESENT: &str = r"
local r = {}
for i = 1, #KEYS, 2 do
  if redis.call('EXISTS', KEYS[i], KEYS[i + 1]) > 0 then table.insert(r, (i - 1) / 2) end
end
return r
";

/// Who holds each present slot, read only: `KEYS` are the lock's token counter, then each
/// slot's key and its readers' key, in slot order; the answer is the counter (or '') then, for
/// each slot with a writer or a live reader, `{slot (0-based), writer's value or '',
/// readers...}` — [`HOLDERS`] of every slot at one moment.
const HOLDERS_OF: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('GET', KEYS[1]) or ''}
for i = 2, #KEYS, 2 do
  local w = redis.call('GET', KEYS[i]) or ''
  local r = redis.call('ZRANGEBYSCORE', KEYS[i + 1], '(' .. now, '+inf')
  if w ~= '' or #r > 0 then
    table.insert(r, 1, w)
    table.insert(r, 1, (i - 2) / 2)
    table.insert(out, r)
  end
end
return out
";

pub struct Redis {
    cfg: RedisConfig,
    mode: Mode,
    /// `stale_after` in ms: every expiry the backend sets.
    px: u64,
    heartbeat: Duration,
    /// Bound for one request that is not a heartbeat.
    timeout: Duration,
    /// While waiting: the wait's deadline, which bounds each request of a try too
    /// ([`Backend::answer_by`]).
    by: Option<Instant>,
    conn: Option<Conn>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// This acquisition's owner record (without its token) and nonce.
    record: String,
    nonce: String,
    /// What we hold: the key's value (exclusive) or our member of the readers' set.
    value: Option<String>,
    token: Option<u64>,
    /// Whether we may have left a waiting writer's mark.
    marked: bool,
    /// The mark's expiry in ms: one heartbeat period (at most `stale_after`). A writer that
    /// waits behind readers tries every half period, which renews it ([`Redis::try_within`]).
    mark_px: u64,
    /// Whether our last try set our mark (we wait behind readers): it is to be renewed.
    marking: bool,
    /// Whether a take of ours got no answer (it may have landed): the next try finds it by our
    /// record ([`ACQUIRE`]), and dropping the backend gives it back ([`GIVE_BACK`]).
    unsure: bool,
    wake: Wakeups,
    /// While waiting: a thread blocked on a connection subscribed to `KEY.released`, which
    /// every release publishes to (an expiry publishes nothing: the backoff timer finds it).
    waiter: Option<Waiter>,
    /// That connection between two waits.
    subscribed: Option<Conn>,
    /// The lock's number of slots (SPEC §3b), recorded with each exclusive grant.
    slots: u32,
    /// What to ask before granting over another recorded number of slots; `None` for a fair
    /// line's place, which keeps no number and no waiting room.
    agree: Option<super::lock::Agree>,
    /// The lock as messages name it.
    lock: String,
    /// This acquisition's nonce: its place in the waiting room ([`ACQUIRE`]).
    acquisition: String,
    /// Whether a busy try takes a place in the waiting room: not under `--wait 0`, and only
    /// once a whole busy try judged our number ([`Backend::prepare_wait`]).
    waits: bool,
    judged: bool,
    /// Whether our place may be in the waiting room (a `join` try was sent): renewed by
    /// trying within every heartbeat period, given back if we stop waiting.
    joined: bool,
    /// Whether `-v` was told we wait in the room.
    said_joined: bool,
}

/// A thread reading the next message of the subscribed connection (`None` back: it broke),
/// and the socket, to end it.
struct Waiter {
    call: Blocking<Option<Conn>>,
    sock: std::net::TcpStream,
}

/// What [`Redis::holders`] read: each holder's value and what it says.
type Seen = Vec<(String, Holder)>;

impl Redis {
    pub fn new(cfg: RedisConfig, lock: &Named) -> Redis {
        let mut rec = Record::ours(&lock.name);
        rec.token = None;
        Redis {
            slots: lock.common.slots,
            agree: None,
            lock: lock.name.clone(),
            acquisition: lock.acquisition.clone(),
            waits: !matches!(lock.common.wait, crate::settings::Wait::For(d) if d.is_zero()),
            joined: false,
            judged: false,
            said_joined: false,
            cfg,
            mode: lock.common.mode(),
            px: lock.common.stale_after.as_millis().max(1) as u64,
            heartbeat: lock.common.heartbeat(),
            timeout: lock
                .common
                .stale_after
                .clamp(Duration::from_secs(2), Duration::from_secs(10)),
            by: None,
            conn: None,
            tls: None,
            nonce: rec.nonce.clone(),
            record: rec.render(),
            value: None,
            token: None,
            marked: false,
            marking: false,
            mark_px: (lock.common.heartbeat().as_millis().max(1) as u64)
                .min(lock.common.stale_after.as_millis().max(1) as u64),
            unsure: false,
            wake: Wakeups::default(),
            waiter: None,
            subscribed: None,
        }
    }

    fn server(&self) -> String {
        let s = if self.cfg.tls { "rediss" } else { "redis" };
        format!("Redis at {s}://{}:{}/{}", self.cfg.host, self.cfg.port, self.cfg.db)
    }

    fn keys(&self) -> [String; 7] {
        let k = &self.cfg.key;
        // A slot's counter and number of slots are the lock's (SPEC §3b).
        let lock = self.cfg.slot_of.as_ref().unwrap_or(k);
        [
            k.clone(),
            format!("{k}.readers"),
            format!("{lock}.token"),
            format!("{k}.state"),
            format!("{k}.writer"),
            format!("{lock}.slots"),
            format!("{lock}.waiting"),
        ]
    }

    fn mode_arg(&self) -> &'static str {
        match self.mode {
            Mode::Exclusive => "w",
            Mode::Shared => "r",
        }
    }

    /// A failure to reach the server (or a broken connection): 69, or 74 while holding.
    fn unreachable(&mut self, what: &str, e: &std::io::Error) -> Error {
        self.conn = None;
        let kind = if self.value.is_some() {
            Kind::Lost
        } else {
            Kind::Unavailable
        };
        let text = e.to_string();
        let hint = if self.cfg.tls && (text.contains("certificate") || text.contains("TLS")) {
            crate::tls::hint(self.cfg.ca_file.as_deref())
        } else {
            ""
        };
        Error::new(kind, format!("{what} ({}): {text}{hint}", self.server()))
    }

    /// An error reply, of the kind its code says.
    fn refused(&self, what: &str, reply: &str) -> Error {
        let code = reply.split_whitespace().next().unwrap_or("");
        if code == "NOAUTH" || reply.contains("unauthenticated") {
            let asked = if self.cfg.password == Password::None {
                ": the server asks for a password and none was given (password_env or \
                 password_file; an address: also $LOCKSMITH_PASSWORD or $REDISCLI_AUTH)"
            } else {
                ""
            };
            return err!(Denied, "{what} ({}): {reply}{asked}", self.server());
        }
        let kind = match code {
            "WRONGPASS" | "NOAUTH" | "NOPERM" => Kind::Denied,
            _ if reply.contains("AUTH") || reply.contains("password") => Kind::Denied,
            "READONLY" | "MOVED" | "ASK" | "CROSSSLOT" | "CLUSTERDOWN" => Kind::Config,
            _ if reply.contains("DB index") => Kind::Config,
            "LOADING" | "BUSY" | "MASTERDOWN" => Kind::Unavailable,
            _ => Kind::Io,
        };
        let why = match code {
            "READONLY" => "; it is a replica: a lock needs the primary",
            "MOVED" | "ASK" | "CROSSSLOT" | "CLUSTERDOWN" => {
                "; a Redis Cluster is not supported: the lock needs one server"
            }
            _ => "",
        };
        Error::new(kind, format!("{what} ({}): {reply}{why}", self.server()))
    }

    fn tls_config(&mut self) -> Result<Option<Arc<rustls::ClientConfig>>> {
        if !self.cfg.tls {
            return Ok(None);
        }
        if self.tls.is_none() {
            let c = crate::tls::client_config(self.cfg.ca_file.as_deref(), true)?;
            self.tls = Some(Arc::new(c));
        }
        Ok(self.tls.clone())
    }

    /// The connection, made (AUTH, SELECT) if there is none.
    fn conn(&mut self) -> Result<&mut Conn> {
        self.conn_by(Instant::now() + self.timeout)
    }

    /// [`Redis::conn`], a new connection made by `deadline`.
    fn conn_by(&mut self, deadline: Instant) -> Result<&mut Conn> {
        if self.conn.is_none() {
            let c = self.connect(deadline)?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// A new connection by `deadline`: TLS, AUTH, SELECT.
    fn connect(&mut self, deadline: Instant) -> Result<Conn> {
        {
            let tls = self.tls_config()?;
            let limit = deadline.saturating_duration_since(Instant::now());
            let mut c = match Conn::connect(&self.cfg.host, self.cfg.port, limit, tls) {
                Ok(c) => c,
                Err(e) => {
                    return Err(self.unreachable("cannot connect", &e));
                }
            };
            if self.cfg.password != Password::None {
                let user = self.cfg.user.clone().unwrap_or_else(|| "default".into());
                let pw = self.cfg.password.resolve(&user)?;
                let r = match &self.cfg.user {
                    Some(u) => c.call(&[b"AUTH", u.as_bytes(), pw.as_bytes()], deadline),
                    None => c.call(&[b"AUTH", pw.as_bytes()], deadline),
                };
                match r {
                    Ok(Value::Error(e)) => {
                        return Err(self.refused("authentication failed", &e));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(self.unreachable("cannot authenticate", &e)),
                }
            }
            if self.cfg.db != 0 {
                let db = self.cfg.db.to_string();
                match c.call(&[b"SELECT", db.as_bytes()], deadline) {
                    Ok(Value::Error(e)) => return Err(self.refused("cannot select the database", &e)),
                    Ok(_) => {}
                    Err(e) => return Err(self.unreachable("cannot select the database", &e)),
                }
            }
            Ok(c)
        }
    }

    /// Starts (or restarts) the thread that wakes us on a release; `Err` only says why there
    /// is none (we poll anyway).
    fn start_waiter(&mut self) -> Result<()> {
        let mut conn = match self.subscribed.take() {
            Some(c) => c,
            None => {
                // Bounded like a try's requests: a server that stops answering here must
                // not hold the wait past its deadline.
                let mut c = self.connect(request_by(self.timeout, self.by))?;
                let channel = format!("{}.released", self.cfg.key);
                let deadline = request_by(self.timeout, self.by);
                let reply = c.call(&[b"SUBSCRIBE", channel.as_bytes()], deadline);
                match reply.map_err(|e| Error::io("SUBSCRIBE", e))? {
                    Value::Array(_) => {}
                    other => return Err(err!(Io, "SUBSCRIBE answered {other:?}")),
                }
                c
            }
        };
        // A release between our last try and the subscription published to nobody: look.
        let mode = self.mode_arg();
        let free_now = self.run("cannot read the lock", LOOKS_FREE, &[mode])?.int() == Some(1);
        let sock = conn.socket().map_err(|e| Error::io("socket", e))?;
        let call = Blocking::spawn("redis-wait", Some(256 * 1024), move || {
            if free_now || conn.next().is_ok() {
                Some(conn)
            } else {
                None
            }
        })
        .map_err(|e| Error::io("cannot start the Redis waiter thread", e))?;
        self.waiter = Some(Waiter { call, sock });
        Ok(())
    }

    /// Ends the waiter thread and the subscription.
    fn stop_waiting(&mut self) {
        if let Some(w) = self.waiter.take() {
            let _ = w.sock.shutdown(std::net::Shutdown::Both);
        }
        self.subscribed = None;
    }

    /// Runs `script` on the lock's keys with `args`, by `deadline`.
    fn eval(&mut self, what: &str, script: &str, args: &[&str], deadline: Instant) -> Result<Value> {
        let keys = self.keys();
        let mut argv: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), b"7"];
        argv.extend(keys.iter().map(|k| k.as_bytes()));
        argv.extend(args.iter().map(|a| a.as_bytes()));
        let r = self.conn_by(deadline)?.call(&argv, deadline);
        match r {
            Ok(Value::Error(e)) => Err(self.refused(what, &e)),
            Ok(v) => Ok(v),
            Err(e) => Err(self.unreachable(what, &e)),
        }
    }

    /// A read-only `script` over the first `n` slots, in one request: its keys are `first`
    /// (if any), then each slot's key and its readers' key, in slot order.
    fn on_slots(&mut self, script: &str, first: Option<String>, n: u32) -> Result<Value> {
        let names: Vec<String> = first
            .into_iter()
            .chain((0..n).flat_map(|k| {
                let slot = self.cfg.slot(k).key;
                let readers = format!("{slot}.readers");
                [slot, readers]
            }))
            .collect();
        let count = names.len().to_string();
        let mut argv: Vec<&[u8]> = vec![b"EVAL", script.as_bytes(), count.as_bytes()];
        argv.extend(names.iter().map(|k| k.as_bytes()));
        let what = "cannot read the lock's slots";
        let deadline = request_by(self.timeout, self.by);
        match self.conn_by(deadline)?.call(&argv, deadline) {
            Ok(Value::Error(e)) => Err(self.refused(what, &e)),
            Ok(v) => Ok(v),
            Err(e) => Err(self.unreachable(what, &e)),
        }
    }

    /// One request, bounded by the usual timeout (and, while waiting, by the wait's deadline).
    fn run(&mut self, what: &str, script: &str, args: &[&str]) -> Result<Value> {
        let deadline = request_by(self.timeout, self.by);
        self.eval(what, script, args, deadline)
    }

    /// The lock's number of slots kept changing under us (SPEC §3b).
    fn fail_slots(&self) -> Error {
        err!(
            Unavailable,
            "cannot take lock {} ({}): its number of slots keeps changing",
            self.cfg.key,
            self.server()
        )
    }

    /// The holders now: the writer, or the readers whose expiry has not passed.
    fn holders(&mut self) -> Result<Seen> {
        let v = self.run("cannot read the lock", HOLDERS, &[])?;
        let items = v.items();
        let text = |i: usize| items.get(i).and_then(Value::text).unwrap_or_default();
        let epoch = text(1).parse::<u64>().ok();
        let mut seen = Vec::new();
        let writer = text(0);
        if !writer.is_empty() {
            seen.push((writer.clone(), holder(&writer, Mode::Exclusive, None)));
        }
        for m in items.iter().skip(2).filter_map(Value::text) {
            let h = holder(&m, Mode::Shared, epoch);
            seen.push((m, h));
        }
        Ok(seen)
    }

    /// Removes one holder if it still holds (compare-and-delete on its value).
    fn remove(&mut self, value: &str) -> Result<bool> {
        let v = self.run("cannot remove the holder's key", REMOVE, &[value])?;
        Ok(v.int() == Some(1))
    }

    /// One try: the lock taken, or who holds it (dead holders on this host removed first).
    fn attempt(&mut self) -> Result<Tried> {
        if self.waiter.as_ref().is_some_and(|w| w.call.returned()) {
            let w = self.waiter.take().expect("checked above");
            self.subscribed = w.call.join().flatten();
        }
        let px = self.px.to_string();
        let mark_px = self.mark_px.to_string();
        let n = self.slots.max(1).to_string();
        let room = match (&self.agree, self.waits && self.judged) {
            (None, _) => "",
            (Some(_), false) => "look",
            (Some(_), true) => "join",
        };
        let acquisition = self.acquisition.clone();
        let mut seen = Vec::new();
        // The record of another number of slots we asked the lock about and may take over.
        let mut over = String::new();
        let (mut tries, mut asked) = (0, 0);
        while tries < 3 {
            asked += 1;
            if asked > 50 {
                return Err(self.fail_slots());
            }
            let (mode, record, nonce) = (self.mode_arg(), self.record.clone(), self.nonce.clone());
            let args = [
                mode,
                record.as_str(),
                px.as_str(),
                nonce.as_str(),
                n.as_str(),
                over.as_str(),
                mark_px.as_str(),
                room,
                acquisition.as_str(),
            ];
            // Unanswered, it may still land: remembered until an answer settles it. Not
            // sent at all (no connection), it did not: a take still unsure from an earlier
            // try stays so — as it does when this one is refused (an error reply: this
            // take did not land, the earlier one may have, and dropping gives it back).
            self.conn_by(request_by(self.timeout, self.by))?;
            // A `join` try may leave a place, answered or not: given back if we stop.
            self.joined |= room == "join";
            let earlier = std::mem::replace(&mut self.unsure, true);
            let v = self
                .run("cannot take the lock", ACQUIRE, &args)
                .inspect_err(|e| self.unsure = earlier || e.kind() == Kind::Unavailable)?;
            self.unsure = false;
            let items = v.items();
            let text = |i: usize| items.get(i).and_then(Value::text).unwrap_or_default();
            match text(0).as_str() {
                "ask" => {
                    let rec = text(1);
                    let before = rec
                        .split(' ')
                        .next()
                        .and_then(|m| m.parse::<u32>().ok())
                        .unwrap_or(0);
                    if let Some(agree) = &self.agree {
                        agree(before)?;
                    }
                    over = rec;
                    continue;
                }
                // The record moved on since we asked: ask again.
                "again" => {
                    over.clear();
                    continue;
                }
                "waited" => {
                    let m = text(1).parse::<u32>().unwrap_or(0);
                    return Err(super::slots::waited_refusal(&self.lock, m, self.slots));
                }
                _ => {}
            }
            tries += 1;
            if text(0) == "took" {
                self.by = None;
                self.stop_waiting();
                self.wake.forget_holder();
                self.marked = false;
                self.marking = false;
                self.joined = false;
                self.value = Some(text(1));
                let token = text(3).parse::<u64>().ok();
                if self.mode == Mode::Exclusive {
                    self.token = token;
                }
                let shared = self.mode == Mode::Shared;
                return Ok(Tried::Took(Grant {
                    token,
                    prev_crashed: text(2).starts_with("dirty") || self.prev_unreadable(&text(2)),
                    recorded_slots: shared.then(|| recorded(&text(4))),
                    ..Grant::default()
                }));
            }
            if self.mode == Mode::Exclusive {
                self.marked = true;
            }
            self.marking = text(1) == "marked";
            if text(2) == "joined" && !self.said_joined {
                self.said_joined = true;
                if self.first_slot() {
                    debug!("lock {}: waiting in its waiting room", self.lock);
                }
            }
            seen = self.holders()?;
            let dead: Vec<(String, Holder)> = seen
                .iter()
                .filter(|(_, h)| h.alive == Some(false))
                .cloned()
                .collect();
            if dead.is_empty() {
                break;
            }
            for (value, h) in dead {
                if self.remove(&value)? {
                    info!("removed the lock of {h}: its locksmith is dead");
                }
            }
        }
        // A holder on this host: its death (pidfd) wakes us.
        let watched = seen.iter().find_map(|(v, _)| match Record::parse(v) {
            Parsed::V1(r) if r.same_host() => Some(r),
            _ => None,
        });
        match watched {
            Some(r) => {
                if !self.wake.holder_alive(r.pid, r.start) {
                    self.wake.forget_holder();
                }
            }
            None => self.wake.forget_holder(),
        }
        Ok(Tried::Busy(seen.into_iter().map(|(_, h)| h).collect()))
    }

    /// Whether this is the lock itself or its first slot: one of an acquisition's slots says
    /// what they all do.
    fn first_slot(&self) -> bool {
        match &self.cfg.slot_of {
            None => true,
            Some(lock) => self.cfg.key == format!("{lock}.slot-0"),
        }
    }

    /// Our place in the waiting room (`"N NONCE"`, [`ACQUIRE`]).
    fn place(&self) -> String {
        format!("{} {}", self.slots.max(1), self.acquisition)
    }

    /// A state value locksmith does not write counts as a crash.
    fn prev_unreadable(&self, prev: &str) -> bool {
        !prev.is_empty() && !prev.starts_with("clean ")
    }
}

/// What a holder's value says (a record of another version: foreign, held).
fn holder(value: &str, mode: Mode, epoch: Option<u64>) -> Holder {
    let parsed = Record::parse(value);
    let mut h = parsed.holder();
    h.mode = Some(mode);
    if mode == Mode::Shared {
        h.token = epoch;
    }
    // The key exists, so its holder heartbeated within stale_after; a same-host pid proven
    // dead holds until a waiter (or `break`) removes its key.
    let dead = matches!(&parsed, Parsed::V1(r) if r.alive() == Some(false));
    h.alive = Some(!dead);
    h
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop_waiting();
        // A waiter that gives up takes away its waiting writer's mark (else readers wait for
        // it to expire) and a take of its own whose answer was lost (else the lock stays
        // taken until it expires).
        if self.value.is_none() && (self.marked || self.unsure || self.joined) {
            let (record, nonce, place) = (self.record.clone(), self.nonce.clone(), self.place());
            let deadline = Instant::now() + Duration::from_secs(1);
            let args = [record.as_str(), nonce.as_str(), place.as_str()];
            match self.eval("cannot give back what the wait left", GIVE_BACK, &args, deadline) {
                Ok(v) if v.int() == Some(1) => info!("gave back a take of ours whose answer was lost"),
                Ok(_) => {}
                Err(e) if self.unsure => info!(
                    "a take of lock `{}` got no answer and may have landed; if it did, it stays until it expires ({e})",
                    self.cfg.key
                ),
                Err(e) => debug!("{e}"),
            }
        }
    }
}

impl Backend for Redis {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// A try whose server did not answer comes back with the backend (its record, unique to
    /// this acquisition): the next try finds a take of ours that landed ([`ACQUIRE`]).
    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let tried = self.attempt();
        Tried::or_unanswered(tried, self)
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.by = by;
    }

    /// A whole busy try judged our number: the next tries take a place in the waiting room.
    fn prepare_wait(&mut self) -> Result<WaitHint> {
        self.judged = true;
        if self.waiter.is_none()
            && let Err(e) = self.start_waiter()
        {
            debug!("no wake-up on release, polling only: {e}");
        }
        // Expiries publish nothing: the backoff timer stays on.
        Ok(WaitHint { poll: true, catches_release: false })
    }

    /// A writer waiting behind readers renews its mark (`K.writer`, which expires one
    /// heartbeat period after it was last set) by trying every half period; a waiter renews
    /// its place in the waiting room (which expires `stale_after` after its last busy try)
    /// by trying every heartbeat period.
    fn try_within(&self) -> Option<Duration> {
        let mark = self
            .marking
            .then(|| Duration::from_millis(self.mark_px / 2).max(Duration::from_millis(1)));
        let place = self.joined.then_some(self.heartbeat);
        mark.into_iter().chain(place).min()
    }

    fn agree_on_slots(&mut self, agree: super::lock::Agree) {
        self.agree = Some(agree);
    }

    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        let v = self.run("cannot read the lock's number of slots", RECORDED, &[])?;
        let rec = v.text().unwrap_or_default();
        Ok(Some(recorded(&rec)))
    }

    /// One request: a read-only script that asks `EXISTS` of every slot's key `K.slot-N` and
    /// its readers `K.slot-N.readers`, all named (so not `SCAN`, which is many round trips and
    /// no snapshot; not `MGET`, which answers nil for the readers' sorted set). Exact at one
    /// moment (the script is atomic), so a superset of the slots held throughout the read. A
    /// fair line's places (`fair.rs`) were otherwise read one script each.
    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        let v = self.on_slots(PRESENT, None, n)?;
        let mut present: Vec<u32> = v
            .items()
            .iter()
            .filter_map(|i| i.int().and_then(|k| u32::try_from(k).ok()))
            .filter(|k| *k < n)
            .collect();
        present.sort_unstable();
        Ok(Some(present))
    }

    /// One request, as [`slots_present`](Self::slots_present): who holds each of the first `n`
    /// slots, as `status` of each would say ([`HOLDERS_OF`]). A fair line's places
    /// (`fair.rs`) were otherwise read one script each — which kept the line to 32 places.
    fn slots_holders(&mut self, n: u32) -> Result<Option<Vec<Holder>>> {
        let counter = self.keys()[2].clone();
        let v = self.on_slots(HOLDERS_OF, Some(counter), n)?;
        let items = v.items();
        let epoch = items
            .first()
            .and_then(Value::text)
            .and_then(|t| t.parse::<u64>().ok());
        let mut all = Vec::new();
        for slot in items.iter().skip(1) {
            let parts = slot.items();
            let Some(k) = parts
                .first()
                .and_then(Value::int)
                .and_then(|k| u32::try_from(k).ok())
                .filter(|k| *k < n)
            else {
                continue;
            };
            let writer = parts.get(1).and_then(Value::text).unwrap_or_default();
            let readers = parts.iter().skip(2).filter_map(Value::text);
            let seen = (!writer.is_empty())
                .then(|| holder(&writer, Mode::Exclusive, None))
                .into_iter()
                .chain(readers.map(|m| holder(&m, Mode::Shared, epoch)));
            all.extend(seen.map(|h| Holder { slot: Some(k), ..h }));
        }
        Ok(Some(all))
    }

    fn wake_fds(&self) -> Vec<std::os::fd::BorrowedFd<'_>> {
        let mut v = self.wake.fds();
        v.extend(self.waiter.iter().map(|w| w.call.fd()));
        v
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        Ok(self.holders()?.into_iter().map(|(_, h)| h).collect())
    }

    fn break_lock(&mut self, how: Break, _: &mut Watcher) -> Result<BreakOutcome> {
        let holders = self.holders()?;
        let lock = format!("`{}` ({})", self.cfg.key, self.server());
        super::stale::break_server_held(
            &lock,
            holders,
            how,
            |h| h.alive == Some(false),
            [
                "a live key (Redis expires it stale_after after its holder's last heartbeat)",
                "delete it",
            ],
            |value, h| {
                if self.remove(&value)? {
                    info!("deleted the lock of {h}");
                } else {
                    info!("the lock of {h} was gone already");
                }
                Ok(())
            },
        )
    }
}

impl Beats for Redis {
    fn period(&self) -> Duration {
        self.heartbeat
    }

    fn beat(&mut self, deadline: Instant) -> Result<()> {
        let Some(value) = self.value.clone() else {
            return Err(err!(Lost, "lock `{}` is not held", self.cfg.key));
        };
        let (mode, px) = (self.mode_arg(), self.px.to_string());
        let server = self.server();
        let key = self.cfg.key.clone();
        match self.eval("cannot renew the lock", HEARTBEAT, &[mode, &value, &px], deadline) {
            Ok(v) if v.int() == Some(1) => Ok(()),
            Ok(_) => {
                self.value = None;
                Err(err!(
                    Lost,
                    "the key of lock `{key}` ({server}) has vanished or changed: it expired or was deleted; someone else may hold it now"
                ))
            }
            // Not confirmed (no answer, the connection broke, a refusal after reconnecting):
            // the key may still be ours; tried again until the lease's point of no return.
            Err(e) => Err(Error::new(Kind::Unavailable, e.message().to_string())),
        }
    }

    /// A request that could not be made keeps the lock held: the caller tries again.
    fn free(&mut self) -> Result<()> {
        let Some(value) = self.value.clone() else {
            return Ok(());
        };
        let mode = self.mode_arg();
        let token = self.token.map(|t| t.to_string()).unwrap_or_default();
        let server = self.server();
        let key = self.cfg.key.clone();
        let r = self.run("cannot release the lock", RELEASE, &[mode, &value, &token]);
        match r {
            Ok(v) if v.int() == Some(1) => {
                self.value = None;
                Ok(())
            }
            Ok(_) => {
                self.value = None;
                Err(err!(
                    Lost,
                    "the key of lock `{key}` ({server}) was no longer ours at release: it expired or was deleted"
                ))
            }
            // Not reached, or no answer: still ours as far as we know; tried again.
            Err(e) => Err(Error::new(Kind::Unavailable, e.message().to_string())),
        }
    }
}
