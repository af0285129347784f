//! `backend = "etcd"`: a lease-bound queue key under the profile's prefix (etcd v3 API).
//!
//! **Acquire:** grant a lease (TTL = `stale_after` rounded up to whole seconds, at least 2),
//! put `PREFIX/w/<lease hex>` (a writer) or `PREFIX/r/<lease hex>` (a reader) with it; the
//! value is the owner record. Keys queue by create revision (the etcd lock recipe): a writer
//! holds when its key is the oldest under `PREFIX/`, a reader when no writer key is older
//! (the readers/writers recipe: a waiting writer's key blocks later readers, so writers are
//! not starved). A waiter watches the deletion of the newest key ahead of it that blocks it
//! (no thundering herd, FIFO order), on the backend's own tokio runtime; the runtime's
//! thread writes one byte to a socket the core polls beside every release cause.
//!
//! **Release:** revoke the lease: the key goes at once, nothing stays under `PREFIX/`. A
//! waiter that gives up, or a locksmith whose parent died, revokes too (Drop). A killed
//! locksmith's key goes when its lease expires, `stale_after` later — or at once when a
//! waiter on the same host (boot id and pid namespace in the owner record) finds its pid
//! dead: proof of death, as the file backends use, and then the waiter revokes that lease.
//! A waiter watches a same-host blocker's pidfd beside the key's deletion.
//!
//! **Keepalive:** one lease keepalive per heartbeat (min(`keepalive`, `stale_after`/3)), each
//! bounded by a deadline that ends a quarter TTL before the lease could expire: a member
//! that does not answer in time means `LOST`, 74, before anyone else can get in.
//!
//! **Fencing tokens:** the create revision of our key (strictly increasing across the whole
//! cluster). `PREFIX.state` holds `dirty N` while writer N holds and `clean N` after its
//! release; a writer that finds `dirty` says `prev=crashed`. Readers report the write epoch
//! (the token of the last writer) from it.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

use super::address::Address;
use super::lock::{
    Attempt, Backend, Beats, Break, BreakOutcome, Grant, Holder, Named, Tried, WaitHint,
    request_by,
};
use super::owner::{Parsed, Record};
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::settings::{Fields, KeyDoc, Password, fmt_duration};
use crate::watch::Watcher;

/// Settings of the `etcd` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port` URLs, all of one scheme (a bare
    /// `host:port` gets `http://`).
    pub endpoints: Vec<String>,
    /// `https://` endpoints: TLS, the server verified against `ca_file` or the system CAs.
    pub tls: bool,
    pub ca_file: Option<std::path::PathBuf>,
    /// The lock's key prefix: the queue lives under `PREFIX/`, the fencing state at
    /// `PREFIX.state`.
    pub prefix: String,
    pub user: Option<String>,
    pub password: Password,
    /// A slot of a lock with several (SPEC §3b): the lock's own prefix, beside which the
    /// number of slots is recorded. `None`: the lock itself.
    pub slot_of: Option<String>,
}

impl EtcdConfig {
    /// Slot `k` of the lock: the queue under `PREFIX.slot-K/` (docs/LAYOUT.md).
    pub fn slot(&self, k: u32) -> EtcdConfig {
        EtcdConfig {
            prefix: format!("{}.slot-{k}", self.prefix),
            slot_of: Some(self.prefix.clone()),
            ..self.clone()
        }
    }

    /// The lock's fair queue: the lock under `PREFIX.line`, whose slots its waiters hold
    /// (docs/LAYOUT.md).
    pub fn queue(&self) -> EtcdConfig {
        EtcdConfig {
            prefix: format!("{}.line", self.prefix),
            slot_of: None,
            ..self.clone()
        }
    }
}

/// The keys [`config`] takes (besides the common and password keys).
pub static KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "endpoints",
        example: "[\"http://127.0.0.1:2379\"]",
        doc: "the cluster's members: host:port, http://host:port or https://host:port (required)",
    },
    KeyDoc {
        key: "ca_file",
        example: "\"/etc/locksmith/etcd-ca.pem\"",
        doc: "PEM file of the CA(s) that sign the members' certificates (https endpoints)",
    },
    KeyDoc {
        key: "prefix",
        example: "\"/locks/deploy\"",
        doc: "the lock's key prefix; nothing stays under it after release [default: /locksmith/PROFILE]",
    },
    KeyDoc {
        key: "user",
        example: "\"locker\"",
        doc: "the etcd user, for a cluster with authentication",
    },
];

