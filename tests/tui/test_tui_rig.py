"""The TUI over sessions the rig recorded (simulated backend + built-in client, real HTTP/2 + TLS)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from workbench.tui.app import WorkbenchApp
from workbench.tui.session_screen import SessionScreen
from workbench.tui.sessions_screen import SessionsScreen
from workbench.tui.timeline import Timeline

pytestmark = pytest.mark.slow  # starts subprocesses or servers

Wait = Callable[..., Any]


async def test_rig_session_finding_blobs_and_replay(tui_rig_db: tuple[Path, dict[str, str]], wait_for: Wait) -> None:
    db, ids = tui_rig_db
    app = WorkbenchApp(db)
    async with app.run_test(size=(150, 45)) as pilot:
        table = app.screen.query_one("#sessions", DataTable)
        await wait_for(pilot, lambda: table.row_count == 2)
        sessions = app.screen
        assert isinstance(sessions, SessionsScreen)
        assert {s.source for s in sessions.sessions} == {"client"}
        miss = next(s for s in sessions.sessions if s.session_id == ids["blob_miss"])
        assert miss.findings.get("warning", 0) >= 1
        # pick the blob_miss session with the keyboard
        row = [str(table.get_row_at(i)[0]) for i in range(table.row_count)].index(ids["blob_miss"])
        await pilot.press(*["down"] * row, "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionScreen)
                       and app.screen.query_one(Timeline).first_paint is not None and app.screen.side_ready)
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        tl = screen.timeline
        await wait_for(pilot, lambda: bool(screen.findings_table.findings))
        codes = [f.code for f in screen.findings_table.findings]
        assert "blob_miss" in codes
        await pilot.press("f", *["down"] * codes.index("blob_miss"), "enter")
        evidence = screen.findings_table.findings[codes.index("blob_miss")].evidence
        await wait_for(pilot, lambda: tl.current is not None and tl.current.seq == evidence[0])
        await wait_for(pilot, lambda: tl.rows_cache.get(evidence[0]) is not None)
        assert tl.rows_cache[evidence[0]]["kind"] == "kv_server_message.get_blob_args"
        blobs = screen.query_one("#blobs-table", DataTable)
        assert any(b["status"] == "miss" for b in blobs.records)  # type: ignore[attr-defined]
        # replay the recorded session to its end at top speed
        await pilot.press("p")
        await wait_for(pilot, lambda: screen.replay is not None)
        await pilot.press(*["plus"] * 5, "i")
        replay = screen.replay
        assert replay is not None
        await wait_for(pilot, lambda: replay.at_end, timeout=60, what="replay end")
        assert tl.index is not None
        assert tl.index.visible == tl.index.total
        assert f"frame {len(replay)}/{len(replay)}" in replay.describe()
        assert not app.errors
