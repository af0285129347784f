//! The S3 wire: AWS Signature Version 4 over a small synchronous HTTP/1.1 client (ureq on
//! the rustls already linked, certificates verified by [`crate::tls`]), the AWS credential
//! conventions, and the few bits of S3's XML and HTTP dates the backend reads.
//!
//! Nothing here decides anything about locks: a request goes out, a [`Reply`] (status, the
//! headers the backend reads, the error `Code`) or a transport failure comes back.

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

use crate::error::{Result, err};
use crate::settings::Hidden;

/// The most of a reply's body read (an owner record, a listing page, an error).
const BODY_CAP: u64 = 4 << 20;

/// AWS credentials, found as the AWS tools find them.
#[derive(Clone)]
pub struct Creds {
    pub access_key: String,
    secret: Hidden,
    token: Option<Hidden>,
    /// Where they came from, for messages (never the secret).
    pub from: String,
}

impl Creds {
    /// Credentials given as they are (the tests' fixture, which makes its bucket).
    pub fn new(access_key: &str, secret: &str) -> Creds {
        Creds {
            access_key: access_key.into(),
            secret: Hidden(secret.into()),
            token: None,
            from: "given".into(),
        }
    }
}

/// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`) from the
/// environment, else the `AWS_PROFILE` (default `default`) section of
/// `AWS_SHARED_CREDENTIALS_FILE` or `~/.aws/credentials`. None found: a config error saying
/// where it looked.
pub fn credentials() -> Result<Creds> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let (Some(a), Some(s)) = (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
        return Ok(Creds {
            access_key: a,
            secret: Hidden(s),
            token: env("AWS_SESSION_TOKEN").map(Hidden),
            from: "$AWS_ACCESS_KEY_ID".into(),
        });
    }
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let file = env("AWS_SHARED_CREDENTIALS_FILE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".aws/credentials")));
    let missing = |why: &str| {
        err!(
            Config,
            "no AWS credentials: {why}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or a \
             [{profile}] section in ~/.aws/credentials (AWS_PROFILE picks the section, \
             AWS_SHARED_CREDENTIALS_FILE the file); an s3:// address never carries them"
        )
    };
    let Some(file) = file else {
        return Err(missing("$AWS_ACCESS_KEY_ID is not set and $HOME is unknown"));
    };
    if !file.exists() {
        return Err(missing(&format!(
            "$AWS_ACCESS_KEY_ID is not set and {} does not exist",
            file.display()
        )));
    }
    let text = crate::files::read_regular(&file, "AWS credentials file", 1 << 20)?;
    let text = String::from_utf8_lossy(&text);
    let mut section = String::new();
    let (mut a, mut s, mut t) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_string();
            continue;
        }
        if section != profile {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            let v = v.trim().to_string();
            match k.trim() {
                "aws_access_key_id" => a = Some(v),
                "aws_secret_access_key" => s = Some(v),
                "aws_session_token" => t = Some(v),
                _ => {}
            }
        }
    }
    match (a, s) {
        (Some(a), Some(s)) => Ok(Creds {
            access_key: a,
            secret: Hidden(s),
            token: t.map(Hidden),
            from: format!("[{profile}] of {}", file.display()),
        }),
        _ => Err(missing(&format!(
            "{} has no [{profile}] section with aws_access_key_id and aws_secret_access_key",
            file.display()
        ))),
    }
}

/// A condition on a write or a delete.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cond<'a> {
    None,
    /// `If-None-Match: *`: only if the object does not exist.
    Absent,
    /// `If-Match: ETAG`: only if the object is still this version.
    Is(&'a str),
}

impl Cond<'_> {
    /// The header it sends, for messages.
    pub fn header(&self) -> &'static str {
        match self {
            Cond::None => "",
            Cond::Absent => "If-None-Match",
            Cond::Is(_) => "If-Match",
        }
    }
}

