//! `backend = "s3"`: an object created by a conditional write on S3 or an S3-compatible
//! server (layout in `docs/LAYOUT.md`, "s3").
//!
//! **Exclusive:** `PUT KEY` with `If-None-Match: *` (exactly one creator wins, on a server
//! that keeps the promise: `verify` checks). The body is the owner record with a beat
//! counter; each heartbeat rewrites it (a new beat, so a new body and a new ETag: servers
//! whose ETag is the MD5 of the body keep it for the same bytes) with `If-Match: <our last
//! ETag>`, so a holder whose object was broken and taken by another learns it (412) and
//! says LOST. Release deletes with `If-Match`: a late holder never removes a successor's
//! object.
//!
//! **Shared:** a reader puts `KEY.readers/<nonce>` and then looks at `KEY`: absent, it holds;
//! present, it takes its object away and waits. A writer creates `KEY` first and then lists
//! `KEY.readers/`: it holds once the list is empty (after judging every reader left there),
//! and meanwhile keeps `KEY`, so that no new reader gets in (writers are not starved). With
//! a strongly consistent server (AWS S3, SeaweedFS) one of the two always sees the other.
//!
//! **Staleness** is judged on the server's clock: an object whose `Last-Modified` is
//! `stale_after` behind the server's `Date` (both whole seconds: a second is taken off) is
//! silent, whatever the waiter's own clock says ([`stale::Evidence::age`]); a holder on this
//! host proven dead goes at once. Either way the waiter deletes exactly the version it
//! judged (`If-Match`), through the one rule of [`stale`].
//!
//! **Fencing tokens** live in `KEY.state` (`state~1~TOKEN~CLEAN`, the state entry of the
//! other backends), swapped with `If-Match` (or `If-None-Match: *` for the first): a writer
//! takes the next token and writes it dirty; its release writes it clean before it deletes
//! `KEY`. A writer that finds it dirty says `prev=crashed`; readers report the token there.
//! A state cut short (no final newline: a swap killed mid-request on a server that kept what
//! it got) has lost its token: the next writer starts it again from the clock's microseconds,
//! above every token counted from 1, and says `token_from=clock prev=crashed`.
//!
//! **Slots** (`--slots N`, SPEC §3b): slot K is the object `KEY.slot-K`, a whole lock as
//! above; every slot takes its tokens from the lock's one `KEY.state`, whose entry records
//! the issuer's number of slots (`state~1~TOKEN~CLEAN~N`, N > 1; a state without it is one
//! slot). Another number recorded is the lock's say first (`slots.rs`), and the swap is made
//! over exactly the state judged (`If-Match`). A waiter keeps its number in the lock's
//! waiting room, an object per waiter under `KEY.waiting/` ([`room`]).

use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use super::address::Address;
use super::lock::{
    Agree, Attempt, Backend, Beats, Break, BreakOutcome, Holder, Named, Tried, WaitHint,
    request_by,
};
use super::owner::{Record, State, cut_short, next_token, parse_state_entry, state_entry};
use super::stale::{Evidence, Holders, Judge};
use super::wake::Wakeups;
use crate::error::{Error, Kind, Result, err};
use crate::log::{debug, info};
use crate::protocol::Mode;
use crate::settings::{Fields, KeyDoc};
use crate::watch::Watcher;

pub mod http;
pub mod probe;
mod room;

use http::{Client, Cond, Reply};

/// Settings of the `s3` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// The lock object's key (no leading `/`).
    pub key: String,
    /// `http(s)://host[:port]` of an S3-compatible server (path-style requests); `None`:
    /// AWS, virtual-host style.
    pub endpoint: Option<String>,
    /// The signing region; `None`: `$AWS_REGION`, `$AWS_DEFAULT_REGION`, else `us-east-1`
    /// with an endpoint (AWS itself needs one).
    pub region: Option<String>,
    pub ca_file: Option<PathBuf>,
    /// A slot of a lock with several (SPEC §3b): the lock's own key, whose state object
    /// (tokens and the number of slots) every slot uses. `None`: the lock itself.
    pub slot_of: Option<String>,
}

impl S3Config {
    /// Slot `k` of the lock: the object `KEY.slot-K` (docs/LAYOUT.md).
    pub fn slot(&self, k: u32) -> S3Config {
        S3Config {
            key: format!("{}.slot-{k}", self.key),
            slot_of: Some(self.key.clone()),
            ..self.clone()
        }
    }

    /// The lock's fair queue: the object `KEY.line`, whose slots its waiters hold
    /// (docs/LAYOUT.md).
    pub fn queue(&self) -> S3Config {
        S3Config {
            key: format!("{}.line", self.key),
            slot_of: None,
            ..self.clone()
        }
    }
}

/// The keys [`config`] takes (besides the common keys).
pub static KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "bucket",
        example: "\"locks\"",
        doc: "the bucket that holds the lock object (required; it must exist)",
    },
    KeyDoc {
        key: "key",
        example: "\"deploy/prod\"",
        doc: "the lock object's key; KEY.state, KEY.readers/ and a semaphore's KEY.slot-K live beside it [default: locksmith/PROFILE]",
    },
    KeyDoc {
        key: "endpoint",
        example: "\"http://127.0.0.1:8333\"",
        doc: "an S3-compatible server, http(s)://HOST[:PORT] (path-style requests) [default: AWS, virtual-host style]",
    },
    KeyDoc {
        key: "region",
        example: "\"eu-central-1\"",
        doc: "the signing region [default: $AWS_REGION, $AWS_DEFAULT_REGION; us-east-1 with an endpoint]",
    },
    KeyDoc {
        key: "ca_file",
        example: "\"/etc/locksmith/s3-ca.pem\"",
        doc: "PEM file of the CA(s) that sign an https endpoint's certificate [default: the system CAs]",
    },
];

