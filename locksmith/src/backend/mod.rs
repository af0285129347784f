//! The lock backends: the registry of every backend, and a profile's validation.
//!
//! The contract a backend implements is [`lock`] ([`lock::Backend`] to lock,
//! [`lock::Registered`] to be named, configured, opened and verified); the policies every
//! backend shares live once each: waiting in [`wait`], holding (heartbeats, LOST, release
//! retried) in [`hold`], the staleness rule of SPEC §6 in [`stale`]. The protocol and watch
//! code never see a backend's details.

pub mod address;
pub mod fair;
pub mod faults;
pub mod filelock;
pub mod hold;
pub mod lock;
pub mod lockdir;
pub mod owner;
pub mod room;
pub mod slots;
pub mod stale;
pub mod verify;
pub mod wait;
pub mod waiting;
pub mod wake;

use std::path::Path;

use toml::Table;

use self::address::Address;
use self::lock::{Backend, Named, Registered};
use crate::error::{Error, Kind, Result};
use crate::settings::{Common, Env, Fields, KeyDoc, Origin, Overrides, Password, apply_timing};

/// The registry: one line per backend — its variant of [`BackendConfig`], its module and type
/// (which implements [`Registered`] and [`Backend`]), the cargo feature that builds it, its
/// name (`backend = "NAME"`), its address schemes (the first the usual one) and what it is in
/// one line (the profiles man page, `--version`). Adding a backend is its file and its line.
macro_rules! backends {
    ($($(#[cfg($cfg:meta)])? $variant:ident = $module:ident :: $ty:ident, $name:literal, $schemes:tt, $about:literal;)+) => {
        $($(#[cfg($cfg)])? pub mod $module;)+

        /// The backends, in the order messages list them.
        pub static BACKENDS: &[Entry] = &[$(
            $(#[cfg($cfg)])?
            Entry {
                name: $name,
                schemes: &$schemes,
                parse: Some(|f| <$module::$ty as Registered>::parse(f).map(BackendConfig::$variant)),
                address: <$module::$ty as Registered>::parts,
                about: $about,
                keys: <$module::$ty as Registered>::KEYS,
                on_files: <$module::$ty as Registered>::ON_FILES,
            },
            $(
            #[cfg(not($cfg))]
            Entry {
                name: $name,
                schemes: &$schemes,
                parse: None,
                address: address::path_keys,
                about: $about,
                keys: &[],
                // Only network backends are left out of a build.
                on_files: false,
            },
            )?
        )+];

        /// Which backend, with its own settings.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum BackendConfig {
            $($(#[cfg($cfg)])? $variant(<$module::$ty as Registered>::Config),)+
        }

        impl BackendConfig {
            pub fn name(&self) -> &'static str {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(_) => $name,)+
                }
            }

            /// Where the lock is, for `-v`: never a password (a postgres `url` is not shown
            /// at all, since a connection string may carry one).
            pub fn location(&self) -> String {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::location(c),)+
                }
            }

            /// Whether the backend can take a shared (reader) lock.
            pub fn supports_shared(&self) -> bool {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(_) => <$module::$ty as Registered>::SHARED,)+
                }
            }

            /// Whether backend `name` can take a shared lock (`false` for an unknown name).
            #[cfg(test)]
            fn supports_shared_by_name(name: &str) -> bool {
                let mut yes = false;
                $($(#[cfg($cfg)])? if name == $name { yes = <$module::$ty as Registered>::SHARED; })+
                yes
            }

            /// Whether backend `name` keeps several slots (`false` for an unknown name).
            #[cfg(test)]
            fn supports_slots_by_name(name: &str) -> bool {
                let mut yes = false;
                $($(#[cfg($cfg)])? if name == $name { yes = <$module::$ty as Registered>::SLOTS; })+
                yes
            }

            /// Whether the backend keeps several slots (SPEC §3b).
            pub fn supports_slots(&self) -> bool {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(_) => <$module::$ty as Registered>::SLOTS,)+
                }
            }

            /// The same lock's slot `k` of several: where its holder keeps its lock.
            pub fn slot(&self, k: u32) -> BackendConfig {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(c) => BackendConfig::$variant(<$module::$ty as Registered>::slot(c, k)),)+
                }
            }

            /// The lock's fair queue, where the backend keeps one.
            pub fn queue(&self) -> Option<BackendConfig> {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::queue(c).map(BackendConfig::$variant),)+
                }
            }

            /// The lock's waiting room, where the backend keeps one ([`Registered::room`]).
            pub fn room(&self, lock: &Named) -> Option<room::Room> {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::room(c, lock),)+
                }
            }

            /// The places of the lock's fair queue ([`Registered::PLACES`]).
            pub fn places(&self) -> u32 {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(_) => <$module::$ty as Registered>::PLACES,)+
                }
            }

            /// Where the server password comes from, for the server backends.
            pub fn password(&self) -> Option<&Password> {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::password(c),)+
                }
            }

            /// The environment variables that carry the lock's server secrets (never CMD's).
            pub fn secret_env(&self) -> Vec<&str> {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::secret_env(c),)+
                }
            }

            /// Whether the backend locks a file a second mount may show (`verify --peer`).
            fn on_files(&self) -> bool {
                match self {
                    $($(#[cfg($cfg)])? BackendConfig::$variant(_) => <$module::$ty as Registered>::ON_FILES,)+
                }
            }
        }

        /// Opens the backend `cfg` says. Nothing is created or taken yet.
        fn open_config(cfg: &BackendConfig, named: &Named) -> Box<dyn Backend> {
            match cfg {
                $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::open(c, named),)+
            }
        }

        /// `verify`'s report on the lock's filesystem or server: what its backend relies on,
        /// probed. `peer`: a second mount of a file lock's directory.
        pub fn verify(profile: &Profile, peer: Option<&Path>) -> Result<verify::Report> {
            if let Some(dir) = peer
                && !profile.backend.on_files()
            {
                return Err(crate::error::err!(
                    Usage,
                    "--peer {} names a second mount of a lock's directory: it applies to the file backends (flock, mkdir, link, symlink), not to backend `{}`, whose server every host sees alike",
                    dir.display(),
                    profile.backend.name()
                ));
            }
            let named = &profile.named();
            match &profile.backend {
                $($(#[cfg($cfg)])? BackendConfig::$variant(c) => <$module::$ty as Registered>::verify(c, named, peer),)+
            }
        }
    };
}

