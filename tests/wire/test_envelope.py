"""Connect envelope framing (docs/protocol.md §2): incremental parsing, gzip, end-stream, trailers, caps,
unary bodies."""

from __future__ import annotations

import gzip
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.wire.endstream import b64decode_loose, parse_end_stream, parse_grpc_web_trailer
from workbench.wire.envelope import (
    FLAG_COMPRESSED,
    FLAG_END_STREAM,
    FLAG_TRAILER,
    Envelope,
    EnvelopeParser,
    encode,
    gzip_tail,
    looks_enveloped,
    split_frames,
    split_unary,
)


def feed_all(chunks: list[bytes], max_frame: int | None = None) -> list[Envelope]:
    p = EnvelopeParser() if max_frame is None else EnvelopeParser(max_frame)
    out: list[Envelope] = []
    for c in chunks:
        out += p.feed(c)
    return out + p.close()


def as_tuples(envs: list[Envelope]) -> list[tuple[int, bytes, int, str | None, bytes | None]]:
    return [(e.flags, e.payload, e.offset, e.error, e.raw) for e in envs]


def normalised(envs: list[Envelope]) -> list[tuple[int, bytes, int, str | None, bytes | None]]:
    """Frames as tuples, with the unframed bytes after a desync merged into one entry.

    Once the stream is out of sync the parser hands back each later chunk as it comes (so nothing
    waits for EOF); how many pieces that makes depends on the chunking, the bytes do not.
    """
    out = as_tuples(envs)
    for i, t in enumerate(out):
        if t[0] == -1 and t[3] is not None and not t[3].startswith("truncated"):
            rest = b"".join(x[1] for x in out[i:])
            return [*out[:i], (-1, rest, t[2], t[3], rest)]
    return out


def test_encode_layout() -> None:
    assert encode(b"\x0a\x02\x6a\x00") == bytes.fromhex("00000000040a026a00")
    assert encode(b"{}", FLAG_END_STREAM) == bytes.fromhex("02000000027b7d")
    z = encode(b"hello" * 50, compress=True)
    assert z[0] == FLAG_COMPRESSED
    assert int.from_bytes(z[1:5], "big") == len(z) - 5
    assert gzip.decompress(z[5:]) == b"hello" * 50


def test_many_frames_in_one_chunk_and_offsets() -> None:
    a, b, c = encode(b"a"), encode(b"bb"), encode(b"{}", FLAG_END_STREAM)
    envs = feed_all([a + b + c])
    assert [(e.flags, e.payload, e.offset) for e in envs] == [(0, b"a", 0), (0, b"bb", 6), (2, b"{}", 13)]
    assert envs[2].is_end_stream
    assert not envs[2].is_trailer
    assert all(e.error is None for e in envs)


def test_one_byte_chunks() -> None:
    body = encode(b"x" * 300) + encode(b"") + encode(b"yz", compress=True) + encode(b"{}", FLAG_END_STREAM)
    envs = feed_all([body[i : i + 1] for i in range(len(body))])
    assert as_tuples(envs) == as_tuples(split_frames(body))
    assert [e.payload for e in envs] == [b"x" * 300, b"", b"yz", b"{}"]


def test_large_frame_in_small_chunks_is_not_rescanned() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    body = encode(payload)
    p = EnvelopeParser()
    got: list[Envelope] = []
    for i in range(0, len(body), 1000):
        got += p.feed(body[i : i + 1000])
        if len(got) == 0:
            assert p.buffered == min(i + 1000, len(body))
    assert [e.payload for e in got] == [payload]
    assert p.buffered == 0
    assert p.close() == []


def test_gzip_flag_inflates_each_envelope() -> None:
    one, two = b"\x0a\x02\x6a\x00", b"\x0a\x02\x72\x00" * 100
    body = encode(one, compress=True) + encode(two, compress=True)
    envs = split_frames(body)
    assert [e.payload for e in envs] == [one, two]
    assert all(e.flags == FLAG_COMPRESSED and e.error is None for e in envs)
    assert envs[1].raw is not None
    assert gzip.decompress(envs[1].raw) == two
    assert envs[1].wire_bytes == envs[1].raw


def test_bad_gzip_keeps_bytes() -> None:
    body = bytes((FLAG_COMPRESSED,)) + (4).to_bytes(4, "big") + b"nope"
    [e] = split_frames(body)
    assert e.error
    assert e.error.startswith("gzip")
    assert e.payload == b"nope"


