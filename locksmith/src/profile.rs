//! The profiles file (SPEC §5): where it is, reading it, and precedence — command line >
//! profile > `[defaults]` > built-in. Raw TOML in, a validated [`Profile`] out (two stages,
//! as ripgrep does with its flags); each backend reads its own keys (`backend/*.rs`), and a
//! profile's `url = "ADDRESS"` goes through the same door as an address on the command line.
//! Every error names the file, the profile and the key (exit 78).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::backend::{self, Entry, Profile};
use crate::error::{Error, Kind, Result, err, shown};
use crate::files;
use crate::settings::{
    Common, Env, Fields, KeyDoc, Origin, Overrides, apply_timing, check_secret_file,
};

/// Subcommand names; a profile may not be called like one of them.
pub const SUBCOMMANDS: &[&str] = &[
    "hold", "run", "status", "break", "verify", "profiles", "help",
];

/// The keys of a profile that are not any backend's (the profiles man page).
pub static PROFILE_KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "backend",
        example: "\"mkdir\"",
        doc: "the backend: flock, mkdir, link, symlink, ftp, postgres, etcd or redis (or give url)",
    },
    KeyDoc {
        key: "url",
        example: "\"mkdir:/var/lock/myapp/x\"",
        doc: "the lock's address (as on the command line, without a password) in place of backend and its location keys; the profile's other keys add to its query",
    },
];

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
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".config"))
        });
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
        "no profiles file found (tried --profiles, $LOCKSMITH_PROFILES, {}): lock by address \
         instead, which needs none (`locksmith run /tmp/x.lock -- CMD`, see `locksmith help`), \
         or write {} (`man locksmith-profiles`; profiles.example.toml is an example)",
        tried.join(", "),
        tried.first().map_or("one", String::as_str)
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

    /// The backend name a profile declares (`backend`, or its `url`'s scheme), without
    /// validating the rest.
    pub fn backend_of(&self, name: &str) -> Option<&str> {
        let raw = self.profiles.get(name)?;
        match (raw.get("backend"), raw.get("url")) {
            (Some(b), _) => b.as_str(),
            (None, Some(Value::String(url))) => backend::entry_of_address(url)
                .ok()
                .flatten()
                .map(|e| e.name),
            (None, _) => None,
        }
    }

    /// Where the keys of one section come from, for [`Fields`].
    fn origin(&self, ctx: &str, profile: Option<&str>) -> Origin {
        Origin {
            ctx: format!("{}: {ctx}", shown(&self.path)),
            kind: Kind::Config,
            dir: self.dir.clone(),
            profile: profile.map(str::to_string),
            file: Some(self.path.clone()),
            address: None,
        }
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
            let hint = crate::error::closest(name, self.names())
                .map(|c| format!("; did you mean `{c}`?"))
                .unwrap_or_default();
            return Err(err!(
                Config,
                "{}: unknown profile `{name}` (known: {}){hint}",
                shown(&self.path),
                crate::error::some_of(self.names(), 10)
            ));
        };
        let mut common = Common::builtin();
        let mut defaults = Fields::new(self.origin("[defaults]", None), self.defaults.clone());
        apply_timing(&mut defaults, &mut common)?;
        defaults.finish()?;

        let mut origin = self.origin(&format!("profile `{name}`"), Some(name));
        let mut table = raw.clone();
        let entry = match (table.remove("backend"), table.get("url")) {
            (Some(Value::String(b)), _) => backend::entry(&b)
                .map_err(|m| Error::new(Kind::Config, format!("{}: {m}", origin.ctx)))?,
            (Some(other), _) => {
                return Err(Error::new(
                    Kind::Config,
                    format!(
                        "{}: `backend` must be a string, not {}",
                        origin.ctx,
                        other.type_str()
                    ),
                ));
            }
            (None, Some(Value::String(url))) => {
                let url = url.clone();
                let (entry, keys) = self.url_keys(&origin, &url, &mut table)?;
                table = keys;
                origin.address = Some(Env {
                    // Profiles name their password's source (SPEC §3a).
                    locksmith_password: false,
                    ..Env::current()
                });
                entry
            }
            (None, _) => {
                return Err(Error::new(
                    Kind::Config,
                    format!(
                        "{}: missing required key `backend` (or `url` = a lock address)",
                        origin.ctx
                    ),
                ));
            }
        };
        backend::configure(name, entry, Fields::new(origin, table), common, overrides)
    }

    /// A profile's `url = "ADDRESS"` in place of `backend`, `host`, `path`...: the address's
    /// keys, with the profile's other keys over its query (repeating a part of the address
    /// is an error).
    fn url_keys(
        &self,
        origin: &Origin,
        url: &str,
        profile: &mut Table,
    ) -> Result<(&'static Entry, Table)> {
        let ctx = format!(
            "{}: `url` = \"{}\"",
            origin.ctx,
            backend::shown_address(url)
        );
        let bad = |m: &str| Error::new(Kind::Config, format!("{ctx}: {m}"));
        let entry = match backend::entry_of_address(url) {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                return Err(bad(
                    "not a lock address (a path, or SCHEME:...; with `backend = \"postgres\"` a libpq URL)",
                ));
            }
            Err(e) => return Err(bad(e.message())),
        };
        let (mut keys, parts) = backend::address_keys(entry, url).map_err(|m| bad(&m))?;
        profile.remove("url");
        for (k, v) in std::mem::take(profile) {
            if parts.contains(&k) {
                return Err(bad(&format!(
                    "`{k}` is part of the address; give it there, not as a key too"
                )));
            }
            keys.insert(k, v);
        }
        Ok((entry, keys))
    }
}

/// Profile names: `[A-Za-z0-9._-]{1,64}`.
pub fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(valid_name("phone.stuff-1_a"));
        assert!(!valid_name(""));
        assert!(!valid_name("a/b"));
        assert!(!valid_name(&"x".repeat(65)));
    }

    /// Issue 14: `url = "ADDRESS"` in a profile: the profile's name is the default of what
    /// an address on the command line must say (postgres's `lock`, etcd's `prefix`), and a
    /// profile's own keys override the address's query.
    #[cfg(all(feature = "postgres", feature = "etcd"))]
    #[test]
    fn url_profiles_default_to_the_profile_name() {
        use crate::backend::BackendConfig;
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let pf = ProfilesFile::parse(
            &path,
            "[profile.nightly]\nurl = \"postgres://locker@db.example.com/app?wait=0\"\nwait = \"5s\"\n\
             [profile.deploy]\nurl = \"etcds://a:2379,b:2379\"\n",
        )
        .unwrap();
        let p = pf.profile("nightly", &Overrides::default()).unwrap();
        let BackendConfig::Postgres(c) = &p.backend else {
            panic!("{p:?}")
        };
        assert_eq!(
            (c.lock.as_str(), c.host.as_str(), c.port),
            ("nightly", "db.example.com", 5432)
        );
        assert_eq!(
            p.common.wait,
            crate::settings::Wait::For(std::time::Duration::from_secs(5))
        );
        let p = pf.profile("deploy", &Overrides::default()).unwrap();
        let BackendConfig::Etcd(c) = &p.backend else {
            panic!("{p:?}")
        };
        assert_eq!(c.prefix, "/locksmith/deploy");
        assert_eq!(c.endpoints, ["https://a:2379", "https://b:2379"]);
        assert!(c.tls);
        assert_eq!(pf.backend_of("deploy"), Some("etcd"));
    }
}

// The FTP profiles are part of the generated ones.
#[cfg(all(test, feature = "ftp"))]
mod proptests;
