"""The simulator over h2 Run (TLS, real sockets): turn shape, execs, parking, errors, scenarios."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, struct_pb2
from sim_h2 import (
    RunSession,
    answer_exec,
    detail_error,
    error_of,
    frames_until_heartbeats,
    open_run,
    run_request,
    server_msg,
    shell_ok,
)

from workbench.schema import pb
from workbench.sim.scenario import ScenarioError, load_scenarios


@pytest.mark.slow
async def test_text_turn_shape(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("What is 2+2?", model="gpt-5"))
    frames = await s.until("interaction_update.turn_ended")
    end = await s.next()
    kinds = [f.kind for f in frames]
    assert kinds[:3] == ["kv_server_message.set_blob_args", "kv_server_message.set_blob_args",
                         "kv_server_message.get_blob_args"]
    first = {k: kinds.index(k) for k in reversed(kinds)}
    assert first["interaction_update.thinking_delta"] < first["interaction_update.thinking_completed"] \
        < first["interaction_update.text_delta"] < first["conversation_checkpoint_update"] \
        < first["interaction_update.step_completed"] < first["interaction_update.turn_ended"]
    assert kinds.count("interaction_update.text_delta") == 4
    assert kinds.count("interaction_update.token_delta") == 4
    assert end is not None
    assert end.kind == "end_stream"
    assert end.payload == b"{}"

    # The prompt blobs are AI-SDK JSON messages keyed by SHA-256 of their bytes.
    sets = [server_msg(f).kv_server_message.set_blob_args for f in frames
            if f.kind == "kv_server_message.set_blob_args"]
    system, user = (json.loads(b.blob_data) for b in sets[:2])
    assert system["role"] == "system"
    assert "gpt-5" in system["content"]
    assert user["role"] == "user"
    assert "What is 2+2?" in user["content"][0]["text"]
    assert all(hashlib.sha256(b.blob_data).digest() == b.blob_id for b in sets)
    text = "".join(server_msg(f).interaction_update.text_delta.text for f in frames
                   if f.kind == "interaction_update.text_delta")
    assert "What is 2+2?" in text

    # Every blob the checkpoint references was set in this run.
    cp = next(server_msg(f).conversation_checkpoint_update for f in frames
              if f.kind == "conversation_checkpoint_update")
    set_ids = {bytes(b.blob_id) for b in sets}
    assert len(cp.turns) == 1
    assert bytes(cp.turns[0]) in set_ids
    assert all(bytes(r) in set_ids for r in cp.root_prompt_messages_json)
    assert cp.token_details.max_tokens > cp.token_details.used_tokens > 0
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert rec.scenario == "text"
    assert not rec.faults
    assert not rec.blob_misses
    await client.close()


@pytest.mark.slow
async def test_run_is_full_duplex(sim_factory: Any) -> None:
    """The server's frames arrive while the request body is still open, and it needs our answers."""
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("hello"))
    first = await s.next()
    assert first is not None
    assert first.kind == "kv_server_message.set_blob_args"
    assert not s.ended
    # The run cannot go on until we answer on the same (still open) request body.
    await s.answer_kv(first)
    frames = await s.until("interaction_update.turn_ended")
    assert frames[-1].kind == "interaction_update.turn_ended"
    await s.stream.end()  # only now does the client finish its side
    assert (await s.next()).kind == "end_stream"  # type: ignore[union-attr]
    await client.close()


@pytest.mark.slow
async def test_tool_flow_exec_then_text(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] list things"))
    before = await s.until("exec_server_message.request_context_args")
    assert [f.kind for f in before][:2] == ["kv_server_message.set_blob_args"] * 2
    await answer_exec(s, before[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess(request_context=pb.RequestContext()))})
    frames = await s.until("exec_server_message.shell_args")
    partial = [server_msg(f).interaction_update.partial_tool_call for f in frames
               if f.kind == "interaction_update.partial_tool_call"]
    snaps = [p.args_text_delta for p in partial]
    assert len(snaps) == 3
    assert all(b.startswith(a) and len(b) > len(a) for a, b in zip(snaps, snaps[1:], strict=False))
    assert json.loads(snaps[-1])["command"] == "echo hello from workbench"
    started = next(server_msg(f).interaction_update.tool_call_started for f in frames
                   if f.kind == "interaction_update.tool_call_started")
    assert started.call_id == partial[0].call_id
    assert started.tool_call.shell_tool_call.args.command == "echo hello from workbench"
    exec_msg = server_msg(frames[-1]).exec_server_message
    assert exec_msg.shell_args.tool_call_id == started.call_id
    assert exec_msg.exec_id

    await answer_exec(s, frames[-1], shell_ok("hello from workbench\n"))
    rest = await s.until("interaction_update.turn_ended")
    kinds = [f.kind for f in rest]
    assert kinds.index("interaction_update.tool_call_delta") < kinds.index("interaction_update.tool_call_completed") \
        < kinds.index("interaction_update.text_delta")
    done = next(server_msg(f).interaction_update.tool_call_completed for f in rest
                if f.kind == "interaction_update.tool_call_completed")
    assert done.tool_call.shell_tool_call.result.success.stdout == "hello from workbench\n"
    text = "".join(server_msg(f).interaction_update.text_delta.text for f in rest
                   if f.kind == "interaction_update.text_delta")
    assert "hello from workbench" in text
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert [(e.kind, e.results, e.closed) for e in rec.execs] == [("request_context", 1, True), ("shell", 1, True)]
    await client.close()


