//! The profiles file: raw TOML in, a validated [`Profile`] out (two stages, as ripgrep
//! does with its flags). Every error names the file, the profile and the key (exit 78).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};

use crate::error::{Error, Kind, Result, err, shown};
use crate::files;

/// Subcommand names; a profile may not be called like one of them.
pub const SUBCOMMANDS: &[&str] = &["hold", "run", "status", "break", "verify", "profiles"];

/// How long to wait for a busy lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    Forever,
    /// Give up after this long; zero tries once.
    For(Duration),
}

/// Timing and mode settings every backend understands, after precedence was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Common {
    pub wait: Wait,
    pub poll: Duration,
    pub max_poll: Duration,
    pub keepalive: Duration,
    pub stale_after: Duration,
    pub shared: bool,
}

impl Common {
    /// Built-in values (SPEC §3).
    pub fn builtin() -> Common {
        Common {
            wait: Wait::Forever,
            poll: Duration::from_millis(200),
            max_poll: Duration::from_secs(4),
            keepalive: Duration::from_secs(5),
            stale_after: Duration::from_secs(60),
            shared: false,
        }
    }

    /// The heartbeat period: min(`keepalive`, `stale_after`/3).
    pub fn heartbeat(&self) -> Duration {
        self.keepalive.min(self.stale_after / 3)
    }
}

/// Settings of the filesystem backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsConfig {
    /// Absolute path of the lock (file for flock, directory for mkdir).
    pub path: PathBuf,
    /// Mode for files and directories locksmith creates (directories get `x` where `r` is).
    pub file_mode: Option<u32>,
    /// Group for files and directories locksmith creates.
    pub group: Option<u32>,
    /// Every contender is on this host: no heartbeat, staleness by proof of death alone
    /// (and, for flock, a network or FUSE filesystem is accepted).
    pub local: bool,
    /// How late the mount may show another host's changes, as the user states it (network
    /// and FUSE filesystems; `stale_after` must exceed it).
    pub cache_time: Option<Duration>,
}

/// Where an FTP password comes from. Resolved only when connecting, so that validating a
/// profile (`profiles`) needs neither the variable nor the file; never printed (`Debug` hides
/// an inline value).
#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    /// No password key: anonymous FTP sends a conventional one.
    None,
    Inline(String),
    Env(String),
    File(PathBuf),
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Password::None => f.write_str("None"),
            Password::Inline(_) => f.write_str("Inline(<hidden>)"),
            Password::Env(v) => write!(f, "Env({v:?})"),
            Password::File(p) => write!(f, "File({p:?})"),
        }
    }
}

impl Password {
    /// The password itself. Errors name the source, never the value.
    pub fn resolve(&self, user: &str) -> Result<String> {
        match self {
            Password::None if user == "anonymous" || user == "ftp" => Ok("locksmith@".to_string()),
            Password::None => Ok(String::new()),
            Password::Inline(p) => Ok(p.clone()),
            Password::Env(var) => match std::env::var(var) {
                Ok(p) => Ok(p),
                Err(std::env::VarError::NotPresent) => Err(err!(
                    Config,
                    "`password_env`: environment variable {var} is not set"
                )),
                Err(std::env::VarError::NotUnicode(_)) => Err(err!(
                    Config,
                    "`password_env`: environment variable {var} is not valid UTF-8"
                )),
            },
            Password::File(path) => {
                // Opened without blocking, checked (kind, owner, mode) on the descriptor
                // read, and read at most 64 KiB (issue 15: a FIFO or /dev/zero here).
                let (file, st) = open_secret(path, "password_file")?;
                let bytes =
                    files::read_capped(file, &st, path, "password_file", files::SECRET_CAP)?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| err!(Config, "password_file {} is not UTF-8 text", shown(path)))?;
                // The first line, without its line ending.
                Ok(text.lines().next().unwrap_or("").to_string())
            }
        }
    }
}

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
}

/// Which backend, with its own settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendConfig {
    Flock(FsConfig),
    Mkdir(FsConfig),
    Link(FsConfig),
    Symlink(FsConfig),
    Ftp(FtpConfig),
    Postgres(PgConfig),
    Etcd(EtcdConfig),
}

