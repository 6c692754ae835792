"""How many bytes anything compressed may inflate to: per frame, per session, per import.

A 1.6 MB flow file can hold eight gzip frames that inflate to 200 MB each. Inflating everything
on sight made an import peak at 9.85 GB and stored 1.6 GB of payloads; a 42 KB flow file whose
body had ``content-encoding: gzip`` grew past 5.9 GB. So every inflation in the package goes
through this module and is charged to a budget: gzip'd envelopes (flag 0x01) in the wire layer
(and therefore in capture, imports, the client, the simulator and ``decode``), HTTP
``content-encoding`` bodies of flow files and packet captures (``gzip``, ``deflate``, ``br``,
``zstd``; a body counts as one frame), a ``.zhar`` document (charged as a session of its own,
without the per-frame limit) and gzip'd fixtures:

- **per frame** (default 32 MiB): one frame's inflated size;
- **per session** (default 256 MiB): the sum over one session's frames (one stream's, when the
  caller does not name the session);
- **per import** (default 512 MiB, only within ``use_budget`` — imports set it): the sum over
  everything one import inflates. Capture, client and simulator run without a total.

A frame that would go past a budget is *not lost*: it is kept with its compressed bytes, kind
``compressed``, and an error naming the budget and how to raise it. It is inflated on demand when
somebody looks at it (``frames --json``, the TUI's detail view, ``decode --json``), up to
``LOOK_LIMIT`` (256 MiB, the gzip-bomb cap). Inflation never allocates more than the budget
allows plus one zlib chunk: the decompressor is asked for at most ``limit + 1`` bytes.

Defaults can be raised per process with environment variables (``WORKBENCH_INFLATE_FRAME_MB``,
``WORKBENCH_INFLATE_SESSION_MB``, ``WORKBENCH_INFLATE_IMPORT_MB``; a capture's mitmdump inherits
them) and for one import with ``workbench import --inflate-frame-mb/--inflate-session-mb/
--inflate-import-mb``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator

MIB = 1024 * 1024
DEFAULT_FRAME = 32 * MIB
DEFAULT_SESSION = 256 * MIB
DEFAULT_IMPORT = 512 * MIB
LOOK_LIMIT = 256 * MIB
ENV_FRAME = "WORKBENCH_INFLATE_FRAME_MB"
ENV_SESSION = "WORKBENCH_INFLATE_SESSION_MB"
ENV_IMPORT = "WORKBENCH_INFLATE_IMPORT_MB"
# Named sessions remembered by one budget (least recently used are forgotten; a forgotten session
# starts over, which only matters for a capture running for days).
_MAX_SESSIONS = 100_000


class InflateOverBudget(ValueError):
    """Inflating this frame would exceed a budget; the message names the budget and its option."""


def _env_mib(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        return default
    return int(value * MIB) if value > 0 else default


def _mib(n: int) -> str:
    return f"{n / MIB:g} MiB"


def inflate_limited(data: bytes, limit: int) -> bytes:
    """Gunzip ``data`` to at most ``limit`` bytes (InflateOverBudget past it, ValueError when broken)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(data, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        raise InflateOverBudget(f"gzip payload inflates past {_mib(limit)}")
    if not d.eof:
        raise ValueError("truncated gzip payload")
    return out


_STEP = 4 * MIB


def _zlib_members(data: bytes, limit: int, wbits: int, name: str, keep: bool) -> list[bytes]:
    """Inflate one zlib-family stream (for gzip, every member) in steps of ``_STEP``; the pieces
    when ``keep``, else nothing (a dry run that only measures)."""
    parts: list[bytes] = []
    size = 0
    rest = data
    while True:
        d = zlib.decompressobj(wbits)
        pending = rest
        try:
            while not d.eof:
                piece = d.decompress(pending, _STEP)
                pending = d.unconsumed_tail
                size += len(piece)
                if size > limit:
                    raise InflateOverBudget(f"{name} body inflates past {_mib(limit)}")
                if keep and piece:
                    parts.append(piece)
                if not piece and not pending:
                    break
        except zlib.error as exc:
            raise ValueError(f"{name}: {exc}") from None
        if not d.eof:
            raise ValueError(f"truncated {name} data")
        rest = d.unused_data
        # gzip allows several members one after the other (RFC 1952 §2.2); zlib and raw deflate do not
        if wbits != 16 + zlib.MAX_WBITS or not rest.strip(b"\0"):
            return parts


def _zlib_limited(data: bytes, limit: int, wbits: int, name: str) -> bytes:
    """One zlib-family stream (for gzip, every member) to at most ``limit`` bytes.

    A dry run measures first, so a bomb costs a few MiB of memory however far it would inflate,
    and only output that fits the limit is ever held.
    """
    _zlib_members(data, limit, wbits, name, keep=False)
    parts = _zlib_members(data, limit, wbits, name, keep=True)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _deflate_limited(data: bytes, limit: int) -> bytes:
    # ``deflate`` means a zlib stream (RFC 9110 §8.4.1.2), but servers send raw deflate too
    try:
        return _zlib_limited(data, limit, zlib.MAX_WBITS, "deflate")
    except InflateOverBudget:
        raise
    except ValueError:
        return _zlib_limited(data, limit, -zlib.MAX_WBITS, "deflate")


# Brotli's Python binding (1.1) has no output limit, so input goes in a few bytes at a time: one
# brotli command carries at most ~16 MiB of output in no fewer than ~3 bytes, which bounds what one
# call can allocate past the limit.
_BROTLI_STEP = 8


def _brotli_limited(data: bytes, limit: int) -> bytes:
    try:
        # brotli loads only for a brotli body
        import brotli
    except ImportError:  # pragma: no cover - a mitmproxy dependency, always installed with it
        raise ValueError("br: the brotli module is not installed") from None
    d = brotli.Decompressor()
    out = bytearray()
    try:
        for i in range(0, len(data), _BROTLI_STEP):
            out += d.process(data[i : i + _BROTLI_STEP])
            if len(out) > limit:
                raise InflateOverBudget(f"br body inflates past {_mib(limit)}")
    except brotli.error as exc:
        raise ValueError(f"br: {exc}") from None
    if not d.is_finished():
        raise ValueError("truncated br data")
    return bytes(out)


def _zstd_limited(data: bytes, limit: int) -> bytes:
    # The decompressor object has no output limit either, and one zstd block (128 KiB) can come
    # from 4 bytes: input goes in 256 bytes at a time (at most ~8 MiB past the limit per call).
    try:
        # zstandard loads only for a zstd body
        import zstandard
    except ImportError:  # pragma: no cover - a mitmproxy dependency, always installed with it
        raise ValueError("zstd: the zstandard module is not installed") from None
    out = bytearray()
    rest = data
    try:
        while True:  # one decompressor per zstd frame; frames may follow one another
            d = zstandard.ZstdDecompressor().decompressobj()
            for i in range(0, len(rest), 256):
                out += d.decompress(rest[i : i + 256])
                if len(out) > limit:
                    raise InflateOverBudget(f"zstd body inflates past {_mib(limit)}")
                if d.eof:
                    break
            if not d.eof:
                raise ValueError("truncated zstd data")
            rest = d.unused_data + rest[i + 256 :]
            if not rest:
                return bytes(out)
    except zstandard.ZstdError as exc:
        raise ValueError(f"zstd: {exc}") from None


_CODINGS: dict[str, Callable[[bytes, int], bytes]] = {
    "gzip": lambda d, n: _zlib_limited(d, n, 16 + zlib.MAX_WBITS, "gzip"),
    "x-gzip": lambda d, n: _zlib_limited(d, n, 16 + zlib.MAX_WBITS, "gzip"),
    "deflate": _deflate_limited,
    "zlib": lambda d, n: _zlib_limited(d, n, zlib.MAX_WBITS, "zlib"),
    "br": _brotli_limited,
    "zstd": _zstd_limited,
}
CODINGS = tuple(_CODINGS)


def codings_of(header: str | None) -> list[str]:
    """The codings of a ``content-encoding`` value in the order they were applied (``identity`` left out)."""
    return [c for c in (part.strip().lower() for part in (header or "").split(",")) if c and c != "identity"]


def decode_limited(data: bytes, coding: str, limit: int) -> bytes:
    """Undo one content coding (``CODINGS``) to at most ``limit`` bytes.

    InflateOverBudget past the limit; ValueError when the data is broken or the coding unknown.
    """
    fn = _CODINGS.get(coding.strip().lower())
    if fn is None:
        raise ValueError(f"unknown content coding {coding!r} (known: {', '.join(CODINGS)})")
    return fn(data, max(limit, 0))


class InflateBudget:
    """Limits and running totals for one scope (an import, or the whole process)."""

    def __init__(self, frame: int | None = None, session: int | None = None, total: int | None = None) -> None:
        self.frame = frame if frame is not None else _env_mib(ENV_FRAME, DEFAULT_FRAME)
        self.session_limit = session if session is not None else _env_mib(ENV_SESSION, DEFAULT_SESSION)
        self.total = total
        self.used = 0
        self._sessions: OrderedDict[str, SessionInflate] = OrderedDict()

    @classmethod
    def for_import(cls, frame: int | None = None, session: int | None = None,
                   total: int | None = None) -> InflateBudget:
        return cls(frame, session, total if total is not None else _env_mib(ENV_IMPORT, DEFAULT_IMPORT))

    def session(self, key: str | None = None) -> SessionInflate:
        """The counter of session ``key`` (shared by every call naming it), or a fresh one."""
        if key is None:
            return SessionInflate(self)
        got = self._sessions.get(key)
        if got is None:
            got = self._sessions[key] = SessionInflate(self)
            if len(self._sessions) > _MAX_SESSIONS:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(key)
        return got


class SessionInflate:
    """One session's share of a budget: ``inflate`` checks all three limits and charges both totals."""

    __slots__ = ("budget", "used")

    def __init__(self, budget: InflateBudget) -> None:
        self.budget = budget
        self.used = 0

    def inflate(self, data: bytes) -> bytes:
        """Gunzip one envelope's payload within the budgets."""
        return self._charge(data, inflate_limited, "the gzip payload", f"{len(data):,} bytes", True)

    def decode(self, data: bytes, codings: tuple[str, ...] | list[str], *, what: str = "the body",
               per_frame: bool = True) -> bytes:
        """Undo ``codings`` (in the order they were applied) within the budgets, charging the result.

        ``per_frame=False`` (a whole document such as a ``.zhar``) skips the per-frame limit; the
        session and import limits still hold. InflateOverBudget names the budget that stopped it.
        """
        def undo(out: bytes, limit: int) -> bytes:
            for coding in reversed(list(codings)):
                out = decode_limited(out, coding, limit)
            return out

        return self._charge(data, undo, what, f"{len(data):,} bytes, {', '.join(codings)}", per_frame)

    def _charge(self, data: bytes, undo: Callable[[bytes, int], bytes], what: str, size: str,
                per_frame: bool) -> bytes:
        limit, name = self.room(per_frame)
        try:
            out = undo(data, limit)
        except InflateOverBudget:
            raise InflateOverBudget(f"not inflated: {what} ({size}) inflates past {name}; "
                                    f"kept compressed, inflated when the frame is viewed") from None
        self.used += len(out)
        self.budget.used += len(out)
        return out

    def room(self, per_frame: bool = True) -> tuple[int, str]:
        """How many bytes the next inflation may produce, and the name of the budget that says so."""
        b = self.budget
        limits = []
        if per_frame:
            limits.append((b.frame, f"the {_mib(b.frame)} per-frame inflate budget "
                                    f"({ENV_FRAME} or workbench import --inflate-frame-mb raise it)"))
        limits.append((b.session_limit - self.used,
                       f"what is left of the {_mib(b.session_limit)} per-session inflate budget "
                       f"({ENV_SESSION} or workbench import --inflate-session-mb raise it)"))
        if b.total is not None:
            limits.append((b.total - b.used, f"what is left of the {_mib(b.total)} per-import inflate budget "
                                             f"({ENV_IMPORT} or workbench import --inflate-import-mb raise it)"))
        limit, name = min(limits, key=lambda x: x[0])
        return max(limit, 0), name


def inflate_document(data: bytes, coding: str, *, what: str, corrupt: str) -> bytes:
    """Undo ``coding`` of a whole document (a gzipped fixture, a ``.zhar``) within the budgets in
    scope: the session and import limits hold, the per-frame one does not (it is not a frame).

    Raises ValueError saying why not: InflateOverBudget naming the budget, else ``corrupt`` followed
    by the codec's complaint.
    """
    try:
        return current_budget().session().decode(data, [coding], what=what, per_frame=False)
    except InflateOverBudget as exc:
        # A frame's way out (kept compressed, inflated when viewed) is no way out for a document.
        raise InflateOverBudget(str(exc).split("; kept compressed")[0]) from None
    except ValueError as exc:
        raise ValueError(f"{corrupt}: {exc}") from exc


_DEFAULT = InflateBudget()
_CURRENT: contextvars.ContextVar[InflateBudget | None] = contextvars.ContextVar("workbench_inflate", default=None)


def current_budget() -> InflateBudget:
    """The budget in scope (``use_budget``), else the process default (frame + session limits)."""
    return _CURRENT.get() or _DEFAULT


@contextlib.contextmanager
def use_budget(budget: InflateBudget) -> Iterator[InflateBudget]:
    """Charge every inflation in this thread/task to ``budget`` (an import wraps itself in one)."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)