def test_compressed_end_stream() -> None:
    body = bytes((FLAG_END_STREAM | FLAG_COMPRESSED,)) + len(z := gzip.compress(b"{}")).to_bytes(4, "big") + z
    [e] = split_frames(body)
    assert e.is_end_stream
    assert e.payload == b"{}"


def test_frame_size_cap() -> None:
    body = encode(b"ok") + encode(b"x" * 2000) + encode(b"never")
    envs = split_frames(body, max_frame=1024)
    assert envs[0].payload == b"ok"
    assert envs[0].error is None
    bad = envs[1]
    assert bad.error is not None
    assert "2000" in bad.error
    assert "1024-byte cap" in bad.error
    assert bad.offset == 7
    assert bad.raw == body[7:]
    assert len(envs) == 2  # everything after the desync is kept as raw bytes, not reframed
    p = EnvelopeParser(max_frame=1024)
    p.feed(body)
    [later] = p.feed(b"more")
    assert later.error
    assert "out of sync" in later.error
    assert later.payload == b"more"


def test_default_cap_catches_desync() -> None:
    [e] = split_frames(b"\x00\xff\xff\xff\xff" + b"junk")
    assert e.error
    assert "cap" in e.error
    assert e.flags == -1


def test_reserved_flags() -> None:
    body = encode(b"ok") + bytes((0x40,)) + (1).to_bytes(4, "big") + b"x"
    envs = split_frames(body)
    assert envs[1].error == "reserved envelope flags 0x40"
    assert envs[1].payload == body[7:]
    assert envs[1].offset == 7


def test_truncated_tail() -> None:
    body = encode(b"abc") + encode(b"defgh")[:-2]
    envs = split_frames(body)
    assert envs[0].payload == b"abc"
    assert envs[1].error == "truncated frame: header announces 5 bytes, 3 arrived"
    assert envs[1].payload == encode(b"defgh")[:-2]
    assert envs[1].offset == 8
    [e] = split_frames(b"\x00\x00\x00")
    assert e.error == "truncated frame header (3 of 5 bytes)"
    assert split_frames(b"") == []


def test_bytes_after_end_stream() -> None:
    body = encode(b"{}", FLAG_END_STREAM) + encode(b"late")
    envs = split_frames(body)
    assert envs[0].is_end_stream
    assert envs[1].error == "bytes after end-stream"
    assert envs[1].payload == encode(b"late")
    assert envs[1].offset == 7
    # the same when the late bytes come in a later chunk
    p = EnvelopeParser()
    assert len(p.feed(encode(b"{}", FLAG_END_STREAM))) == 1
    [late] = p.feed(b"\x00")
    assert late.error == "bytes after end-stream"
    assert late.offset == 7


def test_grpc_web_trailer() -> None:
    body = encode(b"x") + encode(b"grpc-status: 8\r\ngrpc-message: usage%20limit\r\n", FLAG_TRAILER)
    envs = split_frames(body)
    assert envs[1].is_trailer
    assert not envs[1].is_end_stream
    assert parse_grpc_web_trailer(envs[1].payload) == {"grpc-status": "8", "grpc-message": "usage limit"}


def test_unary_bodies() -> None:
    bare = b"\x0a\x03foo"
    [e] = split_unary(bare)
    assert (e.payload, e.enveloped, e.flags) == (bare, False, 0)
    assert not looks_enveloped(bare)
    enveloped = encode(bare)
    assert looks_enveloped(enveloped)
    [e] = split_unary(enveloped)
    assert (e.payload, e.enveloped) == (bare, True)
    two = encode(bare) + encode(b"{}", FLAG_END_STREAM)
    assert [x.payload for x in split_unary(two)] == [bare, b"{}"]
    [e] = split_unary(b"")
    assert e.payload == b""
    assert not e.enveloped
    # a 0x00 first byte whose lengths do not add up is not an envelope
    assert not looks_enveloped(b"\x00\x00\x00\x00\x09abc")


def test_end_stream_parsing() -> None:
    assert not parse_end_stream(b"{}").is_error
    assert not parse_end_stream(b"").is_error
    es = parse_end_stream(json.dumps({"error": {"code": "unavailable", "message": "Provider%20down",
                                                "details": [{"type": "aiserver.v1.ErrorDetails",
                                                             "value": "CA0"}]},
                                      "metadata": {"k": ["v"]}}).encode(),
                          decode_details=lambda raw: {"raw": raw.hex()})
    assert (es.code, es.message, es.metadata) == ("unavailable", "Provider down", {"k": ["v"]})
    assert es.details == [{"type": "aiserver.v1.ErrorDetails", "value_hex": "080d", "value": {"raw": "080d"}}]
    assert es.as_dict()["error"]["code"] == "unavailable"
    for bad in (b"[1]", b"nope", b"\xff"):
        try:
            parse_end_stream(bad)
        except ValueError as exc:
            assert "end-stream" in str(exc)
        else:  # pragma: no cover
            raise AssertionError(bad)


