"""end_stream_not_delivered: client frames still arriving more than one heartbeat interval after the
server's end-stream mean the client never saw the end (a proxy held back END_STREAM)."""

from __future__ import annotations

import pytest
from analysis_helpers import SessionBuilder

from workbench.analysis import Config, analyze_session
from workbench.store.db import Store


def _turn(b: SessionBuilder, beats_before: int = 3) -> None:
    b.run_request()
    for _ in range(beats_before):
        b.client_heartbeat(dt_ms=5000)  # the client beats every 5 s
    b.text("done")
    b.checkpoint()


def test_client_that_saw_the_end_stops(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    _turn(b)
    b.turn_ended()
    b.end_stream()
    b.client_heartbeat(dt_ms=900)  # one in flight when the end arrived: normal
    assert analyze_session(analysis_store, b.done()).findings == []


def test_client_beating_on_after_the_end(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse")
    _turn(b)
    te = b.turn_ended()
    end = b.end_stream()
    late = [b.client_heartbeat(dt_ms=5000) for _ in range(3)]
    res = analyze_session(analysis_store, b.done())
    assert [f.code for f in res.findings] == ["end_stream_not_delivered"]
    f = res.findings[0]
    assert f.severity == "warning"
    assert {end, te, late[1], late[2]} <= set(f.evidence)
    assert late[0] not in f.evidence  # 5 s after the end: not more than one interval yet
    assert "3 frame(s)" in f.message
    assert "5.0 s" in f.message
    assert "client's heartbeat interval" in f.message
    assert "END_STREAM" in f.suggested_fix
    assert "proxy" in f.suggested_fix


def test_interval_falls_back_to_the_config(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    b.text("done")
    b.turn_ended()
    b.end_stream()
    late = b.client_heartbeat(dt_ms=3000)
    sid = b.done()
    assert analyze_session(analysis_store, sid).findings == []  # 3 s < the usual 5 s
    [f] = analyze_session(analysis_store, sid, Config(heartbeat_interval_s=2.0)).findings
    assert f.code == "end_stream_not_delivered"
    assert late in f.evidence


@pytest.mark.parametrize("order", ["causal", "body"])
def test_imports_without_frame_timing_are_not_judged(analysis_store: Store, order: str) -> None:
    b = SessionBuilder(analysis_store, meta={"timing": "per-message", "order": order})
    _turn(b)
    b.turn_ended()
    b.end_stream()
    for _ in range(3):
        b.client_heartbeat(dt_ms=5000)
    assert analyze_session(analysis_store, b.done()).findings == []


def test_a_new_run_after_the_end_is_not_late_traffic(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    _turn(b)
    b.turn_ended()
    b.end_stream()
    b.ts += 60_000_000
    b.run_request(text="next question, a minute later")
    b.client_heartbeat(dt_ms=5000)
    b.text("sure")
    b.turn_ended()
    b.end_stream()
    codes = [f.code for f in analyze_session(analysis_store, b.done()).findings]
    assert "end_stream_not_delivered" not in codes
