"""The remaining built-in scenarios, client mistakes (throw, unanswered queries) and the threaded runner."""

from __future__ import annotations

import ssl
from typing import Any

import httpx
import pytest
from sim_h2 import (
    H2Client,
    RunSession,
    answer_exec,
    error_of,
    frames_until_heartbeats,
    open_run,
    run_request,
    server_msg,
)
from sim_http1 import BidiRun, http1
from support import wait_until_async

from workbench.schema import pb
from workbench.sim import SimThread

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def texts(frames: list[Any]) -> str:
    return "".join(server_msg(f).interaction_update.text_delta.text for f in frames
                   if f.kind == "interaction_update.text_delta")


async def test_shell_stream_strict_events_then_close(sim_factory: Any) -> None:
    """Under stream_close required the exit is not enough; the stream_close finishes the exec."""
    sim = await sim_factory(stream_close="required")
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:shell_stream] ls"))
    frames = await s.until("exec_server_message.shell_stream_args")
    esm = server_msg(frames[-1]).exec_server_message
    assert esm.shell_stream_args.command == "ls -la"
    for ev in (pb.ShellStream(start=pb.ShellStreamStart()), pb.ShellStream(stdout=pb.ShellStreamStdout(data="a.txt\n")),
               pb.ShellStream(stdout=pb.ShellStreamStdout(data="b.txt\n")), pb.ShellStream(exit=pb.ShellStreamExit(code=0))):
        await answer_exec(s, frames[-1], {"shell_stream_result": ev}, close=False)
    # The events alone do not finish the exec …
    assert {f.kind for f in await frames_until_heartbeats(s)} == {"interaction_update.heartbeat"}
    await s.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=esm.id))))
    rest = await s.until("interaction_update.turn_ended")  # … the stream_close does
    done = next(server_msg(f).interaction_update.tool_call_completed for f in rest
                if f.kind == "interaction_update.tool_call_completed")
    assert done.tool_call.shell_tool_call.result.success.stdout == "a.txt\nb.txt\n"
    assert "a.txt" in texts(rest)
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.execs[0].results == 4
    assert rec.execs[0].closed
    await client.close()


async def test_shell_stream_strict_without_close_parks(sim_factory: Any) -> None:
    sim = await sim_factory(exec_stream_close=["shell_stream=required"])
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:shell_stream] ls"))
    frames = await s.until("exec_server_message.shell_stream_args")
    await answer_exec(s, frames[-1], {"shell_stream_result": pb.ShellStream(exit=pb.ShellStreamExit(code=0))},
                      close=False)
    kinds = {f.kind for f in await frames_until_heartbeats(s)}
    assert kinds == {"interaction_update.heartbeat"}
    await client.close()


async def test_throw_finishes_the_exec_with_an_error(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:read_write] x"))
    rc = await s.until("exec_server_message.request_context_args")
    await answer_exec(s, rc[-1], {"request_context_result": pb.RequestContextResult(success=pb.RequestContextSuccess())})
    read = await s.until("exec_server_message.read_args")
    esm = server_msg(read[-1]).exec_server_message
    await s.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        throw=pb.ExecClientThrow(id=esm.id, error="EACCES: permission denied"))))
    write = await s.until("exec_server_message.write_args")
    done = next(server_msg(f).interaction_update.tool_call_completed for f in write
                if f.kind == "interaction_update.tool_call_completed")
    assert done.tool_call.read_tool_call.result.error.error_message == "EACCES: permission denied"
    assert "EACCES" in texts(write)
    rec = sim.state.runs[0]
    assert rec.execs[1].thrown == "EACCES: permission denied"
    await client.close()


async def test_web_search_query_needs_an_answer(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:web_search] find it"))
    frames = await s.until("interaction_query.web_search_request_query")
    q = server_msg(frames[-1]).interaction_query
    assert q.web_search_request_query.args.search_term.startswith("workbench simulator find it")
    assert {f.kind for f in await frames_until_heartbeats(s)} == {"interaction_update.heartbeat"}
    await s.send(pb.AgentClientMessage(interaction_response=pb.InteractionResponse(
        id=q.id, web_search_request_response=pb.WebSearchRequestResponse(
            rejected=pb.InteractionRejected(reason="no network")))))
    rest = await s.until("interaction_update.turn_ended")
    assert "rejected: no network" in texts(rest)
    await client.close()


