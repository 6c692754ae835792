"""Imported frames pass the same write gate as live ones (issue 20, findings 1, 2 and 10).

A flow file as mitmproxy writes it (``io.FlowWriter``), holding a bidi Run whose request is a
gzip'd ``run_request`` with the user's model API key, larger than the per-frame inflate budget
given to the import, so it is kept as kind ``compressed``. The key must be nowhere: not in the
database (payloads inflated), not in ``frames --json``, the Parquet export or a fixture. The
files written are private (0600).
"""

from __future__ import annotations

import json
import os
import stat
import zlib
from io import BytesIO
from pathlib import Path

import pytest
from mitmproxy import io
from mitmproxy.http import Headers
from mitmproxy.test import tflow
from support import run_workbench

from workbench.schema import pb
from workbench.store import open_reader
from workbench.store.gate import wire_bytes
from workbench.wire.envelope import encode

pytestmark = pytest.mark.slow  # runs workbench subprocesses

CANARY = "sk-canary-IMPORT-9b2f44"


def _run_flow(body: bytes, *, client_version: bytes = b"cli-1", grpc_message: bytes | None = None) -> bytes:
    f = tflow.tflow(resp=True)
    f.request.host = "api2.cursor.sh"
    f.request.port = 443
    f.request.scheme = "https"
    f.request.method = "POST"
    f.request.path = "/agent.v1.AgentService/Run"
    f.request.http_version = "HTTP/2.0"
    f.request.headers = Headers([(b"content-type", b"application/connect+proto"),
                                 (b"authorization", b"Bearer tok-IMPORT-SECRET"),
                                 (b"x-request-id", b"rid-import-gate"), (b"x-cursor-client-version", client_version)])
    f.request.raw_content = body
    f.response.http_version = "HTTP/2.0"
    f.response.status_code = 200
    f.response.headers = Headers([(b"content-type", b"application/connect+proto")])
    text = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="hi"))).SerializeToString()
    f.response.raw_content = encode(text) + encode(b"{}", 0x02)
    if grpc_message is not None:
        f.response.trailers = Headers([(b"grpc-status", b"14"), (b"grpc-message", grpc_message)])
    buf = BytesIO()
    io.FlowWriter(buf).add(f)
    return buf.getvalue()


def _run_request() -> bytes:
    return pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_id="conv-import-gate",
        requested_model=pb.RequestedModel(model_id="m", api_key_credentials=pb.ApiKeyCredentials(api_key=CANARY)),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="refactor " * 4000))),
    )).SerializeToString()


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_model_key_in_a_compressed_run_request_is_stored_nowhere(tmp_path: Path) -> None:
    flows = tmp_path / "key.flows"
    flows.write_bytes(_run_flow(encode(_run_request(), compress=True)))
    db = tmp_path / "key.duckdb"
    res = run_workbench("import", str(flows), "--db", str(db), "--inflate-frame-mb", "0.01", timeout=300)
    assert res.returncode == 0, res.stderr

    r = open_reader(db)
    try:
        rows = r.query("SELECT session_id, kind, payload, raw FROM frames").to_pylist()
        [sid] = [s["session_id"] for s in r.query("SELECT session_id FROM sessions").to_pylist()]
    finally:
        r.close()
    assert "compressed" in {x["kind"] for x in rows}  # the frame went past the budget, as intended
    for x in rows:
        for blob in (x["payload"], x["raw"]):
            if blob:
                assert CANARY.encode() not in blob
                if blob[:2] == b"\x1f\x8b":
                    assert CANARY.encode() not in zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(blob)

    shown = run_workbench("frames", sid, "--db", str(db), "--json", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "run_request" in shown.stdout and CANARY not in shown.stdout

    out = tmp_path / "parquet"
    exp = run_workbench("export", "--db", str(db), "--parquet", str(out), timeout=300)
    assert exp.returncode == 0, exp.stderr
    parquet = [p for p in out.rglob("*") if p.is_file()]
    assert parquet
    fixture = tmp_path / "key.fixture.json"
    fx = run_workbench("export-fixture", sid, "--db", str(db), "-o", str(fixture), timeout=300)
    assert fx.returncode == 0, fx.stderr
    for p in [db, *parquet, fixture]:
        data = p.read_bytes()
        assert CANARY.encode() not in data, p
        assert b"tok-IMPORT-SECRET" not in data, p
        assert _mode(p) == 0o600, p  # private to the user (finding 10)
    # what a fixture holds compressed, inflated
    doc = json.loads(fixture.read_text())
    assert CANARY not in json.dumps(doc)


def test_header_bytes_that_are_not_utf8_are_imported_and_kept(tmp_path: Path) -> None:
    flows = tmp_path / "bytes.flows"
    flows.write_bytes(_run_flow(encode(b"\x3a\x00"), client_version=b"1.0\xff", grpc_message=b"caf\xe9 down"))
    db = tmp_path / "bytes.duckdb"
    res = run_workbench("import", str(flows), "--db", str(db), timeout=300)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    r = open_reader(db)
    try:
        [s] = r.query("SELECT client_version, meta FROM sessions").to_pylist()
    finally:
        r.close()
    assert wire_bytes(s["client_version"]) == b"1.0\xff"
    assert wire_bytes(json.loads(s["meta"])["trailers"]["grpc-message"]) == b"caf\xe9 down"