/// Settings of the `etcd` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdConfig {
    /// `http://host:port` or `https://host:port` URLs, all of one scheme (a bare
    /// `host:port` gets `http://`).
    pub endpoints: Vec<String>,
    /// `https://` endpoints: TLS, the server verified against `ca_file` or the system CAs.
    pub tls: bool,
    pub ca_file: Option<PathBuf>,
    /// The lock's key prefix: the queue lives under `PREFIX/`, the fencing state at
    /// `PREFIX.state`.
    pub prefix: String,
    pub user: Option<String>,
    pub password: Password,
}

/// Settings of the `postgres` backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgConfig {
    /// A `postgresql://` URL (or key=value string); `None`: the separate keys below.
    pub url: Option<Hidden>,
    pub host: String,
    pub port: u16,
    pub dbname: Option<String>,
    pub user: Option<String>,
    pub password: Password,
    /// The lock's name, hashed to the 64-bit advisory key on the server.
    pub lock: String,
    /// Schema of the fencing-token table (an identifier, created on first use).
    pub schema: String,
    pub sslmode: SslMode,
    /// CA certificates (PEM) that verify the server; `None`: the system's CA bundle.
    pub ca_file: Option<PathBuf>,
}

/// `sslmode` of the postgres backend, in libpq's words. Unlike libpq, every mode that uses
/// TLS verifies the server's certificate chain (against `ca_file` or the system CAs):
/// `require` and `verify-ca` behave as libpq's do when a root certificate is configured,
/// `verify-full` also checks the host name, `prefer` uses TLS when the server offers it (and
/// then verifies as `require`), `disable` (the default) never uses TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// A string that may hold a secret (a connection URL with a password): never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Hidden(pub String);

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<hidden>")
    }
}

impl BackendConfig {
    pub fn name(&self) -> &'static str {
        match self {
            BackendConfig::Flock(_) => "flock",
            BackendConfig::Mkdir(_) => "mkdir",
            BackendConfig::Link(_) => "link",
            BackendConfig::Symlink(_) => "symlink",
            BackendConfig::Ftp(_) => "ftp",
            BackendConfig::Postgres(_) => "postgres",
            BackendConfig::Etcd(_) => "etcd",
        }
    }

    /// Whether the backend can take a shared (reader) lock.
    pub fn supports_shared(&self) -> bool {
        matches!(
            self,
            BackendConfig::Flock(_)
                | BackendConfig::Symlink(_)
                | BackendConfig::Ftp(_)
                | BackendConfig::Postgres(_)
                | BackendConfig::Etcd(_)
        )
    }
}

/// A validated profile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub backend: BackendConfig,
    pub common: Common,
    /// The profile itself said `shared = true` (a refusal is then 78, not 64).
    pub shared_from_profile: bool,
}

/// Command-line values that override profile and defaults.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub wait: Option<Wait>,
    pub shared: bool,
}

/// A loaded profiles file: the raw tables, validated lazily per profile so that one
/// broken profile does not hide the others from `profiles`.
pub struct ProfilesFile {
    pub path: PathBuf,
    dir: PathBuf,
    defaults: Table,
    profiles: BTreeMap<String, Table>,
}

/// Finds the profiles file: `--profiles`, `$LOCKSMITH_PROFILES`, XDG, `/etc` (SPEC §3).
pub fn locate(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("LOCKSMITH_PROFILES").filter(|p| !p.is_empty()) {
        // Named explicitly: a missing file is an error, no fall-through.
        return Ok(PathBuf::from(p));
    }
    let mut tried = Vec::new();
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
    if let Some(xdg) = xdg {
        let p = xdg.join("locksmith/profiles.toml");
        if p.exists() {
            return Ok(p);
        }
        tried.push(p);
    }
    let etc = PathBuf::from("/etc/locksmith/profiles.toml");
    if etc.exists() {
        return Ok(etc);
    }
    tried.push(etc);
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(err!(
        Config,
        "no profiles file found (tried --profiles, $LOCKSMITH_PROFILES, {})",
        tried.join(", ")
    ))
}

impl ProfilesFile {
    /// Reads and parses the file; checks names and the secret-file permission rule.
    pub fn load(path: &Path) -> Result<ProfilesFile> {
        // Not blocking on a FIFO, not reading /dev/zero forever (issue 15); every failure to
        // read the file the user named is a config error.
        let bytes = files::read_regular(path, "profiles file", files::CONFIG_CAP)?;
        let text = String::from_utf8(bytes)
            .map_err(|_| err!(Config, "profiles file {} is not UTF-8 text", shown(path)))?;
        ProfilesFile::parse(path, &text)
    }

