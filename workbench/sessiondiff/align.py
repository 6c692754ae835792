"""Aligning two sessions' steps in near-linear time: structure first, then within it.

Two long sessions are mostly the same sequence of a few message kinds, so a general sequence
matcher over whole sessions (difflib's ``SequenceMatcher`` is quadratic there: 115 s at 40k
frames) is never used. Instead:

1. **Parts.** Each session is cut into parts at its structure (``compare.part_starts``: a turn
   starts one, an exec's close, a model step's end and a turn's end end one). Parts are paired by
   their bytes first (cheap: a session against itself, or a replay of it, stops here), then the
   ones left by their content with ids, hashes and times left out; each time, keys made unique by
   counting their occurrences, and the longest chain of pairs in the same order on both sides
   kept (patience sorting: O(k log k)). A part left over on both sides with the same content has
   moved: it is one "moved" difference.
2. **Anchors.** In what is left between paired parts, steps that carry structure (turns, execs
   and tool calls by their kind and arguments, endings: ``Alignable.anchor``) are chained the same
   way; then, between those, steps with the same content (``step_key``).
3. **Gaps** between anchors are aligned by ``(direction, kind)``: their common head and tail first
   (linear), and what is left in the middle with ``SequenceMatcher`` only when it is small
   (``GAP_CELLS``: the product of the two lengths). A bigger middle is cut into windows of
   ``WINDOW`` steps, matched window by window: the work is bounded by ``WINDOW`` per step, the
   price is that a step displaced by more than a window is shown as removed and added.

``Alignment.work`` counts the comparisons made (the cells of every bounded matcher plus one per
step or part walked), so a test can check the growth is linear without timing anything.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Sequence
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
    step_key: Callable[[int, bool], Hashable | None] = lambda _i, _a: None
    moved: list[tuple[list[int], list[int]]] = field(default_factory=list)   # parts found elsewhere: (A steps, B steps)
    work: int = 0
    windowed_gaps: int = 0   # gaps too big for the exact matcher (matched window by window)


def align(a: Sequence[Alignable], b: Sequence[Alignable], parts_a: list[int], parts_b: list[int],
          by_bytes: Callable[[int, int, bool], Hashable], by_content: Callable[[int, int, bool], Hashable],
          step_key: Callable[[int, bool], Hashable | None]) -> Alignment:
    """Align steps ``a`` with ``b``. ``parts_*``: the index of each part's first step; ``by_bytes`` and
    ``by_content`` (first step, end, side is A) give a part's key for the two pairings, ``step_key``
    (index, side is A) a step's content key (None: a step not to pair by content)."""
    out = Alignment()
    out.step_key = step_key
    ra, rb = _ranges(parts_a, len(a)), _ranges(parts_b, len(b))
    out.work += len(ra) + len(rb)
    ka = [by_bytes(s, e, True) for s, e in ra]
    kb = [by_bytes(s, e, False) for s, e in rb]
    chain = _chain(_numbered(ka), _numbered(kb), out)
    pairs: list[tuple[int, int]] = []      # parts paired, in order
    pa = pb = 0
    for i, j in [*chain, (len(ra), len(rb))]:
        # the parts between two paired by bytes: paired by content
        ca = [by_content(*ra[k], True) for k in range(pa, i)]
        cb = [by_content(*rb[k], False) for k in range(pb, j)]
        pairs.extend((pa + x, pb + y) for x, y in _chain(_numbered(ca), _numbered(cb), out))
        if i < len(ra):
            pairs.append((i, j))
        pa, pb = i + 1, j + 1
    paired_a, paired_b = {i for i, _ in pairs}, {j for _, j in pairs}
    left_a = [k for k in range(len(ra)) if k not in paired_a]
    left_b = [k for k in range(len(rb)) if k not in paired_b]
    moved_b: dict[Hashable, list[int]] = {}
    if left_a and left_b:
        for k in left_b:
            moved_b.setdefault(by_content(*rb[k], False), []).append(k)
    moved_parts: dict[int, int] = {}
    for k in left_a:
        js = moved_b.get(by_content(*ra[k], True)) if moved_b else None
        if js:
            moved_parts[k] = js.pop(0)
    for k, j in moved_parts.items():   # parts that moved together (a step of several parts): one group
        if out.moved and k - 1 in moved_parts and moved_parts[k - 1] == j - 1:
            out.moved[-1][0].extend(range(*ra[k]))
            out.moved[-1][1].extend(range(*rb[j]))
        else:
            out.moved.append((list(range(*ra[k])), list(range(*rb[j]))))
    gone_b = set(moved_parts.values())
    # steps between paired parts, moved parts left out: aligned by anchors, then by kind
    pa = pb = 0
    for i, j in [*pairs, (len(ra), len(rb))]:
        xs = [s for k in range(pa, i) if k not in moved_parts for s in range(*ra[k])]
        ys = [s for k in range(pb, j) if k not in gone_b for s in range(*rb[k])]
        _align_steps(a, b, xs, ys, out)
        for k in range(pa, i):
            if k in moved_parts:
                out.ops.extend((s, None) for s in range(*ra[k]))
        for k in range(pb, j):
            if k in gone_b:
                out.ops.extend((None, s) for s in range(*rb[k]))
        if i < len(ra):
            xs, ys = list(range(*ra[i])), list(range(*rb[j]))
            if len(xs) == len(ys):   # equal keys, equal steps (a key collision is aligned like a gap)
                out.ops.extend(zip(xs, ys, strict=True))
                out.work += len(xs)
            else:
                _align_steps(a, b, xs, ys, out)
        pa, pb = i + 1, j + 1
    return out