/// The keys of `backend = "etcd"`. `prefix` defaults to `/locksmith/PROFILE` (an address
/// on the command line has no profile: it must name its PREFIX). From an address with a
/// user, the password defaults to `$LOCKSMITH_PASSWORD`.
pub fn config(f: &mut Fields) -> Result<EtcdConfig> {
    let endpoints = f.required("endpoints", Fields::strings)?;
    if endpoints.is_empty() {
        return Err(f.error("`endpoints` is empty"));
    }
    let mut urls = Vec::with_capacity(endpoints.len());
    for e in endpoints {
        let url = if e.starts_with("http://") || e.starts_with("https://") {
            e
        } else if e.contains("://") {
            return Err(f.error(&format!(
                "endpoint {e:?}: expected host:port, http://host:port or https://host:port"
            )));
        } else {
            format!("http://{e}")
        };
        let hostport = url.split_once("://").map_or("", |(_, rest)| rest);
        let hostport = hostport.strip_suffix('/').unwrap_or(hostport);
        let ok = hostport
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !ok || hostport.contains('/') {
            return Err(f.error(&format!("endpoint {url:?}: expected host:port")));
        }
        urls.push(url);
    }
    let tls = urls[0].starts_with("https://");
    if urls.iter().any(|u| u.starts_with("https://") != tls) {
        return Err(f.error("`endpoints` mix http:// and https://; use one scheme"));
    }
    let ca_file = f.path("ca_file")?;
    if ca_file.is_some() && !tls {
        return Err(f.error("`ca_file` needs https:// endpoints (a bare host:port means http://)"));
    }
    let prefix = match (f.string("prefix")?, &f.origin().profile) {
        (Some(p), _) => p,
        (None, Some(profile)) => format!("/locksmith/{profile}"),
        (None, None) => {
            return Err(f.error(
                "an etcd address needs its key PREFIX after HOST:PORT/ (etcd://HOST:PORT/locks/NAME)",
            ));
        }
    };
    let prefix = prefix.trim_end_matches('/').to_string();
    if prefix.is_empty() {
        return Err(f.error("`prefix` is empty"));
    }
    let user = f.string("user")?;
    let mut password = f.password()?;
    if let Some(env) = &f.origin().address
        && user.is_some()
        && password == Password::None
        && env.locksmith_password
    {
        password = Password::Env("LOCKSMITH_PASSWORD".into());
    }
    if user.is_none() && password != Password::None {
        return Err(f.error("a password needs `user`"));
    }
    Ok(EtcdConfig {
        endpoints: urls,
        tls,
        ca_file,
        prefix,
        user,
        password,
        slot_of: None,
    })
}

/// `etcd://HOST:PORT[,HOST:PORT...]/PREFIX` (`etcds://`: https endpoints); PREFIX keeps its
/// leading `/`.
pub fn address(a: &Address) -> std::result::Result<toml::Table, String> {
    let auth = a.authority()?;
    let scheme = if a.scheme == "etcds" { "https" } else { "http" };
    let mut endpoints = Vec::new();
    for (host, port) in &auth.hosts {
        let Some(port) = port else {
            return Err(format!(
                "etcd endpoint {host:?} needs its :PORT (etcd listens on 2379)"
            ));
        };
        endpoints.push(toml::Value::from(format!("{scheme}://{host}:{port}")));
    }
    let mut t = toml::Table::new();
    t.insert("endpoints".into(), endpoints.into());
    if let Some(u) = &auth.user {
        t.insert("user".into(), u.clone().into());
    }
    if !a.path.is_empty() && a.path != "/" {
        t.insert("prefix".into(), a.path.clone().into());
    }
    Ok(t)
}

use super::wake::Wakeups;

pub mod probe;
mod rpc;
use rpc::{Client, EventType, KeyValue};

pub struct Etcd {
    cfg: EtcdConfig,
    profile: String,
    mode: Mode,
    ttl: i64,
    heartbeat: Duration,
    /// Bound for one request that is not a keepalive.
    timeout: Duration,
    rt: Option<Runtime>,
    client: Option<Client>,
    /// The endpoint the client talks to (an index into `cfg.endpoints`, modulo its length).
    next_ep: usize,
    /// Our lease and queue key, once queued.
    lease: Option<i64>,
    /// A lease grant sent without an answer: the ID we asked for, and when it was sent. The
    /// next grant asks for the same ID (one that landed is found as ours), and a waiter that
    /// gives up revokes it ([`Etcd::enqueue`]).
    granting: Option<(i64, Instant)>,
    key: String,
    rev: i64,
    /// When the last keepalive the server confirmed (or the lease grant) was sent: the
    /// server's TTL runs from no earlier than that. Shared with the keeper task that keeps
    /// the lease alive while we wait, so that a lock granted after a long wait counts from
    /// the keeper's last confirmation, not from when the wait began.
    refreshed: Arc<Mutex<Instant>>,
    /// Keeps the lease alive while waiting.
    keeper: Option<JoinHandle<()>>,
    waiter: Option<Waiter>,
    /// The key to watch and the revision it was seen blocking at.
    blocker: Option<(String, i64)>,
    /// Our exclusive acquisition's token, to mark its clean release.
    token: Option<i64>,
    held: bool,
    /// Who held it at our last look, to name them while we wait.
    last_holders: Vec<Holder>,
    /// The pidfd of a same-host blocker (its death wakes us).
    wake: Wakeups,
    /// The lock's number of slots (SPEC §3b), recorded at `LOCK.slots` with each grant.
    slots: u32,
    /// What to ask before granting over another recorded number of slots.
    agree: Option<super::lock::Agree>,
    /// While waiting: the wait's deadline, which bounds each request of a try too
    /// ([`Backend::answer_by`]).
    by: Option<Instant>,
    /// Whether the state was `dirty` when this acquisition first read it (before any mark of
    /// ours), and the marks we sent: a mark of ours found later landed without its answer.
    found: Option<bool>,
    marks: Vec<String>,
}

struct Waiter {
    rx: UnixStream,
    key: String,
    task: JoinHandle<()>,
}

/// One key of the queue.
struct Entry {
    key: String,
    lease: i64,
    rev: i64,
    writer: bool,
    record: Parsed,
}

impl Entry {
    /// The queue's key `kv`, under `queue` (`PREFIX/`); `None` for a key not under it.
    fn read(kv: &KeyValue, queue: &str) -> Option<Entry> {
        let key = std::str::from_utf8(&kv.key).ok()?.to_string();
        let writer = key.strip_prefix(queue)?.starts_with("w/");
        Some(Entry {
            lease: kv.lease,
            rev: kv.create_revision,
            writer,
            record: Record::parse(std::str::from_utf8(&kv.value).unwrap_or("")),
            key,
        })
    }

