"""Issue 21, item 1: the request context is optional (docs/sim.md "Request context").

By default a run does not wait for the answer to ``request_context_args``: a client that puts its
context in the run request and never answers (the published Bun proxy since December 2025) gets
its turn, with its tools taken from the run request. The strict behaviour (server option, scenario
flag, step option) still parks it. Raw h2 sessions against the real server over TLS.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sim_h2 import answer_exec, error_of, open_run, run_request, server_msg, shell_ok

from workbench.schema import pb
from workbench.sim.scenario import ScenarioError, load_scenarios

SCHEMA = json.dumps({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
RUN_REQUEST_TOOL = pb.McpToolDefinition(name="bun___echo", tool_name="echo", provider_identifier="bun",
                                        description="echo", input_schema_json=SCHEMA)


def mcp_ok(text: str) -> dict[str, Any]:
    return {"mcp_result": pb.McpResult(success=pb.McpSuccess(
        content=[pb.McpToolResultContentItem(text=pb.McpTextContent(text=text))]))}


def context_in_run_request(prompt: str) -> bytes:
    """A run request carrying the context the way stateless proxies send it: in the action and mcp_tools."""
    msg = pb.AgentClientMessage.FromString(run_request(prompt, mcp_tools=[RUN_REQUEST_TOOL]))
    ctx = msg.run_request.action.user_message_action.request_context
    ctx.env.workspace_paths.append("/work/project")
    ctx.tools.append(RUN_REQUEST_TOOL)
    return bytes(msg.SerializeToString())


@pytest.mark.slow
async def test_unanswered_request_context_does_not_hold_the_turn(sim_factory: Any) -> None:
    # A long grace: the run request carries the context, so the server does not wait for the answer at all.
    sim = await sim_factory(request_context_grace=60)
    client, s = await open_run(sim)
    await s.send(context_in_run_request("[scenario:tool_flow] go"))
    await s.until("exec_server_message.request_context_args")  # never answered
    frames = await s.until("exec_server_message.mcp_args")  # the tool of the run request
    assert "interaction_update.heartbeat" not in [f.kind for f in frames]  # it never waited
    mcp = server_msg(frames[-1]).exec_server_message.mcp_args
    assert (mcp.name, mcp.tool_name, mcp.provider_identifier) == ("bun___echo", "echo", "bun")
    assert set(mcp.args) == {"text"}
    await answer_exec(s, frames[-1], mcp_ok("echoed 7"), close=False)
    rest = await s.until("interaction_update.turn_ended")
    assert "echoed 7" in "".join(server_msg(f).interaction_update.text_delta.text for f in rest
                                 if f.kind == "interaction_update.text_delta")
    end = await s.next()
    assert end is not None and end.kind == "end_stream" and end.payload == b"{}"
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert rec.faults == []
    assert [(e.kind, e.results, e.background) for e in rec.execs] == [("request_context", 0, True), ("mcp", 1, False)]
    await client.close()


@pytest.mark.slow
async def test_answer_on_its_way_is_waited_for_briefly_and_its_tools_used(sim_factory: Any) -> None:
    """A client that answers late (within the grace) still has the tools of its answer used."""
    sim = await sim_factory(request_context_grace=30)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] go"))  # no tools in the run request
    rc = await s.until("exec_server_message.request_context_args")
    before = await s.until("interaction_update.thinking_completed")  # the turn goes on meanwhile
    assert "exec_server_message.mcp_args" not in [f.kind for f in before]
    ctx = pb.RequestContext(tools=[pb.McpToolDefinition(name="late___run", tool_name="run", provider_identifier="late",
                                                        input_schema_json=SCHEMA)])
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess(request_context=ctx))}, close=False)
    frames = await s.until("exec_server_message.mcp_args")
    assert server_msg(frames[-1]).exec_server_message.mcp_args.name == "late___run"
    await answer_exec(s, frames[-1], mcp_ok("done"), close=False)
    await s.until("interaction_update.turn_ended")
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended" and rec.faults == []
    assert (rec.execs[0].kind, rec.execs[0].results) == ("request_context", 1)
    await client.close()


@pytest.mark.slow
async def test_answer_after_the_tool_call_is_taken_without_fault(sim_factory: Any) -> None:
    sim = await sim_factory(request_context_grace=0)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:read_write] go"))
    rc = await s.until("exec_server_message.request_context_args")
    read = await s.until("exec_server_message.read_args")  # no grace: the built-in read
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(
        success=pb.RequestContextSuccess())})  # only now, and closed
    await answer_exec(s, read[-1], {"read_result": pb.ReadResult(success=pb.ReadSuccess(
        path="README.md", content="x\n", total_lines=1))}, close=False)
    write = await s.until("exec_server_message.write_args")
    await answer_exec(s, write[-1], {"write_result": pb.WriteResult(success=pb.WriteSuccess(
        path="NOTES.md", lines_created=3))}, close=False)
    await s.until("interaction_update.turn_ended")
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert rec.faults == []
    assert [(e.kind, e.results, e.closed) for e in rec.execs][0] == ("request_context", 1, True)
    await client.close()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["server", "scenario", "step"])
async def test_strict_request_context_parks_a_client_that_never_answers(sim_factory: Any, tmp_path: Path,
                                                                       how: str) -> None:
    kw: dict[str, Any] = {"park_timeout": 0.4}
    scenario = "tool_flow"
    if how == "server":
        kw["strict_request_context"] = True
    elif how == "scenario":
        scenario = "request_context_stall"
    else:
        (tmp_path / "ctx_wait.json").write_text(json.dumps({"steps": [
            {"request_context": True, "wait": True}, {"tool": {"exec": "shell"}}, {"turn_ended": True}]}))
        kw["scenario_dirs"] = [tmp_path]
        scenario = "ctx_wait"
    sim = await sim_factory(**kw)
    client, s = await open_run(sim)
    await s.send(context_in_run_request(f"[scenario:{scenario}] go"))
    await s.until("exec_server_message.request_context_args")
    rest = []
    while (f := await s.next()) is not None:
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f)
        rest.append(f)
    assert {f.kind for f in rest[:-1]} == {"interaction_update.heartbeat"}
    err = error_of(s, rest[-1])
    assert err["code"] == "deadline_exceeded"
    assert "exec 1 (request_context) result" in err["message"]
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "park timeout waiting for exec 1 (request_context) result"
    await client.close()


@pytest.mark.slow
async def test_step_wait_false_goes_on_even_on_a_strict_server(sim_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "ctx_go.json").write_text(json.dumps({"steps": [
        {"request_context": True, "wait": False}, {"tool": {"exec": "shell", "args": {"command": "true"}}},
        {"turn_ended": True}]}))
    sim = await sim_factory(strict_request_context=True, request_context_grace=0, scenario_dirs=[tmp_path],
                            park_timeout=5)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:ctx_go] go"))
    await s.until("exec_server_message.request_context_args")
    frames = await s.until("exec_server_message.shell_args")
    await answer_exec(s, frames[-1], shell_ok("ok\n"), close=False)
    await s.until("interaction_update.turn_ended")
    assert (await sim.state.finished_runs(1))[0].outcome == "turn_ended"
    await client.close()


@pytest.mark.parametrize(("doc", "message"), [
    ({"steps": [{"request_context": True, "wait": "yes"}]}, r"steps\[0\]: request_context.wait is true"),
    ({"wait_for_request_context": 1, "steps": []}, "wait_for_request_context is true or false"),
])
def test_request_context_options_are_validated(tmp_path: Path, doc: dict[str, Any], message: str) -> None:
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(ScenarioError, match=message):
        load_scenarios([tmp_path])


def test_request_context_stall_is_tool_flow_that_waits() -> None:
    sc = load_scenarios()
    assert sc["request_context_stall"].wait_for_request_context is True
    assert sc["request_context_stall"].steps == sc["tool_flow"].steps
    assert sc["tool_flow"].wait_for_request_context is None