backends! {
    Flock = flock::Flock, "flock", ["flock"], "flock(2) on a file that stays after release (the kernel releases it if everything dies); interoperates with flock(1); shared locks";
    Mkdir = mkdir::Mkdir, "mkdir", ["mkdir"], "a lock directory, atomic on local disks and NFS; heartbeats let waiters on other hosts break a dead holder";
    Link = link::Link, "link", ["link"], "an NFS-safe hard-link lock file (what the lock name holds judges success); heartbeats";
    Symlink = symlink::Symlink, "symlink", ["symlink"], "an NFS-safe reservation plus symlink scheme with shared (reader) locks; heartbeats";
    #[cfg(feature = "ftp")] Ftp = ftp::Ftp, "ftp", ["ftp", "ftps"], "an FTP or FTPS MKD lock directory on a server (the seed's case); shared locks by marker files";
    #[cfg(feature = "postgres")] Postgres = postgres::Postgres, "postgres", ["postgres", "postgresql"], "a PostgreSQL advisory lock held by a session; fencing tokens in a small table";
    #[cfg(feature = "etcd")] Etcd = etcd::Etcd, "etcd", ["etcd", "etcds"], "an etcd lease-backed lock key under a prefix; shared locks";
    #[cfg(feature = "s3")] S3 = s3::S3, "s3", ["s3"], "an object created by a conditional write on S3 or an S3-compatible server; staleness on the server's clock; shared locks";
    #[cfg(feature = "redis")] Redis = redis::Redis, "redis", ["redis", "rediss"], "a key with an expiry on one Redis or Valkey server, set and renewed by compare-first scripts; fencing tokens by INCR; shared locks";
}

