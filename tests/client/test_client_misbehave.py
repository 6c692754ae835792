"""The client on the misbehaving side of the public bridge reports, checked on the wire:
``retry_after_turn`` (pi-cursor #3: the same user message sent again as a new run on the same
conversation after the transport failed past turn_ended) and the stream ``watchdog`` (oh-my-pi
#6176: cancel_action, RST_STREAM CANCEL or a dropped connection after SECONDS). Against the real
simulator over HTTP/2 + TLS on loopback, and against a test-only ``h2`` server that logs how the
client left (``stall_server``); the CLI flags through ``workbench client``."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from client_sim_process import WORKBENCH, start_sim
from stall_server import StallServer
from support import env_without_proxy

from workbench.client.agent import AgentClient
from workbench.client.events import Error, TransportLostAfterTurn, TurnRetried
from workbench.schema import pb
from workbench.sim.runner import SimServer, running_sim

pytestmark = pytest.mark.slow  # starts servers


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[SimServer]:
    async with running_sim(heartbeat_interval=0.1, long_exec_seconds=4, cert_dir=tmp_path / "cert") as server:
        yield server


def client(server: Any, **kw: Any) -> AgentClient:
    return AgentClient(server.url, "t", verify=server.cert_path, heartbeat_interval=0.1, **kw)


def sent_run_requests(c: AgentClient) -> list[Any]:
    out = []
    for entry in c.frame_log:
        if entry.direction == "client":
            msg = pb.AgentClientMessage.FromString(entry.data)
            if msg.WhichOneof("message") == "run_request":
                out.append((entry.data, msg.run_request))
    return out


# retry after a completed turn ---------------------------------------------------------------

@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_retry_after_a_reset_repeats_the_message_on_the_same_conversation(sim: SimServer,
                                                                                 transport: str) -> None:
    async with client(sim, retry_after_turn=1, transport=transport) as c:
        res = await c.run_turn("[scenario:reset_after_turn] what is the answer?")
    kinds = [type(e).__name__ for e in res.events]
    assert kinds.count("TurnEnded") == 2  # the user sees the answer twice
    retried = [e for e in res.events if isinstance(e, TurnRetried)]
    assert [r.attempt for r in retried] == [1]
    assert ("reset by the server (error code 2)" if transport == "run" else "read failed") in retried[0].reason
    runs = await sim.state.finished_runs(2)
    assert [r.scenario for r in runs] == ["reset_after_turn", "reset_after_turn"]
    assert runs[0].conversation_id == runs[1].conversation_id == res.conversation_id
    assert runs[1].path == "continuation"  # a new run on a conversation the server has seen
    (first, req1), (second, req2) = sent_run_requests(c)
    assert first == second  # the very same run request: same message, same conversation state
    assert req1.action.user_message_action.user_message.text == "[scenario:reset_after_turn] what is the answer?"
    assert res.error is None


async def test_no_retry_a_reset_after_turn_ended_is_only_noted(sim: SimServer) -> None:
    """The healthy twin: the same server, a client that does not retry."""
    async with client(sim) as c:
        res = await c.run_turn("[scenario:reset_after_turn] once")
    assert res.ended and res.error is None
    lost = [e for e in res.events if isinstance(e, TransportLostAfterTurn)]
    assert len(lost) == 1 and "reset by the server" in lost[0].message
    assert not any(isinstance(e, TurnRetried) for e in res.events)
    assert len(await sim.state.finished_runs(1)) == 1


async def test_retry_after_a_goaway_and_at_most_max_retries(sim: SimServer) -> None:
    async with client(sim, retry_after_turn=2) as c:
        res = await c.run_turn("[scenario:goaway_after_turn] hi")
    retried = [e for e in res.events if isinstance(e, TurnRetried)]
    assert [r.attempt for r in retried] == [1, 2]  # the GOAWAY comes every time: bounded by the limit
    assert all("GOAWAY" in r.reason for r in retried)
    runs = await sim.state.finished_runs(3)
    assert len({r.conversation_id for r in runs}) == 1


async def test_a_clean_turn_is_never_retried(sim: SimServer) -> None:
    async with client(sim, retry_after_turn=1) as c:
        res = await c.run_turn("[scenario:text] hi")
    assert not any(isinstance(e, TurnRetried) for e in res.events)
    assert len(await sim.state.finished_runs(1)) == 1


# the faults that play pi-cursor #25 and #13 ----------------------------------------------------

@pytest.mark.parametrize("fault", [False, True])
async def test_forget_blobs_answers_the_servers_get_blob_empty(sim: SimServer, fault: bool) -> None:
    async with client(sim, faults=["forget_blobs"] if fault else []) as c:
        res = await c.run_turn("[scenario:empty_blob_answer] hi")
    assert res.ended
    rec = (await sim.state.finished_runs(1))[0]
    assert len(rec.blob_misses) == (1 if fault else 0)  # the healthy twin keeps its blobs


async def test_ignore_unknown_exec_leaves_the_run_heartbeating(sim: SimServer) -> None:
    async with client(sim, faults=["ignore_unknown_exec"], heartbeat_budget=5) as c:
        stalled = await c.run_turn("[scenario:unknown_exec_case] hi", raise_on_error=False)
    assert stalled.error is not None and stalled.error.code == "heartbeat_budget"
    rec = (await sim.state.finished_runs(1))[0]
    assert rec.execs[0].kind == "unknown_56" and rec.execs[0].results == 0 and rec.execs[0].thrown is None
    async with client(sim) as c:  # the healthy twin: throw, stream_close, the turn completes
        done = await c.run_turn("[scenario:unknown_exec_case] hi")
    assert done.ended
    assert (await sim.state.finished_runs(2))[1].execs[0].thrown


# the watchdog -------------------------------------------------------------------------------

# The server stamps a stream when it has read the request headers, a little after the client sent
# them and started its watchdog: its clock may lag the client's by up to this much.
LAG = 0.15


@pytest.fixture
async def stall(tmp_path: Path) -> AsyncIterator[StallServer]:
    server = await StallServer(tmp_path / "cert").start()
    yield server
    await server.close()


async def test_watchdog_cancel_sends_cancel_action_after_seconds(stall: StallServer) -> None:
    async with client(stall, watchdog=0.8) as c:
        res = await c.run_turn("long", raise_on_error=False)
    [log] = stall.streams
    assert log.cancel_at is not None and log.cancel_at >= 0.8 - LAG
    assert log.reset_code is None
    assert log.client_kinds[0] == "run_request"
    assert isinstance(res.error, Error) and res.error.code == "watchdog"
    assert "after 0.8 s with cancel" in res.error.message
    sent = {pb.AgentClientMessage.FromString(e.data).WhichOneof("message"): e.ts_us
            for e in c.frame_log if e.direction == "client"}
    assert sent["conversation_action"] - sent["run_request"] >= 800_000  # on the client's own clock


async def test_watchdog_reset_sends_rst_stream_cancel(stall: StallServer) -> None:
    async with client(stall, watchdog=0.8, watchdog_action="reset") as c:
        res = await c.run_turn("long", raise_on_error=False)
        [log] = stall.streams
        await log.left.wait()
        assert log.closed_at is None  # the connection itself stays up
    assert log.reset_code == 8  # CANCEL
    assert log.reset_at is not None and log.reset_at >= 0.8 - LAG
    assert "conversation_action.cancel_action" not in log.client_kinds
    assert res.error is not None and res.error.code == "watchdog"


async def test_watchdog_disconnect_closes_the_connection(stall: StallServer) -> None:
    async with client(stall, watchdog=0.8, watchdog_action="disconnect") as c:
        res = await c.run_turn("long", raise_on_error=False)
        [log] = stall.streams
        await log.left.wait()
    assert log.closed_at is not None and log.closed_at >= 0.8 - LAG
    assert log.reset_code is None and not log.goaway_from_client  # no reset, no GOAWAY: just gone
    assert res.error is not None and res.error.code == "watchdog"


@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_watchdog_cuts_a_long_exec_and_without_it_the_turn_completes(sim: SimServer, tmp_path: Path,
                                                                           transport: str) -> None:
    kw = {"execute_locally": True, "workspace": tmp_path, "allow_shell": True, "transport": transport}
    # a command far longer than the watchdog: the cut does not depend on how loaded the machine is
    async with running_sim(heartbeat_interval=0.1, long_exec_seconds=60, cert_dir=tmp_path / "cert") as long_sim:
        async with client(long_sim, watchdog=1.0, **kw) as c:
            cut = await c.run_turn("[scenario:long_exec] build it", raise_on_error=False)
        rec = (await long_sim.state.finished_runs(1))[0]
    assert cut.error is not None and cut.error.code == "watchdog"
    assert "exec 1 (shell_stream) running locally" in cut.error.message
    assert "conversation_action.cancel_action" in rec.client_kinds
    assert rec.outcome == "cancelled"
    async with client(sim, **kw) as c:  # the healthy twin: no watchdog, the 4 s command finishes
        done = await c.run_turn("[scenario:long_exec] build it")
    assert done.ended and "tick 4" in done.text


async def test_a_local_shell_stream_streams_its_output_while_it_runs(sim: SimServer, tmp_path: Path) -> None:
    """long_exec's output reaches the server tick by tick, not all at the exit: what a watchdog cuts."""
    async with client(sim, execute_locally=True, workspace=tmp_path, allow_shell=True) as c:
        res = await c.run_turn("[scenario:long_exec] build it")
    assert res.ended
    events = []
    for e in c.frame_log:
        if e.direction == "client":
            msg = pb.AgentClientMessage.FromString(e.data)
            if msg.exec_client_message.WhichOneof("result") == "shell_stream_result":
                events.append((e.ts_us, msg.exec_client_message.shell_stream_result.WhichOneof("event")))
    names = [name for _, name in events]
    assert names[0] == "start" and names[-1] == "exit" and names.count("stdout") >= 3
    first_out = next(ts for ts, name in events if name == "stdout")
    assert events[-1][0] - first_out >= 2_000_000  # the first tick went out seconds before the exit
    assert (await sim.state.finished_runs(1))[0].execs[0].results == len(events) + 1  # + the final shell_result


