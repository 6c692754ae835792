"""BidiAppend bookkeeping for the capture writer: seqno ordering and the facts of each exchange.

Ordering: up to 16 appends of one run are in flight at once, so they reach the proxy out of
order. ``AppendOrder`` holds appends that arrive ahead of the next expected ``append_seqno`` in a
small per-run window and releases them in seqno order; a gap that does not fill within
``REORDER_WINDOW_S`` (``REORDER_AFTER_END_S`` once the run's stream has ended, or more than
``REORDER_MAX`` held appends) is released as is, so a lost append shows up as a gap in
``append_seqno`` instead of stalling the capture. Frames keep their arrival time in ``ts``;
``seq`` follows seqno order.

Behind its stream: a client sends ``RunSSE`` (its body, the ``BidiRequestId``) and then appends.
mitmproxy hands a streamed request's body over only once the upstream connection is open, while an
append's whole body comes at once, and over HTTP/1.1 the two travel on different connections whose
hooks run in any order; so the first append can reach the writer before the RunSSE body it
followed. An append waits (``behind``) while any RunSSE/RunPoll stream has shown no frame yet, and
the first append of a run that no stream has named yet waits for one to name it; each wait lasts
until that stream shows its first frame or ends, at most ``STREAM_WAIT_S``.

Evidence: each append frame is recorded where it arrived, and carries the facts of the HTTP
exchange that carried it in ``Frame.meta`` (``frames.meta``), completed when the answer comes
(``Sink.patch_meta``), with the keys imports use too (``workbench.protocol.append_meta``); the server's
refusal follows the append it refuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.decode.classify import Frame
from workbench.protocol.append_meta import REORDER_AFTER_END_S, REORDER_WINDOW_S

REORDER_MAX = 64
STREAM_WAIT_S = 2.0

# (ts_us, direction, transport, stream, frame): one frame the writer emits for an append (the
# append itself, then the server's refusal if any, travel together).
Held = tuple[int, str, str, str | None, Frame]
Emit = Callable[[str, int, str, str, "str | None", Frame], None]


@dataclass(slots=True)
class _Window:
    next: int = 0
    started: bool = False
    held: dict[int, tuple[float, list[Held]]] = field(default_factory=dict)
    oldest: float = 0.0
    ended: float | None = None  # when the run's stream finished
    behind: set[str] = field(default_factory=set)  # streams whose first frame these appends wait for
    behind_since: float = 0.0
    waiting: list[tuple[int | None, list[Held]]] = field(default_factory=list)  # in arrival order


class AppendOrder:
    """Per-run seqno windows; ``emit(session_id, ts_us, direction, transport, stream, frame)``."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._windows: dict[str, _Window] = {}
        self._unbound: dict[str, None] = {}  # RunSSE/RunPoll streams whose first frame has not come
        self._stream_runs: set[str] = set()  # request ids a RunSSE/RunPoll body has named

    def state(self) -> tuple[Any, ...]:
        """What it holds, as plain data (the writer process's checkpoint, ``resume.py``)."""
        return self._windows, self._unbound, self._stream_runs

    def restore(self, state: tuple[Any, ...]) -> None:
        """Take over what another one held (``state``): a restarted writer process goes on."""
        self._windows, self._unbound, self._stream_runs = state

    def stream_opened(self, stream: str) -> None:
        """A RunSSE/RunPoll stream opened: it names its run with its first frame."""
        self._unbound[stream] = None

    def stream_settled(self, stream: str, rid: str | None) -> None:
        """A RunSSE/RunPoll stream showed its first frame (naming run ``rid``) or ended: appends
        behind it go on."""
        if stream not in self._unbound:
            return
        del self._unbound[stream]
        self._release_behind(stream)
        if rid is not None:
            self._stream_runs.add(rid)
            self._release_behind(f"run:{rid}")

    def append(self, rid: str, seqno: int | None, items: list[Held]) -> None:
        """An append of run ``rid`` arrived. It waits (see "Behind its stream") behind every stream
        whose first frame has not come (its headers may even come after the append's, on another
        connection); the first append of a run no stream has named yet waits for one to name it."""
        behind = frozenset(self._unbound)
        if not behind and rid not in self._stream_runs and not seqno:
            behind = frozenset({f"run:{rid}"})
        self.add(rid, seqno, items, behind)

    def add(self, rid: str, seqno: int | None, items: list[Held], behind: frozenset[str] = frozenset()) -> None:
        ro = self._windows.get(rid)
        if ro is None:
            ro = self._windows[rid] = _Window()
        if behind and not ro.behind:
            ro.behind_since = time.monotonic()
        ro.behind |= behind
        if ro.behind:
            ro.waiting.append((seqno, items))
            return
        n = seqno if seqno is not None else 0
        if not ro.started and n == 0:
            ro.started = True
        if n <= ro.next:
            self._put(rid, items)
            if n == ro.next:
                ro.next += 1
                ro.started = True
                self._drain(rid, ro)
            return
        now = time.monotonic()
        if not ro.held:
            ro.oldest = now
        ro.held[n] = (now, items)
        if len(ro.held) > REORDER_MAX:
            self._release(rid, ro)

    def attach(self, rid: str, seqno: int | None, item: Held) -> bool:
        """Add ``item`` behind the held append ``seqno`` (its answer); False if it is not held."""
        ro = self._windows.get(rid)
        if ro is None:
            return False
        for n, items in ro.waiting:
            if n == seqno:
                items.append(item)
                return True
        held = ro.held.get(seqno if seqno is not None else 0)
        if held is None:
            return False
        held[1].append(item)
        return True

    def _release_behind(self, stream: str) -> None:
        for rid, ro in list(self._windows.items()):
            if stream in ro.behind:
                ro.behind.discard(stream)
                if not ro.behind:
                    self._go_on(rid, ro)

    def _go_on(self, rid: str, ro: _Window) -> None:
        ro.behind.clear()
        waiting, ro.waiting = ro.waiting, []
        for seqno, items in waiting:
            self.add(rid, seqno, items)

    def _put(self, rid: str, items: list[Held]) -> None:
        for item in items:
            self._emit(rid, *item)

    def ended(self, rid: str) -> None:
        """The run's stream finished: appends still in flight may yet fill a gap, but not for long."""
        ro = self._windows.get(rid)
        if ro is not None:
            ro.ended = time.monotonic()

    def _drain(self, rid: str, ro: _Window) -> None:
        while ro.next in ro.held:
            _, items = ro.held.pop(ro.next)
            self._put(rid, items)
            ro.next += 1
        if ro.held:
            ro.oldest = min(v[0] for v in ro.held.values())

    def _release(self, rid: str, ro: _Window) -> None:
        """Give up waiting for a gap: emit what is held, in seqno order."""
        for n in sorted(ro.held):
            _, items = ro.held.pop(n)
            self._put(rid, items)
            ro.next = n + 1

    def release_due(self, now: float, force: bool = False) -> None:
        for rid in [r for r, ro in self._windows.items() if not ro.held and not ro.behind and ro.ended and now - ro.ended > 60]:
            del self._windows[rid]  # a finished run: forget its counter
        for rid, ro in list(self._windows.items()):
            if ro.behind and (force or now - ro.behind_since >= STREAM_WAIT_S):
                self._go_on(rid, ro)
            if not ro.held:
                continue
            if (force or now - ro.oldest >= REORDER_WINDOW_S
                    or (ro.ended is not None and now - ro.ended >= REORDER_AFTER_END_S)):
                self._release(rid, ro)
