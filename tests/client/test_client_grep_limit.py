"""The grep tool runs the server's pattern with a time limit, off the event loop (issue 20, finding 12).

A real ``workbench sim`` asks the built-in client (executing locally in a workspace) to grep with a
pattern that backtracks catastrophically on a line of the workspace. The client answers the grep
with an error naming the time limit, keeps heartbeating while the search runs, and the turn ends.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from client_sim_process import SimProcess, exec_answers, exec_kinds, recorded_frames, start_sim

from workbench.client.agent import AgentClient
from workbench.schema import pb

pytestmark = pytest.mark.slow  # starts subprocesses or servers

PATTERN = "(a|aa)+$"  # on "aaa…ab": exponential for a backtracking engine
SCENARIOS = {
    "grep_bomb": {
        "description": "A grep whose pattern backtracks catastrophically on a workspace line, then text.",
        "steps": [
            {"tool": {"exec": "grep", "args": {"pattern": PATTERN, "path": "."}, "client_tools": "never"}},
            {"text": "after grep", "chunks": 1},
            {"checkpoint": True}, {"step_completed": True}, {"turn_ended": True}, {"end": "ok"},
        ],
    },
}


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), scenarios=SCENARIOS)
    yield proc
    proc.stop()


@pytest.mark.timeout(120, method="thread")  # before the fix the loop hung in C: no signal got through
async def test_a_catastrophic_pattern_is_stopped_and_the_client_keeps_heartbeating(sim: SimProcess,
                                                                                     tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "notes.txt").write_text("hello\n" + "a" * 64 + "b\n")
    db = tmp_path / "rec.duckdb"
    started = time.monotonic()
    async with AgentClient(sim.url, "t", verify=sim.cert, workspace=ws, execute_locally=True, record_to=db,
                           heartbeat_interval=0.1, heartbeat_budget=100_000) as client:
        assert client.executor is not None
        client.executor.grep_time_limit = 1.0
        res = await client.run_turn("[scenario:grep_bomb] go", raise_on_error=False)
    assert time.monotonic() - started < 60
    assert res.error is None and res.ended and res.text == "after grep", res.error
    frames = recorded_frames(db, res.request_id)
    (grep_id,) = [eid for eid, kind in exec_kinds(frames).items() if kind == "grep_args"]
    assert exec_answers(frames)[grep_id][0] == "grep_result"
    answer = next(f for f in frames if f["direction"] == "client" and f["ref_id"] == grep_id
                  and f["kind"] == "exec_client_message.grep_result")
    err = pb.AgentClientMessage.FromString(answer["payload"]).exec_client_message.grep_result.error.error
    assert err.startswith(f"pattern {PATTERN!r}: the search took longer than 1 s and was stopped"), err
    # the event loop kept running while the pattern was matched: heartbeats went out in between
    asked = next(f["seq"] for f in frames if f["direction"] == "server" and f["ref_id"] == grep_id)
    beats = [f for f in frames if f["direction"] == "client" and asked < f["seq"] < answer["seq"]
             and f["kind"].endswith("heartbeat")]
    assert len(beats) >= 3, [f["kind"] for f in frames]
