//! Finding the `locksmith` helper and starting it with its pipes set up.

use std::env;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::error::{Error, ErrorKind};

/// The environment variable naming the helper binary.
pub(crate) const HELPER_ENV: &str = "LOCKSMITH_BIN";

/// Waits at least this long are passed as `forever`: the helper's duration parser need not
/// cope with `Duration::MAX`, and nobody can tell the difference.
const EFFECTIVELY_FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long to wait for the lock, as passed with `--wait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Pass nothing: the profile's `wait`, else `[defaults]`, else `forever`.
    Profile,
    /// `--wait 0` for zero, else `--wait <millis>ms` (rounded up).
    For(Duration),
    /// `--wait forever`.
    Forever,
}

impl Wait {
    fn arg(self) -> Option<String> {
        match self {
            Wait::Profile => None,
            Wait::Forever => Some("forever".to_owned()),
            Wait::For(d) if d >= EFFECTIVELY_FOREVER => Some("forever".to_owned()),
            Wait::For(d) if d.is_zero() => Some("0".to_owned()),
            Wait::For(d) => {
                // Round up, so that a non-zero wait never turns into "try once".
                let millis = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 != 0);
                Some(format!("{millis}ms"))
            }
        }
    }
}

/// What to ask the helper for.
pub(crate) struct Request<'a> {
    /// The locks, each once, in the order named (SPEC §3b for more than one).
    pub(crate) tags: &'a [&'a str],
    pub(crate) profiles: Option<&'a Path>,
    pub(crate) wait: Wait,
    pub(crate) shared: bool,
    /// `--slots N` (SPEC §3b), checked with [`check_slots`]; `None` passes nothing.
    pub(crate) slots: Option<u32>,
    /// `--fair` (SPEC §3b); `false` passes nothing.
    pub(crate) fair: bool,
}

impl Request<'_> {
    /// `--watch-stdin [--profiles FILE] [--wait D] [--shared] [--slots N] [--fair] hold TAG
    /// [TAG...]`: options first, as the helper wants them before the subcommand.
    pub(crate) fn args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--watch-stdin".into()];
        if let Some(profiles) = self.profiles {
            args.push("--profiles".into());
            args.push(profiles.into());
        }
        if let Some(wait) = self.wait.arg() {
            args.push("--wait".into());
            args.push(wait.into());
        }
        if self.shared {
            args.push("--shared".into());
        }
        if let Some(n) = self.slots {
            args.push("--slots".into());
            args.push(n.to_string().into());
        }
        if self.fair {
            args.push("--fair".into());
        }
        args.push("hold".into());
        args.extend(self.tags.iter().map(OsString::from));
        args
    }
}

/// Checks the tag before anything is spawned: a profile's name, `[A-Za-z0-9._-]{1,64}`, or a
/// lock address (a word with `/` or `:`, SPEC §3a: the helper judges the rest) of at most
/// 4096 bytes without control characters. A leading `-` is refused: it would read as an
/// option.
pub(crate) fn check_tag(tag: &str) -> Result<(), Error> {
    let name = (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    let address = tag.contains(['/', ':']) && tag.len() <= 4096 && !tag.contains(char::is_control);
    if (name || address) && !tag.starts_with('-') {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Usage,
            format!(
                "invalid lock {tag:?}: expected a profile name (1 to 64 of A-Z a-z 0-9 . _ -) \
                 or a lock address (a path, or SCHEME:...), not starting with -"
            ),
        ))
    }
}

/// The most slots a semaphore may have (SPEC §3b).
pub(crate) const MAX_SLOTS: u32 = 1024;

/// Checks a number of slots before anything is spawned: 1 to [`MAX_SLOTS`], as the helper
/// accepts.
pub(crate) fn check_slots(n: u32) -> Result<(), Error> {
    if (1..=MAX_SLOTS).contains(&n) {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Usage,
            format!("invalid number of slots {n}: expected 1 to {MAX_SLOTS}"),
        ))
    }
}

/// Where the helper was found; kept for error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Builder,
    Env,
    BesideExe,
    SearchPath,
    /// No candidate in a safe directory: spawning fails with the reasons (never a bare
    /// `locksmith` for `execvp` to look up in an unsafe `$PATH` entry).
    NotFound,
}

