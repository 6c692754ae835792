"""The timeline's addressing: which frames it shows and how they become display rows.

``FrameFilter`` parses the filter bar's query (``store.view_reads.FrameMatch`` is its SQL); ``FrameIndex`` holds the filtered frames'
seq numbers and heartbeat flags as numpy arrays and computes the display rows from them (heartbeat
runs folded, expansions, replay cut-off). Pure Python and numpy, no database access: the queries
that fill an index live in ``workbench.tui.data`` (run from worker threads), and these classes are
re-exported there. Split out of ``data.py`` to keep that module about the queries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from workbench.protocol import kinds
from workbench.store.view_reads import FrameMatch

# Both directions' keep-alives fold together: a heartbeat loop is server and client heartbeats
# interleaved, and folding only one kind would leave a row per 5 s of silence.
HEARTBEAT_KINDS = kinds.HEARTBEATS
# Runs shorter than this stay unfolded: folding two heartbeats saves one row and hides detail.
MIN_FOLD = 2

# filters -----------------------------------------------------------------------------------------

_TOKEN = re.compile(r'(\w+):("[^"]*"|\S+)|"([^"]*)"|(\S+)')


@dataclass(frozen=True)
class FrameFilter:
    """Which frames the timeline shows: kind prefixes, one direction, text in summary or payload."""

    kinds: tuple[str, ...] = ()
    direction: str | None = None
    text: str = ""

    @classmethod
    def parse(cls, query: str) -> FrameFilter:
        """``kind:exec_server dir:server "some text"``; ``>``/``<`` are shorthands for directions."""
        kinds: list[str] = []
        direction: str | None = None
        words: list[str] = []
        for m in _TOKEN.finditer(query):
            key, val, quoted, bare = m.groups()
            if key is not None:
                val = val.strip('"')
                k = key.lower()
                if k in ("kind", "k"):
                    kinds.extend(v for v in val.split(",") if v)
                    continue
                if k in ("dir", "direction", "d"):
                    direction = _direction(val)
                    continue
                words.append(m.group(0))
            elif quoted is not None:
                words.append(quoted)
            elif bare in (">", "→", "c2s"):
                direction = "client"
            elif bare in ("<", "←", "s2c"):
                direction = "server"
            else:
                words.append(bare)
        return cls(tuple(kinds), direction, " ".join(words))

    @property
    def active(self) -> bool:
        return bool(self.kinds or self.direction or self.text)

    def describe(self) -> str:
        parts = [f"kind:{','.join(self.kinds)}"] if self.kinds else []
        if self.direction:
            parts.append(f"dir:{self.direction}")
        if self.text:
            parts.append(f'"{self.text}"')
        return " ".join(parts)

    def match(self) -> FrameMatch:
        """The filter as the reads take it (``store.view_reads`` builds the SQL)."""
        return FrameMatch(self.kinds, self.direction, self.text.lower(),
                          blob_needle(self.text).lower() if self.text else "")


def _direction(val: str) -> str:
    v = val.lower()
    if v in ("client", "c", ">", "c2s", "up", "out"):
        return "client"
    if v in ("server", "s", "<", "s2c", "down", "in"):
        return "server"
    raise ValueError(f"direction must be client or server, not {val!r}")


def blob_needle(text: str) -> str:
    """``text`` as DuckDB prints the same UTF-8 bytes inside a BLOB cast to VARCHAR."""
    out = []
    for b in text.encode("utf-8"):
        out.append(chr(b) if 0x20 <= b < 0x7F and b != 0x5C else f"\\x{b:02X}")
    return "".join(out)


# the timeline index ------------------------------------------------------------------------------

@dataclass
class RowRef:
    """One display row: a frame, or the header of a heartbeat run."""

    row: int
    seq: int                   # the frame, or the run's first frame
    fold: bool = False
    last_seq: int = -1         # run only
    count: int = 1             # run only
    client_count: int = 0      # run only: how many of them came from the client
    expanded: bool = False     # run only
    member: bool = False       # a frame inside an expanded run


class FrameIndex:
    """Display rows over the filtered frames of one session (folds, expansions, replay cut-off)."""

    def __init__(self, seqs: np.ndarray, heartbeat: np.ndarray, client: np.ndarray | None = None) -> None:
        self.seqs = np.asarray(seqs, dtype=np.int64)
        self.heartbeat = np.asarray(heartbeat, dtype=bool)
        self.client = np.asarray(client if client is not None else np.zeros(len(self.seqs)), dtype=bool)
        self.expanded: set[int] = set()     # first seq of each expanded run
        self.fold = True
        self.limit_seq: int | None = None   # replay: only frames with seq <= this are visible
        self._build()

    # building --------------------------------------------------------------------------------

    def extend(self, seqs: Sequence[int] | np.ndarray, heartbeat: Sequence[bool] | np.ndarray,
               client: Sequence[bool] | np.ndarray | None = None) -> None:
        if len(seqs):
            self.seqs = np.concatenate([self.seqs, np.asarray(seqs, dtype=np.int64)])
            self.heartbeat = np.concatenate([self.heartbeat, np.asarray(heartbeat, dtype=bool)])
            up = np.asarray(client if client is not None else np.zeros(len(seqs)), dtype=bool)
            self.client = np.concatenate([self.client, up])
        self._build()

    def set_limit(self, limit_seq: int | None) -> None:
        self.limit_seq = limit_seq
        self._build()

    def toggle(self, run_first_seq: int) -> None:
        self.expanded.symmetric_difference_update({run_first_seq})
        self._build()

    def expand_around(self, seq: int) -> None:
        """Expand the folded run holding ``seq`` (so a jump can land on the frame itself)."""
        j = self._run_of_index(self.index_of(seq))
        if j is not None:
            first = int(self.seqs[self.run_start[j]])
            if first not in self.expanded:
                self.expanded.add(first)
                self._build()

    def set_fold(self, fold: bool) -> None:
        self.fold = fold
        self._build()

    def _build(self) -> None:
        n = len(self.seqs) if self.limit_seq is None else int(
            np.searchsorted(self.seqs, self.limit_seq, side="right"))
        self.visible = n
        if self.fold and n:
            edges = np.diff(np.concatenate(([0], self.heartbeat[:n].astype(np.int8), [0])))
            starts = np.flatnonzero(edges == 1)
            ends = np.flatnonzero(edges == -1)
            keep = (ends - starts) >= MIN_FOLD
            self.run_start, self.run_end = starts[keep], ends[keep]
        else:
            self.run_start = self.run_end = np.zeros(0, dtype=np.int64)
        marks = np.zeros(n + 1, dtype=np.int64)
        runs_first = self.seqs[self.run_start] if len(self.run_start) else np.zeros(0, dtype=np.int64)
        is_open = np.isin(runs_first, np.fromiter(self.expanded, dtype=np.int64, count=len(self.expanded)))
        closed = ~is_open
        # runs are at least two frames long and never touch, so these index sets have no repeats
        marks[self.run_start[closed] + 1] += 1
        marks[self.run_end[closed]] -= 1
        hidden = np.cumsum(marks)[:n] > 0
        frames = np.flatnonzero(~hidden).astype(np.int64)
        # refs: >= 0 a frame index into seqs, < 0 the header of run -(ref + 1)
        refs = frames.copy()
        codes = -(np.arange(len(self.run_start), dtype=np.int64) + 1)
        pos = np.searchsorted(frames, self.run_start)
        refs[pos[closed]] = codes[closed]
        if is_open.any():
            self.refs = np.insert(refs, pos[is_open], codes[is_open])
            self.keys = np.insert(frames, pos[is_open], self.run_start[is_open])
        else:   # np.insert copies even when inserting nothing: 20 ms a call at 1M frames
            self.refs, self.keys = refs, frames
        self.is_open = is_open

    # reading ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.refs)

    @property
    def total(self) -> int:
        return len(self.seqs)

    def index_of(self, seq: int) -> int:
        """Index of ``seq`` among the filtered frames, or -1 when the filter hides it."""
        i = int(np.searchsorted(self.seqs, seq))
        return i if i < len(self.seqs) and int(self.seqs[i]) == seq else -1

    def _run_of_index(self, i: int) -> int | None:
        if i < 0 or not len(self.run_start):
            return None
        j = int(np.searchsorted(self.run_start, i, side="right")) - 1
        if j >= 0 and self.run_start[j] <= i < self.run_end[j]:
            return j
        return None

    def row(self, r: int) -> RowRef:
        ref = int(self.refs[r])
        if ref >= 0:
            j = self._run_of_index(ref)
            return RowRef(r, int(self.seqs[ref]), member=j is not None and bool(self.is_open[j]))
        j = -ref - 1
        s, e = int(self.run_start[j]), int(self.run_end[j])
        return RowRef(r, int(self.seqs[s]), fold=True, last_seq=int(self.seqs[e - 1]), count=e - s,
                      client_count=int(self.client[s:e].sum()), expanded=bool(self.is_open[j]))

    def rows(self, start: int, stop: int) -> list[RowRef]:
        return [self.row(r) for r in range(max(0, start), min(stop, len(self.refs)))]

    def row_of_seq(self, seq: int) -> int:
        """The row showing ``seq`` (its run's header when folded); -1 when not visible."""
        i = self.index_of(seq)
        if i < 0 or i >= self.visible:
            return -1
        return int(np.searchsorted(self.keys, i, side="right")) - 1

    def seqs_for(self, refs: Iterable[RowRef]) -> list[int]:
        out: list[int] = []
        for rr in refs:
            out.append(rr.seq)
            if rr.fold:
                out.append(rr.last_seq)
        return out
