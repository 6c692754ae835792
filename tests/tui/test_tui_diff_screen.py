"""The TUI's session diff: ``m`` on one session, ``m`` on another, and the diff of the two."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.widgets import DataTable, Static

from workbench.tui.app import WorkbenchApp
from workbench.tui.diff_screen import DiffScreen
from workbench.tui.sample_db import HANG_SESSION, OK_SESSION

SIZE = (150, 45)
Wait = Callable[..., Any]


async def _pick(pilot: Any, table: DataTable[Any], session_id: str) -> None:
    table.move_cursor(row=table.get_row_index(session_id))
    await pilot.press("m")


async def test_mark_two_sessions_and_read_their_diff(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#sessions", DataTable)
        await wait_for(pilot, lambda: table.row_count == 3, what="sessions listed")
        await _pick(pilot, table, OK_SESSION)
        assert not isinstance(app.screen, DiffScreen)
        await _pick(pilot, table, HANG_SESSION)
        await wait_for(pilot, lambda: isinstance(app.screen, DiffScreen) and app.screen.diff is not None,
                       what="the diff computed")
        screen = app.screen
        assert isinstance(screen, DiffScreen) and screen.diff is not None
        assert (screen.a, screen.b) == (OK_SESSION, HANG_SESSION)
        assert not screen.diff.same and screen.diff.stall["b"] is not None and screen.diff.stall["a"] is None
        body = str(screen.query_one("#diff-body", Static).render())
        assert "first divergence:" in body and "heartbeat stall begins at seq 17" in body
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, DiffScreen), what="back to the list")
