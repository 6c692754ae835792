"""The capture writer's hook (``stored.refresh_ended``) on the capture's real sink and store:
findings of a session are stored once it ends (when the capture is idle), again when it changes
after its end, never while it is open; the stamp tells clean from never analysed and from an
older analysis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from workbench.analysis import stored
from workbench.analysis.stamp import KEY_PREFIX, analysis_stamp, stamps
from workbench.analysis.stored import refresh_ended, refresh_stale, stale_sessions
from workbench.capture.sink import Sink, SinkConfig
from workbench.decode.classify import default_decoder
from workbench.overview import finding_states
from workbench.store.db import SessionInfo, Store
from workbench.tui.sample_db import BASE_US, hang_turn, ok_turn


def _emit(sink: Sink, info: SessionInfo, start_us: int, msgs: Any) -> None:
    """Frames of a sample turn into the capture's sink, as the writer hands them over."""
    sink.open_session(info)
    dec = default_decoder()
    streams = {d: dec.stream("run", d) for d in ("client", "server")}
    for offset, direction, data in msgs:
        for f in streams[direction].feed(data):
            sink.emit(info.session_id, start_us + int(offset * 1_000_000), direction, "run", "1", f)


def _end(sink: Sink, sid: str, status: str = "complete") -> None:
    info = sink.get_session(sid)
    assert info is not None
    info.status = status
    sink.touch(sid)


@pytest.fixture
def sink(tmp_path: Path) -> Iterator[Sink]:
    """The capture's real sink on a fresh file, two sessions still open and committed."""
    problems: list[str] = []
    s = Sink(SinkConfig(str(tmp_path / "cap.duckdb"), live=False), problems.append)
    s.open()
    _emit(s, SessionInfo("hang", source="capture", transport="run"), BASE_US, hang_turn())
    _emit(s, SessionInfo("ok", source="capture", transport="run"), BASE_US + 600_000_000, ok_turn())
    s.flush()
    yield s
    s.close()
    assert problems == []


def _codes(store: Store, sid: str) -> list[str]:
    return sorted(store.query("SELECT code FROM findings WHERE session_id = ? AND severity <> 'note'",
                              [sid]).column(0).to_pylist())


def test_findings_stored_when_a_session_ends_and_again_when_it_changes(sink: Sink) -> None:
    store = sink.store
    assert store is not None
    assert refresh_ended(sink) == []  # both still open: nothing analysed, nothing stamped
    assert stamps(store.query) == {}
    states = finding_states(store, {"hang": "open", "ok": "open"})
    assert {s.analysis for s in states.values()} == {"open"}

    _end(sink, "hang", "incomplete")
    sink.flush()
    assert refresh_ended(sink) == ["hang"]
    assert "missing_stream_close" in _codes(store, "hang")
    assert stamps(store.query) == {"hang": analysis_stamp()}
    assert refresh_ended(sink) == []  # unchanged since: not analysed twice

    _end(sink, "ok")
    sink.flush()
    assert refresh_ended(sink, final=True) == ["ok"]
    states = finding_states(store, {"hang": "incomplete", "ok": "complete"})
    assert (states["ok"].analysis, states["ok"].findings, states["ok"].text()) == ("current", 0, "0")
    assert states["hang"].findings >= 3 and states["hang"].notes == 1

    # frames after its end (a late append): the session is analysed again, once the capture is idle
    _emit(sink, sink.get_session("ok"), BASE_US + 700_000_000, ok_turn())  # type: ignore[arg-type]
    sink.flush()
    assert refresh_ended(sink) == []      # frames were committed this tick: busy
    assert refresh_ended(sink) == ["ok"]  # the next tick is idle


def test_busy_ticks_wait_and_many_ended_sessions_are_spread(sink: Sink, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stored, "TICK_BUDGET_S", 0.0)
    _end(sink, "hang")
    _end(sink, "ok")
    _emit(sink, SessionInfo("third", source="capture", transport="run"), BASE_US + 900_000_000, ok_turn())
    sink.flush()
    assert refresh_ended(sink) == []  # traffic this tick: the analysis waits
    first = refresh_ended(sink)
    assert len(first) == 1  # one session per tick at least, the next one at the next tick
    assert refresh_ended(sink) == [s for s in ("hang", "ok") if s not in first]
    assert refresh_ended(sink) == []
    # under constant traffic a session that waited MAX_WAIT_S is analysed anyway
    monkeypatch.setattr(stored, "MAX_WAIT_S", 0.0)
    _end(sink, "third")
    _emit(sink, SessionInfo("fourth", source="capture", transport="run"), BASE_US + 990_000_000, ok_turn())
    sink.flush()
    assert refresh_ended(sink) == ["third"]


def test_an_older_analysis_is_stale_and_recomputed(sink: Sink) -> None:
    store = sink.store
    assert store is not None
    _end(sink, "hang")
    _end(sink, "ok")
    sink.flush()
    refresh_ended(sink, final=True)
    assert stale_sessions(store) == []
    with store.transaction():
        store.con.execute("UPDATE meta SET value = 'a1 wb0.0.9' WHERE key = ?", [KEY_PREFIX + "hang"])
        store.con.execute("DELETE FROM meta WHERE key = ?", [KEY_PREFIX + "ok"])
        store.con.execute("DELETE FROM findings")
    states = finding_states(store, {"hang": "complete", "ok": "complete"})
    assert (states["hang"].analysis, states["ok"].analysis) == ("stale", "not analysed")
    assert states["ok"].text() == "not analysed"  # never 0 for a session nobody analysed
    assert sorted(refresh_stale(store)) == ["hang", "ok"]
    assert stamps(store.query) == {"hang": analysis_stamp(), "ok": analysis_stamp()}
    assert "missing_stream_close" in _codes(store, "hang")


def test_a_budget_stops_starting_sessions_and_leaves_the_rest_not_analysed(sink: Sink) -> None:
    """An import (or a listing) analyses within a time budget; what it did not reach stays "not
    analysed" rather than shown clean."""
    for sid in ("hang", "ok"):
        _end(sink, sid)
    sink.flush()
    assert sink.store is not None
    assert stored.refresh_findings(sink.store, ["hang", "ok"], budget_s=-1.0) == {}  # already spent
    assert sorted(stale_sessions(sink.store)) == ["hang", "ok"]
    assert sorted(stored.refresh_findings(sink.store, ["hang", "ok"], budget_s=60.0)) == ["hang", "ok"]
    assert stale_sessions(sink.store) == []
