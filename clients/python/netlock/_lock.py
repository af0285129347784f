"""``Lock``, the guard; ``lock`` and ``try_lock``, which make one."""

import os
import select
import subprocess
import sys
import threading
import time
import weakref
from typing import List, Optional, Sequence, Tuple

from . import _errors, _protocol, _spawn
from ._errors import Error, Io, Lost, ProtocolError, SpawnError, Usage
from ._spawn import WaitArg

# How long a helper that failed, or broke the protocol, gets to exit after we close its
# pipes before it is killed. A real helper that printed ERROR exits at once; this only
# bounds the damage of a wrong binary.
_ABANDON_GRACE = 5.0

# Locks alive in this process, so that a child made by a bare os.fork() can drop its copies
# of their pipes (otherwise the helper would keep the lock until that child exits too).
_LIVE: "weakref.WeakSet[Lock]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for lk in list(_LIVE):
        # The parent's threads are gone: a mutex one of them held would never be released.
        lk._mutex = threading.Lock()
        lk._forget_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Lock:
    """A lock held by a ``locksmith`` helper process on behalf of this process.

    Made by :func:`lock` or :func:`try_lock`. Held from the moment one of those returns
    until :meth:`unlock`, the end of a ``with`` block, or garbage collection, unless the
    helper reports it lost on the way (:attr:`lost`). One object may hold several locks
    (``lock("a", "b")``): they are then held, lost and released together.

    The helper is a child process whose stdin and stdout are pipes this object owns (stderr
    is inherited: the helper's waiting message and logs appear on ours). Releasing closes
    its stdin (it runs with ``--watch-stdin``) and waits for it to exit: the lock is gone
    when it has exited, and its exit status says whether the release went well.

    Resource leaking:

    - ``unlock()``, the end of a ``with`` block, and ``__del__`` all reap the helper, so no
      zombie is left. ``__del__`` never raises; it reports a failed release on stderr.
    - If this process exits, or is killed (even ``kill -9``), its pipe ends close and the
      helper, which also watches its parent through a pidfd, releases at once.
    - If the helper is killed, nobody releases the lock: it becomes breakable as the
      backend allows (``flock`` at once; ``mkdir``/``link``/``symlink`` at once on same-host
      proof of death, else after ``stale_after``). :attr:`lost` turns true and
      :meth:`unlock` raises :class:`Lost`.
    - The pipes are close-on-exec, so programs this process starts do not keep the lock
      alive. A child made by a bare ``os.fork()`` (or ``multiprocessing`` with the fork
      start method) closes its copies at once; its ``Lock`` objects are inert there.
    - A paused holder can be overtaken: if the helper is stopped past ``stale_after``, a
      waiter on another host may break the lock. Use :attr:`token` for that case.
    - Do not set ``SIGCHLD`` to ``SIG_IGN``: the kernel would reap the helper itself and
      its exit status would be lost.
    """

    def __init__(
        self,
        proc: subprocess.Popen,
        reader: _protocol.LineReader,
        ok: _protocol.OkLine,
        helper: str,
        tags: Sequence[str] = (),
        places: Sequence[int] = (0,),
    ):
        self._proc = proc
        self._reader = reader
        self._ok = ok
        # The names given, in order, duplicates included; places[i]: tags[i]'s lock's place
        # in ok.locks.
        self._tags = list(tags) or [ok.profile]
        self._places = list(places)
        self._helper = helper
        self._problem: Optional[Error] = None
        self._released = False
        # Set by the release: whether it found the lock lost (LOST, an unexpected line, the
        # helper gone or killed before being asked, a failed release). A clean one is not.
        self._lost_at_release = False
        self._owner_pid = os.getpid()
        self._mutex = threading.Lock()
        os.set_blocking(reader.fd, False)
        _LIVE.add(self)

    # -- what the OK line said ------------------------------------------------------

    @property
    def token(self) -> Optional[int]:
        """The fencing token of this acquisition (``token=`` on the ``OK`` line), or ``None``
        if the backend keeps none. Each exclusive acquisition of a lock gets a larger token
        than every earlier one; a shared one reports the last exclusive token.

        **Always None for several locks**, even when each has a token: every lock has its
        own sequence, and one lock's token handed to another's server would fence the wrong
        writer. Use :attr:`tokens` there."""
        return self._ok.token

    @property
    def tokens(self) -> List[Optional[int]]:
        """The fencing token of each lock, in the order the locks were named, ``None`` where
        that lock's backend keeps none: one entry per name given (a name given twice gets
        its lock's token twice). For a single lock, ``[lock.token]``."""
        return [self._ok.locks[i].token for i in self._places]

    @property
    def slot(self) -> Optional[int]:
        """The semaphore slot held (``slot=`` on the ``OK`` line, from 0) for a lock of more
        than one slot (``slots=``), else ``None``. **Always None for several locks**, as
        :attr:`token` is: use :attr:`slots` there."""
        return self._ok.slot

    @property
    def slot_count(self) -> Optional[int]:
        """The lock's number of slots (``slots=`` on the ``OK`` line: the number the lock
        records, the ``slots=`` argument or the profile's), ``None`` as for :attr:`slot`."""
        return self._ok.slot_count

    @property
    def slots(self) -> List[Optional[int]]:
        """The slot held in each lock, in the order named, ``None`` where that lock has one
        slot: one entry per name given (see :attr:`tokens`). For a single lock,
        ``[lock.slot]``. (The ``slots=`` argument is the number of slots: see
        :attr:`slot_counts`.)"""
        return [self._ok.locks[i].slot for i in self._places]

    @property
    def slot_counts(self) -> List[Optional[int]]:
        """Each lock's number of slots, in the order named, ``None`` for a lock of one slot."""
        return [self._ok.locks[i].slots for i in self._places]

    @property
    def backends(self) -> List[str]:
        """The backend holding each lock, in the order named (see :attr:`tokens`)."""
        return [self._ok.locks[i].backend for i in self._places]

    @property
    def tags(self) -> List[str]:
        """The names (profiles or lock addresses) given, in order: one for a single lock."""
        return list(self._tags)

    @property
    def prev_crashed(self) -> bool:
        """Whether the previous acquisition did not end in a clean release (``prev=crashed``):
        a holder was killed, a machine lost, the lock broken. Its data may be half-written."""
        return self._ok.get("prev") == "crashed"

    @property
    def profile(self) -> str:
        """The profile (or lock address) as the helper echoed it on the ``OK`` line; for
        several locks, the first one named."""
        return self._ok.profile

    @property
    def backend(self) -> str:
        """The backend holding the lock: ``flock``, ``mkdir``, ``ftp``, ... For several
        locks, ``backend=`` as written, comma-separated (``mkdir,flock``): see :attr:`backends`."""
        return self._ok.get("backend") or ""

    @property
    def shared(self) -> bool:
        """Whether this is a shared (reader) lock (``mode=shared``); for several locks,
        whether every one is."""
        return all(held.shared for held in self._ok.locks)

    @property
    def status_line(self) -> str:
        """The helper's whole ``OK`` line, without its newline."""
        return self._ok.raw

    def field(self, key: str) -> Optional[str]:
        """Any ``key=value`` field of the ``OK`` line, e.g. ``lock.field("since")``."""
        return self._ok.get(key)

    @property
    def helper_pid(self) -> int:
        """The process id of the helper holding the lock."""
        return self._proc.pid

    # -- is it still held? ------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """Whether the lock was lost while held, checked without blocking.

        True once the helper has written ``LOST`` (or anything unexpected), or has exited or
        been killed before :meth:`unlock` asked it to, or the release failed. False while
        held, and after a clean :meth:`unlock` (the lock is then released, not lost: see
        :attr:`held`). The answer can be stale by the time you act on it; use :attr:`token`
        where that matters.
        """
        self._try_pump()
        if self._released:
            return self._lost_at_release
        return self._problem is not None or self._reader.eof

    @property
    def held(self) -> bool:
        """Whether the lock is still held: neither released nor :attr:`lost`."""
        return not self.lost and not self._released

    def check(self) -> None:
        """Raises :class:`Lost` (with the helper's reason) if the lock is no longer held,
        without blocking. Handy between the steps of a long job."""
        self._try_pump()
        if self._released:
            raise Lost("the lock was released")
        if self._problem is not None:
            raise self._problem
        if self._reader.eof:
            raise Lost(f"the helper (pid {self._proc.pid}) exited while holding the lock")

    def wait_lost(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lock is lost (``LOST``, or the helper exited) or released, or
        ``timeout`` seconds pass (``None``: no limit). Returns :attr:`lost`. For a watchdog
        thread, or to select on :meth:`fileno` yourself."""
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._reader.fd, select.POLLIN)
        while True:
            if self.lost or self._released:
                return self.lost
            if deadline is None:
                poller.poll()
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                poller.poll(max(1, int(left * 1000 + 0.999)))

    def fileno(self) -> int:
        """The read end of the helper's stdout: readable when it says ``LOST`` or exits.
        Read nothing from it yourself; check :attr:`lost` when it becomes readable."""
        return self._reader.fd

    # -- releasing ------------------------------------------------------------------

    def unlock(self) -> bool:
        """Releases the lock and waits until it is really gone (the helper has exited).

        Returns ``True`` if this call released it, ``False`` if it had been released
        already. Raises :class:`Lost` with the helper's reason if it said ``LOST``, or if it
        exited or was killed before being asked (the critical section may have run
        unprotected); the class of its exit code if the release itself failed.
        """
        with self._mutex:
            if self._released:
                return False
            if os.getpid() != self._owner_pid:
                self._forget_in_child()
                return False
            self._release()
            return True

    def __enter__(self) -> "Lock":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.unlock()
            return
        # The block's own exception wins; a failed release is only reported.
        try:
            self.unlock()
        except Error as err:
            _report(self._ok.profile, err)

    def __del__(self) -> None:
        try:
            if self._released:
                return
        except AttributeError:  # __init__ did not finish
            return
        try:
            self.unlock()
        except Error as err:
            _report(self._ok.profile, err)
        except Exception:  # interpreter shutdown: do not make it noisier
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        if len(self._tags) > 1:
            return (
                f"<netlock.Lock {self._tags!r} backends={self.backends} tokens={self.tokens} "
                f"helper_pid={self._proc.pid} {state}>"
            )
        slot = "" if self.slot is None else f" slot={self.slot}/{self.slot_count}"
        return (
            f"<netlock.Lock {self._ok.profile!r} backend={self.backend} token={self.token}{slot} "
            f"helper_pid={self._proc.pid} {state}>"
        )

    # -- internals --------------------------------------------------------------------

    def _try_pump(self) -> None:
        """``_pump`` unless another thread is pumping or releasing (then: no news yet)."""
        if self._released or not self._mutex.acquire(blocking=False):
            return
        try:
            if not self._released:
                self._pump()
        finally:
            self._mutex.release()

    def _pump(self) -> None:
        """Reads what the helper wrote since, without blocking; notes the first problem."""
        while not self._reader.eof:
            try:
                if not self._reader.fill():
                    break
            except Io as err:
                self._note(err)
                break
        while True:
            try:
                line = self._reader.take_line()
            except ProtocolError as err:
                self._note(err)
                continue
            if line is None:
                return
            self._note(_after_ok(line))

    def _note(self, err: Error) -> None:
        if self._problem is None:
            self._problem = err

    def _forget_in_child(self) -> None:
        """In a child made by fork(): close our copies of the pipes, touch nothing else."""
        if self._released:
            return
        self._released = True
        _LIVE.discard(self)
        for f in (self._proc.stdin, self._proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass

    def _release(self) -> None:
        """Closes the helper's stdin, reaps it, and judges how it ended. Runs once.

        Every way out but a clean release (exit 0 after being asked, nothing unexpected
        said) leaves :attr:`lost` true."""
        self._lost_at_release = True
        self._released = True
        _LIVE.discard(self)
        proc = self._proc
        pid = proc.pid
        self._pump()
        # Did the helper end before we asked? Either its stdout said so, or it is reaped now.
        gone_before = self._reader.eof or proc.poll() is not None
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            code = proc.wait()
        except BaseException as e:
            if isinstance(e, OSError) and e.errno is not None:
                proc.stdout.close()
                raise Io(f"waiting for the helper (pid {pid}) to release the lock: {e}") from None
            # Interrupted (KeyboardInterrupt, an exception from a signal handler): the
            # helper is releasing already and exits promptly; reap it anyway so that no
            # zombie is left, then let the exception go on.
            code = proc.wait()
            self._pump()
            proc.stdout.close()
            self._lost_at_release = gone_before or code != 0 or self._problem is not None
            raise
        # It has exited: everything it wrote is in the pipe. Read it all.
        self._pump()
        proc.stdout.close()
        exit_code = code if code >= 0 else None
        if self._problem is not None:
            err = self._problem
            err.exit_code = exit_code
            raise err
        when = "before unlock was asked for" if gone_before else "while releasing the lock"
        if code == 0 and not gone_before:
            self._lost_at_release = False
            return
        if code == 0:
            raise Lost(
                f"the helper (pid {pid}) exited with status 0 {when}: the lock was released "
                "early (was locksmith sent SIGTERM, SIGINT or SIGHUP?)",
                0,
            )
        if code > 0:
            cls = _errors.class_for_code(code) or ProtocolError
            raise cls(
                f"the helper (pid {pid}) exited with status {code} {when}, without a LOST line "
                "(see its stderr)",
                code,
            )
        raise Lost(
            f"the helper (pid {pid}) was killed by signal {-code} {when}: the lock is no "
            "longer held by it and becomes breakable as its backend allows"
        )


def _after_ok(line: str) -> Error:
    """What a line after OK means: only LOST is expected; all of it means the lock is no
    longer trusted."""
    try:
        parsed = _protocol.parse(line)
    except ProtocolError as err:
        return err
    if isinstance(parsed, _protocol.LostLine):
        return Lost(parsed.reason or "the helper reported the lock lost")
    if isinstance(parsed, _protocol.ErrorLine) and parsed.cls is not None:
        return parsed.cls(parsed.message)
    return ProtocolError(f"unexpected line from helper after OK: {line!r}")


def _report(profile: str, err: Error) -> None:
    try:
        sys.stderr.write(f"netlock: releasing {profile!r}: {err}\n")
    except Exception:
        pass


def _abandon(proc: subprocess.Popen) -> Tuple[Optional[int], bool]:
    """Closes both pipes, waits up to ``_ABANDON_GRACE`` for the helper to exit, then kills
    it; always reaps it. Only used before a ``Lock`` exists, when the helper holds nothing
    for us (it said ERROR, or nothing, or broke the protocol, or we were interrupted: a
    waiting helper stops waiting when its pipes close). Returns (exit code, killed)."""
    for f in (proc.stdin, proc.stdout):
        try:
            if f is not None:
                f.close()
        except OSError:
            pass
    killed = False
    try:
        code = proc.wait(_ABANDON_GRACE)
    except subprocess.TimeoutExpired:
        killed = True
        proc.kill()
        code = proc.wait()
    return (code if code >= 0 else None), killed


def _acquire(
    tags: Sequence[str],
    profiles,
    wait: Optional[str],
    shared: bool,
    helper,
    slots: Optional[str] = None,
    fair: bool = False,
) -> Lock:
    if not tags:
        raise Usage("no lock tag given: expected a profile name such as 'phonestuff'")
    for t in tags:
        _spawn.check_tag(t)
    # Each name once, in the order first given; places[i] is tags[i]'s place among them,
    # which is its lock's place on the OK line.
    sent: List[str] = []
    places = []
    for t in tags:
        if t not in sent:
            sent.append(t)
        places.append(sent.index(t))
    tag = tags[0]
    path, origin = _spawn.find_helper(helper)
    args = _spawn.helper_args(sent, profiles, wait, shared, slots, fair)
    shown = f"`{path}` ({origin})"
    try:
        proc = subprocess.Popen(
            [path] + args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
            bufsize=0,
            close_fds=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise SpawnError(f"could not start helper {shown}: {e}") from None
    reader = _protocol.LineReader(proc.stdout.fileno())
    try:
        line = reader.read_line()
        parsed = _protocol.parse(line) if line is not None else None
    except BaseException as err:
        # A protocol error, a read error, or KeyboardInterrupt while waiting: the helper
        # stops waiting when its pipes close (and releases if it had just got the lock).
        code, _ = _abandon(proc)
        if isinstance(err, Error):
            err.exit_code = code
        raise
    if isinstance(parsed, _protocol.OkLine):
        if parsed.profile in (tag, _protocol.shown_tag(tag)):
            lk = Lock(proc, reader, parsed, shown, tags, places)
            if len(parsed.locks) != len(sent):
                _names_merged(lk, len(sent), len(parsed.locks))
            return lk
        _abandon(proc)
        raise ProtocolError(
            f"helper {shown} answered for profile {parsed.profile!r} instead of {tag!r}: {line!r}"
        )
    code, killed = _abandon(proc)
    if isinstance(parsed, _protocol.ErrorLine):
        cls = parsed.cls or _errors.class_for_code(code)
        if cls is None:
            raise ProtocolError(f"{parsed.word}: {parsed.message}", code)
        message = parsed.message if parsed.cls is not None else f"{parsed.word}: {parsed.message}"
        raise cls(message, code)
    if isinstance(parsed, _protocol.LostLine):
        raise ProtocolError(f"helper {shown} said LOST before OK: {line!r}", code)
    # End-of-file without a status line.
    cls = _errors.class_for_code(code) or ProtocolError
    if killed:
        how = f"closed its stdout without a status line and was killed after {_ABANDON_GRACE:g} s"
    elif code is None:
        how = "was killed by a signal without writing a status line"
    else:
        how = f"exited with status {code} without writing a status line"
    raise cls(f"helper {shown} {how} (see its stderr)", code)


def _names_merged(lk: Lock, names: int, held: int) -> None:
    """Releases a set in which the helper took fewer locks than the different names given
    (two names for one lock, which it takes once) and raises :class:`Usage`: which token
    belongs to which name cannot be told."""
    message = (
        f"{names} different lock names were given but the helper took {held} locks "
        f"({lk.status_line!r}): some of the names are the same lock (a profile and its "
        "address?), and which token is whose cannot be told; name each lock once"
    )
    try:
        lk.unlock()
    except Error as err:
        raise Usage(f"{message}; releasing: {err}") from None
    raise Usage(f"{message}; released")


def lock(
    tag: str,
    *more: str,
    profiles=None,
    wait: WaitArg = None,
    shared: bool = False,
    slots: Optional[int] = None,
    fair: bool = False,
    helper=None,
) -> Lock:
    """Takes the lock named by ``tag`` (a profile name or a lock address) and returns the
    :class:`Lock`; with more names (``lock("a", "b", "c")``), takes them all as one set.

    Blocks until the helper answers: by default as long as the profile's ``wait`` says
    (built-in: forever). Options:

    - ``profiles``: the profiles file (``--profiles``); default: the helper's own lookup
      (``$LOCKSMITH_PROFILES``, ``~/.config/locksmith/profiles.toml``, ``/etc/...``).
    - ``wait``: seconds (``0`` tries once), a ``timedelta``, or a duration string such as
      ``"1m30s"`` or ``"forever"``. When it runs out: :class:`Busy`.
    - ``shared``: take a shared (reader) lock; :class:`Usage` if the backend has none.
    - ``slots``: a semaphore of that many slots (``--slots N``, an ``int`` from 1 to 1024,
      else :class:`Usage` before anything is spawned): up to N holders at once, each in its
      own slot (:attr:`Lock.slot`, from 0). Every holder of one lock must ask for the same
      number (another one while it is held: :class:`Config`, nothing taken); ``shared``
      with more than one slot, or a backend without slots (the helper's README says which
      have them), is :class:`Usage`. Default: the profile's or address's (``?slots=N``),
      else 1.
    - ``fair``: wait in the lock's fair queue (``--fair``, ``True`` or ``False``, anything
      else :class:`Usage` before anything is spawned): waiters are served in the order they
      began to wait, for one slot or several, on every backend. **Every contender of the
      lock should say it** (``fair=True``, the profile's ``fair = true`` or the address's
      ``?fair=true``): one that does not is not in line and may go first. A waiter that
      gives up (``wait`` runs out) or whose process goes leaves the line at once; one
      killed, as a dead holder leaves a lock. Default ``False``: pass nothing (the profile's
      or address's ``fair`` stands).
    - ``helper``: the ``locksmith`` binary; default ``$LOCKSMITH_BIN``, else ``locksmith``
      in a directory on ``$PATH`` that only root or you can write.

    Raises the :class:`Error` subclass of the helper's kind: :class:`Busy`,
    :class:`Config`, :class:`Unavailable`, :class:`Denied`, :class:`Usage`, ...;
    :class:`SpawnError` if it could not be started.

    Several locks (SPEC section 3b): the :class:`Lock` is returned only once every one is
    held, and releasing it releases them all.

    - Any mix of backends, profiles and addresses; the helper takes them in one canonical
      order (holding each while waiting for the next), so two programs naming the same
      locks in different orders never deadlock.
    - All or nothing: if one is busy when the wait runs out (one deadline for the whole
      set) or fails, those already taken are given back and that lock's error is raised
      (:class:`Busy`: :func:`try_lock` returns ``None``).
    - Losing any one is losing the set (:attr:`Lock.lost`).
    - ``wait``, ``shared``, ``slots``, ``fair`` and ``profiles`` apply to every lock; an
      address's own ``?wait=``, ``?slots=`` or a profile's keys override them for that lock.
    - :attr:`Lock.token` and :attr:`Lock.slot` are ``None`` for a set; :attr:`Lock.tokens`,
      :attr:`Lock.slots` and :attr:`Lock.backends` have one entry per name, in the order
      named.
    - The same name given twice is taken once. Two *different* names for one lock (a
      profile and its address) raise :class:`Usage` after releasing: the helper takes that
      lock once, and which token belongs to which name could not be told.
    """
    return _acquire(
        (tag,) + more,
        profiles,
        _spawn.wait_arg(wait),
        bool(shared),
        helper,
        _spawn.slots_arg(slots),
        _spawn.fair_arg(fair),
    )


def try_lock(
    tag: str,
    *more: str,
    profiles=None,
    wait: WaitArg = 0,
    shared: bool = False,
    slots: Optional[int] = None,
    fair: bool = False,
    helper=None,
) -> Optional[Lock]:
    """Like :func:`lock`, but returns ``None`` when the lock is busy (for several locks:
    when one of them is; none is held then).

    Tries once by default (``wait=0``); with ``wait`` set, waits that long first. Other
    failures still raise.
    """
    try:
        return lock(
            tag, *more, profiles=profiles, wait=wait, shared=shared, slots=slots, fair=fair, helper=helper
        )
    except _errors.Busy:
        return None
