"""The sessions screen: every session in the database, sortable and filterable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from workbench.textsafe import escape, escape_display
from workbench.tui.context import STATUS_STYLE, TuiContext, fmt_duration, fmt_start
from workbench.tui.data import SEVERITIES, SessionSummary
from workbench.tui.diff_screen import DiffScreen
from workbench.tui.loading import Loader
from workbench.tui.panels import SEVERITY_STYLE

__all__ = ["STATUS_STYLE", "SessionsScreen", "fmt_duration", "fmt_start"]

# (key, header): the display order; ``s`` cycles through the sort keys in this order.
COLUMNS: list[tuple[str, str]] = [
    ("session", "session"), ("label", "label"), ("status", "status"), ("findings", "findings"),
    ("top", "top finding"), ("source", "source"), ("transport", "transport"), ("model", "model"),
    ("start", "start (UTC)"), ("duration", "duration"), ("frames", "frames"),
]
# Columns that share what is left after the others, with the least width each keeps.
FLEX_MIN = {"session": 9, "label": 14, "top": 20}
# When the screen is too narrow for every column, these go first (left to right).
DROP_ORDER = ("source", "duration", "model", "frames", "transport", "start")
CELL_PADDING = 2  # DataTable pads each cell by one on both sides


def sort_value(s: SessionSummary, key: str) -> Any:
    if key == "findings":
        return tuple(-s.findings.get(sev, 0) for sev in SEVERITIES)
    return {"session": s.session_id, "label": s.label, "source": s.source, "transport": s.transport,
            "model": s.model, "start": s.started_us or 0, "duration": s.duration_s or 0.0,
            "frames": s.frame_count, "status": s.status, "top": top_text(s)}[key]


def top_text(s: SessionSummary) -> str:
    return s.top_finding.code if s.top_finding is not None else ""


def cell_texts(s: SessionSummary) -> dict[str, str]:
    """Each column's plain text for one session (widths are measured on these): ids, labels and
    models come from the capture, shown with control characters escaped (workbench.textsafe)."""
    return {"session": escape(s.session_id), "label": escape(s.label), "status": escape(s.status),
            "findings": s.findings_text(), "top": escape(top_text(s)), "source": escape(s.source),
            "transport": escape(s.transport), "model": escape(s.model),
            "start": fmt_start(s.started_us), "duration": fmt_duration(s.duration_s),
            "frames": str(s.frame_count)}


def layout(width: int, natural: dict[str, int]) -> dict[str, int]:
    """Column key → width for a table ``width`` cells wide: every column at its natural width when
    that fits; else the flexible ones (session, label, top finding) shrink to their minimum, then
    the least important columns are left out (``DROP_ORDER``). Status and findings always stay."""
    keys = [k for k, _ in COLUMNS]

    def need(ks: list[str]) -> int:
        return sum(min(natural[k], FLEX_MIN[k]) if k in FLEX_MIN else natural[k] for k in ks) \
            + CELL_PADDING * len(ks)

    for drop in DROP_ORDER:
        if need(keys) <= width:
            break
        keys.remove(drop)
    widths = {k: (min(natural[k], FLEX_MIN[k]) if k in FLEX_MIN else natural[k]) for k in keys}
    spare = width - need(keys)
    for k in ("label", "top", "session"):  # what is left goes to the label first
        if k in widths and spare > 0:
            grow = min(spare, natural[k] - widths[k])
            widths[k] += grow
            spare -= grow
    return widths


class SessionsScreen(Loader, Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open", show=True),
        Binding("slash", "filter", "Filter", show=True),
        Binding("s", "sort", "Sort", show=True),
        Binding("r", "reverse", "Reverse", show=True),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("f5", "reload", "Reload", show=True),
        Binding("m", "mark_diff", "Diff", show=False),
        Binding("q", "app.quit", "Quit", show=True),
    ]
    COMMANDS_HELP = {"open": "Open the selected session", "filter": "Filter sessions by text",
                     "sort": "Sort by the next column", "reverse": "Reverse the sort order",
                     "clear_filter": "Clear the session filter", "reload": "Reload the session list",
                     "mark_diff": "Diff: mark this session, then another (m again) to compare them"}

    class OpenSession(Message):
        """The user chose a session; the application opens it."""

        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    def __init__(self, ctx: TuiContext) -> None:
        super().__init__(id="sessions-screen")
        self.ctx = ctx
        self.sessions: list[SessionSummary] = []
        self.sort_key = "start"
        self.sort_reverse = False
        self.text_filter = ""
        self._widths: dict[str, int] = {}
        self.diff_mark: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter sessions (any column)…", id="session-filter", classes="hidden")
        yield Static("", id="sessions-status")
        table: DataTable[Any] = DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static("", id="session-info")
        yield Footer()

    def on_mount(self) -> None:
        self.title = "workbench"
        self.sub_title = Path(self.ctx.data.path).name
        self.query_one("#sessions", DataTable).focus()
        if self.ctx.follow:
            self.set_interval(self.ctx.poll_interval, self._poll, name="sessions-follow")

    def on_screen_resume(self) -> None:
        # loaded when first shown, not at mount: `workbench tui DB SESSION` opens the session
        # screen on top right away, and its first paint should not wait behind this query
        if not self.sessions and self.app.screen is self:
            self.action_reload()

    # data ------------------------------------------------------------------------------------

    def action_reload(self) -> None:
        self.load(self.ctx.data.sessions, self._got_sessions, group="sessions", what="reading sessions")

    def _poll(self) -> None:
        # never cancel a reload in flight: on a slow disk every poll would cancel the last one
        busy = any(w.group == "sessions" and w.is_running for w in self.app.workers)
        if self.app.screen is self and not busy:
            self.action_reload()

    def _got_sessions(self, sessions: list[SessionSummary]) -> None:
        if sessions == self.sessions and self.query_one("#sessions", DataTable).row_count:
            return
        self.sessions = sessions
        self._fill()

    def visible_sessions(self) -> list[SessionSummary]:
        rows = self.sessions
        if self.text_filter:
            needle = self.text_filter.lower()
            rows = [s for s in rows if needle in " ".join(
                [s.session_id, s.label, s.source, s.transport, s.model, s.status, fmt_start(s.started_us),
                 s.findings_text(), top_text(s)]).lower()]
        return sorted(rows, key=lambda s: sort_value(s, self.sort_key), reverse=self.sort_reverse)

    def on_resize(self) -> None:
        if self.sessions:
            self._fill()

    def _columns(self, table: DataTable[Any], texts: list[dict[str, str]]) -> list[str]:
        """Fit the columns to the table's width (``layout``); rebuild them when that changes."""
        natural = {k: max([len(h)] + [len(t[k]) for t in texts]) for k, h in COLUMNS}
        # the vertical scrollbar takes two cells once the rows outgrow the table
        width = (table.size.width or self.app.size.width) - 2
        widths = layout(width, natural)
        if widths != self._widths or not table.columns:
            table.clear(columns=True)
            for key, header in COLUMNS:
                if key in widths:
                    table.add_column(header, key=key, width=widths[key])
            self._widths = widths
        else:
            table.clear()
        return [k for k, _ in COLUMNS if k in widths]

    def _fill(self) -> None:
        table = self.query_one("#sessions", DataTable)
        current = self.selected_id()
        rows = self.visible_sessions()
        texts = [cell_texts(s) for s in rows]
        keys = self._columns(table, texts)
        for s, text in zip(rows, texts, strict=True):
            cells = {k: Text(v, no_wrap=True, overflow="ellipsis") for k, v in text.items()}
            fcell = Text()
            for sev, style in (("error", "bold red"), ("warning", "yellow"), ("info", "cyan"), ("note", "cyan")):
                if s.findings.get(sev):
                    fcell.append(f"{s.findings[sev]}{sev[0].upper()} ", style)
            if s.analysis in ("not analysed", "open"):
                fcell = Text(s.analysis, "dim italic")  # never "-" for a session nobody analysed
            elif s.analysis == "stale":
                fcell.append("(stale)", "dim")
            cells["findings"] = fcell or Text("-", "dim")
            cells["status"] = Text(text["status"], STATUS_STYLE.get(s.status, ""))
            if s.top_finding is not None:
                cells["top"].stylize(SEVERITY_STYLE.get(s.top_finding.severity, ""))
            table.add_row(*(cells[k] for k in keys), key=s.session_id)
        if current is not None:
            for i, s in enumerate(rows):
                if s.session_id == current:
                    table.move_cursor(row=i)
        self._show_info()
        arrow = "↓" if self.sort_reverse else "↑"
        flt = f'  filter "{self.text_filter}"' if self.text_filter else ""
        live = "  ● live" if self.ctx.data.live else ""
        self.query_one("#sessions-status", Static).update(Content(  # the filter is typed text, not markup
            f"{len(rows)} of {len(self.sessions)} sessions  sorted by {self.sort_key} {arrow}{flt}{live}"))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_info()

    def _show_info(self) -> None:
        """The selected session in full: id, where it came from, label, top finding and its message."""
        sid = self.selected_id()
        s = next((x for x in self.sessions if x.session_id == sid), None)
        t = Text()
        if s is not None:
            t.append(escape(s.session_id), "bold")
            t.append(f"  {escape(s.source)} · {escape(s.transport)} · {escape(s.model) or '?'} · ", "dim")
            t.append(escape(s.status), STATUS_STYLE.get(s.status, ""))
            if s.label:
                t.append(f"  “{escape(s.label)}”")
            f = s.top_finding
            if f is not None:
                t.append("\n")
                t.append(escape(f.code), SEVERITY_STYLE.get(f.severity, "bold"))
                if f.message:
                    t.append(f": {escape_display(f.message)}")
        self.query_one("#session-info", Static).update(t)

    def selected_id(self) -> str | None:
        table = self.query_one("#sessions", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key
        return str(key.value) if key.value is not None else None

    # actions ---------------------------------------------------------------------------------

    def action_open(self) -> None:
        sid = self.selected_id()
        if sid is not None:
            self.post_message(self.OpenSession(sid))

    def action_mark_diff(self) -> None:
        sid = self.selected_id()
        if sid is None:
            return
        if self.diff_mark is None or self.diff_mark == sid:
            self.diff_mark = sid
            self.app.notify(f"A = {sid}: select another session and press m to compare", title="diff",
                            markup=False)
            return
        a, self.diff_mark = self.diff_mark, None
        self.app.push_screen(DiffScreen(a, sid, self.ctx))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.post_message(self.OpenSession(str(event.row_key.value)))

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        key = str(event.column_key.value)
        if key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = key, False
        self._fill()

    def action_sort(self) -> None:
        keys = [k for k, _ in COLUMNS]
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self._fill()

    def action_reverse(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._fill()

    def action_filter(self) -> None:
        box = self.query_one("#session-filter", Input)
        box.remove_class("hidden")
        box.focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id == "session-filter":
            self.text_filter = event.value.strip()
            self._fill()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "session-filter":
            self.query_one("#sessions", DataTable).focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#session-filter", Input)
        box.value = ""
        box.add_class("hidden")
        self.text_filter = ""
        self._fill()
        self.query_one("#sessions", DataTable).focus()