/// One backend as the two front doors see it: its name (`backend = "NAME"`), its address
/// schemes, the parser of its keys and the keys its address says — made by [`backends!`]
/// from its line and its [`Registered`] implementation.
pub struct Entry {
    pub name: &'static str,
    /// Address schemes (SPEC §3a), the first the usual one.
    pub schemes: &'static [&'static str],
    /// Reads the backend's own keys (a profile section or an address: the same code).
    /// `None`: left out of this build (the cargo feature of the same name).
    parse: Option<fn(&mut Fields) -> Result<BackendConfig>>,
    /// The keys an address's parts say (its query is added by [`address::keys`]).
    address: fn(&Address) -> std::result::Result<Table, String>,
    /// What it is, one line (the profiles man page, `--version`).
    pub about: &'static str,
    /// Its own keys, documented where they are parsed (empty when left out of the build).
    pub keys: &'static [&'static [KeyDoc]],
    /// It locks a file of this host's filesystems: its addresses are `SCHEME:PATH`, the
    /// others' `SCHEME://HOST…` (SPEC §3a).
    pub on_files: bool,
}

impl Entry {
    /// Whether this build has it (its cargo feature).
    pub fn built(&self) -> bool {
        self.parse.is_some()
    }

    /// Its parser; a backend this build lacks is handed to the companion executable, which
    /// has it ([`crate::companion`]: returns only if there is none), else why not.
    fn parser(&self) -> std::result::Result<fn(&mut Fields) -> Result<BackendConfig>, String> {
        self.parse.ok_or_else(|| {
            let why = crate::companion::hand_over(self.name);
            format!(
                "backend `{0}` was left out of this build of locksmith (cargo feature `{0}`), and {why}",
                self.name
            )
        })
    }
}

/// Every address scheme as a lock address begins: `mkdir:`, `ftp://`… (completions).
pub fn scheme_prefixes() -> Vec<String> {
    BACKENDS
        .iter()
        .flat_map(|e| {
            let sep = if e.on_files { ":" } else { "://" };
            e.schemes.iter().map(move |s| format!("{s}{sep}"))
        })
        .collect()
}

/// The backend called `name`, or a config error naming the known ones.
pub fn entry(name: &str) -> std::result::Result<&'static Entry, String> {
    BACKENDS.iter().find(|e| e.name == name).ok_or_else(|| {
        let known: Vec<&str> = BACKENDS.iter().map(|e| e.name).collect();
        format!("unknown backend `{name}` (known: {})", known.join(", "))
    })
}

/// Opens the lock a profile names. Nothing is created or taken yet. A backend that keeps
/// slots is opened through [`slots::Slots`] (SPEC §3b), one slot or many, so that every
/// contender compares its number of slots with the lock's — except in flock(1)'s forms,
/// which keep nothing beside the file.
pub fn open(profile: &Profile) -> Result<Box<dyn Backend>> {
    let named = profile.named();
    if !profile.backend.supports_slots() || profile.common.flock1 {
        return Ok(open_config(&profile.backend, &named));
    }
    let cfg = profile.backend.clone();
    let room = profile.backend.room(&named);
    let lock = slots::Slots::new(
        &profile.name,
        profile.common.slots,
        slots_of(cfg, named.clone()),
    )
    .shared(profile.common.shared)
    .room(room.clone());
    let lock: Box<dyn Backend> = match profile.queue() {
        Some((queue, named)) if profile.common.fair => {
            let common = named.common.clone();
            Box::new(fair::Fair::new(
                lock,
                &profile.name,
                &common,
                slots_of(queue, named),
            ))
        }
        _ => Box::new(lock),
    };
    Ok(match room {
        Some(room) => Box::new(waiting::Waiting::new(
            lock,
            &profile.name,
            room,
            profile.common.slots,
        )),
        None => lock,
    })
}

/// How to open lock `cfg`'s slots (and the lock itself).
fn slots_of(cfg: BackendConfig, named: Named) -> slots::Opener {
    std::sync::Arc::new(move |k| match k {
        None => open_config(&cfg, &named),
        Some(k) => open_config(&cfg.slot(k), &named),
    })
}

/// The waiters of a fair lock, in their order (SPEC §3b: `status`); empty unless the profile
/// says `fair`.
pub fn waiters(profile: &Profile) -> Result<Vec<lock::Holder>> {
    match profile.queue() {
        Some((queue, named)) if profile.common.fair && !profile.common.flock1 => {
            let places = named.common.slots;
            fair::waiters(&slots_of(queue, named), places)
        }
        _ => Ok(Vec::new()),
    }
}

/// A validated profile: a profile section, or a lock address standing for one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The profile's name, or the address as given ([`address::display`]).
    pub name: String,
    pub backend: BackendConfig,
    pub common: Common,
    /// The profile (or the address's query) itself said `shared = true` (a refusal is then
    /// of its origin's kind, not 64 for `--shared`).
    pub shared_from_profile: bool,
}