/// The keys of `backend = "s3"`. Credentials are never among them: the AWS conventions
/// only ([`http::credentials`]).
pub fn config(f: &mut Fields) -> Result<S3Config> {
    let bucket = f.required("bucket", Fields::string)?;
    // AWS's rule (3 to 63 of a-z 0-9 - .) is looser on other servers; what any server
    // could take in a host name or a path's first segment is enforced here.
    let valid = !bucket.is_empty()
        && bucket.len() <= 255
        && bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if !valid {
        return Err(f.error(&format!(
            "bucket {bucket:?}: a bucket name is letters, digits, `-`, `_` and `.`"
        )));
    }
    let key = match (f.string("key")?, &f.origin().profile) {
        (Some(k), _) => k,
        (None, Some(p)) => format!("locksmith/{p}"),
        (None, None) => {
            return Err(f.error("an s3 address names its object: s3://BUCKET/KEY"));
        }
    };
    let key = key.trim_start_matches('/').to_string();
    if key.is_empty() || key.ends_with('/') || key.len() > 900 {
        return Err(f.error(&format!(
            "key {key:?}: the lock object's key is a name, not empty and not ending in `/`"
        )));
    }
    let endpoint = f.string("endpoint")?;
    if let Some(e) = &endpoint {
        let rest = e
            .strip_prefix("http://")
            .or_else(|| e.strip_prefix("https://"));
        let ok = rest.is_some_and(|r| {
            let r = r.trim_end_matches('/');
            !r.is_empty() && !r.contains(['/', '?', '#', '@'])
        });
        if !ok {
            return Err(f.error(&format!(
                "endpoint {e:?}: expected http://HOST[:PORT] or https://HOST[:PORT]"
            )));
        }
    }
    let region = f.string("region")?;
    if region
        .as_deref()
        .is_some_and(|r| r.is_empty() || !r.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    {
        return Err(f.error("`region` is a region name such as eu-central-1"));
    }
    let ca_file = f.path("ca_file")?;
    if ca_file.is_some() && endpoint.as_deref().is_some_and(|e| !e.starts_with("https://")) {
        return Err(f.error("`ca_file` needs an https:// endpoint"));
    }
    Ok(S3Config {
        bucket,
        key,
        endpoint: endpoint.map(|e| e.trim_end_matches('/').to_string()),
        region,
        ca_file,
        slot_of: None,
    })
}

/// `s3://BUCKET/KEY`: no user, no password, no port (credentials come from the AWS
/// conventions; `?endpoint=` names another server).
pub fn address(a: &Address) -> std::result::Result<toml::Table, String> {
    let refuse = || {
        "an s3:// address never carries credentials (they would show in `ps` and in logs): \
         set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), or use \
         ~/.aws/credentials with AWS_PROFILE"
            .to_string()
    };
    let auth = a.authority().map_err(|e| {
        if e.contains("password") {
            refuse()
        } else {
            e
        }
    })?;
    if auth.user.is_some() {
        return Err(refuse());
    }
    let [(bucket, None)] = auth.hosts.as_slice() else {
        return Err("an s3 address is s3://BUCKET/KEY (one bucket, no port: give the server as ?endpoint=URL)".into());
    };
    let mut t = toml::Table::new();
    t.insert("bucket".into(), bucket.clone().into());
    let key = a.path.trim_start_matches('/');
    if !key.is_empty() {
        t.insert("key".into(), key.to_string().into());
    }
    Ok(t)
}

/// The region requests are signed for.
fn region(cfg: &S3Config) -> Result<String> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(r) = cfg.region.clone().or_else(|| env("AWS_REGION")).or_else(|| env("AWS_DEFAULT_REGION")) {
        return Ok(r);
    }
    if cfg.endpoint.is_some() {
        return Ok("us-east-1".into());
    }
    Err(err!(
        Config,
        "s3 bucket `{}` on AWS needs its region: give ?region= (key `region`) or set AWS_REGION",
        cfg.bucket
    ))
}

/// The backend's client for `cfg`: credentials and region resolved, TLS set up.
pub fn client(cfg: &S3Config) -> Result<Client> {
    let creds = http::credentials()?;
    Client::new(
        cfg.endpoint.as_deref(),
        &cfg.bucket,
        &region(cfg)?,
        cfg.ca_file.as_deref(),
        creds,
    )
}

/// An object we wrote: its key and the ETag of our last write.
#[derive(Clone, Debug)]
struct Mine {
    key: String,
    etag: String,
}

/// Where the lock is, and how to talk to it: what the waiting views need besides the judge.
pub struct Site {
    cfg: S3Config,
    profile: String,
    client: Option<Client>,
    /// Bound for one request.
    timeout: Duration,
    /// While waiting: the wait's deadline, which bounds each request of a try too
    /// ([`Backend::answer_by`]).
    by: Option<Instant>,
    /// Whether we hold (a failed request is then LOST, not unavailable).
    held: bool,
}

/// An object a listing names.
#[derive(Clone, Debug)]
struct Listed {
    key: String,
    /// Its ETag as the listing gives it (quotes included, as a conditional header wants it).
    etag: Option<String>,
    /// When it was last written, on the server's clock.
    modified: Option<SystemTime>,
    /// The server's clock when it answered the page that listed it (`Date`).
    date: Option<SystemTime>,
}

/// Which objects a look lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Which {
    /// The writer object `KEY`.
    Writer,
    /// The readers under `KEY.readers/`, but ours.
    Readers,
    /// Both (status, break).
    All,
}