    /// Parses `text` as the profiles file at `path`, which names it in errors, anchors
    /// relative lock paths and is checked for permissions if a profile holds a `password`.
    pub fn parse(path: &Path, text: &str) -> Result<ProfilesFile> {
        let mut table: Table = toml::from_str(text).map_err(|e| {
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .map(|l| format!(" line {l}"))
                .unwrap_or_default();
            err!(
                Config,
                "{}:{line}: malformed TOML: {}",
                shown(path),
                e.message().trim()
            )
        })?;
        let here = |what: String| err!(Config, "{}: {what}", shown(path));
        let defaults = match table.remove("defaults") {
            None => Table::new(),
            Some(Value::Table(t)) => t,
            Some(_) => return Err(here("`defaults` must be a table".into())),
        };
        let mut profiles = BTreeMap::new();
        match table.remove("profile") {
            None => {}
            Some(Value::Table(t)) => {
                for (name, v) in t {
                    let Value::Table(body) = v else {
                        return Err(here(format!("`profile.{name}` must be a table")));
                    };
                    if SUBCOMMANDS.contains(&name.as_str()) {
                        return Err(here(format!(
                            "profile `{name}` is named like a subcommand ({}); rename it",
                            SUBCOMMANDS.join(", ")
                        )));
                    }
                    if !valid_name(&name) {
                        return Err(here(format!(
                            "profile name `{name}` must match [A-Za-z0-9._-]{{1,64}}"
                        )));
                    }
                    profiles.insert(name, body);
                }
            }
            Some(_) => return Err(here("`profile` must be a table of tables".into())),
        }
        if let Some(key) = table.keys().next() {
            return Err(here(format!(
                "unknown top-level key `{key}` (expected [defaults] and [profile.NAME])"
            )));
        }
        let holds_secret = profiles.values().any(|t| t.contains_key("password"));
        if holds_secret {
            check_secret_file(path)?;
        }
        let dir = path
            .canonicalize()
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("."));
        Ok(ProfilesFile {
            path: path.to_path_buf(),
            dir,
            defaults,
            profiles,
        })
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.profiles.keys().map(String::as_str)
    }

    /// The backend name a profile declares, without validating the rest.
    pub fn backend_of(&self, name: &str) -> Option<&str> {
        self.profiles.get(name)?.get("backend")?.as_str()
    }

    /// Validates one profile, applying `overrides` > profile > `[defaults]` > built-in.
    pub fn profile(&self, name: &str, overrides: &Overrides) -> Result<Profile> {
        if !valid_name(name) {
            return Err(err!(
                Usage,
                "profile name `{name}` must match [A-Za-z0-9._-]{{1,64}}"
            ));
        }
        let Some(raw) = self.profiles.get(name) else {
            return Err(err!(
                Config,
                "{}: unknown profile `{name}` (known: {})",
                shown(&self.path),
                crate::error::some_of(self.names(), 10)
            ));
        };
        let mut common = Common::builtin();
        let mut defaults = Fields::new(&self.path, "[defaults]", &self.defaults);
        apply_timing(&mut defaults, &mut common)?;
        defaults.finish()?;

        let ctx = format!("profile `{name}`");
        let mut f = Fields::new(&self.path, &ctx, raw);
        apply_timing(&mut f, &mut common)?;
        let shared_from_profile = f.bool("shared")?.unwrap_or(false);
        common.shared = shared_from_profile;
        let backend_name = f
            .string("backend")?
            .ok_or_else(|| f.error("missing required key `backend`"))?;
        let backend = match backend_name.as_str() {
            "flock" => BackendConfig::Flock(self.fs_config(&mut f, false)?),
            "mkdir" => BackendConfig::Mkdir(self.fs_config(&mut f, true)?),
            "link" => BackendConfig::Link(self.fs_config(&mut f, true)?),
            "symlink" => BackendConfig::Symlink(self.fs_config(&mut f, true)?),
            "ftp" if cfg!(feature = "ftp") => BackendConfig::Ftp(self.ftp_config(&mut f)?),
            "postgres" if cfg!(feature = "postgres") => {
                BackendConfig::Postgres(self.pg_config(&mut f, name)?)
            }
            "etcd" if cfg!(feature = "etcd") => {
                BackendConfig::Etcd(self.etcd_config(&mut f, name)?)
            }
            "postgres" | "ftp" | "etcd" => {
                return Err(f.error(&format!(
                    "backend `{backend_name}` was left out of this build of locksmith (cargo feature `{backend_name}`)"
                )));
            }
            other => {
                return Err(f.error(&format!(
                    "unknown backend `{other}` (known: flock, mkdir, link, symlink, ftp, postgres, etcd)"
                )));
            }
        };
        f.finish()?;

        if let Some(w) = overrides.wait {
            common.wait = w;
        }
        if overrides.shared {
            common.shared = true;
        }
        // Floors that keep a waiter and a holder idle (issue 15: `stale_after = "3ns"` with
        // `keepalive = "1ns"` spun at 100% CPU). Below them a value is refused, never raised.
        for (key, value, floor) in [
            ("poll", common.poll, MIN_POLL),
            ("keepalive", common.keepalive, MIN_KEEPALIVE),
            ("stale_after", common.stale_after, MIN_STALE_AFTER),
        ] {
            if value < floor {
                return Err(err!(
                    Config,
                    "{}: {ctx}: `{key}` ({}) is below the floor of {}",
                    shown(&self.path),
                    fmt_duration(value),
                    fmt_duration(floor)
                ));
            }
        }
        if common.max_poll < common.poll {
            return Err(err!(
                Config,
                "{}: {ctx}: `max_poll` ({}) is below `poll` ({})",
                shown(&self.path),
                fmt_duration(common.max_poll),
                fmt_duration(common.poll)
            ));
        }
        if common.keepalive >= common.stale_after {
            return Err(err!(
                Config,
                "{}: {ctx}: `keepalive` ({}) must be below `stale_after` ({})",
                shown(&self.path),
                fmt_duration(common.keepalive),
                fmt_duration(common.stale_after)
            ));
        }
        if common.shared && !backend.supports_shared() {
            let (kind, origin) = if shared_from_profile {
                (Kind::Config, "the profile says `shared = true`")
            } else {
                (Kind::Usage, "--shared was given")
            };
            return Err(Error::new(
                kind,
                format!(
                    "backend `{}` (profile `{name}`) cannot take a shared lock, but {origin}",
                    backend.name()
                ),
            ));
        }
        Ok(Profile {
            name: name.to_string(),
            backend,
            common,
            shared_from_profile,
        })
    }

    fn ftp_config(&self, f: &mut Fields<'_>) -> Result<FtpConfig> {
        let host = f
            .string("host")?
            .ok_or_else(|| f.error("missing required key `host`"))?;
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(f.error(&format!("`host` = {host:?} is not a host name or address")));
        }
        let port_given = f.table.contains_key("port");
        let port = match f.table.remove("port") {
            None => 21,
            Some(Value::Integer(p)) if (1..=65535).contains(&p) => p as u16,
            Some(Value::Integer(p)) => {
                return Err(f.error(&format!("`port` = {p} is not from 1 to 65535")));
            }
            Some(other) => {
                return Err(f.error(&format!(
                    "`port` must be an integer, not {}",
                    other.type_str()
                )));
            }
        };
        let user = f
            .string("user")?
            .ok_or_else(|| f.error("missing required key `user`"))?;
        let password = self.password(f)?;
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
        let ca_file = f.string("ca_file")?.map(|p| self.dir.join(p));
        if ca_file.is_some() && tls == Tls::None {
            return Err(f.error("`ca_file` needs `tls` = \"explicit\" or \"implicit\""));
        }
        // Implicit FTPS listens on its own port (990), unless the profile names one.
        let port = if tls == Tls::Implicit && !port_given {
            990
        } else {
            port
        };
        let path = f
            .string("path")?
            .ok_or_else(|| f.error("missing required key `path`"))?;
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
        })
    }

    fn etcd_config(&self, f: &mut Fields<'_>, profile: &str) -> Result<EtcdConfig> {
        let endpoints = match f.table.remove("endpoints") {
            None => return Err(f.error("missing required key `endpoints`")),
            Some(Value::String(s)) => vec![s],
            Some(Value::Array(a)) => {
                let mut v = Vec::with_capacity(a.len());
                for e in a {
                    match e {
                        Value::String(s) => v.push(s),
                        other => {
                            return Err(f.error(&format!(
                                "`endpoints` must hold strings, not {}",
                                other.type_str()
                            )));
                        }
                    }
                }
                v
            }
            Some(other) => {
                return Err(f.error(&format!(
                    "`endpoints` must be a list of strings, not {}",
                    other.type_str()
                )));
            }
        };
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
        let ca_file = f.string("ca_file")?.map(|p| self.dir.join(p));
        if ca_file.is_some() && !tls {
            return Err(
                f.error("`ca_file` needs https:// endpoints (a bare host:port means http://)")
            );
        }
        let prefix = f
            .string("prefix")?
            .unwrap_or_else(|| format!("/locksmith/{profile}"));
        let prefix = prefix.trim_end_matches('/').to_string();
        if prefix.is_empty() {
            return Err(f.error("`prefix` is empty"));
        }
        let user = f.string("user")?;
        let password = self.password(f)?;
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
        })
    }

    /// `password` | `password_env` | `password_file` (at most one; a file must be 0600).
    fn password(&self, f: &mut Fields<'_>) -> Result<Password> {
        let mut sources = Vec::new();
        if let Some(p) = f.string("password")? {
            sources.push(Password::Inline(p));
        }
        if let Some(v) = f.string("password_env")? {
            sources.push(Password::Env(v));
        }
        if let Some(p) = f.string("password_file")? {
            sources.push(Password::File(self.dir.join(p)));
        }
        if sources.len() > 1 {
            return Err(f.error("give only one of `password`, `password_env` and `password_file`"));
        }
        let password = sources.pop().unwrap_or(Password::None);
        if let Password::File(p) = &password
            && p.exists()
        {
            open_secret(p, "password_file")?;
        }
        Ok(password)
    }

    fn pg_config(&self, f: &mut Fields<'_>, profile: &str) -> Result<PgConfig> {
        let url = f.string("url")?;
        let host = f.string("host")?;
        let port = match f.table.remove("port") {
            None => None,
            Some(Value::Integer(p)) if (1..=65535).contains(&p) => Some(p as u16),
            Some(Value::Integer(p)) => {
                return Err(f.error(&format!("`port` = {p} is not from 1 to 65535")));
            }
            Some(other) => {
                return Err(f.error(&format!(
                    "`port` must be an integer, not {}",
                    other.type_str()
                )));
            }
        };
        let dbname = f.string("dbname")?;
        let user = f.string("user")?;
        let password = self.password(f)?;
        let sslmode = match f.string("sslmode")?.as_deref() {
            None => None,
            Some("disable") => Some(SslMode::Disable),
            Some("prefer") => Some(SslMode::Prefer),
            Some("require") => Some(SslMode::Require),
            Some("verify-ca") => Some(SslMode::VerifyCa),
            Some("verify-full") => Some(SslMode::VerifyFull),
            Some(other) => {
                return Err(f.error(&format!(
                    "`sslmode` = \"{other}\" (expected disable, prefer, require, verify-ca or verify-full)"
                )));
            }
        };
        let ca_file = f.string("ca_file")?.map(|p| self.dir.join(p));
        let lock = f.string("lock")?.unwrap_or_else(|| profile.to_string());
        if lock.is_empty() {
            return Err(f.error("`lock` is empty"));
        }
        let schema = f.string("schema")?.unwrap_or_else(|| "locksmith".into());
        let ident = schema.len() <= 63
            && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ident {
            return Err(f.error(&format!(
                "`schema` = {schema:?} must be a lower-case SQL identifier like \"locksmith\""
            )));
        }
        let url = match (url, &host) {
            (Some(_), Some(_)) => return Err(f.error("give either `url` or `host`, not both")),
            (None, None) => return Err(f.error("missing required key `url` (or `host`)")),
            (Some(u), None) => {
                if port.is_some() || dbname.is_some() || user.is_some() {
                    return Err(f.error(
                        "with `url`, put port, dbname and user in the URL, not in separate keys",
                    ));
                }
                #[cfg(feature = "postgres")]
                let has_password =
                    crate::backend::postgres::url_has_password(&u).map_err(|why| {
                        f.error(&format!(
                            "`url` is not a PostgreSQL connection string: {why}"
                        ))
                    })?;
                #[cfg(not(feature = "postgres"))]
                let has_password = true;
                if has_password {
                    check_secret_file(&self.path)?;
                    if password != Password::None {
                        return Err(f.error(
                            "the `url` holds a password already; drop the other password key",
                        ));
                    }
                }
                Some(Hidden(u))
            }
            (None, Some(_)) => None,
        };
        // A connection string may carry its own `sslmode` (disable, prefer or require).
        #[cfg(feature = "postgres")]
        let in_url = url
            .as_ref()
            .and_then(|u| crate::backend::postgres::url_ssl_mode(&u.0));
        #[cfg(not(feature = "postgres"))]
        let in_url = None;
        let sslmode = match (sslmode, in_url) {
            (Some(a), Some(b)) if a != b => {
                return Err(f.error(&format!(
                    "`sslmode` = \"{}\" but the `url` says sslmode={}; give it once",
                    a.name(),
                    b.name()
                )));
            }
            (Some(m), _) | (None, Some(m)) => m,
            (None, None) => SslMode::Disable,
        };
        if ca_file.is_some() && sslmode == SslMode::Disable {
            return Err(f.error(
                "`ca_file` needs `sslmode` = \"require\", \"verify-ca\" or \"verify-full\"",
            ));
        }
        Ok(PgConfig {
            url,
            host: host.unwrap_or_default(),
            port: port.unwrap_or(5432),
            dbname,
            user,
            password,
            lock,
            schema,
            sslmode,
            ca_file,
        })
    }

    /// The keys of the filesystem backends; `heartbeats`: the backend judges liveness by
    /// heartbeats (mkdir, link, symlink), so it takes `cache_time`.
    fn fs_config(&self, f: &mut Fields<'_>, heartbeats: bool) -> Result<FsConfig> {
        let path = f
            .string("path")?
            .ok_or_else(|| f.error("missing required key `path`"))?;
        if path.is_empty() {
            return Err(f.error("`path` is empty"));
        }
        if path.contains('\0') {
            return Err(f.error(&format!(
                "`path` {} contains a NUL byte",
                shown(Path::new(&path))
            )));
        }
        let path = self.dir.join(path);
        let too_long = path.as_os_str().len() > MAX_PATH || path.iter().any(|c| c.len() > MAX_NAME);
        if too_long {
            return Err(f.error(&format!(
                "`path` {} is {} bytes long: a path is at most {MAX_PATH} bytes, a name in it at most {MAX_NAME}",
                shown(&path),
                path.as_os_str().len()
            )));
        }
        if path.file_name().is_none() {
            return Err(f.error(&format!(
                "`path` {} does not name a file or directory",
                shown(&path)
            )));
        }
        let file_mode = match f.string("file_mode")? {
            None => None,
            Some(s) => Some(match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
                Ok(m) if m <= 0o777 => m,
                // Root would create a setuid (or setgid, or sticky) file (issue 15).
                Ok(m) if m <= 0o7777 => {
                    return Err(f.error(&format!(
                            "`file_mode` = \"{s}\" sets setuid, setgid or sticky bits; give permission bits only, at most \"0777\""
                        )));
                }
                _ => {
                    return Err(f.error(&format!(
                        "`file_mode` = \"{s}\" is not an octal mode like \"0660\""
                    )));
                }
            }),
        };
        let group = match f.string("group")? {
            None => None,
            Some(g) => Some(resolve_group(&g).ok_or_else(|| {
                f.error(&format!("`group` = \"{g}\": no such group on this host"))
            })?),
        };
        let local = f.bool("local")?.unwrap_or(false);
        let cache_time = match f.string("cache_time")? {
            Some(s) if heartbeats => {
                Some(parse_duration(&s).map_err(|m| f.error(&format!("`cache_time`: {m}")))?)
            }
            Some(_) => {
                return Err(f.error(
                    "`cache_time` applies to backends mkdir, link and symlink (flock has no heartbeat)",
                ));
            }
            None => None,
        };
        Ok(FsConfig {
            path,
            file_mode,
            group,
            local,
            cache_time,
        })
    }
}

