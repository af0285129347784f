//! [`NetLock`], the guard, and [`Builder`], its options.

use std::fmt;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, ExitStatus};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};
use crate::protocol::{self, Line, OkLine};
use crate::spawn::{self, Helper, Request, Wait};

/// How long a helper that failed, or broke the protocol, gets to exit after we close its
/// pipes before it is killed. A real helper that printed `ERROR` exits at once; this only
/// bounds the damage of a wrong binary.
const ABANDON_GRACE: Duration = Duration::from_secs(5);

/// How long, after the helper has been reaped, to wait for the watcher thread to read the
/// end of its stdout. The pipe reaches end-of-file when the helper exits, unless a process
/// it started kept a copy of it (it should not); then we stop waiting rather than hang.
const READER_GRACE: Duration = Duration::from_secs(1);

/// A lock held by a `locksmith` helper process on behalf of this process.
///
/// Created with [`NetLock::new`], [`NetLock::try_new`] or [`NetLock::builder`]. The lock is
/// held from the moment one of those returns a `NetLock` until [`unlock`](NetLock::unlock)
/// or `Drop`, unless the helper reports it [lost](NetLock::is_held) on the way.
///
/// ```no_run
/// let lock = netlock::NetLock::new("phonestuff")?;
/// if let Some(token) = lock.token() {
///     // Hand the fencing token to the server you write to, so that it can refuse a
///     // writer whose lock was broken while it was paused.
///     println!("holding {} via {} with token {token}", lock.profile(), lock.backend());
/// }
/// // ... work ...
/// lock.unlock()?; // returns once the lock is really gone
/// # Ok::<(), netlock::Error>(())
/// ```
///
/// # How it is held
///
/// The helper is a child process whose stdin and stdout are pipes owned by the guard. The
/// guard keeps a small thread (`netlock-watch`) blocked reading the rest of the helper's
/// stdout, so that [`is_held`](NetLock::is_held) can answer without blocking: std offers
/// no non-blocking read on a child's stdout without `unsafe`, and the thread ends by itself
/// when the helper exits and its stdout reaches end-of-file. Releasing closes the helper's
/// stdin (it runs with `--watch-stdin`), then waits for the helper to exit.
///
/// # Resource leaking
///
/// - `Drop` releases like [`unlock`](NetLock::unlock) and waits for the helper to exit, so
///   no zombie is left; a failed release is reported on stderr, never as a panic. Waiting
///   is bounded by the helper: when a network release cannot complete it retries until the
///   profile's `stale_after`, then gives up (exit 74).
/// - If this process exits, aborts, or is `SIGKILL`ed, its pipe ends close and the helper
///   also watches this process through a pidfd: it releases at once (within 100 ms for
///   local backends, plus one round trip for network ones).
/// - If the helper is `SIGKILL`ed, nobody releases the lock: it becomes breakable as the
///   backend allows — at once for `flock` (the kernel drops it) and `postgres`/`etcd` (the
///   session or lease ends), at once on same-host proof of death for `mkdir`/`link`/
///   `symlink`, otherwise after a waiter saw no heartbeat for `stale_after`.
///   [`is_held`](NetLock::is_held) then turns false and `unlock` returns a
///   [`Lost`](ErrorKind::Lost) error.
/// - [`std::mem::forget`] on the guard keeps the lock until this process exits.
/// - The pipes are close-on-exec, so children this process spawns do not keep the lock
///   alive. A raw `fork(2)` *without* `exec` duplicates them: the helper then sees no
///   release until that child exits too.
/// - A guard may be created on any thread and moved to another: the helper watches the
///   process, not the thread that spawned it.
/// - A paused holder can be overtaken: if this process is stopped, the helper keeps the lock
///   alive; if the *helper* is stopped (`SIGSTOP`, a VM pause) past `stale_after`, a waiter
///   may break the lock. Fencing tokens ([`token`](NetLock::token)) exist for that case.
/// - This process must not set `SIGCHLD` to `SIG_IGN`: the kernel would then reap the
///   helper itself and releasing reports an [`Io`](ErrorKind::Io) error.
///
/// # Security
///
/// See [the crate documentation](crate#security): only the profile name and options travel
/// on the helper's command line; which binary runs depends on the lookup order.
#[must_use = "if unused the lock is released immediately"]
pub struct NetLock {
    child: Child,
    ok: OkLine,
    /// The names given, in order, duplicates included (one for a single lock).
    tags: Vec<String>,
    /// For each of `tags`, its lock's index in `ok.locks()`.
    places: Vec<usize>,
    watch: Arc<Watch>,
    released: bool,
}

/// Options for taking a lock; made by [`NetLock::builder`].
///
/// ```no_run
/// use std::time::Duration;
///
/// let lock = netlock::NetLock::builder("counter")
///     .profiles("/etc/myapp/locks.toml")
///     .wait(Duration::from_secs(30))
///     .shared(true)
///     .try_lock()?;
/// match lock {
///     Some(lock) => { /* ... read ... */ lock.unlock()? }
///     None => eprintln!("still busy after 30 s, skipping"),
/// }
/// # Ok::<(), netlock::Error>(())
/// ```
#[must_use = "a Builder does nothing until .lock() or .try_lock() is called"]
#[derive(Clone, Debug)]
pub struct Builder {
    tag: String,
    /// More locks to take with `tag`, as one set ([`Builder::also`]).
    also: Vec<String>,
    profiles: Option<PathBuf>,
    wait: Wait,
    shared: bool,
    /// `--slots N`, checked when locking.
    slots: Option<u32>,
    /// `--fair`.
    fair: bool,
    helper: Option<PathBuf>,
}

