//! What every backend shares, whichever door its settings came through (SPEC §3, §3a, §5):
//! durations, [`Wait`], [`Common`], [`Mode`], the command-line [`Overrides`], where a
//! password comes from ([`Password`], `.netrc`, `.pgpass`), and [`Fields`]: a typed reader of
//! one set of keys — a profile's TOML section or an address's query — that reports every key
//! nobody took. Each backend reads its own keys from it (`backend/*.rs`); this floor knows no
//! backend.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use toml::{Table, Value};

use crate::error::{Error, Kind, Result, err, shown};
use crate::files;

/// Exclusive (writer) or shared (reader).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Exclusive,
    Shared,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

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
    /// Holders admitted at once (SPEC §3b, `slots`): 1 is the mutex of §6.
    pub slots: u32,
    /// Waiters served in the order they began to wait (SPEC §3b, `fair`).
    pub fair: bool,
    /// flock(1)'s forms (and `-F`): the lock is the file alone, as flock(1) leaves it — no
    /// fencing-token state, no writer-preference gate beside it (issue 25, finding 12). Not a
    /// profile key: the command line's form says it.
    pub flock1: bool,
    /// Whether `keepalive` was given (in `[defaults]`, a profile or an address); if not, it
    /// follows `stale_after` ([`Common::settle`]).
    pub keepalive_given: bool,
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
            slots: 1,
            fair: false,
            flock1: false,
            keepalive_given: false,
        }
    }

    /// Once every source was applied: a `keepalive` nobody gave is the built-in one or a
    /// third of `stale_after`, whichever is shorter (never below its floor), so that
    /// `stale_after = "5s"` alone is a working lock, not a refusal that the built-in
    /// `keepalive` (5s) is not below it (issue 28). The heartbeat period is the same either
    /// way; a `keepalive` given is checked as given ([`Common::check`]).
    pub fn settle(&mut self) {
        if !self.keepalive_given {
            self.keepalive = self.keepalive.min(self.stale_after / 3).max(MIN_KEEPALIVE);
        }
    }

    /// The heartbeat period: min(`keepalive`, `stale_after`/3).
    pub fn heartbeat(&self) -> Duration {
        self.keepalive.min(self.stale_after / 3)
    }

    pub fn mode(&self) -> Mode {
        if self.shared {
            Mode::Shared
        } else {
            Mode::Exclusive
        }
    }

    /// The floors and the cross-key rules (SPEC §3): `Err` says which rule, naming the keys.
    pub fn check(&self) -> std::result::Result<(), String> {
        // Floors that keep a waiter and a holder idle (issue 15: `stale_after = "3ns"` with
        // `keepalive = "1ns"` spun at 100% CPU). Below them a value is refused, never raised.
        for (key, value, floor) in [
            ("poll", self.poll, MIN_POLL),
            ("keepalive", self.keepalive, MIN_KEEPALIVE),
            ("stale_after", self.stale_after, MIN_STALE_AFTER),
        ] {
            if value < floor {
                return Err(format!(
                    "`{key}` ({}) is below the floor of {}",
                    fmt_duration(value),
                    fmt_duration(floor)
                ));
            }
        }
        if self.max_poll < self.poll {
            return Err(format!(
                "`max_poll` ({}) is below `poll` ({})",
                fmt_duration(self.max_poll),
                fmt_duration(self.poll)
            ));
        }
        if self.keepalive >= self.stale_after {
            return Err(format!(
                "`keepalive` ({}) must be below `stale_after` ({})",
                fmt_duration(self.keepalive),
                fmt_duration(self.stale_after)
            ));
        }
        Ok(())
    }
}

/// Command-line values that override profile and defaults.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub wait: Option<Wait>,
    pub shared: bool,
    /// `--slots N`.
    pub slots: Option<u32>,
    /// `--fair`.
    pub fair: bool,
}

/// The most slots a lock may have (SPEC §3b).
pub const MAX_SLOTS: u32 = 1024;

/// A `slots` value: 1 to [`MAX_SLOTS`].
pub fn parse_slots(s: &str) -> std::result::Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=MAX_SLOTS).contains(&n) => Ok(n),
        _ => Err(format!(
            "\"{s}\" is not a number of slots from 1 to {MAX_SLOTS}"
        )),
    }
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

