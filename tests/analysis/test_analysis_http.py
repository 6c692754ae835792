"""Refused BidiAppends, failed unary calls and gRPC-Web / HTTP errors on streams, as capture and
imports record them (frames.meta of the append, http_error frames, 0x80 trailer frames)."""

from __future__ import annotations

import base64
import json

from analysis_helpers import SessionBuilder

from workbench.analysis import analyze_session
from workbench.schema import pb
from workbench.store.db import Store
from workbench.wire.varint import encode_varint

HEADERS = {"content-type": "application/proto", "authorization": "Bearer <redacted:1a2b3c>"}


def _envelope(payload: bytes, flags: int = 0) -> bytes:
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


def _run_request() -> pb.AgentRunRequest:
    return pb.AgentRunRequest(conversation_state=pb.ConversationStateStructure(), conversation_id="c",
                              action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                                  user_message=pb.UserMessage(text="hi"))))


def _bidi_body(msg: pb.AgentClientMessage, seqno: int) -> bytes:
    return pb.BidiAppendRequest(data=msg.SerializeToString().hex(), request_id=pb.BidiRequestId(request_id="req-1"),
                                append_seqno=seqno).SerializeToString()


def test_run_request_append_refused_415_is_the_root_cause(analysis_store: Store) -> None:
    """Issue 17's proxy: an enveloped BidiAppend sent as application/proto; the service answers 415."""
    b = SessionBuilder(analysis_store, transport="runsse", status="incomplete")
    msg = pb.AgentClientMessage(run_request=_run_request())
    rr = b.append(0, meta={"http_status": 415, "content_type": "application/proto", "request_headers": HEADERS},
                  raw=_envelope(_bidi_body(msg, 0)), run_request=_run_request())
    hb = b.append(1, meta={"http_status": 415, "content_type": "application/proto", "request_headers": HEADERS},
                  client_heartbeat=pb.ClientHeartbeat())
    for _ in range(6):
        b.heartbeat()
    res = analyze_session(analysis_store, b.done())
    codes = [f.code for f in res.findings]
    assert codes[0] == "append_rejected", codes
    f = res.findings[0]
    assert f.severity == "error"
    assert f.evidence == (rr, hb)
    assert "HTTP 415" in f.message
    assert "carried run_request" in f.message
    assert "client_heartbeat" in f.message
    assert "enveloped body" in f.message
    assert "application/proto" in f.message
    assert all(g.cause is not None for g in res.findings[1:])  # everything else follows from it
    assert "stream_ended_without_turn_end" in codes


def test_refusal_known_only_from_the_http_error_frame(analysis_store: Store) -> None:
    """Recordings that keep no status on the append itself: the http_error answer names it."""
    b = SessionBuilder(analysis_store, transport="runsse", status="incomplete")
    rr = b.append(0, run_request=_run_request())
    err = b.http_error(464, b"", seqno=0)
    res = analyze_session(analysis_store, b.done())
    f = next(f for f in res.findings if f.code == "append_rejected")
    assert f.evidence == (rr, err)
    assert "HTTP 464" in f.message
    assert "HTTP/1.1" in f.message


