"""Acceptance: sessions made by the real simulator + client (fault switches) or a real NDJSON
import must produce their finding code; healthy scenarios must produce no finding at all.

Covered elsewhere: ``append_seqno_anomaly`` needs the wire (the client records the
AgentClientMessage inside each BidiAppend, not its seqno), so test_analysis_capture.py records
the rig through `workbench capture`; ``unanswered_query`` has no simulator step yet and is tested
on hand-built sessions in test_analysis_rules.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_rig import echo_args_text, rig_session
from support import run_workbench

from workbench.analysis import analyze
from workbench.store.db import Store

pytestmark = pytest.mark.slow  # starts subprocesses or servers

ROOT = Path(__file__).resolve().parents[2]
HEALTHY_SCENARIOS = ("text", "tool_flow", "read_write", "explore", "shell_stream", "web_search", "exec_abort",
                     "goaway_after_turn", "mcp_large_args")
HEALTHY = [(s, t) for s in HEALTHY_SCENARIOS for t in ("run", "runsse", "runpoll")]


@pytest.mark.parametrize(("scenario", "transport"), HEALTHY)
async def test_healthy_scenarios_produce_no_finding(tmp_path: Path, scenario: str, transport: str) -> None:
    run = await rig_session(tmp_path, [f"[scenario:{scenario}] please"], transport=transport)
    assert run.turn_errors == [None]
    res = run.only()
    assert res.problems == [], [f.message for f in res.findings]
    assert res.frame_count > 10


async def test_healthy_multi_turn_conversation(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:tool_flow] first", "[scenario:text] second"])
    assert run.turn_errors == [None, None]
    assert len(run.session_ids) == 2
    for sid in run.session_ids:
        assert run.results[sid].problems == []


@pytest.mark.parametrize("transport", ["run", "runsse"])
@pytest.mark.parametrize("scenario", ["tool_flow", "read_write", "explore", "shell_stream"])
async def test_real_client_style_against_an_accepting_server_is_healthy(tmp_path: Path, scenario: str,
                                                                        transport: str) -> None:
    """Result alone for non-streamed execs (close policy streams-only) against a simulator that
    completes an exec on its result: the 2026 service and the clients that work with it."""
    run = await rig_session(tmp_path, [f"[scenario:{scenario}] please"], transport=transport,
                            stream_close="accepted", close_policy="streams-only")
    assert run.turn_errors == [None]
    assert run.only().problems == [], [f.message for f in run.only().findings]


async def test_real_client_style_against_a_server_that_waits_for_stream_close(tmp_path: Path) -> None:
    """The December 2025 behaviour: the same client stalls, and the diagnosis names the exec."""
    run = await rig_session(tmp_path, ["[scenario:explore] please"], stream_close="required",
                            close_policy="streams-only")
    assert run.turn_errors == ["heartbeat_budget"]
    f = run.only().findings[0]
    assert f.code == "missing_stream_close"
    assert f.severity == "error"
    assert "ls_args" in f.message
    assert "heartbeat_loop" in run.codes()


async def test_exec_handed_over_by_leaving_the_run_is_not_a_stall(tmp_path: Path) -> None:
    """The fresh-run flow (seed dec10): a proxy leaves the run at the exec, then starts a new run."""
    run = await rig_session(tmp_path, ["[scenario:tool_flow] run it"], execute_locally=False, abandon_on_exec=True)
    res = run.only()
    assert res.problems == [], [f.message for f in res.findings]
    assert [t["status"] for t in res.tool_calls] == ["awaiting_result"]


async def test_no_stream_close_gives_missing_stream_close_and_heartbeat_loop(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:tool_flow] run it"], faults=["no_stream_close"],
                            stream_close="required")
    assert run.turn_errors == ["heartbeat_budget"]
    assert {"missing_stream_close", "heartbeat_loop"} <= set(run.codes())
    f = run.finding("missing_stream_close")
    assert f.severity == "error"
    assert "no stream_close" in f.message


async def test_unanswered_exec(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:tool_flow] run it"], execute_locally=False, ignore_execs=True)
    f = run.finding("unanswered_exec")
    assert "shell" in f.message
    assert f.severity == "error"
    assert "heartbeat_loop" in run.codes()


async def test_reuse_session_gives_kv_only_response(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:kv_only_on_reuse] run it", "[scenario:kv_only_on_reuse] go on"],
                            faults=["reuse_session"])
    f = run.finding("kv_only_response")
    assert "assistant" in f.message
    assert "tool-call Shell" in f.message


async def test_naive_args_concat_gives_args_cumulative_snapshots(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:mcp_large_args] dispatch"], faults=["naive_args_concat"],
                            execute_locally=False, on_exec=echo_args_text)
    f = run.finding("args_cumulative_snapshots")
    assert f.severity == "warning"
    assert "concatenated" in f.message


async def test_same_tool_with_a_correct_client_has_no_finding(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:mcp_large_args] dispatch"], execute_locally=False,
                            on_exec=echo_args_text)
    assert run.codes() == []  # cumulative snapshots and a lossy completion, handled right: healthy
    assert not run.only().failed
    # ... and said, as notes: what a naive client would trip on
    assert sorted(f.code for f in run.only().notes) == ["args_cumulative_snapshots", "completion_args_lossy"]
    [call] = run.only().tool_calls
    assert "tasks" not in call["args_completion"]
    assert "tasks" in call["args_merged"]  # the hazard stays visible


async def test_omit_conversation_state(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:text] hi"], faults=["omit_conversation_state"])
    f = run.finding("missing_conversation_state")
    assert f.severity == "error"
    assert f.first_seq == 0
    assert "server_error" in run.codes()  # the server's "Conversation state is required"


async def test_no_turn_end(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:no_turn_end] hi"])
    assert run.codes() == ["stream_ended_without_turn_end"]
    assert "checkpoint" in run.finding("stream_ended_without_turn_end").message


async def test_blob_miss(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:blob_miss] hi"])
    f = run.finding("blob_miss")
    assert f.severity == "warning"
    assert "without data" in f.message
    misses = [b for b in run.only().blobs if b["status"] == "miss"]
    assert len(misses) == 1
    assert misses[0]["op"] == "get"


@pytest.mark.parametrize(("scenario", "code"), [("rate_limit", "resource_exhausted"),
                                                ("provider_error", "unavailable")])
async def test_server_errors(tmp_path: Path, scenario: str, code: str) -> None:
    run = await rig_session(tmp_path, [f"[scenario:{scenario}] hi"])
    assert run.codes() == ["server_error"]
    f = run.finding("server_error")
    assert code in f.message
    assert f.severity == "error"


async def test_tool_loop_from_a_scenario_file(tmp_path: Path) -> None:
    scenarios = tmp_path / "scenarios"
    scenarios.mkdir()
    tool = {"tool": {"exec": "shell", "args": {"command": "cat README.md"}, "partial_snapshots": 2}}
    (scenarios / "loop.json").write_text(json.dumps({"description": "the same call three times", "steps": [
        {"kv_set": "system"}, tool, tool, tool, {"text": "still reading"}, {"checkpoint": True},
        {"turn_ended": True}, {"end": "ok"}]}))
    run = await rig_session(tmp_path, ["[scenario:loop] read"], scenario_dirs=[scenarios])
    assert run.codes() == ["tool_loop"]
    assert "3 times" in run.finding("tool_loop").message


def test_imported_cli_ndjson_is_healthy(tmp_path: Path) -> None:
    """Verbatim CLI stream-json mixes delta, snapshot and full assistant events and gets its result
    text right: that is the CLI's normal output, no finding (a relay that duplicates the text is
    tested in test_analysis_rules.py)."""
    db = tmp_path / "nd.duckdb"
    src = ROOT / "tests" / "ingest" / "data" / "stream-json.ndjson"
    proc = run_workbench("import", str(src), "--db", str(db), timeout=120)
    assert proc.returncode == 0, proc.stderr
    store = Store(db)
    try:
        results = analyze(store)
    finally:
        store.close()
    [res] = results.values()
    assert res.problems == []
    assert [(t["tool_name"], t["status"]) for t in res.tool_calls] == [("shell", "completed"), ("read", "completed")]
    assert res.tool_calls[0]["result"]["exitCode"] == 1