async def test_followup_on_the_same_run_answers_only_in_kv(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:kv_only_on_followup] first"))
    await s.until("interaction_update.turn_ended")
    await s.send(pb.AgentClientMessage(conversation_action=pb.ConversationAction(
        user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text="and a second question")))))
    seen = await frames_until_heartbeats(s, 5)
    kinds = [f.kind for f in seen]
    assert "interaction_update.text_delta" not in kinds
    assert "interaction_update.turn_ended" not in kinds
    assert kinds.count("interaction_update.heartbeat") >= 3
    blob = next(server_msg(f).kv_server_message.set_blob_args.blob_data for f in seen
                if f.kind == "kv_server_message.set_blob_args")
    assert b'"role":"assistant"' in blob
    assert b"and a second question" in blob
    await client.close()
    assert (await sim.state.finished_runs(1))[0].path == "on_reuse"


async def test_followup_scenario_ends_cleanly_when_client_finishes(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:kv_only_on_followup] only one"))
    await s.until("interaction_update.turn_ended")
    await s.stream.end()
    f = await s.next()
    assert f is not None
    assert f.kind == "end_stream"
    assert (await sim.state.finished_runs(1))[0].outcome == "turn_ended"
    await client.close()


async def test_explore_blob_miss_and_provider_error(sim_factory: Any) -> None:
    sim = await sim_factory()
    client = await H2Client.connect(sim.url, sim.cert_path)
    s = await RunSession.open(client)
    await s.send(run_request("[scenario:explore] look"))
    for kind, result in (("ls_args", {"ls_result": pb.LsResult(success=pb.LsSuccess(
                             directory_tree_root=pb.LsDirectoryTreeNode(abs_path="/w")))}),
                         ("grep_args", {"grep_result": pb.GrepResult(success=pb.GrepSuccess(pattern="TODO"))}),
                         ("delete_args", {"delete_result": pb.DeleteResult(success=pb.DeleteSuccess(
                             path="tmp/scratch.txt"))})):
        frames = await s.until(f"exec_server_message.{kind}")
        await answer_exec(s, frames[-1], result)
    rest = await s.until("interaction_update.turn_ended")
    assert "delete success" in texts(rest)

    s2 = await RunSession.open(client)
    await s2.send(run_request("[scenario:blob_miss] x"))
    frames = await s2.until("kv_server_message.get_blob_args")  # answered as a miss by the helper
    await s2.until("interaction_update.turn_ended")
    runs = await sim.state.finished_runs(2)
    assert not runs[1].blob_misses
    assert not runs[1].faults

    s3 = await RunSession.open(client)
    await s3.send(run_request("[scenario:provider_error] x"))
    frames = []
    while (f := await s3.next()) is not None:
        frames.append(f)
        if f.kind.startswith("kv_server_message"):
            await s3.answer_kv(f)
    err = error_of(s3, frames[-1])
    assert err["code"] == "unavailable"
    assert err["details"][0]["value"]["error"] == "ERROR_OPENAI"
    assert err["details"][0]["value"]["details"]["is_retryable"] is True
    await client.close()


async def test_runsse_client_hangup_while_parked(sim_factory: Any) -> None:
    sim = await sim_factory()
    http = http1(sim)
    run = BidiRun(http, sim.url)
    await run.start()
    await run.append(pb.AgentClientMessage.FromString(run_request("[scenario:web_search] q")))
    blobs = 0
    while True:
        f = await run.next()
        assert f is not None
        if f.kind == "kv_server_message.set_blob_args":
            blobs += 1
            kv = server_msg(f).kv_server_message
            await run.append(pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
                id=kv.id, set_blob_result=pb.SetBlobResult())))
        if f.kind == "interaction_query.web_search_request_query":
            break
    hb = await run.next()
    assert hb is not None
    assert hb.kind == "interaction_update.heartbeat"
    await run.close()  # hang up the RunSSE connection without answering
    await http.aclose()
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.outcome == "disconnected while waiting for interaction_query 1 response"