/// The helper to run and how we found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Helper {
    pub(crate) path: PathBuf,
    pub(crate) origin: Origin,
    /// Candidates passed over, and why (for the error when none is left).
    pub(crate) skipped: Vec<String>,
}

impl fmt::Display for Helper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.origin {
            Origin::Builder => "set with Builder::helper",
            Origin::Env => "from $LOCKSMITH_BIN",
            Origin::BesideExe => "found beside the current executable",
            Origin::SearchPath => "found on $PATH",
            Origin::NotFound => "not found beside the current executable or on $PATH",
        };
        write!(f, "`{}` ({how})", self.path.display())?;
        if !self.skipped.is_empty() {
            write!(f, "; skipped: {}", self.skipped.join("; "))?;
        }
        Ok(())
    }
}

fn helper_file_name() -> String {
    format!("locksmith{}", env::consts::EXE_SUFFIX)
}

/// What the lookup needs to know about a path (from `stat(2)`, symlinks followed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stat {
    pub(crate) uid: u32,
    /// `st_mode`: permission bits and file type.
    pub(crate) mode: u32,
    pub(crate) is_dir: bool,
    pub(crate) is_file: bool,
}

fn stat(path: &Path) -> Option<Stat> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path).ok()?;
    Some(Stat {
        uid: md.uid(),
        mode: md.mode(),
        is_dir: md.is_dir(),
        is_file: md.is_file(),
    })
}

/// Why `path` (a directory to take the helper from, or the helper file itself) may not be
/// trusted: owned by someone other than root or `me`, or writable by group or others. A
/// sticky bit does not help: in a sticky `/tmp` anyone may still create the name
/// `locksmith`. Each ancestor directory must be owned by root or `me` and be either not
/// writable by group and others or sticky (else the directory could be renamed away and
/// replaced). `None`: safe.
fn untrusted(path: &Path, me: u32, stat: &impl Fn(&Path) -> Option<Stat>) -> Option<String> {
    let owner_ok = |st: &Stat| st.uid == 0 || st.uid == me;
    let Some(st) = stat(path) else {
        return Some(format!("{}: cannot stat", path.display()));
    };
    if !owner_ok(&st) {
        return Some(format!("{}: owned by uid {}", path.display(), st.uid));
    }
    if st.mode & 0o022 != 0 {
        return Some(format!(
            "{}: writable by group or others (mode {:04o})",
            path.display(),
            st.mode & 0o7777
        ));
    }
    for anc in path.ancestors().skip(1) {
        let Some(st) = stat(anc) else {
            return Some(format!("{}: cannot stat", anc.display()));
        };
        if !owner_ok(&st) {
            return Some(format!("{}: owned by uid {}", anc.display(), st.uid));
        }
        if st.mode & 0o022 != 0 && st.mode & 0o1000 == 0 {
            return Some(format!(
                "{}: writable by group or others and not sticky (mode {:04o})",
                anc.display(),
                st.mode & 0o7777
            ));
        }
    }
    None
}

/// Finds the helper: `explicit` (from [`Builder::helper`](crate::Builder::helper)), else
/// `$LOCKSMITH_BIN`, else `locksmith` in a trusted directory: beside the current
/// executable; in the parent of that directory only when it is cargo's `deps` directory
/// (`target/debug/deps/it-123` → `target/debug/locksmith`); then on `$PATH`, in order. A
/// directory (or helper file) owned by another user, or writable by group or others, is
/// skipped (see `untrusted`).
pub(crate) fn find_helper(explicit: Option<&Path>) -> Helper {
    locate(
        explicit,
        env::var_os(HELPER_ENV),
        env::current_exe().ok().as_deref(),
        env::var_os("PATH"),
        euid(),
        stat,
    )
}

/// Our effective uid, from `/proc/self/status` (this crate has no libc binding); if it
/// cannot be read, no uid matches and only root's directories are trusted.
fn euid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Uid:"))?;
            line.split_whitespace().nth(2)?.parse().ok()
        })
        .unwrap_or(u32::MAX)
}