async def test_watchdog_over_runsse_drops_the_response(tmp_path: Path) -> None:
    kw = {"execute_locally": True, "workspace": tmp_path, "allow_shell": True, "transport": "runsse"}
    async with running_sim(heartbeat_interval=0.1, long_exec_seconds=60, cert_dir=tmp_path / "cert") as sim:
        async with client(sim, watchdog=1.0, watchdog_action="disconnect", **kw) as c:
            res = await c.run_turn("[scenario:long_exec] build it", raise_on_error=False)
        rec = (await sim.state.finished_runs(1))[0]
    assert res.error is not None and res.error.code == "watchdog"
    assert rec.outcome is not None and rec.outcome.startswith("disconnected while waiting for exec 1")
    assert "conversation_action.cancel_action" not in rec.client_kinds


def test_watchdog_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="watchdog must be > 0"):
        AgentClient("https://127.0.0.1:1", "t", watchdog=0)
    with pytest.raises(ValueError, match="watchdog action 'kill'"):
        AgentClient("https://127.0.0.1:1", "t", watchdog=1, watchdog_action="kill")


# the CLI ------------------------------------------------------------------------------------

def test_cli_flags_retry_and_watchdog(tmp_path: Path) -> None:
    sim = start_sim(tmp_path, "--long-exec-seconds", "5")
    try:
        base = [*WORKBENCH, "client", "--upstream", sim.url, "--ca-file", str(sim.cert), "--heartbeat-interval", "0.2"]
        env = env_without_proxy({"CURSOR_ACCESS_TOKEN": "t"})
        out = subprocess.run([*base, "--retry-after-turn", "[scenario:reset_after_turn] again?"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        assert "TurnRetried(attempt=1" in out.stderr, out.stderr
        assert out.stdout.count("Complete answer") == 1 and "Answer to: again?" in out.stdout, out.stdout
        out = subprocess.run([*base, "--execute-locally", "--workspace", str(tmp_path), "--allow-shell",
                              "--watchdog", "1", "--watchdog-action", "reset", "[scenario:long_exec] go"],
                             capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 1, out.stderr
        assert "watchdog: the client's watchdog ended the run after 1 s with reset" in out.stderr, out.stderr
        bad = subprocess.run([*base, "--watchdog", "0", "x"], capture_output=True, text=True, timeout=60, env=env)
        assert bad.returncode == 2 and "--watchdog 0" in bad.stderr, bad.stderr
    finally:
        sim.stop()
