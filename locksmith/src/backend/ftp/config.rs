//! The `ftp` backend's settings: its keys in a profile section and in an `ftp://` address.

use std::path::PathBuf;

use crate::backend::address::Address;
use crate::error::Result;
use crate::settings::{Fields, KeyDoc, Password, netrc_entry};

/// Transport security of the FTP control and data connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tls {
    None,
    /// `AUTH TLS` on the plain port.
    Explicit,
    /// TLS from the first byte (port 990 by convention).
    Implicit,
}

/// Settings of the `ftp` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FtpConfig {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Password,
    pub tls: Tls,
    /// PEM file of the CA(s) that sign the server's certificate (a private CA).
    pub ca_file: Option<PathBuf>,
    /// The lock directory, relative to the login directory (or absolute on the server).
    pub path: String,
    /// A slot of a lock with several (SPEC §3b): the lock's own path, whose state every slot
    /// issues tokens from. `None`: the lock itself.
    pub slot_of: Option<String>,
}

impl FtpConfig {
    /// Slot `k` of the lock: the lock directory `PATH.slot-K`, issuing tokens from the lock's
    /// state (docs/LAYOUT.md).
    pub fn slot(&self, k: u32) -> FtpConfig {
        FtpConfig {
            path: format!("{}.slot-{k}", self.path),
            slot_of: Some(self.path.clone()),
            ..self.clone()
        }
    }

    /// The lock's fair queue: the lock directory `PATH.line`, whose slots its waiters hold
    /// (docs/LAYOUT.md).
    pub fn queue(&self) -> FtpConfig {
        FtpConfig {
            path: format!("{}.line", self.path),
            slot_of: None,
            ..self.clone()
        }
    }
}

/// The keys [`config`] takes (besides the common and password keys).
pub static KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "host",
        example: "\"ftp.example.com\"",
        doc: "the FTP server (required)",
    },
    KeyDoc {
        key: "port",
        example: "21",
        doc: "[default: 21, or 990 with tls = \"implicit\"]",
    },
    KeyDoc {
        key: "user",
        example: "\"phoneacc\"",
        doc: "the login (required in a profile; an address defaults to ~/.netrc's, else anonymous)",
    },
    KeyDoc {
        key: "tls",
        example: "\"explicit\"",
        doc: "none | explicit (AUTH TLS) | implicit (FTPS); certificates are verified [default: none]",
    },
    KeyDoc {
        key: "ca_file",
        example: "\"/etc/locksmith/ca.pem\"",
        doc: "PEM file of the CA(s) that sign the server's certificate, for a private CA (needs tls)",
    },
    KeyDoc {
        key: "path",
        example: "\"phone_lock\"",
        doc: "the lock directory on the server, relative to the login directory (required); its parent must exist",
    },
];

/// The keys of `backend = "ftp"`. From an address, `user` defaults to the `.netrc` login
/// for the host, else `anonymous`, and the password to `$LOCKSMITH_PASSWORD`, else the
/// `.netrc` entry's (SPEC §3a).
pub fn config(f: &mut Fields) -> Result<FtpConfig> {
    let host = f.required("host", Fields::string)?;
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return Err(f.error(&format!("`host` = {host:?} is not a host name or address")));
    }
    let port = f.port("port")?;
    let user = f.string("user")?;
    let password = f.password()?;
    let (user, password) = match (f.origin().address.clone(), user) {
        (None, None) => return Err(f.error("missing required key `user`")),
        (None, Some(user)) => (user, password),
        (Some(env), user) => {
            let netrc = env.netrc().filter(|_| {
                user.is_none() || (password == Password::None && !env.locksmith_password)
            });
            let entry = match &netrc {
                Some(file) => netrc_entry(file, &host, user.as_deref())?,
                None => None,
            };
            let login = entry.as_ref().and_then(|e| e.login.clone());
            let user = user.or(login).unwrap_or_else(|| "anonymous".into());
            let password = match (password, netrc) {
                (Password::None, _) if env.locksmith_password => {
                    Password::Env("LOCKSMITH_PASSWORD".into())
                }
                (Password::None, Some(file)) if entry.is_some_and(|e| e.password.is_some()) => {
                    Password::Netrc {
                        file,
                        host: host.clone(),
                    }
                }
                (p, _) => p,
            };
            (user, password)
        }
    };
    let tls = match f.string("tls")?.as_deref() {
        None | Some("none") => Tls::None,
        Some("explicit") => Tls::Explicit,
        Some("implicit") => Tls::Implicit,
        Some(other) => {
            return Err(f.error(&format!(
                "`tls` = \"{other}\" (expected none, explicit or implicit)"
            )));
        }
    };
    let ca_file = f.path("ca_file")?;
    if ca_file.is_some() && tls == Tls::None {
        return Err(f.error("`ca_file` needs `tls` = \"explicit\" or \"implicit\""));
    }
    // Implicit FTPS listens on its own port (990), unless the profile names one.
    let port = match port {
        Some(p) => p,
        None if tls == Tls::Implicit => 990,
        None => 21,
    };
    let path = f.required("path", Fields::string)?;
    let bad = path.is_empty()
        || path.ends_with('/')
        || path.contains(['\r', '\n', '\0', '~'])
        || path
            .split('/')
            .skip(usize::from(path.starts_with('/')))
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(f.error(&format!(
            "`path` = {path:?} must name a directory on the server, like \"phone_lock\" or \"locks/phone\" (no empty, `.` or `..` components, no `~`)"
        )));
    }
    Ok(FtpConfig {
        host,
        port,
        user,
        password,
        tls,
        ca_file,
        path,
        slot_of: None,
    })
}

/// `ftp://[USER@]HOST[:PORT]/PATH` (`ftps://`: explicit TLS): PATH relative to the login
/// directory, `/%2F...` for an absolute one, as curl reads it.
pub fn address(a: &Address) -> std::result::Result<toml::Table, String> {
    let mut t = crate::backend::address::one_host_keys(a, "an ftp")?;
    if a.scheme == "ftps" {
        // Explicit TLS, unless the query asks for implicit TLS.
        match a.query_value("tls") {
            None => {
                t.insert("tls".into(), "explicit".into());
            }
            Some("none") => return Err("ftps:// is FTP over TLS: `tls=none` contradicts it".into()),
            Some(_) => {}
        }
    }
    let path = a.path.strip_prefix('/').unwrap_or(&a.path);
    if path.is_empty() {
        return Err("an ftp address needs the lock directory's PATH after HOST/".into());
    }
    t.insert("path".into(), path.to_string().into());
    Ok(t)
}
