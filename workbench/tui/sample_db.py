"""Capture databases for TUI tests, screenshots and the open-time benchmark.

Frames are real protobuf messages, enveloped, classified by the decoder and written by the
Recorder, exactly as a capture would store them; findings, blobs and tool_calls rows are written
with ``Store.insert_rows`` the way the analysis writes them. Timestamps are fixed so screenshots
and snapshot tests are deterministic.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from workbench.decode.classify import Decoder, Frame, default_decoder
from workbench.protocol import kinds
from workbench.protocol.labels import fill_label
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store, us_to_datetime
from workbench.store.queries import frame_kinds
from workbench.store.recorder import Recorder
from workbench.wire.envelope import FLAG_END_STREAM, encode

# 2026-01-15 10:00:00 UTC (naive arithmetic: datetime.timestamp() would use the local zone)
BASE_US = int((datetime(2026, 1, 15, 10, 0, 0) - datetime(1970, 1, 1)).total_seconds() * 1_000_000)

HANG_SESSION = "run-7f3a-shell-hang"
OK_SESSION = "run-2b91-complete"
ERR_SESSION = "runsse-c4d0-rate-limit"

Msg = tuple[float, str, bytes]  # (seconds after start, direction, enveloped bytes)


def _server(**kw: Any) -> bytes:
    return encode(pb.AgentServerMessage(**kw).SerializeToString())


def _client(**kw: Any) -> bytes:
    return encode(pb.AgentClientMessage(**kw).SerializeToString())


def _update(**kw: Any) -> bytes:
    return _server(interaction_update=pb.InteractionUpdate(**kw))


def _run_request(text: str, conversation_id: str) -> bytes:
    return _client(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text=text, message_id="m1"))),
        model_details=pb.ModelDetails(model_id="claude-4-sonnet"),
        conversation_id=conversation_id))


SYSTEM_BLOB = json.dumps({"role": "system", "content": "You are a coding agent. Use tools when needed."}).encode()
USER_BLOB = json.dumps({"role": "user", "content": [
    {"type": "text", "text": "<user_query>run the tests</user_query>"}]}).encode()
SHELL_ARGS = '{"command": "pytest -q", "working_directory": "/repo"}'


def hang_turn() -> Iterator[Msg]:
    """A turn that hangs: the shell exec is answered but never closed (docs/protocol.md §7, missing_stream_close)."""
    yield 0.0, "client", _run_request("run the tests", "c0ffee00-0000-4000-8000-000000000001")
    t = 0.2
    for kv_id, blob in ((1, SYSTEM_BLOB), (2, USER_BLOB)):
        yield t, "server", _server(kv_server_message=pb.KvServerMessage(
            id=kv_id, set_blob_args=pb.SetBlobArgs(blob_id=hashlib.sha256(blob).digest(), blob_data=blob)))
        yield t + 0.01, "client", _client(kv_client_message=pb.KvClientMessage(
            id=kv_id, set_blob_result=pb.SetBlobResult()))
        t += 0.05
    missing = hashlib.sha256(b"an earlier turn").digest()
    yield t, "server", _server(kv_server_message=pb.KvServerMessage(
        id=3, get_blob_args=pb.GetBlobArgs(blob_id=missing)))
    yield t + 0.01, "client", _client(kv_client_message=pb.KvClientMessage(id=3, get_blob_result=pb.GetBlobResult()))
    t = 0.6
    for text in ("The user wants the tests run.", " I will call pytest."):
        yield t, "server", _update(thinking_delta=pb.ThinkingDelta(text=text))
        t += 0.1
    yield t, "server", _update(token_delta=pb.TokenDelta(tokens=12))
    t += 0.1
    for cut in (9, 21, len(SHELL_ARGS)):
        yield t, "server", _update(partial_tool_call=pb.PartialToolCall(
            call_id="toolu_01", args_text_delta=SHELL_ARGS[:cut]))
        t += 0.05
    shell = pb.ShellArgs(command="pytest -q", working_directory="/repo", tool_call_id="toolu_01")
    yield t, "server", _update(tool_call_started=pb.ToolCallStarted(
        call_id="toolu_01", tool_call=pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=shell))))
    t += 0.05
    yield t, "server", _server(exec_server_message=pb.ExecServerMessage(id=7, exec_id="ex-7",
                                                                         shell_stream_args=shell))
    t += 0.4
    yield t, "client", _client(exec_client_message=pb.ExecClientMessage(
        id=7, exec_id="ex-7", shell_stream_result=pb.ShellStream(stdout=pb.ShellStreamStdout(data="3 passed\n"))))
    t += 0.1
    yield t, "client", _client(exec_client_message=pb.ExecClientMessage(
        id=7, exec_id="ex-7", shell_stream_result=pb.ShellStream(exit=pb.ShellStreamExit(code=0, cwd="/repo"))))
    # no stream_close{7}: from here on only heartbeats, both ways
    for i in range(37):
        t += 2.0
        yield t, "server", _update(heartbeat=pb.Heartbeat())
        if i % 5 == 4:
            yield t + 0.3, "client", _client(client_heartbeat=pb.ClientHeartbeat())


def ok_turn() -> Iterator[Msg]:
    yield 0.0, "client", _run_request("say hello", "c0ffee00-0000-4000-8000-000000000002")
    t = 0.3
    for word in ("Hello", ", ", "world", "!"):
        yield t, "server", _update(text_delta=pb.TextDelta(text=word))
        t += 0.08
    for _ in range(3):
        t += 1.5
        yield t, "server", _update(heartbeat=pb.Heartbeat())
    yield t + 0.1, "server", _server(conversation_checkpoint_update=pb.ConversationStateStructure(
        token_details=pb.ConversationTokenDetails(used_tokens=1200, max_tokens=200000)))
    yield t + 0.2, "server", _update(turn_ended=pb.TurnEnded())
    yield t + 0.25, "server", encode(b"{}", flags=FLAG_END_STREAM)


def err_turn() -> Iterator[Msg]:
    yield 0.0, "client", _run_request("refactor everything", "c0ffee00-0000-4000-8000-000000000003")
    err = {"error": {"code": "resource_exhausted", "message": "Error",
                     "details": [{"type": "aiserver.v1.ErrorDetails", "debug": {"error": "ERROR_RATE_LIMITED_CHANGEABLE"}}]}}
    yield 0.4, "server", encode(json.dumps(err).encode(), flags=FLAG_END_STREAM)


def _record(rec: Recorder, dec: Decoder, info: SessionInfo, msgs: Iterator[Msg], start_us: int) -> int:
    rec.open_session(info)
    streams = {d: dec.stream(info.transport or "run", d) for d in ("client", "server")}
    n = 0
    for offset, direction, data in msgs:
        for f in streams[direction].feed(data):
            rec.add(info.session_id, start_us + int(offset * 1_000_000), direction, info.transport or "run", "1", f)
            if direction == "client":
                fill_label(info, kind=f.kind, payload=f.payload)
            n += 1
    return n


def _table(rows: list[dict[str, object]], types: dict[str, pa.DataType]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema(list(types.items())))


FINDING_TYPES = {"session_id": pa.string(), "code": pa.string(), "severity": pa.string(),
                 "message": pa.string(), "first_seq": pa.int64(), "last_seq": pa.int64(),
                 "evidence": pa.list_(pa.int64()), "suggested_fix": pa.string(),
                 "created_at": pa.timestamp("us")}


def build_sample_db(path: str | Path, decoder: Decoder | None = None) -> Path:
    """Three sessions: a missing_stream_close hang (with findings, blobs, a tool call), a clean turn, an error."""
    path = Path(path)
    dec = decoder or default_decoder()
    with Store(path) as store:
        rec = Recorder(store)
        _record(rec, dec, SessionInfo(HANG_SESSION, source="capture", transport="run", model="claude-4-sonnet",
                                      status="incomplete", host="api2.cursor.sh",
                                      path="/agent.v1.AgentService/Run"), hang_turn(), BASE_US)
        _record(rec, dec, SessionInfo(OK_SESSION, source="client", transport="run", model="claude-4-sonnet",
                                      status="complete"), ok_turn(), BASE_US + 600_000_000)
        _record(rec, dec, SessionInfo(ERR_SESSION, source="sim", transport="runsse", model="gpt-5",
                                      status="error", error="resource_exhausted", label="rate_limit"), err_turn(),
                BASE_US + 900_000_000)
        rec.flush()
        kind_at = frame_kinds(store, HANG_SESSION)
        exec_seq = next(s for s, k in kind_at.items() if k == kinds.SHELL_STREAM_ARGS)
        results = [s for s, k in kind_at.items() if kinds.in_family(k, kinds.EXEC_CLIENT)]
        hbs = [s for s, k in kind_at.items() if k == kinds.SERVER_HEARTBEAT]
        partials = [s for s, k in kind_at.items() if k == kinds.PARTIAL_TOOL_CALL]
        get_seq = next(s for s, k in kind_at.items() if k == kinds.KV_GET_BLOB_ARGS)
        created = us_to_datetime(BASE_US + 3_600_000_000)
        findings = [
            dict(session_id=HANG_SESSION, code="exec_no_stream_close", severity="error",
                 message="exec 7 (shell_stream_args) got results but no stream_close; "
                 f"then {len(hbs)} heartbeats and no turn_ended",
                 first_seq=exec_seq, last_seq=hbs[-1], evidence=[exec_seq, *results, hbs[0]],
                 suggested_fix="send stream_close{id: 7} after the last ShellStream result", created_at=created),
            dict(session_id=HANG_SESSION, code="blob_get_miss", severity="warning",
                 message="get_blob for a blob the client does not have (answered without data)",
                 first_seq=get_seq, last_seq=get_seq + 1, evidence=[get_seq, get_seq + 1],
                 suggested_fix="keep the blob store across turns", created_at=created),
            dict(session_id=HANG_SESSION, code="cumulative_args", severity="info",
                 message="partial_tool_call args_text_delta is cumulative for toolu_01",
                 first_seq=partials[0], last_seq=partials[-1], evidence=partials,
                 suggested_fix="append only the new suffix", created_at=created),
            dict(session_id=ERR_SESSION, code="server_error", severity="error",
                 message="resource_exhausted: ERROR_RATE_LIMITED_CHANGEABLE", first_seq=1, last_seq=1,
                 evidence=[1], suggested_fix="usage limit reached; wait or change plan", created_at=created),
        ]
        store.insert_rows("findings", _table(findings, FINDING_TYPES))
        # Stamped as analysed: these hand-made rows are what the screenshots show, and a listing
        # must not replace them with a fresh analysis (workbench.analysis.stamp).
        from workbench.analysis.stamp import mark_analysed

        mark_analysed(store, [HANG_SESSION, OK_SESSION, ERR_SESSION])
        naive = SHELL_ARGS[:9] + SHELL_ARGS[:21] + SHELL_ARGS
        calls = [dict(session_id=HANG_SESSION, call_id="toolu_01", tool_name="shell", exec_id=7,
                      first_seq=partials[0], last_seq=results[-1], exec_seq=exec_seq, result_seq=results[-1],
                      args_streamed=SHELL_ARGS, args_completion=None,
                      args_merged=SHELL_ARGS, args_naive=naive, result=json.dumps({"stdout": "3 passed\n", "exit": 0}),
                      status="no_stream_close", started_at=us_to_datetime(BASE_US + 900_000),
                      ended_at=None)]
        store.insert_rows("tool_calls", _table(calls, {
            "session_id": pa.string(), "call_id": pa.string(), "tool_name": pa.string(), "exec_id": pa.int64(),
            "first_seq": pa.int64(), "last_seq": pa.int64(), "exec_seq": pa.int64(), "result_seq": pa.int64(),
            "args_streamed": pa.string(), "args_completion": pa.string(), "args_merged": pa.string(),
            "args_naive": pa.string(), "result": pa.string(), "status": pa.string(),
            "started_at": pa.timestamp("us"), "ended_at": pa.timestamp("us")}))
        blobs = []
        for i, (blob, role) in enumerate(((SYSTEM_BLOB, "system"), (USER_BLOB, "user"))):
            blobs.append(dict(session_id=HANG_SESSION, blob_id=hashlib.sha256(blob).hexdigest(), op="set",
                              seq=1 + 2 * i, result_seq=2 + 2 * i, kv_id=i + 1, size=len(blob),
                              content_type="json", role=role, sha256_ok=True, status="stored",
                              preview=blob[:60].decode(), data=blob))
        blobs.append(dict(session_id=HANG_SESSION, blob_id=hashlib.sha256(b"an earlier turn").hexdigest(),
                          op="get", seq=get_seq, result_seq=get_seq + 1, kv_id=3, size=0, content_type="empty",
                          role=None, sha256_ok=None, status="miss", preview="", data=None))
        store.insert_rows("blobs", _table(blobs, {
            "session_id": pa.string(), "blob_id": pa.string(), "op": pa.string(), "seq": pa.int64(),
            "result_seq": pa.int64(), "kv_id": pa.int64(), "size": pa.int32(), "content_type": pa.string(),
            "role": pa.string(), "sha256_ok": pa.bool_(), "status": pa.string(), "preview": pa.string(),
            "data": pa.binary()}))
    return path


def _templates(dec: Decoder) -> list[tuple[str, Frame]]:
    out: list[tuple[str, Frame]] = []
    for direction, data in (
        ("server", _update(token_delta=pb.TokenDelta(tokens=3))),
        ("server", _update(text_delta=pb.TextDelta(text="streaming text for the benchmark"))),
        ("server", _update(thinking_delta=pb.ThinkingDelta(text="thinking about it"))),
        ("server", _update(heartbeat=pb.Heartbeat())),
        ("client", _client(client_heartbeat=pb.ClientHeartbeat())),
    ):
        out.extend((direction, f) for f in dec.stream("run", direction).feed(data))
    return out


def build_big_db(path: str | Path, frames: int, session_id: str = "big", decoder: Decoder | None = None) -> Path:
    """One session of ``frames`` frames (mixed deltas, with heartbeat stretches), 20 ms apart."""
    path = Path(path)
    dec = decoder or default_decoder()
    tpl = _templates(dec)
    with Store(path) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo(session_id, source="capture", transport="run", model="bench", status="complete"))
        for i in range(frames):
            # every 200 frames, a stretch of 40 heartbeats (a folded row on screen)
            j = i % 200
            direction, f = tpl[3] if j >= 160 else tpl[j % 3]
            rec.add(session_id, BASE_US + i * 20_000, direction, "run", "1", f)
            if len(rec.batch) >= 100_000:
                rec.flush()
        rec.flush()
    return path