fn apply_timing(f: &mut Fields<'_>, c: &mut Common) -> Result<()> {
    if let Some(s) = f.string("wait")? {
        c.wait = parse_wait(&s).map_err(|m| f.error(&format!("`wait`: {m}")))?;
    }
    for (key, slot) in [
        ("poll", &mut c.poll),
        ("max_poll", &mut c.max_poll),
        ("keepalive", &mut c.keepalive),
        ("stale_after", &mut c.stale_after),
    ] {
        if let Some(s) = f.string(key)? {
            *slot = parse_duration(&s).map_err(|m| f.error(&format!("`{key}`: {m}")))?;
        }
    }
    Ok(())
}

/// The shortest `poll` accepted: below it a waiter would spin.
pub const MIN_POLL: Duration = Duration::from_millis(1);
/// The shortest `keepalive` accepted (the heartbeat period is min(`keepalive`,
/// `stale_after`/3)): below it a holder would spin.
pub const MIN_KEEPALIVE: Duration = Duration::from_millis(10);
/// The shortest `stale_after` accepted: a heartbeat every 33 ms at most.
pub const MIN_STALE_AFTER: Duration = Duration::from_millis(100);

/// The longest lock path accepted, in bytes (Linux's `PATH_MAX`, its terminating NUL
/// included), and the longest name in it (`NAME_MAX`).
pub const MAX_PATH: usize = 4095;
pub const MAX_NAME: usize = 255;

