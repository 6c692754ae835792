"""How many bytes gzip'd envelopes (flag 0x01) may inflate to: per frame, per session, per import.

A 1.6 MB flow file can hold eight gzip frames that inflate to 200 MB each. Inflating everything
on sight made an import peak at 9.85 GB and stored 1.6 GB of payloads. So every inflation in the
wire layer (and therefore in capture, imports, the client, the simulator and ``decode``) is
charged to a budget:

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
from collections.abc import Iterator

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
        b = self.budget
        limits = [(b.frame, f"the {_mib(b.frame)} per-frame inflate budget "
                            f"({ENV_FRAME} or workbench import --inflate-frame-mb raise it)")]
        limits.append((b.session_limit - self.used,
                       f"what is left of the {_mib(b.session_limit)} per-session inflate budget "
                       f"({ENV_SESSION} or workbench import --inflate-session-mb raise it)"))
        if b.total is not None:
            limits.append((b.total - b.used, f"what is left of the {_mib(b.total)} per-import inflate budget "
                                             f"({ENV_IMPORT} or workbench import --inflate-import-mb raise it)"))
        limit, name = min(limits, key=lambda x: x[0])
        try:
            out = inflate_limited(data, max(limit, 0))
        except InflateOverBudget:
            raise InflateOverBudget(f"not inflated: the gzip payload ({len(data):,} bytes) inflates past {name}; "
                                    f"kept compressed, inflated when the frame is viewed") from None
        self.used += len(out)
        b.used += len(out)
        return out


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
