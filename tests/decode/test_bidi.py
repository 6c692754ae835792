"""BidiService unwrapping (docs/protocol.md §3): BidiAppend hex/raw data, RunSSE request id, RunPoll
base64, and transport-level frames (gzip, grpc-web trailer, unary)."""

from __future__ import annotations

import base64

from decode_corpus import UUID, append_body, poll_body
from decode_pbbytes import ld, vi

from workbench.decode import fields_of, frame_to_json
from workbench.decode.classify import BIDI_APPEND, CLIENT_MSG, SERVER_MSG, default_decoder
from workbench.schema import pb
from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_END_STREAM, FLAG_TRAILER, encode

DEC = default_decoder()
KV_RESULT = pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
    id=4, get_blob_result=pb.GetBlobResult(blob_data=b'{"role":"user"}'))).SerializeToString()


def test_bidi_append_hex_field_1() -> None:
    body = append_body(KV_RESULT, seqno=3)
    assert body.startswith(b"\x0a" + bytes((len(KV_RESULT) * 2,)) + KV_RESULT.hex().encode())
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert f.kind == "kv_client_message.get_blob_result"
    assert (f.request_id, f.append_seqno, f.ref_id) == (UUID, 3, 4)
    assert f.payload == KV_RESULT
    assert f.raw == body
    assert f.msg_type == CLIENT_MSG
    assert f.flags == 0
    j = frame_to_json(DEC, f)
    assert j["fields"]["kv_client_message"]["get_blob_result"]["blob_data"] == '{"role":"user"}'
    assert j["raw_hex"] == body.hex()
    assert j["request_id"] == UUID


def test_bidi_append_seqno_0_and_heartbeat_text() -> None:
    body = ld(1, "3a00") + ld(2, ld(1, UUID))  # docs/protocol.md §3: client heartbeat as BidiAppend data is the text 3a00
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert (f.kind, f.append_seqno, f.request_id) == ("client_heartbeat", 0, UUID)


def test_bidi_append_raw_field_4() -> None:
    body = append_body(KV_RESULT, seqno=9, raw_field=True)
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert (f.kind, f.append_seqno, f.payload) == ("kv_client_message.get_blob_result", 9, KV_RESULT)
    assert DEC.unwrap_append(body) == f


def test_bidi_append_bad_hex_and_foreign_data() -> None:
    body = ld(1, "3a0") + ld(2, ld(1, UUID)) + vi(3, 2)
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert f.kind == "malformed"
    assert f.error
    assert "hex" in f.error
    assert (f.request_id, f.append_seqno, f.payload, f.msg_type) == (UUID, 2, body, BIDI_APPEND)
    # docs/protocol.md §3 (5): `0a 03 66 6f 6f` at IDE start-up is no AgentClientMessage
    body = ld(1, "0a03666f6f") + ld(2, ld(1, UUID))
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert f.kind == "malformed"
    assert "not an AgentClientMessage" in (f.error or "")
    assert f.payload == bytes.fromhex("0a03666f6f")
    assert f.raw == body
    [f] = DEC.decode_body(b"\xff\xff", "bidi_append", "client")
    assert f.kind == "malformed"
    assert f.payload == b"\xff\xff"


def test_bidi_append_response_is_empty() -> None:
    [f] = DEC.decode_body(b"", "bidi_append", "server")
    assert f.kind == "empty"


def test_runsse_request_id() -> None:
    body = encode(pb.BidiRequestId(request_id=UUID).SerializeToString())
    sd = DEC.stream("runsse", "client")
    frames = [f for i in range(len(body)) for f in sd.feed(body[i : i + 1])] + sd.close()
    assert [(f.kind, f.request_id) for f in frames] == [("bidi_request_id", UUID)]


def test_runpoll_response_unwraps_base64() -> None:
    inner = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="polled"))).SerializeToString()
    body = encode(poll_body(inner, seqno=5))
    [f] = DEC.decode_body(body, "runpoll", "server")
    assert (f.kind, f.summary, f.append_seqno) == ("interaction_update.text_delta", 'text "polled"', 5)
    assert f.payload == inner
    assert f.raw == poll_body(inner, seqno=5)
    assert f.msg_type == SERVER_MSG
    # unpadded and URL-safe base64 are accepted too
    unpadded = pb.BidiPollResponse(seqno=6, data=base64.urlsafe_b64encode(inner).decode().rstrip("="))
    [f] = DEC.decode_body(encode(unpadded.SerializeToString()), "runpoll", "server")
    assert (f.kind, f.append_seqno, f.payload) == ("interaction_update.text_delta", 6, inner)