def _ranges(starts: list[int], n: int) -> list[tuple[int, int]]:
    bounds = [s for s in starts if 0 < s < n]
    edges = [0, *bounds, n] if n else []
    return [(edges[k], edges[k + 1]) for k in range(len(edges) - 1) if edges[k] < edges[k + 1]]


def _numbered(keys: list[Hashable]) -> list[Hashable]:
    """Each key with its occurrence number: unique keys, equal where the n-th of a kind is."""
    seen: dict[Hashable, int] = {}
    out: list[Hashable] = []
    for k in keys:
        n = seen.get(k, 0)
        seen[k] = n + 1
        out.append((k, n))
    return out


def _align_steps(a: Sequence[Alignable], b: Sequence[Alignable], xs: list[int], ys: list[int],
                 out: Alignment) -> None:
    """Align the steps ``xs`` of A with ``ys`` of B: anchors first, then the gaps between them."""
    if not xs or not ys:
        out.ops.extend((i, None) for i in xs)
        out.ops.extend((None, j) for j in ys)
        out.work += len(xs) + len(ys)
        return
    _chained(a, b, xs, ys, [a[i].anchor for i in xs], [b[j].anchor for j in ys], out, _align_by_content)


def _chained(a: Sequence[Alignable], b: Sequence[Alignable], xs: list[int], ys: list[int],
             ka: Sequence[Hashable | None],
             kb: Sequence[Hashable | None], out: Alignment, fill: Callable[..., None]) -> None:
    """Pair the longest same-order chain of equal keys (``_chain``), and ``fill`` each stretch between."""
    pa = pb = 0
    for i, j in [*_chain(ka, kb, out), (len(xs), len(ys))]:
        fill(a, b, xs[pa:i], ys[pb:j], out)
        if i < len(xs):
            out.ops.append((xs[i], ys[j]))
        pa, pb = i + 1, j + 1


def _align_by_content(a: Sequence[Alignable], b: Sequence[Alignable], xs: list[int], ys: list[int],
                      out: Alignment) -> None:
    """Steps with the same content on both sides (the n-th of each) chained, the rest by kind."""
    if not xs or not ys:
        _align_gap(a, b, xs, ys, out)
        return
    _chained(a, b, xs, ys, _numbered_or_none([out.step_key(i, True) for i in xs]),
             _numbered_or_none([out.step_key(j, False) for j in ys]), out, _align_gap)


def _numbered_or_none(keys: list[Hashable | None]) -> list[Hashable | None]:
    seen: dict[Hashable, int] = {}
    out: list[Hashable | None] = []
    for k in keys:
        if k is None:
            out.append(None)
            continue
        n = seen.get(k, 0)
        seen[k] = n + 1
        out.append((k, n))
    return out


def _chain(ka: Sequence[Hashable | None], kb: Sequence[Hashable | None], out: Alignment) -> list[tuple[int, int]]:
    """The longest chain of positions with the same (unique, not None) key on both sides, in the
    same order on both (patience sorting)."""
    in_b: dict[Hashable, int] = {k: j for j, k in enumerate(kb) if k is not None}
    pairs = [(i, in_b[k]) for i, k in enumerate(ka) if k is not None and k in in_b]
    out.work += len(ka) + len(kb)
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


def _align_gap(a: Sequence[Alignable], b: Sequence[Alignable], xs: list[int], ys: list[int], out: Alignment) -> None:
    # common head and tail: two long stretches that agree are walked once
    n, m = len(xs), len(ys)
    head = 0
    while head < n and head < m and a[xs[head]].token == b[ys[head]].token:
        out.ops.append((xs[head], ys[head]))
        head += 1
    tail = 0
    while n - tail > head and m - tail > head and a[xs[n - tail - 1]].token == b[ys[m - tail - 1]].token:
        tail += 1
    out.work += head + tail + 1
    mx, my = xs[head:n - tail], ys[head:m - tail]
    if mx and my and len(mx) * len(my) > GAP_CELLS:
        out.windowed_gaps += 1
        windows = -(-max(len(mx), len(my)) // WINDOW)
        for w in range(windows):
            _match(a, b, mx[len(mx) * w // windows:len(mx) * (w + 1) // windows],
                   my[len(my) * w // windows:len(my) * (w + 1) // windows], out)
    else:
        _match(a, b, mx, my, out)
    out.ops.extend(zip(xs[n - tail:], ys[m - tail:], strict=True))


def _match(a: Sequence[Alignable], b: Sequence[Alignable], xs: list[int], ys: list[int], out: Alignment) -> None:
    """Exact alignment of a bounded stretch (at most ``GAP_CELLS`` cells, or a window)."""
    if not xs or not ys:
        out.ops.extend((i, None) for i in xs)
        out.ops.extend((None, j) for j in ys)
        out.work += len(xs) + len(ys)
        return
    out.work += len(xs) * len(ys)
    sm = SequenceMatcher(None, [a[i].token for i in xs], [b[j].token for j in ys], autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.ops.extend(zip(xs[i1:i2], ys[j1:j2], strict=True))
        else:
            out.ops.extend((i, None) for i in xs[i1:i2])
            out.ops.extend((None, j) for j in ys[j1:j2])
