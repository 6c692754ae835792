"""Issue 17, end to end through capture: the seed proxy's mode D against the simulator.

The independent gRPC-Web test client (``tests/clients/grpcweb_mode_d_client.py``: HTTP/1.1,
RunSSE + enveloped BidiAppends as ``application/grpc-web+proto``, 0x80 trailers, the AiService
model listing as Connect JSON, stateless tool calls) runs through a real mitmdump with the capture
addon (and the whole-body flow writer, which also exports a HAR with mitmproxy's own exporter) in
front of ``workbench sim``: a tool call handed out, then a fresh run with the history flattened into
the prompt; and the same client sending its envelope as ``application/proto``. The live capture,
the flow-file import and the HAR import must each show the turns complete and diagnosed clean, the
envelopes kept (``raw`` with the 5-byte gRPC-Web header, ``flags``, ``frames.meta.http_status``),
and the refused run as ``append_rejected`` naming ``run_request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from capture_rig import ADDON, BIN, ROOT, Sim
from grpcweb_mode_d_client import GRPC_WEB, ModeDClient, TurnResult, flatten, tool_round
from support import env_without_proxy, free_port, wait_port

from workbench.cli import main
from workbench.store import open_reader
from workbench.wire.envelope import FLAG_TRAILER

WHOLE_BODY_ADDON = ROOT / "tests" / "ingest" / "data" / "whole_body_flows.py"
TOKEN = "wb-mode-d-token-90be12"
BASH = {"name": "bash", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
SOURCES = ("live", "flow", "har")

pytestmark = pytest.mark.slow


@dataclass
class ModeD:
    dbs: dict[str, Path]
    models: list[str]
    first: TurnResult  # the tool call, handed out (the run is left)
    second: TurnResult  # the fresh run with the flattened history
    refused: TurnResult  # the envelope sent as application/proto
    outputs: dict[str, str] = field(default_factory=dict)


async def _conversation(url: str, ca: Path, proxy: str) -> tuple[list[str], TurnResult, TurnResult, TurnResult]:
    client = ModeDClient(url, TOKEN, str(ca), proxy=proxy)
    models = await client.list_models()
    messages = [{"role": "user", "content": "[scenario:tool_flow] say hello with the shell"}]
    first = await client.run(flatten(messages, "opencode"), tools=[BASH])
    [call] = first.tool_calls
    messages = tool_round(messages, call, "hello from workbench")
    second = await client.run(flatten(messages, "opencode"), conversation_id=str(uuid.uuid4()), tools=[BASH])
    refused = await ModeDClient(url, TOKEN, str(ca), proxy=proxy,
                                append_content_type="application/proto").run("[scenario:text] hi")
    return models, first, second, refused


def _cli(*args: str) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(args))
    assert code in (0, 1), (args, code)
    return buf.getvalue()


@pytest.fixture(scope="module")
def mode_d(capture_sim: Sim, capture_confdir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModeD]:
    out = tmp_path_factory.mktemp("mode-d")
    live, flows, har = out / "live.duckdb", out / "whole.flows", out / "whole.har"
    port = free_port()
    with (out / "mitmdump.log").open("w") as log:
        mitm = subprocess.Popen(
            [str(BIN / "mitmdump"), "-q", "-s", str(ADDON), "-s", str(WHOLE_BODY_ADDON), "--listen-host", "127.0.0.1",
             "--listen-port", str(port), "--set", f"confdir={capture_confdir}", "--set", "ssl_insecure=true",
             "--set", f"cursor_db={live}", "--set", f"whole_body_flows={flows}", "--set", f"whole_body_har={har}"],
            stdout=log, stderr=subprocess.STDOUT, env=env_without_proxy())
    try:
        wait_port(port, mitm)
        models, first, second, refused = asyncio.run(asyncio.wait_for(_conversation(
            capture_sim.url, capture_confdir / "mitmproxy-ca-cert.pem", f"http://127.0.0.1:{port}"), 120))
    finally:
        mitm.send_signal(2)
        assert mitm.wait(60) == 0, (out / "mitmdump.log").read_text()[-2000:]
    dbs = {"live": live, "flow": out / "flow.duckdb", "har": out / "har.duckdb"}
    _cli("import", str(flows), "--db", str(dbs["flow"]))
    _cli("import", str(har), "--db", str(dbs["har"]))
    yield ModeD(dbs, models, first, second, refused)


def _sessions(db: Path) -> list[dict[str, Any]]:
    r = open_reader(db)
    try:
        rows = r.query("SELECT session_id, request_id, transport, path, status, http_status FROM sessions").to_pylist()
    finally:
        r.close()
    return rows


def _session(db: Path, rid: str) -> dict[str, Any]:
    [s] = [s for s in _sessions(db) if s["request_id"] == rid and s["transport"] == "runsse"]
    return s


def _frames(db: Path, sid: str) -> list[dict[str, Any]]:
    r = open_reader(db)
    try:
        rows = r.query("SELECT seq, direction, transport, kind, flags, raw, meta, append_seqno, summary FROM frames "
                       "WHERE session_id = ? ORDER BY seq", [sid]).to_pylist()
    finally:
        r.close()
    for row in rows:
        row["meta"] = json.loads(row["meta"]) if row["meta"] else {}
    return rows


def _diagnosis(db: Path) -> dict[str, list[dict[str, Any]]]:
    return {d["session_id"]: d["findings"] for d in map(json.loads, _cli("diagnose", "--all", "--json", "--db",
                                                                        str(db)).splitlines())}


def test_the_client_sees_mode_d_through_the_capture(mode_d: ModeD) -> None:
    assert "gpt-5" in mode_d.models  # /aiserver.v1.AiService/GetUsableModels as Connect JSON
    first, second = mode_d.first, mode_d.second
    assert [c.name for c in first.tool_calls] == ["bash"] and first.abandoned and first.trailer is None
    assert second.turn_ended and second.grpc_status == "0" and second.connect_end_frames == 0
    assert second.text == "The bash call returned: hello from workbench"
    assert not any(k.startswith("exec_server_message.shell") for k in second.kinds)  # not the same call again
    assert set(first.append_statuses + second.append_statuses) == {200}
    assert set(second.append_grpc_status) == {"0"}
    assert mode_d.refused.append_statuses == [415] and "run_request" in (mode_d.refused.error or "")


@pytest.mark.parametrize("source", SOURCES)
def test_recordings_keep_the_envelopes_and_diagnose_clean(mode_d: ModeD, source: str) -> None:
    db = mode_d.dbs[source]
    findings = _diagnosis(db)
    refused_sid = _session(db, mode_d.refused.request_id)["session_id"]
    others = {sid: f for sid, f in findings.items() if sid != refused_sid}
    # the model listing, the run that handed its tool call out, the stateless follow-up: all clean
    assert len(others) == 3 and all(f == [] for f in others.values()), others
    unary = [s for s in _sessions(db) if s["transport"] == "unary"]
    assert [(s["path"], s["http_status"]) for s in unary] == [("/aiserver.v1.AiService/GetUsableModels", 200)]

    for turn in (mode_d.first, mode_d.second):
        rows = _frames(db, _session(db, turn.request_id)["session_id"])
        appends = [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "client"]
        assert len(appends) == len(turn.sent) and [r["kind"] for r in appends] == turn.sent
        assert [r["append_seqno"] for r in appends] == list(range(len(appends)))
        for r in appends:
            raw = r["raw"]
            assert raw[0] == r["flags"] == 0 and int.from_bytes(raw[1:5], "big") == len(raw) - 5  # gRPC-Web header
            assert r["meta"]["http_status"] == 200 and r["meta"]["content_type"] == GRPC_WEB
            assert r["meta"]["grpc_status"] == 0  # the answer's trailer frame, kept as the append's fact
            assert r["meta"]["request_headers"]["authorization"].startswith("Bearer [redacted sha256:")
        # accepted appends leave no answer frames behind (live and imports alike): the run reads as on the wire
        assert [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "server"] == []
        assert TOKEN.encode() not in b"".join(r["raw"] or b"" for r in rows)
    follow_up = _frames(db, _session(db, mode_d.second.request_id)["session_id"])
    end = follow_up[-1]  # the gRPC-Web trailer frame, classified like an end-stream
    assert (end["direction"], end["kind"], end["flags"]) == ("server", "end_stream", FLAG_TRAILER)
    assert "interaction_update.turn_ended" in {r["kind"] for r in follow_up}


@pytest.mark.parametrize("source", SOURCES)
def test_the_envelope_sent_as_application_proto_is_append_rejected(mode_d: ModeD, source: str) -> None:
    db = mode_d.dbs[source]
    sid = _session(db, mode_d.refused.request_id)["session_id"]
    rows = _frames(db, sid)
    [rr] = [r for r in rows if r["kind"] == "run_request"]
    assert rr["meta"]["http_status"] == 415 and rr["meta"]["content_type"] == "application/proto"
    assert rr["raw"][0] == 0 and int.from_bytes(rr["raw"][1:5], "big") == len(rr["raw"]) - 5  # still enveloped
    findings = _diagnosis(db)[sid]
    assert findings[0]["code"] == "append_rejected" and findings[0]["severity"] == "error"
    f = findings[0]
    assert "carried run_request" in f["message"] and "415" in f["message"] and rr["seq"] in f["evidence"]
    assert "application/proto" in f["message"]


def test_a_mode_d_session_recorded_and_diagnosed(mode_d: ModeD, capsys: pytest.CaptureFixture[str]) -> None:
    """What a user sees (printed for the closing note): sessions, the follow-up's frames, its diagnosis."""
    db = str(mode_d.dbs["live"])
    sid = _session(mode_d.dbs["live"], mode_d.second.request_id)["session_id"]
    refused = _session(mode_d.dbs["live"], mode_d.refused.request_id)["session_id"]
    sessions = _cli("sessions", "--db", db)
    frames = _cli("frames", sid, "--db", db)
    diagnosis = _cli("diagnose", sid, "--db", db, "--no-write")
    rejected = _cli("diagnose", refused, "--db", db, "--no-write")
    with capsys.disabled():
        print("\n$ workbench sessions\n" + sessions)
        lines = frames.splitlines()
        print(f"$ workbench frames {sid}   (first 12 and last 4 of {len(lines)} lines)")
        print("\n".join(lines[:12] + ["…"] + lines[-4:]))
        print(f"\n$ workbench diagnose {sid}\n" + diagnosis)
        print(f"$ workbench diagnose {refused}\n" + rejected)
    assert sid in sessions and refused in sessions and "runsse" in sessions
    assert "→ run_request" in frames and "grpc-web trailer status 0" in frames
    assert "clean" in diagnosis and "append_rejected" in rejected and "run_request" in rejected