impl Site {
    pub fn new(cfg: S3Config, named: &Named) -> Site {
        Site {
            cfg,
            profile: named.name.clone(),
            client: None,
            timeout: named
                .common
                .stale_after
                .clamp(Duration::from_secs(2), Duration::from_secs(10)),
            by: None,
            held: false,
        }
    }

    /// The bound of a request sent now: `timeout`, and while waiting not past the wait's
    /// deadline ([`request_by`]).
    fn limit(&self) -> Duration {
        request_by(self.timeout, self.by).saturating_duration_since(Instant::now())
    }

    fn shown(&self) -> String {
        format!("s3://{}/{}", self.cfg.bucket, self.cfg.key)
    }

    fn server(&self) -> String {
        match &self.cfg.endpoint {
            Some(e) => e.clone(),
            None => format!("AWS S3 bucket {}", self.cfg.bucket),
        }
    }

    fn readers_prefix(&self) -> String {
        format!("{}.readers/", self.cfg.key)
    }

    /// The fencing state: the lock's own, for every slot of a lock with several (SPEC §3b).
    fn state_key(&self) -> String {
        format!("{}.state", self.cfg.slot_of.as_ref().unwrap_or(&self.cfg.key))
    }

    fn client(&mut self) -> Result<&Client> {
        if self.client.is_none() {
            self.client = Some(client(&self.cfg)?);
        }
        Ok(self.client.as_ref().expect("made above"))
    }

    /// One request, bounded by `limit`; 409 `ConditionalRequestConflict` (another
    /// conditional write in flight on the same key) tried again. No answer: unavailable
    /// (LOST while held).
    fn call(
        &mut self,
        method: &str,
        key: &str,
        query: &[(&str, &str)],
        cond: Cond<'_>,
        body: &[u8],
        limit: Duration,
    ) -> Result<Reply> {
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = self
                .client()?
                .call(method, key, query, cond, body, left)
                .map_err(|why| self.unreachable(method, key, why))?;
            if r.status == 409
                && r.code == "ConditionalRequestConflict"
                && Instant::now() + pause < deadline
            {
                debug!("{method} {key}: 409 ConditionalRequestConflict; again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(500));
                continue;
            }
            self.check(method, key, cond, &r)?;
            return Ok(r);
        }
    }

    fn unreachable(&self, method: &str, key: &str, why: String) -> Error {
        let kind = if self.held {
            Kind::Lost
        } else {
            Kind::Unavailable
        };
        let hint = if why.contains("certificate") || why.contains("Tls") || why.contains("TLS") {
            crate::tls::hint(self.cfg.ca_file.as_deref())
        } else {
            ""
        };
        Error::new(
            kind,
            format!("{method} {key} ({}): {why}{hint}", self.server()),
        )
    }

    /// The answers no lock step can go on from: wrong credentials (77), a missing bucket
    /// or a server that rejects conditional requests (78), a server error.
    fn check(&self, method: &str, key: &str, cond: Cond<'_>, r: &Reply) -> Result<()> {
        let server = self.server();
        match (r.status, r.code.as_str()) {
            (403, code) => Err(err!(
                Denied,
                "{method} {key} ({server}): access denied ({}): check the AWS credentials and the bucket's policy",
                if code.is_empty() { "HTTP 403" } else { code }
            )),
            (404, "NoSuchBucket") => Err(err!(
                Config,
                "bucket `{}` does not exist ({server}); locksmith never creates buckets",
                self.cfg.bucket
            )),
            (400 | 301, "AuthorizationHeaderMalformed" | "PermanentRedirect") => Err(err!(
                Config,
                "{method} {key} ({server}): {}: the bucket is in another region; give ?region= (key `region`) or AWS_REGION",
                r.what()
            )),
            (400, "NotImplemented" | "InvalidArgument" | "InvalidRequest" | "")
            | (501, _)
                if cond != Cond::None =>
            {
                Err(err!(
                Config,
                "{server} rejects the conditional header `{}` ({}, {method} {key}): it cannot hold a lock",
                cond.header(),
                r.what()
            ))
            }
            (400 | 501, _) => Err(err!(
                Config,
                "{method} {key} ({server}): the server refused the request: {}",
                r.what()
            )),
            (s, _) if s >= 500 => Err(Error::new(
                if self.held { Kind::Lost } else { Kind::Unavailable },
                format!("{method} {key} ({server}): {}", r.what()),
            )),
            (301 | 307, _) => Err(err!(
                Config,
                "{method} {key} ({server}): the bucket is in another region ({}); give ?region=",
                r.what()
            )),
            _ => Ok(()),
        }
    }

    /// An object's evidence from a GET: its record, ETag, age on the server's clock.
    fn evidence(&mut self, key: &str, mode: Mode) -> Result<Option<Evidence>> {
        let limit = self.limit();
        let r = self.call("GET", key, &[], Cond::None, &[], limit)?;
        if r.status == 404 {
            return Ok(None);
        }
        if !r.ok() {
            return Err(self.odd("GET", key, &r));
        }
        Ok(Some(Evidence {
            key: key.into(),
            record: Record::parse_whole(&r.text()),
            sign: r.etag.clone().unwrap_or_default().into_bytes(),
            mode,
            age: r.age(),
        }))
    }

    /// An answer the step did not expect.
    fn odd(&self, method: &str, key: &str, r: &Reply) -> Error {
        Error::new(
            if self.held {
                Kind::Lost
            } else {
                Kind::Unavailable
            },
            format!(
                "{method} {key} ({}): unexpected answer {}",
                self.server(),
                r.what()
            ),
        )
    }

