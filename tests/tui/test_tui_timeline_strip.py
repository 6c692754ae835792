"""The session screen's timeline strip (frames per interval by direction, the stall underlined; a
click or ``s`` jumps there) and ``r``, which writes the session's HTML report and shows its path."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from workbench.decode.classify import default_decoder
from workbench.store.db import SessionInfo, Store
from workbench.store.reader import LiveService
from workbench.store.recorder import Recorder
from workbench.tui.app import WorkbenchApp
from workbench.tui.sample_db import BASE_US, HANG_SESSION, OK_SESSION, _record, hang_turn
from workbench.tui.session_screen import SessionScreen
from workbench.tui.timeline import Timeline
from workbench.tui.timeline_strip import LABEL, TimelineStrip

SIZE = (150, 45)
Wait = Callable[..., Any]


def _strip(app: WorkbenchApp) -> TimelineStrip:
    return app.screen.query_one("#timeline-strip", TimelineStrip)


def _ready(app: WorkbenchApp) -> bool:
    return (isinstance(app.screen, SessionScreen) and app.screen.query_one(Timeline).first_paint is not None
            and _strip(app).data is not None)


def _line(strip: TimelineStrip, y: int) -> str:
    return "".join(seg.text for seg in strip.render_line(y))


def _current_seq(app: WorkbenchApp) -> int | None:
    cur = app.screen.query_one(Timeline).current
    return None if cur is None else cur.seq


async def test_strip_shows_the_stall_and_s_jumps_there(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app), what="session screen and strip")
        strip = _strip(app)
        data = strip.data
        assert data is not None and len(data.seq) == 61
        # the hang: the shell exec's results at 15-16, then nothing but heartbeats from 17 on
        assert data.stall_seq == 17 and data.stall_count >= 5
        client, server, marks = (_line(strip, y) for y in range(3))
        assert client.startswith("client") and server.startswith("server")
        assert any(ch in "▁▂▃▄▅▆▇█" for ch in server[LABEL:])
        assert "stall: " in marks and "seq 17" in marks and "▔" in marks
        a, b = strip.stall_columns()  # type: ignore[misc]
        assert marks[a] == "▔" and b > a   # underlines the stretch, not a single column
        assert _current_seq(app) == 0
        await pilot.press("s")
        await wait_for(pilot, lambda: _current_seq(app) == 17, what="cursor on the stall's first heartbeat")
        # a click on the strip's first column jumps back to the start
        await pilot.click("#timeline-strip", offset=(LABEL, 1))
        await wait_for(pilot, lambda: _current_seq(app) == 0, what="cursor on the first frame")


async def test_no_stall_in_a_healthy_session(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, OK_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        strip = _strip(app)
        assert strip.data is not None and strip.data.stall_seq is None
        assert "stall" not in _line(strip, 2) and "frames over" in _line(strip, 2)
        await pilot.press("s")
        await wait_for(pilot, lambda: any("no stall" in str(n.message) for n in app._notifications))


@pytest.mark.slow
async def test_strip_follows_a_capture_in_progress(tmp_path: Path, wait_for: Wait) -> None:
    """A capture in progress (writer + LiveService in this process): the strip catches up and the
    stall appears once the heartbeats have come."""
    db = tmp_path / "live.duckdb"
    dec = default_decoder()
    store = Store(db)
    service = LiveService(store.con, db)
    service.start()
    try:
        rec = Recorder(store)
        msgs = list(hang_turn())
        _record(rec, dec, SessionInfo(HANG_SESSION, transport="run", status="open"), iter(msgs[:12]), BASE_US)
        rec.flush()
        app = WorkbenchApp(db, HANG_SESSION, follow=True, poll_interval=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: _ready(app))
            strip = _strip(app)
            assert strip.data is not None and strip.data.stall_seq is None
            first = len(strip.data.seq)
            streams = {d: dec.stream("run", d) for d in ("client", "server")}
            for offset, direction, data in msgs[12:]:
                for f in streams[direction].feed(data):
                    rec.add(HANG_SESSION, BASE_US + int(offset * 1e6), direction, "run", "1", f)
            rec.flush()
            await wait_for(pilot, lambda: strip.data is not None and len(strip.data.seq) == 61,
                           what=lambda: f"the strip caught up ({first} frames at first)")
            assert strip.data is not None and strip.data.stall_seq == 17
            assert "stall: " in _line(strip, 2)
    finally:
        service.stop()
        store.close()


async def test_r_writes_the_report_and_shows_its_path(tui_sample_db: Path, tmp_path: Path, wait_for: Wait) -> None:
    db = tmp_path / "capture.duckdb"
    shutil.copy(tui_sample_db, db)
    app = WorkbenchApp(db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        await pilot.press("r")
        out = tmp_path / "reports" / f"{HANG_SESSION}.html"
        await wait_for(pilot, lambda: any(str(out) in str(n.message) for n in app._notifications),
                       timeout=60, what="the report's path shown")
        html = out.read_text()
        assert f'data-session="{HANG_SESSION}"' in html and "missing_stream_close" in html
