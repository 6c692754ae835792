"""The TUI driven by real keystrokes under Pilot over real capture databases."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.syntax import Syntax
from rich.text import Text
from textual.widgets import DataTable, Input, Static

from workbench.decode.classify import default_decoder
from workbench.store.db import SessionInfo, Store
from workbench.store.reader import LiveService
from workbench.store.recorder import Recorder
from workbench.tui.app import WorkbenchApp
from workbench.tui.bridge_screen import BridgeScreen
from workbench.tui.detail import FrameDetailView
from workbench.tui.modals import BlobScreen, HelpScreen, ToolCallScreen
from workbench.tui.sample_db import BASE_US, ERR_SESSION, HANG_SESSION, _record, hang_turn, ok_turn
from workbench.tui.session_screen import SessionScreen
from workbench.tui.sessions_screen import SessionsScreen
from workbench.tui.timeline import Timeline

SIZE = (150, 45)
Wait = Callable[..., Any]


def _timeline(app: WorkbenchApp) -> Timeline:
    return app.screen.query_one("#timeline", Timeline)


def _ready(app: WorkbenchApp) -> bool:
    """The session screen shows real rows (index loaded and the first page painted)."""
    return isinstance(app.screen, SessionScreen) and _timeline(app).first_paint is not None and app.screen.side_ready


def _follow_state(app: WorkbenchApp) -> str:
    screen = app.screen
    if not isinstance(screen, SessionScreen):
        return f"screen {screen!r}"
    total = screen.index.total if screen.index is not None else None
    return (f"polling={screen._polling} max_seq={screen.max_seq} total={total} "
            f"workers={[(w.name, w.state.name) for w in app.workers]}")


def _plain(widget: Static) -> str:
    content: Any = widget.content
    if isinstance(content, Syntax):
        return content.code
    if isinstance(content, Text):
        return content.plain
    return str(content)


def _text(app: WorkbenchApp, selector: str) -> str:
    return _plain(app.screen.query_one(selector, Static))


async def test_open_session_from_list(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.screen.query_one("#sessions", DataTable).row_count == 3)
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("enter")            # the first row: the hang (sorted by start)
        await wait_for(pilot, lambda: _ready(app), what="first paint")
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        assert screen.session_id == HANG_SESSION
        tl = _timeline(app)
        assert tl.index is not None
        assert tl.index.total == 61
        assert len(tl.index) == 18            # 44 heartbeats folded into one row
        assert "61 frames" in _text(app, "#session-status")
        await pilot.press("escape")
        assert isinstance(app.screen, SessionsScreen)
        assert not app.errors


async def test_sessions_filter_and_sort(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db)
    async with app.run_test(size=SIZE) as pilot:
        table = app.screen.query_one("#sessions", DataTable)
        await wait_for(pilot, lambda: table.row_count == 3)
        await pilot.press("slash", *"rate", "enter")
        assert table.row_count == 1
        assert str(table.get_row_at(0)[0]) == ERR_SESSION
        await pilot.press("escape")
        assert table.row_count == 3
        screen = app.screen
        assert isinstance(screen, SessionsScreen)
        await pilot.press("s")                # start → duration
        assert screen.sort_key == "duration"
        assert str(table.get_row_at(0)[0]) == ERR_SESSION   # 0.4 s is the shortest
        await pilot.press("r")
        assert str(table.get_row_at(0)[0]) == HANG_SESSION


async def test_filter_frames_by_kind_direction_and_text(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        tl = _timeline(app)
        await pilot.press("slash", *"kind:exec dir:client", "enter")
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 2, what="filtered index")
        assert "2 of 61 frames match kind:exec dir:client" in _text(app, "#session-status")
        await wait_for(pilot, lambda: tl.rows_cache.get(tl.index.row(0).seq) is not None)  # type: ignore[union-attr]
        assert all(tl.rows_cache[r.seq]["direction"] == "client" for r in tl.index.rows(0, 2))  # type: ignore[union-attr]
        # text inside a decoded payload: the shell command only appears in protobuf bytes
        await pilot.press("slash")
        box = app.screen.query_one("#frame-filter", Input)
        box.value = ""
        await pilot.press(*"pytest", "enter")
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 5, what="text filter")
        await pilot.press("escape")
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 61, what="filter cleared")


async def test_detail_tabs_on_a_frame(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        detail = app.screen.query_one("#detail", FrameDetailView)
        await pilot.press(*["down"] * 14)     # seq 14: the shell exec
        await wait_for(pilot, lambda: detail.detail is not None and detail.detail.seq == 14, what="detail 14")
        tree = app.screen.query_one("#detail-tree")
        labels = []
        stack = [tree.root]  # type: ignore[attr-defined]
        while stack:
            node = stack.pop()
            labels.append(str(node.label))
            stack.extend(node.children)
        assert any('command: "pytest -q"' in lb for lb in labels)
        await pilot.press("o")
        assert detail.active == "tab-json"
        assert '"shell_stream_args"' in _text(app, "#detail-json")
        await pilot.press("x")
        assert detail.active == "tab-hex"
        hex_text = _text(app, "#detail-hex")
        assert "envelope header" in hex_text
        assert "length 40" in hex_text
        assert "00 00 00 00 28" in hex_text
        await pilot.press("t")
        assert detail.active == "tab-tree"


async def test_fold_expand_and_finding_jump(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        tl = _timeline(app)
        await pilot.press("end")
        assert tl.current is not None
        assert tl.current.fold
        await pilot.press("enter")            # unfold the heartbeat run
        assert tl.index is not None
        assert len(tl.index) == 18 + 44
        await pilot.press("enter")
        assert len(tl.index) == 18
        # findings panel: the blob miss (second row) → its evidence frames 5 and 6
        await pilot.press("f", "down", "enter")
        await wait_for(pilot, lambda: tl.current is not None and tl.current.seq == 5, what="jump to evidence")
        assert tl.evidence == {5, 6}
        assert tl.has_focus
        await pilot.press("right_square_bracket")
        assert tl.current is not None
        assert tl.current.seq == 6
        # the hang finding's evidence reaches into the folded run: it opens, the cursor lands on frame 14
        await pilot.press("f", "up", "enter")
        await wait_for(pilot, lambda: tl.current is not None and tl.current.seq == 14)
        assert tl.evidence == {14, 15, 16, 17}
        assert tl.index.row(tl.index.row_of_seq(17)).member


async def test_finding_jump_clears_a_filter_that_hides_evidence(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        tl = _timeline(app)
        await pilot.press("slash", *"kind:interaction_update.thinking", "enter")
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 2)
        await pilot.press("f", "enter")
        await wait_for(pilot, lambda: tl.current is not None and tl.current.seq == 14, what="jump after reload")
        assert tl.index is not None
        assert tl.index.total == 61


async def test_tool_call_blob_help_and_palette(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        await wait_for(pilot, lambda: app.screen.query_one("#tools-table", DataTable).row_count == 1)
        await pilot.press("c", "enter")
        assert isinstance(app.screen, ToolCallScreen)
        naive = _plain(app.screen.query_one("#col-args_naive").query(Static).last())
        assert '{"command{"command' in naive.replace("\n", "").replace(" ", "")
        await pilot.press("escape")
        await pilot.press("b", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, BlobScreen), what="blob screen")
        assert app.screen.data is not None
        assert b'"system"' in app.screen.data  # type: ignore[attr-defined]
        await pilot.press("escape")
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Start or stop replay at the recorded pace" in titles
        assert "Detail: hex dump" in titles
        await pilot.press("ctrl+p")
        await pilot.press(*"Detail: hex")
        await pilot.pause(0.5)
        await pilot.press("enter")
        detail = app.screen.query_one("#detail", FrameDetailView)
        await wait_for(pilot, lambda: detail.active == "tab-hex", what="palette command")


async def test_replay_to_the_end(tui_sample_db: Path, wait_for: Wait) -> None:
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        tl = _timeline(app)
        await wait_for(pilot, lambda: len(screen.findings_table.findings) == 3)
        await pilot.press("p")
        await wait_for(pilot, lambda: screen.replay is not None)
        await pilot.press("space")            # pause right away: step by hand first
        r = screen.replay
        assert r is not None
        await pilot.press(*["comma"] * (r.pos + 1))    # back to before the first frame
        assert r.pos == -1
        assert tl.index is not None
        assert tl.index.visible == 0
        await pilot.press("full_stop", "full_stop")
        assert r.pos == 1
        assert r.seq == r.pos
        assert tl.index is not None
        assert tl.index.visible == r.pos + 1
        assert screen.findings_table.lit == set()     # no evidence reached yet
        await pilot.press("comma")
        pos = r.pos
        await pilot.press(*["plus"] * 5, "i", "space")
        assert r.speed == 20.0
        assert r.skip_idle
        assert r.pos >= pos
        await wait_for(pilot, lambda: r.at_end, timeout=60, what="replay end")
        assert "frame 61/61" in _text(app, "#replay-bar")
        assert tl.index.visible == 61
        assert screen.findings_table.lit == {0, 1, 2}
        assert tl.current is not None
        assert tl.current.seq == 17
        assert tl.current.fold  # cursor follows the end
        await pilot.press("p")                # leave replay: everything visible again
        assert screen.replay is None
        assert screen.findings_table.lit is None


@pytest.mark.slow
async def test_follow_live_capture(tmp_path: Path, wait_for: Wait) -> None:
    """A capture in progress (writer + LiveService in this process): frames, sessions, findings appear."""
    db = tmp_path / "live.duckdb"
    dec = default_decoder()
    store = Store(db)
    service = LiveService(store.con, db)
    service.start()
    try:
        rec = Recorder(store)
        msgs = list(hang_turn())
        info = SessionInfo(HANG_SESSION, transport="run", status="open")
        _record(rec, dec, info, iter(msgs[:10]), BASE_US)
        rec.flush()
        app = WorkbenchApp(db, HANG_SESSION, follow=True, poll_interval=0.1)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: _ready(app))
            tl = _timeline(app)
            first = tl.index.total if tl.index is not None else 0
            assert first > 0
            assert app.data.live
            # more of the same session arrives, continuing its seq
            streams = {d: dec.stream("run", d) for d in ("client", "server")}
            for offset, direction, data in msgs[10:]:
                for f in streams[direction].feed(data):
                    rec.add(HANG_SESSION, BASE_US + int(offset * 1e6), direction, "run", "1", f)
            rec.flush()
            await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 61,
                           what=lambda: f"new frames (errors: {app.errors}, {_follow_state(app)})")
            assert tl.current is not None
            assert tl.current.fold  # the cursor stayed on the tail
            import pyarrow as pa

            from workbench.tui.sample_db import FINDING_TYPES
            screen = app.screen
            assert isinstance(screen, SessionScreen)
            # no findings rows yet: the incremental analyzer diagnoses the live capture
            await wait_for(pilot, lambda: "missing_stream_close" in {
                f.code for f in screen.findings_table.findings}, what="live findings")
            # once an analysis writes findings rows, those are shown
            store.insert_rows("findings", pa.Table.from_pylist([dict(
                session_id=HANG_SESSION, code="exec_no_stream_close", severity="error", message="stored",
                first_seq=14, last_seq=60, evidence=[14], suggested_fix="", created_at=None)],
                schema=pa.schema(list(FINDING_TYPES.items()))))
            await wait_for(pilot, lambda: [f.message for f in screen.findings_table.findings] == ["stored"],
                           what="stored finding")
            # a new session shows up on the sessions screen
            _record(rec, dec, SessionInfo("second", transport="run"), ok_turn(), BASE_US + 10**9)
            rec.flush()
            await pilot.press("escape")
            table = app.screen.query_one("#sessions", DataTable)
            await wait_for(pilot, lambda: table.row_count == 2, what="new session")
            assert not app.errors
    finally:
        service.stop()
        store.close()


async def test_database_errors_are_reported_not_raised(tmp_path: Path, wait_for: Wait) -> None:
    db = tmp_path / "gone.duckdb"
    Store(db).close()
    app = WorkbenchApp(db, follow=True, poll_interval=0.1)   # follow: the file is opened per query
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _text(app, "#sessions-status") != "")
        db.unlink()
        await wait_for(pilot, lambda: app.errors, what="reported error")
        # the message names the file (the exact wording depends on when the file vanished)
        assert str(db) in app.errors[0]
        assert "no such capture database" in app.errors[0] or "does not exist" in app.errors[0]
        assert app.is_running


async def test_kind_picker_and_direction_cycle(tui_sample_db: Path, wait_for: Wait) -> None:
    from textual.widgets import OptionList

    from workbench.tui.modals import KindPicker

    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        tl = _timeline(app)
        await pilot.press("k")
        await wait_for(pilot, lambda: isinstance(app.screen, KindPicker), what="kind picker")
        picker = app.screen
        assert isinstance(picker, KindPicker)
        assert picker.kinds[0] == ("interaction_update.heartbeat", 37)   # most frequent first
        options = picker.query_one(OptionList)
        target = [o.id for o in (options.get_option_at_index(i) for i in range(options.option_count))].index(
            "exec_server_message.shell_stream_args")
        await pilot.press(*["down"] * target, "enter")
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 1, what="kind filter")
        assert "kind:exec_server_message.shell_stream_args" in _text(app, "#session-status")
        await pilot.press("escape")
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 61)
        await pilot.press("d")                 # client only
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total < 61 and "dir:client" in _text(
            app, "#session-status"))
        await pilot.press("d")                 # server only
        await wait_for(pilot, lambda: "dir:server" in _text(app, "#session-status"))
        await pilot.press("d")                 # both again
        await wait_for(pilot, lambda: tl.index is not None and tl.index.total == 61)


async def test_opened_on_a_session_only_that_screen_is_built(tui_sample_db: Path, wait_for: Wait) -> None:
    """`workbench tui DB SESSION`: the sessions list is not built for the first paint; going back
    makes it (issue 24: build only what the first screen shows)."""
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: _ready(app))
        assert not any(isinstance(s, SessionsScreen) for s in app.screen_stack)
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen)
                       and app.screen.query_one("#sessions", DataTable).row_count == 3, what="sessions list")
        await pilot.press("enter")            # and into a session again, over the list this time
        await wait_for(pilot, lambda: _ready(app))
        await pilot.press("escape")
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen))
        assert not app.errors


async def test_a_long_session_paints_from_a_prefix_then_reads_the_whole_index(
        tui_sample_db: Path, wait_for: Wait, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 24: the first rows come from an index of the first PREFIX_SEQS frames (here 20 of
    61), the whole index follows; a jump asked for meanwhile waits for it."""
    from workbench.tui import session_screen

    monkeypatch.setattr(session_screen, "PREFIX_SEQS", 20)
    app = WorkbenchApp(tui_sample_db, HANG_SESSION)
    asked: list[int | None] = []
    real = app.data.frame_index

    def spy(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("upto_seq"))
        return real(*args, **kwargs)

    monkeypatch.setattr(app.data, "frame_index", spy)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionScreen) and app.screen.index is not None)
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        screen.jump_to_evidence([60])          # past the prefix: done once the whole index is there
        await wait_for(pilot, lambda: screen.index_complete, what="the whole index")
        tl = _timeline(app)
        assert asked[:2] == [19, 60]
        assert tl.index is not None and tl.index.total == 61
        await wait_for(pilot, lambda: tl.current is not None and tl.current.seq == 60, what="jump to 60")
        assert "61 frames" in _text(app, "#session-status")
        assert not app.errors


async def test_bridge_screen_on_a_session_without_links_says_so(tui_sample_db: Path, wait_for: Wait) -> None:
    """``B`` on a session without a bridge link opens the bridge screen, which reads in a worker and then
    says the session is not linked, leaving both tables empty."""
    app = WorkbenchApp(tui_sample_db)
    async with app.run_test(size=(150, 45)) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, SessionsScreen) and app.screen.selected_id(),
                       what="the sessions list")
        sid = app.screen.selected_id()
        await pilot.press("B")
        await wait_for(pilot, lambda: isinstance(app.screen, BridgeScreen), what="the bridge screen")
        info = app.screen.query_one("#bridge-info", Static)
        await wait_for(pilot, lambda: "not linked" in str(info.render()), what="the not-linked message")
        assert sid in str(info.render())
        assert app.screen.query_one("#bridge-openai", DataTable).row_count == 0
        assert app.screen.query_one("#bridge-agent", DataTable).row_count == 0