    /// The keys under `prefix`, every page.
    fn list(&mut self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.listing(prefix)?.into_iter().map(|l| l.key).collect())
    }

    /// The objects under `prefix`, every page.
    fn listing(&mut self, prefix: &str) -> Result<Vec<Listed>> {
        let mut listed = Vec::new();
        let mut token = String::new();
        let limit = self.limit();
        loop {
            let mut q = vec![("list-type", "2"), ("prefix", prefix)];
            if !token.is_empty() {
                q.push(("continuation-token", token.as_str()));
            }
            let r = self.call("GET", "", &q, Cond::None, &[], limit)?;
            if !r.ok() {
                return Err(self.odd("LIST", prefix, &r));
            }
            let text = r.text();
            listed.extend(http::blocks(&text, "Contents").into_iter().filter_map(|b| {
                Some(Listed {
                    key: http::tag(b, "Key")?,
                    etag: http::tag(b, "ETag"),
                    modified: http::tag(b, "LastModified")
                        .and_then(|t| humantime::parse_rfc3339_weak(&t).ok()),
                    date: r.date,
                })
            }));
            match http::tag(&text, "NextContinuationToken") {
                Some(t) if http::tag(&text, "IsTruncated").as_deref() == Some("true") => {
                    token = t;
                }
                _ => return Ok(listed),
            }
        }
    }

    fn look(&mut self, which: Which, ours: Option<&str>) -> Result<Option<Vec<Evidence>>> {
        let mut list = Vec::new();
        if which != Which::Readers {
            let key = self.cfg.key.clone();
            if let Some(ev) = self.evidence(&key, Mode::Exclusive)? {
                list.push(ev);
            }
        }
        if which != Which::Writer {
            let prefix = self.readers_prefix();
            for key in self.list(&prefix)? {
                if Some(key.as_str()) == ours {
                    continue;
                }
                if let Some(ev) = self.evidence(&key, Mode::Shared)? {
                    list.push(ev);
                }
            }
        }
        Ok((!list.is_empty()).then_some(list))
    }

    /// Deletes exactly the version `ev` saw: `false` if it changed or went meanwhile.
    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        let key = ev.key.to_string_lossy().into_owned();
        let etag = String::from_utf8_lossy(&ev.sign).into_owned();
        let limit = self.limit();
        let r = self.call("DELETE", &key, &[], Cond::Is(&etag), &[], limit)?;
        match r.status {
            200 | 204 => Ok(true),
            404 | 412 => Ok(false),
            _ => Err(self.odd("DELETE", &key, &r)),
        }
    }

    /// The fencing state and its ETag (`None`: none yet, or none whole: [`StateRead::cut`]).
    fn state(&mut self) -> Result<(Option<State>, Option<String>)> {
        self.state_by().map(|r| (r.state, r.etag))
    }

    /// [`Site::state`], the nonce of the acquisition that wrote it (`by=`), if named, and
    /// whether what is there is a state cut short.
    fn state_by(&mut self) -> Result<StateRead> {
        let key = self.state_key();
        let limit = self.limit();
        let r = self.call("GET", &key, &[], Cond::None, &[], limit)?;
        let mut read = StateRead::default();
        if r.status == 404 {
            return Ok(read);
        }
        if !r.ok() {
            return Err(self.odd("GET", &key, &r));
        }
        let text = r.text();
        read.etag = r.etag.clone();
        // Every state we write is `state~…` and ends with a newline: cut short, a swap was
        // killed mid-request and the server kept what it got (SeaweedFS keeps an empty
        // object; the S3 kill -9 soak found one, and every later take was refused 78).
        if cut_short(&text, "state~") {
            read.cut = r.date.or(Some(std::time::SystemTime::UNIX_EPOCH));
            return Ok(read);
        }
        let by = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("by="))
            .map(str::to_string);
        // The entry is the first line; a second, `by=NONCE`, names the acquisition that
        // issued it ([`S3::take_token`]).
        match parse_state_entry(r.text().lines().next().unwrap_or_default().trim()) {
            Some(s) if s.token < u64::MAX => Ok(StateRead {
                state: Some(s),
                by,
                ..read
            }),
            _ => Err(err!(
                Config,
                "lock state {} ({}) says {:?}: this locksmith cannot issue a fencing token after it; if no other locksmith version uses this lock, delete the object (tokens then start again at 1)",
                key,
                self.server(),
                crate::error::one_line(&r.text(), 80)
            )),
        }
    }
}

/// The lock's fencing state as read ([`Site::state_by`]).
#[derive(Default)]
struct StateRead {
    /// `None`: no state yet, or none whole.
    state: Option<State>,
    etag: Option<String>,
    /// The acquisition that issued it (`by=NONCE`).
    by: Option<String>,
    /// A state cut short (a swap killed mid-request on a server that kept what it got),
    /// with the server's clock when it said so: the last token is lost, and the next starts
    /// again from the clock — the later of ours and the server's, so that hosts whose clocks
    /// disagree restart above one another while the server's does not go back — above
    /// every token counted from 1 (`token_from=clock`), over exactly this object
    /// (`If-Match`).
    cut: Option<std::time::SystemTime>,
}

/// The objects a waiter judges, as [`stale`] sees them.
struct View<'a> {
    site: &'a mut Site,
    which: Which,
    ours: Option<String>,
}

impl Holders for View<'_> {
    fn holders(&mut self) -> Result<Option<Vec<Evidence>>> {
        self.site.look(self.which, self.ours.as_deref())
    }

    fn remove(&mut self, ev: &Evidence) -> Result<bool> {
        self.site.remove(ev)
    }
}