def test_sim_thread_for_sync_callers(sim_cert_dir: Any) -> None:
    with SimThread(heartbeat_interval=0.05, cert_dir=sim_cert_dir, models=["only-model"]) as sim:
        ctx = ssl.create_default_context(cafile=str(sim.cert_path))
        with httpx.Client(http2=True, verify=ctx) as http:
            r = http.post(sim.url + "/agent.v1.AgentService/GetUsableModels", content=b"{}",
                          headers={"authorization": "Bearer x", "content-type": "application/json"})
        assert [m["modelId"] for m in r.json()["models"]] == ["only-model"]
        assert sim.state.runs == []
    assert sim.sim is None


async def test_pending_answers_are_not_lost(sim_factory: Any) -> None:
    """A client that pipelines: run_request and both KV answers sent before reading anything."""
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:no_turn_end] pipelined"))
    for kid in (1, 2):
        await s.send(pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
            id=kid, set_blob_result=pb.SetBlobResult())))
    kinds: list[str] = []
    while (f := await s.next()) is not None:
        kinds.append(f.kind)
        if f.kind.startswith("kv_server_message") and server_msg(f).kv_server_message.id > 2:
            await s.answer_kv(f)
    assert kinds[-1] == "end_stream"
    assert "interaction_update.text_delta" in kinds
    await client.close()


async def test_wrong_answers_are_recorded_as_faults(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] x"))
    rc = await s.until("exec_server_message.request_context_args")
    esm = server_msg(rc[-1]).exec_server_message
    # Answered with the wrong result member and without echoing exec_id, plus a stray stream_close.
    await s.send(pb.AgentClientMessage(exec_client_message=pb.ExecClientMessage(
        id=esm.id, shell_result=pb.ShellResult())))
    for i in (esm.id, 99):
        await s.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
            stream_close=pb.ExecClientStreamClose(id=i))))
    frames = await s.until("exec_server_message.shell_args")
    await answer_exec(s, frames[-1], {"shell_result": pb.ShellResult(success=pb.ShellSuccess(stdout="ok"))})
    await s.until("interaction_update.turn_ended")
    await client.close()
    faults = (await sim.state.finished_runs(1))[0].faults
    assert "exec 1 (request_context) answered with shell_result" in faults
    assert any("exec 1: exec_id ''" in f for f in faults)
    assert "client messages the run never used: exec_client_control_message.stream_close#99" in faults


async def test_goaway_after_turn_and_network_drop(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:goaway_after_turn] hi"))
    await s.until("interaction_update.turn_ended")
    assert (await s.next()).kind == "end_stream"  # type: ignore[union-attr]
    await wait_until_async(lambda: client.goaway is not None, timeout=30, what="the GOAWAY after the turn")
    assert client.goaway == 0
    await client.close()

    client, s = await open_run(sim)
    await s.send(run_request("[scenario:network_drop] hi"))
    frames: list[Any] = []
    while (f := await s.next()) is not None:
        frames.append(f)
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f)
    assert s.stream.reset
    assert frames[-1].kind == "interaction_update.token_delta"
    assert (await sim.state.finished_runs(2))[1].outcome == "stream reset"
    await client.close()


async def test_network_drop_over_http1(sim_factory: Any) -> None:
    sim = await sim_factory()
    async with http1(sim) as http:
        run = BidiRun(http, sim.url)
        await run.start()
        await run.append(pb.AgentClientMessage.FromString(run_request("[scenario:network_drop] hi")))
        frames = await run.until_end()
        await run.close()
    assert isinstance(run.error, httpx.HTTPError)  # the dropped connection is a transport error …
    assert "end_stream" not in [f.kind for f in frames]  # … never a clean end
    assert (await sim.state.finished_runs(1))[0].outcome == "stream reset"


async def test_server_aborts_a_slow_exec(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:exec_abort] wait"))
    frames = await s.until("exec_server_message.shell_args")
    eid = server_msg(frames[-1]).exec_server_message.id
    waited = await s.until("exec_server_control_message.abort")
    assert server_msg(waited[-1]).exec_server_control_message.abort.id == eid
    assert {f.kind for f in waited[:-1]} <= {"interaction_update.heartbeat"}
    # A late answer for the aborted exec is dropped without complaint.
    await s.send(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=eid))))
    rest = await s.until("interaction_update.turn_ended")
    assert "aborted by the server" in texts(rest)
    await s.stream.end()
    while await s.next() is not None:
        pass
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.execs[0].aborted
    assert not rec.faults
    await client.close()
