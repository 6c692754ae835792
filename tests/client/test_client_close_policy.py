"""The two client styles on the wire, through a real ``workbench sim`` subprocess, on Run, RunSSE +
BidiAppend and RunPoll + BidiAppend: ``always`` (result(s) then stream_close for every exec) and
``streams-only`` (what current real clients send: the result alone, stream_close only after a
streamed shell — exit, final shell_result, stream_close — and after a throw).

Each turn is checked three ways: the client's own recording (what it sent for each exec id, in
order), the turn's outcome, and the sim's summary of the run (``-> turn_ended``, no faults). Against
``--strict-stream-close`` (the December 2025 service) ``streams-only`` stalls and ``always`` does not.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from client_sim_process import WORKBENCH, SimProcess, exec_answers, exec_kinds, recorded_frames, start_sim

from workbench.client.agent import AgentClient
from workbench.client.events import ExecRequest

pytestmark = pytest.mark.slow  # starts subprocesses or servers

NEVER = {"client_tools": "never"}
SCENARIOS = {
    "policy_mix": {
        "description": "Every exec kind once: request_context, the built-in tools, a plain and a streamed "
                       "shell, an MCP exec answered and one the caller fails (throw).",
        "steps": [
            {"kv_set": "system"}, {"kv_set": "user"},
            {"request_context": True},
            {"tool": {"exec": "read", "args": {"path": "README.md"}, **NEVER}},
            {"tool": {"exec": "write", "args": {"path": "out/NOTES.md", "contents": "notes\n"}, **NEVER}},
            {"tool": {"exec": "ls", "args": {"path": "."}, **NEVER}},
            {"tool": {"exec": "grep", "args": {"pattern": "hello", "path": "."}, **NEVER}},
            {"tool": {"exec": "delete", "args": {"path": "scratch.txt"}, **NEVER}},
            {"tool": {"exec": "shell", "args": {"command": "echo plain"}, **NEVER}},
            {"tool": {"exec": "shell_stream", "args": {"command": "echo streamed"}, **NEVER}},
            {"tool": {"exec": "mcp", "args": {"text": "answer me"}, **NEVER}},
            {"tool": {"exec": "mcp", "args": {"text": "fail me"}, **NEVER}},
            {"text": "All done: {tool_result}", "chunks": 2},
            {"checkpoint": True}, {"step_completed": True}, {"turn_ended": True}, {"end": "ok"},
        ],
    },
}
STREAMED_SHELL = ["shell_stream_result.start", "shell_stream_result.stdout", "shell_stream_result.exit",
                  "shell_result", "stream_close"]
THROWN = ["throw", "stream_close"]


def expected(policy: str, mcp_answered: bool = True) -> list[tuple[str, list[str]]]:
    """(args member, what the client sends for it) for policy_mix, in exec order."""
    def result(kind: str) -> list[str]:
        return [f"{kind}_result", "stream_close"] if policy == "always" else [f"{kind}_result"]

    return [("request_context_args", result("request_context")), ("read_args", result("read")),
            ("write_args", result("write")), ("ls_args", result("ls")), ("grep_args", result("grep")),
            ("delete_args", result("delete")), ("shell_args", result("shell")),
            ("shell_stream_args", STREAMED_SHELL),
            ("mcp_args", result("mcp") if mcp_answered else THROWN), ("mcp_args", THROWN)]


def workspace(tmp: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# demo\nhello world\n")
    (ws / "scratch.txt").write_text("scratch\n")
    return ws


async def answer_mcp(req: ExecRequest) -> str:
    if "fail" in str(req.args.get("args")):
        raise RuntimeError("the caller's tool failed")
    return "mcp answered"


def on_the_wire(db: Path, request_id: str) -> list[tuple[str, list[str]]]:
    frames = recorded_frames(db, request_id)
    kinds, answers = exec_kinds(frames), exec_answers(frames)
    return [(kinds[eid], answers[eid]) for eid in sorted(answers)]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    proc = start_sim(tmp_path_factory.mktemp("sim"), scenarios=SCENARIOS)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def strict_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    proc = start_sim(tmp_path_factory.mktemp("strict"), "--strict-stream-close", scenarios=SCENARIOS)
    yield proc
    proc.stop()


async def turn(sim: SimProcess, tmp: Path, policy: str, transport: str, budget: int = 400) -> tuple[Any, str, Path]:
    db = tmp / "rec.duckdb"
    async with AgentClient(sim.url, "t", transport=transport, verify=sim.cert, workspace=workspace(tmp),
                           execute_locally=True, allow_shell=True, close_policy=policy, record_to=db,
                           heartbeat_interval=0.5, heartbeat_budget=budget) as c:
        res = await c.run_turn("[scenario:policy_mix] go", on_exec=answer_mcp, raise_on_error=False)
    summary = await asyncio.to_thread(sim.next_run)
    return res, summary, db


@pytest.mark.parametrize("transport", ["run", "runsse", "runpoll"])
@pytest.mark.parametrize("policy", ["always", "streams-only"])
async def test_each_policy_on_the_wire_completes_against_the_default_sim(
        sim: SimProcess, tmp_path: Path, policy: str, transport: str) -> None:
    res, summary, db = await turn(sim, tmp_path, policy, transport)
    assert on_the_wire(db, res.request_id) == expected(policy), (res.error, summary)
    assert res.error is None, (res.error, summary)
    assert res.ended, (res.error, summary)
    assert res.end_missing is None
    assert "-> turn_ended" in summary, summary
    assert "faults:" not in summary, summary
    assert res.text.startswith("All done")


@pytest.mark.parametrize("transport", ["run", "runpoll"])
async def test_streams_only_stalls_against_the_strict_sim(strict_sim: SimProcess, tmp_path: Path,
                                                           transport: str) -> None:
    """December 2025: built-in tool results alone left the run heartbeating until stream_close."""
    res, summary, db = await turn(strict_sim, tmp_path, "streams-only", transport, budget=60)
    assert not res.ended
    assert res.error is not None
    assert res.error.code == "heartbeat_budget"
    assert "close policy streams-only" in res.error.message
    assert "--strict-stream-close" in res.error.message
    assert "turn_ended" not in summary
    first = on_the_wire(db, res.request_id)[0]
    assert first == ("request_context_args", ["request_context_result"])  # answered, never closed


@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_always_completes_against_the_strict_sim(strict_sim: SimProcess, tmp_path: Path,
                                                       transport: str) -> None:
    res, summary, db = await turn(strict_sim, tmp_path, "always", transport)
    assert on_the_wire(db, res.request_id) == expected("always"), (res.error, summary)
    assert res.error is None, (res.error, summary)
    assert res.ended, (res.error, summary)
    assert "-> turn_ended" in summary, summary
    assert "faults:" not in summary, summary


def test_the_cli_close_policy_switch(sim: SimProcess, tmp_path: Path) -> None:
    db = tmp_path / "cli.duckdb"
    proc = subprocess.run(
        [*WORKBENCH, "client", "--upstream", sim.url, "--ca-file", sim.cert, "--transport", "runsse",
         "--close-policy", "streams-only", "--execute-locally", "--allow-shell", "--workspace", str(workspace(tmp_path)),
         "--heartbeat-budget", "400", "--record", str(db), "[scenario:policy_mix] from the command line"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "CURSOR_ACCESS_TOKEN": "sk-cli-policy"})
    summary = sim.next_run()
    # the CLI hands no exec to a caller: both MCP execs are thrown (then closed)
    assert on_the_wire(db, recorded_session(db)) == expected("streams-only", mcp_answered=False), proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("All done")
    assert "-> turn_ended" in summary, summary
    assert "faults:" not in summary, summary


def recorded_session(db: Path) -> str:
    from workbench.store.reader import open_reader

    reader = open_reader(db)
    try:
        [row] = reader.query("SELECT session_id, meta FROM sessions").to_pylist()
    finally:
        reader.close()
    assert '"close_policy": "streams-only"' in row["meta"] or '"close_policy":"streams-only"' in row["meta"]
    return str(row["session_id"])
