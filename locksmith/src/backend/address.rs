//! Lock addresses (SPEC §3a): a lock named on the command line, or in a profile's
//! `url = "…"`, without a profile section of its own.
//!
//! ```text
//! /var/lock/x.lock  ./x.lock                 flock on that file (no query: `?` is a name byte)
//! flock:PATH  mkdir:PATH  link:PATH  symlink:PATH[?KEY=VALUE&...]
//! ftp://[USER@]HOST[:PORT]/PATH              ftps:// explicit TLS, ?tls=implicit
//! postgres://[USER@]HOST[:PORT]/DB?lock=NAME postgresql:// too
//! etcd://HOST:PORT[,HOST:PORT...]/PREFIX     etcds:// https endpoints
//! redis://[USER@]HOST[:PORT][/DB]?key=NAME   rediss:// TLS
//! ```
//!
//! An address is only another way to write a backend's keys: its parts become keys (each
//! backend's `address` function says which), its query adds keys of the same names, and the
//! backend's own parser reads them all, exactly as it reads a profile section. A password is
//! never part of an address: `USER:PASSWORD@` and `?password=` are refused without being
//! repeated.

use toml::{Table, Value};

use crate::error::{Error, Kind, Result, one_line};

/// The scheme (one of `known`, as written there) of a word that names an address, `flock`
/// for a path, or `None` for a profile name.
///
/// A word that begins with a known `SCHEME:` is that kind of address; any other word with a
/// `/` is a path for flock; a word with `:` but no `/` and no known scheme is a usage error
/// naming the schemes; anything else is a profile name.
pub fn classify(word: &str, known: &[&'static str]) -> Result<Option<&'static str>> {
    if let Some((scheme, _)) = word.split_once(':')
        && let Some(s) = known.iter().find(|s| s.eq_ignore_ascii_case(scheme))
    {
        return Ok(Some(s));
    }
    // `SCHEME://…` of a scheme not (yet) known is never a relative path (issue 25).
    let unknown_url = word
        .split_once(':')
        .is_some_and(|(s, rest)| is_scheme(s) && rest.starts_with("//"));
    if word.contains('/') && !unknown_url {
        return Ok(Some("flock"));
    }
    if word.contains(':') {
        let scheme = word.split_once(':').map_or("", |(s, _)| s);
        return Err(Error::new(
            Kind::Usage,
            format!(
                "`{}:` is not a lock address scheme (known: {}; a path with a `/` is a flock file, a word without `:` a profile)",
                one_line(scheme, 64),
                known.join(", ")
            ),
        ));
    }
    Ok(None)
}

/// RFC 3986's `scheme`: `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
pub fn is_scheme(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'+' | b'-' | b'.'))
}

/// An address taken apart: parts still to be read by its backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// Lower case; empty for a bare path.
    pub scheme: String,
    /// What follows `//` up to the path, if the address has it (raw, not decoded).
    authority: Option<String>,
    /// Percent-decoded (a bare path is taken as it is).
    pub path: String,
    /// Percent-decoded `key=value` pairs, in order.
    pub query: Vec<(String, String)>,
}

/// `[USER@]HOST[:PORT][,HOST[:PORT]...]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Authority {
    pub user: Option<String>,
    pub hosts: Vec<(String, Option<u16>)>,
}

/// The keys of an address that names one `[USER@]HOST[:PORT]` (ftp, postgres): `host`,
/// `port` and `user` where given; `backend` names the backend in the error.
pub fn one_host_keys(a: &Address, backend: &str) -> std::result::Result<Table, String> {
    let auth = a.authority()?;
    let [(host, port)] = auth.hosts.as_slice() else {
        return Err(format!("{backend} address names one HOST[:PORT]"));
    };
    let mut t = Table::new();
    t.insert("host".into(), host.clone().into());
    if let Some(p) = port {
        t.insert("port".into(), i64::from(*p).into());
    }
    if let Some(u) = &auth.user {
        t.insert("user".into(), u.clone().into());
    }
    Ok(t)
}

