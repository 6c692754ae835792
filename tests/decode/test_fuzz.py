"""Hypothesis: chunking never changes what is decoded, the fast paths agree with the protobuf
runtime, and random or mutated input (≤ 64 KB) never raises. How long such input takes is
measured by ``benchmarks/decode_fuzz.py``, not asserted here.

Fuzz budget: 4,000 random + 6,000 mutated inputs (plus the equivalence tests' own examples).
"""

from __future__ import annotations

import json

import decode_corpus as corpus
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.decode import frame_to_json
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, Decoder, Frame, default_decoder
from workbench.wire.envelope import encode

DEC = default_decoder()
SLOW = Decoder(fast=False)
MAX_INPUT = corpus.MAX_INPUT
STREAMED = [k for k in corpus.ALL_KEYS if k[0] in ("run", "runsse", "runpoll")]
FAST = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _chunks(body: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(c % (len(body) + 1) for c in cuts), len(body)]
    return [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def stream_decode(dec: Decoder, body: bytes, key: tuple[str, str], cuts: list[int]) -> list[Frame]:
    sd = dec.stream(*key)
    out: list[Frame] = []
    for c in _chunks(body, cuts):
        out += sd.feed(c)
    return out + sd.close()


# ---- split anywhere: the stream decoder gives what the one-shot decoder gives ---------------

def _no_end_stream(key: tuple[str, str]) -> list[bytes]:
    """Bodies that can be followed by more frames (no end-stream inside)."""
    return [b for b in corpus.bodies()[key]
            if not any(f.kind.startswith("end_stream") for f in DEC.decode_body(b, *key))]


@settings(max_examples=400, **FAST)  # type: ignore[arg-type]
@given(data=st.data())
def test_stream_split_anywhere_decodes_identically(data: st.DataObject) -> None:
    key = data.draw(st.sampled_from(STREAMED), label="key")
    pool = _no_end_stream(key)
    picked = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=15), label="frames")
    end = data.draw(st.sampled_from([b"", corpus.END_OK, corpus.END_ERR]), label="end")
    body = b"".join(picked) + end
    whole = DEC.decode_body(body, *key)
    assert whole
    assert all(f.kind != "malformed" for f in whole)
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=30), label="cuts")
    assert stream_decode(DEC, body, key, cuts) == whole
    one_byte = list(range(len(body))) if len(body) < 4000 else cuts
    assert stream_decode(DEC, body, key, one_byte) == whole


# ---- the fast paths (cache, byte-level text deltas, fused envelope loop) change nothing -------

@settings(max_examples=1500, **FAST)  # type: ignore[arg-type]
@given(data=st.data())
def test_fast_paths_agree_with_protobuf_runtime(data: st.DataObject) -> None:
    direction = data.draw(st.sampled_from(["server", "client"]), label="direction")
    pool = corpus.server_payloads() if direction == "server" else corpus.client_payloads()
    base = data.draw(st.sampled_from(pool), label="base")
    seed = data.draw(st.integers(-1, 2**32), label="seed")
    payload = corpus.mutate(seed, base) if seed >= 0 else base
    msg_type = SERVER_MSG if direction == "server" else CLIENT_MSG
    assert DEC.classify_agent(payload, msg_type) == SLOW.classify_agent(payload, msg_type)
    # twice: the second answer may come from the small-frame cache
    assert DEC.classify_agent(payload, msg_type) == SLOW.classify_agent(payload, msg_type)
    body = encode(payload)
    assert stream_decode(DEC, body, ("run", direction), [3, 7]) == SLOW.decode_body(body, "run", direction)


@settings(max_examples=600, **FAST)  # type: ignore[arg-type]
@given(text=st.text(max_size=20_000), style=st.sampled_from([None, 0, 2]), extra=st.binary(max_size=6),
       thinking=st.booleans())
def test_text_fast_path_edges(text: str, style: int | None, extra: bytes, thinking: bool) -> None:
    from decode_pbbytes import ld, vi

    inner = ld(1, text) + (vi(2, style) if style is not None else b"")
    payload = ld(1, ld(4 if thinking else 1, inner)) + extra
    for p in (payload, payload[:-1], ld(1, ld(1, text.encode()[:-1]))):
        assert DEC.classify_agent(p, SERVER_MSG) == SLOW.classify_agent(p, SERVER_MSG)


# ---- fuzz: never raises ---------------------------------------------------------