/// The longest duration locksmith accepts anywhere: 100 years. Far beyond any real wait or
/// timeout (`wait = "forever"` exists), and small enough that a deadline (now + duration)
/// can never overflow the clock, which would panic.
pub const MAX_DURATION: Duration = Duration::from_secs(100 * 31_557_600);

/// `humantime::parse_duration`, one term at a time (`1m 30s` is `1m` + `30s`), summed with
/// checked arithmetic; `Ok(None)` if the sum exceeds [`MAX_DURATION`]. humantime 2.4 panics
/// ("overflow in Duration::new", its issue #66) when the terms of one string add up to
/// `u64::MAX` seconds with a nanosecond carry (`18446744073709551615s1000ms`); a single
/// term cannot. Error offsets are shifted back to positions in `s`.
pub(crate) fn human_duration(
    s: &str,
) -> std::result::Result<Option<Duration>, humantime::DurationError> {
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
    let d = match bare_seconds(s) {
        Some(d) => d?,
        None => human_duration(s.trim())
            .map_err(|e| {
                format!("\"{s}\" is not a duration like \"250ms\", \"3s\", \"1m30s\" or 30 (seconds) ({e})")
            })?
            .ok_or_else(|| too_long(s))?,
    };
    if d.is_zero() {
        return Err(format!("\"{s}\" must be greater than 0"));
    }
    Ok(d)
}

/// Seconds as flock(1)'s `-w` takes them: digits with at most one `.` (`30`, `0.5`, `.5`);
/// `None` for anything else. The one reading of a bare number, for `-w` under the name
/// flock and for every duration of locksmith's (issue 25).
pub fn decimal_seconds(t: &str) -> Option<f64> {
    let number = !t.is_empty()
        && t.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && t.bytes().filter(|b| *b == b'.').count() <= 1
        && t != ".";
    if !number {
        return None;
    }
    t.parse().ok()
}

/// A bare number is seconds, fractions allowed, as flock(1)'s `-w` (issue 25): `None` if
/// `s` is not one.
fn bare_seconds(s: &str) -> Option<std::result::Result<Duration, String>> {
    let secs = decimal_seconds(s.trim())?;
    Some(match Duration::try_from_secs_f64(secs) {
        Ok(d) if d <= MAX_DURATION => Ok(d),
        _ => Err(too_long(s)),
    })
}

/// A `wait` value: `0` (try once), `forever`, or a duration (a bare number is seconds).
pub fn parse_wait(s: &str) -> std::result::Result<Wait, String> {
    match s.trim() {
        "forever" => Ok(Wait::Forever),
        other => match bare_seconds(other) {
            Some(d) => d
                .map(Wait::For)
                .map_err(|m| format!("{m} (use \"forever\")")),
            None => match human_duration(other) {
                Ok(Some(d)) => Ok(Wait::For(d)),
                Ok(None) => Err(format!("{} (use \"forever\")", too_long(s))),
                Err(e) => Err(format!(
                    "\"{s}\" is not `0`, `forever` or a duration like \"10m\" or 30 (seconds) ({e})"
                )),
            },
        },
    }
}

/// Formats a duration the way a profile would say it.
pub fn fmt_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
}

/// A `--wait`/`-w`/`--timeout` value on the command line: as [`parse_wait`] (a bare number
/// is seconds, fractions allowed, as flock(1) takes it: `-w 2.5`).
pub fn parse_wait_arg(s: &str) -> std::result::Result<Wait, String> {
    parse_wait(s)
}

/// Where a password comes from. Resolved only when connecting, so that validating a
/// profile (`profiles`) needs neither the variable nor the file; never printed (`Debug` hides
/// an inline value).
#[derive(Clone, PartialEq, Eq)]
pub enum Password {
    /// No password key: anonymous FTP sends a conventional one.
    None,
    Inline(String),
    Env(String),
    File(PathBuf),
    /// The `password` of the `.netrc` entry for `host` and the user (as curl and lftp read it).
    Netrc {
        file: PathBuf,
        host: String,
    },
    /// The `.pgpass` line for this host, port, database and user (as libpq reads it).
    Pgpass {
        file: PathBuf,
        host: String,
        port: u16,
        dbname: String,
    },
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Password::None => f.write_str("None"),
            Password::Inline(_) => f.write_str("Inline(<hidden>)"),
            Password::Env(v) => write!(f, "Env({v:?})"),
            Password::File(p) => write!(f, "File({p:?})"),
            Password::Netrc { file, host } => write!(f, "Netrc({file:?}, {host:?})"),
            Password::Pgpass { file, .. } => write!(f, "Pgpass({file:?})"),
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
                let text = read_secret(path, "password_file")?;
                // The first line, without its line ending.
                Ok(text.lines().next().unwrap_or("").to_string())
            }
            Password::Netrc { file, host } => netrc_entry(file, host, Some(user))?
                .and_then(|e| e.password)
                .ok_or_else(|| {
                    err!(
                        Config,
                        "{} has no password for machine {host} login {user}",
                        shown(file)
                    )
                }),
            Password::Pgpass {
                file,
                host,
                port,
                dbname,
            } => pgpass_password(file, host, *port, dbname, user)?.ok_or_else(|| {
                err!(
                    Config,
                    "{} has no line for {host}:{port}:{dbname}:{user}",
                    shown(file)
                )
            }),
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

