"""Layout of the report's timeline, as plain data, from a session read one frame at a time.

Frames binned over the session's span (``TL_BINS`` columns whatever its length), per direction
(client above the axis, server below), stacked by family; stretches with nothing but heartbeats
(at least ``GAP_MIN_S`` and 5% of the span, so at most 20 of them) shaded; each finding's span on a
row of its own. What it keeps is bounded by the bins, the gaps and the findings, never the frames.

The picture is drawn ``TL_WIDTH`` units wide and scaled to the page's width
(``templates/timeline.svg.j2``); the axis leaves room on the right for its last label.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.protocol import kinds
from workbench.report.diagram import HEARTBEAT_COLOUR, colour

TL_WIDTH = 1100
TL_LEFT = 60
TL_RIGHT = 40          # room right of the axis: the last tick's label is centred on its end
TL_BAND = 70           # height of one direction's band
TL_BINS = 160
TL_FINDINGS = 40       # finding spans drawn (the rest are counted)
GAP_MIN_S = 0.25       # no progress for at least this long (and 5% of the session): a shaded gap


@dataclass
class Bar:
    x: float
    y: float
    w: float
    h: float
    colour: str
    title: str


@dataclass
class Span:
    x: float
    w: float
    title: str
    code: str = ""
    anchor: str = ""      # the frame it links to, under the session's anchor


@dataclass
class Timeline:
    width: int = TL_WIDTH
    height: int = 2 * TL_BAND + 50
    left: int = TL_LEFT
    right: int = TL_WIDTH - TL_RIGHT
    band: int = TL_BAND
    bars: list[Bar] = field(default_factory=list)
    gaps: list[Span] = field(default_factory=list)
    findings: list[Span] = field(default_factory=list)
    findings_left_out: int = 0
    ticks: list[tuple[float, str, str]] = field(default_factory=list)   # x, text, text-anchor
    legend: list[tuple[str, str]] = field(default_factory=list)
    duration_s: float = 0.0


class TimelineBuilder:
    """Fed a session's frames a page at a time, as columns; ``t0``/``t1``: its first and last
    frame's time (µs)."""

    def __init__(self, t0: int, t1: int) -> None:
        self.t0, self.t1 = t0, t1
        self.span_us = max(t1 - t0, 1)
        self.counts: Counter[tuple[int, str, str]] = Counter()
        self.min_gap = max(GAP_MIN_S * 1e6, 0.05 * self.span_us)
        self.last_progress: int | None = None
        self.gap_spans: list[tuple[int, int]] = []
        self.seen = 0

    def x_of(self, ts: int) -> float:
        return TL_LEFT + (ts - self.t0) / self.span_us * (TL_WIDTH - TL_LEFT - TL_RIGHT)

    def add_page(self, ts: np.ndarray, server: np.ndarray, kind_codes: np.ndarray, kind_names: Sequence[str]) -> None:
        """``ts`` (µs), ``server`` (bool) and the kind of each frame as a code into ``kind_names``."""
        if not len(ts):
            return
        self.seen += len(ts)
        families = ["heartbeat" if kinds.is_heartbeat(k) else kinds.family(k) for k in kind_names]
        beat = np.array([f == "heartbeat" for f in families], dtype=bool)
        bins = np.minimum(TL_BINS - 1, (ts - self.t0) * TL_BINS // self.span_us)
        key = (bins * 2 + server.astype(np.int64)) * len(kind_names) + kind_codes
        values, counts = np.unique(key, return_counts=True)
        for v, n in zip(values.tolist(), counts.tolist(), strict=True):
            col, k = divmod(v, len(kind_names))
            b, up = divmod(col, 2)
            self.counts[(b, "server" if up else "client", families[k])] += n
        progress = ts[~beat[kind_codes]]
        if len(progress):
            if self.last_progress is not None:
                progress = np.concatenate(([self.last_progress], progress))
            gaps = np.nonzero(np.diff(progress) >= self.min_gap)[0]
            self.gap_spans += [(int(progress[i]), int(progress[i + 1])) for i in gaps.tolist()]
            self.last_progress = int(progress[-1])

    def finish(self, findings: Sequence[dict[str, Any]], ts_of: dict[int, int]) -> Timeline:
        """``ts_of``: the time of each seq a finding starts or ends at (read for the findings only)."""
        tl = Timeline()
        if not self.seen:
            return tl
        t0, span_us = self.t0, self.span_us
        tl.duration_s = (self.t1 - t0) / 1e6
        plot_w = TL_WIDTH - TL_LEFT - TL_RIGHT
        bin_w = plot_w / TL_BINS
        per_column: Counter[tuple[int, str]] = Counter()
        for (b, d, _fam), n in self.counts.items():
            per_column[(b, d)] += n
        peak = max(per_column.values()) or 1
        stacked: dict[tuple[int, str], float] = {}
        families: dict[str, str] = {}
        for (b, direction, fam), n in sorted(self.counts.items()):
            h = n / peak * (TL_BAND - 8)
            base = stacked.get((b, direction), 0.0)
            stacked[(b, direction)] = base + h
            c = HEARTBEAT_COLOUR if fam == "heartbeat" else colour(fam)
            families[fam] = c
            # client frames grow up from the axis, server frames down from it
            axis = 20 + TL_BAND
            y = axis - base - h if direction == "client" else axis + base
            tl.bars.append(Bar(TL_LEFT + b * bin_w, y, max(bin_w - 0.5, 0.5), h, c,
                               f"{n} {fam} frame{'s' if n != 1 else ''} ({direction}) near "
                               f"+{b * span_us / TL_BINS / 1e6:.3f} s"))
        tl.legend = sorted(families.items())
        # gaps: stretches with nothing but heartbeats, long enough to see (the last one up to the end)
        spans = list(self.gap_spans)
        if self.last_progress is not None and self.t1 - self.last_progress >= self.min_gap:
            spans.append((self.last_progress, self.t1))
        for a, b in spans:
            tl.gaps.append(Span(self.x_of(a), self.x_of(b) - self.x_of(a), f"no progress for {(b - a) / 1e6:.3f} s"))
        shown = [fd for fd in findings if not fd["is_note"] and fd["first_seq"] is not None]
        tl.findings_left_out = max(0, len(shown) - TL_FINDINGS)
        for fd in shown[:TL_FINDINGS]:
            a = ts_of.get(int(fd["first_seq"]), t0)
            b = ts_of.get(int(fd["last_seq"] if fd["last_seq"] is not None else fd["first_seq"]), a)
            tl.findings.append(Span(self.x_of(a), max(self.x_of(b) - self.x_of(a), 2.0),
                                    f"{fd['code']}: seq {fd['first_seq']}–{fd['last_seq']}", str(fd["code"]),
                                    f"frame-{fd['first_seq']}"))
        tl.height = 2 * TL_BAND + 56 + 16 * len(tl.findings)
        for k in range(6):
            tl.ticks.append((TL_LEFT + k * plot_w / 5, f"+{k * span_us / 5 / 1e6:.2f}s", "middle"))
        return tl
