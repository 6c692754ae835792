"""One small test per rule over hand-built sessions (real protobuf, classifier, Recorder, DuckDB)."""

from __future__ import annotations

import base64
import hashlib
import json

from analysis_helpers import SessionBuilder, analysis_codes

from workbench.analysis import Config, analyze_session
from workbench.analysis.rules import RULES
from workbench.schema import pb
from workbench.store.db import Store

ALL_CODES = {"heartbeat_loop", "missing_stream_close", "unanswered_exec", "unanswered_query", "kv_only_response",
             "args_cumulative_snapshots", "completion_args_lossy", "missing_conversation_state",
             "append_seqno_anomaly", "stream_ended_without_turn_end", "blob_miss", "tool_loop", "server_error",
             "ndjson_duplicate_text", "append_rejected", "unary_error", "end_stream_not_delivered",
             "retried_turn", "transport_error_after_turn", "client_cancelled", "framing_lost", "stream_held_open"}


def _finish_ok(b: SessionBuilder) -> str:
    b.text("done")
    b.checkpoint()
    b.turn_ended()
    b.end_stream()
    return b.done()


def _only(res, code):
    found = [f for f in res.findings if f.code == code]
    assert found, f"no {code} in {[f.code for f in res.findings]}"
    return found[0]


def test_registry_has_every_code_once() -> None:
    assert set(RULES) == ALL_CODES
    for code, rule in RULES.items():
        assert rule.code == code
        assert rule.severity in ("error", "warning", "note")


