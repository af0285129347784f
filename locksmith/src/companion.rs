//! The companion executable (issue 29): a build of the local backends only (`locksmith`
//! built with `--no-default-features`, as the Debian package ships it: a smaller binary, less
//! to map and relocate at every start, a lighter holder) hands a lock of any other backend
//! to `locksmith-net`, the build with every backend, by executing it in its own place —
//! same process (the parent's pid and pipe stay the same), same arguments, same environment
//! — as soon as a profile or an address names such a backend, before anything is taken
//! (every command loads all its locks before it takes the first).
//!
//! The companion is `$LOCKSMITH_NET` if set, else `locksmith-net` beside this executable. A
//! build that has every backend never hands over. Only the executable's own `main` allows
//! it ([`allow`]): a library caller (the tests) gets the "left out of this build" error.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// The companion's file name, beside this executable.
pub const NAME: &str = "locksmith-net";

static ALLOWED: AtomicBool = AtomicBool::new(false);

/// Set in the companion's environment by the hand-over, taken out again as it starts (no
/// command it runs sees it): a `$LOCKSMITH_NET` that leads back to a slim build (a wrapper
/// script, say) is refused there instead of executing each other forever.
const HANDED: &str = "LOCKSMITH_HANDED_OVER";

static HANDED_TO_US: AtomicBool = AtomicBool::new(false);

/// Lets [`hand_over`] execute the companion: said by the executable's `main`, before any
/// thread is started (it takes [`HANDED`] out of the environment).
pub fn allow() {
    ALLOWED.store(true, Ordering::Relaxed);
    if std::env::var_os(HANDED).is_some() {
        HANDED_TO_US.store(true, Ordering::Relaxed);
        // SAFETY: called first thing in `main`, while this process has one thread.
        #[allow(unsafe_code)]
        unsafe {
            std::env::remove_var(HANDED);
        }
    }
}

/// Where the companion is: `$LOCKSMITH_NET`, else `locksmith-net` beside this executable.
/// `Err`: why there is none to hand over to (for the message).
pub fn path() -> Result<PathBuf, String> {
    let path = match std::env::var_os("LOCKSMITH_NET") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => std::env::current_exe()
            .map_err(|e| format!("cannot find this executable ({e})"))?
            .with_file_name(NAME),
    };
    // Exactly the file looked at is executed: no search of $PATH for a bare name.
    let path = std::path::absolute(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => format!("no {} found", path.display()),
        _ => format!("{}: {e}", path.display()),
    })?;
    // Never ourselves again (a slim build installed under the companion's name).
    let me = std::fs::metadata("/proc/self/exe").ok();
    if me.is_some_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino())) {
        return Err(format!("{} is this very build", path.display()));
    }
    Ok(path)
}

/// Executes the companion in this process's place with this process's arguments, for a lock
/// of backend `backend`, which this build does not have. Returns only if it cannot: why not.
pub fn hand_over(backend: &str) -> String {
    if !ALLOWED.load(Ordering::Relaxed) {
        return "no companion executable in this use".into();
    }
    if HANDED_TO_US.load(Ordering::Relaxed) {
        return "it was handed over to this build already: $LOCKSMITH_NET (or locksmith-net) leads back to a build without it".into();
    }
    let path = match path() {
        Ok(p) => p,
        Err(why) => return why,
    };
    crate::log::debug!("backend {backend}: handed to {}", path.display());
    let mut args = std::env::args_os();
    let argv0 = args.next().unwrap_or_else(|| OsString::from("locksmith"));
    let e = std::process::Command::new(&path)
        .arg0(argv0)
        .args(args)
        .env(HANDED, "1")
        .exec();
    format!("cannot execute {}: {e}", path.display())
}
