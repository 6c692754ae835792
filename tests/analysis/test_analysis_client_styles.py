"""Healthy traffic of every client style gives no finding; the December 2025 stall still does.

Sessions are built with the real protobuf runtime into a DuckDB file (client_styles.py): the
real-client style (result alone, final shell_result after a stream, throw + stream_close, never
half-closing) and our client's style (always stream_close), over Run, RunSSE + BidiAppend and
RunPoll, in wire order, causal order and body order (imports without per-frame timing).
"""

from __future__ import annotations

import pytest
from analysis_helpers import SessionBuilder
from client_styles import STYLES, body_meta, tool_turn, write_turn

from workbench.analysis import analyze_session
from workbench.analysis.context import ORDER_NOTE
from workbench.schema import pb
from workbench.store.db import Store


@pytest.mark.parametrize("order", ["time", "causal", "body"])
@pytest.mark.parametrize("transport", ["run", "runsse", "runpoll"])
@pytest.mark.parametrize("style", STYLES)
def test_healthy_turn_of_every_style_has_no_finding(analysis_store: Store, style: str, transport: str,
                                                    order: str) -> None:
    b = SessionBuilder(analysis_store, transport=transport, meta=body_meta(order))
    write_turn(b, tool_turn(style), order)
    res = analyze_session(analysis_store, b.done())
    assert res.problems == [], [f.message for f in res.findings]
    calls = {t["call_id"]: t for t in res.tool_calls}
    assert len(calls) == 7
    assert all(t["result_seq"] is not None for t in calls.values() if t["tool_name"] != "fetch")
    # the blob only the client named (its run_request state, echoed in the checkpoint) is listed, not missed
    assert not [r for r in res.blobs if r["status"] in ("miss", "empty", "unanswered")]


@pytest.mark.parametrize("order", ["time", "body"])
def test_result_alone_against_a_server_that_waits_for_stream_close(analysis_store: Store, order: str) -> None:
    """The December 2025 stall: streams-only client, a server that parks until stream_close."""
    b = SessionBuilder(analysis_store, status="error", meta=body_meta(order))
    turn = tool_turn("streams-only", ("read", "grep"), policy="required")
    seqs = write_turn(b, turn, order)
    res = analyze_session(analysis_store, b.done())
    codes = [f.code for f in res.findings]
    assert codes[0] == "missing_stream_close", codes  # the root cause comes first
    assert {"missing_stream_close", "heartbeat_loop", "server_error"} <= set(codes)
    close = res.findings[0]
    exec_seq = next(seqs[i] for i, e in enumerate(turn.events) if e.direction == "server"
                    and i > 0 and turn.events[i + 1].tag == "client_heartbeat")
    result_seq = next(seqs[i] for i, e in enumerate(turn.events) if e.tag == "result")
    heartbeats = [seqs[i] for i, e in enumerate(turn.events) if e.direction == "server"][-9:-1]
    assert {exec_seq, result_seq} <= set(close.evidence)
    assert heartbeats[0] in close.evidence
    assert "exec 1 (read_args" in close.message
    assert "deadline_exceeded" in close.message
    loop = next(f for f in res.findings if f.code == "heartbeat_loop")
    assert loop.cause == "missing_stream_close"
    assert loop.cause_seq == close.first_seq
    err = next(f for f in res.findings if f.code == "server_error")
    assert err.cause is not None
    assert "deadline_exceeded" in err.message
    if order == "time":
        assert close.severity == "error"
        assert not close.message.startswith(ORDER_NOTE)
    else:
        assert close.severity == "warning"
        assert close.message.startswith(ORDER_NOTE)


def test_always_closing_client_against_that_server_is_healthy(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    write_turn(b, tool_turn("always", ("read", "grep", "shell_stream"), policy="required"))
    assert analyze_session(analysis_store, b.done()).problems == []


def test_request_context_never_answered_but_the_turn_completes(analysis_store: Store) -> None:
    """A proxy that sends its context inside run_request and ignores request_context_args (seen
    against the real service): the service goes on, so nothing was harmed."""
    b = SessionBuilder(analysis_store, transport="runsse")
    b.run_request(text="hi")
    b.server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1",
                                                      request_context_args=pb.RequestContextArgs()))
    for _ in range(2):
        b.heartbeat()
        b.client_heartbeat()
    b.update(thinking_delta=pb.ThinkingDelta(text="ok"))
    b.text("Hello.")
    b.checkpoint()
    b.turn_ended()
    b.end_stream()
    res = analyze_session(analysis_store, b.done())
    assert res.problems == []
    assert not res.failed
    # said as a note: a server that waits for the context would have parked here
    [note] = res.notes
    assert (note.code, note.severity, note.first_seq) == ("unanswered_exec", "note", 1)
    assert "request_context_args" in note.message and "went on without it" in note.message


def test_request_context_never_answered_and_the_server_waited(analysis_store: Store) -> None:
    """A strict server parks on the unanswered request context: the finding says it waited for it."""
    b = SessionBuilder(analysis_store, transport="runsse", status="error")
    b.run_request(text="hi")
    b.server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1",
                                                      request_context_args=pb.RequestContextArgs()))
    for _ in range(6):
        b.heartbeat()
    res = analyze_session(analysis_store, b.done())
    f = next(f for f in res.findings if f.code == "unanswered_exec")
    assert f.severity == "error"
    assert "This server waited for the context" in f.message
    assert "request_context_result" in f.suggested_fix
    loop = next(f for f in res.findings if f.code == "heartbeat_loop")
    assert "This server waited for the context" in loop.message
    assert res.notes == []


def test_proxy_leaving_the_run_at_an_exec_after_ignoring_request_context(analysis_store: Store) -> None:
    """The stateless flow: request_context ignored, then the proxy hands the MCP exec to its own
    caller and leaves the run before the server parks; the next turn is a fresh run."""
    b = SessionBuilder(analysis_store, transport="runsse", status="aborted")
    b.run_request(text="list files")
    b.server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1",
                                                      request_context_args=pb.RequestContextArgs()))
    b.heartbeat()
    b.update(partial_tool_call=pb.PartialToolCall(call_id="c1", args_text_delta='{"path": "."}'))
    b.update(tool_call_started=pb.ToolCallStarted(call_id="c1", tool_call=pb.ToolCall(
        mcp_tool_call=pb.McpToolCall())))
    b.server(exec_server_message=pb.ExecServerMessage(id=2, exec_id="e2", mcp_args=pb.McpArgs(
        name="list", tool_name="list", tool_call_id="c1")))
    res = analyze_session(analysis_store, b.done())
    assert res.problems == [], [f.message for f in res.findings]


def test_unanswered_exec_with_a_stall_is_still_found(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse", status="incomplete")
    b.run_request()
    e = b.server(exec_server_message=pb.ExecServerMessage(id=4, exec_id="e4", ls_args=pb.LsArgs(path=".")))
    hbs = [b.heartbeat() for _ in range(6)]
    b.client_heartbeat()
    res = analyze_session(analysis_store, b.done())
    assert [f.code for f in res.findings] == ["unanswered_exec", "heartbeat_loop", "stream_ended_without_turn_end"]
    f = res.findings[0]
    assert f.first_seq == e
    assert hbs[0] in f.evidence
    assert "exec 4 (ls_args" in f.message
    assert res.findings[1].cause == "unanswered_exec"
    assert res.findings[2].cause == "heartbeat_loop"