pub struct S3 {
    site: Site,
    mode: Mode,
    heartbeat: Duration,
    stale_after: Duration,
    judge: Judge,
    wake: Wakeups,
    record: Record,
    beats: u64,
    /// Our object, once written.
    mine: Option<Mine>,
    /// The key of a create of ours that got no answer (it may have landed): the next create
    /// finds it by our nonce, and dropping the backend removes it if it is there.
    unsure: Option<String>,
    /// The state's ETag after our swap (a writer's clean release swaps it again).
    state_etag: Option<String>,
    /// The token our swap took, and whether the state was dirty before it.
    taken: Option<(u64, bool)>,
    /// Our swap started a state cut short again from the clock ([`StateRead::cut`]).
    token_from_clock: bool,
    /// A swap sent and not answered yet (or whose answer was lost): its token, and whether
    /// the state was dirty before it.
    swapping: Option<(u64, bool)>,
    token: Option<u64>,
    /// When our last write was sent.
    written: Option<Instant>,
    /// The lock's number of slots (SPEC §3b), recorded in the state with each token.
    slots: u32,
    /// What to ask before issuing over another recorded number of slots.
    agree: Option<Agree>,
}

impl S3 {
    pub fn new(cfg: S3Config, named: &Named) -> S3 {
        let shown = PathBuf::from(format!("s3://{}/{}", cfg.bucket, cfg.key));
        S3 {
            site: Site::new(cfg, named),
            mode: named.common.mode(),
            heartbeat: named.common.heartbeat(),
            stale_after: named.common.stale_after,
            judge: Judge::new(named, shown, false),
            wake: Wakeups::default(),
            record: Record::ours(&named.name),
            beats: 0,
            mine: None,
            unsure: None,
            state_etag: None,
            taken: None,
            token_from_clock: false,
            swapping: None,
            token: None,
            written: None,
            slots: named.common.slots.max(1),
            agree: None,
        }
    }

    /// Our object's key.
    fn our_key(&self) -> String {
        match self.mode {
            Mode::Exclusive => self.site.cfg.key.clone(),
            Mode::Shared => format!("{}{}", self.site.readers_prefix(), self.record.nonce),
        }
    }

    /// The next body of our object: the owner record, a new beat.
    fn next_body(&mut self) -> Vec<u8> {
        self.beats += 1;
        self.record.render_beat(self.beats).into_bytes()
    }

    /// Creates our object (`If-None-Match: *`); `false`: it exists (someone else's).
    fn create(&mut self) -> Result<bool> {
        let key = self.our_key();
        let body = self.next_body();
        let limit = self.site.limit();
        let sent = Instant::now();
        // Unanswered (or a 5xx: a gateway's timeout), it may still land: remembered until an
        // answer settles it. Refused (403, 400…), it did not.
        self.unsure = Some(key.clone());
        let r = self
            .site
            .call("PUT", &key, &[], Cond::Absent, &body, limit)
            .inspect_err(|e| {
                if e.kind() != Kind::Unavailable {
                    self.unsure = None;
                }
            })?;
        self.written = Some(sent);
        match r.status {
            200 | 201 | 204 => {
                let etag = r.etag.unwrap_or_default();
                self.mine = Some(Mine { key, etag });
                self.unsure = None;
                Ok(true)
            }
            // Ours after all? A create whose answer was lost (a timeout) and is tried again
            // finds its own object: the record's nonce says so.
            412 => self.adopt(&key, limit),
            _ => Err(self.site.odd("PUT", &key, &r)),
        }
    }

    /// Whether the object at `key` is ours — written by a create of ours whose answer was
    /// lost, as the owner record's nonce says (no one else writes our nonce: a breaker
    /// deletes, a successor writes its own) — and if so, takes it as `mine`. Either way the
    /// unanswered create is settled: the key holds one object, ours or not.
    fn adopt(&mut self, key: &str, limit: Duration) -> Result<bool> {
        let r = self.site.call("GET", key, &[], Cond::None, &[], limit)?;
        if r.status == 404 {
            // Gone meanwhile: whatever was there, nothing of ours is.
            self.unsure = None;
            return Ok(false);
        }
        if !r.ok() {
            return Err(self.site.odd("GET", key, &r));
        }
        self.unsure = None;
        let ours = matches!(
            Record::parse(&r.text()),
            super::owner::Parsed::V1(rec) if rec.nonce == self.record.nonce
        );
        if ours {
            let etag = r.etag.clone().unwrap_or_default();
            self.mine = Some(Mine {
                key: key.to_string(),
                etag,
            });
        }
        Ok(ours)
    }

    /// Rewrites our object with a new beat, `If-Match` our last ETag, within `limit`.
    /// `Ok(false)`: it is no longer ours (changed or gone).
    fn rewrite(&mut self, limit: Duration) -> Result<bool> {
        let Some(mine) = self.mine.clone() else {
            return Ok(false);
        };
        let body = self.next_body();
        let sent = Instant::now();
        let r = self
            .site
            .call("PUT", &mine.key, &[], Cond::Is(&mine.etag), &body, limit)?;
        match r.status {
            200 | 201 | 204 => {
                self.written = Some(sent);
                self.mine = Some(Mine {
                    key: mine.key,
                    etag: r.etag.unwrap_or_default(),
                });
                Ok(true)
            }
            412 | 404 => {
                // Our own earlier write may have landed without its answer reaching us (a
                // timed-out heartbeat): the object then carries our nonce, and only we write
                // it — a breaker deletes, a successor writes its own.
                if self.adopt(&mine.key, limit)? {
                    return self.rewrite(limit);
                }
                Ok(false)
            }
            _ => Err(self.site.odd("PUT", &mine.key, &r)),
        }
    }