    fn holder(&self) -> Holder {
        let mut h = self.record.holder();
        // A writer's token is its key's create revision (a slot's: the revision of its grant,
        // written into its record); readers get the write epoch, which lives in the state
        // key, not here.
        h.token = self.writer.then(|| h.token.unwrap_or(self.rev as u64));
        h.mode = Some(if self.writer {
            Mode::Exclusive
        } else {
            Mode::Shared
        });
        // The lease is alive (the key exists); a same-host pid proven dead holds until a
        // waiter (or `break`) revokes its lease.
        let dead = matches!(&self.record, Parsed::V1(r) if r.alive() == Some(false));
        h.alive = Some(!dead);
        h
    }
}

fn lost(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Etcd {
    pub fn new(cfg: EtcdConfig, profile: &Named) -> Etcd {
        let ttl = (profile.common.stale_after.as_millis().div_ceil(1000) as i64).max(2);
        Etcd {
            cfg,
            profile: profile.name.to_string(),
            mode: profile.common.mode(),
            ttl,
            heartbeat: profile.common.heartbeat(),
            timeout: profile
                .common
                .stale_after
                .clamp(Duration::from_secs(2), Duration::from_secs(10)),
            rt: None,
            client: None,
            next_ep: 0,
            lease: None,
            granting: None,
            key: String::new(),
            rev: 0,
            refreshed: Arc::new(Mutex::new(Instant::now())),
            keeper: None,
            waiter: None,
            blocker: None,
            token: None,
            held: false,
            last_holders: Vec::new(),
            wake: Wakeups::default(),
            slots: profile.common.slots,
            agree: None,
            by: None,
            found: None,
            marks: Vec::new(),
        }
    }

    fn server(&self) -> String {
        format!("etcd at {}", self.cfg.endpoints.join(","))
    }

    fn queue(&self) -> String {
        format!("{}/", self.cfg.prefix)
    }

    fn state_key(&self) -> String {
        format!("{}.state", self.cfg.prefix)
    }

    /// `LOCK.slots`: the number of slots of the last exclusive grant (absent: 1).
    fn slots_key(&self) -> String {
        format!(
            "{}.slots",
            self.cfg.slot_of.as_deref().unwrap_or(&self.cfg.prefix)
        )
    }

    /// When the last confirmed keepalive was sent.
    fn refreshed(&self) -> Instant {
        *self.refreshed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The moment after which we no longer trust our lease: a quarter TTL before the server
    /// could let it expire (it counts the TTL from when it saw our last keepalive, which was
    /// after we sent it).
    fn deadline(&self) -> Instant {
        let expires = self.refreshed() + Duration::from_secs(self.ttl as u64);
        expires - Duration::from_millis(self.ttl as u64 * 250)
    }

    fn rt(&mut self) -> Result<&Runtime> {
        if self.rt.is_none() {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("etcd")
                .enable_all()
                .build()
                .map_err(|e| Error::io("cannot start the etcd client runtime", e))?;
            self.rt = Some(rt);
        }
        Ok(self.rt.as_ref().expect("built above"))
    }

    /// Runs `f` on the runtime, bounded by `limit`.
    fn run<T, F>(&mut self, limit: Duration, f: F) -> Result<std::result::Result<T, String>>
    where
        F: std::future::Future<Output = rpc::Result<T>>,
    {
        let rt = self.rt()?;
        Ok(
            match rt.block_on(async { tokio::time::timeout(limit, f).await }) {
                Ok(Ok(v)) => Ok(v),
                Ok(Err(e)) => Err(self.error_text(&e)),
                Err(_) => Err(format!("no answer within {}", fmt_duration(limit))),
            },
        )
    }

    fn error_text(&self, e: &rpc::Error) -> String {
        match e {
            rpc::Error::Status(s) => {
                // Unauthenticated (16), PermissionDenied (7); etcd says "authentication
                // failed" with InvalidArgument.
                let code = s.code() as i32;
                if code == 16
                    || code == 7
                    || s.message().contains("authentication failed")
                    || s.message().contains("permission denied")
                {
                    format!("denied: {}", s.message())
                } else {
                    s.message().to_string()
                }
            }
            other => other.to_string(),
        }
    }

    /// Maps a failed request to an error of the right kind.
    fn fail(&self, what: &str, why: String) -> Error {
        let kind = if let Some(rest) = why.strip_prefix("denied: ") {
            return err!(Denied, "{what} ({}): {rest}", self.server());
        } else if self.held {
            Kind::Lost
        } else {
            Kind::Unavailable
        };
        // tonic connects lazily: a refused certificate shows on the first request.
        let hint = if self.cfg.tls && (why.contains("certificate") || why.contains("TLS")) {
            crate::tls::hint(self.cfg.ca_file.as_deref())
        } else {
            ""
        };
        Error::new(kind, format!("{what} ({}): {why}{hint}", self.server()))
    }

    /// How to reach a member: timeouts, TLS, the user (its password resolved).
    fn options(&self) -> Result<rpc::Options> {
        let mut opts = rpc::Options {
            timeout: self.timeout,
            ping: Duration::from_secs(1),
            ca_pem: None,
            user: None,
        };
        if self.cfg.tls {
            opts.ca_pem = Some(crate::tls::ca_pem(self.cfg.ca_file.as_deref())?);
        }
        if let Some(user) = &self.cfg.user {
            let pw = match &self.cfg.password {
                Password::None => String::new(),
                p => p.resolve(user)?,
            };
            opts.user = Some((user.clone(), pw));
        }
        Ok(opts)
    }

    fn client(&mut self) -> Result<Client> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let opts = self.options()?;
        // One member at a time, starting with the one that answered last: a member that is
        // down makes the request fail over to the next (see `call`), where a balanced
        // channel over all of them would keep sending some requests to it.
        let n = self.cfg.endpoints.len();
        let limit = request_by(self.timeout, self.by).saturating_duration_since(Instant::now());
        let mut last = String::new();
        for i in 0..n {
            let at = (self.next_ep + i) % n;
            let endpoint = self.cfg.endpoints[at].clone();
            match self.run(limit, Client::connect(&endpoint, &opts))? {
                Ok(c) => {
                    self.next_ep = at;
                    self.client = Some(c.clone());
                    return Ok(c);
                }
                Err(why) if why.starts_with("denied: ") => {
                    return Err(self.fail("cannot connect", why));
                }
                Err(why) => {
                    debug!("cannot connect to {}: {why}", self.cfg.endpoints[at]);
                    last = why;
                }
            }
        }
        Err(self.fail("cannot connect", last))
    }

    /// Runs one request `f` on a connected client, bounded by `limit`; a request that could
    /// not reach its member (connection refused or reset, member unavailable) is sent again
    /// to the next member, round after round until `limit`. `f` must be safe to repeat: our requests are
    /// (a put of the same key and lease, a read, a revoke, a lease grant of our own ID).
    fn call<T, F, Fut>(&mut self, limit: Duration, f: F) -> Result<std::result::Result<T, String>>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = rpc::Result<T>>,
    {
        let began = Instant::now();
        let deadline = request_by(limit, self.by);
        let n = self.cfg.endpoints.len();
        let mut tries = 0;
        loop {
            let c = self.client()?;
            let left = deadline.saturating_duration_since(Instant::now());
            let r = self
                .rt()?
                .block_on(async { tokio::time::timeout(left, f(c)).await });
            match r {
                Ok(Ok(v)) => return Ok(Ok(v)),
                Ok(Err(e)) => {
                    let unreachable = match &e {
                        rpc::Error::Transport(_) => true,
                        // Unavailable; tonic reports a connection that broke under a
                        // request as Unknown "transport error".
                        rpc::Error::Status(s) => {
                            s.code() as i32 == 14
                                || s.message() == "transport error"
                                || s.message().starts_with("Service was not ready")
                        }
                    };
                    tries += 1;
                    // After a round over every member, a pause: an election takes a moment.
                    let pause = if tries % n == 0 {
                        Duration::from_millis(100)
                    } else {
                        Duration::ZERO
                    };
                    if unreachable && n > 1 && Instant::now() + pause < deadline {
                        debug!(
                            "{} did not take the request ({e}); trying the next member",
                            self.cfg.endpoints[self.next_ep % n]
                        );
                        self.client = None;
                        self.next_ep += 1;
                        std::thread::sleep(pause);
                        continue;
                    }
                    return Ok(Err(self.error_text(&e)));
                }
                Err(_) => {
                    let waited = deadline.saturating_duration_since(began);
                    return Ok(Err(format!("no answer within {}", fmt_duration(waited))));
                }
            }
        }
    }

    /// The queue, oldest first, and the revision it was read at.
    fn entries(&mut self) -> Result<(Vec<Entry>, i64)> {
        let q = self.queue();
        let limit = self.timeout;
        let resp = self
            .call(limit, |mut c| {
                let q = q.clone();
                async move { c.range_prefix(&q).await }
            })?
            .map_err(|why| self.fail("cannot read the lock queue", why))?;
        let at = resp.header.map_or(0, |h| h.revision);
        let q = self.queue();
        let v = resp.kvs.iter().filter_map(|kv| Entry::read(kv, &q)).collect();
        Ok((v, at))
    }

    /// Who is ahead of a key of `writer` kind at `rev` and blocks it.
    fn blockers(entries: &[Entry], rev: i64, writer: bool) -> Vec<&Entry> {
        entries
            .iter()
            .filter(|e| e.rev < rev && (writer || e.writer))
            .collect()
    }

    /// The holders of the lock now: the oldest writer if it leads, else the readers ahead
    /// of the first writer.
    fn holding(entries: &[Entry]) -> Vec<&Entry> {
        match entries.first() {
            None => Vec::new(),
            Some(e) if e.writer => vec![e],
            Some(_) => entries.iter().take_while(|e| !e.writer).collect(),
        }
    }

    /// Every key under `PREFIX.slot-` (its slots' queues and states), in one range read,
    /// with that prefix.
    fn slot_keys(&mut self) -> Result<(String, rpc::pb::etcdserverpb::RangeResponse)> {
        let base = format!("{}.slot-", self.cfg.prefix);
        let limit = self.timeout;
        let read = self.call(limit, |mut c| {
            let base = base.clone();
            async move { c.range_prefix(&base).await }
        })?;
        let r = read.map_err(|why| self.fail("cannot read the lock's slots", why))?;
        Ok((base, r))
    }

    /// Grants a lease and queues our key.
    ///
    /// **The lease's ID is ours** (random, asked for in the grant): a grant whose answer is
    /// lost is asked again with the same ID, and one that landed answers "lease already
    /// exists" — that lease is ours, its TTL running from no earlier than the first send —
    /// rather than an unused lease left to run out its TTL; a waiter that gives up before
    /// it could ask again revokes that ID ([`Etcd::revoke`]).
    fn enqueue(&mut self) -> Result<()> {
        let ttl = self.ttl;
        let limit = self.timeout;
        let (id, sent) = *self
            .granting
            .get_or_insert_with(|| (fastrand::i64(1..i64::MAX), Instant::now()));
        let lease = match self.call(limit, |mut c| async move { c.lease_grant(ttl, id).await })? {
            Ok(g) => g.id,
            Err(why) if why.contains("lease already exists") => {
                debug!("lease {id:016x}: granted by a request whose answer was lost");
                id
            }
            // The ID is kept for the next grant whatever the failure: asking for it again is
            // safe (a lease of that ID can only be ours).
            Err(why) => return Err(self.fail("cannot grant a lease", why)),
        };
        self.granting = None;
        self.lease = Some(lease);
        // A new lease: its TTL runs from the grant (a keeper of an earlier lease, aborted
        // by now, only ever moves this forward with times before `sent`).
        *self.refreshed.lock().unwrap_or_else(|e| e.into_inner()) = sent;
        let kind = if self.mode == Mode::Exclusive {
            "w"
        } else {
            "r"
        };
        self.key = format!("{}{kind}/{lease:016x}", self.queue());
        let mut rec = Record::ours(&self.profile);
        rec.nonce = format!("{lease:016x}");
        let key = self.key.clone();
        let value = rec.render();
        let resp = self
            .call(limit, |mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(&key, &value, lease).await }
            })?
            .map_err(|why| self.fail("cannot queue for the lock", why))?;
        self.rev = resp.header.map_or(0, |h| h.revision);
        debug!("queued {} at revision {}", self.key, self.rev);
        Ok(())
    }

    /// Holding: the token and whether the previous writer released cleanly. An exclusive
    /// grant also records the lock's number of slots at `LOCK.slots` (SPEC §3b), in one
    /// transaction with the state's `dirty` mark, if that key did not change since we read
    /// it; another number recorded is the lock's say first ([`Agree`](super::lock::Agree)).
    /// A slot's token is the revision of that transaction (create revisions are not in grant
    /// order across slots), written into its record for `status` and `break --token`.
    ///
    /// Holding begins only once this returns: a request of it that gets no answer is an
    /// `Unavailable` error (not `Lost`), and the next try, our key still first, grants again
    /// (issue 27). The `dirty` mark of a try whose answer was lost may have landed: the next
    /// read finds our own mark (`dirty R`, R our key's create revision, unique to this
    /// acquisition) and takes `prev` from what the first read of this acquisition found
    /// ([`Etcd::found`]), so a landed mark neither says `prev=crashed` falsely nor hides one.
    fn grant(&mut self) -> Result<Grant> {
        let g = self.mark()?;
        self.held = true;
        self.by = None;
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        self.waiter = None;
        Ok(g)
    }

    /// [`Etcd::grant`]'s reads and writes.
    fn mark(&mut self) -> Result<Grant> {
        let (state_key, slots_key) = (self.state_key(), self.slots_key());
        let limit = self.timeout;
        let several = self.slots > 1;
        for _ in 0..50 {
            let (sk, nk) = (state_key.clone(), slots_key.clone());
            let read = match self.call(limit, |mut c| {
                let (sk, nk) = (sk.clone(), nk.clone());
                async move { c.get_two(&sk, &nk).await }
            }) {
                Ok(Ok((st, sl, _))) => Some((st, sl)),
                // Refused (a role that may not read them): as before slots existed.
                Ok(Err(e)) if e.starts_with("denied: ") => {
                    debug!("cannot read {state_key} and {slots_key}: {e}");
                    None
                }
                // No answer: tried again (a grant without the state would lose
                // `prev=crashed`).
                Ok(Err(why)) => return Err(self.fail("cannot read the lock state", why)),
                Err(e) => return Err(e),
            };
            let prev = read.as_ref().and_then(|(st, _)| {
                st.kvs
                    .first()
                    .and_then(|kv| String::from_utf8(kv.value.clone()).ok())
            });
            // No state yet: a fresh lock. A value we cannot read counts as a crash.
            let (dirty, epoch) = match prev.as_deref().map(|p| p.split_once(' ')) {
                None => (false, None),
                Some(Some((word, n))) => (word != "clean", n.parse::<u64>().ok()),
                Some(None) => (true, None),
            };
            // Our own mark, of a try whose answer was lost: what it replaced is what we found.
            let ours = prev.as_deref().is_some_and(|p| self.marks.iter().any(|m| m == p));
            let dirty = match (ours, self.found) {
                (true, Some(found)) => found,
                _ => {
                    self.found = Some(dirty);
                    dirty
                }
            };
            if self.mode == Mode::Shared {
                let recorded = read.as_ref().map(|(_, sl)| {
                    sl.kvs.first().map_or(1, |kv| {
                        std::str::from_utf8(&kv.value)
                            .ok()
                            .and_then(|v| v.parse::<u32>().ok())
                            .unwrap_or(1)
                            .max(1)
                    })
                });
                return Ok(Grant {
                    token: epoch,
                    prev_crashed: false,
                    recorded_slots: recorded,
                    ..Grant::default()
                });
            }
            let Some((_, recorded)) = read else {
                if several {
                    return Err(self.fail(
                        "cannot read the lock's number of slots",
                        format!("{slots_key} could not be read"),
                    ));
                }
                // As before slots existed: a token without the state's mark.
                self.token = Some(self.rev);
                return Ok(Grant {
                    token: Some(self.rev as u64),
                    prev_crashed: dirty,
                    ..Grant::default()
                });
            };
            let (before, seen) = recorded.kvs.first().map_or((1, 0), |kv| {
                let n = std::str::from_utf8(&kv.value)
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0);
                (n, kv.mod_revision)
            });
            if before != self.slots.max(1)
                && let Some(agree) = &self.agree
            {
                agree(before)?;
            }
            let mark = format!("dirty {}", self.rev);
            if !self.marks.contains(&mark) {
                self.marks.push(mark.clone());
            }
            let n = self.slots.max(1).to_string();
            let wrote = self.call(limit, |mut c| {
                let (sk, nk, mark, n) = (state_key.clone(), slots_key.clone(), mark.clone(), n.clone());
                async move {
                    c.put_if_unchanged(&nk, seen, &[(&sk, &mark), (&nk, &n)])
                        .await
                }
            });
            let at = match wrote {
                Ok(Ok(r)) if r.succeeded => r.header.map_or(0, |h| h.revision),
                // Someone granted meanwhile: read again.
                Ok(Ok(_)) => continue,
                Ok(Err(why)) => {
                    if several || !why.starts_with("denied: ") {
                        // No answer: it may have landed; the next try finds our mark.
                        return Err(self.fail("cannot record the lock's number of slots", why));
                    }
                    debug!("cannot mark the lock state: {why}");
                    0
                }
                Err(e) => {
                    if several {
                        return Err(e);
                    }
                    debug!("cannot mark the lock state: {e}");
                    0
                }
            };
            let token = if several { at } else { self.rev };
            self.token = Some(token);
            if several {
                self.stamp(token);
            }
            return Ok(Grant {
                token: Some(token as u64),
                prev_crashed: dirty,
                ..Grant::default()
            });
        }
        Err(self.fail(
            "cannot record the lock's number of slots",
            format!("{slots_key} keeps changing"),
        ))
    }

    /// A slot's token into its record (best effort: `status` shows the create revision
    /// without it).
    fn stamp(&mut self, token: i64) {
        let Some(lease) = self.lease else {
            return;
        };
        let mut rec = Record::ours(&self.profile);
        rec.nonce = format!("{lease:016x}");
        rec.token = Some(token as u64);
        let (key, value) = (self.key.clone(), rec.render());
        let limit = self.timeout;
        if let Ok(Err(e)) | Err(e) = self
            .call(limit, |mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(&key, &value, lease).await }
            })
            .map_err(|e| e.to_string())
        {
            debug!("cannot write our token into {key}: {e}");
        }
    }

    /// Keeps our lease alive while waiting (holding uses the heartbeat).
    fn start_keeper(&mut self) -> Result<()> {
        if self.keeper.is_some() {
            return Ok(());
        }
        let Some(lease) = self.lease else {
            return Ok(());
        };
        let c = self.client()?;
        let period = self.heartbeat;
        let refreshed = Arc::clone(&self.refreshed);
        let task = self.rt()?.spawn(async move {
            let mut c = c;
            loop {
                let mut sent = Instant::now();
                if let Ok((mut k, mut s)) = c.lease_keep_alive(lease).await {
                    // The first answer is to the keepalive that opened the stream.
                    let mut first = true;
                    loop {
                        if !first {
                            tokio::time::sleep(period).await;
                            sent = Instant::now();
                            if k.keep_alive().await.is_err() {
                                break;
                            }
                        }
                        first = false;
                        match tokio::time::timeout(period, s.message()).await {
                            // Confirmed: the lease lives at least a TTL from `sent`.
                            Ok(Ok(Some(r))) if r.ttl > 0 => {
                                let mut at = refreshed.lock().unwrap_or_else(|e| e.into_inner());
                                *at = (*at).max(sent);
                            }
                            // Expired (TTL 0): our key is gone; `try_acquire` queues again.
                            Ok(Ok(Some(_))) => {}
                            _ => break,
                        }
                    }
                }
                tokio::time::sleep(period).await;
            }
        });
        self.keeper = Some(task);
        Ok(())
    }

    /// One lease keepalive bounded by `limit`: the TTL the server answers (0: expired).
    /// A confirmation moves `refreshed` forward.
    fn keep_alive(
        &mut self,
        lease: i64,
        limit: Duration,
    ) -> Result<std::result::Result<i64, String>> {
        let sent = Instant::now();
        let r = self.call(limit, |mut c| async move {
            let (_k, mut s) = c.lease_keep_alive(lease).await?;
            Ok(s.message().await?.map_or(0, |r| r.ttl))
        })?;
        if let Ok(ttl) = r
            && ttl > 0
        {
            let mut at = self.refreshed.lock().unwrap_or_else(|e| e.into_inner());
            *at = (*at).max(sent);
        }
        Ok(r)
    }

    fn revoke(&mut self) {
        if let Some(k) = self.keeper.take() {
            k.abort();
        }
        if let Some(w) = self.waiter.take() {
            w.task.abort();
        }
        // A grant whose answer was lost: its lease may be there.
        let Some(lease) = self.lease.take().or(self.granting.take().map(|(id, _)| id)) else {
            return;
        };
        let Some(mut c) = self.client.clone() else {
            return;
        };
        let limit = request_by(self.timeout.min(Duration::from_secs(3)), self.by)
            .saturating_duration_since(Instant::now());
        match self.run(limit, async move { c.lease_revoke(lease).await }) {
            Ok(Ok(_)) => debug!("revoked lease {lease:016x}"),
            Ok(Err(e)) => debug!("cannot revoke lease {lease:016x}: {e}"),
            Err(e) => debug!("cannot revoke lease {lease:016x}: {e}"),
        }
    }

    /// One try: the keys ahead of ours decide.
    fn attempt(&mut self) -> Result<Tried> {
        if let Some(w) = &self.waiter {
            let mut buf = [0u8; 8];
            match std::io::Read::read(&mut &w.rx, &mut buf) {
                Ok(n) if n > 0 => self.waiter = None,
                _ if self.wake.holder_exited() => {}
                // The wait's deadline: busy only if the member says so now. A watch that
                // heard nothing may be on a member that stopped answering (issue 27): ask.
                _ if self.by.is_some_and(|by| Instant::now() >= by) => {}
                _ => return Ok(Tried::Busy(self.last_holders.clone())),
            }
        }
        if self.lease.is_none() {
            self.enqueue()?;
        }
        let (mut entries, mut at) = self.entries()?;
        // Keys ahead of ours whose locksmith is provably dead (same host): revoke their
        // leases rather than wait out the TTL, then look again.
        for _ in 0..3 {
            let dead: Vec<(i64, Holder)> = Self::blockers(&entries, self.rev, true)
                .into_iter()
                .filter(|e| e.key != self.key)
                .filter(|e| matches!(&e.record, Parsed::V1(r) if r.alive() == Some(false)))
                .map(|e| (e.lease, e.record.holder()))
                .collect();
            if dead.is_empty() {
                break;
            }
            for (lease, h) in dead {
                let limit = self.timeout;
                match self.call(limit, |mut c| async move { c.lease_revoke(lease).await })? {
                    Ok(_) => info!("revoked lease {lease:016x} of {h}: its locksmith is dead"),
                    Err(e) => debug!("cannot revoke lease {lease:016x} of {h}: {e}"),
                }
            }
            (entries, at) = self.entries()?;
        }
        if !entries.iter().any(|e| e.key == self.key) && !self.held {
            // Our waiting key went (its lease ran out while the member stalled, or someone
            // revoked it): queue again, at the back.
            info!(
                "our place in the queue ({}) is gone; queueing again",
                self.key
            );
            self.revoke();
            self.enqueue()?;
            (entries, at) = self.entries()?;
        }
        // Our place is our key's create revision as the server keeps it (a put repeated after
        // a lost reply answers with a later revision).
        if let Some(e) = entries.iter().find(|e| e.key == self.key) {
            self.rev = e.rev;
        }
        if !entries.iter().any(|e| e.key == self.key) {
            return Err(self.fail(
                "lost our place in the queue",
                format!(
                    "key {} is gone (its lease expired or was revoked)",
                    self.key
                ),
            ));
        }
        let writer = self.mode == Mode::Exclusive;
        let ahead = Self::blockers(&entries, self.rev, writer);
        let Some(last) = ahead.last() else {
            self.blocker = None;
            self.wake.forget_holder();
            // The keeper confirms our lease every heartbeat while we wait; if it could not
            // lately (a stalled member), confirm it now, before saying OK: a lock is granted
            // with at least a heartbeat of lease ahead of it.
            if Instant::now() + self.heartbeat >= self.deadline()
                && let Some(lease) = self.lease
            {
                let limit = self.timeout;
                match self.keep_alive(lease, limit)? {
                    Ok(ttl) if ttl > 0 => {}
                    // Expired between our read and now: queue again.
                    Ok(_) => {
                        self.revoke();
                        return Ok(Tried::Busy(self.last_holders.clone()));
                    }
                    Err(why) => return Err(self.fail("cannot renew our lease", why)),
                }
            }
            return Ok(Tried::Took(self.grant()?));
        };
        self.blocker = Some((last.key.clone(), at));
        // A blocker on this host: its death (pidfd) wakes us to revoke its lease.
        match &last.record {
            Parsed::V1(r) if r.same_host() => {
                if !self.wake.holder_alive(r.pid, r.start) {
                    self.wake.forget_holder();
                }
            }
            _ => self.wake.forget_holder(),
        }
        let holders: Vec<Holder> = Self::holding(&entries)
            .into_iter()
            .map(Entry::holder)
            .collect();
        self.last_holders = holders.clone();
        Ok(Tried::Busy(holders))
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // A waiter that gives up: its revoke bounded like a try's last request (a member that
        // does not answer lets the lease expire by itself, its keeper gone).
        self.by = Some(Instant::now());
        self.revoke();
    }
}