/// A file that holds a secret must be the user's (or root's) and private (as ssh insists),
/// and a regular file: checked on the descriptor opened (without blocking).
pub fn check_secret_file(path: &Path) -> Result<()> {
    open_secret(path, "secret file").map(|_| ())
}

/// Opens a file that holds a secret and checks it on the descriptor: a regular file, owned
/// by the user or root, not readable by group or others.
pub fn open_secret(path: &Path, what: &str) -> Result<(fs::File, nix::sys::stat::FileStat)> {
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

/// A secret file's text, checked as [`open_secret`] does and read at most 64 KiB.
fn read_secret(path: &Path, what: &str) -> Result<String> {
    let (file, st) = open_secret(path, what)?;
    let bytes = files::read_capped(file, &st, path, what, files::SECRET_CAP)?;
    String::from_utf8(bytes).map_err(|_| err!(Config, "{what} {} is not UTF-8 text", shown(path)))
}

/// What the process environment says about password sources for an address (SPEC §3a):
/// read once, so that parsing is a function of its inputs (and testable without touching
/// the process's environment).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Env {
    /// `$HOME`, where `.netrc` and `.pgpass` live; `None` or empty: there are none.
    pub home: Option<PathBuf>,
    /// Relative paths of a command-line address anchor here.
    pub cwd: PathBuf,
    /// `$LOCKSMITH_PASSWORD` is set (addresses on the command line only).
    pub locksmith_password: bool,
    /// `$PGPASSWORD` is set (libpq's convention).
    pub pgpassword: bool,
    /// `$REDISCLI_AUTH` is set (redis-cli's convention).
    pub rediscli_auth: bool,
    /// `$PGPASSFILE` (libpq's convention), else `~/.pgpass`.
    pub pgpassfile: Option<PathBuf>,
}

impl Env {
    /// The environment of this process.
    pub fn current() -> Env {
        let var = |v: &str| std::env::var_os(v).filter(|s| !s.is_empty());
        Env {
            home: var("HOME").map(PathBuf::from),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            locksmith_password: var("LOCKSMITH_PASSWORD").is_some(),
            pgpassword: var("PGPASSWORD").is_some(),
            rediscli_auth: var("REDISCLI_AUTH").is_some(),
            pgpassfile: var("PGPASSFILE").map(PathBuf::from),
        }
    }

    /// The user's login name (libpq's default user), looked up only when asked.
    pub fn login(&self) -> String {
        nix::unistd::User::from_uid(nix::unistd::getuid())
            .ok()
            .flatten()
            .map_or_else(|| "postgres".to_string(), |u| u.name)
    }

    /// `~/.netrc`, if there is a home.
    pub fn netrc(&self) -> Option<PathBuf> {
        self.home.as_ref().map(|h| h.join(".netrc"))
    }

    /// `$PGPASSFILE`, else `~/.pgpass`.
    pub fn pgpass(&self) -> Option<PathBuf> {
        self.pgpassfile
            .clone()
            .or_else(|| self.home.as_ref().map(|h| h.join(".pgpass")))
    }
}

/// One `.netrc` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetrcEntry {
    pub login: Option<String>,
    pub password: Option<String>,
}

