"""BidiAppend exchange facts (``workbench.protocol.append_meta``): one shape for capture and imports."""

from __future__ import annotations

from workbench.decode.classify import default_decoder
from workbench.protocol.append_meta import answer_grpc, append_exchange_meta, grpc_status_number, headers_dict
from workbench.wire.endstream import grpc_web_trailer_payload
from workbench.wire.envelope import FLAG_TRAILER, encode


def test_headers_are_lower_cased_and_repeats_joined() -> None:
    assert headers_dict([("Content-Type", "application/proto"), ("X-A", "1"), ("x-a", "2")]) == {
        "content-type": "application/proto", "x-a": "1, 2"}
    assert headers_dict(None) == {}


def test_grpc_status_from_headers_trailers_and_the_trailer_frame() -> None:
    body = encode(b"") + encode(grpc_web_trailer_payload([("grpc-status", "9"), ("grpc-message", "seqno gap")]),
                                FLAG_TRAILER)
    answer = default_decoder().decode_body(body, "bidi_append", "server")
    assert answer_grpc([("grpc-status", "0")], None, answer) == {"grpc-status": "9", "grpc-message": "seqno gap"}
    assert answer_grpc([("grpc-status", "0")], {"grpc-status": "14"}) == {"grpc-status": "14"}
    assert answer_grpc(None, None) == {}


def test_the_meta_keys() -> None:
    assert append_exchange_meta(None, [("X-Request-Id", "r")], "application/proto") == {
        "http_status": None, "request_headers": {"x-request-id": "r"}, "content_type": "application/proto"}
    meta = append_exchange_meta(200, [], "application/grpc-web+proto", grpc={"grpc-status": "9", "grpc-message": "m"},
                                error="client gone")
    assert meta == {"http_status": 200, "request_headers": {}, "content_type": "application/grpc-web+proto",
                    "grpc_status": 9, "grpc_message": "m", "error": "client gone"}
    assert "grpc_status" not in append_exchange_meta(200, [], None, grpc={"grpc-status": "x"})
    assert grpc_status_number("8") == 8
    assert grpc_status_number(None) is None