/// What the server answered.
#[derive(Clone, Debug, Default)]
pub struct Reply {
    pub status: u16,
    pub etag: Option<String>,
    pub last_modified: Option<SystemTime>,
    /// The server's clock when it answered (`Date`).
    pub date: Option<SystemTime>,
    pub body: Vec<u8>,
    /// The error's `<Code>`, if the body says one.
    pub code: String,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// How long ago, on the server's clock, the object was last written: whole seconds both
    /// (`Date` and `Last-Modified`), so one second less than their difference — never more
    /// than the truth.
    pub fn age(&self) -> Option<Duration> {
        let (lm, date) = (self.last_modified?, self.date?);
        Some(
            date.duration_since(lm)
                .unwrap_or_default()
                .saturating_sub(Duration::from_secs(1)),
        )
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `CODE` or `HTTP NNN`, for messages.
    pub fn what(&self) -> String {
        if self.code.is_empty() {
            format!("HTTP {}", self.status)
        } else {
            format!("HTTP {} {}", self.status, self.code)
        }
    }
}

/// Where requests go and how they are signed.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    /// TLS for `https` endpoints (kept to build another agent: [`Client::unpooled`]).
    tls: Option<Arc<Tls>>,
    /// `scheme://host[:port]` of every request.
    base: String,
    /// The `Host` header (signed).
    host: String,
    /// The path prefix: `/BUCKET` for path-style requests, empty for virtual-host style.
    prefix: String,
    region: String,
    creds: Creds,
}

impl Client {
    /// A client of `bucket` at `endpoint` (path style) or at AWS in `region` (virtual-host
    /// style); `https` verified against `ca_file` or the system CAs.
    pub fn new(
        endpoint: Option<&str>,
        bucket: &str,
        region: &str,
        ca_file: Option<&std::path::Path>,
        creds: Creds,
    ) -> Result<Client> {
        let (base, prefix) = match endpoint {
            Some(e) => (e.trim_end_matches('/').to_string(), format!("/{}", encode(bucket, true))),
            None => (format!("https://{bucket}.s3.{region}.amazonaws.com"), String::new()),
        };
        let host = base.split_once("://").map_or("", |(_, h)| h).to_string();
        let tls = if base.starts_with("https://") {
            let config = crate::tls::client_config(ca_file, true)?;
            Some(Arc::new(Tls(Arc::new(config))))
        } else {
            None
        };
        Ok(Client {
            agent: agent(tls.as_ref(), true),
            tls,
            base,
            host,
            prefix,
            region: region.to_string(),
            creds,
        })
    }

