"""Both sides of a bridge, turn by turn: the OpenAI requests on the left, their agent runs on the right.

Opened with ``B`` (shift-b) on a session of either side (the sessions list or a session) that is linked to
the other side (``workbench.analysis.bridge_join``). The requests linked to each other through
their runs (a tool call handed out, its result sent back) form the conversation shown; each turn
is one OpenAI request with the runs it caused, and the two tables are padded so a turn starts on
the same row on both sides. The bridge findings of those sessions are listed below.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from workbench.analysis.bridge import bridge_findings
from workbench.analysis.bridge_join import JOINED, Link, links_of
from workbench.store import bridge_reads as reads
from workbench.store.db import us_to_datetime
from workbench.store.queries import Reader, Row
from workbench.tui.context import TuiContext

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
    t = us_to_datetime(f["ts"]).strftime("%H:%M:%S.%f")[:-3] if f["ts"] else ""
    arrow = "→" if f["direction"] == "client" else "←"
    return (str(f["seq"]), t, arrow, f["kind"], Text(str(f["summary"] or "")[:120]))


class BridgeScreen(Screen[None]):
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
            yield Static(id="bridge-info")
            with Horizontal(id="bridge-sides"):
                yield DataTable(id="bridge-openai", cursor_type="row", zebra_stripes=True)
                yield DataTable(id="bridge-agent", cursor_type="row", zebra_stripes=True)
            yield Static(id="bridge-findings")
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"bridge {self.session_id[:8]}"
        data = self.ctx.data
        left = self.query_one("#bridge-openai", DataTable)
        right = self.query_one("#bridge-agent", DataTable)
        left.add_columns(*_COLUMNS)
        right.add_columns("run", *_COLUMNS)
        self.turns = _turns(data, self.session_id)
        if not self.turns:
            self.query_one("#bridge-info", Static).update(
                Text(f"session {self.session_id} is not linked to the other side of a bridge"))
            return
        sessions: set[str] = set()
        for n, (req, links) in enumerate(self.turns, 1):
            caused = [lk for lk in links if lk.role == "caused"]
            lrows = [(Text(f"turn {n}", "bold"), "", "", Text(f"request {req[:8]}", "bold"), "")]
            lrows += [_row(f) for f in reads.frame_lines(data, req)]
            rrows: list[tuple[Any, ...]] = []
            for lk in caused:
                rrows.append((Text(lk.session_id[:8], "bold"), Text(f"turn {n}", "bold"), "", "",
                              Text(f"run caused, by {'+'.join(lk.by)}", "bold"), ""))
                rrows += [(lk.session_id[:8], *_row(f)) for f in reads.frame_lines(data, lk.session_id)]
            height = max(len(lrows), len(rrows))
            for r in lrows + [("",) * len(_COLUMNS)] * (height - len(lrows)):
                left.add_row(*r)
            for r in rrows + [("",) * (len(_COLUMNS) + 1)] * (height - len(rrows)):
                right.add_row(*r)
            sessions.add(req)
            sessions.update(lk.session_id for lk in links)
        info = Text()
        info.append(f"{len(self.turns)} request{'s' if len(self.turns) != 1 else ''}", "bold")
        info.append(" (left: what the OpenAI client sent and got) · runs (right: the agent side)")
        self.query_one("#bridge-info", Static).update(info)
        found = [f for s in sorted(sessions) for f in bridge_findings(data, s)
                 if s in {t[0] for t in self.turns}]
        text = Text()
        if not found:
            text.append("no bridge finding", "green")
        for f in found:
            text.append(f"{f.severity.upper()} {f.code} ", "bold red" if f.severity == "error" else "yellow")
            text.append(f"request {f.session_id[:8]}: {f.message}\n")
        self.query_one("#bridge-findings", Static).update(text)

    def action_back(self) -> None:
        self.app.pop_screen()