/// The `.netrc` entry for `host` (else the `default` entry), as curl reads the file: with
/// `user`, the first entry for the host whose login is that user (or that has no login);
/// `Ok(None)` if the file does not exist or has no such entry. A file readable by group or
/// others is refused (78), as for profiles files. `macdef` bodies are skipped.
pub fn netrc_entry(file: &Path, host: &str, user: Option<&str>) -> Result<Option<NetrcEntry>> {
    if !file.exists() {
        return Ok(None);
    }
    let text = read_secret(file, ".netrc")?;
    let mut entries: Vec<(Option<String>, NetrcEntry)> = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            match w {
                "machine" => entries.push((
                    Some(words.next().unwrap_or_default().to_string()),
                    NetrcEntry {
                        login: None,
                        password: None,
                    },
                )),
                "default" => entries.push((
                    None,
                    NetrcEntry {
                        login: None,
                        password: None,
                    },
                )),
                "login" | "password" | "account" => {
                    let v = words.next().unwrap_or_default().to_string();
                    if let Some((_, e)) = entries.last_mut() {
                        match w {
                            "login" => e.login = Some(v),
                            "password" => e.password = Some(v),
                            _ => {}
                        }
                    }
                }
                "macdef" => {
                    // The macro's body runs to the next empty line.
                    for l in lines.by_ref() {
                        if l.trim().is_empty() {
                            break;
                        }
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    let fits = |e: &NetrcEntry| user.is_none_or(|u| e.login.as_deref().is_none_or(|l| l == u));
    let found = entries
        .iter()
        .find(|(m, e)| m.as_deref() == Some(host) && fits(e))
        .or_else(|| entries.iter().find(|(m, e)| m.is_none() && fits(e)));
    Ok(found.map(|(_, e)| e.clone()))
}

/// The password of the first `.pgpass` line matching host, port, database and user (libpq's
/// format: `host:port:db:user:password`, `*` matches anything, `\:` and `\\` escape);
/// `Ok(None)` if the file does not exist or no line matches. A file readable by group or
/// others is refused (78).
pub fn pgpass_password(
    file: &Path,
    host: &str,
    port: u16,
    dbname: &str,
    user: &str,
) -> Result<Option<String>> {
    if !file.exists() {
        return Ok(None);
    }
    let text = read_secret(file, ".pgpass")?;
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::new();
        let mut cur = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => cur.extend(chars.next()),
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut cur)),
                c => cur.push(c),
            }
        }
        fields.push(cur);
        if fields.len() != 5 {
            continue;
        }
        let matches = [host, port.as_str(), dbname, user]
            .iter()
            .zip(&fields)
            .all(|(want, got)| got == "*" || got == want);
        if matches {
            return Ok(fields.pop());
        }
    }
    Ok(None)
}

/// One key of a profile section (or an address's query), documented where it is parsed:
/// `locksmith --generate man-profiles` renders these, and a unit test checks that each
/// backend's parser takes exactly the keys it documents.
pub struct KeyDoc {
    pub key: &'static str,
    /// An example value, as TOML writes it.
    pub example: &'static str,
    pub doc: &'static str,
}

/// The keys every backend takes (read by [`apply_timing`] and `backend::configure`).
pub static COMMON_KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "wait",
        example: "\"10m\"",
        doc: "give up after this long; \"0\" tries once; \"forever\" [default: forever]",
    },
    KeyDoc {
        key: "poll",
        example: "\"200ms\"",
        doc: "first retry interval where the backend must poll; grows with jitter [default: 200ms]",
    },
    KeyDoc {
        key: "max_poll",
        example: "\"4s\"",
        doc: "retry interval ceiling (\"don't hammer the server\") [default: 4s]",
    },
    KeyDoc {
        key: "keepalive",
        example: "\"5s\"",
        doc: "keep the connection, lease or heartbeat alive this often; the heartbeat runs every min(keepalive, stale_after/3) [default: 5s, or stale_after/3 if shorter]",
    },
    KeyDoc {
        key: "stale_after",
        example: "\"60s\"",
        doc: "a holder silent this long may be broken by a waiter, never sooner [default: 60s]",
    },
    KeyDoc {
        key: "shared",
        example: "true",
        doc: "take a shared (reader) lock where the backend can (flock, symlink, ftp, etcd, postgres) [default: false]",
    },
    KeyDoc {
        key: "slots",
        example: "2",
        doc: "a semaphore: up to this many holders at once, each in its own slot (1 to 1024); every contender of one lock must say the same [default: 1]",
    },
    KeyDoc {
        key: "fair",
        example: "true",
        doc: "a fair queue: waiters are served in the order they began to wait (every contender of the lock should say it) [default: false]",
    },
];

