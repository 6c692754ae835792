"""The TUI on a 120×40 terminal: statuses, labels, summaries and finding messages stay readable.

Each test reads the screen as the user sees it (the compositor's lines) and checks that what
matters is on it uncut, then compares an SVG snapshot at that size. Findings are listed root cause
first (``workbench.analysis.causes.order_findings``), not worst severity first.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from support import wait_until_async
from textual.pilot import Pilot
from textual.widgets import DataTable

from workbench.store.db import SessionInfo, Store
from workbench.tui.app import WorkbenchApp
from workbench.tui.data import TuiData
from workbench.tui.detail import FrameDetailView
from workbench.tui.panels import FindingsTable
from workbench.tui.sample_db import ERR_SESSION, HANG_SESSION, OK_SESSION
from workbench.tui.session_screen import SessionScreen
from workbench.tui.timeline import Timeline

NARROW = (120, 40)
Snap = Callable[..., bool]


async def _until(pilot: Pilot[Any], cond: Callable[[], object], timeout: float = 30) -> None:
    await wait_until_async(cond, timeout=timeout, interval=0, what="the 120x40 set-up",
                           pause=lambda: pilot.pause(0.02))


def screen_lines(app: WorkbenchApp) -> list[str]:
    """The terminal's lines as drawn."""
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


async def _sessions_ready(pilot: Pilot[Any]) -> None:
    await _until(pilot, lambda: pilot.app.screen.query_one("#sessions", DataTable).row_count == 3)
    await _until(pilot, lambda: not any(w.is_running for w in pilot.app.workers))
    await pilot.pause(0.1)


async def _session_ready(pilot: Pilot[Any]) -> None:
    app = pilot.app
    await _until(pilot, lambda: isinstance(app.screen, SessionScreen)
                 and app.screen.query_one(Timeline).first_paint is not None and app.screen.side_ready)
    screen = app.screen
    assert isinstance(screen, SessionScreen)
    await _until(pilot, lambda: len(screen.findings_table.findings) == 3)
    await _until(pilot, lambda: screen.query_one(FrameDetailView).detail is not None)
    await _until(pilot, lambda: not any(w.is_running for w in app.workers))
    await pilot.pause(0.1)


async def test_sessions_screen_at_120_columns_shows_status_label_and_top_finding(tui_sample_db: Path) -> None:
    app = WorkbenchApp(tui_sample_db)
    async with app.run_test(size=NARROW) as pilot:
        await _sessions_ready(pilot)
        lines = screen_lines(app)
        text = "\n".join(lines)
        head = next(i for i, line in enumerate(lines) if "top finding" in line)
        rows = {line.split()[0].rstrip("…"): line for line in lines[head + 1: head + 4]}
        assert len(rows) == 3, text
        hang = next(v for k, v in rows.items() if HANG_SESSION.startswith(k))
        ok = next(v for k, v in rows.items() if OK_SESSION.startswith(k))
        err = next(v for k, v in rows.items() if ERR_SESSION.startswith(k))
        # whole words: a status cut to "incompl" or a label cut short fails here
        assert " incomplete " in hang and " run the tests " in hang and " exec_no_stream_close " in hang
        assert " complete " in ok and " say hello " in ok
        assert " error " in err and " rate_limit " in err
        # the selected session in full, with its top finding's message
        assert HANG_SESSION in text
        assert "exec_no_stream_close: exec 7 (shell_stream_args) got results but no stream_close" in text
        assert not app.errors


async def test_session_screen_at_120_columns_shows_status_summaries_and_messages(tui_sample_db: Path) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=NARROW) as pilot:
        await _session_ready(pilot)
        lines = screen_lines(app)
        text = "\n".join(lines)
        assert "incomplete  run-7f3a-shell-hang  “run the tests”" in text
        # summaries keep 30+ characters next to a kind column that shrank
        assert 'thinking " I will call pytest."' in text
        assert "shell_stream_args \"pytes" in text
        # each finding's message under its code, in root-cause order
        table = app.screen.query_one(FindingsTable)
        assert table.narrow
        assert "exec 7 (shell_stream_args) got results" in text
        assert "get_blob for a blob the client does not" in text
        assert not app.errors


def test_findings_are_listed_root_cause_first(tmp_path: Path) -> None:
    """A stall: the symptom (error) was recorded first; the cause (warning) still leads."""
    import pyarrow as pa

    from workbench.tui.sample_db import FINDING_TYPES

    db = tmp_path / "causes.duckdb"
    with Store(db) as store:
        store.upsert_sessions([SessionInfo("s1", transport="run", status="incomplete")])
        rows = [
            {"session_id": "s1", "code": "stream_ended_without_turn_end", "severity": "error",
             "message": "the stream ended without turn_ended", "first_seq": 40, "last_seq": 40, "evidence": [40],
             "suggested_fix": None, "created_at": None},
            {"session_id": "s1", "code": "heartbeat_loop", "severity": "error", "message": "37 heartbeats",
             "first_seq": 12, "last_seq": 39, "evidence": [12, 39], "suggested_fix": None, "created_at": None},
            {"session_id": "s1", "code": "missing_stream_close", "severity": "warning",
             "message": "exec 1 answered without stream_close", "first_seq": 10, "last_seq": 11,
             "evidence": [10, 11], "suggested_fix": None, "created_at": None},
        ]
        store.insert_rows("findings", pa.Table.from_pylist(rows, schema=pa.schema(list(FINDING_TYPES.items()))),
                          replace_sessions=["s1"])
    data = TuiData(db)
    try:
        found = data.findings("s1")
        assert [f.code for f in found] == ["missing_stream_close", "heartbeat_loop",
                                              "stream_ended_without_turn_end"]
        assert [f.cause for f in found] == [None, "missing_stream_close", "heartbeat_loop"]
        (summary,) = data.sessions()
        assert summary.top_finding is not None and summary.top_finding.code == "missing_stream_close"
    finally:
        data.close()


def test_snapshot_sessions_screen_120x40(tui_sample_db: Path, snap_compare: Snap) -> None:
    assert snap_compare(WorkbenchApp(tui_sample_db), terminal_size=NARROW, run_before=_sessions_ready)


def test_snapshot_session_screen_120x40(tui_sample_db: Path, snap_compare: Snap) -> None:
    assert snap_compare(WorkbenchApp(tui_sample_db, HANG_SESSION), terminal_size=NARROW, run_before=_session_ready)