@pytest.mark.slow
async def test_client_tools_turn_shell_into_mcp(sim_factory: Any) -> None:
    sim = await sim_factory()
    schema = struct_pb2.Value()
    json_format.ParseDict({"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
                          schema)
    tool = pb.McpToolDefinition(name="myserver___run_command", tool_name="run_command",
                                provider_identifier="myserver", description="run a command",
                                input_schema=schema.SerializeToString())
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] go", mcp_tools=[tool]))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess())})
    frames = await s.until("exec_server_message.mcp_args")
    mcp = server_msg(frames[-1]).exec_server_message.mcp_args
    assert mcp.name == "myserver___run_command"
    assert mcp.tool_name == "run_command"
    assert set(mcp.args) == {"cmd"}
    assert struct_pb2.Value.FromString(mcp.args["cmd"]).string_value == "echo hello from workbench"
    await answer_exec(s, frames[-1], {"mcp_result": pb.McpResult(success=pb.McpSuccess(
        content=[pb.McpToolResultContentItem(text=pb.McpTextContent(text="ran it: 42"))]))})
    rest = await s.until("interaction_update.turn_ended")
    text = "".join(server_msg(f).interaction_update.text_delta.text for f in rest
                   if f.kind == "interaction_update.text_delta")
    assert "ran it: 42" in text
    await client.close()


@pytest.mark.slow
async def test_missing_stream_close_parks_with_heartbeats_when_strict(sim_factory: Any) -> None:
    """--strict-stream-close: the December 2025 stall (a result alone parks the run)."""
    sim = await sim_factory(scenario="tool_flow", stream_close="required")
    client, s = await open_run(sim)
    await s.send(run_request("no marker: the server default is tool_flow"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess())})
    frames = await s.until("exec_server_message.shell_args")
    await answer_exec(s, frames[-1], shell_ok("hi\n"), close=False)  # result, but no stream_close
    seen = await frames_until_heartbeats(s)
    kinds = [f.kind for f in seen]
    assert kinds.count("interaction_update.heartbeat") >= 3
    assert set(kinds) == {"interaction_update.heartbeat"}, kinds
    rec = sim.state.runs[0]
    assert rec.waiting_for is not None
    assert "stream_close" in rec.waiting_for
    await client.close()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome is not None
    assert rec.outcome.startswith("disconnected while waiting for exec 2")


@pytest.mark.slow
async def test_unanswered_exec_hits_park_timeout(sim_factory: Any) -> None:
    # A server that waits for the request context (--strict-request-context); by default it would go on.
    sim = await sim_factory(park_timeout=0.3, strict_request_context=True)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:read_write] edit"))
    await s.until("exec_server_message.request_context_args")  # never answered
    rest: list[Any] = []
    while (f := await s.next()) is not None:
        rest.append(f)
    assert [f.kind for f in rest[:-1]] == ["interaction_update.heartbeat"] * (len(rest) - 1)
    assert len(rest) >= 3
    err = error_of(s, rest[-1])
    assert err["code"] == "deadline_exceeded"
    assert "exec 1 (request_context) result" in err["message"]
    await client.close()


