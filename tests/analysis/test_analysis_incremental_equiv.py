"""The batch analysis (SQL aggregates + a walk over the interesting frames) and the incremental one
(every row through the walk, fed in pages) must agree, whatever the page boundaries."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from analysis_helpers import SessionBuilder
from client_styles import tool_turn, write_turn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.analysis import IncrementalAnalyzer, analyze_session
from workbench.schema import pb
from workbench.store.db import Store

SESSIONS = ["healthy", "stall", "kv-only", "appends", "loop", "refused", "late-end", "streams-only", "strict"]


@pytest.fixture(scope="module")
def equiv_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = Store(Path(tmp_path_factory.mktemp("equiv")) / "e.duckdb")
    b = SessionBuilder(store, "healthy")
    b.run_request()
    b.set_blob(1, json.dumps({"role": "system", "content": "x"}).encode())
    b.set_blob_result(1)
    b.healthy_shell_turn()
    b.heartbeat()
    b.text("ok")
    b.checkpoint()
    b.turn_ended()
    b.end_stream()
    b.done()

    b = SessionBuilder(store, "stall", status="incomplete")
    b.run_request()
    b.text("let me look")
    b.exec_shell(1, "ls", "c1")
    b.shell_result(1)
    for _ in range(12):
        b.heartbeat()
    b.done()

    b = SessionBuilder(store, "kv-only", status="incomplete")
    b.run_request()
    b.healthy_shell_turn()
    b.heartbeat()
    b.set_blob(4, json.dumps({"role": "assistant", "content": [
        {"type": "tool-call", "toolName": "Shell", "toolCallId": "x", "args": {"command": "ls"}}]}).encode())
    b.set_blob_result(4)
    for _ in range(6):
        b.heartbeat()
    b.done()

    b = SessionBuilder(store, "appends", transport="runsse")
    b.append(0, run_request=pb.AgentRunRequest(conversation_state=pb.ConversationStateStructure()))
    b.append(0, client_heartbeat=pb.ClientHeartbeat())
    b.text("hi")
    b.end_stream()
    b.done()

    b = SessionBuilder(store, "loop")
    b.run_request()
    for i in range(4):
        b.healthy_shell_turn(call_id=f"c{i}", exec_id=i + 1, command="cat a")
        b.heartbeat()
    b.get_blob(9, b"\x02" * 32)
    b.get_blob_result(9, None)
    b.text("done")
    b.turn_ended()
    b.done()

    b = SessionBuilder(store, "refused", transport="runsse", status="incomplete")
    b.append(0, meta={"http_status": 200}, run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure()))
    b.server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1", ls_args=pb.LsArgs(path=".")))
    b.append(1, meta={"http_status": 415, "content_type": "application/proto"}, raw=b"\x00\x00\x00\x00\x02\x08\x01",
             exec_client_message=pb.ExecClientMessage(id=1, exec_id="e1", ls_result=pb.LsResult()))
    b.http_error(415, b"", seqno=1)
    for _ in range(6):
        b.heartbeat()
    b.done()

    b = SessionBuilder(store, "late-end")
    b.run_request()
    for _ in range(3):
        b.client_heartbeat(dt_ms=5000)
    b.text("ok")
    b.turn_ended()
    b.end_stream()
    for _ in range(3):
        b.client_heartbeat(dt_ms=5000)
    b.done()

    b = SessionBuilder(store, "streams-only", transport="runsse")
    write_turn(b, tool_turn("streams-only"))
    b.done()
    b = SessionBuilder(store, "strict", status="error")
    write_turn(b, tool_turn("streams-only", ("ls", "read"), policy="required"))
    b.done()
    yield store
    store.close()


def _key(res):
    return ([(f.code, f.severity, f.first_seq, f.last_seq, f.evidence) for f in res.findings],
            [dict(r) for r in res.tool_calls],
            [dict(r) for r in res.blobs])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(SESSIONS), cuts=st.lists(st.integers(min_value=1, max_value=60), max_size=6))
def test_incremental_equals_batch(equiv_store: Store, name: str, cuts: list[int]) -> None:
    rows = equiv_store.query("SELECT * FROM frames WHERE session_id = ? ORDER BY seq", [name])
    inc = IncrementalAnalyzer(name)
    start = 0
    for cut in sorted(set(cuts)):
        if cut > start:
            inc.feed(rows.slice(start, cut - start))
            start = cut
    inc.feed(rows.slice(start))
    batch = analyze_session(equiv_store, name)
    assert _key(inc.result(final=True)) == _key(batch)
    assert batch.findings or name in ("healthy", "streams-only")


def test_equivalence_sessions_cover_the_rules(equiv_store: Store) -> None:
    counts = {r["session_id"]: r["n"] for r in equiv_store.query(
        "SELECT session_id, count(*) AS n FROM frames GROUP BY ALL").to_pylist()}
    assert all(counts.get(name, 0) >= 4 for name in SESSIONS), counts
    codes = {name: sorted({f.code for f in analyze_session(equiv_store, name).problems}) for name in SESSIONS}
    assert codes == {
        "healthy": [],
        "stall": ["heartbeat_loop", "missing_stream_close", "stream_ended_without_turn_end"],
        "kv-only": ["heartbeat_loop", "kv_only_response", "stream_ended_without_turn_end"],
        "appends": ["append_seqno_anomaly", "stream_ended_without_turn_end"],
        "loop": ["blob_miss", "tool_loop"],
        "refused": ["append_rejected", "heartbeat_loop", "stream_ended_without_turn_end", "unanswered_exec"],
        "late-end": ["end_stream_not_delivered"],
        "streams-only": [],
        "strict": ["heartbeat_loop", "missing_stream_close", "server_error"],
    }