impl Address {
    /// Splits `text`, which begins with one of the `known` schemes (or is a bare path for
    /// flock). Errors never repeat a password: [`refuse_password`] names the safe ways instead.
    pub fn parse(text: &str, known: &[&str]) -> std::result::Result<Address, String> {
        let scheme_given = text.split_once(':').and_then(|(s, _)| {
            known
                .iter()
                .any(|k| k.eq_ignore_ascii_case(s))
                .then(|| s.to_ascii_lowercase())
        });
        let Some(scheme) = scheme_given else {
            // A bare path: flock on that file, every byte part of the name.
            return Ok(Address {
                scheme: String::new(),
                authority: None,
                path: text.to_string(),
                query: Vec::new(),
            });
        };
        let rest = &text[scheme.len() + 1..];
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.strip_prefix("//") {
            Some(r) => {
                let (a, p) = r.find('/').map_or((r, ""), |i| r.split_at(i));
                (Some(a.to_string()), p)
            }
            None => (None, rest),
        };
        let mut pairs = Vec::new();
        for pair in query.into_iter().flat_map(|q| q.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                format!(
                    "query parameter `{}` has no value (write KEY=VALUE)",
                    one_line(pair, 64)
                )
            })?;
            let k = decode(k)?;
            if k == "password" {
                return Err(refuse_password());
            }
            pairs.push((k, decode(v)?));
        }
        Ok(Address {
            scheme,
            authority,
            path: decode(path)?,
            query: pairs,
        })
    }

    /// The query's value for `key`, if given.
    pub fn query_value(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The authority of a `SCHEME://` address: the user (never a password) and the hosts.
    pub fn authority(&self) -> std::result::Result<Authority, String> {
        let Some(auth) = &self.authority else {
            return Err(format!(
                "a {}: address is {}://HOST/...",
                self.scheme, self.scheme
            ));
        };
        let (user, hosts) = match auth.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, auth.as_str()),
        };
        if user.is_some_and(|u| u.contains(':')) {
            return Err(refuse_password());
        }
        let user = match user {
            Some("") => return Err("empty user name before `@`".into()),
            Some(u) => Some(decode(u)?),
            None => None,
        };
        let mut list = Vec::new();
        for hp in hosts.split(',') {
            let (host, port) = match hp.strip_prefix('[') {
                // An IPv6 literal: [::1]:5432.
                Some(r) => {
                    let (h, after) = r
                        .split_once(']')
                        .ok_or_else(|| "unclosed `[` in the address's HOST".to_string())?;
                    (h, after.strip_prefix(':'))
                }
                None => match hp.rsplit_once(':') {
                    Some((h, p)) => (h, Some(p)),
                    None => (hp, None),
                },
            };
            if host.is_empty() {
                return Err("no HOST in the address".into());
            }
            let port = match port {
                None => None,
                Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                    "the address's PORT is not a number from 1 to 65535".to_string()
                })?),
            };
            list.push((decode(host)?, port));
        }
        Ok(Authority { user, hosts: list })
    }
}

/// The refusal of a password in an address, naming the safe ways (and never the password).
pub fn refuse_password() -> String {
    "an address never carries a password (it would show in `ps` and in logs): give \
     ?password_env=VARIABLE or ?password_file=PATH, or set $LOCKSMITH_PASSWORD, or use \
     ~/.netrc (ftp), ~/.pgpass / $PGPASSWORD (postgres) or $REDISCLI_AUTH (redis)"
        .to_string()
}

/// `%XX` decoded; a `%` not followed by two hex digits stays as it is. The result must be
/// UTF-8 without NUL.
fn decode(s: &str) -> std::result::Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    let text = String::from_utf8(out).map_err(|_| "a %-escape makes invalid UTF-8".to_string())?;
    if text.contains('\0') {
        return Err("a %-escape makes a NUL byte".into());
    }
    Ok(text)
}

/// The address as an error names it: [`display`]ed, and whatever might be a password
/// (`:…@` before the query) written `***`, however malformed the rest.
pub fn shown(text: &str) -> String {
    let masked = text.find("://").and_then(|i| {
        let rest = &text[i + 3..];
        let end = rest.find('?').unwrap_or(rest.len());
        let at = rest[..end].rfind('@')?;
        let colon = rest[..at].find(':')?;
        Some(format!(
            "{}{}:***{}",
            &text[..i + 3],
            &rest[..colon],
            &rest[at..]
        ))
    });
    let masked = masked.as_deref().unwrap_or(text);
    // And a `password=` in the query.
    let masked = match masked.split_once('?') {
        Some((head, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((k, _)) if decode(k).is_ok_and(|k| k == "password") => {
                        format!("{k}=***")
                    }
                    _ => pair.to_string(),
                })
                .collect();
            format!("{head}?{}", pairs.join("&"))
        }
        None => masked.to_string(),
    };
    display(&masked)
}

