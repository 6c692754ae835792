"""A compact timeline above the frame list: frames per interval by direction, the stall marked.

Two rows of bars (client frames above, server frames below, heartbeats dimmed) over the session's
wall-clock span, and a marker row where a stall (a tail of at least ``STALL_MIN_HEARTBEATS``
server heartbeats with no progress after them; ``workbench.report.shape`` says the same for the
report) is underlined in red. Clicking a column, or the screen's "jump to stall" key, posts
``TimelineStrip.Jump`` with the first frame of that moment.

The numbers come from one query of four narrow columns (``strip_data``), binned with numpy, so a
million-frame session costs no Python object per frame.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from workbench.report.shape import STALL_MIN_HEARTBEATS
from workbench.store import queries
from workbench.tui.data import TuiData, column_array

LABEL = 8          # "client " / "server " column
BLOCKS = " ▁▂▃▄▅▆▇█"
_CLIENT = Style(color="bright_blue")
_SERVER = Style(color="green")
_BEAT = Style(color="grey50")
_STALL = Style(color="bright_red", bold=True)
_DIM = Style(color="grey50")


@dataclass
class StripData:
    seq: np.ndarray        # frame seqs in order
    ts: np.ndarray         # µs
    up: np.ndarray         # client → server
    beat: np.ndarray       # a heartbeat (either side)
    stall_seq: int | None  # the first heartbeat of the stall
    stall_count: int = 0

    @property
    def empty(self) -> bool:
        return not len(self.seq)


def strip_data(data: TuiData, session_id: str) -> StripData:
    t = queries.frame_timeline_flags(data, session_id)
    seq = column_array(t, "seq", np.int64)
    ts = column_array(t, "ts", np.int64)
    up = column_array(t, "up", np.int8).astype(bool)
    beat = column_array(t, "beat", np.int8).astype(bool)
    progress = column_array(t, "progress", np.int8).astype(bool)
    server_beat = column_array(t, "server_beat", np.int8).astype(bool)
    stall_seq, count = find_stall(progress, server_beat, seq)
    return StripData(seq, ts, up, beat, stall_seq, count)


def find_stall(progress: np.ndarray, server_beat: np.ndarray, seq: np.ndarray) -> tuple[int | None, int]:
    """The first seq of the server heartbeats after the last progress frame, when there are enough."""
    last = int(np.flatnonzero(progress)[-1]) if progress.any() else -1
    tail = np.flatnonzero(server_beat[last + 1:]) + last + 1
    if len(tail) < STALL_MIN_HEARTBEATS:
        return None, 0
    return int(seq[tail[0]]), len(tail)


class TimelineStrip(Widget):
    """Frames per interval, client and server, with the stall underlined."""

    DEFAULT_CSS = """
    TimelineStrip { height: 3; background: $surface; }
    """

    class Jump(Message):
        def __init__(self, seq: int) -> None:
            super().__init__()
            self.seq = seq

    def __init__(self, *, id: str | None = None) -> None:  # noqa: A002 (Textual's name)
        super().__init__(id=id)
        self.data: StripData | None = None

    def set_data(self, data: StripData) -> None:
        self.data = data
        self.refresh()

    # layout ------------------------------------------------------------------------------------

    def _bins(self) -> int:
        return max(1, self.size.width - LABEL)

    def _bin_of(self) -> np.ndarray:
        d = self.data
        assert d is not None
        span = max(int(d.ts[-1] - d.ts[0]), 1)
        return np.minimum((d.ts - d.ts[0]) * self._bins() // span, self._bins() - 1)

    def seq_at(self, column: int) -> int | None:
        """The first frame in the interval under ``column`` (or the next one after it)."""
        d = self.data
        if d is None or d.empty or column < LABEL:
            return None
        bins = self._bin_of()
        at = np.flatnonzero(bins >= column - LABEL)
        return int(d.seq[at[0]]) if len(at) else int(d.seq[-1])

    def stall_columns(self) -> tuple[int, int] | None:
        d = self.data
        if d is None or d.empty or d.stall_seq is None:
            return None
        bins = self._bin_of()
        first = int(np.searchsorted(d.seq, d.stall_seq))
        return LABEL + int(bins[first]), LABEL + int(bins[-1])

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        d = self.data
        if d is None or d.empty:
            return Strip([Segment(" reading frames…" if d is None else " no frames", _DIM)]).crop(0, width)
        bins = self._bin_of()
        n = self._bins()
        if y < 2:
            mask = d.up if y == 0 else ~d.up
            counts = np.bincount(bins[mask], minlength=n)
            beats = np.bincount(bins[mask & d.beat], minlength=n)
            peak = max(int(np.bincount(bins, minlength=n).max()), 1)
            segs = [Segment("client " if y == 0 else "server ", _CLIENT if y == 0 else _SERVER), Segment(" ")]
            style = _CLIENT if y == 0 else _SERVER
            for c, b in zip(counts.tolist(), beats.tolist(), strict=True):
                level = 0 if c == 0 else max(1, round(c / peak * (len(BLOCKS) - 1)))
                segs.append(Segment(BLOCKS[level], _BEAT if c and b == c else style))
            return Strip(segs).crop(0, width)
        cols = self.stall_columns()
        span_s = (int(d.ts[-1]) - int(d.ts[0])) / 1e6
        if cols is None:
            return Strip([Segment(" " * LABEL), Segment(f"{len(d.seq)} frames over {span_s:.3f} s", _DIM)]).crop(0, width)
        a, b = cols
        text = f" stall: {d.stall_count} heartbeats from seq {d.stall_seq} (s: jump) "
        span = b - a + 1
        if span >= len(text) + 2:           # the words on the underline itself
            line = [Segment(" " * a), Segment("▔" + text + "▔" * (span - len(text) - 1), _STALL)]
        else:                                 # a short stall: the words from where it starts
            start = max(0, min(a, width - len(text)))
            line = [Segment(" " * start), Segment(text, _STALL)]
        return Strip(line).crop(0, width)

    def on_click(self, event: events.Click) -> None:
        seq = self.seq_at(event.x)
        if seq is not None:
            self.post_message(self.Jump(seq))
