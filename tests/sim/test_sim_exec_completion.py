"""Exec completion: the stream_close policy (required | accepted | ignored), per server, scenario and step.

Real h2 Run streams against the simulator; each client style is written out message by message.
"""

from __future__ import annotations

from typing import Any

import pytest
from sim_h2 import answer_exec, frames_until_heartbeats, open_run, run_request, server_msg, shell_ok

from workbench.schema import pb
from workbench.sim.exec_completion import StreamClosePolicy, parse_policy, resolve, server_policy
from workbench.sim.scenario import ScenarioError, parse_scenario

RC_OK = {"request_context_result": pb.RequestContextResult(success=pb.RequestContextSuccess())}


def close(eid: int) -> Any:
    return pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=eid)))


def texts(frames: list[Any]) -> str:
    return "".join(server_msg(f).interaction_update.text_delta.text for f in frames
                   if f.kind == "interaction_update.text_delta")


@pytest.mark.slow
async def test_default_accepts_results_alone(sim_factory: Any) -> None:
    """The 2026 client style: request_context and shell answered by the result alone, never closed."""
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] go"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], RC_OK, close=False)
    frames = await s.until("exec_server_message.shell_args")
    await answer_exec(s, frames[-1], shell_ok("hi there\n"), close=False)
    rest = await s.until("interaction_update.turn_ended")
    assert "hi there" in texts(rest)
    assert "interaction_update.heartbeat" not in [f.kind for f in rest]
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert not rec.faults
    assert [(e.kind, e.results, e.closed, e.policy) for e in rec.execs] == [
        ("request_context", 1, False, "accepted"), ("shell", 1, False, "accepted")]
    await client.close()


@pytest.mark.slow
async def test_default_welcomes_a_later_stream_close(sim_factory: Any) -> None:
    """Our own client's style (result, then stream_close) is just as healthy under the default."""
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] go"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], RC_OK)
    frames = await s.until("exec_server_message.shell_args")
    await answer_exec(s, frames[-1], shell_ok("ok\n"))
    await s.until("interaction_update.turn_ended")
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert not rec.faults
    assert [e.closed for e in rec.execs] == [True, True]
    await client.close()


@pytest.mark.slow
async def test_shell_stream_completes_on_exit_and_welcomes_the_final_shell_result(sim_factory: Any) -> None:
    """exit → the turn goes on; the final shell_result and stream_close that follow are no faults."""
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:shell_stream] ls"))
    frames = await s.until("exec_server_message.shell_stream_args")
    esm = server_msg(frames[-1]).exec_server_message
    for ev in (pb.ShellStream(start=pb.ShellStreamStart()), pb.ShellStream(stdout=pb.ShellStreamStdout(data="a.txt\n")),
               pb.ShellStream(exit=pb.ShellStreamExit(code=0))):
        await answer_exec(s, frames[-1], {"shell_stream_result": ev}, close=False)
    done = await s.until("interaction_update.tool_call_completed")  # completed on the exit alone
    assert "interaction_update.heartbeat" not in [f.kind for f in done]
    final = pb.ShellResult(success=pb.ShellSuccess(command="ls -la", exit_code=0, stdout="a.txt\n"))
    await answer_exec(s, frames[-1], {"shell_result": final})  # final shell_result, then stream_close
    rest = await s.until("interaction_update.turn_ended")
    assert "a.txt" in texts(rest)
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert rec.faults == []
    assert rec.execs[0].results == 4
    assert rec.execs[0].closed
    assert rec.execs[0].id == esm.id
    await client.close()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["server", "scenario"])
async def test_strict_stalls_a_result_alone_client_until_it_closes(sim_factory: Any, how: str) -> None:
    """--strict-stream-close (or a scenario's stream_close: required): the December 2025 stall."""
    sim = await sim_factory(stream_close="required") if how == "server" else await sim_factory()
    scenario = "tool_flow" if how == "server" else "stream_close_stall"
    client, s = await open_run(sim)
    await s.send(run_request(f"[scenario:{scenario}] go"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], RC_OK, close=False)
    stalled = await frames_until_heartbeats(s)  # the result alone is not enough …
    assert {f.kind for f in stalled} == {"interaction_update.heartbeat"}
    assert "exec 1 (request_context) stream_close" in (sim.state.runs[0].waiting_for or "")
    await s.send(close(server_msg(rc[-1]).exec_server_message.id))  # … the stream_close is
    frames = await s.until("exec_server_message.shell_args")
    await answer_exec(s, frames[-1], shell_ok("late\n"), close=False)
    assert {f.kind for f in await frames_until_heartbeats(s)} == {"interaction_update.heartbeat"}
    await s.send(close(server_msg(frames[-1]).exec_server_message.id))
    rest = await s.until("interaction_update.turn_ended")
    assert "late" in texts(rest)
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert not rec.faults
    assert rec.heartbeats >= 6
    assert [(e.closed, e.policy) for e in rec.execs] == [(True, "required"), (True, "required")]
    await client.close()


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["required", "accepted", "ignored"])
async def test_throw_then_stream_close_completes_any_exec(sim_factory: Any, policy: str) -> None:
    """Cursor's own executor answers an exec it cannot handle with throw, then stream_close."""
    sim = await sim_factory(stream_close=policy)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:read_write] x"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], RC_OK)
    read = await s.until("exec_server_message.read_args")
    eid = server_msg(read[-1]).exec_server_message.id
    await s.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        throw=pb.ExecClientThrow(id=eid, error="no handler for read_args", error_code="UNIMPLEMENTED"))))
    await s.send(close(eid))
    frames = await s.until("exec_server_message.write_args")
    completed = next(server_msg(f).interaction_update.tool_call_completed for f in frames
                     if f.kind == "interaction_update.tool_call_completed")
    assert completed.tool_call.read_tool_call.result.error.error_message == "no handler for read_args"
    await answer_exec(s, frames[-1], {"write_result": pb.WriteResult(success=pb.WriteSuccess(path="NOTES.md"))})
    await s.until("interaction_update.turn_ended")
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "turn_ended"
    assert rec.faults == []
    assert rec.execs[1].thrown == "no handler for read_args"
    await client.close()


