"""The frame timeline: a virtual list that renders only the rows on screen.

The widget holds a ``FrameIndex`` (row → seq, folds) and a cache of row contents keyed by seq.
Rows not in the cache render as a placeholder and are asked for with one ``NeedRows`` message
per refresh; the screen fetches them in a worker and hands them back with ``add_rows``.
"""

from __future__ import annotations

import time

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from workbench.protocol import kinds
from workbench.store.gate import wire_str
from workbench.textsafe import escape, escape_display
from workbench.tui.data import FrameIndex, RowRef

KIND_WIDTH = 40       # the kind column on a wide screen
MIN_KIND_WIDTH = 22   # on a narrow one, where kinds are written compactly (``compact_kind``)
MIN_SUMMARY = 32      # the summary keeps at least this much before the kind column shrinks
ROW_PREFIX = 16       # evidence mark, time offset, direction arrow
CACHE_LIMIT = 50_000

_FAMILY_STYLES: list[tuple[str, Style]] = [
    (kinds.END_STREAM_ERROR, Style(color="bright_red", bold=True)),
    (kinds.MALFORMED, Style(color="bright_red", bold=True)),
    (kinds.END_STREAM, Style(color="green", bold=True)),
    (kinds.RUN_REQUEST, Style(color="bright_white", bold=True)),
    (kinds.SERVER_HEARTBEAT, Style(color="grey50")),
    (kinds.CLIENT_HEARTBEAT, Style(color="grey50")),
    (kinds.EXEC_HEARTBEAT, Style(color="grey50")),
    (kinds.TURN_ENDED, Style(color="green", bold=True)),
    ("interaction_update.tool_call", Style(color="magenta")),
    (kinds.PARTIAL_TOOL_CALL, Style(color="magenta")),
    ("interaction_update.thinking", Style(color="bright_blue")),
    (kinds.INTERACTION_UPDATE, Style(color="cyan")),
    (kinds.EXEC_CLIENT_CONTROL, Style(color="bright_yellow")),
    (kinds.EXEC_SERVER_CONTROL, Style(color="bright_yellow")),
    ("exec_", Style(color="yellow")),
    ("kv_", Style(color="blue")),
    (kinds.CHECKPOINT, Style(color="green")),
    (kinds.INTERACTION_QUERY, Style(color="bright_magenta")),
    (kinds.INTERACTION_RESPONSE, Style(color="bright_magenta")),
]
_DEFAULT = Style(color="white")
_DIM = Style(color="grey50")
_FOLD = Style(color="grey62", italic=True)
_ERROR = Style(color="bright_red")
_CURSOR = Style(bgcolor="grey30", bold=True)
_CURSOR_FOCUS = Style(bgcolor="dark_blue", bold=True)
_EVIDENCE = Style(bgcolor="dark_red")
_LIT = Style(color="bright_yellow", bold=True)


def kind_width(width: int) -> int:
    """The kind column for a timeline ``width`` cells wide: 40, less when the summary would get
    fewer than ``MIN_SUMMARY`` cells (a 120-column terminal), never under ``MIN_KIND_WIDTH``."""
    return max(MIN_KIND_WIDTH, min(KIND_WIDTH, width - ROW_PREFIX - MIN_SUMMARY))


def compact_kind(kind: str, width: int) -> str:
    """``kind`` in at most ``width`` cells: as stored when it fits, else without the
    ``interaction_update.`` prefix and with ``_message.`` shortened to ``.``, then cut."""
    if len(kind) <= width:
        return kind
    short = kind.removeprefix("interaction_update.").replace("_message.", ".")
    return short if len(short) <= width else short[: width - 1] + "…"


def kind_style(kind: str) -> Style:
    for prefix, style in _FAMILY_STYLES:
        if kind.startswith(prefix):
            return style
    return _DEFAULT


def arrow(direction: str) -> str:
    # client→server goes up the screen's "wire", server→client comes down
    return "→" if direction == "client" else "←"


def offset_text(ts_us: int | None, t0_us: int) -> str:
    if ts_us is None:
        return ""
    return f"+{(ts_us - t0_us) / 1e6:9.3f}s"


