"""How the capture writer shares the GIL with mitmproxy's event loop while the proxy is busy.

The writer thread decodes, redacts and stores every frame; under a flood that is several times
the Python work the event loop does to forward the same bytes (py-spy ``--gil``: the writer held
the GIL 80 % of the time, the loop 20 %). A thread that wants the GIL back from one that keeps
computing waits a whole switch interval (5 ms) for it, and the event loop gives the GIL up at every
socket call, so each read or write of the proxy could cost it up to 5 ms behind the writer.

So the writer works in slices: after each slice (``SLICE`` of work), while the proxy is busy, it
sleeps briefly (``PAUSE``), long enough for the loop to take the GIL. The loop then never waits
longer than about one slice. "Busy" is: the proxy handed over events within the last ``BUSY``
seconds. (Not "during this slice": a loop that waits for the GIL cannot hand anything over while the
writer computes, so it shows up only every switch interval or so.) When the proxy is quiet and the
writer is catching up on a backlog, it goes on at full speed; and it stops pausing while the
backlog is beyond ``BACKLOG`` events, so that a flood that never ends cannot grow the queue without
bound: the writer then keeps up as it did without pacing. Nothing is dropped or reordered either
way; only when a frame is committed changes.

``sys.setswitchinterval`` would do something similar for every thread of mitmproxy and every other
addon; this paces only the thread that causes the contention.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from typing import Any, Protocol

SLICE = 0.0005      # seconds of writer work between chances for the loop to take the GIL
PAUSE = 0.0001      # the writer's sleep then (the kernel makes it about 0.15 ms)
BUSY = 0.010        # seconds after the last hand-off seen during which the proxy counts as busy
BACKLOG = 4096      # queued events (chunks: at most 16 KiB each on HTTP/2) beyond which it never pauses


class Pacing(Protocol):
    """What the writer's loop asks of a pacer: ``begin`` a drain, ``step`` after each event."""

    pauses: int

    def begin(self) -> None: ...

    def step(self) -> None: ...


class NoPacing:
    """For a writer with a GIL of its own (the writer process): nothing to yield to."""

    pauses = 0

    def begin(self) -> None:
        pass

    def step(self) -> None:
        pass


class Pacer:
    """Counts the writer's work in slices and yields the GIL between them while the proxy is busy.

    ``begin`` at the start of a drain, ``step`` after each event handled. ``pauses`` counts the
    times it yielded (read by tests).
    """

    def __init__(self, q: queue.SimpleQueue[Any], slice_s: float = SLICE, pause_s: float = PAUSE,
                 backlog: int = BACKLOG, busy_s: float = BUSY, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self._q, self._clock, self._sleep = q, clock, sleep
        self._slice, self._pause, self._backlog, self._busy = slice_s, pause_s, backlog, busy_s
        # the slice: when it ends, the queue's length at its start, the events taken during it
        self._end, self._size, self._got = 0.0, 0, 0
        self._last_put = float("-inf")  # when the writer last saw that events had been put
        self.pauses = 0

    def begin(self) -> None:
        self._end = self._clock() + self._slice
        self._size = self._q.qsize()
        self._got = 0

    def step(self) -> None:
        self._got += 1
        now = self._clock()
        if now < self._end:
            return
        size = self._q.qsize()
        # events put during the slice = what is queued now - what was queued + what was taken
        if size + self._got > self._size:
            self._last_put = now
        if now - self._last_put < self._busy and size < self._backlog:
            self._sleep(self._pause)
            self.pauses += 1
        self.begin()
