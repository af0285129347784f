"""The reader side of the pipe protocol (SPEC section 4).

Grammar accepted (fields are separated by ASCII whitespace, so a stray trailing space or
``\\r`` does not break a parent)::

    OK <profile> key=value ...     <profile>: the first word, always (a name, or a lock
                                   address such as ``mkdir:/x?stale_after=30s``, ``=`` and all);
                                   backend= required; token= an unsigned 64-bit integer;
                                   mode= exclusive | shared
                                   With locks=N (several locks, SPEC section 3b): backend=,
                                   mode= and token= hold N comma-separated values, one per
                                   lock in the order named; a token may be empty (that lock
                                   keeps none); <profile> is the first lock named
                                   slot=K slots=N (a semaphore, SPEC 3b): both or neither,
                                   K < N; for several locks one value each, both empty for
                                   a lock of one slot
    ERROR <kind>: <message>        kind: usage unavailable lost io busy denied config
    LOST [<reason>]                only after OK

Anything else is a ``ProtocolError``.
"""

import os
import re
import unicodedata
from typing import Dict, List, Optional, Tuple

from . import _errors
from ._errors import ProtocolError

# Longest line accepted from the helper, newline included. A real OK line is a few hundred
# bytes; the cap keeps a wrong program from making us buffer without end.
MAX_LINE = 64 * 1024

_WS = re.compile(r"[ \t\n\r\f\v]+")
_U64_MAX = 2**64 - 1


class Held:
    """What the ``OK`` line says about one lock of the set."""

    __slots__ = ("backend", "shared", "token", "slot", "slots")

    def __init__(
        self,
        backend: str,
        shared: bool,
        token: Optional[int],
        slot: Optional[int] = None,
        slots: Optional[int] = None,
    ):
        self.backend = backend
        self.shared = shared
        self.token = token
        # slot=K (from 0) and slots=N, for a lock of more than one slot (SPEC 3b).
        self.slot = slot
        self.slots = slots

    def __repr__(self) -> str:
        return (
            f"Held({self.backend!r}, shared={self.shared}, token={self.token}, "
            f"slot={self.slot}, slots={self.slots})"
        )


class OkLine:
    """The fields of an ``OK`` line. ``locks`` has one :class:`Held` per lock (``locks=N``,
    else one), in the order named; ``token``, ``slot`` and ``slot_count`` are the single
    lock's, ``None`` for several."""

    __slots__ = ("raw", "profile", "fields", "locks", "token", "slot", "slot_count")

    def __init__(self, raw: str, profile: str, fields: List[Tuple[str, str]], locks: List[Held]):
        self.raw = raw
        self.profile = profile
        self.fields = fields
        self.locks = locks
        self.token = locks[0].token if len(locks) == 1 else None
        self.slot = locks[0].slot if len(locks) == 1 else None
        self.slot_count = locks[0].slots if len(locks) == 1 else None

    def get(self, key: str) -> Optional[str]:
        for k, v in self.fields:
            if k == key:
                return v
        return None


class ErrorLine:
    """An ``ERROR <kind>: <message>`` line; ``cls`` is ``None`` for a word we do not know."""

    __slots__ = ("word", "message", "cls")

    def __init__(self, word: str, message: str):
        self.word = word
        self.message = message
        self.cls = _errors.class_for_word(word)


class LostLine:
    """A ``LOST [<reason>]`` line."""

    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


# Unicode's White_Space property, as Rust's `char::is_whitespace` (the helper's rule).
_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)


def shown_tag(tag: str) -> str:
    """The OK line's profile field for ``tag``, as the helper writes it (SPEC 3a): each
    whitespace or control character written ``%XX`` per UTF-8 byte (a space is ``%20``), so
    that it stays one word."""
    return "".join(
        "".join(f"%{b:02X}" for b in c.encode("utf-8"))
        if c in _WHITE_SPACE or unicodedata.category(c) == "Cc"
        else c
        for c in tag
    )


def parse(line: str):
    """Parses one line (without its newline) into ``OkLine``, ``ErrorLine`` or ``LostLine``.

    Raises ``ProtocolError`` for anything else.
    """

    def bad(why: str) -> ProtocolError:
        return ProtocolError(f"unexpected line from helper ({why}): {line!r}")

    parts = _WS.split(line, maxsplit=1)
    first = parts[0]
    rest = parts[1].strip(" \t\n\r\f\v") if len(parts) > 1 else ""
    if first == "OK":
        try:
            return _parse_ok(line, rest)
        except ValueError as e:
            raise bad(str(e)) from None
    if first == "ERROR":
        if ":" not in rest:
            raise bad("ERROR without `<kind>:`")
        word, message = rest.split(":", 1)
        word = word.strip(" \t\n\r\f\v")
        if not word:
            raise bad("ERROR with an empty kind")
        return ErrorLine(word, message.strip(" \t\n\r\f\v"))
    if first == "LOST":
        return LostLine(rest)
    raise bad("expected OK, ERROR or LOST")