    /// Deletes our object if it is still ours (best effort when giving up).
    fn withdraw(&mut self, limit: Duration) -> Result<bool> {
        let Some(mine) = self.mine.take() else {
            return Ok(true);
        };
        let r = self
            .site
            .call("DELETE", &mine.key, &[], Cond::Is(&mine.etag), &[], limit)?;
        Ok(matches!(r.status, 200 | 204))
    }

    /// Takes the next fencing token: the state swapped to `dirty N+1`. The token, and
    /// whether the last writer's release was not clean. With several slots (SPEC §3b) every
    /// slot's holder swaps the lock's one state, which records the issuer's number of slots:
    /// another number recorded is the lock's say first ([`Agree`]), and the swap is then
    /// made over exactly the state that was judged; a lost swap is another slot's holder's
    /// (each 412 is someone else's success), and we read again. A slot leaves the clean mark
    /// as it was (its holders release in any order: none can say the last acquisition ended
    /// cleanly; `prev=crashed` is each slot's own), as the other backends' slots do.
    fn take_token(&mut self) -> Result<(u64, bool)> {
        let key = self.site.state_key();
        let limit = self.site.limit();
        let several = self.slots > 1;
        let rounds = if several { 200 } else { 20 };
        for round in 0..rounds {
            if several && round > 0 {
                // Contention between slots: a short jittered pause, not a doubling one.
                std::thread::sleep(Duration::from_micros(fastrand::u64(500..5_000)));
            }
            let StateRead {
                state,
                etag,
                by,
                cut,
            } = self.site.state_by()?;
            // A try that took a token and then got no answer: if the state is still exactly
            // our swap, no token was issued since, and ours is still the newest — taken
            // again, it would be counted twice and say prev=crashed of our own dirty mark.
            if let Some(t) = self.taken
                && etag.is_some()
                && etag == self.state_etag
            {
                return Ok(t);
            }
            // The same for a swap whose own answer was lost (it timed out, or the connection
            // closed): the state names the acquisition that issued it, and the token and mark
            // we read before it are kept (issue 27: it said a false prev=crashed).
            if let (Some((t, dirty)), Some(st)) = (self.swapping, state)
                && by.as_deref() == Some(self.record.nonce.as_str())
                && st.token == t
            {
                self.state_etag = etag;
                self.taken = Some((t, dirty));
                self.swapping = None;
                return Ok((t, dirty));
            }
            if let (Some(st), Some(agree)) = (state, &self.agree)
                && st.slots() != self.slots
            {
                agree(st.slots())?;
            }
            // The number of slots the state recorded is lost with it: whoever holds where a
            // contender of our number would not (the lock itself, a slot beyond ours) is
            // asked about as one of another number.
            if cut.is_some()
                && let Some(agree) = &self.agree
            {
                agree(0)?;
            }
            let token = match cut {
                Some(server) => {
                    let server = server
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(0));
                    super::lockdir::state::floor().max(server) + 1
                }
                None => next_token(state),
            };
            let next = State {
                token,
                clean: several && state.is_none_or(|s| s.clean),
                slots: self.slots,
            };
            let body = format!("{}\nby={}\n", state_entry(next), self.record.nonce);
            let cond = etag.as_deref().map_or(Cond::Absent, Cond::Is);
            // A state cut short was cut by an acquisition killed mid-swap.
            let dirty = !several && (cut.is_some() || state.is_some_and(|s| !s.clean));
            // Until an answer settles it, this swap may have landed.
            self.swapping = Some((token, dirty));
            self.token_from_clock = cut.is_some();
            let r = self
                .site
                .call("PUT", &key, &[], cond, body.as_bytes(), limit)?;
            self.swapping = None;
            match r.status {
                200 | 201 | 204 => {
                    self.state_etag = r.etag;
                    self.taken = Some((token, dirty));
                    return Ok((token, dirty));
                }
                412 | 404 => {
                    debug!("lock state {key} moved on from {state:?}: reading it again");
                    continue;
                }
                _ => return Err(self.site.odd("PUT", &key, &r)),
            }
        }
        Err(err!(
            Unavailable,
            "the fencing state {key} ({}) kept changing under us",
            self.site.server()
        ))
    }

    /// Judges the objects `which` and removes the dead and silent; `Ok(None)`: none left.
    fn clear(&mut self, which: Which) -> Result<Option<Vec<Holder>>> {
        let ours = self.mine.as_ref().map(|m| m.key.clone());
        let mut view = View {
            site: &mut self.site,
            which,
            ours,
        };
        self.judge.clear_dead(&mut view, &mut self.wake)
    }

    /// One try (see the module's documentation).
    fn attempt(&mut self) -> Result<Tried> {
        for _ in 0..4 {
            let tried = match self.mode {
                Mode::Exclusive => self.attempt_writer()?,
                Mode::Shared => self.attempt_reader()?,
            };
            if let Some(t) = tried {
                return Ok(t);
            }
        }
        // Kept changing under us: busy for now, the wait tries again.
        Ok(Tried::Busy(vec![Holder::default()]))
    }

    /// `None`: something changed; look again.
    fn attempt_writer(&mut self) -> Result<Option<Tried>> {
        if self.mine.is_none() {
            if !self.create()? {
                return Ok(self.clear(Which::Writer)?.map(Tried::Busy));
            }
            debug!("created {}", self.site.shown());
        } else if self.judge_due() && !self.rewrite(self.site.limit())? {
            // Our waiting object was broken (we stalled): queue again.
            info!("our object {} was taken away; trying again", self.site.shown());
            self.mine = None;
            return Ok(None);
        }
        // We have KEY: no reader gets in any more. Readers left must go first.
        if let Some(live) = self.clear(Which::Readers)? {
            return Ok(Some(Tried::Busy(live)));
        }
        let (token, dirty) = self.take_token()?;
        self.record.token = Some(token);
        // Confirms the object is still ours, and writes its token for status and break.
        if !self.rewrite(self.site.limit())? {
            self.mine = None;
            self.record.token = None;
            return Ok(None);
        }
        self.token = Some(token);
        self.site.held = true;
        let mut grant = self.judge.grant(&mut self.wake, Some(token));
        grant.prev_crashed |= dirty;
        grant.token_from_clock = self.token_from_clock;
        Ok(Some(Tried::Took(grant)))
    }

    /// A waiting writer's object is rewritten once a heartbeat period has passed since
    /// our last write, so that it never looks stale while we wait for readers to leave.
    fn judge_due(&self) -> bool {
        self.written.is_none_or(|t| t.elapsed() >= self.heartbeat)
    }

    fn attempt_reader(&mut self) -> Result<Option<Tried>> {
        if self.mine.is_none() && !self.create()? {
            // Our nonce's name exists: a new nonce.
            self.record.nonce = crate::host::nonce();
            return Ok(None);
        }
        let key = self.site.cfg.key.clone();
        let limit = self.site.limit();
        let r = self.site.call("HEAD", &key, &[], Cond::None, &[], limit)?;
        match r.status {
            404 => {
                let (state, _) = self.site.state()?;
                self.site.held = true;
                let epoch = state.map(|s| s.token);
                let mut grant = self.judge.grant(&mut self.wake, epoch);
                grant.recorded_slots = Some(state.map_or(1, |s| s.slots()));
                Ok(Some(Tried::Took(grant)))
            }
            200 => {
                // A writer holds or waits: step back, then judge it.
                self.withdraw(limit)?;
                Ok(self.clear(Which::Writer)?.map(Tried::Busy))
            }
            _ => Err(self.site.odd("HEAD", &key, &r)),
        }
    }
}