impl NetLock {
    /// Takes the lock named by the profile `tag`, or by the lock address `tag`
    /// (`"mkdir:/srv/locks/x"`, `"/var/lock/x.lock"`: no profiles file needed), waiting as
    /// long as the profile (or the address's `?wait=`) says (the built-in default is
    /// `forever`).
    ///
    /// Blocks until the helper answers. Errors carry the helper's kind and message:
    /// [`Busy`](ErrorKind::Busy) when the profile's `wait` ran out, and
    /// [`Config`](ErrorKind::Config), [`Unavailable`](ErrorKind::Unavailable),
    /// [`Denied`](ErrorKind::Denied), [`Spawn`](ErrorKind::Spawn) and so on.
    ///
    /// ```no_run
    /// let lock = netlock::NetLock::new("phonestuff")?;
    /// // ... upload phone.tsv ...
    /// lock.unlock()?;
    /// # Ok::<(), netlock::Error>(())
    /// ```
    pub fn new(tag: &str) -> Result<NetLock, Error> {
        NetLock::builder(tag).lock()
    }

    /// Tries once to take the lock (`--wait 0`): `Ok(None)` if someone else holds it.
    ///
    /// ```no_run
    /// match netlock::NetLock::try_new("nightly")? {
    ///     Some(lock) => { /* ... run the job ... */ lock.unlock()? }
    ///     None => eprintln!("another nightly run is in progress"),
    /// }
    /// # Ok::<(), netlock::Error>(())
    /// ```
    pub fn try_new(tag: &str) -> Result<Option<NetLock>, Error> {
        NetLock::builder(tag).try_lock()
    }

    /// Starts a [`Builder`] for the profile `tag`, to choose the profiles file, the wait,
    /// shared mode or the helper binary.
    pub fn builder(tag: &str) -> Builder {
        Builder {
            tag: tag.to_owned(),
            also: Vec::new(),
            profiles: None,
            wait: Wait::Profile,
            shared: false,
            slots: None,
            fair: false,
            helper: None,
        }
    }

    /// Releases the lock and waits until it is really gone (the helper has exited).
    ///
    /// `Ok(())` only if the helper exited with status 0 after being asked to release and
    /// never reported the lock lost. Otherwise the error says what happened:
    /// [`Lost`](ErrorKind::Lost) with the helper's reason if it printed `LOST`, or if it
    /// exited or was killed before being asked (the critical section may have run
    /// unprotected); the kind of its exit code if the release failed.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    /// The fencing token of this acquisition (`token=` on the `OK` line), if the backend
    /// keeps one. Each exclusive acquisition of a lock gets a larger token than every
    /// earlier one; a shared one reports the last exclusive token.
    ///
    /// **For several locks ([`Builder::also`]) this is always `None`**, even when every
    /// lock has a token: each lock has its own token sequence, and one lock's token handed
    /// to the server of another would fence the wrong writer. Use
    /// [`tokens`](NetLock::tokens) there.
    pub fn token(&self) -> Option<u64> {
        self.ok.token()
    }

    /// The fencing token of each lock, in the order the locks were named
    /// ([`NetLock::builder`]'s, then each [`Builder::also`]'s), `None` where that lock's
    /// backend keeps none. One entry per name given: a name given twice gets its lock's
    /// token twice. For a single lock, `vec![lock.token()]`.
    ///
    /// ```no_run
    /// let locks = netlock::NetLock::builder("mkdir:/srv/locks/db")
    ///     .also("/var/lock/cache.lock")
    ///     .lock()?;
    /// if let [Some(db), Some(cache)] = locks.tokens()[..] {
    ///     println!("db token {db}, cache token {cache}");
    /// }
    /// # Ok::<(), netlock::Error>(())
    /// ```
    pub fn tokens(&self) -> Vec<Option<u64>> {
        self.per_name(|l| l.token)
    }

    /// The semaphore slot this guard holds (`slot=` on the `OK` line, from 0), for a lock of
    /// more than one slot ([`Builder::slots`]); `None` for a lock of one slot.
    ///
    /// Like [`token`](NetLock::token), **always `None` for several locks**: use
    /// [`slots`](NetLock::slots) there.
    ///
    /// ```no_run
    /// // At most 2 jobs at once on this host, each on its own GPU.
    /// let lock = netlock::NetLock::builder("/var/lock/gpu").slots(2).lock()?;
    /// let gpu = lock.slot().expect("a lock of 2 slots reports its slot");
    /// println!("running on GPU {gpu} of {:?}", lock.slot_count());
    /// # Ok::<(), netlock::Error>(())
    /// ```
    pub fn slot(&self) -> Option<u32> {
        self.ok.slot()
    }

    /// The number of slots of the lock held (`slots=` on the `OK` line), `None` for a lock of
    /// one slot or several locks (see [`slot_counts`](NetLock::slot_counts)). It is the number
    /// the lock records, which is [`Builder::slots`] or the profile's `slots`.
    pub fn slot_count(&self) -> Option<u32> {
        self.ok.slot_count()
    }

    /// The semaphore slot held in each lock, in the order the locks were named, `None` where
    /// that lock has one slot: one entry per name given (see [`tokens`](NetLock::tokens)).
    /// For a single lock, `vec![lock.slot()]`.
    pub fn slots(&self) -> Vec<Option<u32>> {
        self.per_name(|l| l.slot)
    }

    /// The number of slots of each lock, in the order named, `None` where that lock has one
    /// slot (see [`slots`](NetLock::slots)).
    pub fn slot_counts(&self) -> Vec<Option<u32>> {
        self.per_name(|l| l.slots)
    }

    /// The backend holding each lock (`flock`, `mkdir`, ...), in the order the locks were
    /// named, one entry per name given (see [`tokens`](NetLock::tokens)).
    pub fn backends(&self) -> Vec<&str> {
        self.per_name(|l| l.backend.as_str())
    }

    /// The names (profiles or lock addresses) this guard was made for, as given and in
    /// order: one for a single lock, more after [`Builder::also`].
    pub fn tags(&self) -> &[String] {
        &self.tags
    }

    fn per_name<'a, T>(&'a self, f: impl Fn(&'a protocol::Held) -> T) -> Vec<T> {
        self.places
            .iter()
            .map(|&i| f(&self.ok.locks()[i]))
            .collect()
    }

    /// Whether the lock is still held, without blocking.
    ///
    /// False once the helper has reported `LOST`, written anything unexpected, or exited
    /// (its stdout reached end-of-file). The answer can be stale by the time you act on it;
    /// use [`token`](NetLock::token) where that matters.
    pub fn is_held(&self) -> bool {
        let state = self.watch.lock();
        !self.released && state.problem.is_none() && !state.eof
    }

