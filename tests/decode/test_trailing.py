"""Bytes after the last complete envelope of a body are reported, never dropped (issue 21 item 4):
for every transport and direction, one complete envelope followed by 2 stray bytes decodes to the
envelope's frame and a frame holding exactly the stray bytes; bytes a gzip frame carries after its
gzip data are noted on the frame (``frames.meta.trailing_bytes``)."""

from __future__ import annotations

import gzip
import json

import pytest
from decode_corpus import UUID, append_body, poll_body
from support import run_workbench

from workbench.decode import frame_to_json
from workbench.decode.classify import default_decoder
from workbench.schema import pb
from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_TRAILER, header
from workbench.wire.envelope import encode as envelope

DEC = default_decoder()
STRAY = b"\x00\x01"


def _server() -> bytes:
    m = pb.AgentServerMessage()
    m.interaction_update.text_delta.text = "hi"
    return m.SerializeToString()


def _client() -> bytes:
    m = pb.AgentClientMessage()
    m.client_heartbeat.SetInParent()
    return m.SerializeToString()


# (transport, direction, body of one complete envelope, its kind)
CASES = [
    ("run", "server", envelope(_server()), "interaction_update.text_delta"),
    ("run", "client", envelope(_client()), "client_heartbeat"),
    ("runsse", "server", envelope(_server()), "interaction_update.text_delta"),
    ("runsse", "client", envelope(pb.BidiRequestId(request_id=UUID).SerializeToString()), "bidi_request_id"),
    ("runpoll", "server", envelope(poll_body(_server(), 1)), "interaction_update.text_delta"),
    ("runpoll", "client", envelope(pb.BidiPollRequest(request_id=pb.BidiRequestId(request_id=UUID))
                                   .SerializeToString()), "bidi_poll_request"),
    ("bidi_append", "client", envelope(append_body(_client(), 1, raw_field=True)), "client_heartbeat"),
    ("bidi_append", "server", envelope(b"") + envelope(b"grpc-status: 0\r\n", FLAG_TRAILER), "empty"),
    ("unary", "server", envelope(_server()), "unary"),
]


@pytest.mark.parametrize(("transport", "direction", "body", "kind"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_stray_bytes_after_the_last_envelope_are_a_frame(transport: str, direction: str, body: bytes,
                                                        kind: str) -> None:
    clean = DEC.decode_body(body, transport, direction)
    assert clean[0].kind == kind
    frames = DEC.decode_body(body + STRAY, transport, direction)
    assert frames[:-1] == clean
    last = frames[-1]
    assert (last.kind, last.payload, last.summary) == ("malformed", STRAY, "2 B after the last complete envelope")
    assert last.error == "truncated frame header (2 of 5 bytes)"
    if transport in ("run", "runsse", "runpoll"):  # the capture's incremental decoder says the same
        sd = DEC.stream(transport, direction)
        assert [*sd.feed(body + STRAY), *sd.close()] == frames


@pytest.mark.parametrize("stray", [b"\x0a\x01\x02\x03\x04\x05", b"\xff" * 9], ids=["protobuf-like", "ff"])
@pytest.mark.parametrize(("transport", "direction", "body", "kind"), CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_stray_bytes_that_do_not_look_like_a_header_are_a_frame_too(transport: str, direction: str, body: bytes,
                                                                    kind: str, stray: bytes) -> None:
    """Five or more stray bytes whose first is no envelope flag made a unary or BidiAppend body
    one bare message (``malformed``, the envelope's kind lost), while streams kept the envelope."""
    clean = DEC.decode_body(body, transport, direction)
    frames = DEC.decode_body(body + stray, transport, direction)
    assert frames[:-1] == clean
    assert (frames[-1].kind, frames[-1].payload) == ("malformed", stray)


def test_bytes_after_the_gzip_data_are_noted() -> None:
    z = gzip.compress(_server())
    f, = DEC.decode_body(header(FLAG_COMPRESSED, len(z) + 2) + z + STRAY, "run", "server")
    assert (f.kind, f.error, f.flags) == ("interaction_update.text_delta", None, FLAG_COMPRESSED)
    assert f.meta == {"wire_length": len(z) + 2,
                      "trailing_bytes": {"count": 2, "hex": "0001", "where": "after the gzip data"}}
    assert f.summary == 'text "hi" [2 B after the gzip data]'
    assert frame_to_json(DEC, f)["trailing_bytes"]["count"] == 2
    # kept compressed over a budget and inflated when looked at: noted then
    g = DEC.inflate_compressed(z + STRAY, "agent.v1.AgentServerMessage")
    assert g.meta is not None and g.meta["trailing_bytes"]["hex"] == "0001"


@pytest.mark.slow
def test_decode_cli_reports_the_stray_bytes() -> None:
    proc = run_workbench("decode", "--json", (envelope(_server()) + STRAY).hex())
    assert proc.returncode == 1, proc.stderr  # a malformed frame: exit 1, as before
    frames = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [f["kind"] for f in frames] == ["interaction_update.text_delta", "malformed"]
    assert frames[1]["fields"] == {"$hex": "0001"}
    assert "Traceback" not in proc.stderr