/// Where a password may come from (at most one of them; read by [`Fields::password`]).
pub static PASSWORD_KEYS: &[KeyDoc] = &[
    KeyDoc {
        key: "password",
        example: "\"s3cret\"",
        doc: "the password itself: the profiles file must then be the user's own (or root's) and not readable by group or others",
    },
    KeyDoc {
        key: "password_env",
        example: "\"PHONE_FTP_PASSWORD\"",
        doc: "the environment variable that holds the password (removed from CMD's environment)",
    },
    KeyDoc {
        key: "password_file",
        example: "\"/etc/locksmith/phone.password\"",
        doc: "a file holding the password on its first line; it must be the user's own and 0600",
    },
];

#[cfg(test)]
thread_local! {
    /// Every key a [`Fields`] was asked for on this thread (the documentation test).
    pub static ASKED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Where a set of keys comes from; errors are worded and classed after it.
#[derive(Clone, Debug)]
pub struct Origin {
    /// The start of every error: `FILE: profile `x`` or `address `…``.
    pub ctx: String,
    /// `Config` in a profiles file (a profile's `url` included), `Usage` on the command line.
    pub kind: Kind,
    /// Relative paths anchor here: the profiles file's directory, or the current directory.
    pub dir: PathBuf,
    /// The profile's name: the default of postgres's `lock` and etcd's `prefix`.
    pub profile: Option<String>,
    /// The profiles file, checked for privacy when one of its keys holds a secret.
    pub file: Option<PathBuf>,
    /// The keys came (at least partly) from an address: values may be strings for any type,
    /// and the password conventions of SPEC §3a apply, read from this environment.
    pub address: Option<Env>,
}

/// Takes keys out of one table (a profile section, or an address's parts and query); whatever
/// is left at the end is an unknown key.
pub struct Fields {
    origin: Origin,
    table: Table,
}

impl Fields {
    pub fn new(origin: Origin, table: Table) -> Fields {
        Fields { origin, table }
    }

    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// An error about these keys, of the origin's kind.
    pub fn error(&self, msg: &str) -> Error {
        Error::new(self.origin.kind, format!("{}: {msg}", self.origin.ctx))
    }

    pub fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// Relative `p` anchored where this origin's relative paths are.
    pub fn anchor(&self, p: impl AsRef<Path>) -> PathBuf {
        self.origin.dir.join(p)
    }

    /// Takes `key` out of the table (in the unit tests, noting that it was asked for).
    fn take(&mut self, key: &str) -> Option<Value> {
        #[cfg(test)]
        ASKED.with(|a| a.borrow_mut().push(key.to_string()));
        self.table.remove(key)
    }

    /// A key that must be there, read by `read` (e.g. `Fields::string`).
    pub fn required<T>(
        &mut self,
        key: &str,
        read: impl FnOnce(&mut Self, &str) -> Result<Option<T>>,
    ) -> Result<T> {
        read(self, key)?.ok_or_else(|| self.error(&format!("missing required key `{key}`")))
    }

    pub fn string(&mut self, key: &str) -> Result<Option<String>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            // A timing key's bare number is seconds (issue 25): `wait = 10`, `stale_after = 2.5`.
            Some(Value::Integer(n)) if TIMING.contains(&key) => Ok(Some(n.to_string())),
            Some(Value::Float(x)) if TIMING.contains(&key) => Ok(Some(x.to_string())),
            Some(other) => Err(self.error(&format!(
                "`{key}` must be a string, not {}",
                other.type_str()
            ))),
        }
    }

    /// A string key that names a file: anchored as [`Fields::anchor`] says.
    pub fn path(&mut self, key: &str) -> Result<Option<PathBuf>> {
        Ok(self.string(key)?.map(|p| self.anchor(p)))
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(b)),
            Some(Value::String(s))
                if self.origin.address.is_some() && (s == "true" || s == "false") =>
            {
                Ok(Some(s == "true"))
            }
            Some(other) => Err(self.error(&format!(
                "`{key}` must be true or false, not {}",
                match other {
                    Value::String(s) if self.origin.address.is_some() => format!("{s:?}"),
                    other => other.type_str().to_string(),
                }
            ))),
        }
    }

    /// A TCP port, 1 to 65535.
    pub fn port(&mut self, key: &str) -> Result<Option<u16>> {
        let n = match self.take(key) {
            None => return Ok(None),
            Some(Value::Integer(p)) => p,
            Some(Value::String(s)) if self.origin.address.is_some() => {
                s.parse::<i64>().map_err(|_| {
                    self.error(&format!("`{key}` = {s:?} is not a number from 1 to 65535"))
                })?
            }
            Some(other) => {
                return Err(self.error(&format!(
                    "`{key}` must be an integer, not {}",
                    other.type_str()
                )));
            }
        };
        match u16::try_from(n) {
            Ok(p) if p > 0 => Ok(Some(p)),
            _ => Err(self.error(&format!("`{key}` = {n} is not from 1 to 65535"))),
        }
    }

    /// A number of slots, 1 to [`MAX_SLOTS`] (SPEC §3b).
    pub fn slots(&mut self, key: &str) -> Result<Option<u32>> {
        Ok(self.number(key, 1, MAX_SLOTS.into())?.map(|n| n as u32))
    }

    /// A whole number from `min` to `max` (an address gives it as text).
    pub fn number(&mut self, key: &str, min: i64, max: i64) -> Result<Option<i64>> {
        let n = match self.take(key) {
            None => return Ok(None),
            Some(Value::Integer(n)) => n,
            Some(Value::String(s)) if self.origin.address.is_some() => {
                s.parse::<i64>().map_err(|_| {
                    self.error(&format!(
                        "`{key}` = {s:?} is not a number from {min} to {max}"
                    ))
                })?
            }
            Some(other) => {
                return Err(self.error(&format!(
                    "`{key}` must be an integer, not {}",
                    other.type_str()
                )));
            }
        };
        if (min..=max).contains(&n) {
            Ok(Some(n))
        } else {
            Err(self.error(&format!("`{key}` = {n} is not from {min} to {max}")))
        }
    }

    /// A list of strings (a single string is a list of one).
    pub fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(vec![s])),
            Some(Value::Array(a)) => {
                let mut v = Vec::with_capacity(a.len());
                for e in a {
                    match e {
                        Value::String(s) => v.push(s),
                        other => {
                            return Err(self.error(&format!(
                                "`{key}` must hold strings, not {}",
                                other.type_str()
                            )));
                        }
                    }
                }
                Ok(Some(v))
            }
            Some(other) => Err(self.error(&format!(
                "`{key}` must be a list of strings, not {}",
                other.type_str()
            ))),
        }
    }

    /// `password` | `password_env` | `password_file` (at most one; a file must be 0600, and
    /// a profiles file that holds a `password` too).
    pub fn password(&mut self) -> Result<Password> {
        let mut sources = Vec::new();
        if let Some(p) = self.string("password")? {
            sources.push(Password::Inline(p));
        }
        if let Some(v) = self.string("password_env")? {
            sources.push(Password::Env(v));
        }
        if let Some(p) = self.path("password_file")? {
            sources.push(Password::File(p));
        }
        if sources.len() > 1 {
            return Err(
                self.error("give only one of `password`, `password_env` and `password_file`")
            );
        }
        let password = sources.pop().unwrap_or(Password::None);
        if let Password::File(p) = &password
            && p.exists()
        {
            open_secret(p, "password_file")?;
        }
        Ok(password)
    }

    /// A key of this origin holds a secret: the profiles file it is in must be private.
    pub fn holds_secret(&self) -> Result<()> {
        match &self.origin.file {
            Some(file) => check_secret_file(file),
            None => Ok(()),
        }
    }

    /// Every key was taken, or the first one left is named as unknown.
    pub fn finish(self) -> Result<()> {
        match self.table.keys().next() {
            None => Ok(()),
            Some(key) => Err(self.error(&format!("unknown key `{key}`"))),
        }
    }
}

/// The timing keys: durations, where a bare number is seconds.
const TIMING: &[&str] = &["wait", "poll", "max_poll", "keepalive", "stale_after"];

/// `wait`, `poll`, `max_poll`, `keepalive` and `stale_after` from `f` into `c`.
pub fn apply_timing(f: &mut Fields, c: &mut Common) -> Result<()> {
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
            if key == "keepalive" {
                c.keepalive_given = true;
            }
        }
    }
    Ok(())
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
        // A bare number is seconds, fractions allowed (issue 25).
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_wait("10"), Ok(Wait::For(Duration::from_secs(10))));
        assert_eq!(parse_wait("0.0"), Ok(Wait::For(Duration::ZERO)));
        assert!(parse_duration("0.0").is_err());
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
}
