"""KV blob analysis and tool-call reconstruction on hand-built sessions."""

from __future__ import annotations

import hashlib
import json

from analysis_helpers import SessionBuilder

from workbench.analysis import analyze, analyze_session
from workbench.analysis.blobs import describe
from workbench.schema import pb
from workbench.store.db import Store


def test_describe_content_types_roles_and_protobuf_types() -> None:
    system = describe(json.dumps({"role": "system", "content": "You are an agent"}).encode())
    assert (system["content_type"], system["role"]) == ("json", "system")
    assert system["parts"] == [{"type": "text", "text": "You are an agent"}]
    tool = describe(json.dumps({"role": "tool", "id": "t", "content": [
        {"type": "tool-result", "toolName": "Read", "toolCallId": "c1", "result": "1|hello"}]}).encode())
    assert tool["role"] == "tool"
    assert tool["parts"][0] == {"type": "tool-result", "name": "Read", "id": "c1",
                               "result": "1|hello"}
    user = describe(pb.UserMessage(text="fix the bug", message_id="m1").SerializeToString())
    assert (user["content_type"], user["proto_type"], user["role"]) == ("protobuf", "UserMessage", "user")
    step = describe(pb.ConversationStep(tool_call=pb.ToolCall(shell_tool_call=pb.ShellToolCall(
        args=pb.ShellArgs(command="ls")))).SerializeToString())
    assert step["proto_type"] == "ConversationStep"
    assert step["parts"][0]["type"] == "tool-call"
    assert step["parts"][0]["args"]["command"] == "ls"
    ids = [hashlib.sha256(bytes([i])).digest() for i in range(3)]
    turn = describe(pb.ConversationTurnStructure(agent_conversation_turn=pb.AgentConversationTurnStructure(
        user_message=ids[0], steps=ids[1:])).SerializeToString())
    assert turn["proto_type"] == "ConversationTurnStructure"
    state = describe(pb.ConversationStateStructure(root_prompt_messages_json=ids).SerializeToString())
    assert state["proto_type"] == "ConversationStateStructure"
    assert describe(b"plain words here\n")["content_type"] == "text"
    assert describe(bytes(range(200, 256)))["content_type"] == "binary"
    assert describe(b"")["content_type"] == "empty"


def test_blob_lifecycle_sha_and_checkpoint_refs(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    system = json.dumps({"role": "system", "content": "rules"}).encode()
    s1, sys_id = b.set_blob(1, system)
    b.set_blob_result(1)
    user_msg = pb.UserMessage(text="hi", message_id="u1").SerializeToString()
    s2, user_id = b.set_blob(2, user_msg)
    b.set_blob_result(2)
    step = pb.ConversationStep(assistant_message=pb.AssistantMessage(text="hello")).SerializeToString()
    _s3, step_id = b.set_blob(3, step)
    b.set_blob_result(3)
    turn = pb.ConversationTurnStructure(agent_conversation_turn=pb.AgentConversationTurnStructure(
        user_message=user_id, steps=[step_id])).SerializeToString()
    _s4, turn_id = b.set_blob(4, turn)
    b.set_blob_result(4)
    odd_id = b"\x01" * 32
    s5, _ = b.set_blob(5, b"not hashed", blob_id=odd_id)
    b.set_blob_result(5)
    g = b.get_blob(6, sys_id)
    b.get_blob_result(6, system)
    b.text("hello")
    b.checkpoint(pb.ConversationStateStructure(root_prompt_messages_json=[sys_id], turns=[turn_id]))
    b.turn_ended()
    res = analyze_session(analysis_store, b.done())
    assert res.problems == []
    by = {(r["seq"]): r for r in res.blobs}
    assert by[s1]["status"] == "stored"
    assert by[s1]["sha256_ok"] is True
    assert by[s1]["checkpoint_ref"] == "root_prompt_messages_json[0]"
    assert by[s2]["proto_type"] == "UserMessage"
    assert by[s2]["checkpoint_ref"] == "turns[0].user_message"
    assert [r["checkpoint_ref"] for r in res.blobs if r["blob_id"] == step_id.hex()] == ["turns[0].steps[0]"]
    assert by[s5]["sha256_ok"] is False
    assert by[g]["op"] == "get"
    assert by[g]["status"] == "served"
    assert by[g]["role"] == "system"
    # bytes are stored once per blob id
    assert by[s1]["data"] == system
    assert by[g]["data"] is None


def test_tool_call_reconstruction_shell(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store)
    b.run_request()
    b.healthy_shell_turn(call_id="call-7", exec_id=3, command="echo hi")
    b.text("ok")
    b.turn_ended()
    res = analyze_session(analysis_store, b.done())
    [t] = res.tool_calls
    assert t["call_id"] == "call-7"
    assert t["tool_name"] == "shell"
    assert t["exec_id"] == 3
    assert t["args_streamed"] == {"command": "echo hi"}
    assert t["args_completion"]["command"] == "echo hi"
    assert t["args_merged"]["command"] == "echo hi"
    assert t["args_naive"].startswith('{"comm')
    assert json.loads(json.dumps(t["args_naive"])) != '{"command": "echo hi"}'
    assert t["exec_seq"] < t["result_seq"] < t["last_seq"]
    assert t["status"] == "completed"
    assert t["result"] == {"shell_stream_result": {"exit": {}}}
    assert t["started_at"] <= t["ended_at"]


def test_analyze_writes_and_replaces_rows(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="incomplete")
    b.run_request()
    b.set_blob(1, b'{"role":"user","content":"x"}')
    b.set_blob_result(1)
    b.healthy_shell_turn()
    for _ in range(6):
        b.heartbeat()
    sid = b.done()
    analyze(analysis_store)
    analyze(analysis_store, [sid])  # twice: rows are replaced, not duplicated
    rows = analysis_store.query("SELECT code, severity, evidence FROM findings WHERE session_id = ? "
                                "AND severity <> 'note'", [sid]).to_pylist()
    assert sorted(r["code"] for r in rows) == ["heartbeat_loop", "stream_ended_without_turn_end"]
    assert all(isinstance(r["evidence"], list) and r["evidence"] for r in rows)
    t = analysis_store.query("SELECT tool_name, args_merged, args_naive FROM tool_calls").to_pylist()
    assert len(t) == 1
    assert json.loads(t[0]["args_merged"])["command"] == "echo hi"
    blobs = analysis_store.query("SELECT op, role, parts FROM blobs").to_pylist()
    assert blobs == [{"op": "set", "role": "user", "parts": '[{"type": "text", "text": "x"}]'}]
