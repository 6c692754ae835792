"""The capture writer's hook (``stored.refresh_ended``) on a real store and recorder: findings of
a session are stored once it ends, again when it changes after its end, never while it is open;
the stamp tells clean from never analysed and from an older analysis."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from workbench.analysis import stored
from workbench.analysis.stamp import KEY_PREFIX, analysis_stamp, stamps
from workbench.analysis.stored import refresh_ended, refresh_stale, stale_sessions
from workbench.decode.classify import default_decoder
from workbench.overview import finding_states
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.tui.sample_db import BASE_US, _record, hang_turn, ok_turn


def _sink(tmp_path: Path) -> SimpleNamespace:
    store = Store(tmp_path / "cap.duckdb")
    rec = Recorder(store)
    dec = default_decoder()
    _record(rec, dec, SessionInfo("hang", source="capture", transport="run"), hang_turn(), BASE_US)
    _record(rec, dec, SessionInfo("ok", source="capture", transport="run"), ok_turn(), BASE_US + 600_000_000)
    rec.flush()
    return SimpleNamespace(store=store, recorder=rec)


def _codes(store: Store, sid: str) -> list[str]:
    return sorted(store.query("SELECT code FROM findings WHERE session_id = ? AND severity <> 'note'",
                              [sid]).column(0).to_pylist())


def test_findings_stored_when_a_session_ends_and_again_when_it_changes(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    store, rec = sink.store, sink.recorder
    try:
        assert refresh_ended(sink) == []  # both still open: nothing analysed, nothing stamped
        assert stamps(store.query) == {}
        states = finding_states(store.query, {"hang": "open", "ok": "open"})
        assert {s.analysis for s in states.values()} == {"open"}

        rec.sessions["hang"].status = "incomplete"
        rec.touch("hang")
        rec.flush()
        assert refresh_ended(sink) == ["hang"]
        assert "missing_stream_close" in _codes(store, "hang")
        assert stamps(store.query) == {"hang": analysis_stamp()}
        assert refresh_ended(sink) == []  # unchanged since: not analysed twice

        rec.sessions["ok"].status = "complete"
        rec.touch("ok")
        rec.flush()
        assert refresh_ended(sink, final=True) == ["ok"]
        states = finding_states(store.query, {"hang": "incomplete", "ok": "complete"})
        assert (states["ok"].analysis, states["ok"].findings, states["ok"].text()) == ("current", 0, "0")
        assert states["hang"].findings >= 3 and states["hang"].notes == 1

        # frames after its end (a late append): the session is analysed again
        _record(rec, default_decoder(), rec.sessions["ok"], ok_turn(), BASE_US + 700_000_000)
        rec.flush()
        assert refresh_ended(sink) == ["ok"]
    finally:
        store.close()


def test_many_ended_sessions_are_spread_over_ticks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sink = _sink(tmp_path)
    store, rec = sink.store, sink.recorder
    monkeypatch.setattr(stored, "TICK_BUDGET_S", 0.0)
    try:
        for sid in ("hang", "ok"):
            rec.sessions[sid].status = "complete"
            rec.touch(sid)
        rec.flush()
        first = refresh_ended(sink)
        assert len(first) == 1  # one session per tick at least, the next one at the next tick
        assert refresh_ended(sink) == [s for s in ("hang", "ok") if s not in first]
        assert refresh_ended(sink) == []
    finally:
        store.close()


def test_an_older_analysis_is_stale_and_recomputed(tmp_path: Path) -> None:
    sink = _sink(tmp_path)
    store, rec = sink.store, sink.recorder
    try:
        for sid in ("hang", "ok"):
            rec.sessions[sid].status = "complete"
            rec.touch(sid)
        rec.flush()
        refresh_ended(sink, final=True)
        assert stale_sessions(store) == []
        with store.transaction():
            store.con.execute("UPDATE meta SET value = 'a1 wb0.0.9' WHERE key = ?", [KEY_PREFIX + "hang"])
            store.con.execute("DELETE FROM meta WHERE key = ?", [KEY_PREFIX + "ok"])
            store.con.execute("DELETE FROM findings")
        states = finding_states(store.query, {"hang": "complete", "ok": "complete"})
        assert (states["hang"].analysis, states["ok"].analysis) == ("stale", "not analysed")
        assert states["ok"].text() == "not analysed"  # never 0 for a session nobody analysed
        assert sorted(refresh_stale(store)) == ["hang", "ok"]
        assert stamps(store.query) == {"hang": analysis_stamp(), "ok": analysis_stamp()}
        assert "missing_stream_close" in _codes(store, "hang")
    finally:
        store.close()