def test_healthy_session_has_no_finding(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    b.healthy_shell_turn()
    sid = _finish_ok(b)
    res = analyze_session(analysis_store, sid)
    assert res.problems == []
    assert [t["status"] for t in res.tool_calls] == ["completed"]


# heartbeat_loop ------------------------------------------------------------------------------------

def test_heartbeat_loop_after_result_without_close(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="incomplete")
    b.run_request()
    exec_seq = b.exec_shell(1, "ls", "c1")
    result_seq = b.shell_result(1)
    hbs = [b.heartbeat() for _ in range(7)]
    res = analyze_session(analysis_store, b.done())
    f = _only(res, "heartbeat_loop")
    assert f.severity == "error"
    assert "7 server heartbeats" in f.message
    assert "stream_close{1}" in f.message
    assert set(hbs) <= set(f.evidence)
    assert exec_seq in f.evidence
    assert result_seq in f.evidence
    assert "stream_close" in f.suggested_fix


def test_heartbeat_stretch_that_recovers_or_follows_turn_end_is_not_a_loop(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, "recovers")
    b.run_request()
    for _ in range(9):
        b.heartbeat()
    _finish_ok(b)
    b2 = SessionBuilder(analysis_store, "idle-after-turn", status="incomplete")
    b2.run_request()
    b2.text("hi")
    b2.turn_ended()
    for _ in range(9):
        b2.heartbeat()
    b2.done()
    assert "heartbeat_loop" not in analysis_codes(analyze_session(analysis_store, "recovers").findings)
    assert "heartbeat_loop" not in analysis_codes(analyze_session(analysis_store, "idle-after-turn").findings)


def test_heartbeat_loop_threshold_is_configurable(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="incomplete")
    b.run_request()
    for _ in range(6):
        b.heartbeat()
    sid = b.done()
    assert "heartbeat_loop" in analysis_codes(analyze_session(analysis_store, sid).findings)
    cfg = Config(heartbeat_min_count=10)
    assert "heartbeat_loop" not in analysis_codes(analyze_session(analysis_store, sid, cfg).findings)
    cfg = Config(heartbeat_min_span_s=60)
    assert "heartbeat_loop" not in analysis_codes(analyze_session(analysis_store, sid, cfg).findings)


# exec obligations ------------------------------------------------------------------------------------

def test_missing_stream_close_and_close_or_throw_satisfies_it(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, "noclose", status="incomplete")
    b.run_request()
    e = b.exec_shell(4)
    r = b.shell_result(4)
    for _ in range(3):
        b.heartbeat()
    b.done()
    f = _only(analyze_session(analysis_store, "noclose"), "missing_stream_close")
    assert f.severity == "error"
    assert "exec 4" in f.message
    assert {e, r} <= set(f.evidence)

    b = SessionBuilder(analysis_store, "thrown")
    b.run_request()
    b.exec_shell(4)
    b.client(exec_client_control_message=pb.ExecClientControlMessage(throw=pb.ExecClientThrow(id=4, error="nope")))
    _finish_ok(b)
    assert analyze_session(analysis_store, "thrown").problems == []


def test_result_alone_is_healthy_when_the_server_goes_on(analysis_store: Store) -> None:
    """A server that completes an exec on its result (the 2026 service): no stream_close needed,
    even when the server waited a while (heartbeats) before going on."""
    b = SessionBuilder(analysis_store, "alone")
    b.run_request()
    b.exec_shell(4, member="shell_args")
    b.exec_result(4, shell_result=pb.ShellResult(success=pb.ShellSuccess(command="ls", exit_code=0)))
    for _ in range(6):
        b.heartbeat()
    b.update(token_delta=pb.TokenDelta(tokens=3))
    _finish_ok(b)
    assert analyze_session(analysis_store, "alone").problems == []

    b = SessionBuilder(analysis_store, "cut", status="aborted")  # the client left right after its result
    b.run_request()
    b.exec_shell(4, member="shell_args")
    b.exec_result(4, shell_result=pb.ShellResult(success=pb.ShellSuccess(command="ls", exit_code=0)))
    assert "missing_stream_close" not in analysis_codes(analyze_session(analysis_store, "cut").findings)


def test_unanswered_exec(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="incomplete")
    b.run_request()
    e = b.server(exec_server_message=pb.ExecServerMessage(id=9, exec_id="x9", read_args=pb.ReadArgs(path="a.txt")))
    for _ in range(3):
        b.heartbeat()
    f = _only(analyze_session(analysis_store, b.done()), "unanswered_exec")
    assert f.severity == "error"
    assert "exec 9 (read_args" in f.message
    assert f.first_seq == e


def test_unanswered_query_and_answered_query(analysis_store: Store) -> None:
    query = pb.InteractionQuery(id=3, ask_question_interaction_query=pb.AskQuestionInteractionQuery())
    b = SessionBuilder(analysis_store, "q-open", status="incomplete")
    b.run_request()
    q = b.server(interaction_query=query)
    b.heartbeat()
    f = _only(analyze_session(analysis_store, b.done()), "unanswered_query")
    assert f.first_seq == q
    assert "id 3" in f.message

    b = SessionBuilder(analysis_store, "q-done")
    b.run_request()
    b.server(interaction_query=query)
    b.client(interaction_response=pb.InteractionResponse(
        id=3, ask_question_interaction_response=pb.AskQuestionInteractionResponse()))
    _finish_ok(b)
    assert analyze_session(analysis_store, "q-done").problems == []


# KV ----------------------------------------------------------------------------------------------------

ASSISTANT_TOOL_CALL = json.dumps({"id": "m1", "role": "assistant", "content": [
    {"type": "tool-call", "toolCallId": "call_1", "toolName": "Shell",
     "args": {"command": "echo 'Hello from KV blob investigation'"}}]}).encode()


def test_kv_only_response(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="incomplete")
    b.run_request()
    b.healthy_shell_turn(command="echo 'Hello from KV blob investigation'")
    b.heartbeat()
    s, _bid = b.set_blob(7, ASSISTANT_TOOL_CALL)
    b.set_blob_result(7)
    for _ in range(3):
        b.heartbeat()
    res = analyze_session(analysis_store, b.done())
    f = _only(res, "kv_only_response")
    assert f.severity == "error"
    assert s in f.evidence
    assert "tool-call Shell" in f.message
    assert "not text" in f.message
    blob = [r for r in res.blobs if r["seq"] == s][0]
    assert blob["role"] == "assistant"
    assert blob["parts"][0]["name"] == "Shell"


def test_assistant_blob_after_streamed_text_is_healthy(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    b.text("the answer")
    b.set_blob(1, json.dumps({"role": "assistant", "content": [{"type": "text", "text": "the answer"}]}).encode())
    b.set_blob_result(1)
    b.checkpoint()
    b.turn_ended()
    assert analyze_session(analysis_store, b.done()).problems == []


def test_blob_miss_is_a_requested_blob_answered_absent(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    missing = hashlib.sha256(b"never stored").digest()
    g = b.get_blob(2, missing)
    r = b.get_blob_result(2, None)
    b.text("ok")
    b.turn_ended()
    res = analyze_session(analysis_store, b.done())
    [f] = res.findings
    assert f.code == "blob_miss"
    assert f.severity == "warning"
    assert missing.hex()[:12] in f.message
    assert f.evidence == (g, r)


def test_blobs_named_but_never_requested_are_not_misses(analysis_store: Store) -> None:
    """A checkpoint (or the client's own run_request state) naming blob ids nobody set: the server
    never asked for them, so nothing was missed; the blobs table still lists them."""
    ghost = hashlib.sha256(b"ghost turn").digest()
    mine = hashlib.sha256(b"client rules").digest()
    b = SessionBuilder(analysis_store)
    b.run_request(state=pb.ConversationStateStructure(root_prompt_messages_json=[mine]))
    cp = b.checkpoint(pb.ConversationStateStructure(turns=[ghost], root_prompt_messages_json=[mine]))
    b.text("ok")
    b.turn_ended()
    res = analyze_session(analysis_store, b.done())
    assert res.problems == []
    [row] = [r for r in res.blobs if r["blob_id"] == ghost.hex()]
    assert row["status"] == "never_set"
    assert row["checkpoint_ref"] == "turns[0]"
    assert row["seq"] == cp


# tool-call args ------------------------------------------------------------------------------------------

def _mcp_call(b: SessionBuilder, call_id: str, streamed: dict, completion: dict, *, echo: str | None = None) -> None:
    from workbench.protocol.args import json_to_mcp_args

    text = json.dumps(streamed)
    for cut in (len(text) // 3, 2 * len(text) // 3, len(text)):
        b.update(partial_tool_call=pb.PartialToolCall(call_id=call_id, args_text_delta=text[:cut]))
    started = pb.ToolCall(mcp_tool_call=pb.McpToolCall(args=pb.McpArgs(name="task", tool_name="task")))
    b.update(tool_call_started=pb.ToolCallStarted(call_id=call_id, tool_call=started))
    b.server(exec_server_message=pb.ExecServerMessage(id=5, exec_id="e5", mcp_args=pb.McpArgs(
        name="task", tool_name="task", tool_call_id=call_id, args=json_to_mcp_args(streamed))))
    content = [pb.McpToolResultContentItem(text=pb.McpTextContent(text=echo or "ok"))]
    b.client(exec_client_message=pb.ExecClientMessage(id=5, exec_id="e5", mcp_result=pb.McpResult(
        success=pb.McpSuccess(content=content))))
    b.stream_close(5)
    done = pb.ToolCall(mcp_tool_call=pb.McpToolCall(args=pb.McpArgs(
        name="task", tool_name="task", args=json_to_mcp_args(completion))))
    b.update(tool_call_completed=pb.ToolCallCompleted(call_id=call_id, tool_call=done))


def test_completion_args_lossy_needs_the_client_replaying_the_lossy_args(analysis_store: Store) -> None:
    streamed = {"description": "d", "tasks": [{"id": 1}, {"id": 2}], "options": {"a": 1}}
    completion = {"description": "d", "options": json.dumps({"a": 1})}
    b = SessionBuilder(analysis_store, "merged")
    b.run_request()
    _mcp_call(b, "call-m", streamed, completion)
    res = analyze_session(analysis_store, _finish_ok(b))
    assert res.problems == []  # the server's lossy completion alone hurts a merging client not at all
    assert not res.failed
    # ... but it is said, as a note naming what the completion lost
    [note] = [f for f in res.notes if f.code == "completion_args_lossy"]
    assert note.severity == "note"
    assert "omitted key: tasks" in note.message
    assert 'options: {"a": 1} (object) → "{\\"a\\": 1}" (string)' in note.message
    assert res.findings[-len(res.notes):] == res.notes  # notes come after the findings
    row = res.tool_calls[0]
    assert row["tool_name"] == "task"
    assert row["args_merged"] == streamed
    assert row["args_completion"] == completion
    assert "tasks" not in row["args_completion"]

    # A stateless client that let the completion overwrite the args replays them in its next run.
    b = SessionBuilder(analysis_store, "overwrote")
    b.run_request()
    _mcp_call(b, "call-m", streamed, completion)
    b.text("done")
    b.turn_ended()
    history = f"ASSISTANT: TOOL_CALL task {json.dumps(completion, separators=(',', ':'))}\nTOOL_RESULT (call_id: call-m): ok"
    nxt = b.run_request(text=history)
    b.text("ok")
    b.turn_ended()
    res = analyze_session(analysis_store, b.done())
    f = _only(res, "completion_args_lossy")
    assert f.severity == "warning"
    assert "omitted key: tasks" in f.message
    assert "options: " in f.message and "(string)" in f.message
    assert not [n for n in res.notes if n.code == "completion_args_lossy"]  # a warning, not also a note
    assert nxt in f.evidence
    assert f"seq {nxt}" in f.message
    assert "args_cumulative_snapshots" not in analysis_codes(res.findings)  # no garbled text echoed


def test_args_cumulative_snapshots_needs_the_client_echoing_garbled_args(analysis_store: Store) -> None:
    from workbench.protocol.args import naive_concat

    args = {"description": "d", "tasks": [{"id": 1}]}
    text = json.dumps(args)
    garbled = naive_concat([text[: len(text) // 3], text[: 2 * len(text) // 3], text])
    b = SessionBuilder(analysis_store)
    b.run_request()
    _mcp_call(b, "call-g", args, args, echo=f"the tool got: {garbled}")
    res = analyze_session(analysis_store, _finish_ok(b))
    f = _only(res, "args_cumulative_snapshots")
    assert f.severity == "warning"
    assert "call-g" in f.message
    assert res.tool_calls[0]["args_naive"] == garbled


def test_tool_loop(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    for i in range(3):
        b.healthy_shell_turn(call_id=f"c{i}", exec_id=i + 1, command="cat README.md")
    res = analyze_session(analysis_store, _finish_ok(b))
    f = _only(res, "tool_loop")
    assert "shell called 3 times" in f.message
    assert "cat README.md" in f.message

    b = SessionBuilder(analysis_store, "two")
    b.run_request()
    for i in range(2):
        b.healthy_shell_turn(call_id=f"c{i}", exec_id=i + 1, command="cat README.md")
    b.healthy_shell_turn(call_id="c9", exec_id=9, command="ls")
    assert analyze_session(analysis_store, _finish_ok(b)).problems == []


# requests and streams -------------------------------------------------------------------------------------

def test_missing_conversation_state(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, "omit", status="error")
    rr = b.run_request(omit_state=True)
    b.end_stream({"code": "invalid_argument", "message": "Conversation state is required"})
    f = _only(analyze_session(analysis_store, b.done()), "missing_conversation_state")
    assert f.first_seq == rr
    assert f.severity == "error"

    b = SessionBuilder(analysis_store, "followup")
    b.run_request()
    cp = b.checkpoint()
    b.turn_ended()
    rr2 = b.run_request()  # a second run in the session, state empty again
    b.text("?")
    b.turn_ended()
    f = _only(analyze_session(analysis_store, b.done()), "missing_conversation_state")
    assert f.evidence == (cp, rr2)
    assert "context" in f.message


def test_conversation_state_left_out_harmlessly(analysis_store: Store) -> None:
    # a server that answers a run_request without field 1 anyway
    b = SessionBuilder(analysis_store, "lenient")
    b.run_request(omit_state=True)
    _finish_ok(b)
    # a stateless follow-up: empty state, the history flattened into the prompt
    b = SessionBuilder(analysis_store, "stateless")
    b.run_request(text="USER: list the files please")
    b.checkpoint()
    b.turn_ended()
    b.run_request(text="USER: list the files please\nASSISTANT: ls\nTOOL_RESULT (call_id: c1): a.txt")
    b.text("a.txt")
    b.turn_ended()
    # a new conversation in the same session is no follow-up
    b2 = SessionBuilder(analysis_store, "new-conv")
    b2.run_request(conversation_id="conv-1")
    b2.checkpoint()
    b2.turn_ended()
    b2.run_request(conversation_id="conv-2")
    b2.text("fresh")
    b2.turn_ended()
    for sid in ("lenient", b.done(), b2.done()):
        assert analyze_session(analysis_store, sid).problems == [], sid


def test_append_seqno_anomalies(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse")
    b.append(0, run_request=pb.AgentRunRequest(conversation_state=pb.ConversationStateStructure()))
    b.append(1, client_heartbeat=pb.ClientHeartbeat())
    reset = b.append(0, client_heartbeat=pb.ClientHeartbeat())
    dup = b.append(1, client_heartbeat=pb.ClientHeartbeat())
    b.append(4, client_heartbeat=pb.ClientHeartbeat())
    _finish_ok(b)
    f = _only(analyze_session(analysis_store, "s1"), "append_seqno_anomaly")
    assert "restart at 0" in f.message
    assert "duplicate 1" in f.message
    assert "gap: 2, 3" in f.message
    assert {reset, dup} <= set(f.evidence)


def test_append_resent_after_failure_and_two_counters(analysis_store: Store) -> None:
    hb = {"client_heartbeat": pb.ClientHeartbeat()}
    b = SessionBuilder(analysis_store, "retry", transport="runsse")
    b.append(0, run_request=pb.AgentRunRequest(conversation_state=pb.ConversationStateStructure()),
             meta={"http_status": 200})
    b.append(1, meta={"http_status": 503}, **hb)
    b.append(1, meta={"http_status": 200}, **hb)  # the same message again under its seqno: a retry
    b.append(2, meta={"http_status": 200}, **hb)
    _finish_ok(b)
    assert analyze_session(analysis_store, "retry").problems == []

    # two counters (the stateless proxy's bug): seqnos of heartbeats collide with the others
    b = SessionBuilder(analysis_store, "two-counters", transport="runsse")
    b.append(0, run_request=pb.AgentRunRequest(conversation_state=pb.ConversationStateStructure()),
             meta={"http_status": 200})
    b.server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1", request_context_args=pb.RequestContextArgs()))
    first = b.append(1, meta={"http_status": 200}, exec_client_message=pb.ExecClientMessage(
        id=1, exec_id="e1", request_context_result=pb.RequestContextResult()))
    hb0 = b.append(0, meta={"http_status": 200}, **hb)
    hb1 = b.append(1, meta={"http_status": 200}, **hb)
    _finish_ok(b)
    f = _only(analyze_session(analysis_store, "two-counters"), "append_seqno_anomaly")
    assert "seqno 1 reused for a different message" in f.message
    assert {hb0, hb1, first} <= set(f.evidence)


def test_stream_ended_without_turn_end(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    b.text("partial answer")
    cp = b.checkpoint()
    end = b.end_stream()
    f = _only(analyze_session(analysis_store, b.done()), "stream_ended_without_turn_end")
    assert cp in f.evidence
    assert end in f.evidence
    assert "conversation_checkpoint_update" in f.message


def test_server_error_names_the_error_and_advice(analysis_store: Store) -> None:
    details = pb.ErrorDetails(error=51, details=pb.CustomErrorDetails(title="Usage limit reached",
                                                                       detail="Switch model", is_retryable=False))
    value = base64.b64encode(details.SerializeToString()).decode().rstrip("=")
    b = SessionBuilder(analysis_store, status="error")
    b.run_request()
    b.text("Let me")
    end = b.end_stream({"code": "resource_exhausted", "message": "Error",
                        "details": [{"type": "aiserver.v1.ErrorDetails", "value": value}]})
    res = analyze_session(analysis_store, b.done())
    f = _only(res, "server_error")
    assert f.evidence == (end,)
    assert "resource_exhausted" in f.message
    assert "ERROR_RATE_LIMITED_CHANGEABLE" in f.message
    assert "Usage limit reached" in f.message
    assert "rate limit" in f.suggested_fix
    assert "stream_ended_without_turn_end" not in analysis_codes(res.findings)


def test_ndjson_duplicate_text(analysis_store: Store) -> None:
    from workbench.ingest.ndjson import NdjsonRecorder
    from workbench.store.recorder import Recorder

    sid = "nd-1"
    lines = [
        {"type": "system", "subtype": "init", "session_id": sid, "model": "auto"},
        {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
         "session_id": sid, "timestamp_ms": 1},
        {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": " world"}]},
         "session_id": sid, "timestamp_ms": 2},
        {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "Hello world"}]},
         "session_id": sid, "timestamp_ms": 3, "model_call_id": "m1"},
        {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": "Hello world"}]},
         "session_id": sid},
        {"type": "result", "subtype": "success", "result": "Hello world", "session_id": sid, "is_error": False},
    ]
    def record(sid: str, lines: list[dict]) -> None:
        rec = Recorder(analysis_store)
        nd = NdjsonRecorder(rec, "import:ndjson", {}, fallback_session=lambda: sid, fallback_ts=lambda: 1)
        for i, line in enumerate(lines, 1):
            nd.feed(json.dumps({**line, "session_id": sid}).encode(), i)
        nd.finish()
        rec.flush()

    # the CLI's own output mixes the forms and gets the result right: healthy
    record(sid, lines)
    assert analyze_session(analysis_store, sid).problems == []
    # a relay that concatenated every form wrote the duplicated text as its result
    record("nd-2", lines[:-1] + [{**lines[-1], "result": "Hello worldHello worldHello world"}])
    res = analyze_session(analysis_store, "nd-2")
    assert analysis_codes(res.findings) == ["ndjson_duplicate_text"]
    f = res.findings[0]
    assert "Hello world" in f.message
    assert f.evidence == (1, 3, 4, 5)


def test_conversation_context_across_sessions(analysis_store: Store) -> None:
    first = SessionBuilder(analysis_store, "turn-1", conversation_id="conv-9")
    first.run_request(conversation_id="conv-9")
    data = json.dumps({"role": "system", "content": "rules"}).encode()
    _s, bid = first.set_blob(1, data)
    first.set_blob_result(1)
    first.text("hi")
    first.checkpoint(pb.ConversationStateStructure(root_prompt_messages_json=[bid]))
    first.turn_ended()
    first.done()
    second = SessionBuilder(analysis_store, "turn-2", conversation_id="conv-9")
    second.ts += 60_000_000
    # a follow-up message (the same request sent again would be a retried_turn), with an empty
    # state: the checkpoint was not echoed
    rr = second.run_request(conversation_id="conv-9", text="and now the tests")
    second.text("hello again")
    second.checkpoint(pb.ConversationStateStructure(root_prompt_messages_json=[bid]))
    second.turn_ended()
    second.done()
    res = analyze_session(analysis_store, "turn-2")
    # the blob was set in the first session of the conversation: not a miss
    assert analysis_codes(res.findings) == ["missing_conversation_state"]
    f = res.findings[0]
    assert f.evidence == (rr,)
    assert "turn-1" in f.message
    assert analyze_session(analysis_store, "turn-1").problems == []


def test_unanswered_kv_request_is_an_error(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="incomplete")
    b.run_request()
    s, _ = b.set_blob(3, b'{"role":"user","content":"x"}')
    for _ in range(2):
        b.heartbeat()
    res = analyze_session(analysis_store, b.done())
    [f] = [f for f in res.findings if f.code == "blob_miss"]
    assert f.severity == "error"
    assert f.evidence == (s,)
    assert "never answered" in f.message
    assert res.blobs[0]["status"] == "unanswered"


def test_mcp_exec_without_stream_close_is_tolerated_when_the_turn_went_on(analysis_store: Store) -> None:
    from workbench.protocol.args import json_to_mcp_args

    b = SessionBuilder(analysis_store)
    b.run_request()
    b.server(exec_server_message=pb.ExecServerMessage(id=2, exec_id="e2", mcp_args=pb.McpArgs(
        name="echo", tool_name="echo", args=json_to_mcp_args({"x": 1}))))
    b.client(exec_client_message=pb.ExecClientMessage(id=2, exec_id="e2", mcp_result=pb.McpResult(
        success=pb.McpSuccess(content=[pb.McpToolResultContentItem(text=pb.McpTextContent(text="1"))]))))
    _finish_ok(b)
    res = analyze_session(analysis_store, "s1")
    assert res.problems == []
    assert res.tool_calls[0]["tool_name"] == "echo"
    assert res.tool_calls[0]["args_merged"] == {"x": 1}


def test_unary_session_is_not_a_run(analysis_store: Store) -> None:
    from workbench.store.recorder import Recorder

    dec = SessionBuilder(analysis_store, "unary-1").dec
    rec = Recorder(analysis_store)
    for direction in ("client", "server"):
        for f in dec.decode_body(b"\x0a\x03abc", "unary", direction):
            rec.add("unary-1", 1_700_000_000_000_000, direction, "unary", None, f)
    rec.flush()
    assert analyze_session(analysis_store, "unary-1").problems == []
