"""Analysis throughput on a 1,000,000-frame session.

Generates one long run in a fresh DuckDB file through the real classifier and FrameBatch inserts
(a realistic mix: mostly token/tool-call/thinking deltas, per step a streamed tool call with its
exec, result and stream_close, KV set/get of JSON prompt blobs, text, heartbeats; the run ends in
a heartbeat loop after an exec that never got its stream_close), then times
``workbench.analysis.analyze`` on it (walk + blobs + tool calls + rules + writing the rows) and,
as the baseline measured in the same run, a plain ``SELECT kind, count(*) … GROUP BY kind`` scan of
the same frames. Paired rounds (``--rounds``, default 3): baseline then analysis, each round; the
figure is the median, printed with the machine's yardstick (``yardstick.py``).

    python benchmarks/diagnose.py [--frames N] [--rounds R] [--db PATH] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from goals import goal

from workbench.analysis import analyze
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, Frame, default_decoder
from workbench.schema import pb
from workbench.store.db import FrameBatch, SessionInfo, Store, us_to_datetime

SID = "bench-1m"


def _server(**fields: Any) -> Frame:
    return default_decoder().classify_agent(pb.AgentServerMessage(**fields).SerializeToString(), SERVER_MSG)


def _client(**fields: Any) -> Frame:
    return default_decoder().classify_agent(pb.AgentClientMessage(**fields).SerializeToString(), CLIENT_MSG)


def _update(**fields: Any) -> Frame:
    return _server(interaction_update=pb.InteractionUpdate(**fields))


_SYSTEM = json.dumps({"role": "system", "content": "You are a coding agent. " * 400}).encode()


def step_frames(k: int) -> list[tuple[str, Frame]]:
    """One model step (~210 frames) with ids unique to step ``k``, in the proportions of the IDE
    captures in docs/protocol.md §6 (per tool call: ~110 token_delta, ~50 tool_call_delta, ~23
    thinking_delta, ~6 text_delta, 2-3 partial_tool_call, ~8 KV frames, 2 heartbeats)."""
    token = _update(token_delta=pb.TokenDelta(tokens=3))
    think = _update(thinking_delta=pb.ThinkingDelta(text="considering the files "))
    out: list[tuple[str, Frame]] = [("server", think)] * 23
    out.append(("server", _update(thinking_completed=pb.ThinkingCompleted(thinking_duration_ms=900))))
    call = f"call-{k}"
    args = json.dumps({"command": f"grep -rn pattern{k} src", "working_directory": "/work"})
    for cut in (len(args) // 3, 2 * len(args) // 3, len(args)):
        out.append(("server", _update(partial_tool_call=pb.PartialToolCall(call_id=call, args_text_delta=args[:cut]))))
    tc = pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=pb.ShellArgs(command=f"grep -rn pattern{k} src")))
    out.append(("server", _update(tool_call_started=pb.ToolCallStarted(call_id=call, tool_call=tc))))
    eid = k + 1
    out.append(("server", _server(exec_server_message=pb.ExecServerMessage(
        id=eid, exec_id=f"x{k}", shell_args=pb.ShellArgs(command=f"grep -rn pattern{k} src", tool_call_id=call)))))
    out.append(("client", _client(exec_client_message=pb.ExecClientMessage(
        id=eid, exec_id=f"x{k}", shell_result=pb.ShellResult(success=pb.ShellSuccess(stdout="src/a.py:1: hit\n"))))))
    out.append(("client", _client(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=eid)))))
    delta = _update(tool_call_delta=pb.ToolCallDeltaUpdate(call_id=call))
    out += [("server", delta)] * 50
    out.append(("server", _update(heartbeat=pb.Heartbeat())))
    out.append(("server", _update(tool_call_completed=pb.ToolCallCompleted(call_id=call, tool_call=tc))))
    out += [("server", token)] * 55
    out += [("server", _update(text_delta=pb.TextDelta(text=f"found {k} ")))] * 6
    out += [("server", token)] * 55
    tool_blob = json.dumps({"role": "tool", "content": [{"type": "tool-result", "toolName": "Shell",
                                                         "toolCallId": call, "result": "src/a.py:1: hit " * 20}]})
    kv = 4 * k + 1
    for i, blob in enumerate((tool_blob.encode(), _SYSTEM)):
        bid = hashlib.sha256(blob).digest()
        out.append(("server", _server(kv_server_message=pb.KvServerMessage(id=kv + 2 * i, set_blob_args=pb.SetBlobArgs(
            blob_id=bid, blob_data=blob)))))
        out.append(("client", _client(kv_client_message=pb.KvClientMessage(
            id=kv + 2 * i, set_blob_result=pb.SetBlobResult()))))
        out.append(("server", _server(kv_server_message=pb.KvServerMessage(id=kv + 2 * i + 1, get_blob_args=pb.GetBlobArgs(
            blob_id=bid)))))
        out.append(("client", _client(kv_client_message=pb.KvClientMessage(id=kv + 2 * i + 1, get_blob_result=pb.GetBlobResult(
            blob_data=blob)))))
    out.append(("server", _update(step_completed=pb.StepCompleted(step_id=k, step_duration_ms=1200))))
    out.append(("server", _update(heartbeat=pb.Heartbeat())))
    if k % 10 == 0:
        out.append(("client", _client(client_heartbeat=pb.ClientHeartbeat())))
    return out


def generate(store: Store, frames: int) -> int:
    batch = FrameBatch()
    ts = 1_750_000_000_000_000
    seq = 0
    first = _client(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(), conversation_id="bench",
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="find every pattern")))))
    batch.add(SID, seq, ts, "client", "run", None, first)
    seq += 1
    loop = 2_000
    k = 0
    while seq < frames - loop - 3:
        for direction, f in step_frames(k):
            ts += 2_000
            batch.add(SID, seq, ts, direction, "run", None, f)
            seq += 1
        k += 1
        if len(batch) >= 100_000:
            store.insert_frames(batch)
            batch.clear()
    # the stall: an exec answered without stream_close, then heartbeats only
    eid = 10_000_000
    stall = [("server", _server(exec_server_message=pb.ExecServerMessage(
        id=eid, exec_id="stall", shell_stream_args=pb.ShellArgs(command="sleep 1")))),
        ("client", _client(exec_client_message=pb.ExecClientMessage(
            id=eid, exec_id="stall", shell_stream_result=pb.ShellStream(exit=pb.ShellStreamExit(code=0)))))]
    hb = _update(heartbeat=pb.Heartbeat())
    for direction, f in stall:
        ts += 2_000
        batch.add(SID, seq, ts, direction, "run", None, f)
        seq += 1
    while seq < frames:
        ts += 2_000_000
        batch.add(SID, seq, ts, "server", "run", None, hb)
        seq += 1
    store.insert_frames(batch)
    info = SessionInfo(SID, source="benchmark", transport="run", conversation_id="bench", frame_count=seq,
                       started_at=us_to_datetime(1_750_000_000_000_000), ended_at=us_to_datetime(ts),
                       status="incomplete")
    store.upsert_sessions([info])
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--frames", type=int, default=1_000_000)
    ap.add_argument("--db", help="database file (default: a temporary file)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary database")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds (baseline, analysis); default 3")
    args = ap.parse_args()
    tmp = None
    if args.db:
        path = Path(args.db)
    else:
        tmp = tempfile.mkdtemp(prefix="wb-bench-")
        path = Path(tmp) / "diagnose.duckdb"
    store = Store(path)
    t0 = time.perf_counter()
    n = generate(store, args.frames)
    store.checkpoint()
    print(f"generated {n:,} frames in {time.perf_counter() - t0:.1f} s ({path})")

    bases, fulls, tooks, cpus = [], [], [], []
    for _ in range(max(1, args.rounds)):
        t0 = time.perf_counter()
        kinds = store.query("SELECT kind, count(*) FROM frames WHERE session_id = ? GROUP BY kind", [SID])
        bases.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        store.query("SELECT sum(octet_length(payload)), count(DISTINCT call_id) FROM frames WHERE session_id = ?",
                    [SID])
        fulls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        c0 = time.process_time()
        result = analyze(store, [SID])[SID]
        tooks.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    store.close()
    base, full, took, cpu = (statistics.median(x) for x in (bases, fulls, tooks, cpus))
    print(f"medians of {len(tooks)} paired rounds (analysis: {', '.join(f'{t:.3f}' for t in tooks)} s)")
    print(f"baseline  GROUP BY kind scan: {base:.3f} s ({n / base:,.0f} frames/s, {kinds.num_rows} kinds)")
    print(f"baseline2 payload-reading scan: {full:.3f} s ({n / full:,.0f} frames/s)")
    print(f"analyze   whole session:      {took:.3f} s ({n / took:,.0f} frames/s) — "
          f"{took / base:.1f}x the GROUP BY scan, {took / full:.1f}x the payload scan")
    print(goal("diagnose").line(took, f"{took:.3f} s at {n:,} frames"))
    print(f"          CPU time {cpu:.2f} s (all threads; the wall time above includes waiting on a busy machine, "
          f"load average {os.getloadavg()[0]:.1f})")
    print(f"          {len(result.tool_calls):,} tool calls, {len(result.blobs):,} blob rows, findings: "
          + ", ".join(f"{f.code}({f.severity})" for f in result.findings))
    print(yardstick_line())
    if tmp and not args.keep:
        os.remove(path)
        for extra in Path(tmp).iterdir():
            extra.unlink()
        os.rmdir(tmp)


def yardstick_line() -> str:
    from yardstick import measure  # the machine's yardstick (benchmarks/yardstick.py), run after the figures

    return measure().line()


if __name__ == "__main__":
    main()