impl Drop for S3 {
    /// A waiter that gives up takes its object away (a writer's waiting `KEY`, a reader's
    /// name); a holder's was released already.
    fn drop(&mut self) {
        let limit = Duration::from_secs(2);
        if self.mine.is_none()
            && let Some(key) = self.unsure.clone()
            && let Err(e) = self.adopt(&key, limit)
        {
            info!(
                "a create of {key} got no answer and may have landed; if it did, it stays until it is stale ({e})"
            );
        }
        if self.mine.is_some()
            && let Err(e) = self.withdraw(limit)
        {
            debug!("cannot take our object away: {e}");
        }
    }
}

impl Backend for S3 {
    fn name(&self) -> &'static str {
        "s3"
    }

    /// A try whose server did not answer comes back with the backend (its nonce, an unsure
    /// create): the next try recognises a write of ours that landed ([`S3::adopt`]).
    fn try_acquire(mut self: Box<Self>) -> Result<Attempt> {
        let tried = self.attempt();
        if matches!(tried, Ok(Tried::Took(_))) {
            self.site.by = None;
        }
        Tried::or_unanswered(tried, self)
    }

    fn answer_by(&mut self, by: Option<Instant>) {
        self.site.by = by;
    }

    fn prepare_wait(&mut self) -> Result<WaitHint> {
        Ok(WaitHint { poll: true, catches_release: false })
    }

    fn agree_on_slots(&mut self, agree: Agree) {
        self.agree = Some(agree);
    }

    fn recorded_slots(&mut self) -> Result<Option<u32>> {
        let (state, _) = self.site.state()?;
        Ok(Some(state.map_or(1, |s| s.slots())))
    }

    /// One ListObjectsV2 with the prefix `KEY.slot-` (a page per 1000 keys): slot K is
    /// present while `KEY.slot-K` or a reader under `KEY.slot-K.readers/` is listed. A
    /// superset of the slots held throughout the listing only on a server whose listing is
    /// consistent with its writes (AWS S3 since 2020, SeaweedFS: an object put before the
    /// listing is in it); on one that lists late a place can be missed, and a fair line's
    /// order with it. A fair line's places (`fair.rs`) were otherwise read one object each.
    fn slots_present(&mut self, n: u32) -> Result<Option<Vec<u32>>> {
        let base = format!("{}.slot-", self.site.cfg.key);
        let mut v: Vec<u32> = self
            .site
            .list(&base)?
            .iter()
            .filter_map(|key| {
                let rest = key.strip_prefix(&base)?;
                // The object itself, or one of its readers.
                super::slots::slot_named(rest, n, |t| t.is_empty() || t.starts_with(".readers/"))
            })
            .collect();
        v.sort_unstable();
        v.dedup();
        Ok(Some(v))
    }

    fn wake_fds(&self) -> Vec<BorrowedFd<'_>> {
        self.wake.fds()
    }

    fn status(&mut self) -> Result<Vec<Holder>> {
        let stale_after = self.stale_after;
        Ok(self
            .site
            .look(Which::All, None)?
            .unwrap_or_default()
            .iter()
            .map(|ev| ev.judged(stale_after))
            .collect())
    }

    fn break_lock(&mut self, how: Break, watcher: &mut Watcher) -> Result<BreakOutcome> {
        let mut view = View {
            site: &mut self.site,
            which: Which::All,
            ours: None,
        };
        self.judge.break_lock(&mut view, how, watcher)
    }
}