    /// Like [`is_held`](NetLock::is_held), but says why the lock is no longer held:
    /// the `LOST` reason, or that the helper exited. Handy between steps of a long job:
    /// `lock.check()?;`.
    pub fn check(&self) -> Result<(), Error> {
        let state = self.watch.lock();
        if let Some(problem) = &state.problem {
            return Err(problem.clone());
        }
        if state.eof {
            return Err(Error::new(
                ErrorKind::Lost,
                format!(
                    "the helper (pid {}) exited while holding the lock",
                    self.child.id()
                ),
            ));
        }
        Ok(())
    }

    /// The profile name, as the helper echoed it on the `OK` line; for several locks, the
    /// first one named.
    pub fn profile(&self) -> &str {
        self.ok.profile()
    }

    /// The backend holding the lock (`backend=`: `flock`, `mkdir`, `ftp`, ...). For several
    /// locks, `backend=` as the helper wrote it, comma-separated (`mkdir,flock`); see
    /// [`backends`](NetLock::backends).
    pub fn backend(&self) -> &str {
        self.ok.backend()
    }

    /// Whether this is a shared (reader) lock (`mode=shared`); for several locks, whether
    /// every one of them is.
    pub fn is_shared(&self) -> bool {
        self.ok.shared()
    }

    /// Whether the previous acquisition of this lock did not end in a clean release
    /// (`prev=crashed`): a holder was killed, a machine lost, or the lock broken. Data the
    /// previous holder was writing may be half-written. For several locks: of any of them.
    pub fn prev_crashed(&self) -> bool {
        self.ok.prev_crashed()
    }

    /// Any `key=value` field of the `OK` line, e.g. `lock.field("since")`.
    pub fn field(&self, key: &str) -> Option<&str> {
        self.ok.get(key)
    }

    /// The helper's whole `OK` line, without its newline.
    pub fn status_line(&self) -> &str {
        self.ok.raw()
    }

    /// The process id of the helper holding the lock.
    pub fn helper_pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes the helper's stdin, reaps it, and judges how it ended. Runs once.
    fn release(&mut self) -> Result<(), Error> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        // Did the helper end before we asked? (Best effort: its end-of-file may not have
        // been read yet.)
        let gone_before = self.watch.lock().eof;
        drop(self.child.stdin.take());
        let pid = self.child.id();
        let status = self.child.wait().map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("waiting for the helper (pid {pid}) to release the lock: {e}"),
            )
        });
        let problem = self.watch.wait_eof(READER_GRACE);
        let status = status?;
        let code = status.code();
        if let Some(problem) = problem {
            return Err(problem.with_exit_code(code));
        }
        let when = if gone_before {
            "before unlock was asked for"
        } else {
            "while releasing the lock"
        };
        let err = match code {
            Some(0) if !gone_before => return Ok(()),
            Some(0) => Error::new(
                ErrorKind::Lost,
                format!(
                    "the helper (pid {pid}) exited with status 0 {when}: the lock was \
                     released early (was locksmith sent SIGTERM, SIGINT or SIGHUP?)"
                ),
            ),
            Some(c) => Error::new(
                ErrorKind::from_exit_code(c).unwrap_or(ErrorKind::Protocol),
                format!(
                    "the helper (pid {pid}) exited with status {c} {when}, without a LOST \
                     line (see its stderr)"
                ),
            ),
            None => Error::new(
                ErrorKind::Lost,
                format!(
                    "the helper (pid {pid}) ended {when} ({status}): the lock is no longer \
                     held by it and becomes breakable as its backend allows"
                ),
            ),
        };
        Err(err.with_exit_code(code))
    }
}

impl Drop for NetLock {
    fn drop(&mut self) {
        if let Err(err) = self.release() {
            eprintln!("netlock: releasing {:?}: {err}", self.ok.profile());
        }
    }
}

impl fmt::Debug for NetLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("NetLock");
        d.field("profile", &self.profile())
            .field("backend", &self.backend())
            .field("token", &self.token());
        if self.slot().is_some() {
            d.field("slot", &self.slot());
        }
        if self.tags.len() > 1 {
            d.field("tags", &self.tags).field("tokens", &self.tokens());
            if self.slots().iter().any(Option::is_some) {
                d.field("slots", &self.slots());
            }
        }
        d.field("helper_pid", &self.helper_pid())
            .field("held", &self.is_held())
            .finish()
    }
}

impl Builder {
    /// Also take the lock `tag` (a profile name or a lock address), together with the
    /// others, as one set (SPEC §3b): the guard is returned only once every lock is held,
    /// and releasing it releases them all.
    ///
    /// ```no_run
    /// let locks = netlock::NetLock::builder("mkdir:/srv/locks/db")
    ///     .also("/var/lock/cache.lock")
    ///     .also("deploy")
    ///     .lock()?; // all three held, or an error and none held
    /// println!("tokens: {:?}", locks.tokens());
    /// locks.unlock()?; // all three released
    /// # Ok::<(), netlock::Error>(())
    /// ```
    ///
    /// - Any mix of backends, profiles and addresses. The helper takes them in one
    ///   canonical order (holding each while waiting for the next), so two programs naming
    ///   the same locks in different orders never deadlock.
    /// - All or nothing: if one is busy when the wait runs out (one deadline for the whole
    ///   set) or fails, those already taken are given back and the error is that lock's
    ///   ([`Busy`](ErrorKind::Busy), so [`try_lock`](Builder::try_lock) gives `Ok(None)`).
    /// - Losing any one is losing the set: [`is_held`](NetLock::is_held) turns false.
    /// - [`wait`](Builder::wait), [`shared`](Builder::shared) and the profiles file apply to
    ///   every lock; an address's own `?wait=`, `?shared=` or a profile's keys override them
    ///   for that lock.
    /// - The same name given twice is taken once. Two *different* names for one lock (a
    ///   profile and its address) are refused with a [`Usage`](ErrorKind::Usage) error,
    ///   after releasing: the helper takes that lock once, and which token belongs to which
    ///   name could not be told.
    /// - [`NetLock::token`] is `None` for a set; [`NetLock::tokens`] and
    ///   [`NetLock::backends`] give one entry per name, in the order named.
    pub fn also(mut self, tag: &str) -> Builder {
        self.also.push(tag.to_owned());
        self
    }

