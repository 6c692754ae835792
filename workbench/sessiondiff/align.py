"""Aligning two sessions' steps in near-linear time: structure first, then within it.

Two long sessions are mostly the same sequence of a few message kinds, so a general sequence
matcher over whole sessions (difflib's ``SequenceMatcher`` is quadratic there: 115 s at 40k
frames) is never used. Instead:

1. **Anchors.** Steps that carry the session's structure — turns (``run_request``,
   ``turn_ended``), execs and tool calls (by their kind and a digest of their arguments, ids
   left out), model steps, endings — get a key made unique by counting its occurrences ("the
   second ``shell`` exec running ``ls``"). Keys found on both sides are paired, and the longest
   chain of pairs in the same order on both sides is kept (patience sorting: O(k log k)).
   A step that moved breaks the chain and is left to the gaps, where it shows as on one side only
   and is then recognised as moved.
2. **Gaps** between consecutive anchors are aligned by ``(direction, kind)``: their common head and
   tail first (linear), and what is left in the middle with ``SequenceMatcher`` only when it is
   small (``GAP_CELLS``: the product of the two lengths). A bigger middle is cut into windows of
   ``WINDOW`` steps, matched window by window: the work is bounded by ``WINDOW`` per step, the
   price is that a step displaced by more than a window is shown as removed and added.

``Alignment.work`` counts the comparisons made (the cells of every bounded matcher plus one per
step walked), so a test can check the growth is linear without timing anything.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Protocol

GAP_CELLS = 40_000   # a gap's middle aligned exactly when len(A) × len(B) is at most this
WINDOW = 200         # else matched in windows of this many steps a side


class Alignable(Protocol):
    @property
    def token(self) -> Hashable: ...

    @property
    def anchor(self) -> Hashable | None: ...


@dataclass
class Alignment:
    """``ops``: the steps in order, each ``(i, j)``: A's i-th with B's j-th, ``(i, None)``: only in A,
    ``(None, j)``: only in B."""

    ops: list[tuple[int | None, int | None]] = field(default_factory=list)
    work: int = 0
    windowed_gaps: int = 0   # gaps too big for the exact matcher (matched window by window)


def align(a: Sequence[Alignable], b: Sequence[Alignable]) -> Alignment:
    out = Alignment()
    chain = _anchor_chain(a, b, out)
    pa = pb = 0
    for i, j in [*chain, (len(a), len(b))]:
        _align_gap(a, b, pa, i, pb, j, out)
        if i < len(a):
            out.ops.append((i, j))
        pa, pb = i + 1, j + 1
    return out


def _anchor_chain(a: Sequence[Alignable], b: Sequence[Alignable], out: Alignment) -> list[tuple[int, int]]:
    """The longest chain of anchor pairs in the same order on both sides (patience sorting)."""
    in_b: dict[Hashable, int] = {}
    for j, y in enumerate(b):
        if y.anchor is not None:
            in_b[y.anchor] = j
    pairs = [(i, in_b[x.anchor]) for i, x in enumerate(a) if x.anchor is not None and x.anchor in in_b]
    out.work += len(a) + len(b)
    # longest strictly increasing subsequence of the B positions, in A order
    tails: list[int] = []          # B position ending the best chain of each length
    tail_at: list[int] = []        # index into pairs of that chain's end
    back: list[int] = [-1] * len(pairs)
    for k, (_i, j) in enumerate(pairs):
        n = bisect.bisect_left(tails, j)
        back[k] = tail_at[n - 1] if n else -1
        if n == len(tails):
            tails.append(j)
            tail_at.append(k)
        else:
            tails[n] = j
            tail_at[n] = k
    out.work += len(pairs)
    chain: list[tuple[int, int]] = []
    k = tail_at[-1] if tail_at else -1
    while k >= 0:
        chain.append(pairs[k])
        k = back[k]
    chain.reverse()
    return chain


def _align_gap(a: Sequence[Alignable], b: Sequence[Alignable], a1: int, a2: int, b1: int, b2: int,
               out: Alignment) -> None:
    # common head and tail: two long sessions that agree are walked once
    head = 0
    while a1 + head < a2 and b1 + head < b2 and a[a1 + head].token == b[b1 + head].token:
        out.ops.append((a1 + head, b1 + head))
        head += 1
    a1, b1 = a1 + head, b1 + head
    tail = 0
    while a2 - tail > a1 and b2 - tail > b1 and a[a2 - tail - 1].token == b[b2 - tail - 1].token:
        tail += 1
    out.work += head + tail + 1
    n, m = a2 - tail - a1, b2 - tail - b1
    if n and m and n * m > GAP_CELLS:
        out.windowed_gaps += 1
        windows = -(-max(n, m) // WINDOW)
        for w in range(windows):
            _match(a, b, a1 + n * w // windows, a1 + n * (w + 1) // windows,
                   b1 + m * w // windows, b1 + m * (w + 1) // windows, out)
    else:
        _match(a, b, a1, a1 + n, b1, b1 + m, out)
    out.ops.extend((a2 - k, b2 - k) for k in range(tail, 0, -1))


def _match(a: Sequence[Alignable], b: Sequence[Alignable], a1: int, a2: int, b1: int, b2: int,
           out: Alignment) -> None:
    """Exact alignment of a bounded stretch (at most ``GAP_CELLS`` cells, or a window)."""
    if a1 == a2 or b1 == b2:
        out.ops.extend((i, None) for i in range(a1, a2))
        out.ops.extend((None, j) for j in range(b1, b2))
        out.work += a2 - a1 + b2 - b1
        return
    out.work += (a2 - a1) * (b2 - b1)
    sm = SequenceMatcher(None, [x.token for x in a[a1:a2]], [y.token for y in b[b1:b2]], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.ops.extend((a1 + i, b1 + j1 + k) for k, i in enumerate(range(i1, i2)))
        else:
            out.ops.extend((a1 + i, None) for i in range(i1, i2))
            out.ops.extend((None, b1 + j) for j in range(j1, j2))