@pytest.mark.slow
async def test_read_write_two_execs(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:read_write] please"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess())})
    read = await s.until("exec_server_message.read_args")
    assert server_msg(read[-1]).exec_server_message.read_args.path == "README.md"
    await answer_exec(s, read[-1], {"read_result": pb.ReadResult(success=pb.ReadSuccess(
        path="README.md", content="a\nb\nc\n", total_lines=3))})
    write = await s.until("exec_server_message.write_args")
    wa = server_msg(write[-1]).exec_server_message.write_args
    assert wa.path == "NOTES.md"
    assert wa.file_text.startswith("# Notes")
    done_read = next(server_msg(f).interaction_update.tool_call_completed for f in write
                     if f.kind == "interaction_update.tool_call_completed")
    assert done_read.tool_call.read_tool_call.result.success.content == "a\nb\nc\n"
    await answer_exec(s, write[-1], {"write_result": pb.WriteResult(success=pb.WriteSuccess(
        path="NOTES.md", lines_created=3))})
    rest = await s.until("interaction_update.turn_ended")
    done_write = next(server_msg(f).interaction_update.tool_call_completed for f in rest
                      if f.kind == "interaction_update.tool_call_completed")
    assert done_write.tool_call.edit_tool_call.result.success.path == "NOTES.md"
    await client.close()


@pytest.mark.slow
async def test_mcp_large_args_completion_is_lossy(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:mcp_large_args] dispatch"))
    frames = await s.until("exec_server_message.mcp_args")
    snaps = [server_msg(f).interaction_update.partial_tool_call.args_text_delta for f in frames
             if f.kind == "interaction_update.partial_tool_call"]
    full = json.loads(snaps[-1])
    assert len(full["tasks"]) == 40
    assert isinstance(full["options"], dict)
    assert all(b.startswith(a) for a, b in zip(snaps, snaps[1:], strict=False))
    exec_args = server_msg(frames[-1]).exec_server_message.mcp_args
    assert exec_args.name == "cursor___task"
    tasks = json_format.MessageToDict(struct_pb2.Value.FromString(exec_args.args["tasks"]))
    assert len(tasks) == 40
    assert tasks[0]["id"] == "task-00"
    await answer_exec(s, frames[-1], {"mcp_result": pb.McpResult(success=pb.McpSuccess(
        content=[pb.McpToolResultContentItem(text=pb.McpTextContent(text="40 subagents started"))]))})
    rest = await s.until("interaction_update.turn_ended")
    done = next(server_msg(f).interaction_update.tool_call_completed for f in rest
                if f.kind == "interaction_update.tool_call_completed")
    args = done.tool_call.mcp_tool_call.args.args
    assert "tasks" not in args
    assert "description" in args
    options = struct_pb2.Value.FromString(args["options"])
    assert options.WhichOneof("kind") == "string_value"
    assert json.loads(options.string_value) == full["options"]
    await client.close()


@pytest.mark.slow
async def test_kv_only_on_reuse_then_new_run(sim_factory: Any) -> None:
    sim = await sim_factory()
    conv = str(uuid.uuid4())
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:kv_only_on_reuse] run it", conversation_id=conv))
    frames = await s.until("exec_server_message.shell_args")
    checkpoint = next(server_msg(f).conversation_checkpoint_update for f in frames
                      if f.kind == "conversation_checkpoint_update")
    assert len(checkpoint.pending_tool_calls) == 1
    await answer_exec(s, frames[-1], shell_ok("Hello from KV blob investigation\n"))
    seen = await frames_until_heartbeats(s, 5)
    kinds = [f.kind for f in seen]
    assert "interaction_update.tool_call_completed" in kinds
    assert kinds.count("interaction_update.heartbeat") >= 3
    assert "interaction_update.text_delta" not in kinds
    assert "interaction_update.turn_ended" not in kinds
    blobs = [json.loads(server_msg(f).kv_server_message.set_blob_args.blob_data) for f in seen
             if f.kind == "kv_server_message.set_blob_args"]
    assert blobs
    assert blobs[-1]["role"] == "assistant"
    assert blobs[-1]["content"][0]["type"] == "tool-call"
    assert blobs[-1]["content"][0]["toolName"] == "Shell"
    await client.close()

    # The fix: a new run on the same conversation with the checkpoint echoed gets the text.
    client2, s2 = await open_run(sim)
    await s2.send(run_request("[scenario:kv_only_on_reuse] run it", conversation_id=conv, state=checkpoint))
    rest = await s2.until("interaction_update.turn_ended")
    assert "interaction_update.text_delta" in [f.kind for f in rest]
    runs = (await sim.state.finished_runs(2))
    assert runs[0].path == "on_reuse"
    assert runs[1].path == "continuation"
    assert not runs[1].blob_misses  # the echoed checkpoint's blobs were in our client store
    await client2.close()