    /// The profiles file (`--profiles FILE`). Default: the helper's own lookup
    /// (`$LOCKSMITH_PROFILES`, then `~/.config/locksmith/profiles.toml`, then
    /// `/etc/locksmith/profiles.toml`).
    pub fn profiles(mut self, path: impl AsRef<Path>) -> Builder {
        self.profiles = Some(path.as_ref().to_owned());
        self
    }

    /// Give up after waiting this long (`--wait <millis>ms`, rounded up to a millisecond;
    /// `Duration::ZERO` is `--wait 0`, try once). Default: the profile's `wait`.
    ///
    /// When the wait runs out, [`lock`](Builder::lock) returns a
    /// [`Busy`](ErrorKind::Busy) error and [`try_lock`](Builder::try_lock) `Ok(None)`.
    pub fn wait(mut self, wait: Duration) -> Builder {
        self.wait = Wait::For(wait);
        self
    }

    /// Wait as long as it takes (`--wait forever`), whatever the profile says.
    pub fn wait_forever(mut self) -> Builder {
        self.wait = Wait::Forever;
        self
    }

    /// Take a shared (reader) lock (`--shared`) if `true`. The helper refuses with a
    /// [`Usage`](ErrorKind::Usage) error if the backend has no shared mode. `false` (the
    /// default) passes nothing, so a profile that says `shared = true` still gets a shared
    /// lock; [`NetLock::is_shared`] tells which one you got.
    pub fn shared(mut self, shared: bool) -> Builder {
        self.shared = shared;
        self
    }

    /// A semaphore of `n` slots (`--slots N`, SPEC §3b): up to `n` holders at once, each in
    /// its own slot ([`NetLock::slot`], from 0), each slot a whole lock (crash release,
    /// `LOST`, fencing tokens rising across slots). `n` is 1 to 1024; anything else is a
    /// [`Usage`](ErrorKind::Usage) error before anything is spawned. Default: pass nothing
    /// (the profile's or address's `slots`, else 1).
    ///
    /// ```no_run
    /// let lock = netlock::NetLock::builder("mkdir:/srv/locks/encoders")
    ///     .slots(4)
    ///     .lock()?; // waits while 4 others hold it
    /// println!("slot {:?} of {:?}", lock.slot(), lock.slot_count());
    /// # Ok::<(), netlock::Error>(())
    /// ```
    ///
    /// - Every contender of one lock must ask for the same number: the helper refuses
    ///   another number while someone holds or waits with a [`Config`](ErrorKind::Config)
    ///   error naming both, taking nothing.
    /// - A backend without slots (the helper's README says which have them) refuses `n` > 1
    ///   with a [`Usage`](ErrorKind::Usage) error, and so does [`shared`](Builder::shared)
    ///   with `n` > 1 (a slot is exclusive).
    /// - For several locks ([`Builder::also`]) it applies to every one; an address's own
    ///   `?slots=` or a profile's `slots` overrides it for that lock.
    ///   [`NetLock::slots`] gives each lock's slot.
    pub fn slots(mut self, n: u32) -> Builder {
        self.slots = Some(n);
        self
    }

    /// Wait in a fair queue (`--fair`, SPEC §3b) if `true`: waiters are served in the order
    /// they began to wait, for one slot or several ([`slots`](Builder::slots)), on every
    /// backend. `false` (the default) passes nothing, so a profile that says `fair = true`
    /// (or an address with `?fair=true`) still waits in line.
    ///
    /// ```no_run
    /// // Deploys across hosts, first come, first served.
    /// let lock = netlock::NetLock::builder("mkdir:/shared/locks/deploy")
    ///     .fair(true)
    ///     .lock()?;
    /// # Ok::<(), netlock::Error>(())
    /// ```
    ///
    /// - **Every contender of the lock should say it** (here, or by its profile or
    ///   address): one that does not is not in line and may go first.
    /// - A waiter that gives up ([`wait`](Builder::wait) runs out), fails, or whose process
    ///   goes leaves the line at once; one killed leaves it as a dead holder leaves a lock.
    ///   `locksmith --fair status LOCK` lists the line in order.
    /// - Only the first waiters in line (the helper keeps 1024 places on the file backends,
    ///   32 on the network ones) wait in order; more wait for a place in no order.
    /// - For several locks ([`Builder::also`]) it applies to every one.
    pub fn fair(mut self, fair: bool) -> Builder {
        self.fair = fair;
        self
    }

    /// The helper binary to run. Default: `$LOCKSMITH_BIN`, else `locksmith` in a trusted
    /// directory: beside the current executable, in the parent of cargo's `deps` directory,
    /// then on `$PATH` (see the crate docs, "Finding the helper").
    pub fn helper(mut self, path: impl AsRef<Path>) -> Builder {
        self.helper = Some(path.as_ref().to_owned());
        self
    }

    /// Takes the lock, waiting as configured; a wait that runs out is a
    /// [`Busy`](ErrorKind::Busy) error.
    pub fn lock(self) -> Result<NetLock, Error> {
        acquire(&self, self.wait)
    }

    /// Takes the lock if it can be had within the configured [`wait`](Builder::wait) —
    /// or at once (`--wait 0`) if no wait was set — and returns `Ok(None)` if it is busy.
    pub fn try_lock(self) -> Result<Option<NetLock>, Error> {
        let wait = match self.wait {
            Wait::Profile => Wait::For(Duration::ZERO),
            other => other,
        };
        match acquire(&self, wait) {
            Ok(lock) => Ok(Some(lock)),
            Err(err) if err.kind() == ErrorKind::Busy => Ok(None),
            Err(err) => Err(err),
        }
    }
}

