"""The right-hand column of the session screen: the frame detail over the findings, tool-call and
blob panels.

It is built after the timeline's first rows are on screen (``build``): the tabs, trees and tables
are most of what styling and layout cost when a session opens, and the timeline is what the user
reads first. Until then the column is an empty pane of the same width, so nothing moves.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static, TabbedContent, TabPane

from workbench.tui.detail import FrameDetailView
from workbench.tui.panels import BlobsTable, FindingsTable, ToolCallsTable


class SessionSide(Vertical):
    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.built = False   # build() started
        self.ready = False   # build() finished: every widget of the column is mounted

    def compose(self) -> ComposeResult:
        if not self.built:
            return
        yield FrameDetailView(id="detail")
        with TabbedContent(id="panels"):  # the first pane; no `initial`: see SessionSide.build
            with TabPane("Findings", id="findings"), Vertical():
                yield FindingsTable(id="findings-table")
                yield Static("", id="finding-text")
            with TabPane("Tool calls", id="tool-calls"):
                yield ToolCallsTable(id="tools-table")
            with TabPane("Blobs", id="blobs"):
                yield BlobsTable(id="blobs-table")

    async def build(self) -> bool:
        """Mount the detail and the panels (once); False when the screen went away meanwhile."""
        if not self.built:
            self.built = True
            await self.recompose()
            self.ready = bool(self.query(BlobsTable))
        return self.ready