def test_b64_loose() -> None:
    assert b64decode_loose("CA0") == b"\x08\x0d"
    assert b64decode_loose("-_8") == b"\xfb\xff"


# ---- split anywhere: chunking never changes the result -------------------------------------

payloads = st.binary(max_size=300)
frames_st = st.lists(
    st.tuples(payloads, st.sampled_from([0, 0, 0, FLAG_COMPRESSED, FLAG_TRAILER])), min_size=1, max_size=12)


def _body(frames: list[tuple[bytes, int]], end: bool, tail: bytes) -> bytes:
    body = b"".join(encode(p, compress=True) if fl == FLAG_COMPRESSED else encode(p, fl) for p, fl in frames)
    if end:
        body += encode(b'{"error":{"code":"internal"}}', FLAG_END_STREAM)
    return body + tail


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(frames=frames_st, end=st.booleans(), tail=st.binary(max_size=12), data=st.data())
def test_split_anywhere_equivalence(frames: list[tuple[bytes, int]], end: bool, tail: bytes,
                                    data: st.DataObject) -> None:
    body = _body(frames, end, tail)
    whole = normalised(split_frames(body))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=40), label="cuts"))
    bounds = [0, *cuts, len(body)]
    chunks = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert normalised(feed_all(chunks)) == whole
    # and byte by byte
    assert normalised(feed_all([body[i : i + 1] for i in range(len(body))])) == whole
    # every complete frame before any error comes out identically, whatever the chunking
    good = [t for t in whole if t[3] is None]
    assert [t for t in as_tuples(feed_all(chunks)) if t[3] is None] == good
    # nothing is lost: payload bytes of good frames + raw of bad ones account for the body
    assert sum(5 + len(e.wire_bytes) if e.flags >= 0 else len(e.payload) for e in split_frames(body)) == len(body)


def test_the_header_and_the_flag_names() -> None:
    from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_END_STREAM, FLAG_TRAILER, flag_names, header

    assert header(FLAG_COMPRESSED, 300) == b"\x01\x00\x00\x01\x2c"
    assert encode(b"abc", FLAG_END_STREAM)[:5] == header(FLAG_END_STREAM, 3)
    assert flag_names(0) == ["data"]
    assert flag_names(FLAG_COMPRESSED | FLAG_END_STREAM) == ["gzip", "end-stream"]
    assert flag_names(FLAG_TRAILER) == ["trailer"]


def test_stray_bytes_after_complete_envelopes_of_a_unary_body() -> None:
    # issue 21: a body of complete envelopes plus stray bytes is still envelopes (a bare message
    # cannot start with 0x00-0x03); the stray bytes come out as a frame of their own
    bare = b"\x0a\x03foo"
    for stray in (b"\x00\x01", b"\x00\x00\x00\x00\x09ab"):
        body = encode(bare) + stray
        assert looks_enveloped(body, stray_tail=True)
        assert not looks_enveloped(body)  # a Connect server's 415 test: the lengths must add up
        first, rest = split_unary(body)
        assert (first.payload, first.enveloped, first.error) == (bare, True, None)
        assert (rest.payload, rest.offset, rest.flags) == (stray, len(encode(bare)), -1)
        assert rest.error is not None and rest.error.startswith("truncated frame")
    # a trailer-first body keeps needing its exact lengths; so does a bare message
    assert not looks_enveloped(encode(b"grpc-status: 0\r\n", FLAG_TRAILER) + b"\x00\x01", stray_tail=True)
    assert not looks_enveloped(bare + b"\x00\x01", stray_tail=True)


def test_gzip_tail_is_kept() -> None:
    data = b"\x0a\x03foo" * 10
    z = gzip.compress(data)
    assert gzip_tail(z, data) == b""
    for tail in (b"\x00\x01", b"junk after the member", gzip.compress(b"second member")):
        assert gzip_tail(z + tail, data) == tail
        [e] = split_frames(encode(z + tail, FLAG_COMPRESSED))
        assert (e.payload, e.error, e.tail, e.raw) == (data, None, tail, z + tail)
    [e] = split_frames(encode(data, compress=True))
    assert e.tail == b""
