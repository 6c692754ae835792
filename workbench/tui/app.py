"""``workbench tui``: the Textual application (sessions → session → detail)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial
from pathlib import Path

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from workbench.decode.classify import Decoder
from workbench.textsafe import escape_display
from workbench.tui.context import TuiContext
from workbench.tui.data import TuiData
from workbench.tui.loading import LoadFailed
from workbench.tui.modals import HelpScreen
from workbench.tui.session_screen import SessionScreen
from workbench.tui.sessions_screen import SessionsScreen

log = logging.getLogger("workbench.tui")


class WorkbenchApp(App[None]):
    CSS_PATH = "workbench.tcss"
    TITLE = "workbench"
    BINDINGS = [
        Binding("question_mark", "help", "Help", show=True),
        # no description: the help screen (and its snapshot) list screen keys; the palette has it
        Binding("B", "bridge", "", show=False),
    ]

    def __init__(self, db_path: str | Path, session: str | None = None, *, follow: bool = False,
                 decoder: Decoder | None = None, poll_interval: float = 0.5, data: TuiData | None = None) -> None:
        super().__init__()
        self.data = data or TuiData(db_path, decoder, transient=follow)
        self.ctx = TuiContext(self.data, follow, poll_interval)
        self.initial_session = session
        self.errors: list[str] = []

    def on_mount(self) -> None:
        # Opened on a session, only that screen is built: the sessions list is made when the
        # user goes back to it (its first paint does not wait for a screen it does not show).
        if self.initial_session:
            self.open_session(self.initial_session)
        else:
            self.push_screen(SessionsScreen(self.ctx))

    def open_session(self, session_id: str) -> None:
        self.push_screen(SessionScreen(session_id, self.ctx))

    def on_sessions_screen_open_session(self, message: SessionsScreen.OpenSession) -> None:
        self.open_session(message.session_id)

    def on_session_screen_closed(self, message: SessionScreen.Closed) -> None:
        if any(isinstance(s, SessionsScreen) for s in self.screen_stack):
            self.pop_screen()
        else:
            self.switch_screen(SessionsScreen(self.ctx))

    def action_bridge(self) -> None:
        """Both sides of a bridge for the session shown or selected (``bridge_screen``)."""
        # deferred: the bridge screen brings the bridge analysis (its rules, pyarrow.compute: ≈ 90 ms),
        # which the first paint has no use for
        from workbench.tui.bridge_screen import BridgeScreen

        screen = self.screen
        sid = getattr(screen, "session_id", None)
        if sid is None and isinstance(screen, SessionsScreen):
            sid = screen.selected_id()
        if sid and not isinstance(screen, BridgeScreen):
            self.push_screen(BridgeScreen(sid, self.ctx))

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            return
        keys = [(" ".join(self.get_key_display(Binding(k, b.action)) for k in b.key.split(",")), b.description)
                for b in _bindings(self.screen) if b.description]
        self.push_screen(HelpScreen(keys))

    def on_load_failed(self, message: LoadFailed) -> None:
        """The one place database and decoding errors end up: tell the user, keep the details."""
        text = f"{message.what}: {message.error}"
        self.errors.append(text)
        log.error("%s", text, exc_info=message.error)
        self.log.error(text)
        # plain text: the error may quote the capture (ids, kinds, messages), never markup
        self.notify(escape_display(text, layout=True), title="error", severity="error", timeout=8, markup=False)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Help", "Keys and filter syntax", self.action_help)
        yield SystemCommand("Both sides of a bridge (B)", "the OpenAI requests and their agent runs, turn by turn",
                            self.action_bridge)
        helps: dict[str, str] = getattr(screen, "COMMANDS_HELP", {})
        for action, text in helps.items():
            yield SystemCommand(text, f"action {action}", partial(screen.run_action, action))

    def on_unmount(self) -> None:
        self.data.close()


def _bindings(screen: Screen[object]) -> list[Binding]:
    out: list[Binding] = []
    for b in [*getattr(screen, "BINDINGS", []), *WorkbenchApp.BINDINGS]:
        if isinstance(b, Binding):
            out.append(b)
    return out


def run_app(db_path: str | Path, session: str | None = None, *, follow: bool = False) -> None:
    """Open the TUI on a database (for callers other than the CLI, e.g. ``workbench demo``)."""
    WorkbenchApp(db_path, session, follow=follow).run()
