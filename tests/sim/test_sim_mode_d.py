"""Mode D against the simulator: the independent gRPC-Web test client (tests/clients/).

HTTP/1.1, RunSSE + enveloped BidiAppends as application/grpc-web+proto, 0x80 trailers, the
AiService model listing as Connect JSON, and stateless tool calls (each follow-up a fresh run
with a new conversation_id and the history flattened into the prompt).
"""

from __future__ import annotations

import base64
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "clients"))

from grpcweb_mode_d_client import ModeDClient, flatten, tool_round  # noqa: E402

from workbench.schema import pb  # noqa: E402

pytestmark = pytest.mark.slow  # starts subprocesses or servers

BASH = {"name": "bash", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
READ = {"name": "read", "parameters": {"type": "object", "properties": {"filePath": {"type": "string"}}}}
WRITE = {"name": "write", "parameters": {"type": "object", "properties": {
    "filePath": {"type": "string"}, "content": {"type": "string"}}}}


def client(sim: Any, **kw: Any) -> ModeDClient:
    return ModeDClient(sim.url, "test-token", str(sim.cert_path), **kw)


def healthy(res: Any) -> None:
    """What mode D needs to see: every append accepted, the end as a gRPC-Web trailer, no Connect frames."""
    assert set(res.append_statuses) == {200}, res.append_statuses
    assert set(res.append_grpc_status) == {"0"}, res.append_statuses
    assert res.connect_end_frames == 0


@pytest.mark.parametrize("style", ["seed", "opencode"])
async def test_tool_call_then_stateless_followup_continues_the_scenario(sim_factory: Any, style: str) -> None:
    sim = await sim_factory()
    c = client(sim)
    assert "gpt-5" in await c.list_models()  # /aiserver.v1.AiService/GetUsableModels, Connect JSON

    messages = [{"role": "user", "content": "[scenario:tool_flow] say hello with the shell"}]
    first = await c.run(flatten(messages, style), tools=[BASH])
    healthy(first)
    [call] = first.tool_calls
    assert call.name == "bash"
    assert call.arguments == {"command": "echo hello from workbench"}
    assert first.abandoned
    assert first.trailer is None  # handed out: the run is left, never resumed

    messages = tool_round(messages, call, "hello from workbench")
    second = await c.run(flatten(messages, style), conversation_id=str(uuid.uuid4()), tools=[BASH])
    healthy(second)
    assert second.turn_ended
    assert second.grpc_status == "0"
    assert second.text == "The bash call returned: hello from workbench"
    assert not any(k.startswith("exec_server_message") for k in second.kinds)  # not the same call again

    runs = await sim.state.finished_runs(2)
    assert runs[0].conversation_id != runs[1].conversation_id
    assert [r.framing for r in runs] == ["grpc_web", "grpc_web"]
    assert (runs[1].path, runs[1].outcome, runs[1].faults) == ("history", "turn_ended", [])
    assert runs[0].outcome.startswith("disconnected while waiting for exec 2")


async def test_multi_step_history_resumes_with_the_next_tool(sim_factory: Any) -> None:
    sim = await sim_factory()
    c = client(sim)
    messages = [{"role": "user", "content": "[scenario:read_write] take notes"}]
    first = await c.run(flatten(messages), tools=[READ, WRITE])
    assert [t.name for t in first.tool_calls] == ["read"]
    messages = tool_round(messages, first.tool_calls[0], "# Readme\nline two\n")
    second = await c.run(flatten(messages), conversation_id=str(uuid.uuid4()), tools=[READ, WRITE])
    assert [t.name for t in second.tool_calls] == ["write"]  # the next tool, not the read again
    assert second.text.startswith("Read it (")
    messages = tool_round(messages, second.tool_calls[0], "wrote NOTES.md")
    third = await c.run(flatten(messages), conversation_id=str(uuid.uuid4()), tools=[READ, WRITE])
    healthy(third)
    assert third.turn_ended
    assert third.text == "Done: wrote NOTES.md."
    assert third.tool_calls == []
    assert [r.path for r in await sim.state.finished_runs(3)] == ["steps", "history", "history"]


async def test_executing_client_2026_style_has_no_faults(sim_factory: Any) -> None:
    """Results alone, a shell stream closed only after its final shell_result: healthy by default."""
    sim = await sim_factory()
    c = client(sim)
    for scenario in ("shell_stream", "explore", "read_write"):
        res = await c.run(f"[scenario:{scenario}] go", hand_out=False)
        healthy(res)
        assert res.turn_ended, (scenario, res.kinds[-5:])
        assert res.grpc_status == "0", (scenario, res.kinds[-5:])
        if scenario == "shell_stream":
            i = res.sent.index("exec_client_message.shell_result")
            assert res.sent[i - 3:i + 2] == ["exec_client_message.shell_stream_result"] * 3 + [
                "exec_client_message.shell_result", "exec_client_control_message.stream_close"]
    runs = await sim.state.finished_runs(3)
    assert [(r.outcome, r.faults) for r in runs] == [("turn_ended", [])] * 3
    assert runs[0].execs[0].results == 4
    assert runs[0].execs[0].closed  # 3 events + the final shell_result
    assert not any(e.closed for r in runs[1:] for e in r.execs)  # never closed, never needed


async def test_strict_server_stalls_the_client_until_it_sends_stream_close(sim_factory: Any) -> None:
    sim = await sim_factory(stream_close="required")
    c = client(sim, close_policy="never", close_after_heartbeats=3)
    res = await c.run("[scenario:tool_flow] go", hand_out=False)
    healthy(res)
    assert res.turn_ended
    assert res.grpc_status == "0"
    closes = [i for i, s in enumerate(res.sent) if s == "exec_client_control_message.stream_close"]
    assert len(closes) == 2  # one per exec, each sent only after the stall
    # Between the request_context result and the end of the stall the server sent heartbeats only.
    first_exec = res.kinds.index("exec_server_message.request_context_args")
    after = res.kinds[first_exec + 1:]
    assert after[:3] == ["interaction_update.heartbeat"] * 3
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert not rec.faults
    assert rec.heartbeats >= 6


async def test_enveloped_append_sent_as_connect_unary_gets_415(sim_factory: Any) -> None:
    sim = await sim_factory()
    res = await client(sim, append_content_type="application/proto").run("[scenario:text] hi")
    assert res.append_statuses == [415]
    assert res.error
    assert "run_request" in res.error
    assert res.kinds == []  # nothing reached the run


async def test_errors_reach_a_grpc_web_client_as_trailers(sim_factory: Any) -> None:
    sim = await sim_factory()
    c = client(sim)
    res = await c.run("[scenario:rate_limit] go")
    assert res.grpc_status == "8"
    assert "interaction_update.text_delta" in res.kinds  # mid-turn, after text
    res = await c.run("hi", model="no-such-model")
    assert res.grpc_status == "5"
    assert res.trailer is not None
    assert res.trailer["grpc-message"] == "Error"
    status = pb.RpcStatus.FromString(base64.b64decode(res.trailer["grpc-status-details-bin"] + "=="))
    assert pb.ErrorDetails.FromString(status.details[0].value).details.title == "Invalid model"