def test_connect_streaming_content_type_on_a_unary_append(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse", status="incomplete")
    b.append(0, meta={"http_status": 415, "content_type": "application/connect+proto"}, run_request=_run_request())
    f = next(f for f in analyze_session(analysis_store, b.done()).findings if f.code == "append_rejected")
    assert "connect+proto" in f.message
    assert "unary" in f.message


def test_refused_exec_result_leaves_the_exec_unanswered(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse", status="incomplete")
    b.append(0, meta={"http_status": 200}, run_request=_run_request())
    e = b.server(exec_server_message=pb.ExecServerMessage(id=1, exec_id="e1", read_args=pb.ReadArgs(path="a")))
    res_seq = b.append(1, meta={"http_status": 401}, exec_client_message=pb.ExecClientMessage(
        id=1, exec_id="e1", read_result=pb.ReadResult(success=pb.ReadSuccess(path="a", content="x"))))
    for _ in range(6):
        b.heartbeat()
    res = analyze_session(analysis_store, b.done())
    assert [f.code for f in res.findings][:2] == ["append_rejected", "unanswered_exec"]
    rej, unanswered = res.findings[:2]
    assert "authentication" in rej.message
    assert rej.evidence == (res_seq,)
    assert unanswered.first_seq == e
    assert f"seq {res_seq} was refused" in unanswered.message
    assert unanswered.cause == "append_rejected"


def test_accepted_grpc_web_appends_and_a_clean_trailer_are_healthy(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, transport="runsse")
    meta = {"http_status": 200, "content_type": "application/grpc-web+proto"}
    b.append(0, meta=meta, raw=_envelope(_bidi_body(pb.AgentClientMessage(run_request=_run_request()), 0)),
             run_request=_run_request())
    b.text("hello")
    b.checkpoint()
    b.turn_ended()
    end = b.grpc_web_trailer(0)
    res = analyze_session(analysis_store, b.done())
    assert res.problems == []
    assert res.frame_count == end + 1


def _status_details(code: int, message: str, details: pb.ErrorDetails) -> str:
    """google.rpc.Status{1 code, 2 message, 3 Any{1 type_url, 2 value}} in base64, as grpc-status-details-bin."""
    def ld(num: int, data: bytes) -> bytes:
        return encode_varint(num << 3 | 2) + encode_varint(len(data)) + data

    any_ = ld(1, b"type.googleapis.com/aiserver.v1.ErrorDetails") + ld(2, details.SerializeToString())
    status = encode_varint(1 << 3) + encode_varint(code) + ld(2, message.encode()) + ld(3, any_)
    return base64.b64encode(status).decode().rstrip("=")


def test_grpc_web_trailer_error_is_a_server_error(analysis_store: Store) -> None:
    details = pb.ErrorDetails(error=51, details=pb.CustomErrorDetails(title="You've hit your usage limit",
                                                                       detail="Switch model", is_retryable=False))
    b = SessionBuilder(analysis_store, transport="runsse", status="error")
    b.append(0, run_request=_run_request())
    b.text("Let me")
    end = b.grpc_web_trailer(8, "Error", f"grpc-status-details-bin: {_status_details(8, 'Error', details)}\r\n")
    res = analyze_session(analysis_store, b.done())
    assert [f.code for f in res.findings] == ["server_error"]
    f = res.findings[0]
    assert f.evidence == (end,)
    assert "gRPC-Web trailer" in f.message
    assert "resource_exhausted" in f.message
    assert "ERROR_RATE_LIMITED_CHANGEABLE" in f.message
    assert "usage limit" in f.message
    assert "rate limit" in f.suggested_fix


def test_http_error_on_the_run_itself(analysis_store: Store) -> None:
    b = SessionBuilder(analysis_store, status="error", http_status=464)
    b.run_request()
    err = b.http_error(464, b"", transport="run")
    res = analyze_session(analysis_store, b.done())
    assert [f.code for f in res.findings] == ["server_error"]
    assert res.findings[0].evidence == (err,)
    assert "HTTP/1.1" in res.findings[0].message


def _unary(store: Store, sid: str, status: int, meta: dict | None = None, error: str | None = None) -> SessionBuilder:
    """A unary GetUsableModels call as capture records it: the request, then the answer's frames."""
    b = SessionBuilder(store, sid, transport="unary", path="/aiserver.v1.AiService/GetUsableModels",
                       http_status=status, status="error" if status >= 400 or error else "complete", meta=meta,
                       error=error)
    b._write(b.dec.decode_body(b"\x0a\x00", "unary", "client")[0], "client", "unary", 10)
    return b


def test_unary_calls(analysis_store: Store) -> None:
    ok = _unary(analysis_store, "ok", 200)
    ok._write(ok.dec.decode_body(b"\x0a\x05\x0a\x03gpt", "unary", "server")[0], "server", "unary", 10)
    assert analyze_session(analysis_store, ok.done()).problems == []

    bad = _unary(analysis_store, "501", 501)
    body = json.dumps({"code": "unimplemented", "message": "no such method"}).encode()
    err = bad.http_error(501, body, transport="unary")
    [f] = analyze_session(analysis_store, bad.done()).findings
    assert f.code == "unary_error"
    assert f.severity == "error"
    assert err in f.evidence
    assert "GetUsableModels" in f.message
    assert "HTTP 501 unimplemented" in f.message
    assert "does not implement" in f.message

    grpc = _unary(analysis_store, "grpc", 200, meta={"trailers": {"grpc-status": "16", "grpc-message": "not logged in"}},
                  error="grpc-status 16 not logged in")
    [f] = analyze_session(analysis_store, grpc.done()).findings
    assert f.code == "unary_error"
    assert "unauthenticated" in f.message
    assert "log in" in f.suggested_fix

    web = _unary(analysis_store, "grpc-web", 200)
    end = web.grpc_web_trailer(5, "model not found")
    [f] = analyze_session(analysis_store, web.done()).findings
    assert f.code == "unary_error"
    assert f.evidence[-1] == end
    assert "not_found" in f.message


def test_grpc_web_append_refused_inside_a_200_answer(analysis_store: Store) -> None:
    """gRPC-Web answers a refused append with HTTP 200 and an error trailer: capture keeps the
    grpc-status in the append's meta and the trailer as the append's answer frame."""
    b = SessionBuilder(analysis_store, transport="runsse", status="incomplete")
    meta = {"http_status": 200, "content_type": "application/grpc-web+proto", "grpc_status": 3,
            "grpc_message": "bad append"}
    rr = b.append(0, meta=meta, run_request=_run_request())
    body = b"grpc-status: 3\r\ngrpc-message: bad append\r\n"
    f = b.dec.decode_body(b"\x80" + len(body).to_bytes(4, "big") + body, "runsse", "server")[0]
    f.request_id, f.append_seqno = "req-1", 0
    answer = b._write(f, "server", "bidi_append", 10)
    for _ in range(6):
        b.heartbeat()
    b.client_heartbeat(dt_ms=20_000)
    res = analyze_session(analysis_store, b.done())
    codes = [x.code for x in res.findings]
    assert codes[0] == "append_rejected"
    assert "end_stream_not_delivered" not in codes
    assert "server_error" not in codes
    rej = res.findings[0]
    assert {rr, answer} <= set(rej.evidence)
    assert "HTTP 200 with invalid_argument" in rej.message
    assert "carried run_request" in rej.message


def test_heartbeats_refused_after_the_end_harm_nobody(analysis_store: Store) -> None:
    """A heartbeat in flight as the run ends reaches a server that has let the stream go (404):
    nothing the run needed was lost, so no finding; a real message refused alike still is one."""
    b = SessionBuilder(analysis_store, transport="runsse")
    b.append(0, meta={"http_status": 200}, run_request=_run_request())
    b.text("hello")
    b.checkpoint()
    b.turn_ended()
    b.end_stream()
    b.append(1, meta={"http_status": 404}, client_heartbeat=pb.ClientHeartbeat())
    b.http_error(404, b'{"code": "not_found", "message": "no live run"}', seqno=1)
    assert analyze_session(analysis_store, b.done()).problems == []

    b = SessionBuilder(analysis_store, "late-result", transport="runsse")
    b.append(0, meta={"http_status": 200}, run_request=_run_request())
    b.text("hello")
    b.turn_ended()
    b.end_stream()
    hb = b.append(1, meta={"http_status": 404}, client_heartbeat=pb.ClientHeartbeat())
    late = b.append(2, meta={"http_status": 404}, conversation_action=pb.ConversationAction(
        user_message_action=pb.UserMessageAction(user_message=pb.UserMessage(text="and now?"))))
    f = next(f for f in analyze_session(analysis_store, b.done()).findings if f.code == "append_rejected")
    assert f.evidence[:2] == (hb, late) and "conversation_action" in f.message
