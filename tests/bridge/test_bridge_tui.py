"""The TUI opens both sides of a bridge beside each other, turn by turn (real Textual app under
Pilot, over a database a real capture wrote in front of ``workbench proxy``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bridge_rig import start_bridge_rig
from support import wait_until_async
from test_bridge_join import tool_turns
from textual.widgets import DataTable, Static

from workbench.tui.app import WorkbenchApp
from workbench.tui.bridge_screen import BridgeScreen


@pytest.fixture(scope="module")
def bridge_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    rig = start_bridge_rig(tmp_path_factory.mktemp("bridge-tui"))
    try:
        tool_turns(rig)
    finally:
        rig.stop()
    yield rig.db


def _column(table: DataTable, index: int) -> list[str]:  # type: ignore[type-arg]
    return [str(table.get_row_at(i)[index]) for i in range(table.row_count)]


@pytest.mark.slow
async def test_bridge_screen_side_by_side(bridge_db: Path) -> None:
    import duckdb

    con = duckdb.connect(str(bridge_db), read_only=True)
    try:
        run = con.execute("SELECT session_id FROM sessions WHERE transport = 'run' ORDER BY started_at LIMIT 1").fetchone()
    finally:
        con.close()
    assert run is not None
    app = WorkbenchApp(bridge_db, run[0])
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_until_async(lambda: getattr(app.screen, "session_id", None) == run[0], timeout=20,
                               pause=lambda: pilot.pause(0.02))
        await pilot.press("B")
        await wait_until_async(lambda: isinstance(app.screen, BridgeScreen), timeout=20, pause=lambda: pilot.pause(0.02))
        screen = app.screen
        assert isinstance(screen, BridgeScreen)
        # Both sides are read in a worker; the tables fill when the read is done.
        await wait_until_async(lambda: bool(screen.turns), timeout=20, pause=lambda: pilot.pause(0.02))
        assert len(screen.turns) == 2  # the tool call handed out, then the follow-up with its result
        left = screen.query_one("#bridge-openai", DataTable)
        right = screen.query_one("#bridge-agent", DataTable)
        assert left.row_count == right.row_count  # padded: each turn starts on the same row
        kinds_left, kinds_right = _column(left, 3), _column(right, 4)
        assert "openai.request" in kinds_left and "openai.delta.tool_calls" in kinds_left
        assert "openai.delta.content" in kinds_left and "run_request" in kinds_right
        assert "interaction_update.text_delta" in kinds_right
        turn2 = _column(left, 0).index("turn 2")
        assert _column(right, 1)[turn2] == "turn 2"
        # a healthy bridge: only the note of its hand-off (the run it left, closed at once)
        panel = str(screen.query_one("#bridge-findings", Static).render())
        assert [ln.split()[:2] for ln in panel.splitlines() if ln.strip()] == [["NOTE", "bridge_left_run"]], panel
        await pilot.press("escape")
        await wait_until_async(lambda: not isinstance(app.screen, BridgeScreen), timeout=20,
                               pause=lambda: pilot.pause(0.02))