class Timeline(ScrollView, can_focus=True):
    """Frames of one session, one row each, heartbeat runs folded."""

    BINDINGS = [
        Binding("up", "cursor(-1)", "Up", show=False),
        Binding("down", "cursor(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("home,g", "first", "First", show=False),
        Binding("end,G", "last", "Last", show=False),
        Binding("enter", "select", "Open/fold", show=True),
    ]

    DEFAULT_CSS = """
    Timeline { background: $surface; }
    """

    cursor = reactive(0, always_update=True)

    class NeedRows(Message):
        def __init__(self, timeline: Timeline, seqs: list[int]) -> None:
            super().__init__()
            self.timeline = timeline
            self.seqs = seqs

    class Highlighted(Message):
        def __init__(self, row: RowRef) -> None:
            super().__init__()
            self.row = row

    class Selected(Message):
        def __init__(self, row: RowRef) -> None:
            super().__init__()
            self.row = row

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.index: FrameIndex | None = None
        self.t0_us = 0
        self.rows_cache: dict[int, dict] = {}
        self.evidence: set[int] = set()
        self._asked: set[int] = set()
        self._request_pending = False
        self.first_paint: float | None = None   # monotonic time the first real row was drawn
        self.follow_tail = False

    # data in -----------------------------------------------------------------------------------

    def set_index(self, index: FrameIndex, t0_us: int | None = None, *, keep_cursor_seq: int | None = None) -> None:
        self.index = index
        if t0_us is not None:
            self.t0_us = t0_us
        self._asked.clear()
        self._update_size()
        row = index.row_of_seq(keep_cursor_seq) if keep_cursor_seq is not None else -1
        self.cursor = row if row >= 0 else min(self.cursor, max(0, len(index) - 1))
        self.refresh()

    def index_changed(self) -> None:
        """The index was modified in place (extend, fold toggle, replay limit)."""
        self._update_size()
        if self.index is not None and self.cursor >= len(self.index):
            self.cursor = max(0, len(self.index) - 1)
        self.refresh()

    def _update_size(self) -> None:
        n = len(self.index) if self.index is not None else 0
        self.virtual_size = Size(self.size.width, n)

    def add_rows(self, rows: dict[int, dict]) -> None:
        if len(self.rows_cache) + len(rows) > CACHE_LIMIT:
            self.rows_cache.clear()
        self.rows_cache.update(rows)
        self._asked.difference_update(rows)
        self.refresh()

    def clear_cache(self) -> None:
        self.rows_cache.clear()
        self._asked.clear()

    def set_evidence(self, seqs: set[int]) -> None:
        self.evidence = set(seqs)
        self.refresh()

    def on_resize(self, event: events.Resize) -> None:
        self._update_size()

    # cursor ------------------------------------------------------------------------------------

    @property
    def current(self) -> RowRef | None:
        if self.index is None or not len(self.index):
            return None
        return self.index.row(min(self.cursor, len(self.index) - 1))

    def watch_cursor(self, old: int, new: int) -> None:
        self._scroll_to_cursor()
        self.refresh()
        cur = self.current
        if cur is not None:
            self.post_message(self.Highlighted(cur))

    def _scroll_to_cursor(self, center: bool = False) -> None:
        h = max(1, self.scrollable_content_region.height)
        top = int(self.scroll_offset.y)
        if center:
            self.scroll_to(y=max(0, self.cursor - h // 2), animate=False, immediate=True)
        elif self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False, immediate=True)
        elif self.cursor >= top + h:
            self.scroll_to(y=self.cursor - h + 1, animate=False, immediate=True)

    def jump_to_row(self, row: int) -> None:
        self.cursor = row
        self._scroll_to_cursor(center=True)

    def action_cursor(self, delta: int) -> None:
        if self.index is not None and len(self.index):
            self.cursor = max(0, min(len(self.index) - 1, self.cursor + delta))

    def action_page(self, delta: int) -> None:
        self.action_cursor(delta * max(1, self.scrollable_content_region.height - 1))

    def action_first(self) -> None:
        self.cursor = 0

    def action_last(self) -> None:
        if self.index is not None:
            self.cursor = max(0, len(self.index) - 1)

    def action_select(self) -> None:
        cur = self.current
        if cur is not None:
            self.post_message(self.Selected(cur))

    def on_click(self, event: events.Click) -> None:
        if self.index is None:
            return
        row = int(self.scroll_offset.y) + event.y
        if 0 <= row < len(self.index):
            self.cursor = row
            if event.chain >= 2:
                self.action_select()

    # rendering ---------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        index = self.index
        row = int(self.scroll_offset.y) + y
        if index is None or row >= len(index):
            return Strip.blank(width)
        rr = index.row(row)
        data = self.rows_cache.get(rr.seq)
        last = self.rows_cache.get(rr.last_seq) if rr.fold else None
        if data is None or (rr.fold and last is None):
            self._ask(rr)
            segs = [Segment(f"  {'':10} …  loading frame {rr.seq}", _DIM)]
        else:
            segs = self._row_segments(rr, data, last)
            if self.first_paint is None:
                self.first_paint = time.monotonic()
        if row == self.cursor:
            cursor_style = _CURSOR_FOCUS if self.has_focus else _CURSOR
            segs = [Segment(t, (s or Style()) + cursor_style) for t, s, _ in segs]
            return Strip(segs).crop_extend(0, width, cursor_style)
        if rr.seq in self.evidence or (rr.fold and any(rr.seq <= s <= rr.last_seq for s in self.evidence)):
            segs = [Segment(t, (s or Style()) + _EVIDENCE) for t, s, _ in segs]
            return Strip(segs).crop_extend(0, width, _EVIDENCE)
        return Strip(segs).crop_extend(0, width, None)

    def _row_segments(self, rr: RowRef, data: dict, last: dict | None) -> list[Segment]:
        mark = Segment("◆ " if rr.seq in self.evidence else "  ", _LIT)
        off = Segment(offset_text(data.get("ts_us"), self.t0_us) + " ", _DIM)
        if rr.fold and last is not None:
            span = ((last.get("ts_us") or 0) - (data.get("ts_us") or 0)) / 1e6
            sign = "▾" if rr.expanded else "▸"
            text = f"{sign} × {rr.count} heartbeats over {span:.0f} s"
            if rr.client_count:
                text += f"  ({rr.count - rr.client_count} ← server, {rr.client_count} → client)"
            text += f"   seq {rr.seq}…{rr.last_seq}"
            return [mark, off, Segment("⋯ ", _DIM), Segment(text, _FOLD)]
        indent = "  " if rr.member else ""
        kind = data.get("kind") or ""
        direction = data.get("direction") or ""
        kw = kind_width(self.scrollable_content_region.width)
        # captured text: control characters as visible escapes (workbench.textsafe); a segment goes
        # to the terminal as it is, an ESC in it would reach the terminal
        kind_cell = (indent + compact_kind(escape(kind), kw - len(indent))).ljust(kw)
        summary = escape_display(wire_str(str(data.get("summary") or "")))  # the text, not its stored form
        segs = [mark, off, Segment(arrow(direction) + " ", Style(color="bright_cyan" if direction == "client"
                                                                   else "bright_green")),
                Segment(kind_cell + " ", kind_style(kind)), Segment(summary)]
        if data.get("error"):
            segs.append(Segment(f"  ⚠ {escape_display(wire_str(str(data['error'])))}", _ERROR))
        return segs

    def _ask(self, rr: RowRef) -> None:
        if rr.seq in self._asked:
            return
        if not self._request_pending:
            self._request_pending = True
            self.call_after_refresh(self._request_rows)

    def _request_rows(self) -> None:
        self._request_pending = False
        if self.index is None:
            return
        h = max(1, self.scrollable_content_region.height)
        top = int(self.scroll_offset.y)
        # fetch a screen above and below too, so small scrolls need no round trip
        refs = self.index.rows(top - h, top + 2 * h)
        wanted = [s for s in self.index.seqs_for(refs) if s not in self.rows_cache and s not in self._asked]
        if wanted:
            self._asked.update(wanted)
            self.post_message(self.NeedRows(self, wanted))
