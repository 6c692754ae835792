"""``workbench diff`` in the TUI: pick two sessions on the sessions screen (``m`` on the first,
``m`` on the second) and read what changed between them, as ``workbench diff A B`` prints it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from workbench.textsafe import escape_display
from workbench.tui.context import TuiContext
from workbench.tui.loading import Loader

if TYPE_CHECKING:
    from workbench.sessiondiff.compare import Diff

# how a line of the diff is coloured, by how it starts (after its indentation)
_STYLES = [("only in A", "red"), ("only in B", "green"), ("first divergence", "bold yellow"),
           ("stall", "bold red"), ("B: heartbeat stall", "bold red"), ("A: heartbeat stall", "bold red"),
           ("same:", "bold green")]


def diff_text(text: str) -> Text:
    out = Text()
    # both sessions' text: control characters escaped, its own lines kept (workbench.textsafe)
    for line in escape_display(text, layout=True).splitlines():
        body = line.strip()
        style = next((s for prefix, s in _STYLES if body.startswith(prefix)), "")
        if not style and line.startswith("  ") and not line.startswith("    ") and body.endswith(":"):
            style = "bold underline"   # a section: messages, execs, tool calls, …
        out.append(line + "\n", style)
    return out


class DiffScreen(Loader, ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "dismiss", "Close")]

    def __init__(self, a: str, b: str, ctx: TuiContext) -> None:
        super().__init__(classes="wb-modal", id="diff-screen")
        self.a, self.b = a, b
        self.ctx = ctx
        self.diff: Diff | None = None

    def compose(self) -> ComposeResult:
        with Vertical(classes="wb-modal-box"):
            yield Static(Text(f"diff  A {self.a}  B {self.b}", "bold"), classes="wb-modal-title")
            with VerticalScroll(id="diff-scroll"):
                yield Static(Text("comparing…", "dim"), id="diff-body")
            yield Static(Text("esc to close", "dim"))

    def on_mount(self) -> None:
        data, a, b = self.ctx.data, self.a, self.b

        def fetch() -> Diff:
            # deferred: the TUI starts without the decoder and the analysis, which a diff needs
            from workbench.report.session import load_session
            from workbench.sessiondiff.compare import diff_sessions

            return diff_sessions(load_session(data, a), load_session(data, b))

        self.load(fetch, self._show, group="diff", what=f"comparing {a} with {b}")

    def _show(self, d: Diff) -> None:
        from workbench.sessiondiff.render import human  # deferred with the diff (above)

        self.diff = d
        self.query_one("#diff-body", Static).update(diff_text(human(d)))
