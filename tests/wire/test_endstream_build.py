"""Building end-of-stream messages next to parsing them: what a server writes, a client reads back."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from workbench.wire.endstream import (
    GRPC_STATUS,
    end_from_grpc,
    end_stream_payload,
    grpc_trailers,
    grpc_web_trailer_payload,
    parse_end_stream,
    parse_grpc_web_trailer,
)

codes = st.sampled_from(sorted(GRPC_STATUS))
messages = st.text(max_size=80)


def test_clean_end_is_an_empty_object() -> None:
    assert end_stream_payload() == b"{}"
    assert end_stream_payload({}) == b"{}"
    assert not parse_end_stream(end_stream_payload(None)).is_error


@given(codes, messages)
def test_error_object_round_trips(code: str, message: str) -> None:
    es = parse_end_stream(end_stream_payload({"code": code, "message": message}))
    assert es.code == code
    assert json.loads(end_stream_payload({"code": code, "message": message}))["error"]["message"] == message


@given(codes, st.dictionaries(st.text(min_size=1, max_size=10), st.text(max_size=10), max_size=3))
def test_whole_document_is_kept(code: str, metadata: dict[str, str]) -> None:
    doc = {"error": {"code": code, "message": "m"}, "metadata": metadata}
    es = parse_end_stream(end_stream_payload(doc))
    assert es.code == code
    assert es.metadata == metadata


@given(codes, messages)
def test_grpc_web_trailer_round_trips(code: str, message: str) -> None:
    payload = grpc_web_trailer_payload(grpc_trailers(code, message))
    es = end_from_grpc(parse_grpc_web_trailer(payload))
    assert es.code == code
    # Everything outside printable ASCII is percent-encoded and survives; HTTP field values lose
    # their surrounding spaces (the only whitespace sent as is).
    assert (es.message or "") == message.strip(" ")
