"""gRPC-Web BidiAppends (mode D) keep their evidence in the recording (issue 17, item 4).

The envelope of an enveloped append body stays in ``raw`` with its flags; each append carries the
facts of its HTTP exchange in ``frames.meta`` (``http_status``, redacted ``request_headers``,
``content_type``, gRPC status); gRPC-Web trailer frames are classified like end-stream frames.
"""

from __future__ import annotations

import binascii
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from capture_rig import NODE_CLIENT, Sim
from hypothesis import given, settings
from hypothesis import strategies as st
from support import env_without_proxy, wait_until

from workbench.capture.writer import (
    Body,
    CaptureWriter,
    Chunk,
    Done,
    Eof,
    FlowOpen,
    Open,
    Response,
    WriterConfig,
)
from workbench.decode.classify import default_decoder
from workbench.redact import redact_frame, redact_headers, short_hash
from workbench.schema import pb
from workbench.store import open_reader
from workbench.wire.envelope import FLAG_TRAILER, encode, looks_enveloped, split_unary

DEC = default_decoder()
TOKEN = "wb-grpcweb-token-51c0"
KEY = "sk-MODEL-KEY-in-run-request"
GRPC_WEB = "application/grpc-web+proto"


def _append(seqno: int, inner: bytes, rid: str = "gw-rid") -> bytes:
    return pb.BidiAppendRequest(data=binascii.hexlify(inner).decode(), request_id=pb.BidiRequestId(request_id=rid),
                                append_seqno=seqno).SerializeToString()


def _run_request() -> bytes:
    return pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        requested_model=pb.RequestedModel(model_id="m", api_key_credentials=pb.ApiKeyCredentials(api_key=KEY)),
    )).SerializeToString()


# decoder and redaction -------------------------------------------------------------------------

@pytest.mark.parametrize("compress", [False, True])
def test_an_enveloped_append_keeps_its_envelope(compress: bool) -> None:
    body = encode(_append(0, _run_request()), compress=compress)
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert f.kind == "run_request"
    assert f.payload == _run_request()
    assert f.raw == body
    assert f.flags == (1 if compress else 0)
    assert f.request_id == "gw-rid"
    assert f.append_seqno == 0
    # a bare (Connect) append is unchanged: raw is the BidiAppendRequest itself
    [bare] = DEC.decode_body(_append(0, _run_request()), "bidi_append", "client")
    assert bare.raw == _append(0, _run_request())
    assert bare.flags == 0


@pytest.mark.parametrize("compress", [False, True])
def test_redaction_rebuilds_the_envelope_around_the_redacted_append(compress: bool) -> None:
    body = encode(_append(3, _run_request()), compress=compress)
    [f] = DEC.decode_body(body, "bidi_append", "client")
    f = redact_frame(f)
    assert f.raw is not None
    assert KEY.encode() not in f.raw
    [env] = split_unary(f.raw)
    assert env.enveloped
    assert env.flags == (1 if compress else 0)
    inner = pb.BidiAppendRequest.FromString(env.payload)
    assert inner.append_seqno == 3
    assert bytes.fromhex(inner.data) == f.payload
    assert KEY.encode() not in f.payload


def test_grpc_web_answers_are_recognised_as_envelopes() -> None:
    ok = encode(b"") + encode(b"grpc-status: 0\r\n", FLAG_TRAILER)
    assert looks_enveloped(ok)
    assert looks_enveloped(encode(b"grpc-status: 3\r\ngrpc-message: bad\r\n", FLAG_TRAILER))  # trailers only
    # lengths that add up behind a 0x80 are not enough: a trailer frame holds header text
    assert not looks_enveloped(bytes([0x80, 0, 0, 0, 2, 0x08, 0x01]))
    kinds = [(f.kind, f.flags) for f in DEC.decode_body(ok, "bidi_append", "server")]
    assert kinds == [("empty", 0), ("end_stream", FLAG_TRAILER)]
    [err] = [f for f in DEC.decode_body(encode(b"") + encode(b"grpc-status: 3\r\ngrpc-message: bad%20seqno\r\n",
                                                           FLAG_TRAILER), "bidi_append", "server")
             if f.kind != "empty"]
    assert (err.kind, err.summary) == ("end_stream.error", "grpc-web trailer status 3 bad seqno")


# the writer: one append exchange at a time ------------------------------------------------------