/// Spawns the helper and reads its first line: `OK` makes a guard, anything else an error
/// after the helper has been reaped.
fn acquire(builder: &Builder, wait: Wait) -> Result<NetLock, Error> {
    let given: Vec<&str> = std::iter::once(&builder.tag)
        .chain(&builder.also)
        .map(String::as_str)
        .collect();
    for tag in &given {
        spawn::check_tag(tag)?;
    }
    if let Some(n) = builder.slots {
        spawn::check_slots(n)?;
    }
    // Each name once, in the order first given; `places[i]` is given[i]'s place among them,
    // which is its lock's place on the OK line.
    let mut sent: Vec<&str> = Vec::new();
    let places: Vec<usize> = given
        .iter()
        .map(|tag| {
            sent.iter().position(|s| s == tag).unwrap_or_else(|| {
                sent.push(tag);
                sent.len() - 1
            })
        })
        .collect();
    let request = Request {
        tags: &sent,
        profiles: builder.profiles.as_deref(),
        wait,
        shared: builder.shared,
        slots: builder.slots,
        fair: builder.fair,
    };
    let helper = spawn::find_helper(builder.helper.as_deref());
    let mut child = spawn::spawn(&helper, &request)?;
    let Some(stdout) = child.stdout.take() else {
        let err = Error::new(ErrorKind::Io, "the helper's stdout was not captured");
        return Err(abandon(child, err));
    };
    let mut reader = BufReader::new(stdout);
    let failure = match protocol::read_line(&mut reader) {
        Ok(Some(line)) => match protocol::parse(&line) {
            // An address comes back with its spaces written %20 (SPEC §3a).
            Ok(Line::Ok(ok)) if ok.profile() == protocol::shown_tag(&builder.tag) => {
                let (held, names) = (ok.locks().len(), sent.len());
                let tags = given.iter().map(|&t| t.to_owned()).collect();
                let lock = NetLock::hold(child, reader, ok, tags, places)?;
                if held == names {
                    return Ok(lock);
                }
                return Err(names_merged(lock, names, held));
            }
            Ok(Line::Ok(ok)) => Error::new(
                ErrorKind::Protocol,
                format!(
                    "helper {helper} answered for profile {:?} instead of {:?}: {line:?}",
                    ok.profile(),
                    builder.tag
                ),
            ),
            Ok(Line::Error {
                kind,
                word,
                message,
            }) => {
                drop(reader);
                // The helper's own words matter more than a failure to reap it.
                let code = reap(&mut child, ABANDON_GRACE)
                    .ok()
                    .and_then(|(status, _)| status.code());
                let (kind, message) =
                    match kind.or_else(|| code.and_then(ErrorKind::from_exit_code)) {
                        Some(kind) if Some(kind) == ErrorKind::from_word(&word) => (kind, message),
                        Some(kind) => (kind, format!("{word}: {message}")),
                        None => (ErrorKind::Protocol, format!("{word}: {message}")),
                    };
                return Err(Error::new(kind, message).with_exit_code(code));
            }
            Ok(Line::Lost { .. }) => Error::new(
                ErrorKind::Protocol,
                format!("helper {helper} said LOST before OK: {line:?}"),
            ),
            Err(err) => err,
        },
        Ok(None) => {
            drop(reader);
            let (status, killed) = reap(&mut child, ABANDON_GRACE)?;
            return Err(silent_exit(&helper, status, killed));
        }
        Err(err) => err,
    };
    drop(reader);
    Err(abandon(child, failure))
}

/// The error for a set in which the helper took fewer locks than the different names given
/// (two names for one lock, which it takes once): which token belongs to which name cannot
/// be told, so the set is released and refused.
fn names_merged(lock: NetLock, names: usize, held: usize) -> Error {
    let message = format!(
        "{names} different lock names were given but the helper took {held} locks ({:?}): \
         some of the names are the same lock (a profile and its address?), and which token \
         is whose cannot be told; name each lock once",
        lock.status_line()
    );
    match lock.unlock() {
        Ok(()) => Error::new(ErrorKind::Usage, format!("{message}; released")),
        Err(e) => Error::new(ErrorKind::Usage, format!("{message}; releasing: {e}")),
    }
}

/// The error for a helper whose stdout ended without a status line.
fn silent_exit(helper: &Helper, status: ExitStatus, killed: bool) -> Error {
    let code = status.code();
    let kind = code
        .and_then(ErrorKind::from_exit_code)
        .unwrap_or(ErrorKind::Protocol);
    let how = if killed {
        format!("closed its stdout without a status line and was killed after {ABANDON_GRACE:?}")
    } else {
        match code {
            Some(c) => format!("exited with status {c} without writing a status line"),
            None => format!("ended ({status}) without writing a status line"),
        }
    };
    Error::new(kind, format!("helper {helper} {how} (see its stderr)")).with_exit_code(code)
}

/// Reaps a helper we are giving up on and returns `err` with its exit code.
fn abandon(mut child: Child, err: Error) -> Error {
    match reap(&mut child, ABANDON_GRACE) {
        Ok((status, _)) => err.with_exit_code(status.code()),
        Err(_) => err,
    }
}

/// Closes the helper's stdin and waits up to `grace` for it to exit, then kills it; always
/// reaps it. Returns its status and whether it had to be killed.
///
/// Only used before a guard exists, when the helper holds no lock on our behalf (it said
/// `ERROR`, or said nothing, or broke the protocol), so killing it cannot break a lock we
/// were told we hold. Polls `waitpid(WNOHANG)`: std has no wait with a timeout.
fn reap(child: &mut Child, grace: Duration) -> Result<(ExitStatus, bool), Error> {
    drop(child.stdin.take());
    let pid = child.id();
    let io = |e: std::io::Error| {
        Error::new(
            ErrorKind::Io,
            format!("waiting for the helper (pid {pid}): {e}"),
        )
    };
    let deadline = Instant::now() + grace;
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait().map_err(io)? {
            return Ok((status, false));
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    // It may have exited in between: kill then fails harmlessly and wait reaps it.
    let _ = child.kill();
    let status = child.wait().map_err(io)?;
    Ok((status, true))
}

impl NetLock {
    /// Turns an `OK`ed helper into a guard, with the watcher thread reading the rest.
    fn hold(
        mut child: Child,
        reader: BufReader<ChildStdout>,
        ok: OkLine,
        tags: Vec<String>,
        places: Vec<usize>,
    ) -> Result<NetLock, Error> {
        let watch = Arc::new(Watch::default());
        let theirs = Arc::clone(&watch);
        // The thread is detached: `release` learns that it has finished through
        // `Watch::done`, and it ends by itself at end-of-file.
        let spawned = thread::Builder::new()
            .name("netlock-watch".to_owned())
            .spawn(move || watch_rest(reader, &theirs));
        match spawned {
            Ok(_) => Ok(NetLock {
                child,
                ok,
                tags,
                places,
                watch,
                released: false,
            }),
            Err(e) => {
                // The closure, and with it our end of stdout, is gone: the helper releases.
                drop(child.stdin.take());
                let _ = child.wait();
                Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "could not start the thread that watches the helper: {e}; lock released"
                    ),
                ))
            }
        }
    }
}