def _check(data: bytes, key: tuple[str, str], cuts: list[int]) -> None:
    assert len(data) <= MAX_INPUT
    frames = DEC.decode_body(data, *key)
    streamed = stream_decode(DEC, data, key, cuts)
    if key[0] in ("run", "runsse", "runpoll"):
        assert [f.kind for f in streamed if f.kind != "malformed"] == [f.kind for f in frames if f.kind != "malformed"]
    for i, f in enumerate(frames):
        assert isinstance(f.kind, str)
        assert f.kind
        assert isinstance(f.summary, str)
        if f.kind == "malformed":
            assert f.error
        # the named tree (bbpb on the unknown parts) must not raise either; sampled, it is slow
        if (i < 3 or f.kind == "malformed") and len(f.payload) <= 8192:
            json.dumps(frame_to_json(DEC, f))


@settings(max_examples=4000, **FAST)  # type: ignore[arg-type]
@given(key=st.sampled_from(corpus.ALL_KEYS), small=st.binary(max_size=600), seed=st.integers(0, 2**32))
def test_fuzz_random_frames(key: tuple[str, str], small: bytes, seed: int) -> None:
    """Hypothesis' own byte strings (≤ 600 B), or every third example up to 64 KB of random bytes,
    half of them behind a plausible envelope header."""
    raw, cuts = corpus.random_input(seed, small)
    _check(raw, key, cuts)


@settings(max_examples=6000, **FAST)  # type: ignore[arg-type]
@given(key=st.sampled_from(corpus.ALL_KEYS), seed=st.integers(0, 2**32))
def test_fuzz_mutated_frames(key: tuple[str, str], seed: int) -> None:
    body, cuts = corpus.mutated_input(seed, key)
    _check(body, key, cuts)


@settings(max_examples=500, **FAST)  # type: ignore[arg-type]
@given(fields=st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 5]), st.one_of(st.text(max_size=300),
                                                                             st.binary(max_size=20))),
                       max_size=5),
       extra=st.binary(max_size=3))
def test_partial_tool_call_fast_path_edges(fields: list[tuple[int, str | bytes]], extra: bytes) -> None:
    from decode_pbbytes import ld

    payload = ld(1, ld(7, b"".join(ld(no, value) for no, value in fields))) + extra
    assert DEC.classify_agent(payload, SERVER_MSG) == SLOW.classify_agent(payload, SERVER_MSG)


@settings(max_examples=500, **FAST)  # type: ignore[arg-type]
@given(kv_id=st.one_of(st.none(), st.integers(0, 2**40)), parts=st.lists(st.tuples(
    st.sampled_from([1, 2, 3]), st.binary(max_size=200)), max_size=3), order=st.booleans(),
    blob=st.one_of(st.just(b""), st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_set_blob_fast_path_edges(kv_id: int | None, parts: list[tuple[int, bytes]], order: bool, blob: bytes) -> None:
    from decode_pbbytes import ld, vi

    args = b"".join(ld(no, value) for no, value in parts) + ld(2, b'{"role": "tool"}' + blob)
    head = vi(1, kv_id) if kv_id is not None else b""
    body = head + ld(3, args) if order else ld(3, args) + head
    payload = ld(4, body)
    assert DEC.classify_agent(payload, SERVER_MSG) == SLOW.classify_agent(payload, SERVER_MSG)


_leaf = st.one_of(st.just(b""), st.text(max_size=60).map(lambda t: b"\x0a" + bytes((len(t.encode()),)) + t.encode()
                                                         if len(t.encode()) < 128 else b""),
                  st.binary(max_size=8))


@settings(max_examples=600, **FAST)  # type: ignore[arg-type]
@given(call_id=st.one_of(st.none(), st.text(max_size=30), st.binary(max_size=6)), member=st.sampled_from([None, 1, 2, 3, 4]),
       sub=st.sampled_from([None, 1, 2, 3]), leaf=_leaf, model=st.one_of(st.none(), st.text(max_size=10)),
       swap=st.booleans(), extra=st.binary(max_size=3))
def test_tool_call_delta_fast_path_edges(call_id: str | bytes | None, member: int | None, sub: int | None,
                                         leaf: bytes, model: str | None, swap: bool, extra: bytes) -> None:
    from decode_pbbytes import ld

    inner = b"" if sub is None else ld(sub, leaf)
    delta = b"" if member is None else ld(member, inner if member != 3 else leaf)
    fields = [b"" if call_id is None else ld(1, call_id), ld(2, delta), b"" if model is None else ld(3, model)]
    if swap:
        fields.reverse()
    payload = ld(1, ld(15, b"".join(fields))) + extra
    assert DEC.classify_agent(payload, SERVER_MSG) == SLOW.classify_agent(payload, SERVER_MSG)
