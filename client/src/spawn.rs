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
    pub(crate) tag: &'a str,
    pub(crate) profiles: Option<&'a Path>,
    pub(crate) wait: Wait,
    pub(crate) shared: bool,
}

impl Request<'_> {
    /// `--watch-stdin [--profiles FILE] [--wait D] [--shared] hold TAG`: options first,
    /// as the helper wants them before the subcommand.
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
        args.push("hold".into());
        args.push(self.tag.into());
        args
    }
}

/// Checks the tag against the helper's profile-name rule, `[A-Za-z0-9._-]{1,64}`, before
/// anything is spawned. A leading `-` is refused too: it would read as an option.
pub(crate) fn check_tag(tag: &str) -> Result<(), Error> {
    let valid = (1..=64).contains(&tag.len())
        && !tag.starts_with('-')
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Usage,
            format!(
                "invalid profile name {tag:?}: expected 1 to 64 of A-Z a-z 0-9 . _ -, \
                 not starting with -"
            ),
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
}

/// The helper to run and how we found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Helper {
    pub(crate) path: PathBuf,
    pub(crate) origin: Origin,
}

impl fmt::Display for Helper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = match self.origin {
            Origin::Builder => "set with Builder::helper",
            Origin::Env => "from $LOCKSMITH_BIN",
            Origin::BesideExe => "found beside the current executable",
            Origin::SearchPath => "looked up on $PATH",
        };
        write!(f, "`{}` ({how})", self.path.display())
    }
}

fn helper_file_name() -> String {
    format!("locksmith{}", env::consts::EXE_SUFFIX)
}

/// Finds the helper: `explicit` (from [`Builder::helper`](crate::Builder::helper)), else
/// `$LOCKSMITH_BIN`, else `locksmith` beside the current executable or in its parent
/// directory, else `locksmith` on `$PATH`.
pub(crate) fn find_helper(explicit: Option<&Path>) -> Helper {
    locate(
        explicit,
        env::var_os(HELPER_ENV),
        env::current_exe().ok().as_deref(),
        |p| p.is_file(),
    )
}

/// [`find_helper`] with its inputs passed in, so tests need not touch the environment.
fn locate(
    explicit: Option<&Path>,
    env_value: Option<OsString>,
    current_exe: Option<&Path>,
    is_file: impl Fn(&Path) -> bool,
) -> Helper {
    if let Some(path) = explicit {
        return Helper {
            path: path.to_owned(),
            origin: Origin::Builder,
        };
    }
    // Set but empty counts as unset. Set to a missing file is a spawn error, not a
    // fall-through: the user asked for that binary.
    if let Some(value) = env_value.filter(|v| !v.is_empty()) {
        return Helper {
            path: value.into(),
            origin: Origin::Env,
        };
    }
    let name = helper_file_name();
    // The executable's own directory, then its parent: test binaries live in
    // target/debug/deps while the helper is target/debug/locksmith.
    let dirs = current_exe
        .and_then(Path::parent)
        .into_iter()
        .flat_map(|dir| [Some(dir), dir.parent()])
        .flatten();
    for dir in dirs {
        let candidate = dir.join(&name);
        if is_file(&candidate) {
            return Helper {
                path: candidate,
                origin: Origin::BesideExe,
            };
        }
    }
    Helper {
        path: PathBuf::from(name),
        origin: Origin::SearchPath,
    }
}

/// `fork(2)` + `execve(2)` of the helper with stdin and stdout on pipes we keep and
/// stderr inherited. std creates the pipes close-on-exec, so other children we spawn do
/// not inherit our ends (which would keep the helper from seeing them close).
pub(crate) fn spawn(helper: &Helper, request: &Request<'_>) -> Result<Child, Error> {
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
            tag: "demo",
            profiles: None,
            wait: Wait::Profile,
            shared: false,
        };
        assert_eq!(args(&r), ["--watch-stdin", "hold", "demo"]);
    }

    #[test]
    fn args_full() {
        let r = Request {
            tag: "demo",
            profiles: Some(Path::new("/etc/p.toml")),
            wait: Wait::For(Duration::from_millis(1500)),
            shared: true,
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
                "hold",
                "demo"
            ]
        );
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
        for good in ["demo", "a", "phone.stuff_1-2", "x-", &"a".repeat(64)] {
            check_tag(good).unwrap();
        }
        for bad in [
            "",
            "-v",
            "--help",
            "a b",
            "a/b",
            "é",
            "a\n",
            &"a".repeat(65),
        ] {
            assert_eq!(
                check_tag(bad).unwrap_err().kind(),
                ErrorKind::Usage,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn lookup_order() {
        let exe = Path::new("/w/target/debug/deps/it-123");
        let beside = Path::new("/w/target/debug/deps/locksmith");
        let parent = Path::new("/w/target/debug/locksmith");

        let h = locate(
            Some(Path::new("/x/ls")),
            Some("/env/ls".into()),
            Some(exe),
            |_| true,
        );
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("/x/ls"), Origin::Builder)
        );

        let h = locate(None, Some("/env/ls".into()), Some(exe), |_| true);
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("/env/ls"), Origin::Env)
        );

        let h = locate(None, Some("".into()), Some(exe), |_| true);
        assert_eq!((h.path.as_path(), h.origin), (beside, Origin::BesideExe));

        let h = locate(None, None, Some(exe), |p| p == parent);
        assert_eq!((h.path.as_path(), h.origin), (parent, Origin::BesideExe));

        let h = locate(None, None, Some(exe), |_| false);
        assert_eq!(
            (h.path.as_path(), h.origin),
            (Path::new("locksmith"), Origin::SearchPath)
        );

        let h = locate(None, None, None, |_| true);
        assert_eq!(h.origin, Origin::SearchPath);
    }

    #[test]
    fn helper_display_says_where_it_came_from() {
        let helper = Helper {
            path: PathBuf::from("/opt/locksmith"),
            origin: Origin::Env,
        };
        assert_eq!(helper.to_string(), "`/opt/locksmith` (from $LOCKSMITH_BIN)");
        // Spawning itself is tested in guard.rs, where every test that forks first writes
        // the fake helper (see `fake()` there).
    }
}