/// [`find_helper`] with its inputs passed in, so tests need not touch the environment.
fn locate(
    explicit: Option<&Path>,
    env_value: Option<OsString>,
    current_exe: Option<&Path>,
    path_var: Option<OsString>,
    me: u32,
    stat: impl Fn(&Path) -> Option<Stat>,
) -> Helper {
    if let Some(path) = explicit {
        return Helper {
            path: path.to_owned(),
            origin: Origin::Builder,
            skipped: Vec::new(),
        };
    }
    // Set but empty counts as unset. Set to a missing file is a spawn error, not a
    // fall-through: the user asked for that binary.
    if let Some(value) = env_value.filter(|v| !v.is_empty()) {
        return Helper {
            path: value.into(),
            origin: Origin::Env,
            skipped: Vec::new(),
        };
    }
    let name = helper_file_name();
    let mut skipped = Vec::new();
    let exe_dir = current_exe.and_then(Path::parent);
    // Cargo puts test binaries in target/<profile>/deps and the helper in target/<profile>.
    let cargo_parent = exe_dir
        .filter(|d| d.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent);
    let beside = exe_dir
        .into_iter()
        .chain(cargo_parent)
        .map(|d| (d.to_path_buf(), Origin::BesideExe));
    let on_path: Vec<(PathBuf, Origin)> = path_var
        .as_deref()
        .map(|p| {
            env::split_paths(p)
                // An empty entry means the current directory: never trusted implicitly.
                .filter(|d| d.is_absolute())
                .map(|d| (d, Origin::SearchPath))
                .collect()
        })
        .unwrap_or_default();
    for (dir, origin) in beside.chain(on_path) {
        let candidate = dir.join(&name);
        if !stat(&candidate).is_some_and(|st| st.is_file) {
            continue;
        }
        if !stat(&dir).is_some_and(|st| st.is_dir) {
            continue;
        }
        match untrusted(&dir, me, &stat).or_else(|| untrusted_file(&candidate, me, &stat)) {
            None => {
                return Helper {
                    path: candidate,
                    origin,
                    skipped,
                };
            }
            Some(why) => skipped.push(why),
        }
    }
    Helper {
        path: PathBuf::from(name),
        origin: Origin::NotFound,
        skipped,
    }
}

/// The helper file itself: owned by root or `me`, not writable by group or others.
fn untrusted_file(file: &Path, me: u32, stat: &impl Fn(&Path) -> Option<Stat>) -> Option<String> {
    let st = stat(file)?;
    if st.uid != 0 && st.uid != me {
        return Some(format!("{}: owned by uid {}", file.display(), st.uid));
    }
    (st.mode & 0o022 != 0).then(|| {
        format!(
            "{}: writable by group or others (mode {:04o})",
            file.display(),
            st.mode & 0o7777
        )
    })
}

