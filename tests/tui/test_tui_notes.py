"""Notes in the TUI (issue 21, item 3): after the findings, counted apart, never as a finding; a
session nobody analysed says so instead of showing no finding."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, TabbedContent

from workbench.analysis import analyze
from workbench.decode.classify import default_decoder
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.tui.app import WorkbenchApp
from workbench.tui.sample_db import BASE_US, _record, hang_turn, ok_turn
from workbench.tui.session_screen import SessionScreen

SIZE = (150, 45)
Wait = Callable[..., Any]


@pytest.fixture
def analysed_db(tmp_path: Path) -> Path:
    """A hang (errors, a warning and the cumulative-args note, from the real analysis) and a clean
    turn nobody analysed."""
    db = tmp_path / "notes.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        _record(rec, default_decoder(), SessionInfo("hang", source="capture", transport="run", status="incomplete"),
                hang_turn(), BASE_US)
        _record(rec, default_decoder(), SessionInfo("fresh", source="capture", transport="run", status="complete"),
                ok_turn(), BASE_US + 600_000_000)
        rec.flush()
        analyze(store, ["hang"])
    return db


async def test_notes_follow_the_findings_and_are_counted_apart(analysed_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(analysed_db, "hang")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionScreen) and app.screen.side_ready
                       and len(app.screen.findings_table.findings) == 5, what="findings")
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        shown = [(f.severity, f.code) for f in screen.findings_table.findings]
        assert shown[-1] == ("note", "args_cumulative_snapshots")
        assert all(sev in ("error", "warning") for sev, _ in shown[:-1])
        table = screen.findings_table
        assert str(table.get_row_at(table.row_count - 1)[1]).startswith("note")  # the last row on screen too
        label = screen.query_one("#panels", TabbedContent).get_tab("findings").label
        await wait_for(pilot, lambda: "Findings (4 + 1 note)" in str(label), what=str(label))


async def test_sessions_list_counts_notes_apart_and_says_not_analysed(analysed_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(analysed_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one("#sessions", DataTable).row_count == 2)
        table = app.screen.query_one("#sessions", DataTable)
        cells = {key.value: str(table.get_cell(key, "findings")) for key in table.rows}
        assert cells["hang"].split() == ["3E", "1W", "1N"]
        assert cells["fresh"] == "not analysed"