@pytest.mark.slow
async def test_second_turn_reads_checkpoint_blobs(sim_factory: Any) -> None:
    sim = await sim_factory()
    conv = str(uuid.uuid4())
    client, s = await open_run(sim)
    await s.send(run_request("turn one", conversation_id=conv))
    frames = await s.until("interaction_update.turn_ended")
    cp = next(server_msg(f).conversation_checkpoint_update for f in frames
              if f.kind == "conversation_checkpoint_update")
    s2 = await RunSession.open(client)
    await s2.send(run_request("turn two", conversation_id=conv, state=cp))
    gets: list[bytes] = []
    forgetful: dict[bytes, bytes] = {}  # a client that lost its blob store
    while True:
        f = await s2.next()
        assert f is not None
        if f.kind == "kv_server_message.get_blob_args":
            gets.append(bytes(server_msg(f).kv_server_message.get_blob_args.blob_id))
        if f.kind.startswith("kv_server_message"):
            await s2.answer_kv(f, forgetful)
        if f.kind == "interaction_update.turn_ended":
            break
    assert gets[0] == bytes(cp.turns[-1])
    rec = (await sim.state.finished_runs(2))[1]
    assert rec.blob_misses
    assert rec.blob_misses[0].startswith("turns ")
    await client.close()


@pytest.mark.slow
async def test_cancel_action_ends_the_stream(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] x"))
    await s.until("exec_server_message.request_context_args")
    await s.send(pb.AgentClientMessage(conversation_action=pb.ConversationAction(
        cancel_action=pb.CancelAction(reason="user pressed stop"))))
    rest: list[Any] = []
    while (f := await s.next()) is not None:
        rest.append(f)
    assert rest[-1].kind == "end_stream"
    assert (await sim.state.finished_runs(1))[0].outcome == "cancelled"
    await client.close()


@pytest.mark.slow
@pytest.mark.parametrize(("scenario", "last_kinds"), [
    ("no_turn_end", ["conversation_checkpoint_update", "end_stream"]),
])
async def test_marker_selects_scenario(sim_factory: Any, scenario: str, last_kinds: list[str]) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request(f"please [scenario:{scenario}] now"))
    frames: list[Any] = []
    while (f := await s.next()) is not None:
        frames.append(f)
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f)
    kinds = [f.kind for f in frames]
    assert kinds[-2:] == last_kinds
    assert "interaction_update.turn_ended" not in kinds
    assert "interaction_update.text_delta" in kinds
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.scenario == scenario
    assert rec.outcome == "ended without turn_ended"
    await client.close()


@pytest.mark.slow
async def test_rate_limit_end_stream_error(sim_factory: Any) -> None:
    sim = await sim_factory(scenario="rate_limit")
    client, s = await open_run(sim)
    await s.send(run_request("hi"))
    frames: list[Any] = []
    while (f := await s.next()) is not None:
        frames.append(f)
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f)
    assert "interaction_update.text_delta" in [f.kind for f in frames]
    err = error_of(s, frames[-1])
    assert err["code"] == "resource_exhausted"
    assert detail_error(err) == "ERROR_RATE_LIMITED_CHANGEABLE"
    assert err["details"][0]["debug"]["details"]["title"] == "You've hit your usage limit"
    await client.close()


async def one_error(sim: Any, message: bytes, token: str | None = "test-token") -> tuple[RunSession, dict[str, Any]]:
    client, s = await open_run(sim, token=token)
    await s.send(message)
    f = await s.next()
    assert f is not None
    err = error_of(s, f)
    assert await s.next() is None
    await client.close()
    return s, err


@pytest.mark.slow
async def test_auth_errors(sim_factory: Any) -> None:
    sim = await sim_factory()
    _, err = await one_error(sim, run_request("hi"), token=None)
    assert err["code"] == "unauthenticated"
    assert detail_error(err) == "ERROR_NOT_LOGGED_IN"
    locked = await sim_factory(token="s3cret")
    _, err = await one_error(locked, run_request("hi"), token="wrong")
    assert err["code"] == "unauthenticated"
    assert detail_error(err) == "ERROR_NOT_LOGGED_IN"
    client, s = await open_run(locked, token="s3cret")
    await s.send(run_request("hi"))
    assert (await s.until("interaction_update.turn_ended"))[-1].kind == "interaction_update.turn_ended"
    await client.close()