impl Profile {
    /// What its backend is opened with besides its own settings.
    pub fn named(&self) -> Named {
        Named {
            name: self.name.clone(),
            common: self.common.clone(),
            acquisition: crate::host::nonce(),
        }
    }

    /// Its fair queue (SPEC §3b), where its backend keeps one: the queue's settings, and the
    /// queue as a lock of exclusive slots — the places, as many as the lock's backend keeps
    /// ([`Registered::PLACES`]) — with the lock's timing.
    fn queue(&self) -> Option<(BackendConfig, Named)> {
        let cfg = match &self.backend {
            // A flock holder's number cannot be read by others (nothing is written beside a
            // flock lock but its counter): flock's line is kept by mkdir locks beside it,
            // which record their holders' numbers, and are freed at once when one dies here.
            BackendConfig::Flock(c) => BackendConfig::Mkdir(c.queue()),
            other => other.queue()?,
        };
        let common = Common {
            shared: false,
            slots: self.backend.places(),
            fair: false,
            ..self.common.clone()
        };
        // The records of a place name the lock's profile (a name without spaces: some
        // backends' records are space-separated).
        let name = self.name.clone();
        let acquisition = crate::host::nonce();
        Some((
            cfg,
            Named {
                name,
                common,
                acquisition,
            },
        ))
    }
}

