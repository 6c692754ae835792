"""BidiAppend bookkeeping for the capture writer: seqno ordering and the facts of each exchange.

Ordering: up to 16 appends of one run are in flight at once, so they reach the proxy out of
order. ``AppendOrder`` holds appends that arrive ahead of the next expected ``append_seqno`` in a
small per-run window and releases them in seqno order; a gap that does not fill within
``REORDER_WINDOW_S`` (``REORDER_AFTER_END_S`` once the run's stream has ended, or more than
``REORDER_MAX`` held appends) is released as is, so a lost append shows up as a gap in
``append_seqno`` instead of stalling the capture. Frames keep their arrival time in ``ts``;
``seq`` follows seqno order.

Evidence: each append frame is recorded where it arrived, and carries the facts of the HTTP
exchange that carried it in ``Frame.meta`` (``frames.meta``), completed when the answer comes
(``Sink.patch_meta``), with the keys imports use too (``workbench.protocol.append_meta``); the server's
refusal follows the append it refuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from workbench.decode.classify import Frame
from workbench.protocol.append_meta import REORDER_AFTER_END_S, REORDER_WINDOW_S

REORDER_MAX = 64

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


class AppendOrder:
    """Per-run seqno windows; ``emit(session_id, ts_us, direction, transport, stream, frame)``."""

    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._windows: dict[str, _Window] = {}

    def add(self, rid: str, seqno: int | None, items: list[Held]) -> None:
        ro = self._windows.get(rid)
        if ro is None:
            ro = self._windows[rid] = _Window()
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
        held = ro.held.get(seqno if seqno is not None else 0) if ro is not None else None
        if held is None:
            return False
        held[1].append(item)
        return True

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
        for rid in [r for r, ro in self._windows.items() if not ro.held and ro.ended and now - ro.ended > 60]:
            del self._windows[rid]  # a finished run: forget its counter
        for rid, ro in self._windows.items():
            if not ro.held:
                continue
            if (force or now - ro.oldest >= REORDER_WINDOW_S
                    or (ro.ended is not None and now - ro.ended >= REORDER_AFTER_END_S)):
                self._release(rid, ro)