/// Profile names: `[A-Za-z0-9._-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The longest duration locksmith accepts anywhere: 100 years. Far beyond any real wait or
/// timeout (`wait = "forever"` exists), and small enough that a deadline (now + duration)
/// can never overflow the clock, which would panic.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// `humantime::parse_duration`, one term at a time (`1m 30s` is `1m` + `30s`), summed with
/// checked arithmetic; `Ok(None)` if the sum exceeds [`MAX_DURATION`]. humantime 2.4 panics
/// ("overflow in Duration::new", its issue #66) when the terms of one string add up to
/// `u64::MAX` seconds with a nanosecond carry (`18446744073709551615s1000ms`); a single
/// term cannot. Error offsets are shifted back to positions in `s`.
fn human_duration(s: &str) -> std::result::Result<Option<Duration>, humantime::DurationError> {
    use humantime::DurationError as E;
    // A term starts at a digit that follows a unit (humantime's own rule).
    let mut starts = vec![0];
    let mut after_unit = false;
    for (i, c) in s.char_indices() {
        if c.is_ascii_digit() && after_unit {
            starts.push(i);
        }
        if c.is_alphabetic() {
            after_unit = true;
        } else if !c.is_whitespace() {
            after_unit = false;
        }
    }
    let mut total = Duration::ZERO;
    for (n, &at) in starts.iter().enumerate() {
        let term = &s[at..starts.get(n + 1).copied().unwrap_or(s.len())];
        if n > 0 && term == "0" {
            // humantime reads a whole "0" as zero; a last term "0" lacks its unit.
            return Err(E::UnknownUnit {
                start: s.len(),
                end: s.len(),
                unit: String::new(),
                value: 0,
            });
        }
        let d = humantime::parse_duration(term).map_err(|e| match e {
            E::InvalidCharacter(o) => E::InvalidCharacter(at + o),
            E::NumberExpected(o) => E::NumberExpected(at + o),
            E::UnknownUnit {
                start,
                end,
                unit,
                value,
            } => E::UnknownUnit {
                start: at + start,
                end: at + end,
                unit,
                value,
            },
            other => other,
        })?;
        match total.checked_add(d).filter(|t| *t <= MAX_DURATION) {
            Some(t) => total = t,
            None => return Ok(None),
        }
    }
    Ok(Some(total))
}

