"""AgentClient against the real simulated backend (TLS, HTTP/2 and HTTP/1.1 on loopback)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from support import wait_until_async

from workbench.client.agent import AgentClient
from workbench.client.events import (
    AgentError,
    Checkpoint,
    Error,
    ExecHandled,
    ExecRequest,
    KvSet,
    TextDelta,
    ToolCall,
    TurnEnded,
)
from workbench.schema import pb
from workbench.sim.runner import running_sim

TRANSPORTS = ["run", "runsse", "runpoll"]


@pytest.fixture
async def sim():
    async with running_sim(heartbeat_interval=0.05) as s:
        yield s


async def last_run(sim, timeout: float = 30.0):
    """The newest run record once the simulator has finished it (polled with a deadline)."""
    await wait_until_async(lambda: sim.state.runs and sim.state.runs[-1].finished.is_set(), timeout=timeout,
                           what="the simulator to finish its run")
    return sim.state.runs[-1]


def client(sim, **kw) -> AgentClient:
    return AgentClient(sim.url, "test-token", verify=str(sim.cert_path), **kw)


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_text_turn_on_every_transport(sim, transport: str) -> None:
    async with client(sim, transport=transport) as c:
        res = await c.run_turn("[scenario:text] ping")
    assert res.ended
    assert res.error is None
    assert "Hello from the workbench simulator" in res.text
    assert "ping" in res.text
    assert res.usage.output_tokens > 0
    assert res.usage.context_tokens > 0
    run = await last_run(sim)
    assert run.transport == transport
    assert run.outcome == "turn_ended"
    assert not run.faults
    assert run.request_id == res.request_id
    # the frame log holds the exact agent messages, first the run request
    first = c.frame_log[0]
    assert first.direction == "client"
    assert first.transport == ("run" if transport == "run" else "bidi_append")
    req = pb.AgentClientMessage.FromString(first.data)
    assert req.WhichOneof("message") == "run_request"
    assert req.run_request.HasField("conversation_state")
    server = [e for e in c.frame_log if e.direction == "server"]
    assert len(server) == len(run.sent_kinds)
    assert pb.AgentServerMessage.FromString(server[-1].data).interaction_update.HasField("turn_ended")


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_exec_handed_to_caller_gets_result_then_stream_close(sim, transport: str) -> None:
    seen: list[ExecRequest] = []

    async def on_exec(req: ExecRequest) -> str:
        seen.append(req)
        return "hello from the caller"

    async with client(sim, transport=transport) as c:
        res = await c.run_turn("[scenario:tool_flow] run it", on_exec=on_exec)
    assert [r.kind for r in seen] == ["shell"]
    assert seen[0].args["command"] == "echo hello from workbench"
    assert "hello from the caller" in res.text
    assert res.ended
    assert res.tool_calls
    assert res.tool_calls[0].args["command"] == "echo hello from workbench"
    run = await last_run(sim)
    assert [(e.kind, e.closed, e.thrown) for e in run.execs] == [("request_context", True, None),
                                                                 ("shell", True, None)]
    assert not run.faults


@pytest.mark.slow
async def test_local_execution_read_then_write_in_workspace(sim, tmp_path: Path) -> None:
    (tmp_path / "README.md").write_text("# Readme\nline two\n")
    async with client(sim, transport="runsse", workspace=tmp_path, execute_locally=True) as c:
        res = await c.run_turn("[scenario:read_write] notes please")
    assert res.ended
    assert "2 lines of README.md" in res.text
    assert (tmp_path / "NOTES.md").read_text().startswith("# Notes")
    handled = [e for e in res.events if isinstance(e, ExecHandled)]
    assert [(h.kind, h.ok) for h in handled] == [("request_context", True), ("read", True), ("write", True)]


async def test_local_execution_is_confined_to_the_workspace(tmp_path: Path) -> None:
    from workbench.client.localexec import LocalExecutor

    ex = LocalExecutor(tmp_path)
    [(field, result)] = await ex.run("read", pb.ReadArgs(path="../../etc/passwd"))
    assert field == "read_result"
    assert result.WhichOneof("result") == "rejected"
    [(field, result)] = await ex.run("write", pb.WriteArgs(path="/tmp/elsewhere.txt", file_text="x"))
    assert result.WhichOneof("result") == "rejected"
    with pytest.raises(NotImplementedError):
        await ex.run("computer_use", b"")


@pytest.mark.slow
async def test_checkpoint_is_echoed_with_the_same_conversation_id(sim) -> None:
    async with client(sim) as c:
        first = await c.run_turn("[scenario:text] one")
        ckpt = next(e for e in first.events if isinstance(e, Checkpoint)).state
        await c.run_turn("[scenario:text] two")
    runs = sim.state.runs[-2:]
    assert runs[0].conversation_id == runs[1].conversation_id == c.conversation_id
    sent = [pb.AgentClientMessage.FromString(e.data) for e in c.frame_log if e.direction == "client"]
    reqs = [m.run_request for m in sent if m.WhichOneof("message") == "run_request"]
    assert len(reqs) == 2
    assert reqs[0].conversation_state.ByteSize() == 0
    assert bytes(reqs[1].conversation_state.SerializeToString()) == ckpt


STRICT_SHELL = {"description": "one shell exec that completes only with stream_close (December 2025)", "steps": [
    {"kv_set": "system"}, {"kv_set": "user"},
    {"tool": {"exec": "shell", "args": {"command": "echo hi"}, "require_stream_close": True}},
    {"text": "{tool_result}"}, {"checkpoint": True}, {"step_completed": True}, {"turn_ended": True}, {"end": "ok"}]}


@pytest.mark.slow
async def test_no_stream_close_stalls_until_the_heartbeat_budget(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "strict_shell.json").write_text(json.dumps(STRICT_SHELL))
    ws = tmp_path / "ws"
    ws.mkdir()
    async with running_sim(heartbeat_interval=0.05, scenario_dirs=[tmp_path / "scenarios"]) as sim, \
            client(sim, workspace=ws, execute_locally=True, allow_shell=True, faults={"no_stream_close"},
                   heartbeat_budget=15) as c:
        with pytest.raises(AgentError) as info:
            await c.run_turn("[scenario:strict_shell] stall")
        run = await last_run(sim)
    err = info.value.error
    assert err.code == "heartbeat_budget"
    assert "15 consecutive server heartbeats" in err.message
    assert "no stream_close" in err.message
    shell = [e for e in run.execs if e.kind == "shell"][0]
    assert shell.results == 1
    assert not shell.closed


@pytest.mark.slow
async def test_omit_conversation_state_is_rejected(sim) -> None:
    async with client(sim, faults={"omit_conversation_state"}) as c:
        res = await c.run_turn("[scenario:text] hi", raise_on_error=False)
    assert res.error is not None
    assert res.error.code == "invalid_argument"
    assert "Conversation state is required" in res.error.message


@pytest.mark.slow
async def test_reset_append_seqno_duplicates_seqno_zero(sim) -> None:
    async with client(sim, transport="runsse", faults={"reset_append_seqno"}, heartbeat_budget=40) as c:
        res = await c.run_turn("[scenario:text] hi", raise_on_error=False)
    run = await last_run(sim)
    assert any("duplicate append_seqno 0" in f for f in run.faults)
    # the first reply (a KV answer) was dropped as a duplicate, so the run never finishes
    assert res.error is not None
    assert res.error.code == "heartbeat_budget"


@pytest.mark.slow
async def test_answer_written_into_the_parked_run_is_hidden_in_kv(sim) -> None:
    # kv_only_on_reuse: the server wants a new run after the tool call; answering in place gets
    # tool_call_completed, heartbeats and an assistant KV blob — no text, no turn_ended (docs/protocol.md §7, kv_only_response)
    async with client(sim, heartbeat_budget=20, heartbeat_interval=0.02) as c:
        res = await c.run_turn("[scenario:kv_only_on_reuse] go", on_exec=_answer, raise_on_error=False)
    assert not res.ended
    assert res.error is not None
    assert res.error.code == "heartbeat_budget"
    assert not any(isinstance(e, TextDelta) for e in res.events)
    assert any(isinstance(e, ToolCall) for e in res.events)
    blobs = [e.data for e in res.events if isinstance(e, KvSet)]
    assert any(b'"tool-call"' in b and b'"role":"assistant"' in b for b in blobs)
    run = await last_run(sim)
    assert run.path == "on_reuse"
    assert "client_heartbeat" in run.client_kinds  # the client kept beating while the server stalled


@pytest.mark.slow
async def test_reuse_session_fault_writes_the_next_turn_into_the_open_run(sim) -> None:
    async with client(sim, faults={"reuse_session"}, heartbeat_budget=20) as c:
        first = await c.run_turn("[scenario:kv_only_on_followup] one")
        second = await c.run_turn("[scenario:kv_only_on_followup] two", raise_on_error=False)
    assert first.text == "First answer, streamed normally."
    assert first.ended
    assert second.request_id == first.request_id  # no new run: same stream, same request id
    assert second.error is not None
    assert second.error.code == "heartbeat_budget"
    assert second.text == ""
    hidden = [e.data for e in second.events if isinstance(e, KvSet)]
    assert any(b"Second answer, hidden in a KV blob" in b for b in hidden)
    assert len(sim.state.runs) == 1


@pytest.mark.slow
async def test_without_reuse_session_the_next_turn_is_a_new_run(sim) -> None:
    # This scenario's server keeps the run open after turn_ended for a follow-up; the client waits
    # for the end as real clients do, then says it never came (and names that possible cause).
    async with client(sim, heartbeat_budget=20, end_timeout=0.5) as c:
        first = await c.run_turn("[scenario:kv_only_on_followup] one")
        second = await c.run_turn("[scenario:kv_only_on_followup] two")
    assert second.ended
    assert second.text == "First answer, streamed normally."
    assert len(sim.state.runs) == 2
    assert first.end_missing is not None
    assert "follow-up" in first.end_missing.message


async def _answer(req: ExecRequest) -> str:
    return "Hello from KV blob investigation"


@pytest.mark.slow
async def test_errors_are_surfaced(sim) -> None:
    async with client(sim) as c:
        res = await c.run_turn("[scenario:rate_limit] hi", raise_on_error=False)
        assert res.error is not None
        assert res.error.code == "resource_exhausted"
        assert res.error.details
        assert res.error.details[0]["debug"]["error"] == "ERROR_RATE_LIMITED_CHANGEABLE"
        res = await c.run_turn("[scenario:no_turn_end] hi", raise_on_error=False)
        assert res.error is not None
        assert res.error.code == "incomplete"
        assert "without turn_ended" in res.error.message
        res = await c.run_turn("[scenario:text] hi", model="no-such-model", raise_on_error=False)
        assert res.error is not None
        assert res.error.code == "not_found"
        assert "no-such-model" in await _models_hint(c)


async def _models_hint(c: AgentClient) -> str:
    models = await c.list_models()
    assert "default" in models
    return "no-such-model" if "no-such-model" not in models else ""


@pytest.mark.slow
async def test_bad_token_is_unauthenticated(sim) -> None:
    async with AgentClient(sim.url, " ", verify=str(sim.cert_path)) as c:
        res = await c.run_turn("[scenario:text] hi", raise_on_error=False)
    assert res.error is not None
    assert res.error.code == "unauthenticated"


@pytest.mark.slow
async def test_events_stream_in_order(sim) -> None:
    async with client(sim, transport="runpoll") as c:
        kinds = [type(e).__name__ async for e in c.stream_turn("[scenario:text] order")]
    assert kinds.index("TextDelta") < kinds.index("Checkpoint") < kinds.index("TurnEnded")
    assert kinds[-1] == "TurnEnded"


@pytest.mark.slow
async def test_record_to_store(sim, tmp_path: Path) -> None:
    from workbench.store.reader import open_reader

    db = tmp_path / "client.duckdb"
    async with client(sim, record_to=db) as c:
        await c.run_turn("[scenario:text] record me")
    reader = open_reader(db)
    rows = reader.query("select source, status, frame_count from sessions").to_pylist()
    kinds = [r["kind"] for r in reader.query("select kind from frames order by seq").to_pylist()]
    # every agent message of the frame log, then the end-stream (the close waits for it)
    assert rows == [{"source": "client", "status": "complete", "frame_count": len(c.frame_log) + 1}]
    assert kinds[0] == "run_request"
    assert kinds[-2:] == ["interaction_update.turn_ended", "end_stream"]


def test_bad_options_name_themselves() -> None:
    with pytest.raises(ValueError, match="transport 'grpc'"):
        AgentClient("https://x", "t", transport="grpc")
    with pytest.raises(ValueError, match="unknown fault"):
        AgentClient("https://x", "t", faults={"nope"})
    with pytest.raises(ValueError, match="token is empty"):
        AgentClient("https://x", "")
    assert "t0ken" not in repr(AgentClient("https://x", "t0ken"))


_ = (Error, TurnEnded)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_large_prompt_crosses_flow_control_windows(sim, transport: str) -> None:
    big = "[scenario:text] " + "x" * (3 * 1024 * 1024)
    async with client(sim, transport=transport) as c:
        res = await c.run_turn(big)
    assert res.ended
    assert "You said: xxxx" in res.text
    sent = pb.AgentClientMessage.FromString(c.frame_log[0].data)
    assert len(sent.run_request.action.user_message_action.user_message.text) == len(big)


@pytest.mark.slow
async def test_concurrent_turns_share_one_http2_connection(sim) -> None:
    from workbench.client.agent import Connections

    conns = Connections(sim.url, str(sim.cert_path))
    clients = [AgentClient(sim.url, "t", verify=str(sim.cert_path), connections=conns) for _ in range(4)]
    try:
        before = await conns.h2()
        results = await asyncio.gather(*(c.run_turn(f"[scenario:text] n{i}") for i, c in enumerate(clients)))
        h2 = await conns.h2()
    finally:
        for c in clients:
            await c.aclose()
        await conns.aclose()
    assert [r.text.rsplit(": ", 1)[1] for r in results] == ["n0", "n1", "n2", "n3"]
    assert len({r.request_id for r in results}) == 4
    assert h2 is before
    assert h2.alpn == "h2"  # all four runs were streams of one connection


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_goaway_after_turn_reconnects_and_drops_are_reported(sim, transport: str) -> None:
    async with client(sim, transport=transport) as c:
        first = await c.run_turn("[scenario:goaway_after_turn] one")
        second = await c.run_turn("[scenario:goaway_after_turn] two")
        dropped = await c.run_turn("[scenario:network_drop] three", raise_on_error=False)
    assert first.ended
    assert second.ended
    assert second.text == first.text
    assert dropped.error is not None
    assert dropped.error.code == "transport"
    assert dropped.text == "This answer is cut off mid"


@pytest.mark.slow
async def test_interaction_query_is_answered(sim) -> None:
    async with client(sim) as c:
        res = await c.run_turn("[scenario:web_search] news")
    assert res.ended
    assert "rejected" in res.text
    run = await last_run(sim)
    assert "interaction_response.web_search_request_response" in run.client_kinds


@pytest.mark.slow
async def test_server_abort_cancels_a_local_exec(sim, tmp_path: Path) -> None:
    async with client(sim, workspace=tmp_path, execute_locally=True, allow_shell=True) as c:
        res = await c.run_turn("[scenario:exec_abort] slow")
    assert res.ended
    assert res.text.startswith("The command did not finish")
    handled = [e for e in res.events if isinstance(e, ExecHandled)]
    assert [(h.kind, h.ok, h.detail) for h in handled] == [("shell", False, "aborted by the server")]