impl Backend for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
    }

    /// A try whose server did not answer comes back with the backend: its key is named by
    /// its own lease, so a put that landed without its answer is found as ours by the next
    /// try (its place kept), a lease granted without its answer too (its ID is ours,
    /// [`Etcd::enqueue`]), and a `dirty`
    /// mark that landed is recognised ([`Etcd::grant`]).
    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let tried = self.attempt();
        Tried::or_unanswered(tried, self)
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.by = by;
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        self.start_keeper()?;
        let Some((key, at)) = self.blocker.clone() else {
            return Ok(WaitHint { poll: true, catches_release: false });
        };
        if self.waiter.as_ref().is_some_and(|w| w.key == key) {
            return Ok(WaitHint { poll: false, catches_release: false });
        }
        if let Some(w) = self.waiter.take() {
            w.task.abort();
        }
        let c = self.client()?;
        let (rx, mut tx) = UnixStream::pair().map_err(|e| Error::io("socketpair", e))?;
        rx.set_nonblocking(true)
            .map_err(|e| Error::io("socketpair", e))?;
        let k = key.clone();
        let task = self.rt()?.spawn(async move {
            let mut c = c;
            if let Ok(mut s) = c.watch(&k, at + 1).await {
                'outer: while let Ok(Some(r)) = s.message().await {
                    if r.canceled {
                        break;
                    }
                    for ev in &r.events {
                        if ev.r#type == EventType::Delete as i32 {
                            break 'outer;
                        }
                    }
                }
            }
            let _ = tx.write_all(b"!");
        });
        self.waiter = Some(Waiter { rx, key, task });
        Ok(WaitHint { poll: false, catches_release: false })
    }

    fn agree_on_slots(&mut self, agree: super::lock::Agree) {
        self.agree = Some(agree);
    }

    /// `LOCK.slots` (absent: 1), by a linearizable read.
    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        let key = self.slots_key();
        let limit = self.timeout;
        let read = self.call(limit, |mut c| {
            let key = key.clone();
            async move { c.get(&key).await }
        })?;
        let r = read.map_err(|why| self.fail("cannot read the lock's number of slots", why))?;
        Ok(Some(r.kvs.first().map_or(1, |kv| {
            std::str::from_utf8(&kv.value)
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(1)
                .max(1)
        })))
    }

    /// One range read over `PREFIX.slot-`: slot K is present while a key lives
    /// under its queue `PREFIX.slot-K/` (a lease-bound key: a holder's or a waiter's, a
    /// superset of the holders); `PREFIX.slot-K.state` lives on after release and is not
    /// counted. A fair line's places (`fair.rs`) were otherwise read one range each.
    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        let (base, r) = self.slot_keys()?;
        let mut v: Vec<u32> = r
            .kvs
            .iter()
            .filter_map(|kv| {
                let rest = std::str::from_utf8(&kv.key).ok()?.strip_prefix(&base)?;
                // A key under the slot's queue `PREFIX.slot-K/`.
                super::slots::slot_named(rest, n, |t| t.starts_with('/'))
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        Ok(Some(v))
    }

    /// The same range read as [`slots_present`](Self::slots_present), each slot's queue
    /// judged as `status` of the slot judges its own: who holds each of the first `n` slots.
    /// A fair line's places (`fair.rs`) were otherwise read one range each — which kept the
    /// line to 32 places.
    fn slots_holders(&mut self, n: u32) -> Result<Option<Vec<Holder>>> {
        let (base, r) = self.slot_keys()?;
        // Each slot's keys, oldest first (the range is sorted by create revision).
        let mut queues: std::collections::BTreeMap<u32, Vec<Entry>> = Default::default();
        for kv in &r.kvs {
            let Some(rest) = std::str::from_utf8(&kv.key)
                .ok()
                .and_then(|k| k.strip_prefix(&base))
            else {
                continue;
            };
            let Some(k) = super::slots::slot_named(rest, n, |t| t.starts_with('/')) else {
                continue;
            };
            if let Some(e) = Entry::read(kv, &format!("{base}{k}/")) {
                queues.entry(k).or_default().push(e);
            }
        }
        Ok(Some(
            queues
                .iter()
                .flat_map(|(&k, entries)| {
                    Self::holding(entries).into_iter().map(move |e| Holder {
                        slot: Some(k),
                        ..e.holder()
                    })
                })
                .collect(),
        ))
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut v: Vec<BorrowedFd<'_>> = self.waiter.iter().map(|w| w.rx.as_fd()).collect();
        v.extend(self.wake.fds());
        v
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        let (entries, _) = self.entries()?;
        Ok(Self::holding(&entries)
            .into_iter()
            .map(Entry::holder)
            .collect())
    }

    fn break_lock(&mut self, how: Break, _: &mut Watcher) -> Result<BreakOutcome> {
        let (entries, _) = self.entries()?;
        let holders = Self::holding(&entries)
            .into_iter()
            .map(|e| (e.lease, e.holder()))
            .collect();
        let limit = self.timeout;
        // Holders on this host whose locksmith is provably dead go without --force.
        super::stale::break_server_held(
            &format!("`{}`", self.profile),
            holders,
            how,
            |h| h.alive == Some(false),
            [
                "a live lease (etcd frees it when the lease expires)",
                "revoke it",
            ],
            |lease, h| {
                self.call(limit, |mut c| async move { c.lease_revoke(lease).await })?
                    .map_err(|why| self.fail("cannot revoke the holder's lease", why))?;
                info!("revoked lease {lease:016x} of {h}");
                Ok(())
            },
        )
    }
}

