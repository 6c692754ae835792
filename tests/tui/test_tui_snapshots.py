"""SVG snapshots of each screen (pytest-textual-snapshot); update with `pytest --snapshot-update`.

The demo database has fixed timestamps and ids, the terminal a fixed size, and each snapshot
waits for the data workers to finish, so the pictures are deterministic.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from support import wait_until_async
from textual.pilot import Pilot
from textual.widgets import DataTable

from workbench.tui.app import WorkbenchApp
from workbench.tui.detail import FrameDetailView
from workbench.tui.modals import ToolCallScreen
from workbench.tui.sample_db import HANG_SESSION
from workbench.tui.session_screen import SessionScreen
from workbench.tui.timeline import Timeline

SIZE = (150, 42)
Snap = Callable[..., bool]


async def _until(pilot: Pilot[Any], cond: Callable[[], object], timeout: float = 30) -> None:
    await wait_until_async(cond, timeout=timeout, interval=0, what="the snapshot's set-up",
                           pause=lambda: pilot.pause(0.02))


async def _session_ready(pilot: Pilot[Any]) -> None:
    app = pilot.app
    await _until(pilot, lambda: isinstance(app.screen, SessionScreen)
                 and app.screen.query_one(Timeline).first_paint is not None and app.screen.side_ready)
    screen = app.screen
    assert isinstance(screen, SessionScreen)
    await _until(pilot, lambda: len(screen.findings_table.findings) == 3)
    detail = screen.query_one(FrameDetailView)
    await _until(pilot, lambda: detail.detail is not None)
    await _until(pilot, lambda: not any(w.is_running for w in app.workers))


def _session_then(*keys: str, seq: int | None = None) -> Callable[[Pilot[Any]], Awaitable[None]]:
    async def run(pilot: Pilot[Any]) -> None:
        await _session_ready(pilot)
        if keys:
            await pilot.press(*keys)
        if seq is not None:
            detail = pilot.app.screen.query_one(FrameDetailView)
            await _until(pilot, lambda: detail.detail is not None and detail.detail.seq == seq)
        await _until(pilot, lambda: not any(w.is_running for w in pilot.app.workers))
        await pilot.pause(0.1)
    return run


def test_snapshot_sessions_screen(tui_sample_db: Path, snap_compare: Snap) -> None:
    async def ready(pilot: Pilot[Any]) -> None:
        await _until(pilot, lambda: pilot.app.screen.query_one("#sessions", DataTable).row_count == 3)
    assert snap_compare(WorkbenchApp(tui_sample_db), terminal_size=SIZE, run_before=ready)


def test_snapshot_session_tree_tab(tui_sample_db: Path, snap_compare: Snap) -> None:
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE,
                        run_before=_session_then(*["down"] * 14, seq=14))


def test_snapshot_session_json_tab(tui_sample_db: Path, snap_compare: Snap) -> None:
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE,
                        run_before=_session_then(*["down"] * 14, "o", seq=14))


def test_snapshot_session_hex_tab(tui_sample_db: Path, snap_compare: Snap) -> None:
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE,
                        run_before=_session_then(*["down"] * 14, "x", seq=14))


def test_snapshot_finding_evidence(tui_sample_db: Path, snap_compare: Snap) -> None:
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE,
                        run_before=_session_then("f", "enter", seq=14))


def test_snapshot_tool_call(tui_sample_db: Path, snap_compare: Snap) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await _session_ready(pilot)
        await pilot.press("c", "enter")
        await _until(pilot, lambda: isinstance(pilot.app.screen, ToolCallScreen))
        await pilot.pause(0.1)
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE, run_before=run)


def test_snapshot_blob(tui_sample_db: Path, snap_compare: Snap) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await _session_ready(pilot)
        await pilot.press("b", "enter")
        await _until(pilot, lambda: type(pilot.app.screen).__name__ == "BlobScreen")
        await pilot.pause(0.1)
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE, run_before=run)


def test_snapshot_replay_paused(tui_sample_db: Path, snap_compare: Snap) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await _session_ready(pilot)
        screen = pilot.app.screen
        assert isinstance(screen, SessionScreen)
        await pilot.press("p")
        await _until(pilot, lambda: screen.replay is not None)
        await pilot.press("space")
        replay = screen.replay
        assert replay is not None
        # a fixed position whatever the clock did meanwhile
        await pilot.press(*["comma"] * (replay.pos + 1), *["full_stop"] * 12, "plus", "plus")
        await _until(pilot, lambda: not any(w.is_running for w in pilot.app.workers))
        await pilot.pause(0.2)
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE, run_before=run)


def test_snapshot_help(tui_sample_db: Path, snap_compare: Snap) -> None:
    async def run(pilot: Pilot[Any]) -> None:
        await _session_ready(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.1)
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=SIZE, run_before=run)