@pytest.mark.slow
async def test_ignored_policy_never_needs_or_counts_stream_close(sim_factory: Any) -> None:
    sim = await sim_factory(exec_stream_close=["shell=ignored"])
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] go"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], RC_OK, close=False)
    frames = await s.until("exec_server_message.shell_args")
    eid = server_msg(frames[-1]).exec_server_message.id
    await s.send(close(eid))  # a close without a result does not complete the exec here …
    assert {f.kind for f in await frames_until_heartbeats(s)} == {"interaction_update.heartbeat"}
    await answer_exec(s, frames[-1], shell_ok("finally\n"), close=False)  # … the result does
    rest = await s.until("interaction_update.turn_ended")
    assert "finally" in texts(rest)
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.faults == []
    assert rec.execs[1].policy == "ignored"
    await client.close()


@pytest.mark.slow
async def test_step_policy_beats_scenario_and_server(sim_factory: Any, tmp_path: Any) -> None:
    (tmp_path / "mixed.json").write_text("""{
      "stream_close": {"default": "required", "read": "ignored"},
      "steps": [
        {"request_context": true, "stream_close": "accepted"},
        {"tool": {"exec": "read", "args": {"path": "a"}}},
        {"tool": {"exec": "shell", "args": {"command": "x"}, "stream_close": "accepted"}},
        {"turn_ended": true}
      ]}""")
    sim = await sim_factory(scenario_dirs=[tmp_path], exec_stream_close=["read=required"])
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:mixed] go"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], RC_OK, close=False)
    read = await s.until("exec_server_message.read_args")
    await answer_exec(s, read[-1], {"read_result": pb.ReadResult(success=pb.ReadSuccess(path="a"))}, close=False)
    shell = await s.until("exec_server_message.shell_args")
    await answer_exec(s, shell[-1], shell_ok("x\n"), close=False)
    await s.until("interaction_update.turn_ended")
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert [e.policy for e in rec.execs] == ["accepted", "ignored", "accepted"]
    assert not rec.faults
    await client.close()


def test_policy_resolution_and_validation() -> None:
    server = server_policy("accepted", ["shell_stream=required"])
    assert resolve("shell_stream", None, None, server) == "required"
    assert resolve("read", None, None, server) == "accepted"
    scenario = parse_policy({"read": "ignored"}, "x")
    assert scenario == StreamClosePolicy(None, (("read", "ignored"),))
    assert resolve("read", None, scenario, server) == "ignored"
    assert resolve("shell_stream", None, scenario, server) == "required"  # the scenario has no opinion
    assert resolve("shell_stream", "accepted", scenario, server) == "accepted"
    with pytest.raises(ValueError, match="KIND=POLICY"):
        server_policy("accepted", ["shell"])
    with pytest.raises(ValueError, match="unknown exec type 'bash'"):
        server_policy("accepted", ["bash=required"])
    with pytest.raises(ValueError, match="must be one of required, accepted, ignored"):
        parse_policy("strict", "x")


@pytest.mark.parametrize(("doc", "message"), [
    ({"stream_close": "maybe", "steps": []}, "stream_close must be one of"),
    ({"stream_close": {"bash": "required"}, "steps": []}, "unknown exec type 'bash'"),
    ({"steps": [{"request_context": True, "stream_close": "nope"}]}, r"steps\[0\]: stream_close must be"),
    ({"steps": [{"tool": {"exec": "shell", "stream_close": "x"}}]}, r"steps\[0\]: stream_close must be"),
    ({"steps": [{"tool": {"exec": "shell", "resume_at": 9}}]}, r"tool.resume_at is the index of a step"),
    ({"steps": [{"text": "a"}], "prelude": 5}, "prelude is a number of leading steps"),
])
def test_bad_policy_fields_name_the_file_and_step(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario(doc, "broken")
    assert str(info.value).startswith("broken")