/// Both front doors end here: the common keys (timing over `common`, `shared`), the
/// backend's own keys, no key left over, then `overrides` (the command line), the floors
/// and cross-key rules, and whether the backend can share. Errors are of `f`'s origin kind
/// (78 in a profiles file, 64 on the command line), except `--shared` (64).
pub fn configure(
    name: &str,
    entry: &Entry,
    mut f: Fields,
    mut common: Common,
    overrides: &Overrides,
) -> Result<Profile> {
    apply_timing(&mut f, &mut common)?;
    let shared_from_profile = f.bool("shared")?.unwrap_or(false);
    common.shared = shared_from_profile;
    let slots_from_profile = f.slots("slots")?;
    common.slots = slots_from_profile.unwrap_or(1);
    let fair_from_profile = f.bool("fair")?.unwrap_or(false);
    common.fair = fair_from_profile;
    let parse = entry.parser().map_err(|m| f.error(&m))?;
    let backend = parse(&mut f)?;
    let origin = f.origin().clone();
    f.finish()?;
    if let Some(w) = overrides.wait {
        common.wait = w;
    }
    if overrides.shared {
        common.shared = true;
    }
    if let Some(n) = overrides.slots {
        common.slots = n;
    }
    if overrides.fair {
        common.fair = true;
    }
    common.settle();
    common
        .check()
        .map_err(|m| Error::new(origin.kind, format!("{}: {m}", origin.ctx)))?;
    if common.shared && !backend.supports_shared() {
        let (kind, why) = if shared_from_profile {
            (origin.kind, "the profile says `shared = true`")
        } else {
            (Kind::Usage, "--shared was given")
        };
        let what = match origin.profile {
            Some(_) => format!("profile `{name}`"),
            None => format!("address `{name}`"),
        };
        return Err(Error::new(
            kind,
            format!(
                "backend `{}` ({what}) cannot take a shared lock, but {why}",
                backend.name()
            ),
        ));
    }
    if common.slots > 1 {
        // Which of the two a refusal blames: the command line (64) or the profile (its kind).
        let (kind, said) = match (overrides.slots, slots_from_profile) {
            (Some(_), _) => (Kind::Usage, format!("--slots {}", common.slots)),
            (None, _) => (origin.kind, format!("`slots = {}`", common.slots)),
        };
        if common.shared {
            let kind = if overrides.shared { Kind::Usage } else { kind };
            return Err(Error::new(
                kind,
                format!(
                    "{said} with a shared lock: a semaphore's slots are exclusive (use slots, or \
                     --shared, not both)"
                ),
            ));
        }
        if !backend.supports_slots() {
            return Err(Error::new(
                kind,
                format!(
                    "backend `{}` cannot keep several slots yet, but {said} was given",
                    backend.name()
                ),
            ));
        }
    }
    if common.fair && backend.queue().is_none() {
        let (kind, said) = if overrides.fair {
            (Kind::Usage, "--fair")
        } else {
            (origin.kind, "`fair = true`")
        };
        return Err(Error::new(
            kind,
            format!(
                "backend `{}` cannot keep a fair queue yet, but {said} was given",
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

/// The backend a word names as a lock address (SPEC §3a); `Ok(None)`: a profile name; a
/// usage error for a word with `:` and no known scheme.
pub fn entry_of_address(word: &str) -> Result<Option<&'static Entry>> {
    Ok(address::classify(word, &schemes())?
        .map(|s| entry_of_scheme(s).expect("classify answers a scheme of the table")))
}

/// Every scheme of the table, in its order.
pub fn schemes() -> Vec<&'static str> {
    BACKENDS
        .iter()
        .flat_map(|e| e.schemes.iter().copied())
        .collect()
}

fn entry_of_scheme(scheme: &str) -> Option<&'static Entry> {
    BACKENDS.iter().find(|e| e.schemes.contains(&scheme))
}

/// The keys an address says (its parts, then its query), and which of them its parts said.
pub fn address_keys(
    entry: &Entry,
    text: &str,
) -> std::result::Result<(Table, Vec<String>), String> {
    // Before its parts are read: a backend this build lacks reads them its own way, in the
    // companion it is handed to (a profile's `url` and a command line's address alike).
    entry.parser()?;
    address::keys(entry.address, text, &schemes())
}

/// An address as messages show it (a password-like part masked).
pub fn shown_address(text: &str) -> String {
    address::shown(text)
}

/// A lock address given on the command line (SPEC §3a): no profiles file, built-in
/// defaults, relative paths from the current directory; a bad address is 64.
pub fn from_address(
    entry: &Entry,
    text: &str,
    env: &Env,
    overrides: &Overrides,
) -> Result<Profile> {
    let ctx = format!("address `{}`", address::shown(text));
    let (table, _) =
        address_keys(entry, text).map_err(|m| Error::new(Kind::Usage, format!("{ctx}: {m}")))?;
    let origin = Origin {
        ctx,
        kind: Kind::Usage,
        dir: env.cwd.clone(),
        profile: None,
        file: None,
        address: Some(env.clone()),
    };
    configure(
        &address::display(text),
        entry,
        Fields::new(origin, table),
        Common::builtin(),
        overrides,
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::settings::{ASKED, COMMON_KEYS};

    /// A profile `p` of a profiles file, as the keys' origin.
    fn origin(e: &Entry) -> Origin {
        Origin {
            ctx: format!("profile `{}`", e.name),
            kind: Kind::Config,
            dir: "/tmp".into(),
            profile: Some("p".into()),
            file: None,
            address: None,
        }
    }

    fn scheme_of(word: &str) -> Result<Option<&'static str>> {
        entry_of_address(word).map(|e| e.map(|e| e.name))
    }

    #[test]
    fn words_are_profiles_paths_or_addresses() {
        assert_eq!(scheme_of("phonestuff").unwrap(), None);
        assert_eq!(scheme_of("/tmp/x.lock").unwrap(), Some("flock"));
        assert_eq!(scheme_of("./x.lock").unwrap(), Some("flock"));
        assert_eq!(scheme_of("/tmp/a:b").unwrap(), Some("flock"));
        assert_eq!(scheme_of("mkdir:/p").unwrap(), Some("mkdir"));
        assert_eq!(scheme_of("MKDIR:/p").unwrap(), Some("mkdir"));
        assert_eq!(scheme_of("ftps://h/p").unwrap(), Some("ftp"));
        assert_eq!(scheme_of("postgresql://h/db").unwrap(), Some("postgres"));
        assert_eq!(scheme_of("etcds://h:1/p").unwrap(), Some("etcd"));
        assert_eq!(scheme_of("redis://h/2?key=k").unwrap(), Some("redis"));
        assert_eq!(scheme_of("REDISS://h?key=k").unwrap(), Some("redis"));
        let e = scheme_of("nfs:x").unwrap_err();
        assert_eq!(e.kind(), Kind::Usage);
        assert!(e.message().contains("mkdir"), "{e}");
        // `SCHEME://` of an unknown scheme is a usage error, never a relative path (SPEC
        // §3a, issue 25); a `/` before any `scheme:` keeps a path a path.
        assert_eq!(scheme_of("s3://bkt/k").unwrap(), Some("s3"));
        for url in ["sftp://h/x", "file:///x"] {
            assert_eq!(scheme_of(url).unwrap_err().kind(), Kind::Usage, "{url}");
        }
        assert_eq!(scheme_of("./x:y").unwrap(), Some("flock"));
        assert_eq!(scheme_of("./s3://b").unwrap(), Some("flock"));
    }

    /// The least each backend needs to parse, as a profile section says it.
    fn minimal(name: &str) -> &'static str {
        match name {
            "ftp" => "host = \"h\"\nuser = \"u\"\npath = \"p\"",
            "postgres" => "host = \"h\"",
            "etcd" => "endpoints = [\"h:1\"]",
            "s3" => "bucket = \"bkt\"",
            "redis" => "host = \"h\"",
            _ => "path = \"/tmp/x\"",
        }
    }

    /// The keys each backend's parser takes are exactly the keys it documents (what
    /// `--generate man-profiles` prints): a key added to a parser without its documentation,
    /// or documented but not parsed, fails here.
    #[test]
    fn every_backend_documents_exactly_the_keys_it_parses() {
        for e in BACKENDS.iter().filter(|e| e.built()) {
            let origin = origin(e);
            let table: Table = minimal(e.name).parse().unwrap();
            ASKED.with(|a| a.borrow_mut().clear());
            configure(
                "p",
                e,
                Fields::new(origin, table),
                Common::builtin(),
                &Overrides::default(),
            )
            .unwrap_or_else(|err| panic!("{}: {err}", e.name));
            let asked: BTreeSet<String> = ASKED.with(|a| a.borrow().iter().cloned().collect());
            let documented: BTreeSet<String> = COMMON_KEYS
                .iter()
                .chain(e.keys.iter().flat_map(|k| k.iter()))
                .map(|k| k.key.to_string())
                .collect();
            assert_eq!(asked, documented, "backend {}", e.name);
        }
    }

    /// Each documented example is a value its key accepts.
    #[test]
    fn documented_examples_parse() {
        for e in BACKENDS.iter().filter(|e| e.built()) {
            for k in COMMON_KEYS
                .iter()
                .chain(e.keys.iter().flat_map(|k| k.iter()))
            {
                // Keys that need another key's company get it.
                let company = match (e.name, k.key) {
                    ("ftp", "ca_file") => "\ntls = \"explicit\"",
                    ("postgres", "ca_file") => "\nsslmode = \"require\"",
                    ("etcd", "ca_file") => "\nendpoints = [\"https://h:1\"]",
                    ("etcd", "user") => "\npassword_env = \"X\"",
                    ("etcd", "password" | "password_env" | "password_file") => "\nuser = \"u\"",
                    ("redis", "ca_file") => "\ntls = true",
                    ("redis", "user") => "\npassword_env = \"X\"",
                    ("postgres", "url") => "",
                    _ => "",
                };
                let base = match (e.name, k.key) {
                    // url replaces host.
                    ("postgres", "url") => "",
                    ("etcd", "endpoints" | "ca_file") => "",
                    _ => minimal(e.name),
                };
                let mut text = format!("{base}{company}");
                if !text.contains(&format!("{} =", k.key)) {
                    text.push_str(&format!("\n{} = {}", k.key, k.example));
                }
                let table: Table = text
                    .parse()
                    .unwrap_or_else(|err| panic!("{} {}: {err}", e.name, k.key));
                let origin = origin(e);
                let r = configure(
                    "p",
                    e,
                    Fields::new(origin, table),
                    Common::builtin(),
                    &Overrides::default(),
                );
                // `shared` on a backend that cannot share, `slots` or `fair` on one that keeps
                // no slots: refused by design.
                let refused = match k.key {
                    "shared" => !BackendConfig::supports_shared_by_name(e.name),
                    "slots" => !BackendConfig::supports_slots_by_name(e.name),
                    // A fair queue is kept by the slots of a lock beside the lock's.
                    "fair" => !BackendConfig::supports_slots_by_name(e.name),
                    _ => false,
                };
                if refused {
                    assert!(
                        r.is_err(),
                        "{} {} = {} was accepted",
                        e.name,
                        k.key,
                        k.example
                    );
                } else {
                    r.unwrap_or_else(|err| panic!("{} {} = {}: {err}", e.name, k.key, k.example));
                }
            }
        }
    }
}
