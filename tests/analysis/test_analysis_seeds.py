"""The three seed investigations, reproduced with the simulator + client and diagnosed.

- tool-calling-investigation-dec08: built-in exec results sent without stream_close, then the run
  is stuck in heartbeats (the client's "auto-close after N heartbeats" workaround ends it).
- tool-calling-investigation-dec10-condensed: tool results appended into the still-open run
  (same-session continuation) → tool_call_completed, heartbeats and an assistant KV blob that
  holds a tool call (Shell, command echo …), no text, no turn_ended.
- pr-preserve-large-mcp-args: the `task` tool's `tasks` array streamed as cumulative snapshots
  (garbled by naive concatenation) and dropped from the completion frame's McpArgs; the pre-fix
  proxy overwrote the args with that completion and replayed them in its next (stateless) run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_rig import echo_args_text, rig_session

from workbench.client.events import TurnResult
from workbench.protocol.args import parse_json
from workbench.store.reader import open_reader

pytestmark = pytest.mark.slow  # starts subprocesses or servers


async def test_seed_dec08_heartbeat_loop_after_missing_stream_close(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:tool_flow] Use the bash tool to run: echo hello"],
                            faults=["no_stream_close"], stream_close="required")
    assert run.turn_errors == ["heartbeat_budget"]  # the client's workaround: give up after N heartbeats
    close = run.finding("missing_stream_close")
    loop = run.finding("heartbeat_loop")
    reader = open_reader(run.db)
    try:
        frames = {r["seq"]: r for r in reader.query(
            "SELECT seq, kind, ref_id FROM frames WHERE session_id = ? ORDER BY seq", [run.session_ids[0]]).to_pylist()}
    finally:
        reader.close()
    exec_seq = close.first_seq
    assert frames[exec_seq]["kind"] == "exec_server_message.shell_args"
    result_seq = next(s for s in close.evidence if frames[s]["kind"] == "exec_client_message.shell_result")
    assert frames[result_seq]["ref_id"] == frames[exec_seq]["ref_id"]
    heartbeats = [s for s in loop.evidence if frames[s]["kind"] == "interaction_update.heartbeat"]
    assert len(heartbeats) >= 5
    assert min(heartbeats) > result_seq
    assert f"stream_close{{{frames[exec_seq]['ref_id']}}}" in loop.message  # the loop names its cause
    assert not any(frames[s]["kind"] == "exec_client_control_message.stream_close" for s in frames if s > exec_seq)


async def test_seed_dec10_answer_hidden_in_kv_blob(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:kv_only_on_reuse] run echo", "[scenario:kv_only_on_reuse] go on"],
                            faults=["reuse_session"])
    res = run.only()
    f = run.finding("kv_only_response")
    assert f.severity == "error"
    blobs = res.blobs
    roles = {b["role"] for b in blobs if b["content_type"] == "json"}
    assert {"system", "user", "assistant"} <= roles
    assert any(b["content_type"] == "protobuf" for b in blobs)  # turn/user-message structures
    [assistant] = [b for b in blobs if b["role"] == "assistant" and b["op"] == "set"]
    assert assistant["seq"] in f.evidence
    [part] = assistant["parts"]
    assert part["type"] == "tool-call"
    assert part["name"] == "Shell"  # a tool call, not text
    assert part["args"] == {"command": "echo 'Hello from KV blob investigation'"}
    assert all(b["sha256_ok"] for b in blobs if b["size"])
    assert "heartbeat_loop" in run.codes()
    # the fresh run on the same conversation (the investigation's fix) is clean
    assert run.results[run.session_ids[1]].problems == []


def _flattened_history(prev: TurnResult | None) -> str:
    """The pre-fix proxy's next prompt: history flattened, the call's args as the completion had them."""
    assert prev is not None
    call = next(c for c in prev.tool_calls if c.completion_args is not None)
    args = json.dumps(call.completion_args, separators=(",", ":"))  # JSON.stringify of what it kept
    return (f"USER: dispatch the subagents\nASSISTANT: TOOL_CALL {call.name} {args}\n"
            f"TOOL_RESULT (call_id: {call.call_id}): done\nUSER: go on")


async def test_seed_pr_large_mcp_args(tmp_path: Path) -> None:
    run = await rig_session(tmp_path, ["[scenario:mcp_large_args] dispatch the subagents", _flattened_history],
                            faults=["naive_args_concat"], execute_locally=False, on_exec=echo_args_text)
    res = run.only()
    [call] = [t for t in res.tool_calls if t["tool_name"] == "task"]
    tasks = call["args_merged"]["tasks"]
    assert isinstance(tasks, list)
    assert len(tasks) > 1  # the merge keeps the array
    assert "tasks" not in call["args_completion"]  # the completion frame dropped it
    assert isinstance(call["args_completion"]["options"], str)  # and downgraded options to a string
    assert call["args_streamed"]["tasks"] == tasks
    assert parse_json(call["args_naive"]) is None  # naive concatenation: not even JSON
    lossy = run.finding("completion_args_lossy")
    assert "'tasks'" in lossy.message
    assert call["call_id"] in lossy.message
    assert f"session {run.session_ids[1]}" in lossy.message  # where the lossy args came back
    snap = run.finding("args_cumulative_snapshots")
    assert call["call_id"] in snap.message
    assert call["result_seq"] in snap.evidence