impl Beats for Etcd {
    fn period(&self) -> Duration {
        self.heartbeat
    }

    fn beat(&mut self, deadline: Instant) -> Result<()> {
        let Some(lease) = self.lease else {
            return Err(err!(Lost, "the lease of lock `{}` is gone", self.profile));
        };
        let limit = self
            .deadline()
            .min(deadline)
            .saturating_duration_since(Instant::now());
        let server = self.server();
        match self.keep_alive(lease, limit)? {
            Ok(ttl) if ttl > 0 => Ok(()),
            Ok(_) => Err(err!(
                Lost,
                "the lease of lock `{}` ({server}) has expired; someone else may hold it now",
                self.profile
            )),
            Err(why) => Err(err!(
                Lost,
                "cannot keep the lease of lock `{}` alive ({server}): {}; giving it up before it can expire",
                self.profile,
                lost(why)
            )),
        }
    }

    /// A request that could not be made keeps the lease: the caller tries again.
    fn free(&mut self) -> Result<()> {
        let Some(lease) = self.lease else {
            return Ok(());
        };
        let limit = self.timeout;
        let state_key = self.state_key();
        let server = self.server();
        let token = self.token;
        let key = self.key.clone();
        let r = self.call(limit, |mut c| {
            let (key, state_key) = (key.clone(), state_key.clone());
            async move {
                if let Some(t) = token {
                    // Mark the clean release only while our key still stands, and free the name
                    // in the same step: the next waiter's watch fires one round trip sooner.
                    let clean = format!("clean {t}");
                    c.put_and_delete_if_leased(&key, lease, &state_key, &clean)
                        .await?;
                }
                c.lease_revoke(lease).await
            }
        })?;
        self.held = false;
        self.lease = None;
        self.token = None;
        match r {
            Ok(_) => Ok(()),
            Err(why) => {
                info!("{why}; the next holder may see prev=crashed");
                Err(err!(
                    Lost,
                    "cannot release lock `{}` ({server}): {why}",
                    self.profile
                ))
            }
        }
    }
}