    /// One request on object `key` (empty: the bucket), bounded by `limit`. `Err`: no
    /// answer (connection refused, TLS, timeout), with why.
    pub fn call(
        &self,
        method: &str,
        key: &str,
        query: &[(&str, &str)],
        cond: Cond<'_>,
        body: &[u8],
        limit: Duration,
    ) -> std::result::Result<Reply, String> {
        let path = if key.is_empty() {
            format!("{}/", self.prefix)
        } else {
            format!("{}/{}", self.prefix, encode(key, false))
        };
        let mut q: Vec<(String, String)> = query
            .iter()
            .map(|(k, v)| (encode(k, true), encode(v, true)))
            .collect();
        q.sort();
        let qs = q
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("&");
        let now = SystemTime::now();
        let stamp = humantime::format_rfc3339_seconds(now)
            .to_string()
            .replace(['-', ':'], "");
        let day = &stamp[..8];
        let payload = hex(&Sha256::digest(body));
        let mut headers = vec![
            ("host", self.host.clone()),
            ("x-amz-content-sha256", payload.clone()),
            ("x-amz-date", stamp.clone()),
        ];
        if let Some(t) = &self.creds.token {
            headers.push(("x-amz-security-token", t.0.clone()));
        }
        let signed = headers.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(";");
        let canonical = format!(
            "{method}\n{path}\n{qs}\n{}\n{signed}\n{payload}",
            headers
                .iter()
                .map(|(k, v)| format!("{k}:{}\n", v.trim()))
                .collect::<String>()
        );
        let scope = format!("{day}/{}/s3/aws4_request", self.region);
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{stamp}\n{scope}\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut k = hmac(format!("AWS4{}", self.creds.secret.0).as_bytes(), day.as_bytes());
        for part in [self.region.as_bytes(), b"s3", b"aws4_request"] {
            k = hmac(&k, part);
        }
        let signature = hex(&hmac(&k, to_sign.as_bytes()));
        let auth = format!(
            "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
            self.creds.access_key
        );
        let url = if qs.is_empty() {
            format!("{}{path}", self.base)
        } else {
            format!("{}{path}?{qs}", self.base)
        };
        let mut req = self
            .agent
            .request(method, &url)
            .timeout(limit.max(Duration::from_millis(1)))
            .set("Authorization", &auth);
        for (k, v) in headers.iter().skip(1) {
            req = req.set(k, v);
        }
        match cond {
            Cond::None => {}
            Cond::Absent => req = req.set("If-None-Match", "*"),
            Cond::Is(etag) => req = req.set("If-Match", etag),
        }
        let r = if method == "PUT" {
            req.send_bytes(body)
        } else {
            req.call()
        };
        let resp = match r {
            Ok(resp) => resp,
            Err(ureq::Error::Status(_, resp)) => resp,
            Err(ureq::Error::Transport(t)) => return Err(transport(&t)),
        };
        let date = |h: &str| resp.header(h).and_then(http_date);
        let mut reply = Reply {
            status: resp.status(),
            etag: resp.header("ETag").map(str::to_string),
            last_modified: date("Last-Modified"),
            date: date("Date"),
            ..Reply::default()
        };
        if method != "HEAD" {
            let _ = resp
                .into_reader()
                .take(BODY_CAP)
                .read_to_end(&mut reply.body);
        }
        if !reply.ok() {
            reply.code = tag(&reply.text(), "Code").unwrap_or_default();
        }
        Ok(reply)
    }

    /// `scheme://host[:port]`, for messages.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The same client, every request on a connection of its own. For requests that follow
    /// a refusal within microseconds (`verify`): a server that answers a conditional write's
    /// 412 before reading its body (hyper's, as in s3s-fs) closes that connection just after
    /// the answer; ureq's look for a closed connection before reusing one can run before the
    /// close arrives, and a PUT with a body is not sent again (ureq 2 repeats only bodiless
    /// requests), so the next PUT failed with "Unexpected EOF" (the stop's CI of session 19).
    pub fn unpooled(&self) -> Client {
        Client {
            agent: agent(self.tls.as_ref(), false),
            ..self.clone()
        }
    }
}

/// An agent with our settings: no redirects, a 5 s connect bound, TLS as given, and idle
/// connections kept for reuse or not.
fn agent(tls: Option<&Arc<Tls>>, pooled: bool) -> ureq::Agent {
    let mut b = ureq::AgentBuilder::new()
        .redirects(0)
        .timeout_connect(Duration::from_secs(5))
        .user_agent(concat!("locksmith/", env!("CARGO_PKG_VERSION")));
    if !pooled {
        b = b.max_idle_connections(0).max_idle_connections_per_host(0);
    }
    if let Some(t) = tls {
        b = b.tls_connector(Arc::clone(t));
    }
    b.build()
}

/// TLS for ureq on our own rustls settings ([`crate::tls`]: `ca_file` or the system CAs, the
/// name verified), so that ureq's `tls` feature (its webpki-roots table, 700 relocations every
/// start of the helper would pay) is not linked.
struct Tls(Arc<rustls::ClientConfig>);

impl ureq::TlsConnector for Tls {
    fn connect(
        &self,
        dns_name: &str,
        mut io: Box<dyn ureq::ReadWrite>,
    ) -> std::result::Result<Box<dyn ureq::ReadWrite>, ureq::Error> {
        let name = dns_name.trim_start_matches('[').trim_end_matches(']');
        let sni = rustls::pki_types::ServerName::try_from(name.to_string())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let mut conn =
            rustls::ClientConnection::new(Arc::clone(&self.0), sni).map_err(std::io::Error::other)?;
        conn.complete_io(&mut io)?;
        Ok(Box::new(TlsStream(rustls::StreamOwned::new(conn, io))))
    }
}

