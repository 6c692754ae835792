"""The wire order of a run recorded without per-frame timing (flow files, HAR), rebuilt from the protocol.

A flow file or HAR keeps one whole body per direction and four times per HTTP exchange. Within a
run the server's frames keep their order (one body) and so do the client's (one body for an h2
``Run``; BidiAppends ordered by ``append_seqno``), but how the two interleave is lost. The protocol
gives it back (``workbench.protocol.matching``): every answer goes right after the server message it
answers, the ``run_request`` first, a follow-up after the ``turn_ended`` it follows. Messages that
answer nothing (client heartbeats, cancel) are spread between their neighbours: by their own time
when they came in an exchange of their own (a BidiAppend), evenly otherwise. An append that left
the client after the whole response had arrived stays after it: its exchange times prove it.

The result is a position per client message: how many server frames precede it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.protocol import kinds
from workbench.protocol.matching import START, FrameLike, pair_messages


@dataclass
class ClientMessage:
    """A client frame to place; ``t`` = when its own exchange started (a BidiAppend), else None."""

    frame: FrameLike
    t: float | None = None


class OrderUnknown(Exception):
    """The ids of a run do not allow rebuilding its order; the message says why."""


def _time_points(points: list[tuple[float, int]]) -> tuple[list[float], list[int]]:
    points.sort()
    times, positions = [], []
    top = 0
    for t, p in points:
        top = max(top, p)
        times.append(t)
        positions.append(top)
    return times, positions


def _at_time(times: list[float], positions: list[int], t: float) -> int:
    """Server frames out by time ``t``, interpolated between known (time, position) points."""
    i = bisect_right(times, t)
    if i == 0:
        return positions[0]
    if i == len(times):
        return positions[-1]
    t0, t1, p0, p1 = times[i - 1], times[i], positions[i - 1], positions[i]
    if t1 <= t0:
        return p0
    return p0 + int((t - t0) / (t1 - t0) * (p1 - p0))


def causal_positions(server: Sequence[FrameLike], client: Sequence[ClientMessage], *,
                     response_start: float | None = None, response_end: float | None = None) -> list[int]:
    """For each client message (in client order), the number of server frames before it.

    Raises ``OrderUnknown`` when the ids cannot be paired (see ``pair_messages``).
    """
    pairing = pair_messages(server, [c.frame for c in client])
    if pairing.problem:
        raise OrderUnknown(pairing.problem)
    n = len(server)
    # Messages without a time of their own stay before the final end-stream frame.
    end_cap = n - 1 if n and kinds.is_end_stream(server[-1].kind) else n
    lower: list[int | None] = []
    for c, target in zip(client, pairing.answers, strict=True):
        bound = None if target is None else 0 if target == START else target + 1
        if (c.t is not None and response_end is not None and c.t > response_end and target != START):
            bound = n  # sent after the whole response had arrived
        lower.append(bound)

    pos = [0] * len(client)
    last = 0
    points: list[tuple[float, int]] = []
    for i, bound in enumerate(lower):
        if bound is not None:
            last = max(last, bound)
            pos[i] = last
            t = client[i].t
            if t is not None:
                points.append((t, last))
    if response_start is not None:
        points.append((response_start, 0))
    if response_end is not None:
        points.append((response_end, n))
    times, positions = _time_points(points)

    i = 0
    while i < len(client):
        if lower[i] is not None:
            i += 1
            continue
        j = i
        while j < len(client) and lower[j] is None:
            j += 1
        lo = pos[i - 1] if i else 0
        hi = pos[j] if j < len(client) else max(lo, end_cap)
        prev = lo
        gap = j - i
        for k in range(i, j):
            t = client[k].t
            if t is not None and times:
                p = _at_time(times, positions, t)
            else:
                p = lo + (hi - lo) * (k - i + 1) // (gap + 1)
            p = min(max(p, prev), hi)
            pos[k] = prev = p
        i = j
    return pos


def interleave(n_server: int, positions: Sequence[int]) -> list[tuple[str, int]]:
    """The merged order: ``("client", i)`` / ``("server", j)`` pairs, client messages before server frame ``pos``."""
    by_pos: dict[int, list[int]] = {}
    for i, p in enumerate(positions):
        by_pos.setdefault(p, []).append(i)
    out: list[tuple[str, int]] = []
    for p in range(n_server + 1):
        out.extend(("client", i) for i in by_pos.get(p, ()))
        if p < n_server:
            out.append(("server", p))
    return out
