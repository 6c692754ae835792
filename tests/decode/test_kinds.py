"""Every message kind of docs/protocol.md §5, built with the real protobuf runtime, enveloped and
decoded: kind, summary, named fields and values."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from decode_pbbytes import ld, vi
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from workbench.decode import fields_of, frame_to_json
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, Frame, default_decoder
from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, encode

DEC = default_decoder()
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def real_oneof(desc: Descriptor) -> Any:
    for o in desc.oneofs:
        if len(o.fields) == 1 and o.name == "_" + o.fields[0].name:
            continue
        return o
    return None


def decode_one(payload: bytes, direction: str, transport: str = "run") -> Frame:
    frames = DEC.decode_body(encode(payload), transport, direction)
    assert len(frames) == 1, frames
    return frames[0]


def tree(f: Frame) -> Any:
    return fields_of(DEC, f.kind, f.payload, f.msg_type, f.flags)


# ---- every oneof member, from the descriptors ------------------------------------------------

def _cases(top_type: str, direction: str) -> list[tuple[str, str, str, str | None]]:
    desc = pb.message(top_type).DESCRIPTOR
    out: list[tuple[str, str, str, str | None]] = []
    for top_fd in real_oneof(desc).fields:
        sub = real_oneof(top_fd.message_type)
        if sub is None:
            out.append((direction, top_type, top_fd.name, None))
        else:
            out.extend((direction, top_type, top_fd.name, m.name) for m in sub.fields)
    return out


CASES = _cases("AgentServerMessage", "server") + _cases("AgentClientMessage", "client")


def test_cases_cover_every_container_of_section_6() -> None:
    tops = {(d, t) for d, _, t, _ in CASES}
    for top in ("interaction_update", "exec_server_message", "exec_server_control_message",
                "kv_server_message", "interaction_query", "conversation_checkpoint_update"):
        assert ("server", top) in tops
    for top in ("exec_client_message", "exec_client_control_message", "kv_client_message",
                "conversation_action", "interaction_response", "run_request", "client_heartbeat",
                "prewarm_request"):
        assert ("client", top) in tops
    members = {m for *_, m in CASES}
    # spot checks against the overlay's numbers
    assert {"text_delta", "step_completed", "shell_args", "mini_swe_agent_bash_result", "pi_ls_result",
            "set_blob_args", "get_blob_result", "stream_close", "throw", "abort",
            "web_fetch_request_query", "async_ask_question_completion_action"} <= members
    assert len(CASES) > 120


def _build(top_type: str, top: str, member: str | None) -> tuple[bytes, Any]:
    outer = pb.message(top_type)()
    sub = getattr(outer, top)
    sub.SetInParent()
    if member is None:
        return outer.SerializeToString(), None
    fd: FieldDescriptor = sub.DESCRIPTOR.fields_by_name[member]
    if "id" in sub.DESCRIPTOR.fields_by_name:
        sub.id = 7
    if fd.message_type is not None:
        inner = getattr(sub, member)
        inner.SetInParent()
        if "id" in fd.message_type.fields_by_name:  # exec control messages carry the exec id inside
            inner.id = 7
    else:
        setattr(sub, member, b"\x01\x02\x03")
    return outer.SerializeToString(), fd


@pytest.mark.parametrize(("direction", "top_type", "top", "member"), CASES,
                         ids=[f"{t}.{m}" if m else t for _, _, t, m in CASES])
def test_every_member_decodes(direction: str, top_type: str, top: str, member: str | None) -> None:
    payload, fd = _build(top_type, top, member)
    f = decode_one(payload, direction)
    assert f.kind == (f"{top}.{member}" if member else top)
    assert f.msg_type == (SERVER_MSG if direction == "server" else CLIENT_MSG)
    assert f.error is None
    assert f.flags == 0
    assert f.payload == payload
    assert isinstance(f.summary, str)
    assert f.summary
    t = tree(f)
    assert top in t
    if member is not None:
        assert member in t[top]
        if top in ("exec_server_message", "exec_client_message", "kv_server_message", "kv_client_message",
                   "interaction_query", "interaction_response"):
            assert t[top]["id"] == 7
            assert f.ref_id == 7
        if top.endswith("control_message"):
            assert t[top][member] == {"id": 7}
            assert f.ref_id == 7
        if fd is not None and fd.message_type is None:  # unmodelled bytes member
            assert t[top][member] == {"$hex": "010203"}
    # the JSON view is plain JSON
    json.dumps(frame_to_json(DEC, f))


# ---- first-tag table and byte signatures (docs/protocol.md §5) --------------------------------------------------

SERVER_TAGS = {0x0A: "interaction_update", 0x12: "exec_server_message", 0x1A: "conversation_checkpoint_update",
               0x22: "kv_server_message", 0x2A: "exec_server_control_message", 0x3A: "interaction_query"}
CLIENT_TAGS = {0x0A: "run_request", 0x12: "exec_client_message", 0x1A: "kv_client_message",
               0x22: "conversation_action", 0x2A: "exec_client_control_message", 0x32: "interaction_response",
               0x3A: "client_heartbeat", 0x42: "prewarm_request"}
UPDATE_TAGS = ["0a text_delta", "12 tool_call_started", "1a tool_call_completed", "22 thinking_delta",
               "2a thinking_completed", "32 user_message_appended", "3a partial_tool_call", "42 token_delta",
               "4a summary", "52 summary_started", "5a summary_completed", "62 shell_output_delta",
               "6a heartbeat", "72 turn_ended", "7a tool_call_delta", "8201 step_started",
               "8a01 step_completed"]


@pytest.mark.parametrize(("tags", "direction"), [(SERVER_TAGS, "server"), (CLIENT_TAGS, "client")])
def test_first_tag_table(tags: dict[int, str], direction: str) -> None:
    for first, top in tags.items():
        payload = bytes((first, 0))
        f = decode_one(payload, direction)
        assert f.kind.split(".")[0] == top, (hex(first), f.kind)


@pytest.mark.parametrize("entry", UPDATE_TAGS)
def test_interaction_update_tags(entry: str) -> None:
    hex_tag, member = entry.split()
    inner = bytes.fromhex(hex_tag) + b"\x00"
    payload = b"\x0a" + bytes((len(inner),)) + inner
    f = decode_one(payload, "server")
    assert f.kind == f"interaction_update.{member}"


@pytest.mark.parametrize(("hex_bytes", "transport", "direction", "kind", "summary"), [
    ("00 00000004 0a026a00", "run", "server", "interaction_update.heartbeat", "heartbeat"),
    ("00 00000004 0a027200", "run", "server", "interaction_update.turn_ended", "turn ended"),
    ("00 00000002 3a00", "run", "client", "client_heartbeat", "client heartbeat"),
    ("02 00000002 7b7d", "run", "server", "end_stream", "end-stream ok"),
    ("00 00000006 2a040a020807", "run", "client", "exec_client_control_message.stream_close",
     "stream_close exec#7"),
])
def test_byte_signatures(hex_bytes: str, transport: str, direction: str, kind: str, summary: str) -> None:
    frames = DEC.decode_body(bytes.fromhex(hex_bytes.replace(" ", "")), transport, direction)
    assert [(f.kind, f.summary) for f in frames] == [(kind, summary)]


def test_runsse_request_signature() -> None:
    body = bytes.fromhex("00000000260a24") + UUID.encode()
    [f] = DEC.decode_body(body, "runsse", "client")
    assert (f.kind, f.request_id, f.msg_type) == ("bidi_request_id", UUID, "aiserver.v1.BidiRequestId")
    assert UUID in f.summary
    assert tree(f) == {"request_id": UUID}


def test_runpoll_request_signature() -> None:
    body = bytes.fromhex("000000002a0a260a24") + UUID.encode() + bytes.fromhex("1001")
    [f] = DEC.decode_body(body, "runpoll", "client")
    assert (f.kind, f.request_id) == ("bidi_poll_request", UUID)
    assert tree(f) == {"request_id": {"request_id": UUID}, "start_request": True}


# ---- hand-written value checks ---------------------------------------------------------------

def S(**kw: Any) -> bytes:
    return pb.AgentServerMessage(**kw).SerializeToString()


def C(**kw: Any) -> bytes:
    return pb.AgentClientMessage(**kw).SerializeToString()


def U(**kw: Any) -> bytes:
    return S(interaction_update=pb.InteractionUpdate(**kw))


def test_text_delta() -> None:
    f = decode_one(U(text_delta=pb.TextDelta(text="Hello")), "server")
    assert (f.kind, f.summary) == ("interaction_update.text_delta", 'text "Hello"')
    assert tree(f) == {"interaction_update": {"text_delta": {"text": "Hello"}}}


def test_text_delta_long_non_ascii_and_quotes() -> None:
    text = 'ünïcode → "quoted"\nline two ' + "x" * 300
    f = decode_one(U(text_delta=pb.TextDelta(text=text)), "server")
    assert f.kind == "interaction_update.text_delta"
    assert f.summary.startswith('text "ünïcode → \\"quoted\\"\\nline two x')
    assert f.summary.endswith('…"')
    assert tree(f)["interaction_update"]["text_delta"]["text"] == text


def test_thinking_and_token_deltas() -> None:
    f = decode_one(U(thinking_delta=pb.ThinkingDelta(text="hmm")), "server")
    assert (f.kind, f.summary) == ("interaction_update.thinking_delta", 'thinking "hmm"')
    f = decode_one(U(token_delta=pb.TokenDelta(tokens=42)), "server")
    assert (f.kind, f.summary) == ("interaction_update.token_delta", "tokens 42")
    assert tree(f) == {"interaction_update": {"token_delta": {"tokens": 42}}}


def test_partial_tool_call() -> None:
    args = '{"command": "ls -la", "cwd": "/w"}'
    f = decode_one(U(partial_tool_call=pb.PartialToolCall(call_id="toolu_01", args_text_delta=args,
                                                           model_call_id="mc_1")), "server")
    assert f.kind == "interaction_update.partial_tool_call"
    assert f.call_id == "toolu_01"
    assert f.summary == f'partial "toolu_01" args {len(args)} chars ' + json.dumps(args[-40:])
    assert tree(f) == {"interaction_update": {"partial_tool_call": {
        "call_id": "toolu_01", "args_text_delta": args, "model_call_id": "mc_1"}}}


@pytest.mark.parametrize("member", ["tool_call_started", "tool_call_completed"])
def test_tool_call_started_completed(member: str) -> None:
    call = pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=pb.ShellArgs(command="ls -la", working_directory="/w")))
    cls = pb.ToolCallStarted if member == "tool_call_started" else pb.ToolCallCompleted
    f = decode_one(U(**{member: cls(call_id="toolu_9", tool_call=call, model_call_id="m")}), "server")
    assert f.kind == f"interaction_update.{member}"
    assert f.summary == f'{member} "toolu_9" shell_tool_call'
    assert f.call_id == "toolu_9"
    t = tree(f)["interaction_update"][member]
    assert t["tool_call"]["shell_tool_call"]["args"] == {"command": "ls -la", "working_directory": "/w"}
    assert t["model_call_id"] == "m"


def test_tool_call_delta() -> None:
    d = pb.ToolCallDelta(shell_tool_call_delta=pb.ShellToolCallDelta(stdout=pb.ShellToolCallStdoutDelta(content="out")))
    f = decode_one(U(tool_call_delta=pb.ToolCallDeltaUpdate(call_id="c1", tool_call_delta=d)), "server")
    assert (f.kind, f.call_id) == ("interaction_update.tool_call_delta", "c1")
    assert f.summary == 'tool_call_delta "c1" shell_tool_call_delta'
    assert tree(f)["interaction_update"]["tool_call_delta"]["tool_call_delta"] == {
        "shell_tool_call_delta": {"stdout": {"content": "out"}}}


def test_step_started_completed() -> None:
    f = decode_one(U(step_completed=pb.StepCompleted(step_id=3, step_duration_ms=1500)), "server")
    assert (f.kind, f.summary) == ("interaction_update.step_completed", "step 3 completed 1500 ms")
    assert f.payload[2:4] == b"\x8a\x01"


def exec_msg(**kw: Any) -> bytes:
    return S(exec_server_message=pb.ExecServerMessage(id=7, exec_id="ex-7", **kw))


def test_exec_shell_args() -> None:
    f = decode_one(exec_msg(shell_args=pb.ShellArgs(command="ls -la", working_directory="/w", timeout=3000,
                                                    tool_call_id="toolu_1")), "server")
    assert (f.kind, f.summary, f.ref_id) == ("exec_server_message.shell_args", 'exec#7 shell_args "ls -la"', 7)
    assert tree(f) == {"exec_server_message": {"id": 7, "exec_id": "ex-7", "shell_args": {
        "command": "ls -la", "working_directory": "/w", "timeout": 3000, "tool_call_id": "toolu_1"}}}


def test_exec_read_and_write_args() -> None:
    f = decode_one(exec_msg(read_args=pb.ReadArgs(path="/w/a.py")), "server")
    assert (f.kind, f.summary) == ("exec_server_message.read_args", 'exec#7 read_args "/w/a.py"')
    f = decode_one(exec_msg(write_args=pb.WriteArgs(path="/w/b.txt", file_text="hi\n")), "server")
    assert (f.kind, f.summary) == ("exec_server_message.write_args", 'exec#7 write_args "/w/b.txt"')
    assert tree(f)["exec_server_message"]["write_args"] == {"path": "/w/b.txt", "file_text": "hi\n"}


def test_exec_mcp_args_values_are_json() -> None:
    opts = pb.Value()
    opts.struct_value.update({"deep": True, "list": [1, "a"]})
    args = {"query": pb.Value(string_value="foo").SerializeToString(),
            "limit": pb.Value(number_value=5).SerializeToString(),
            "opts": opts.SerializeToString(),
            "plain": b"not a Value \xff"}
    f = decode_one(exec_msg(mcp_args=pb.McpArgs(name="github___search", args=args, tool_name="search")), "server")
    assert (f.kind, f.summary) == ("exec_server_message.mcp_args", "exec#7 mcp_args github___search (4 args)")
    got = tree(f)["exec_server_message"]["mcp_args"]
    assert got["name"] == "github___search"
    assert got["tool_name"] == "search"
    assert got["args"]["query"] == "foo"
    assert got["args"]["limit"] == 5
    assert got["args"]["opts"] == {"deep": True, "list": [1, "a"]}
    assert got["args"]["plain"] == {"$hex": b"not a Value \xff".hex()}


def test_exec_results_and_controls() -> None:
    r = pb.ShellResult(success=pb.ShellSuccess(command="ls", exit_code=0, stdout="a\nb\n"))
    f = decode_one(C(exec_client_message=pb.ExecClientMessage(id=7, exec_id="ex-7", shell_result=r)), "client")
    assert (f.kind, f.summary, f.ref_id) == ("exec_client_message.shell_result",
                                             "exec#7 shell_result success exit 0", 7)
    assert tree(f)["exec_client_message"]["shell_result"]["success"]["stdout"] == "a\nb\n"
    f = decode_one(C(exec_client_control_message=pb.ExecClientControlMessage(
        throw=pb.ExecClientThrow(id=9, error="boom", error_code="UNIMPLEMENTED"))), "client")
    assert (f.kind, f.summary, f.ref_id) == ("exec_client_control_message.throw", 'throw exec#9 "boom"', 9)
    assert tree(f) == {"exec_client_control_message": {"throw": {"id": 9, "error": "boom",
                                                                  "error_code": "UNIMPLEMENTED"}}}
    f = decode_one(C(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=7))), "client")
    assert (f.kind, f.summary) == ("exec_client_control_message.stream_close", "stream_close exec#7")
    f = decode_one(S(exec_server_control_message=pb.ExecServerControlMessage(abort=pb.ExecServerAbort(id=4))),
                   "server")
    assert (f.kind, f.summary, f.ref_id) == ("exec_server_control_message.abort", "abort exec#4", 4)


def test_kv_set_and_get() -> None:
    blob = json.dumps({"role": "system", "content": "x" * 12_700}).encode()
    blob_id = bytes.fromhex("3f2a") + bytes(30)
    f = decode_one(S(kv_server_message=pb.KvServerMessage(id=3, set_blob_args=pb.SetBlobArgs(
        blob_id=blob_id, blob_data=blob))), "server")
    assert f.kind == "kv_server_message.set_blob_args"
    assert f.ref_id == 3
    assert f.summary == "set_blob#3 3f2a… 12.4 KB json/system"
    t = tree(f)["kv_server_message"]
    assert t["set_blob_args"]["blob_id"] == blob_id.hex()
    assert json.loads(t["set_blob_args"]["blob_data"])["role"] == "system"

    f = decode_one(S(kv_server_message=pb.KvServerMessage(id=4, get_blob_args=pb.GetBlobArgs(blob_id=blob_id))),
                   "server")
    assert (f.kind, f.summary) == ("kv_server_message.get_blob_args", "get_blob#4 3f2a…")
    f = decode_one(C(kv_client_message=pb.KvClientMessage(id=4, get_blob_result=pb.GetBlobResult(
        blob_data=b"x" * 2048))), "client")
    assert (f.kind, f.summary) == ("kv_client_message.get_blob_result", "get_blob_result#4 2.0 KB")
    f = decode_one(C(kv_client_message=pb.KvClientMessage(id=5, get_blob_result=pb.GetBlobResult())), "client")
    assert f.summary == "get_blob_result#5 miss"
    f = decode_one(C(kv_client_message=pb.KvClientMessage(id=3, set_blob_result=pb.SetBlobResult())), "client")
    assert (f.kind, f.summary) == ("kv_client_message.set_blob_result", "set_blob_result#3 ok")


def test_checkpoint() -> None:
    state = pb.ConversationStateStructure(turns=[b"\x01" * 32, b"\x02" * 32],
                                          token_details=pb.ConversationTokenDetails(used_tokens=1234, max_tokens=200000))
    f = decode_one(S(conversation_checkpoint_update=state), "server")
    assert (f.kind, f.summary) == ("conversation_checkpoint_update", "checkpoint 2 turns, 1234 tokens")
    t = tree(f)["conversation_checkpoint_update"]
    assert t["turns"] == ["01" * 32, "02" * 32]
    assert t["token_details"] == {"used_tokens": 1234, "max_tokens": 200000}


def test_run_request() -> None:
    req = pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="fix the bug", message_id="m1", mode=1))),
        model_details=pb.ModelDetails(model_id="claude-4-sonnet"),
        conversation_id="conv-1")
    payload = C(run_request=req)
    assert payload[:4] == b"\x0a" + payload[1:2] + b"\x0a\x00"  # docs/protocol.md §5: a fresh run starts 0a <len> 0a 00
    f = decode_one(payload, "client")
    assert f.kind == "run_request"
    assert f.summary == 'run_request "claude-4-sonnet" state "fix the bug"'
    t = tree(f)["run_request"]
    assert t["conversation_state"] == {}
    assert t["action"]["user_message_action"]["user_message"] == {"text": "fix the bug", "message_id": "m1",
                                                                 "mode": 1}
    assert t["model_details"] == {"model_id": "claude-4-sonnet"}
    assert t["conversation_id"] == "conv-1"
    f = decode_one(C(run_request=pb.AgentRunRequest(requested_model=pb.RequestedModel(model_id="gpt-5"))), "client")
    assert f.summary == 'run_request "gpt-5" NO state ""'


def test_conversation_action_and_interaction() -> None:
    f = decode_one(C(conversation_action=pb.ConversationAction(cancel_action=pb.CancelAction())), "client")
    assert (f.kind, f.summary) == ("conversation_action.cancel_action", "action cancel_action")
    f = decode_one(S(interaction_query=pb.InteractionQuery(
        id=2, web_search_request_query=pb.WebSearchRequestQuery())), "server")
    assert (f.kind, f.summary, f.ref_id) == ("interaction_query.web_search_request_query",
                                             "query#2 web_search_request_query", 2)


# ---- end-stream ------------------------------------------------------------------------------

def end_stream(doc: dict[str, Any]) -> Frame:
    frames = DEC.decode_body(encode(json.dumps(doc).encode(), FLAG_END_STREAM), "run", "server")
    assert len(frames) == 1
    return frames[0]


def test_end_stream_ok() -> None:
    f = end_stream({})
    assert (f.kind, f.summary, f.flags) == ("end_stream", "end-stream ok", FLAG_END_STREAM)
    assert tree(f) == {}
    f = end_stream({"metadata": {"x-trace": ["1"]}})
    assert f.kind == "end_stream"
    assert tree(f) == {"metadata": {"x-trace": ["1"]}}


def _details() -> bytes:
    return pb.ErrorDetails(error=51, details=pb.CustomErrorDetails(
        title="Usage limit", detail="You hit the limit", is_retryable=False, additional_info={"plan": "pro"}),
        is_expected=True).SerializeToString()


def test_end_stream_error_with_value_details() -> None:
    raw = _details()
    value = base64.b64encode(raw).decode().rstrip("=")  # Connect sends unpadded base64
    f = end_stream({"error": {"code": "resource_exhausted", "message": "Usage%20limit%20reached",
                              "details": [{"type": "aiserver.v1.ErrorDetails", "value": value}]}})
    assert f.kind == "end_stream.error"
    assert f.summary == 'resource_exhausted "Usage limit reached" ERROR_RATE_LIMITED_CHANGEABLE'
    err = tree(f)["error"]
    assert err["code"] == "resource_exhausted"
    assert err["message"] == "Usage limit reached"
    [d] = err["details"]
    assert d["type"] == "aiserver.v1.ErrorDetails"
    assert d["value_hex"] == raw.hex()
    assert d["value"] == {"error": "ERROR_RATE_LIMITED_CHANGEABLE", "is_expected": True, "details": {
        "title": "Usage limit", "detail": "You hit the limit", "additional_info": {"plan": "pro"}}}


def test_end_stream_error_with_debug_details() -> None:
    dbg = {"error": "ERROR_BAD_MODEL_NAME", "details": {"title": "Bad model", "isRetryable": False},
           "isExpected": True}
    f = end_stream({"error": {"code": "not_found", "message": "Error",
                              "details": [{"type": "aiserver.v1.ErrorDetails", "debug": dbg}]}})
    assert (f.kind, f.summary) == ("end_stream.error", 'not_found "Error" ERROR_BAD_MODEL_NAME')
    assert tree(f)["error"]["details"] == [{"type": "aiserver.v1.ErrorDetails", "debug": dbg}]


def test_end_stream_error_bad_base64_detail_is_kept() -> None:
    f = end_stream({"error": {"code": "internal", "message": "Error",
                              "details": [{"type": "aiserver.v1.ErrorDetails", "value": "!!!"}]}})
    assert f.kind == "end_stream.error"
    [d] = tree(f)["error"]["details"]
    assert "value_error" in d or d.get("value_hex") is not None


def test_end_stream_not_json_is_malformed() -> None:
    [f] = DEC.decode_body(encode(b"not json", FLAG_END_STREAM), "run", "server")
    assert f.kind == "malformed"
    assert "JSON" in (f.error or "")
    assert tree(f) == {"$hex": b"not json".hex()}  # nothing lost


# ---- unknown members and fields --------------------------------------------------------------

def test_unknown_exec_member_keeps_number() -> None:
    inner = vi(1, 7) + ld(77, ld(1, "x"))
    f = decode_one(ld(2, inner), "server")
    assert f.kind == "exec_server_message.77"
    assert f.ref_id == 7
    assert "77" in f.summary
    assert tree(f) == {"exec_server_message": {"id": 7, "77": {"1": "x"}}}


def test_unknown_top_level_member() -> None:
    f = decode_one(ld(6, ld(1, "hello")), "server")  # AgentServerMessage has no field 6
    assert f.kind == "6"
    assert tree(f) == {"6": {"1": "hello"}}
    f = decode_one(ld(40, b"\x08\x01"), "client")
    assert f.kind == "40"


def test_unknown_interaction_update_member() -> None:
    f = decode_one(ld(1, ld(30, b"")), "server")
    assert f.kind == "interaction_update.30"
    assert tree(f) == {"interaction_update": {"30": ""}}


def test_unknown_fields_inside_known_messages() -> None:
    nested = ld(1, "inner text") + vi(2, 5)
    td = ld(1, "hi") + ld(9, "héllo → wörld") + ld(10, nested) + ld(11, b"\xff\xfe\x00\x01") + vi(12, 300)
    f = decode_one(ld(1, ld(1, td)), "server")
    assert (f.kind, f.summary) == ("interaction_update.text_delta", 'text "hi"')
    got = tree(f)["interaction_update"]["text_delta"]
    assert got == {"text": "hi", "9": "héllo → wörld", "10": {"1": "inner text", "2": 5},
                   "11": {"$hex": "fffe0001"}, "12": 300}


# ---- malformed and empty -------------------------------------------------------------------

def test_malformed_and_empty() -> None:
    [f] = DEC.decode_body(encode(b"\x0a\x05ab"), "run", "server")  # length runs past the end
    assert f.kind == "malformed"
    assert f.error
    assert "protobuf" in f.error
    assert f.payload == b"\x0a\x05ab"
    [f] = DEC.decode_body(encode(b""), "run", "server")
    assert f.kind == "empty"
    # invalid UTF-8 in a string field: the schema disagrees with that field, not with the frame
    # (issue 21): the kind stands, the field is flagged (tests/decode/test_schema_mismatch.py)
    [f] = DEC.decode_body(encode(ld(1, ld(1, ld(1, b"\xff\xfe")))), "run", "server")
    assert (f.kind, f.error) == ("interaction_update.text_delta", None)
    assert [m["path"] for m in f.meta["schema_mismatch"]] == ["interaction_update.text_delta.text"]
    # …but a top-level member that is no message at all leaves nothing parsed: malformed
    [f] = DEC.decode_body(encode(ld(1, b"\xff\xfe")), "run", "server")
    assert f.kind == "malformed"
