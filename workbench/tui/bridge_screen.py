"""Both sides of a bridge, turn by turn: the OpenAI requests on the left, their agent runs on the right.

Opened with ``B`` (shift-b) on a session of either side (the sessions list or a session) that is linked to
the other side (``workbench.analysis.bridge_join``). The requests linked to each other through
their runs (a tool call handed out, its result sent back) form the conversation shown; each turn
is one OpenAI request with the runs it caused, and the two tables are padded so a turn starts on
the same row on both sides. The bridge findings of those sessions are listed below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from workbench.analysis.bridge import bridge_findings
from workbench.analysis.bridge_join import JOINED, Link, links_of
from workbench.analysis.model import Finding
from workbench.store import bridge_reads as reads
from workbench.store.db import us_to_time
from workbench.store.gate import wire_str
from workbench.store.queries import Reader, Row
from workbench.textsafe import escape, escape_display, rich_text
from workbench.tui.context import TuiContext
from workbench.tui.loading import Loader

MAX_SESSIONS = 40   # a conversation of this many requests and runs is shown; the rest is left out
_COLUMNS = ("seq", "time", "", "kind", "summary")


def _turns(data: Reader, sid: str) -> list[tuple[str, list[Link]]]:
    """(OpenAI request, its links) per turn of the conversation ``sid`` belongs to, in time order."""
    seen: dict[str, list[Link]] = {}
    todo = [sid]
    while todo and len(seen) < MAX_SESSIONS:
        s = todo.pop()
        if s in seen:
            continue
        seen[s] = links_of(data, s)
        todo += [lk.session_id for lk in seen[s] if lk.session_id not in seen]
    if not seen:
        return []
    started = reads.transports_by_start(data, list(seen))
    return [(s, seen[s]) for s, transport in started.items() if transport in JOINED]


def _row(f: Row) -> tuple[Any, ...]:
    when = us_to_time(f["ts"]) if f["ts"] else ""
    # a time past year 9999 (a hostile import) comes as DuckDB's text: its time of day, to the ms
    t = when.strftime("%H:%M:%S.%f")[:-3] if isinstance(when, datetime) else when.split(" ")[-1][:12]
    arrow = "→" if f["direction"] == "client" else "←"
    # captured text, never markup, control characters escaped (workbench.textsafe)
    return (str(f["seq"]), rich_text(t), arrow, rich_text(f["kind"]),
            rich_text(wire_str(str(f["summary"] or ""))[:120], display=True))


@dataclass
class BridgeView:
    """Everything the screen shows, read in one go off the UI thread."""

    turns: list[tuple[str, list[Link]]]
    frames: dict[str, list[Row]] = field(default_factory=dict)   # session id → its frame lines
    findings: list[Finding] = field(default_factory=list)


def read_bridge(data: Reader, session_id: str) -> BridgeView:
    """The conversation ``session_id`` belongs to: its turns, each side's frames, its bridge findings."""
    view = BridgeView(_turns(data, session_id))
    requests = [req for req, _ in view.turns]
    for req, links in view.turns:
        view.frames[req] = reads.frame_lines(data, req)
        for lk in links:
            if lk.role == "caused" and lk.session_id not in view.frames:
                view.frames[lk.session_id] = reads.frame_lines(data, lk.session_id)
    sessions = sorted(set(requests) | {lk.session_id for _, links in view.turns for lk in links})
    view.findings = [f for s in sessions if s in requests for f in bridge_findings(data, s)]
    return view


class BridgeScreen(Loader, Screen[None]):
    BINDINGS = [
        Binding("escape", "back", "Back", show=True),
        Binding("q", "back", "Back", show=False),
    ]

    def __init__(self, session_id: str, ctx: TuiContext) -> None:
        super().__init__()
        self.session_id = session_id
        self.ctx = ctx
        self.turns: list[tuple[str, list[Link]]] = []

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Static(Text("reading both sides…", "dim"), id="bridge-info")
            with Horizontal(id="bridge-sides"):
                yield DataTable(id="bridge-openai", cursor_type="row", zebra_stripes=True)
                yield DataTable(id="bridge-agent", cursor_type="row", zebra_stripes=True)
            yield Static(id="bridge-findings")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"bridge {escape(self.session_id[:8])}"
        self.query_one("#bridge-openai", DataTable).add_columns(*_COLUMNS)
        self.query_one("#bridge-agent", DataTable).add_columns("run", *_COLUMNS)
        data, sid = self.ctx.data, self.session_id
        self.load(lambda: read_bridge(data, sid), self._show, group="bridge", what="both sides of the bridge")

    def _show(self, view: BridgeView) -> None:
        self.turns = view.turns
        if not view.turns:
            self.query_one("#bridge-info", Static).update(
                Text(f"session {escape(self.session_id)} is not linked to the other side of a bridge"))
            return
        left = self.query_one("#bridge-openai", DataTable)
        right = self.query_one("#bridge-agent", DataTable)
        for n, (req, links) in enumerate(view.turns, 1):
            caused = [lk for lk in links if lk.role == "caused"]
            lrows = [(Text(f"turn {n}", "bold"), "", "", Text(f"request {escape(req[:8])}", "bold"), "")]
            lrows += [_row(f) for f in view.frames.get(req, [])]
            rrows: list[tuple[Any, ...]] = []
            for lk in caused:
                rrows.append((rich_text(lk.session_id[:8], "bold"), Text(f"turn {n}", "bold"), "", "",
                              Text(f"run caused, by {'+'.join(lk.by)}", "bold"), ""))
                rrows += [(rich_text(lk.session_id[:8]), *_row(f)) for f in view.frames.get(lk.session_id, [])]
            height = max(len(lrows), len(rrows))
            for r in lrows + [("",) * len(_COLUMNS)] * (height - len(lrows)):
                left.add_row(*r)
            for r in rrows + [("",) * (len(_COLUMNS) + 1)] * (height - len(rrows)):
                right.add_row(*r)
        info = Text()
        info.append(f"{len(view.turns)} request{'s' if len(view.turns) != 1 else ''}", "bold")
        info.append(" (left: what the OpenAI client sent and got) · runs (right: the agent side)")
        self.query_one("#bridge-info", Static).update(info)
        text = Text()
        if not view.findings:
            text.append("no bridge finding", "green")
        for f in view.findings:
            text.append(f"{f.severity.upper()} {f.code} ", "bold red" if f.severity == "error" else "yellow")
            text.append(f"request {escape(f.session_id[:8])}: {escape_display(f.message)}\n")
        self.query_one("#bridge-findings", Static).update(text)

    def action_back(self) -> None:
        self.app.pop_screen()