def test_runpoll_eof_and_bad_data() -> None:
    heartbeat = bytes.fromhex("0a026a00")
    [f] = DEC.decode_body(encode(poll_body(heartbeat, 7, eof=True)), "runpoll", "server")
    assert f.kind == "interaction_update.heartbeat"
    assert f.summary.endswith("(eof)")
    [f] = DEC.decode_body(encode(poll_body(b"", 8, eof=True)), "runpoll", "server")
    assert (f.kind, f.append_seqno) == ("empty", 8)
    assert "eof" in f.summary
    bad = pb.BidiPollResponse(seqno=9, data="%%%").SerializeToString()
    [f] = DEC.decode_body(encode(bad), "runpoll", "server")
    assert f.kind == "malformed"
    assert f.payload == bad


def test_gzip_frames_decode_like_plain_ones() -> None:
    payload = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text="zipped " * 20))).SerializeToString()
    plain = DEC.decode_body(encode(payload), "run", "server")[0]
    [f] = DEC.decode_body(encode(payload, compress=True), "run", "server")
    assert f.flags == FLAG_COMPRESSED
    assert (f.kind, f.summary, f.payload) == (plain.kind, plain.summary, plain.payload)
    # a compressed end-stream (flag 0x03)
    import gzip

    z = gzip.compress(b'{"error":{"code":"unavailable","message":"down"}}')
    [f] = DEC.decode_body(bytes((FLAG_END_STREAM | FLAG_COMPRESSED,)) + len(z).to_bytes(4, "big") + z, "run", "server")
    assert (f.kind, f.summary) == ("end_stream.error", 'unavailable "down"')
    # broken gzip keeps the bytes and says why
    [f] = DEC.decode_body(bytes((FLAG_COMPRESSED,)) + (3).to_bytes(4, "big") + b"abc", "run", "server")
    assert f.kind == "malformed"
    assert f.error
    assert f.error.startswith("gzip")
    assert f.payload == b"abc"


def test_grpc_web_trailer_frames() -> None:
    [f] = DEC.decode_body(encode(b"grpc-status: 8\r\ngrpc-message: usage%20limit\r\n", FLAG_TRAILER), "run", "server")
    assert (f.kind, f.summary, f.flags) == ("end_stream.error", "grpc-web trailer status 8 usage limit", 0x80)
    assert fields_of(DEC, f.kind, f.payload, f.msg_type, f.flags) == {"grpc-status": "8", "grpc-message": "usage limit"}
    [f] = DEC.decode_body(encode(b"grpc-status: 0\r\n", FLAG_TRAILER), "run", "server")
    assert f.kind == "end_stream"


def test_framing_errors_become_malformed_frames() -> None:
    ok = encode(bytes.fromhex("0a026a00"))
    frames = DEC.decode_body(ok + b"\x00\x7f\xff\xff\xff" + b"rest", "run", "server")
    assert [f.kind for f in frames] == ["interaction_update.heartbeat", "malformed"]
    assert "cap" in (frames[1].error or "")
    assert frames[1].payload == b"\x00\x7f\xff\xff\xff" + b"rest"
    frames = DEC.decode_body(ok + ok[:-1], "run", "server")
    assert [f.kind for f in frames] == ["interaction_update.heartbeat", "malformed"]
    assert frames[1].error
    assert frames[1].error.startswith("truncated frame")
    frames = DEC.decode_body(encode(b"{}", FLAG_END_STREAM) + ok, "run", "server")
    assert [f.kind for f in frames] == ["end_stream", "malformed"]
    assert frames[1].error == "bytes after end-stream"
    assert frames[1].payload == ok


def test_unary_bare_and_enveloped() -> None:
    body = pb.GetServerConfigResponse(http2_config=3).SerializeToString()
    [bare] = DEC.decode_body(body, "unary", "server", msg_type="aiserver.v1.GetServerConfigResponse")
    [env] = DEC.decode_body(encode(body), "unary", "server", msg_type="aiserver.v1.GetServerConfigResponse")
    for f in (bare, env):
        assert (f.kind, f.payload, f.msg_type, f.flags) == ("unary", body, "aiserver.v1.GetServerConfigResponse", 0)
        assert fields_of(DEC, f.kind, f.payload, f.msg_type) == {"http2_config": 3}
    [f] = DEC.decode_body(b"", "unary", "server")
    assert f.kind == "empty"
    [f] = DEC.decode_body(body, "unary", "client")
    assert f.kind == "unary"
    assert fields_of(DEC, f.kind, f.payload, f.msg_type) == {"7": 3}