/// The address as the OK line, `status` and messages name it: as given (it holds no
/// password), with spaces written `%20` and other whitespace and control bytes escaped, so
/// that it stays one word.
pub fn display(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_whitespace() || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// What a backend says an address's parts are (its keys).
pub type Parts = fn(&Address) -> std::result::Result<Table, String>;

/// The keys an address says: its parts (through its backend's `parts`), then its query;
/// and the names of the keys its parts said. A query key that repeats a part (`?host=`), or
/// itself, is refused.
pub fn keys(
    parts: Parts,
    text: &str,
    known: &[&str],
) -> std::result::Result<(Table, Vec<String>), String> {
    let a = Address::parse(text, known)?;
    if a.scheme.is_empty() {
        // A bare path: flock, no query.
        let mut t = Table::new();
        t.insert("path".into(), Value::String(a.path));
        return Ok((t, vec!["path".into()]));
    }
    let mut t = parts(&a)?;
    let from_address: Vec<String> = t.keys().cloned().collect();
    for (k, v) in a.query {
        if from_address.contains(&k) {
            return Err(format!(
                "`{k}` is part of the address itself; do not repeat it as ?{k}="
            ));
        }
        if t.insert(k.clone(), Value::String(v)).is_some() {
            return Err(format!("?{k}= is given twice"));
        }
    }
    Ok((t, from_address))
}

/// The parts of a file backend's address: `SCHEME:PATH` (no `//` authority).
pub fn path_keys(a: &Address) -> std::result::Result<Table, String> {
    if a.authority.is_some() {
        return Err(format!(
            "a {}: address is {}:PATH (a path on this host, not //HOST)",
            a.scheme, a.scheme
        ));
    }
    if a.path.is_empty() {
        return Err(format!("`{}:` needs a PATH", a.scheme));
    }
    let mut t = Table::new();
    t.insert("path".into(), Value::String(a.path.clone()));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[&str] = &["flock", "mkdir", "ftp", "ftps", "postgres", "etcd"];

    #[test]
    fn parts_are_split_and_decoded() {
        let a = Address::parse(
            "ftp://joe@h.example:2121/%2Flocks/a%20b?tls=explicit&wait=0",
            KNOWN,
        )
        .unwrap();
        assert_eq!(a.scheme, "ftp");
        assert_eq!(a.path, "//locks/a b");
        assert_eq!(
            a.query,
            vec![
                ("tls".into(), "explicit".into()),
                ("wait".into(), "0".into())
            ]
        );
        let auth = a.authority().unwrap();
        assert_eq!(auth.user.as_deref(), Some("joe"));
        assert_eq!(auth.hosts, vec![("h.example".into(), Some(2121))]);
        let a = Address::parse("etcd://a:1,[::1]:2/locks/x", KNOWN).unwrap();
        assert_eq!(
            a.authority().unwrap().hosts,
            vec![("a".into(), Some(1)), ("::1".into(), Some(2))]
        );
        assert_eq!(a.path, "/locks/x");
        // A bare path keeps every byte.
        assert_eq!(Address::parse("./a?b%20", KNOWN).unwrap().path, "./a?b%20");
    }

    #[test]
    fn passwords_are_refused_and_never_repeated() {
        for text in [
            "ftp://joe:s3cret@h/p",
            "ftp://joe:@h/p",
            "postgres://u:s3cret@h/db?lock=x",
            "mkdir:/p?password=s3cret",
        ] {
            let a = Address::parse(text, KNOWN);
            let e = match a {
                Err(e) => e,
                Ok(a) => a.authority().unwrap_err(),
            };
            assert!(e.contains("never carries a password"), "{text}: {e}");
            assert!(!e.contains("s3cret"), "{e}");
        }
    }

    #[test]
    fn display_is_one_word() {
        assert_eq!(shown("ftp://joe:a/b@h/p"), "ftp://joe:***@h/p");
        assert_eq!(shown("ftp://h/p?x=@"), "ftp://h/p?x=@");
        assert_eq!(
            shown("mkdir:/p?wait=0&password=x&y=1"),
            "mkdir:/p?wait=0&password=***&y=1"
        );
        assert_eq!(display("/tmp/a b"), "/tmp/a%20b");
        assert_eq!(display("mkdir:/x\ty\n"), "mkdir:/x%09y%0A");
    }
}
