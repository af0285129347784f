"""Crash-safe locks held by a ``locksmith`` helper process.

A lock (a ``flock(2)`` file, a lock directory on NFS or on an FTP server, an etcd key, a
PostgreSQL advisory lock, an S3 object, a Redis key) is taken and held by a small helper process, ``locksmith``, on
behalf of this one. The helper releases it when the lock is unlocked, and also **at once if
this process dies**, however it dies (even ``kill -9``). This package only names a
*profile*; which backend, server and credentials it means is written in the profiles file
the helper reads, so no password travels on a command line.

::

    import netlock

    with netlock.lock("phonestuff") as l:      # blocks until the lock is ours
        upload("phone.tsv", fencing_token=l.token)
    # released here, and really gone: the helper has exited

    l = netlock.try_lock("nightly")            # None if someone else holds it
    if l is None:
        raise SystemExit("another nightly run is in progress")
    with l:
        run_job()

Several locks at once: name them all (``netlock.lock("db", "cache")``); the
:class:`Lock` holds every one or none, and :attr:`Lock.tokens` gives each lock's token in
the order named.

A semaphore: ``netlock.lock("/var/lock/gpu", slots=2)`` lets up to two holders in at once,
each in its own slot (:attr:`Lock.slot`: 0 or 1).

A fair queue: ``netlock.lock("mkdir:/shared/locks/deploy", fair=True)`` waits in line, served
in the order the waiters began to wait (every contender of the lock should say ``fair=True``).

Errors keep the helper's classification: :class:`Busy`, :class:`Config`,
:class:`Unavailable`, :class:`Denied`, :class:`Lost`, :class:`Usage`, :class:`Io`, and the
client's own :class:`SpawnError` and :class:`ProtocolError`, all subclasses of
:class:`Error` with ``.kind``, ``.message`` and ``.exit_code``.

How it works: ``lock()`` runs ``locksmith --watch-stdin [--profiles FILE] [--wait D]
[--shared] [--slots N] [--fair] hold TAG [TAG...]`` with stdin and stdout on pipes it keeps and stderr inherited, and
reads one line: ``OK <profile> backend=... [token=N] [prev=crashed] [slot=K slots=N] ...`` or ``ERROR
<kind>: <message>`` (then the helper exits with a sysexits code: 64 usage, 69 unavailable,
74 lost/io, 75 busy, 77 denied, 78 config). While held, the helper writes nothing more,
except ``LOST <reason>`` if the lock is lost (then it exits 74); :attr:`Lock.lost` reads
that without blocking. Releasing closes the helper's stdin and waits for it to exit.

Security: the helper is ``helper=``, else ``$LOCKSMITH_BIN`` (as given: whoever can set
your environment or write that file decides what runs), else ``locksmith`` in a directory
on ``$PATH`` that is owned by root or you and writable by nobody else (entries that are
empty, relative, or writable by others are skipped; never the script's own directory).
Only the tag, the profiles path, the wait, ``--shared``, ``--slots`` and ``--fair`` appear on
the helper's command line (visible in ``ps``).

Limits, said plainly: a holder paused longer than the profile's ``stale_after``
(``SIGSTOP``, a VM pause) can have its lock broken by a waiter on another host; pass
:attr:`Lock.token` to whatever you write to, so that it can refuse a stale writer.
"""

from ._errors import (
    Busy,
    Config,
    Denied,
    Error,
    Io,
    Lost,
    ProtocolError,
    SpawnError,
    Unavailable,
    Usage,
)
from ._lock import Lock, lock, try_lock

__version__ = "0.1.0"

__all__ = [
    "lock",
    "try_lock",
    "Lock",
    "Error",
    "Busy",
    "Config",
    "Unavailable",
    "Denied",
    "Lost",
    "Usage",
    "Io",
    "SpawnError",
    "ProtocolError",
]
