"""Exceptions: one class per kind of the helper's ``ERROR <kind>:`` line and exit code."""

from typing import Optional

__all__ = [
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


class Error(Exception):
    """Taking, holding or releasing a lock failed.

    ``kind`` is the helper's word (``busy``, ``config``, ``unavailable``, ``denied``,
    ``lost``, ``usage``, ``io``) or the client's own (``spawn``, ``protocol``);
    ``message`` the helper's own words when it gave any; ``exit_code`` the helper's exit
    status when it had exited (``None`` if it had not, or a signal killed it).

    ``str(err)`` is ``locksmith: <kind>: <message>``.
    """

    kind = "error"

    def __init__(self, message: str, exit_code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"locksmith: {self.kind}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, exit_code={self.exit_code!r})"


class Busy(Error):
    """The lock is held by someone else and the wait gave up (exit code 75).

    ``try_lock`` returns ``None`` instead of raising this.
    """

    kind = "busy"


class Config(Error):
    """Profiles file missing or malformed, unknown profile or backend, missing field,
    unsafe file permissions (exit code 78)."""

    kind = "config"


class Unavailable(Error):
    """The lock server could not be reached: connection refused, TLS failed (exit code 69)."""

    kind = "unavailable"


class Denied(Error):
    """Authentication failed, or permission denied on the lock path (exit code 77)."""

    kind = "denied"


class Lost(Error):
    """The lock was lost while held (the helper said ``LOST``, or it died or was stopped
    before being asked to release), or the release could not complete (exit code 74)."""

    kind = "lost"


class Usage(Error):
    """A bad argument: refused by this package before anything was spawned, or by the
    helper's command line (exit code 64)."""

    kind = "usage"


class Io(Error):
    """An I/O error on the lock path (EIO, ENOSPC, EROFS; exit code 74), or on the pipes
    to the helper."""

    kind = "io"


class SpawnError(Error):
    """The helper could not be started (not found, not executable)."""

    kind = "spawn"


class ProtocolError(Error):
    """The helper said something this package cannot parse, or exited without a status
    line and with an exit code outside the table."""

    kind = "protocol"


_BY_WORD = {
    cls.kind: cls
    for cls in (Busy, Config, Unavailable, Denied, Lost, Usage, Io, SpawnError, ProtocolError)
}

# The helper's words: the only kinds an ``ERROR`` line may carry.
HELPER_WORDS = ("busy", "config", "unavailable", "denied", "lost", "usage", "io")

_BY_CODE = {64: Usage, 69: Unavailable, 74: Lost, 75: Busy, 77: Denied, 78: Config}


def class_for_word(word: str):
    """The class for a word on an ``ERROR`` line, or ``None`` if the helper may not send it."""
    return _BY_WORD[word] if word in HELPER_WORDS else None


def class_for_code(code: Optional[int]):
    """The class a sysexits code stands for (74 is ``lost``, as the helper uses it for a
    failed release), or ``None``."""
    return _BY_CODE.get(code) if code is not None else None


def make(kind: str, message: str, exit_code: Optional[int] = None) -> Error:
    """An error of the class named by ``kind``."""
    return _BY_WORD.get(kind, ProtocolError)(message, exit_code)