def _exchange(w: CaptureWriter, key: str, body: bytes, status: int, answer: bytes,
              ctype: str = GRPC_WEB, trailers: dict[str, str] | None = None) -> None:
    now = time.time_ns() // 1000
    headers = redact_headers([("content-type", ctype), ("authorization", f"Bearer {TOKEN}"),
                              ("x-request-id", "gw-rid")])
    w.queue.put(Open(FlowOpen(key=key, transport="bidi_append", streaming=False, host="h",
                                   path="/aiserver.v1.BidiService/BidiAppend", ts_us=now, request_id="gw-rid",
                                   meta={"request_headers": headers}, content_type=ctype)))
    w.queue.put(Body(key, "client", now, body))
    w.queue.put(Response(key, now + 1, status, [("content-type", ctype)], "HTTP/1.1", None))
    w.queue.put(Body(key, "server", now + 2, answer))
    w.queue.put(Done(key, now + 3, None, trailers or {}))


def test_each_append_carries_its_exchange_and_refusals_follow_it(tmp_path: Path) -> None:
    w = CaptureWriter(WriterConfig(db_path=str(tmp_path / "gw.duckdb"), flush_interval=0.05, live=False))
    w.start()
    hb = pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString()
    ok = encode(b"") + encode(b"grpc-status: 0\r\n", FLAG_TRAILER)
    _exchange(w, "a0", encode(_append(0, _run_request())), 200, ok)
    _exchange(w, "a1", encode(_append(1, hb)), 200,
              encode(b"") + encode(b"grpc-status: 9\r\ngrpc-message: seqno%20gap\r\n", FLAG_TRAILER))
    _exchange(w, "a2", encode(_append(2, hb)), 415, b"", ctype="application/proto")
    w.stop()
    r = open_reader(tmp_path / "gw.duckdb")
    rows = r.query("SELECT seq, direction, kind, flags, raw, meta, append_seqno, summary FROM frames "
                   "WHERE session_id = 'gw-rid' ORDER BY seq").to_pylist()
    r.close()
    assert [(x["direction"], x["kind"], x["append_seqno"]) for x in rows] == [
        ("client", "run_request", 0), ("client", "client_heartbeat", 1), ("server", "end_stream.error", 1),
        ("client", "client_heartbeat", 2), ("server", "http_error", 2)]
    metas = [json.loads(x["meta"]) if x["meta"] else None for x in rows]
    assert metas[0] == {"http_status": 200, "content_type": GRPC_WEB, "grpc_status": 0, "request_headers": {
        "content-type": GRPC_WEB, "authorization": f"Bearer [redacted sha256:{short_hash(TOKEN)}]",
        "x-request-id": "gw-rid"}}
    assert metas[1]["grpc_status"] == 9
    assert metas[1]["grpc_message"] == "seqno gap"
    assert rows[2]["summary"] == "grpc-web trailer status 9 seqno gap"
    assert rows[2]["flags"] == FLAG_TRAILER
    assert metas[3]["http_status"] == 415
    assert metas[3]["content_type"] == "application/proto"
    raw = rows[0]["raw"]
    assert raw[0] == 0
    assert int.from_bytes(raw[1:5], "big") == len(raw) - 5  # the 5-byte gRPC-Web envelope
    [env] = split_unary(rows[0]["raw"])
    assert env.enveloped
    assert pb.BidiAppendRequest.FromString(env.payload).request_id.request_id == "gw-rid"
    assert KEY.encode() not in rows[0]["raw"]


def test_an_append_keeps_its_place_and_gets_its_answer_later(tmp_path: Path) -> None:
    """Recorded where it arrived, even when its answer comes after a commit and after server frames."""
    w = CaptureWriter(WriterConfig(db_path=str(tmp_path / "late.duckdb"), flush_interval=0.05, live=False))
    w.start()
    now = time.time_ns() // 1000
    q = w.queue.put
    rid_env = encode(pb.BidiRequestId(request_id="gw-rid").SerializeToString())
    q(Open(FlowOpen(key="sse", transport="runsse", streaming=True, host="h",
                         path="/agent.v1.AgentService/RunSSE", ts_us=now, request_id="gw-rid")))
    q(Chunk("sse", "client", now, rid_env))
    q(Eof("sse", "client", now))
    q(Open(FlowOpen(key="a0", transport="bidi_append", streaming=False, host="h",
                         path="/aiserver.v1.BidiService/BidiAppend", ts_us=now + 1, request_id="gw-rid",
                         meta={"request_headers": [("content-type", GRPC_WEB)]}, content_type=GRPC_WEB)))
    q(Body("a0", "client", now + 1, encode(_append(0, _run_request()))))
    wait_until(lambda: w.frames_committed >= 2, timeout=30, interval=0.01,
               what="the append to be committed")  # the append is committed ...
    assert w.frames_committed == 2
    text = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text="t")))
    q(Response("sse", now + 2, 200, [], "HTTP/1.1", None))
    q(Chunk("sse", "server", now + 3, encode(text.SerializeToString())))  # ... a server frame passes ...
    q(Response("a0", now + 4, 200, [], "HTTP/1.1", None))  # ... and then its answer comes
    q(Body("a0", "server", now + 4, encode(b"") + encode(b"grpc-status: 0\r\n", FLAG_TRAILER)))
    q(Done("a0", now + 5, None, {}))
    w.stop()
    r = open_reader(tmp_path / "late.duckdb")
    rows = r.query("SELECT seq, kind, meta FROM frames WHERE session_id = 'gw-rid' ORDER BY seq").to_pylist()
    r.close()
    assert [x["kind"] for x in rows] == ["bidi_request_id", "run_request", "interaction_update.text_delta"]
    meta = json.loads(rows[1]["meta"])
    assert meta["http_status"] == 200
    assert meta["grpc_status"] == 0
    assert meta["content_type"] == GRPC_WEB