/// What the watcher thread has seen after `OK`.
#[derive(Default)]
struct Watch {
    state: Mutex<WatchState>,
    /// Signalled when `eof` becomes true.
    done: Condvar,
}

#[derive(Default)]
struct WatchState {
    /// The first thing that means the lock is no longer (certainly) held: `LOST`, an
    /// unexpected line, a read error.
    problem: Option<Error>,
    /// The helper's stdout reached end-of-file (it exited), or reading it failed.
    eof: bool,
}

impl Watch {
    fn lock(&self) -> MutexGuard<'_, WatchState> {
        // The state stays consistent even if a holder panicked: every update is one store.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, problem: Error) {
        let mut state = self.lock();
        if state.problem.is_none() {
            state.problem = Some(problem);
        }
    }

    fn finish(&self) {
        self.lock().eof = true;
        self.done.notify_all();
    }

    /// Waits up to `timeout` for end-of-file and takes the problem seen, if any.
    fn wait_eof(&self, timeout: Duration) -> Option<Error> {
        let state = self.lock();
        let (mut state, _) = self
            .done
            .wait_timeout_while(state, timeout, |s| !s.eof)
            .unwrap_or_else(PoisonError::into_inner);
        state.problem.take()
    }
}

/// The watcher thread: reads the helper's stdout after `OK` until end-of-file.
fn watch_rest(mut reader: BufReader<ChildStdout>, watch: &Watch) {
    loop {
        match protocol::read_line(&mut reader) {
            Ok(None) => break,
            Ok(Some(line)) => watch.note(after_ok(&line)),
            // A failing read(2) will not get better; dropping our end makes the helper
            // release, which matches the lock now being reported as not held.
            Err(err) if err.kind() == ErrorKind::Io => {
                watch.note(err);
                break;
            }
            // A bad line (too long, not UTF-8): note it and keep draining.
            Err(err) => watch.note(err),
        }
    }
    watch.finish();
}

/// What a line after `OK` means. Only `LOST` is expected; the rest is honoured or
/// reported as a protocol error, and all of it means the lock is no longer trusted.
fn after_ok(line: &str) -> Error {
    match protocol::parse(line) {
        Ok(Line::Lost { reason }) if reason.is_empty() => {
            Error::new(ErrorKind::Lost, "the helper reported the lock lost")
        }
        Ok(Line::Lost { reason }) => Error::new(ErrorKind::Lost, reason),
        Ok(Line::Error {
            kind: Some(kind),
            message,
            ..
        }) => Error::new(kind, message),
        Ok(Line::Error { .. } | Line::Ok(_)) => Error::new(
            ErrorKind::Protocol,
            format!("unexpected line from helper after OK: {line:?}"),
        ),
        Err(err) => err,
    }
}

#[cfg(all(test, unix))]
mod tests {
    //! The guard against a fake helper (a shell script that acts by the tag's prefix).
    //! Tests against the real `locksmith` live in the workspace's `tests/`.

    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::OnceLock;

    const FAKE: &str = r#"#!/bin/sh
# Fake locksmith: behaves according to the tag (the last argument).
for a in "$@"; do tag=$a; done
# The first lock named (the word after `hold`): the OK line's profile field for a set.
first=; after=
for a in "$@"; do
  if [ -n "$after" ] && [ -z "$first" ]; then first=$a; fi
  [ "$a" = hold ] && after=1
done
dir=$(dirname "$0")
printf '%s\n' "$@" > "$dir/$tag.args"
case $tag in
pair*)    echo "OK $first backend=fake,other mode=exclusive,shared token=5, locks=2"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
semset*)  echo "OK $first backend=fake,other token=5,6 slot=,2 slots=,3 locks=2"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
sem*)     echo "OK $tag backend=fake mode=exclusive token=7 slot=1 slots=3"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
merged*)  echo "OK $first backend=fake mode=exclusive token=3"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
busy*)    echo "ERROR busy: held by host=h pid=1 ppid=0"; exit 75 ;;
config*)  echo "ERROR config: no profile named $tag"; exit 78 ;;
odd*)     echo "ERROR strange: what"; exit 78 ;;
quiet*)   exit 69 ;;
zero*)    exit 0 ;;
garbage*) echo "hello there"; exec cat >/dev/null ;;
other*)   echo "OK someone-else backend=fake"; exec cat >/dev/null ;;
lost*)    echo "OK $tag backend=fake mode=exclusive token=9"; echo "LOST server went away"; exit 74 ;;
early*)   echo "OK $tag backend=fake"; exit 0 ;;
relfail*) echo "OK $tag backend=fake"; cat >/dev/null; exit 74 ;;
*)        echo "OK $tag backend=fake mode=exclusive token=42 prev=crashed since=2025-01-01T00:00:00Z"
          cat >/dev/null
          touch "$dir/$tag.released" ;;
