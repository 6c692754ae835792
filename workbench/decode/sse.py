"""Server-sent events read from chunks as they cross the wire: linear in the bytes, bounded in memory.

A stream's bytes arrive in chunks cut anywhere, and a hostile (or broken) server can send one line
of hundreds of megabytes. ``SseReader`` therefore looks for line ends only in the bytes of each new
chunk (``bytes.find`` over the chunk, each byte about once; never over what it holds from before)
and holds at most ``limit`` bytes of one event's data (and so of one line): an event whose data
grows past the limit is not held any more, only counted and hashed as it goes by, and comes out as
``SseOversize`` (its size and SHA-256) instead of ``SseEvent``; so does an event with one ``data``
line longer than the limit (its ``data:`` included), and a comment line past it. A longer line of
any other field (``event:``, ``id:``) is skipped. So a 200 MB line costs one pass over its bytes
and ``limit`` bytes of memory, whatever the chunking.

The limit (``SSE_EVENT_LIMIT``, 16 MiB) can be changed per process with ``WORKBENCH_SSE_EVENT_MB``
(a capture's mitmdump and its writer process inherit it) and for one import with
``workbench import --sse-event-mb``, like the inflate budgets (``workbench.wire.inflate``).
Parsing follows the SSE rules: ``\\r\\n``, ``\\r`` or ``\\n`` end a line; ``field: value`` (one
space after the colon dropped); ``data`` lines joined by ``\\n``; ``event`` names the event; a
blank line dispatches it; a line starting with ``:`` is a comment; other fields are ignored.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from collections.abc import Iterator
from typing import NamedTuple

MIB = 1024 * 1024
SSE_EVENT_LIMIT = 16 * MIB
ENV_SSE_EVENT = "WORKBENCH_SSE_EVENT_MB"
# below this a limit would cut field names ("data:", "event:") off the lines it has to read
MIN_SSE_EVENT_LIMIT = 64
_LONG_DATA, _LONG_COMMENT, _LONG_OTHER = 0, 1, 2


_LIMIT: contextvars.ContextVar[int | None] = contextvars.ContextVar("sse_event_limit", default=None)


@contextlib.contextmanager
def use_sse_event_limit(limit: int | None) -> Iterator[None]:
    """Readers made within the block hold ``limit`` bytes (``workbench import --sse-event-mb``);
    None: the process default."""
    token = _LIMIT.set(limit)
    try:
        yield
    finally:
        _LIMIT.reset(token)


def sse_event_limit() -> int:
    """The limit in force: the one ``use_sse_event_limit`` set, else ``$WORKBENCH_SSE_EVENT_MB``
    (MiB, fractions allowed), else the default."""
    chosen = _LIMIT.get()
    if chosen is not None:
        return max(MIN_SSE_EVENT_LIMIT, chosen)
    raw = os.environ.get(ENV_SSE_EVENT, "").strip()
    try:
        value = float(raw) if raw else 0.0
    except ValueError:
        value = 0.0
    return max(MIN_SSE_EVENT_LIMIT, int(value * MIB)) if value > 0 else SSE_EVENT_LIMIT


class SseEvent(NamedTuple):
    event: str | None   # its ``event:`` name
    data: bytes         # its ``data`` lines joined by newlines


class SseComment(NamedTuple):
    line: bytes         # the whole line, its ``:`` included


class SseOversize(NamedTuple):
    """An event whose data (or a comment line) went past the limit: what is known of it."""

    comment: bool       # a comment line (else an event's data)
    event: str | None
    size: int           # bytes of the event's data (its ``data`` values joined by newlines) or of the line
    sha256: str         # of those bytes
    limit: int


SseItem = SseEvent | SseComment | SseOversize


class SseReader:
    """Chunks of one SSE body in (``feed``, then ``close``), events out."""

    __slots__ = ("limit", "_line", "_after_cr", "_long", "_long_hash", "_long_size", "_data", "_data_size",
                 "_event", "_over", "_over_size")

    def __init__(self, limit: int | None = None) -> None:
        self.limit = max(MIN_SSE_EVENT_LIMIT, limit if limit is not None else sse_event_limit())
        self._line = bytearray()          # the line being read, while within the limit
        self._after_cr = False            # the last chunk ended with \r: a \n opening the next is its pair
        self._long: int | None = None     # the line went past the limit: what kind of line it is
        self._long_hash: hashlib._Hash | None = None  # a comment line's bytes past the limit
        self._long_size = 0
        self._data: list[bytes] = []      # the current event's data lines
        self._data_size = 0               # their size joined by newlines
        self._event: str | None = None
        self._over: hashlib._Hash | None = None  # the current event's data, once past the limit
        self._over_size = 0

    @property
    def held(self) -> int:
        """Bytes held now (the line being read and the event's data): at most twice the limit."""
        return len(self._line) + self._data_size

    def feed(self, chunk: bytes) -> list[SseItem]:
        out: list[SseItem] = []
        if not chunk:
            return out
        pos = 0
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                pos = 1
        limit = self.limit
        size = len(chunk)
        find = chunk.find
        # the next \n and \r at or after ``pos``, each searched again only once ``pos`` passes it
        # (memchr over the chunk's bytes: every byte is looked at about once, whatever the lines)
        nl, cr = find(b"\n", pos), find(b"\r", pos)
        while nl >= 0 or cr >= 0:
            if cr < 0 or 0 <= nl < cr:
                end, nxt = nl, nl + 1
            else:
                end = cr
                nxt = cr + 2 if chunk[cr + 1:cr + 2] == b"\n" else cr + 1
                if nxt == size and chunk[-1:] == b"\r":
                    self._after_cr = True  # its \n may open the next chunk
            if self._long is None and not self._line and end - pos <= limit:
                self._whole_line(chunk[pos:end], out)  # the common case: the line is in this chunk
            else:
                self._piece(chunk, pos, end)
                self._line_ended(out)
            pos = nxt
            if 0 <= nl < pos:
                nl = find(b"\n", pos)
            if 0 <= cr < pos:
                cr = find(b"\r", pos)
        if pos < size:
            self._piece(chunk, pos, size)
        return out

    def close(self) -> list[SseItem]:
        out: list[SseItem] = []
        if self._long is not None or self._line:
            self._line_ended(out)
        self._whole_line(b"", out)
        return out

    # lines -------------------------------------------------------------------------------------

    def _piece(self, chunk: bytes, start: int, end: int) -> None:
        """Part of a line that goes on past ``end`` (or whose start came in an earlier chunk)."""
        if start >= end:
            return
        view = memoryview(chunk)[start:end]
        if self._long is not None:
            self._long_bytes(view)
        elif len(self._line) + (end - start) <= self.limit:
            self._line += view
        else:
            self._start_long(view)

    def _start_long(self, view: memoryview) -> None:
        """The line went past the limit: from here on it is counted and hashed, not held."""
        held = bytes(self._line)
        self._line = bytearray()
        head = (held[:6] + bytes(view[:6]))[:6]
        if head.startswith(b"data:"):
            self._long = _LONG_DATA
            skip = 5 + (head[5:6] == b" ")  # the value starts after "data:" and one space
            self._over_from_here()
            if skip < len(held):
                self._long_bytes(memoryview(held)[skip:])
                self._long_bytes(view)
            else:
                self._long_bytes(view[skip - len(held):])
        elif head.startswith(b":"):
            self._long = _LONG_COMMENT
            self._long_hash, self._long_size = hashlib.sha256(), 0
            self._long_bytes(memoryview(held))
            self._long_bytes(view)
        else:
            self._long = _LONG_OTHER  # an event name, an id, an unknown field: nothing to keep

    def _long_bytes(self, view: memoryview) -> None:
        if self._long == _LONG_DATA:
            assert self._over is not None
            self._over.update(view)
            self._over_size += len(view)
        elif self._long == _LONG_COMMENT:
            assert self._long_hash is not None
            self._long_hash.update(view)
            self._long_size += len(view)

    def _line_ended(self, out: list[SseItem]) -> None:
        long, self._long = self._long, None
        if long is None:
            line = bytes(self._line)
            self._line = bytearray()
            self._whole_line(line, out)
        elif long == _LONG_COMMENT:
            assert self._long_hash is not None
            out.append(SseOversize(True, None, self._long_size, self._long_hash.hexdigest(), self.limit))
            self._long_hash = None

    def _whole_line(self, line: bytes, out: list[SseItem]) -> None:
        if not line:
            self._dispatch(out)
            return
        if line[:1] == b":":
            out.append(SseComment(line))
            return
        name, _, value = line.partition(b":")
        if value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            size = self._data_size + (1 if self._data else 0) + len(value)
            if self._over is None and size <= self.limit:
                self._data.append(value)
                self._data_size = size
            else:
                self._over_from_here().update(value)
                self._over_size += len(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")

    def _over_from_here(self) -> hashlib._Hash:
        """The hash of the current event's data, started from what is held (which is then dropped),
        with the newline that joins the next data line to the earlier ones counted."""
        if self._over is None:
            self._over = hashlib.sha256(self._joined_data())
            self._over_size = self._data_size
            if not self._data:
                self._data_size = 0
                return self._over
            self._data, self._data_size = [], 0
        self._over.update(b"\n")
        self._over_size += 1
        return self._over

    def _joined_data(self) -> bytes:
        return b"\n".join(self._data)

    def _dispatch(self, out: list[SseItem]) -> None:
        if self._over is not None:
            out.append(SseOversize(False, self._event, self._over_size, self._over.hexdigest(), self.limit))
        elif self._data or self._event is not None:
            out.append(SseEvent(self._event, self._joined_data()))
        self._data, self._data_size, self._event = [], 0, None
        self._over, self._over_size = None, 0
