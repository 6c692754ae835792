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
    assert analyze_session(analysis_store, b.done()).problems == []


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
    assert analyze_session(analysis_store, sid).problems == []  # 3 s < the usual 5 s
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
    assert analyze_session(analysis_store, b.done()).problems == []


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


def test_one_heartbeat_in_flight_is_judged_by_the_client_pace_not_the_server(analysis_store: Store) -> None:
    """Found by the healthy matrix (RunPoll, our client, a loaded machine): the server heartbeats every
    0.1 s, the client every 0.5 s, its two heartbeats before the end left together, and one more was
    in flight when the end came (0.2 s later). One gap says nothing about the client's pace and the
    server's spacing nothing at all: that frame is no sign the client missed the end."""
    b = SessionBuilder(analysis_store, transport="runpoll")
    b.run_request()
    for _ in range(6):
        b.heartbeat(dt_ms=100)
    b.client_heartbeat(dt_ms=10)
    b.client_heartbeat(dt_ms=7)  # queued behind the first, left with it
    b.text("done")
    b.turn_ended()
    b.end_stream()
    b.client_heartbeat(dt_ms=200)
    assert analyze_session(analysis_store, b.done()).problems == []


def _kv_turn(b: SessionBuilder, answer_ms: int) -> None:
    """A turn whose KV answers take ``answer_ms`` to come back (the path's round trip), the client
    beating every 50 ms (faster than that round trip, as test clients do on a loaded machine)."""
    b.run_request()
    for _ in range(4):
        b.client_heartbeat(dt_ms=50)
    b.set_blob(1, b"system prompt")
    b.ts += answer_ms * 1000
    b.set_blob_result(1)
    b.text("done")
    b.turn_ended()
    b.end_stream()


def test_a_heartbeat_in_flight_is_allowed_the_sessions_round_trip(analysis_store: Store) -> None:
    """Found by the import equivalence test under load (RunSSE through mitmdump, client beats every
    50 ms): a heartbeat sent just before the end reached the client was recorded 0.3 s after it.
    The session's own KV answers took 0.4 s: that is the path, not a client that missed the end."""
    b = SessionBuilder(analysis_store, transport="runsse")
    _kv_turn(b, answer_ms=400)
    b.client_heartbeat(dt_ms=300)
    assert analyze_session(analysis_store, b.done()).problems == []


def test_beating_on_beyond_the_round_trip_is_still_late(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse")
    _kv_turn(b, answer_ms=400)
    late = [b.client_heartbeat(dt_ms=300) for _ in range(3)]  # 0.3, 0.6, 0.9 s after the end
    [f] = analyze_session(analysis_store, b.done()).findings
    assert f.code == "end_stream_not_delivered"
    assert late[2] in f.evidence  # beyond 50 ms + 0.4 s
    assert late[0] not in f.evidence
    assert "slowest KV round trip of the session (0.4 s)" in f.message
