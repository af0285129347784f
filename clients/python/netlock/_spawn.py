"""Finding the ``locksmith`` helper and building its command line."""

import datetime
import math
import os
import re
import stat
from typing import List, Optional, Tuple, Union

from ._errors import SpawnError, Usage

HELPER_ENV = "LOCKSMITH_BIN"
HELPER_NAME = "locksmith"

# Waits at least this long are passed as ``forever``.
_EFFECTIVELY_FOREVER = 100 * 365 * 24 * 3600
_SECONDS = re.compile(r"^[0-9]+(\.[0-9]*)?$|^\.[0-9]+$")

WaitArg = Union[None, int, float, str, datetime.timedelta]


def check_tag(tag: object) -> str:
    """Refuses what could never be a profile name or lock address, before anything is spawned:
    an empty tag, one starting with ``-`` (it would read as an option), control characters.
    The helper judges the rest (and says ``ERROR usage:``)."""
    if not isinstance(tag, str):
        raise Usage(f"the lock tag must be a string, not {type(tag).__name__}")
    if not tag:
        raise Usage("no lock tag given: expected a profile name such as 'phonestuff'")
    if tag.startswith("-"):
        raise Usage(f"invalid lock tag {tag!r}: it must not start with '-'")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in tag):
        raise Usage(f"invalid lock tag {tag!r}: control characters")
    return tag


def wait_arg(wait: WaitArg) -> Optional[str]:
    """The ``--wait`` value for ``wait``: ``None`` passes nothing (the profile decides).

    Numbers and ``timedelta`` are seconds: ``0`` is ``0`` (try once), anything else is
    whole milliseconds rounded up (a non-zero wait never becomes "try once"), infinity and
    waits of a century or more ``forever``. A string that is a plain number is seconds too;
    any other string (``"forever"``, ``"1m30s"``) goes to the helper as written.
    """
    if wait is None:
        return None
    if isinstance(wait, datetime.timedelta):
        wait = wait.total_seconds()
    if isinstance(wait, str):
        text = wait.strip()
        if not text:
            raise Usage("wait='' : expected seconds, 'forever' or a duration such as '1m30s'")
        if not _SECONDS.match(text):
            if any(c.isspace() for c in text) or text.startswith("-"):
                raise Usage(f"wait={wait!r}: expected seconds, 'forever' or a duration such as '1m30s'")
            return text
        wait = float(text)
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise Usage(f"wait={wait!r}: expected seconds (a number), a str or a timedelta")
    if math.isnan(wait) or wait < 0:
        raise Usage(f"wait={wait!r}: must not be negative")
    if wait >= _EFFECTIVELY_FOREVER:
        return "forever"
    if wait == 0:
        return "0"
    micros = round(wait * 1_000_000)
    millis = max(1, -(-micros // 1000))
    return f"{millis}ms"


# The most slots a semaphore may have (SPEC section 3b).
MAX_SLOTS = 1024


def slots_arg(slots: object) -> Optional[str]:
    """The ``--slots`` value for ``slots``: ``None`` passes nothing (the profile decides);
    an ``int`` from 1 to 1024 is passed as written; anything else (a ``bool``, a ``str``, 0,
    1025) raises :class:`Usage` before anything is spawned."""
    if slots is None:
        return None
    if isinstance(slots, bool) or not isinstance(slots, int):
        raise Usage(f"slots={slots!r}: expected a number of slots (an int from 1 to {MAX_SLOTS})")
    if not 1 <= slots <= MAX_SLOTS:
        raise Usage(f"slots={slots!r}: expected 1 to {MAX_SLOTS}")
    return str(slots)


def fair_arg(fair: object) -> bool:
    """Whether to pass ``--fair`` for ``fair``: ``True`` passes it; ``False`` or ``None``
    passes nothing (the profile decides); anything else (``"yes"``, ``1``) raises
    :class:`Usage` before anything is spawned."""
    if fair is None or fair is False:
        return False
    if fair is True:
        return True
    raise Usage(f"fair={fair!r}: expected True or False")


def helper_args(
    tags: Union[str, List[str]],
    profiles,
    wait: Optional[str],
    shared: bool,
    slots: Optional[str] = None,
    fair: bool = False,
) -> List[str]:
    """``--watch-stdin [--profiles FILE] [--wait D] [--shared] [--slots N] [--fair] hold TAG
    [TAG...]``."""
    args = ["--watch-stdin"]
    if profiles is not None:
        args += ["--profiles", os.fspath(profiles)]
    if wait is not None:
        args += ["--wait", wait]
    if shared:
        args.append("--shared")
    if slots is not None:
        args += ["--slots", slots]
    if fair:
        args.append("--fair")
    args.append("hold")
    args += [tags] if isinstance(tags, str) else tags
    return args


def find_helper(explicit=None) -> Tuple[str, str]:
    """The helper to run and how it was found: ``helper=``, else ``$LOCKSMITH_BIN``, else
    ``locksmith`` in a trusted directory on ``$PATH`` (see ``untrusted``)."""
    if explicit is not None:
        return os.fspath(explicit), "given as helper="
    env = os.environ.get(HELPER_ENV)
    if env:
        # Set to a missing file is a spawn error, not a fall-through: the user asked for it.
        return env, "from $" + HELPER_ENV
    skipped = []
    for entry in os.environ.get("PATH", "").split(os.pathsep):
        if not entry or not os.path.isabs(entry):
            continue  # an empty or relative entry means the current directory
        candidate = os.path.join(entry, HELPER_NAME)
        if not (os.path.isfile(candidate) and os.access(candidate, os.X_OK)):
            continue
        why = untrusted(candidate)
        if why:
            skipped.append(f"{candidate} ({why})")
            continue
        return candidate, "looked up on $PATH"
    detail = "; skipped: " + ", ".join(skipped) if skipped else ""
    raise SpawnError(
        f"no `{HELPER_NAME}` helper found: set ${HELPER_ENV} or pass helper=, "
        f"or install it in a directory on $PATH that only you or root can write{detail}"
    )


def untrusted(candidate: str) -> Optional[str]:
    """Why ``candidate`` must not be run, or ``None``.

    The directory it is found in, the real file (symlinks resolved) and the directory that
    holds the real file must be owned by root or by us and not writable by group or others.
    Their ancestors must be owned by root or by us too, and may be writable by others only
    with the sticky bit (``/tmp``), which keeps others from renaming what is ours.
    """
    euid = os.geteuid()

    def bad_owner(st: os.stat_result) -> bool:
        return st.st_uid not in (0, euid)

    def check(path: str, strict: bool) -> Optional[str]:
        try:
            st = os.stat(path)
        except OSError as e:
            return f"{path}: {e.strerror}"
        if bad_owner(st):
            return f"{path} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and (strict or not (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX)):
            return f"{path} is writable by group or others"
        return None

    def chain(directory: str) -> Optional[str]:
        directory = os.path.realpath(directory)
        why = check(directory, True)
        while why is None and directory != os.path.dirname(directory):
            directory = os.path.dirname(directory)
            why = check(directory, False)
        return why

    real = os.path.realpath(candidate)
    return (
        chain(os.path.dirname(candidate))
        or check(real, True)
        or (chain(os.path.dirname(real)) if os.path.dirname(real) != os.path.realpath(os.path.dirname(candidate)) else None)
    )
