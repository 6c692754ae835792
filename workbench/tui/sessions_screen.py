"""The sessions screen: every session in the database, sortable and filterable."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static

from workbench.tui.data import SEVERITIES, SessionSummary
from workbench.tui.loading import Loader

if TYPE_CHECKING:
    from workbench.tui.app import WorkbenchApp

COLUMNS: list[tuple[str, str]] = [
    ("session", "session"), ("source", "source"), ("transport", "transport"), ("model", "model"),
    ("start", "start (UTC)"), ("duration", "duration"), ("frames", "frames"), ("findings", "findings"),
    ("status", "status"),
]
STATUS_STYLE = {"complete": "green", "open": "cyan", "incomplete": "yellow", "error": "bold red", "aborted": "red"}


def fmt_start(us: int | None) -> str:
    if us is None:
        return ""
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_duration(s: float | None) -> str:
    if s is None:
        return ""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def sort_value(s: SessionSummary, key: str) -> Any:
    if key == "findings":
        return tuple(-s.findings.get(sev, 0) for sev in SEVERITIES)
    return {"session": s.session_id, "source": s.source, "transport": s.transport, "model": s.model,
            "start": s.started_us or 0, "duration": s.duration_s or 0.0, "frames": s.frame_count,
            "status": s.status}[key]


class SessionsScreen(Loader, Screen[None]):
    BINDINGS = [
        Binding("enter", "open", "Open", show=True),
        Binding("slash", "filter", "Filter", show=True),
        Binding("s", "sort", "Sort", show=True),
        Binding("r", "reverse", "Reverse", show=True),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("f5", "reload", "Reload", show=True),
        Binding("q", "app.quit", "Quit", show=True),
    ]
    COMMANDS_HELP = {"open": "Open the selected session", "filter": "Filter sessions by text",
                     "sort": "Sort by the next column", "reverse": "Reverse the sort order",
                     "clear_filter": "Clear the session filter", "reload": "Reload the session list"}

    app: WorkbenchApp

    def __init__(self) -> None:
        super().__init__(id="sessions-screen")
        self.sessions: list[SessionSummary] = []
        self.sort_key = "start"
        self.sort_reverse = False
        self.text_filter = ""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Input(placeholder="filter sessions (any column)…", id="session-filter", classes="hidden")
        yield Static("", id="sessions-status")
        table: DataTable[Any] = DataTable(id="sessions", cursor_type="row", zebra_stripes=True)
        yield table
        yield Footer()

    def on_mount(self) -> None:
        self.title = "workbench"
        self.sub_title = Path(self.app.data.path).name
        table = self.query_one("#sessions", DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        table.focus()
        if self.app.follow:
            self.set_interval(self.app.poll_interval, self._poll, name="sessions-follow")

    def on_screen_resume(self) -> None:
        # loaded when first shown, not at mount: `workbench tui DB SESSION` opens the session
        # screen on top right away, and its first paint should not wait behind this query
        if not self.sessions and self.app.screen is self:
            self.action_reload()

    # data ------------------------------------------------------------------------------------

    def action_reload(self) -> None:
        self.load(self.app.data.sessions, self._got_sessions, group="sessions", what="reading sessions")

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
                [s.session_id, s.source, s.transport, s.model, s.status, fmt_start(s.started_us),
                 s.findings_text()]).lower()]
        return sorted(rows, key=lambda s: sort_value(s, self.sort_key), reverse=self.sort_reverse)

    def _fill(self) -> None:
        table = self.query_one("#sessions", DataTable)
        current = self.selected_id()
        table.clear()
        rows = self.visible_sessions()
        for s in rows:
            fcell = Text()
            for sev, style in (("error", "bold red"), ("warning", "yellow"), ("info", "cyan")):
                if s.findings.get(sev):
                    fcell.append(f"{s.findings[sev]}{sev[0].upper()} ", style)
            table.add_row(s.session_id, s.source, s.transport, s.model, fmt_start(s.started_us),
                          fmt_duration(s.duration_s), str(s.frame_count), fcell or Text("-", "dim"),
                          Text(s.status, STATUS_STYLE.get(s.status, "")), key=s.session_id)
        if current is not None:
            for i, s in enumerate(rows):
                if s.session_id == current:
                    table.move_cursor(row=i)
        arrow = "↓" if self.sort_reverse else "↑"
        flt = f'  filter "{self.text_filter}"' if self.text_filter else ""
        live = "  ● live" if self.app.data.live else ""
        self.query_one("#sessions-status", Static).update(
            f"{len(rows)} of {len(self.sessions)} sessions  sorted by {self.sort_key} {arrow}{flt}{live}")

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
            self.app.open_session(sid)

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value is not None:
            self.app.open_session(str(event.row_key.value))

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