#[derive(Debug)]
struct TlsStream(rustls::StreamOwned<rustls::ClientConnection, Box<dyn ureq::ReadWrite>>);

impl std::io::Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl std::io::Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl ureq::ReadWrite for TlsStream {
    fn socket(&self) -> Option<&std::net::TcpStream> {
        self.0.get_ref().socket()
    }
}

/// A transport failure in a few words (ureq's own text names the cause: refused, DNS, TLS).
fn transport(t: &ureq::Transport) -> String {
    let mut s = t.to_string();
    if let Some(src) = std::error::Error::source(t) {
        let src = src.to_string();
        if !s.contains(&src) {
            s = format!("{s}: {src}");
        }
    }
    s
}

fn hmac(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    m.update(data);
    m.finalize().into_bytes().to_vec()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// S3's URI encoding: unreserved characters as they are, every other byte `%XX`; `/` kept
/// in an object key's path (`slash` false), encoded in a query or a bucket.
pub fn encode(s: &str, slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') || (b == b'/' && !slash) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, RFC 9110's IMF-fixdate).
pub fn http_date(s: &str) -> Option<SystemTime> {
    let f: Vec<&str> = s.split_whitespace().collect();
    let [_, day, mon, year, time, "GMT"] = f.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|x| x == mon)? + 1;
    let text = format!("{year}-{m:02}-{:0>2}T{time}Z", day);
    humantime::parse_rfc3339_weak(&text).ok()
}

/// The text of the first `<NAME>…</NAME>` in `xml`, entities decoded.
pub fn tag(xml: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&close)?;
    Some(unescape(&xml[start..end]))
}

/// Every `<NAME>…</NAME>` block of `xml`, in order.
pub fn blocks<'a>(xml: &'a str, name: &str) -> Vec<&'a str> {
    let open = format!("<{name}>");
    let close = format!("</{name}>");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        let Some(j) = after.find(&close) else { break };
        out.push(&after[..j]);
        rest = &after[j + close.len()..];
    }
    out
}

fn unescape(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&#34;", "\"")
        .replace("&amp;", "&")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of AWS's documentation ("Signature Calculations for the Authorization
    /// Header", GET Object): the signing key and signature it gives.
    #[test]
    fn sigv4_matches_the_aws_example() {
        let secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY";
        let canonical = "GET\n/test.txt\n\nhost:examplebucket.s3.amazonaws.com\nrange:bytes=0-9\nx-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\nx-amz-date:20130524T000000Z\n\nhost;range;x-amz-content-sha256;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n20130524T000000Z\n20130524/us-east-1/s3/aws4_request\n{}",
            hex(&Sha256::digest(canonical.as_bytes()))
        );
        let mut k = hmac(format!("AWS4{secret}").as_bytes(), b"20130524");
        for part in [&b"us-east-1"[..], b"s3", b"aws4_request"] {
            k = hmac(&k, part);
        }
        assert_eq!(
            hex(&hmac(&k, to_sign.as_bytes())),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    #[test]
    fn dates_keys_and_xml() {
        let t = http_date("Thu, 26 Nov 2026 13:08:35 GMT").unwrap();
        assert_eq!(
            humantime::format_rfc3339_seconds(t).to_string(),
            "2026-11-26T13:08:35Z"
        );
        assert_eq!(http_date("yesterday"), None);
        assert_eq!(encode("a b/c+d", false), "a%20b/c%2Bd");
        assert_eq!(encode("a/b", true), "a%2Fb");
        let xml = "<Error><Code>NoSuchBucket</Code><Message>a &amp; b</Message></Error>";
        assert_eq!(tag(xml, "Code").as_deref(), Some("NoSuchBucket"));
        assert_eq!(tag(xml, "Message").as_deref(), Some("a & b"));
        let l = "<R><Contents><Key>a</Key></Contents><Contents><Key>b</Key></Contents></R>";
        let keys: Vec<_> = blocks(l, "Contents")
            .into_iter()
            .filter_map(|b| tag(b, "Key"))
            .collect();
        assert_eq!(keys, ["a", "b"]);
    }
}