esac
"#;

    /// The fake helper, written once before any test spawns anything: executing a file
    /// that another thread's fork still holds open for writing fails with ETXTBSY.
    fn fake() -> &'static Path {
        static PATH: OnceLock<PathBuf> = OnceLock::new();
        PATH.get_or_init(|| {
            // target/tmp when run from target/<profile>/deps, else the system temp dir.
            let base = std::env::current_exe()
                .ok()
                .and_then(|exe| Some(exe.parent()?.parent()?.parent()?.join("tmp")))
                .unwrap_or_else(std::env::temp_dir);
            sweep_stale(&base);
            let dir = base.join(format!("netlock-unit-{}", std::process::id()));
            fs::create_dir_all(&dir).unwrap();
            let path = dir.join("fake-locksmith");
            fs::write(&path, FAKE).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
            path
        })
    }

    /// Removes the directories of earlier test runs whose process is gone.
    fn sweep_stale(base: &Path) {
        if !cfg!(target_os = "linux") {
            return;
        }
        for entry in fs::read_dir(base).into_iter().flatten().flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("netlock-unit-")) else {
                continue;
            };
            if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }

    fn builder(tag: &str) -> Builder {
        NetLock::builder(tag).helper(fake())
    }

    fn sidecar(tag: &str, ext: &str) -> PathBuf {
        fake().with_file_name(format!("{tag}.{ext}"))
    }

    fn eventually(what: &str, f: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn guard_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<NetLock>();
        check::<Builder>();
    }

    #[test]
    fn holds_and_unlock_waits_for_release() {
        let lock = builder("okay1").lock().unwrap();
        assert!(lock.is_held());
        lock.check().unwrap();
        assert_eq!(lock.profile(), "okay1");
        assert_eq!(lock.backend(), "fake");
        assert_eq!(lock.token(), Some(42));
        assert!(lock.prev_crashed());
        assert!(!lock.is_shared());
        assert_eq!(lock.field("since"), Some("2025-01-01T00:00:00Z"));
        assert!(lock.status_line().starts_with("OK okay1 backend=fake "));
        assert!(!sidecar("okay1", "released").exists());
        lock.unlock().unwrap();
        // unlock returned only after the helper finished its release.
        assert!(sidecar("okay1", "released").exists());
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn drop_releases_and_reaps() {
        let lock = builder("okay2").lock().unwrap();
        let pid = lock.helper_pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(lock);
        assert!(sidecar("okay2", "released").exists());
        // Reaped: no zombie left behind.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn passes_options_before_subcommand() {
        let lock = builder("okay3")
            .profiles("/tmp/p.toml")
            .wait(Duration::from_millis(250))
            .shared(true)
            .lock()
            .unwrap();
        let args = fs::read_to_string(sidecar("okay3", "args")).unwrap();
        assert_eq!(
            args,
            "--watch-stdin\n--profiles\n/tmp/p.toml\n--wait\n250ms\n--shared\nhold\nokay3\n"
        );
        lock.unlock().unwrap();

        builder("okay4").lock().unwrap().unlock().unwrap();
        let args = fs::read_to_string(sidecar("okay4", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\nhold\nokay4\n");

        builder("okay5")
            .wait_forever()
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
        let args = fs::read_to_string(sidecar("okay5", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--wait\nforever\nhold\nokay5\n");
    }

    #[test]
    fn try_new_passes_wait_zero_and_maps_busy_to_none() {
        assert!(builder("busy1").try_lock().unwrap().is_none());
        let args = fs::read_to_string(sidecar("busy1", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--wait\n0\nhold\nbusy1\n");

        // An explicit wait is kept by try_lock.
        assert!(
            builder("busy2")
                .wait(Duration::from_secs(2))
                .try_lock()
                .unwrap()
                .is_none()
        );
        let args = fs::read_to_string(sidecar("busy2", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--wait\n2000ms\nhold\nbusy2\n");
    }

    #[test]
    fn lock_reports_busy_as_error() {
        let err = builder("busy3").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Busy);
        assert_eq!(err.exit_code(), Some(75));
        assert_eq!(err.message(), "held by host=h pid=1 ppid=0");
        assert_eq!(
            err.to_string(),
            "locksmith: busy: held by host=h pid=1 ppid=0"
        );
    }

    #[test]
    fn error_line_kind_and_unknown_kind() {
        let err = builder("config1").try_lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert_eq!(err.message(), "no profile named config1");
        assert_eq!(err.exit_code(), Some(78));

        // An unknown word falls back on the exit code and keeps the word.
        let err = builder("odd1").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config);
        assert_eq!(err.message(), "strange: what");
    }

    #[test]
    fn exit_without_line_uses_status() {
        let err = builder("quiet1").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(err.exit_code(), Some(69));
        assert!(
            err.message()
                .contains("status 69 without writing a status line"),
            "{err}"
        );

        let err = builder("zero1").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
        assert_eq!(err.exit_code(), Some(0));
    }

    #[test]
    fn garbage_and_wrong_profile_are_protocol_errors() {
        let err = builder("garbage1").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
        assert!(err.message().contains("hello there"), "{err}");
        assert_eq!(err.exit_code(), Some(0));

        let err = builder("other1").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Protocol);
        assert!(err.message().contains("someone-else"), "{err}");
    }

    #[test]
    fn lost_turns_is_held_false_and_unlock_reports_it() {
        let lock = builder("lost1").lock().unwrap();
        assert_eq!(lock.token(), Some(9));
        eventually("is_held() == false", || !lock.is_held());
        let err = lock.check().unwrap_err();
        assert_eq!(
            (err.kind(), err.message()),
            (ErrorKind::Lost, "server went away")
        );
        let err = lock.unlock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Lost);
        assert_eq!(err.message(), "server went away");
        assert_eq!(err.exit_code(), Some(74));
    }

    #[test]
    fn helper_exiting_early_is_lost() {
        let lock = builder("early1").lock().unwrap();
        eventually("is_held() == false", || !lock.is_held());
        assert_eq!(lock.check().unwrap_err().kind(), ErrorKind::Lost);
        let err = lock.unlock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Lost);
        assert_eq!(err.exit_code(), Some(0));
        assert!(err.message().contains("before unlock"), "{err}");
    }

    #[test]
    fn failed_release_is_reported() {
        let lock = builder("relfail1").lock().unwrap();
        assert!(lock.is_held());
        let err = lock.unlock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Lost);
        assert_eq!(err.exit_code(), Some(74));
        assert!(err.message().contains("while releasing"), "{err}");
    }

    #[test]
    fn several_locks_in_the_order_named() {
        let lock = builder("set1").also("pair1").lock().unwrap();
        let args = fs::read_to_string(sidecar("pair1", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\nhold\nset1\npair1\n");
        assert_eq!(lock.tags(), ["set1", "pair1"]);
        assert_eq!(lock.tokens(), [Some(5), None]);
        assert_eq!(lock.backends(), ["fake", "other"]);
        assert_eq!(lock.backend(), "fake,other");
        assert_eq!(lock.profile(), "set1");
        // One token cannot stand for the set.
        assert_eq!(lock.token(), None);
        assert!(!lock.is_shared(), "one of the two is exclusive");
        assert!(format!("{lock:?}").contains("tokens: [Some(5), None]"));
        lock.unlock().unwrap();
        assert!(sidecar("pair1", "released").exists());
    }

    #[test]
    fn the_same_name_twice_is_sent_once_and_reported_twice() {
        let lock = builder("set2")
            .also("pair2")
            .also("set2")
            .try_lock()
            .unwrap()
            .unwrap();
        let args = fs::read_to_string(sidecar("pair2", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--wait\n0\nhold\nset2\npair2\n");
        assert_eq!(lock.tags(), ["set2", "pair2", "set2"]);
        assert_eq!(lock.tokens(), [Some(5), None, Some(5)]);
        assert_eq!(lock.backends(), ["fake", "other", "fake"]);
        lock.unlock().unwrap();

        // Only one name, given twice: a single lock.
        let lock = builder("okay6").also("okay6").lock().unwrap();
        let args = fs::read_to_string(sidecar("okay6", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\nhold\nokay6\n");
        assert_eq!(lock.tokens(), [Some(42), Some(42)]);
        assert_eq!(lock.token(), Some(42));
        lock.unlock().unwrap();
    }

    #[test]
    fn two_names_for_one_lock_are_refused_and_released() {
        let err = builder("set3").also("merged1").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Usage);
        assert!(err.message().contains("name each lock once"), "{err}");
        assert!(err.message().ends_with("; released"), "{err}");
        assert!(sidecar("merged1", "released").exists());
    }

    #[test]
    fn every_name_of_a_set_is_checked_before_spawning() {
        let _ = fake();
        let err = builder("okay7").also("-v").lock().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Usage);
        assert!(!sidecar("-v", "args").exists());
    }

    #[test]
    fn slots_are_passed_and_the_slot_reported() {
        let lock = builder("sem1").slots(3).lock().unwrap();
        let args = fs::read_to_string(sidecar("sem1", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--slots\n3\nhold\nsem1\n");
        assert_eq!((lock.slot(), lock.slot_count()), (Some(1), Some(3)));
        assert_eq!(lock.slots(), [Some(1)]);
        assert_eq!(lock.slot_counts(), [Some(3)]);
        assert_eq!(lock.token(), Some(7));
        assert!(format!("{lock:?}").contains("slot: Some(1)"), "{lock:?}");
        lock.unlock().unwrap();

        // Without slots: nothing passed, no slot.
        let lock = builder("okay8").lock().unwrap();
        assert_eq!((lock.slot(), lock.slot_count()), (None, None));
        assert_eq!(lock.slots(), [None]);
        lock.unlock().unwrap();
    }

    #[test]
    fn slots_of_a_set_in_the_order_named() {
        let lock = builder("set4")
            .also("semset1")
            .also("set4")
            .slots(1)
            .shared(true)
            .lock()
            .unwrap();
        let args = fs::read_to_string(sidecar("semset1", "args")).unwrap();
        assert_eq!(
            args,
            "--watch-stdin\n--shared\n--slots\n1\nhold\nset4\nsemset1\n"
        );
        assert_eq!(lock.slots(), [None, Some(2), None]);
        assert_eq!(lock.slot_counts(), [None, Some(3), None]);
        // One slot cannot stand for the set.
        assert_eq!((lock.slot(), lock.slot_count()), (None, None));
        assert!(format!("{lock:?}").contains("slots: [None, Some(2), None]"));
        lock.unlock().unwrap();
    }

    #[test]
    fn fair_is_passed_after_slots() {
        let lock = builder("okay9").fair(true).lock().unwrap();
        let args = fs::read_to_string(sidecar("okay9", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--fair\nhold\nokay9\n");
        lock.unlock().unwrap();
        let lock = builder("sem5").slots(2).fair(true).lock().unwrap();
        let args = fs::read_to_string(sidecar("sem5", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\n--slots\n2\n--fair\nhold\nsem5\n");
        lock.unlock().unwrap();
        // `fair(false)`: nothing passed (the profile decides).
        let lock = builder("okay10").fair(true).fair(false).lock().unwrap();
        let args = fs::read_to_string(sidecar("okay10", "args")).unwrap();
        assert_eq!(args, "--watch-stdin\nhold\nokay10\n");
        lock.unlock().unwrap();
    }

    #[test]
    fn bad_slots_are_refused_before_spawning() {
        let _ = fake();
        for (n, tag) in [(0, "sem2"), (1025, "sem3"), (u32::MAX, "sem4")] {
            let err = builder(tag).slots(n).lock().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Usage, "{n}");
            assert_eq!(err.exit_code(), None);
            assert!(err.message().contains("1 to 1024"), "{err}");
            assert!(!sidecar(tag, "args").exists(), "{n}: nothing spawned");
            let err = builder(tag).slots(n).try_lock().unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Usage, "{n}");
        }
    }

    #[test]
    fn bad_tag_is_refused_before_spawning() {
        let _ = fake();
        let err = NetLock::builder("-v")
            .helper("/nonexistent")
            .lock()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Usage);
    }

    #[test]
    fn missing_helper_is_spawn_error() {
        let _ = fake();
        let err = NetLock::builder("demo")
            .helper("/nonexistent/locksmith")
            .try_lock()
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Spawn);
        assert_eq!(err.exit_code(), None);
        assert!(err.message().contains("Builder::helper"), "{err}");
    }
}