impl S3 {
    fn not_ours(&self) -> Error {
        err!(
            Lost,
            "lock {} ({}) was no longer ours at release (broken as stale, or by `break`); its object was left alone",
            self.site.shown(),
            self.site.server()
        )
    }
}

impl Beats for S3 {
    fn period(&self) -> Duration {
        self.heartbeat
    }

    fn beat(&mut self, deadline: Instant) -> Result<()> {
        let limit = deadline.saturating_duration_since(Instant::now());
        // A request that gets no answer is worth another try (not LOST yet): the holding
        // policy retries until the lease's point of no return.
        self.site.held = false;
        let r = self.rewrite(limit);
        self.site.held = true;
        match r {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.mine = None;
                Err(err!(
                    Lost,
                    "lock {} ({}) was broken (its object changed or went: a waiter judged it stale); someone else may hold it now",
                    self.site.shown(),
                    self.site.server()
                ))
            }
            Err(e) => Err(e),
        }
    }

    fn free(&mut self) -> Result<()> {
        let limit = self.site.limit();
        self.site.held = false;
        self.taken = None;
        let Some(mine) = self.mine.clone() else {
            return Err(self.not_ours());
        };
        // A slot of several never marks the state clean (see `take_token`).
        if let (Some(t), Some(etag), 1) = (self.token, self.state_etag.clone(), self.slots) {
            // Still ours? A holder whose object was broken (paused past stale_after, or
            // `break --force`) must leave the state dirty: its successor says prev=crashed.
            let r = self
                .site
                .call("HEAD", &mine.key, &[], Cond::Is(&mine.etag), &[], limit)?;
            if matches!(r.status, 404 | 412) {
                self.mine = None;
                self.token = None;
                return Err(self.not_ours());
            }
            // The clean mark first, and only over our own dirty mark: a successor's state
            // is never touched.
            let key = self.site.state_key();
            let body = format!("{}\n", state_entry(State::one(t, true)));
            let r = self
                .site
                .call("PUT", &key, &[], Cond::Is(&etag), body.as_bytes(), limit)?;
            if r.ok() {
                self.state_etag = r.etag;
            } else {
                info!(
                    "cannot mark the clean release ({}); the next holder may see prev=crashed",
                    r.what()
                );
            }
            self.token = None;
        }
        let r = self
            .site
            .call("DELETE", &mine.key, &[], Cond::Is(&mine.etag), &[], limit)?;
        match r.status {
            200 | 204 => {
                self.mine = None;
                Ok(())
            }
            404 | 412 => {
                self.mine = None;
                Err(self.not_ours())
            }
            _ => Err(self.site.odd("DELETE", &mine.key, &r)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Common;

    fn site() -> Site {
        let cfg = S3Config {
            bucket: "locks".into(),
            key: "a/b".into(),
            endpoint: Some("http://127.0.0.1:9".into()),
            region: None,
            ca_file: None,
            slot_of: None,
        };
        Site::new(
            cfg,
            &Named {
                name: "p".into(),
                common: Common::builtin(),
                acquisition: "0123456789abcdef".into(),
            },
        )
    }

    fn reply(status: u16, code: &str) -> Reply {
        Reply {
            status,
            code: code.into(),
            ..Reply::default()
        }
    }

    /// What each answer means: the exit code and the words a user needs.
    #[test]
    fn answers_are_told_apart() {
        let mut s = site();
        let e = s
            .check("PUT", "a/b", Cond::Absent, &reply(403, "SignatureDoesNotMatch"))
            .unwrap_err();
        assert_eq!(e.kind(), Kind::Denied);
        let e = s
            .check("GET", "a/b", Cond::None, &reply(404, "NoSuchBucket"))
            .unwrap_err();
        assert_eq!(e.kind(), Kind::Config);
        assert!(e.message().contains("`locks`"), "{e}");
        for (status, code, cond, header) in [
            (501, "NotImplemented", Cond::Absent, "If-None-Match"),
            (400, "InvalidArgument", Cond::Is("\"x\""), "If-Match"),
            (400, "", Cond::Absent, "If-None-Match"),
        ] {
            let e = s.check("PUT", "a/b", cond, &reply(status, code)).unwrap_err();
            assert_eq!(e.kind(), Kind::Config);
            assert!(e.message().contains(&format!("`{header}`")), "{e}");
        }
        let e = s
            .check("PUT", "a/b", Cond::Absent, &reply(400, "AuthorizationHeaderMalformed"))
            .unwrap_err();
        assert!(e.message().contains("region"), "{e}");
        // Not errors: the steps read them.
        for st in [200, 204, 404, 409, 412] {
            s.check("PUT", "a/b", Cond::Absent, &reply(st, "")).unwrap();
        }
        assert_eq!(
            s.check("PUT", "a/b", Cond::None, &reply(503, "SlowDown"))
                .unwrap_err()
                .kind(),
            Kind::Unavailable
        );
        s.held = true;
        assert_eq!(
            s.check("PUT", "a/b", Cond::None, &reply(503, "SlowDown"))
                .unwrap_err()
                .kind(),
            Kind::Lost
        );
    }

    #[test]
    fn an_address_never_carries_credentials() {
        for text in ["s3://AKID:secret@b/k", "s3://AKID@b/k", "s3://:s@b/k"] {
            let a = Address::parse(text, &["s3"]).unwrap();
            let e = address(&a).unwrap_err();
            assert!(!e.contains("secret") || !e.contains("AKID"), "{e}");
            assert!(e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        }
        let a = Address::parse("s3://b/k/x", &["s3"]).unwrap();
        let t = address(&a).unwrap();
        assert_eq!(t["bucket"].as_str(), Some("b"));
        assert_eq!(t["key"].as_str(), Some("k/x"));
    }
}
