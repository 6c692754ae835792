"""The capture hot path (byte-level fast paths, the server stream's inlined dispatch, the envelope
loop) stores exactly what the protobuf path stores: same kind, summary, ids, meta and decoded JSON
for every frame.

``Decoder(fast=False)`` is the reference: it classifies every frame with the protobuf runtime and
was left as it was when the hot path was made cheaper (issue 24, decode ≥ 0.2× upb).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import duckdb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import load_benchmark

from workbench.decode import frame_to_json
from workbench.decode.classify import SERVER_MSG, Decoder, Frame, default_decoder
from workbench.decode.frame import new_frame
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.recorder import Recorder
from workbench.wire.envelope import encode
from workbench.wire.varint import encode_varint

load_benchmark("goals").load()  # benchmarks/decode.py imports it as ``goals``
BENCH = load_benchmark("decode")
SLOW = Decoder(fast=False)
FAST_KINDS = {"interaction_update.text_delta", "interaction_update.partial_tool_call",
              "interaction_update.tool_call_delta", "kv_server_message.set_blob_args"}
S, U = pb.AgentServerMessage, pb.InteractionUpdate


def _streamed(dec: Decoder, body: bytes, chunk: int) -> list[Frame]:
    sd = dec.stream("run", "server")
    out: list[Frame] = []
    for i in range(0, len(body), chunk):
        out += sd.feed(body[i : i + chunk])
    return out + sd.close()


def _stored(db: Path, frames: list[Frame]) -> list[tuple[Any, ...]]:
    """``frames`` recorded into a real DuckDB file and read back, row by row."""
    with Store(db) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo("s1", source="capture", transport="run"))
        for i, f in enumerate(frames):
            rec.add("s1", 1_000 + i, "server", "run", "1", f)
        rec.flush()
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT seq, kind, summary, payload, raw, flags, msg_type, size, ref_id, call_id, "
                           "append_seqno, request_id, error, meta FROM frames ORDER BY seq").fetchall()


def test_the_benchmark_corpus_is_stored_as_the_protobuf_path_stores_it(tmp_path: Path) -> None:
    payloads = BENCH.build_corpus(3_000, 7) + BENCH.build_corpus(1_000, 11)
    body = b"".join(encode(p) for p in payloads)
    reference = SLOW.decode_body(body, "run", "server")
    assert len(reference) == len(payloads)
    assert FAST_KINDS <= {f.kind for f in reference}  # every fast path is exercised
    for chunk in (16_384, 1_000, 7):  # the benchmark's chunks, and frames cut anywhere
        assert _streamed(default_decoder(), body, chunk) == reference, chunk
    fast = _streamed(default_decoder(), body, 16_384)
    for a, b in zip(fast, reference, strict=True):
        assert frame_to_json(default_decoder(), a) == frame_to_json(SLOW, b)
    assert _stored(tmp_path / "fast.duckdb", fast) == _stored(tmp_path / "slow.duckdb", reference)


# ---- frames at the edges the fast paths read by hand -------------------------------------------

_LENGTHS = [0, 1, 2, 31, 32, 120, 127, 128, 129, 300, 16_383, 16_384, 70_000]
_TEXT = st.text(alphabet=st.sampled_from('ab "\\\n\rü→ok'), max_size=140)


def _blob(draw: st.DrawFn) -> bytes:
    size = draw(st.sampled_from(_LENGTHS))
    head = draw(st.sampled_from([b'{"role": "user", "content": "', b"  [1, ", b"\x0a\x03abc", b"plain text ", b"\xff\xfe"]))
    data = (head + b"x" * size)[:size]
    args = pb.SetBlobArgs(blob_data=data)
    id_len = draw(st.sampled_from([0, 1, 2, 32]))
    if id_len:
        args.blob_id = bytes(range(7, 7 + id_len))
    kv = pb.KvServerMessage(set_blob_args=args)
    kv_id = draw(st.sampled_from([0, 1, 127, 128, 300, 2**31, 2**32 - 1]))
    if kv_id:
        kv.id = kv_id
    return S(kv_server_message=kv).SerializeToString()


def _partial(draw: st.DrawFn) -> bytes:
    fields = [
        ("call_id", draw(st.sampled_from(["", "toolu_1", "c" * 130]))),
        ("args_text_delta", '{"command": "' + draw(_TEXT) * draw(st.sampled_from([1, 3]))),
        ("model_call_id", draw(st.sampled_from(["", "mc1"]))),
    ]
    if draw(st.booleans()):  # another order, or a field twice: valid protobuf, not the fast layout
        fields = draw(st.permutations(fields)) + draw(st.lists(st.sampled_from(fields), max_size=1))
    inner = b"".join(pb.PartialToolCall(**{name: value}).SerializeToString() for name, value in fields)
    update = b"\x3a" + encode_varint(len(inner)) + inner  # InteractionUpdate.partial_tool_call (7)
    return b"\x0a" + encode_varint(len(update)) + update


def _text(draw: st.DrawFn) -> bytes:
    text = draw(_TEXT)
    member = draw(st.sampled_from(["text_delta", "thinking_delta"]))
    delta = pb.TextDelta(text=text) if member == "text_delta" else pb.ThinkingDelta(text=text)
    return S(interaction_update=U(**{member: delta})).SerializeToString()


def _exec(draw: st.DrawFn) -> bytes:
    """ExecServerMessages (the exec fast path parses them with the runtime, then skips the general
    dispatch): each summarised member, one without a detail, none; ids; another member or an
    unknown field after it (the last oneof member on the wire wins)."""
    text = draw(_TEXT)
    ex = pb.ExecServerMessage(id=draw(st.sampled_from([0, 1, 300, 2**32 - 1])),
                              exec_id=draw(st.sampled_from(["", "exec-1"])))
    member = draw(st.sampled_from(["shell_args", "read_args", "ls_args", "grep_args", "mcp_args",
                                   "fetch_args", "diagnostics_args", None]))
    if member == "shell_args":
        ex.shell_args.CopyFrom(pb.ShellArgs(command=text, working_directory="/w"))
    elif member == "grep_args":
        ex.grep_args.CopyFrom(pb.GrepArgs(pattern=text, glob="*.py") if draw(st.booleans()) else
                              pb.GrepArgs(glob=text))
    elif member == "mcp_args":
        ex.mcp_args.CopyFrom(pb.McpArgs(name=text, tool_name="t", args={"q": b"1", "r": b""}))
    elif member == "fetch_args":
        ex.fetch_args.CopyFrom(pb.FetchArgs(url=text))
    elif member is not None:
        getattr(ex, member).path = text
    if draw(st.booleans()):
        ex.span_context.trace_id = "t1"
    data = S(exec_server_message=ex).SerializeToString()
    return data + draw(st.sampled_from([b"", b"", S(interaction_update=U(heartbeat=pb.Heartbeat())).SerializeToString(),
                                        b"\xf8\x07\x01", S(exec_server_message=pb.ExecServerMessage(id=5)).SerializeToString()]))


@st.composite
def _edge_frames(draw: st.DrawFn) -> bytes:
    payload = draw(st.sampled_from([_blob, _partial, _text, _exec]))(draw)
    # bytes near the start (tags and lengths, where the fast paths look): set, or nudged by a few
    # (a length one off is the mistake a hand-written reader makes)
    at = st.one_of(st.integers(0, 8), st.integers(0, 48))
    edits = draw(st.lists(st.tuples(at, st.booleans(), st.integers(0, 255)), max_size=3))
    buf = bytearray(payload)
    for i, nudge, value in edits:
        if i < len(buf):
            buf[i] = (buf[i] + value % 7 - 3) % 256 if nudge else value
    cut = draw(st.integers(0, 3))
    return bytes(buf[: len(buf) - cut] if cut and draw(st.booleans()) else buf)


@settings(max_examples=1500, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(payload=_edge_frames(), seed=st.integers(0, 2**16))
def test_the_fast_paths_agree_with_the_protobuf_path_at_their_edges(payload: bytes, seed: int) -> None:
    dec = default_decoder()
    expected = SLOW.classify_agent(payload, SERVER_MSG)
    assert dec.classify_agent(payload, SERVER_MSG) == expected
    body = encode(payload) * 2
    cuts = sorted(random.Random(seed).sample(range(len(body) + 1), 3))
    sd = dec.stream("run", "server")
    got = [f for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True) for f in sd.feed(body[a:b])]
    assert got + sd.close() == [expected, SLOW.classify_agent(payload, SERVER_MSG)]


def test_the_edges_reach_every_fast_path() -> None:
    """Frames of the shapes drawn above, unedited, do take the fast paths (with two-byte lengths too)."""
    dec = default_decoder()
    fp = dec.fast_paths
    assert fp is not None
    rng = random.Random(3)
    taken = set()
    for size in _LENGTHS:
        data = S(kv_server_message=pb.KvServerMessage(id=rng.randint(0, 300), set_blob_args=pb.SetBlobArgs(
            blob_id=b"\x01" * 32, blob_data=b'{"role": "tool"}'.ljust(size, b" ")))).SerializeToString()
        f = fp.set_blob(data, len(data))
        assert f is not None and f == SLOW.classify_agent(data, SERVER_MSG), size
        taken.add(f.kind)
    for n in (1, 60, 130, 400):
        data = S(interaction_update=U(partial_tool_call=pb.PartialToolCall(
            call_id="toolu_1", args_text_delta="→" * n, model_call_id="mc1"))).SerializeToString()
        f = fp.update(data, len(data))
        assert f is not None and f == SLOW.classify_agent(data, SERVER_MSG), n
        taken.add(f.kind)
    for n in (10, 50, 119, 120, 200):
        data = S(interaction_update=U(text_delta=pb.TextDelta(text="ü" * n))).SerializeToString()
        f = fp.update(data, len(data))
        assert f is not None and f == SLOW.classify_agent(data, SERVER_MSG), n
        taken.add(f.kind)
    assert taken == FAST_KINDS - {"interaction_update.tool_call_delta"}
    for member in ("shell_args", "read_args", "mcp_args", "diagnostics_args"):
        ex = pb.ExecServerMessage(id=rng.randint(0, 300), exec_id="exec-1")
        getattr(ex, member).SetInParent()
        data = S(exec_server_message=ex).SerializeToString()
        f = fp.exec_server(data)
        assert f is not None and f == SLOW.classify_agent(data, SERVER_MSG), member
        assert f.kind == f"exec_server_message.{member}" and f.ref_id == ex.id
    # another member last on the wire, no member, broken bytes: the protobuf path decides
    tail = S(interaction_update=U(heartbeat=pb.Heartbeat())).SerializeToString()
    for other in (data + tail, S(exec_server_message=pb.ExecServerMessage(id=3)).SerializeToString(), data[:-1]):
        assert fp.exec_server(other) is None
        assert dec.classify_agent(other, SERVER_MSG) == SLOW.classify_agent(other, SERVER_MSG)


def test_new_frame_builds_what_the_frame_class_builds() -> None:
    """The hot paths' constructor sets every field as ``Frame(...)`` does: a field added to ``Frame``
    and forgotten there is left unset, which the comparison below reports."""
    args = ("interaction_update.text_delta", 'text "hi"', b"\x0a\x01", 3, SERVER_MSG, "oops", b"raw", 7, "toolu_1")
    made, reference = new_frame(*args), Frame(*args)
    for f in dataclasses.fields(Frame):
        assert getattr(made, f.name) == getattr(reference, f.name), f.name
    assert made == reference and type(made) is Frame
    assert new_frame("k", "s", b"", 0, None) == Frame("k", "s", b"", 0, None)