def _parse_ok(line: str, rest: str) -> OkLine:
    words = [w for w in _WS.split(rest) if w]
    # The first word is always the profile field (SPEC section 4), whatever it holds: for a
    # lock address it is the address as given (section 3a), ``?k=v&...`` included.
    if not words:
        raise ValueError("OK without a profile name")
    profile = words[0]
    fields: List[Tuple[str, str]] = []
    seen: Dict[str, str] = {}
    for word in words[1:]:
        if "=" not in word:
            raise ValueError(f"`{word}` is not key=value")
        key, value = word.split("=", 1)
        if not key:
            raise ValueError(f"`{word}` has an empty key")
        if key in seen:
            raise ValueError(f"`{key}=` appears twice")
        seen[key] = value
        fields.append((key, value))
    # One lock unless locks=N says more (SPEC section 3b); then each of backend=, mode= and
    # token= has N comma-separated values.
    n = None
    if "locks" in seen:
        v = seen["locks"]
        if not (v.isascii() and v.isdigit()) or int(v) < 1:
            raise ValueError(f"locks={v} is not a positive integer")
        n = int(v)

    def each(key: str) -> List[str]:
        value = seen[key]
        if n is None:
            return [value]
        parts = value.split(",")
        if len(parts) != n:
            raise ValueError(f"{key}={value} has {len(parts)} values for locks={n}")
        return parts

    if not seen.get("backend"):
        raise ValueError("OK without backend=")
    backends = each("backend")
    if not all(backends):
        raise ValueError("backend= with an empty value")
    modes = each("mode") if "mode" in seen else ["exclusive"] * len(backends)
    for mode in modes:
        if mode not in ("exclusive", "shared"):
            raise ValueError(f"mode={mode} is neither exclusive nor shared")
    tokens: List[Optional[int]] = [None] * len(backends)
    if "token" in seen:
        t = seen["token"]
        for i, part in enumerate(each("token")):
            if part == "" and n is not None:
                continue  # several locks: a lock without a token leaves its place empty
            if not (part.isascii() and part.isdigit()) or int(part) > _U64_MAX:
                raise ValueError(f"token={t} is not an unsigned 64-bit integer")
            tokens[i] = int(part)
    # Semaphores (SPEC 3b): slot=K slots=N, one value per lock, both empty for a lock of one
    # slot.
    def numbers(key: str) -> List[Optional[int]]:
        if key not in seen:
            return [None] * len(backends)
        out: List[Optional[int]] = []
        for part in each(key):
            if part == "" and n is not None:
                out.append(None)
            elif part.isascii() and part.isdigit() and int(part) < 2**32:
                out.append(int(part))
            else:
                raise ValueError(f"{key}={seen[key]} is not a number")
        return out

    slot, slots = numbers("slot"), numbers("slots")
    for k, count in zip(slot, slots):
        if (k is None) != (count is None) or (k is not None and k >= count):
            raise ValueError(
                f"slot={seen.get('slot', '')} slots={seen.get('slots', '')}: a slot needs its "
                "number of slots, and below it"
            )
    locks = [
        Held(b, m == "shared", tk, k, c)
        for b, m, tk, k, c in zip(backends, modes, tokens, slot, slots)
    ]
    return OkLine(line, profile, fields, locks)


class LineReader:
    """Reads ``\\n``-terminated lines from a file descriptor with a buffer of its own,
    so that a non-blocking read after ``OK`` sees exactly what the helper wrote.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.eof = False

    def fill(self) -> bool:
        """One ``read(2)``. Returns ``False`` if the descriptor is non-blocking and nothing
        is there yet; sets ``eof`` at end-of-file. Raises ``Io`` on a read error."""
        try:
            data = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        except OSError as e:
            if e.errno is None:
                raise  # not from read(2): raised by a signal handler (TimeoutError...)
            self.eof = True
            raise _errors.Io(f"reading the helper's stdout: {e}") from None
        if data:
            self.buf += data
        else:
            self.eof = True
        return True

    def take_line(self) -> Optional[str]:
        """The next complete line in the buffer, without its newline, or ``None``.

        At end-of-file, leftover bytes without a newline are a ``ProtocolError``; so are a
        line over ``MAX_LINE`` bytes and one that is not UTF-8.
        """
        nl = self.buf.find(b"\n", 0, MAX_LINE)
        if nl < 0:
            if len(self.buf) >= MAX_LINE:
                self.buf.clear()
                raise ProtocolError(f"helper wrote a line longer than {MAX_LINE} bytes")
            if self.eof and self.buf:
                partial = bytes(self.buf).decode("utf-8", "replace")
                self.buf.clear()
                raise ProtocolError(f"helper's stdout ended in the middle of a line: {partial!r}")
            return None
        raw = bytes(self.buf[:nl])
        del self.buf[: nl + 1]
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            shown = raw.decode("utf-8", "replace")
            raise ProtocolError(f"helper wrote a line that is not UTF-8: {shown!r}") from None

    def read_line(self) -> Optional[str]:
        """Blocks until a whole line (returned without its newline) or end-of-file (``None``)."""
        while True:
            line = self.take_line()
            if line is not None:
                return line
            if self.eof:
                return None
            self.fill()