/// `fork(2)` + `execve(2)` of the helper with stdin and stdout on pipes we keep and
/// stderr inherited. std creates the pipes close-on-exec, so other children we spawn do
/// not inherit our ends (which would keep the helper from seeing them close).
pub(crate) fn spawn(helper: &Helper, request: &Request<'_>) -> Result<Child, Error> {
    if helper.origin == Origin::NotFound {
        return Err(Error::new(
            ErrorKind::Spawn,
            format!(
                "could not start helper {helper}: no `locksmith` in a directory only root or you can write; set $LOCKSMITH_BIN or Builder::helper"
            ),
        ));
    }
    Command::new(&helper.path)
        .args(request.args())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            Error::new(
                ErrorKind::Spawn,
                format!("could not start helper {helper}: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(request: &Request<'_>) -> Vec<String> {
        request
            .args()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn args_minimal() {
        let r = Request {
            tags: &["demo"],
            profiles: None,
            wait: Wait::Profile,
            shared: false,
            slots: None,
            fair: false,
        };
        assert_eq!(args(&r), ["--watch-stdin", "hold", "demo"]);
    }

    #[test]
    fn args_full() {
        let r = Request {
            tags: &["demo", "mkdir:/srv/x?stale_after=30s"],
            profiles: Some(Path::new("/etc/p.toml")),
            wait: Wait::For(Duration::from_millis(1500)),
            shared: true,
            slots: Some(3),
            fair: true,
        };
        assert_eq!(
            args(&r),
            [
                "--watch-stdin",
                "--profiles",
                "/etc/p.toml",
                "--wait",
                "1500ms",
                "--shared",
                "--slots",
                "3",
                "--fair",
                "hold",
                "demo",
                "mkdir:/srv/x?stale_after=30s"
            ]
        );
    }

    #[test]
    fn slots_from_1_to_1024() {
        for good in [1, 2, 1024] {
            check_slots(good).unwrap();
        }
        for bad in [0, 1025, u32::MAX] {
            let err = check_slots(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Usage, "{bad}");
            assert!(err.message().contains("1 to 1024"), "{err}");
        }
    }

    #[test]
    fn wait_arguments() {
        assert_eq!(Wait::Profile.arg(), None);
        assert_eq!(Wait::Forever.arg().as_deref(), Some("forever"));
        assert_eq!(Wait::For(Duration::ZERO).arg().as_deref(), Some("0"));
        assert_eq!(
            Wait::For(Duration::from_nanos(1)).arg().as_deref(),
            Some("1ms")
        );
        assert_eq!(
            Wait::For(Duration::from_micros(2_500)).arg().as_deref(),
            Some("3ms")
        );
        assert_eq!(
            Wait::For(Duration::from_secs(10)).arg().as_deref(),
            Some("10000ms")
        );
        assert_eq!(Wait::For(Duration::MAX).arg().as_deref(), Some("forever"));
    }

    #[test]
    fn tags() {
        for good in [
            "demo",
            "a",
            "phone.stuff_1-2",
            "x-",
            &"a".repeat(64),
            "a/b",
            "/var/lock/x.lock",
            "mkdir:/srv/locks/x",
            "ftp://host/locks/x",
            "s3://locks/deploy/prod?endpoint=http://127.0.0.1:8333",
            "redis://locker@127.0.0.1:6379/2?key=locks:x",
            "rediss://redis.example.com?key=x&ca_file=/etc/ca.pem",
        ] {
            check_tag(good).unwrap();
        }
        for bad in [
            "",
            "-v",
            "--help",
            "a b",
            "-/x",
            "é",
            "a\n",
            "/a\n",
            &"a".repeat(65),
        ] {
            assert_eq!(
                check_tag(bad).unwrap_err().kind(),
                ErrorKind::Usage,
                "{bad:?}"
            );
        }
    }

    /// A fake file system for the lookup: path → (uid, mode); directories end in `/` in
    /// the table only by their mode's file type.
    fn fake_fs<'a>(entries: &'a [(&'a str, u32, u32)]) -> impl Fn(&Path) -> Option<Stat> + 'a {
        move |p: &Path| {
            entries
                .iter()
                .find(|(n, _, _)| Path::new(n) == p)
                .map(|&(_, uid, mode)| Stat {
                    uid,
                    mode,
                    is_dir: mode & 0o170000 == 0o040000,
                    is_file: mode & 0o170000 == 0o100000,
                })
        }
    }

    const DIR: u32 = 0o040000;
    const FILE: u32 = 0o100000;

    /// The usual tree: /w owned by uid 1000, a cargo target dir, a helper in
    /// target/debug, and /tmp (sticky, world-writable) with a planted /tmp/locksmith.
    const TREE: &[(&str, u32, u32)] = &[
        ("/", 0, DIR | 0o755),
        ("/w", 1000, DIR | 0o755),
        ("/w/target", 1000, DIR | 0o755),
        ("/w/target/debug", 1000, DIR | 0o755),
        ("/w/target/debug/deps", 1000, DIR | 0o755),
        ("/w/target/debug/deps/it-123", 1000, FILE | 0o755),
        ("/w/target/debug/locksmith", 1000, FILE | 0o755),
        ("/tmp", 0, DIR | 0o1777),
        ("/tmp/build", 1000, DIR | 0o755),
        ("/tmp/build/app", 1000, FILE | 0o755),
        ("/tmp/locksmith", 65534, FILE | 0o755),
        ("/usr", 0, DIR | 0o755),
        ("/usr/bin", 0, DIR | 0o755),
        ("/usr/bin/locksmith", 0, FILE | 0o755),
    ];

    #[test]
    fn lookup_order() {
        let exe = Path::new("/w/target/debug/deps/it-123");
        let fs = fake_fs(TREE);
        let h = locate(
            Some(Path::new("/x/ls")),
            Some("/env/ls".into()),
            Some(exe),
            None,
            1000,
            &fs,
        );
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("/x/ls"), Origin::Builder)
        );

        let h = locate(None, Some("/env/ls".into()), Some(exe), None, 1000, &fs);
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("/env/ls"), Origin::Env)
        );

        // Cargo's deps directory: its parent, target/debug, holds the helper.
        let h = locate(None, Some("".into()), Some(exe), None, 1000, &fs);
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("/w/target/debug/locksmith"), Origin::BesideExe)
        );

        // Beside the executable comes first.
        let mut tree = TREE.to_vec();
        tree.push(("/w/target/debug/deps/locksmith", 1000, FILE | 0o755));
        let h = locate(None, None, Some(exe), None, 1000, fake_fs(&tree));
        assert_eq!(h.path, Path::new("/w/target/debug/deps/locksmith"));

        // Then $PATH.
        let h = locate(
            None,
            None,
            Some(Path::new("/w/app")),
            Some("/nope:/usr/bin".into()),
            1000,
            &fs,
        );
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("/usr/bin/locksmith"), Origin::SearchPath)
        );

        let h = locate(None, None, None, None, 1000, &fs);
        assert_eq!(h.origin, Origin::NotFound);
    }

    /// Issue 15 item 6: a program at /tmp/build/app ran /tmp/locksmith, which any user can
    /// create: the parent directory is no longer searched (it is not cargo's `deps`), and a
    /// directory others can write is never trusted, sticky or not.
    #[test]
    fn a_helper_planted_where_others_can_write_is_never_run() {
        let fs = fake_fs(TREE);
        let app = Path::new("/tmp/build/app");
        let h = locate(None, None, Some(app), None, 1000, &fs);
        assert_eq!(h.origin, Origin::NotFound, "{h}");
        // Even as the directory of the executable, or on $PATH.
        let h = locate(
            None,
            None,
            Some(Path::new("/tmp/app")),
            Some("/tmp".into()),
            1000,
            &fs,
        );
        assert_eq!(h.origin, Origin::NotFound, "{h}");
        assert!(
            h.skipped
                .iter()
                .any(|s| s.contains("/tmp: writable by group or others")),
            "{h}"
        );
        // A group-writable directory, one owned by someone else, a helper file others can
        // write: skipped; the next safe candidate wins.
        for (dir_uid, dir_mode, file_uid, file_mode) in [
            (1000, 0o775, 1000, 0o755),
            (1001, 0o755, 1000, 0o755),
            (1000, 0o755, 1001, 0o755),
            (1000, 0o755, 1000, 0o777),
        ] {
            let mut tree = TREE.to_vec();
            tree.push(("/opt", 0, DIR | 0o755));
            tree.push(("/opt/x", dir_uid, DIR | dir_mode));
            tree.push(("/opt/x/locksmith", file_uid, FILE | file_mode));
            let h = locate(
                None,
                None,
                Some(Path::new("/opt/x/app")),
                Some("/usr/bin".into()),
                1000,
                fake_fs(&tree),
            );
            assert_eq!(h.path, Path::new("/usr/bin/locksmith"), "{h}");
            assert_eq!(h.skipped.len(), 1, "{h}");
        }
        // A relative $PATH entry ("" or ".") is never searched.
        let mut tree = TREE.to_vec();
        tree.push(("locksmith", 1000, FILE | 0o755));
        let h = locate(None, None, None, Some(":.".into()), 1000, fake_fs(&tree));
        assert_eq!(h.origin, Origin::NotFound);
        // A directory under a world-writable, non-sticky ancestor: skipped.
        let mut tree = TREE.to_vec();
        tree.push(("/pub", 0, DIR | 0o777));
        tree.push(("/pub/bin", 1000, DIR | 0o755));
        tree.push(("/pub/bin/locksmith", 1000, FILE | 0o755));
        let h = locate(
            None,
            None,
            None,
            Some("/pub/bin".into()),
            1000,
            fake_fs(&tree),
        );
        assert_eq!(h.origin, Origin::NotFound, "{h}");
        assert!(
            h.skipped[0].contains("/pub: writable by group or others and not sticky"),
            "{h}"
        );
    }

    #[test]
    fn helper_display_says_where_it_came_from() {
        let helper = Helper {
            path: PathBuf::from("/opt/locksmith"),
            origin: Origin::Env,
            skipped: Vec::new(),
        };
        assert_eq!(helper.to_string(), "`/opt/locksmith` (from $LOCKSMITH_BIN)");
        // Spawning itself is tested in guard.rs, where every test that forks first writes
        // the fake helper (see `fake()` there).
    }
}