fn too_long(s: &str) -> String {
    format!("\"{s}\" is longer than the limit of 100 years")
}

/// A human duration (`250ms`, `3s`, `1m30s`); zero is refused (only `wait` takes it).
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let d = human_duration(s.trim())
        .map_err(|e| format!("\"{s}\" is not a duration like \"250ms\", \"3s\", \"1m30s\" ({e})"))?
        .ok_or_else(|| too_long(s))?;
    if d.is_zero() {
        return Err(format!("\"{s}\" must be greater than 0"));
    }
    Ok(d)
}

/// A `wait` value: `0` (try once), `forever`, or a duration.
pub fn parse_wait(s: &str) -> std::result::Result<Wait, String> {
    match s.trim() {
        "forever" => Ok(Wait::Forever),
        "0" => Ok(Wait::For(Duration::ZERO)),
        other => match human_duration(other) {
            Ok(Some(d)) => Ok(Wait::For(d)),
            Ok(None) => Err(format!("{} (use \"forever\")", too_long(s))),
            Err(e) => Err(format!(
                "\"{s}\" is not `0`, `forever` or a duration like \"10m\" ({e})"
            )),
        },
    }
}

/// Formats a duration the way a profile would say it.
pub fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

fn resolve_group(g: &str) -> Option<u32> {
    if let Ok(gid) = g.parse::<u32>() {
        return Some(gid);
    }
    nix::unistd::Group::from_name(g)
        .ok()
        .flatten()
        .map(|gr| gr.gid.as_raw())
}