@pytest.mark.slow
async def test_bad_model_missing_state_unknown_scenario(sim_factory: Any) -> None:
    sim = await sim_factory()
    _, err = await one_error(sim, run_request("hi", model="gpt-9000"))
    assert err["code"] == "not_found"
    assert detail_error(err) == "ERROR_BAD_MODEL_NAME"
    assert "gpt-9000" in err["details"][0]["value"]["details"]["detail"]
    _, err = await one_error(sim, run_request("hi", with_state=False))
    assert err["message"] == "Conversation state is required"
    _, err = await one_error(sim, run_request("[scenario:does_not_exist] hi"))
    assert err["code"] == "invalid_argument"
    assert "does_not_exist" in err["message"]
    assert "tool_flow" in err["message"]


@pytest.mark.slow
async def test_user_scenario_dir(sim_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "haiku.json").write_text(json.dumps({
        "description": "a custom one",
        "steps": [{"kv_set": "user"}, {"text": "Custom answer for {model}", "chunks": 1},
                  {"turn_ended": True}, {"end": "ok"}]}))
    sim = await sim_factory(scenario_dirs=[tmp_path])
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:haiku]", model="composer-1"))
    frames = await s.until("interaction_update.turn_ended")
    texts = [server_msg(f).interaction_update.text_delta.text for f in frames
             if f.kind == "interaction_update.text_delta"]
    assert texts == ["Custom answer for composer-1"]
    await client.close()


def test_bad_scenario_files_are_named(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text(json.dumps({"steps": [{"kv_set": "user"}, {"txt": "oops"}]}))
    with pytest.raises(ScenarioError, match=r"broken\.json: steps\[1\]: unknown verb 'txt'"):
        load_scenarios([tmp_path])
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ScenarioError, match=r"broken\.json: not valid JSON"):
        load_scenarios([tmp_path])
    with pytest.raises(ScenarioError, match="does not exist"):
        load_scenarios([tmp_path / "nope"])


def test_builtin_scenarios_load() -> None:
    names = set(load_scenarios())
    assert {"text", "tool_flow", "read_write", "mcp_large_args", "kv_only_on_reuse", "no_turn_end",
            "rate_limit"} <= names


@pytest.mark.slow
async def test_new_run_resumes_after_abandoned_tool_calls(sim_factory: Any) -> None:
    """A client that answers tool calls with a fresh run (history in the prompt), like the OpenAI proxy."""
    sim = await sim_factory()
    conv = str(uuid.uuid4())
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:read_write] notes", conversation_id=conv))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess())})
    read = await s.until("exec_server_message.read_args")
    call_id = server_msg(read[-1]).exec_server_message.read_args.tool_call_id
    await client.close()  # abandon the run with the exec unanswered

    history = (f"[scenario:read_write] notes\nASSISTANT TOOL_CALL (call_id: {call_id}): read {{}}\n\n"
               f"TOOL_RESULT (call_id: {call_id}):\nthree lines of README\n\nContinue.")
    client, s = await open_run(sim)
    await s.send(run_request(history, conversation_id=conv))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess())})
    frames = await s.until("exec_server_message.write_args")  # the read is not asked again
    kinds = [f.kind for f in frames]
    assert "exec_server_message.read_args" not in kinds
    text = "".join(server_msg(f).interaction_update.text_delta.text for f in frames
                   if f.kind == "interaction_update.text_delta")
    assert "three lines of README" in text
    await client.close()
    runs = await sim.state.finished_runs(2)
    assert runs[1].path == "resumed"


@pytest.mark.slow
async def test_gzip_envelopes_for_clients_that_accept_them(sim_factory: Any) -> None:
    sim = await sim_factory(gzip_min=1000)
    client, s = await open_run(sim, **{"connect-accept-encoding": "gzip"})
    await s.send(run_request("zip it"))
    frames = await s.until("interaction_update.turn_ended")
    assert s.stream.headers.get("connect-content-encoding") == "gzip"
    system = frames[0]  # the ~5 KB system prompt blob: compressed on the wire, decoded intact
    assert system.flags & 0x01
    assert json.loads(server_msg(system).kv_server_message.set_blob_args.blob_data)["role"] == "system"
    assert not any(f.flags & 0x01 for f in frames if f.kind == "interaction_update.text_delta")
    await client.close()
    plain_client, plain = await open_run(sim)  # no connect-accept-encoding: never compressed
    await plain.send(run_request("plain"))
    assert not any(f.flags & 0x01 for f in await plain.until("interaction_update.turn_ended"))
    await plain_client.close()