# through real mitmdump + sim with the Node client in gRPC-Web mode ------------------------------

@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="node (v20+) is not installed")
@pytest.mark.parametrize("append_ctype", [None, "application/proto"])
def test_node_grpc_web_appends_are_recorded_with_their_envelope(capture_sim: Sim, capture_mitm: Any, tmp_path: Path,
                                                               append_ctype: str | None) -> None:
    m = capture_mitm()
    log = tmp_path / "gw.ndjson"
    cmd = [str(shutil.which("node")), str(NODE_CLIENT), "--base-url", capture_sim.url, "--ca", str(m.ca),
           "--proxy", m.proxy, "--transport", "runsse", "--framing", "grpc-web", "--token", TOKEN,
           "--prompt", "[scenario:text] grpc-web", "--log", str(log), "--timeout-ms", "30000"]
    if append_ctype:
        cmd += ["--append-content-type", append_ctype]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env_without_proxy())
    summary = json.loads(proc.stdout.splitlines()[-1])
    assert m.stop() == 0
    r = open_reader(m.db)
    rows = r.query("SELECT direction, transport, kind, flags, raw, meta, append_seqno FROM frames "
                   "WHERE session_id = ? ORDER BY seq", [summary["request_id"]]).to_pylist()
    r.close()
    sent = [json.loads(x) for x in log.read_text().splitlines() if '"bidi_append"' in x]
    appends = [x for x in rows if x["transport"] == "bidi_append" and x["direction"] == "client"]
    assert sent
    assert [x["raw"].hex() for x in appends] == [e["wire_hex"] for e in sent]  # envelope kept, as sent
    for x in appends:
        meta = json.loads(x["meta"])
        assert meta["content_type"] == (append_ctype or GRPC_WEB)
        assert meta["request_headers"]["authorization"] == f"Bearer [redacted sha256:{short_hash(TOKEN)}]"
        assert meta["http_status"] in (200, 415)
    first = json.loads(appends[0]["meta"])
    if append_ctype == "application/proto" or first["http_status"] == 415:
        # An envelope sent as Connect unary: refused, and the recording shows which append and why.
        assert first["http_status"] == 415
        assert summary["error"]
        assert "415" in summary["error"]
        refusal = [x for x in rows if x["direction"] == "server" and x["transport"] == "bidi_append"]
        assert refusal
        assert refusal[0]["kind"] == "http_error"
        assert refusal[0]["append_seqno"] == 0
    else:  # a simulator that speaks gRPC-Web: the turn completes and appends carry grpc-status 0
        assert summary["error"] is None
        assert summary["turn_ended"]
        assert all(json.loads(x["meta"]).get("grpc_status") in (None, 0) for x in appends)
    assert TOKEN.encode() not in b"".join(p.read_bytes() for p in m.db.parent.glob(m.db.name + "*"))


# properties ------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200), seqno=st.integers(min_value=0, max_value=2**40), compress=st.booleans(),
       bare=st.booleans())
def test_append_framing_round_trips(text: str, seqno: int, compress: bool, bare: bool) -> None:
    inner = pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text=text))),
        requested_model=pb.RequestedModel(model_id="m", api_key_credentials=pb.ApiKeyCredentials(api_key=KEY)),
    )).SerializeToString()
    req = _append(seqno, inner)
    body = req if bare else encode(req, compress=compress)
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert f.payload == inner
    assert f.append_seqno == seqno
    assert f.raw == body
    assert f.flags == (0 if bare else int(compress))
    stored = redact_frame(f)
    assert stored.raw is not None
    assert KEY.encode() not in stored.raw
    [again] = DEC.decode_body(stored.raw, "bidi_append", "client")  # the stored wrapper still decodes
    assert again.payload == stored.payload
    assert again.flags == f.flags
    assert again.append_seqno == seqno