/// A file that holds a secret must be the user's (or root's) and private (as ssh insists),
/// and a regular file: checked on the descriptor opened (without blocking).
pub fn check_secret_file(path: &Path) -> Result<()> {
    open_secret(path, "secret file").map(|_| ())
}

/// Opens a file that holds a secret and checks it on the descriptor: a regular file, owned
/// by the user or root, not readable by group or others.
fn open_secret(path: &Path, what: &str) -> Result<(fs::File, nix::sys::stat::FileStat)> {
    let (file, st) = files::open_regular(
        path,
        what,
        nix::fcntl::OFlag::O_RDONLY,
        nix::sys::stat::Mode::empty(),
    )?;
    let uid = nix::unistd::geteuid().as_raw();
    if st.st_uid != uid && st.st_uid != 0 {
        return Err(err!(
            Config,
            "{} holds a password but is owned by uid {}, not by you (uid {uid}) or root",
            shown(path),
            st.st_uid
        ));
    }
    if st.st_mode & 0o077 != 0 {
        return Err(err!(
            Config,
            "{} holds a password but its mode is {:04o}: it must not be readable by group or others (chmod 600)",
            shown(path),
            st.st_mode & 0o7777
        ));
    }
    Ok((file, st))
}

/// Takes keys out of one table; whatever is left at the end is an unknown key.
struct Fields<'a> {
    file: &'a Path,
    ctx: &'a str,
    table: Table,
}

impl<'a> Fields<'a> {
    fn new(file: &'a Path, ctx: &'a str, table: &Table) -> Fields<'a> {
        Fields {
            file,
            ctx,
            table: table.clone(),
        }
    }

    fn error(&self, msg: &str) -> Error {
        err!(Config, "{}: {}: {msg}", shown(self.file), self.ctx)
    }

    fn string(&mut self, key: &str) -> Result<Option<String>> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(Value::Integer(0)) if key == "wait" => Ok(Some("0".into())),
            Some(other) => Err(self.error(&format!(
                "`{key}` must be a string, not {}",
                other.type_str()
            ))),
        }
    }

    fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.table.remove(key) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(b)),
            Some(other) => Err(self.error(&format!(
                "`{key}` must be true or false, not {}",
                other.type_str()
            ))),
        }
    }

    fn finish(self) -> Result<()> {
        match self.table.keys().next() {
            None => Ok(()),
            Some(key) => Err(self.error(&format!("unknown key `{key}`"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_human() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
        assert_eq!(parse_wait("0"), Ok(Wait::For(Duration::ZERO)));
        assert_eq!(parse_wait("forever"), Ok(Wait::Forever));
        assert_eq!(parse_wait("10m"), Ok(Wait::For(Duration::from_secs(600))));
        assert_eq!(parse_duration("1h 5min 2s"), Ok(Duration::from_secs(3902)));
        assert_eq!(parse_duration("1.5s250ms"), Ok(Duration::from_millis(1750)));
        assert_eq!(parse_duration("100y"), Ok(MAX_DURATION));
    }

    /// Found by the proptests: humantime 2.4 panicked on these (its issue #66), and durations
    /// too long for a deadline made the helper panic later (`Instant + Duration`).
    #[test]
    fn huge_durations_are_errors_not_panics() {
        for s in [
            "18446744073709551615s1000ms",
            "18446744073709551615s 999999999ns 1ns",
            "18446744073709551615s 1000000000ns",
            "300000000000y",
            "100y 1ns",
            "584542046090y",
        ] {
            let e = parse_duration(s).unwrap_err();
            assert!(e.contains("longer than the limit of 100 years"), "{s}: {e}");
            let e = parse_wait(s).unwrap_err();
            assert!(e.contains("use \"forever\""), "{s}: {e}");
        }
        // Overflowing one term is still humantime's own error.
        assert!(
            parse_duration("99999999999999999999s")
                .unwrap_err()
                .contains("too large")
        );
    }

    #[test]
    fn duration_errors_point_into_the_whole_string() {
        let e = parse_duration("1h 30x").unwrap_err();
        assert!(e.contains("\"x\""), "{e}");
        let e = parse_duration("1h 3$s").unwrap_err();
        assert!(e.contains("invalid character at 4"), "{e}");
    }

    #[test]
    fn names() {
        assert!(valid_name("phone.stuff-1_a"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"x".repeat(65)));
    }
}

#[cfg(test)]
mod proptests;
