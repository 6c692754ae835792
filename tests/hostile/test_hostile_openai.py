"""Source: the OpenAI side of a bridge (``workbench capture --bridge``, flow and HAR imports), in process.

Invariants, for the SSE reader (``workbench.decode.sse``, what the capture's bridge listener feeds
each answer to) and the OpenAI decoder (``workbench.decode.openai``) with everything after it on the
way in and out (the write gate, the bridge analysis' readings, the views' trees):
(a) no exception, whatever the bytes: arbitrary JSON, nested far past the nesting limit, huge strings;
(b) every event kept or marked: the reader gives what the SSE rules give for the whole body, cut in
    any chunks, an event whose data (or one line) is past the limit as its size and SHA-256;
(c) bounded: the reader holds at most twice its limit whatever the line length; a frame's summary,
    error and call id are bounded whatever the body;
(d) lossless forwarding: the capture hands the proxy back every chunk it was given, unchanged.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from strategies import hostile, tried

from workbench.capture.addon import _stream_callable
from workbench.capture.flows import Chunk
from workbench.decode.classify import default_decoder
from workbench.decode.openai import (
    CALL_ID_LIMIT,
    ERROR_LIMIT,
    SUMMARY_LIMIT,
    OpenAIStream,
    decode_openai_body,
)
from workbench.decode.render import fields_of
from workbench.decode.sse import SseComment, SseEvent, SseItem, SseOversize, SseReader
from workbench.nesting import NESTING_LIMIT, TooDeep, load_json
from workbench.protocol import kinds
from workbench.protocol.openai import answer_facts, request_facts
from workbench.redact import redact_frame
from workbench.store.gate import gate_frame

_EOL = re.compile(rb"\r\n|\r|\n")


# the SSE rules on a whole body, with no limit on what is held: what the reader must agree with --

def reference_events(body: bytes, limit: int) -> list[SseItem]:
    out: list[SseItem] = []
    data: list[bytes] = []
    event: str | None = None
    long_line = False

    def dispatch() -> None:
        nonlocal data, event, long_line
        joined = b"\n".join(data)
        if data and (long_line or len(joined) > limit):
            out.append(SseOversize(False, event, len(joined), hashlib.sha256(joined).hexdigest(), limit))
        elif data or event is not None:
            out.append(SseEvent(event, joined))
        data, event, long_line = [], None, False

    for line in _EOL.split(body):
        if not line:
            dispatch()
        elif line[:1] == b":":
            out.append(SseOversize(True, None, len(line), hashlib.sha256(line).hexdigest(), limit)
                       if len(line) > limit else SseComment(line))
        else:
            name, _, value = line.partition(b":")
            value = value[1:] if value[:1] == b" " else value
            if name == b"data":
                data.append(value)
                long_line = long_line or len(line) > limit
            elif name == b"event" and len(line) <= limit:
                event = value.decode("utf-8", "replace")
    dispatch()
    return out


_value = st.one_of(st.binary(max_size=40), st.binary(min_size=1, max_size=3000)).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_line = st.one_of(
    _value.map(lambda v: b"data: " + v), _value.map(lambda v: b"data:" + v), st.just(b"data"),
    _value.map(lambda v: b"event: " + v), _value.map(lambda v: b":" + v), _value.map(lambda v: b"id: " + v),
    st.just(b""), st.just(b""), _value)
_eol = st.sampled_from([b"\n", b"\r", b"\r\n"])
sse_bodies = st.lists(st.tuples(_line, _eol), max_size=30).flatmap(
    lambda lines: st.tuples(st.just(b"".join(ln + e for ln, e in lines)), st.booleans())).map(
    lambda t: t[0] if t[1] else t[0].rstrip(b"\r\n"))


def _chunks(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    return [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]


@hostile(300)
@given(body=sse_bodies, cuts=st.lists(st.integers(0, 1 << 20), max_size=40), limit=st.sampled_from([64, 200, 1000]))
def test_sse_reader_any_chunking(body: bytes, cuts: list[int], limit: int) -> None:
    tried("test_sse_reader_any_chunking")
    reader = SseReader(limit)
    got: list[SseItem] = []
    forwarded: list[bytes] = []
    put: list[Any] = []
    forward = _stream_callable(put.append, "flow", "server")
    for chunk in _chunks(body, cuts):
        forwarded.append(forward(chunk))
        got += reader.feed(chunk)
        assert reader.held <= 2 * limit, f"the reader holds {reader.held} bytes with a {limit}-byte limit"  # (c)
    got += reader.close()
    assert b"".join(forwarded) == body  # (d): the proxy sends on exactly what came
    assert b"".join(ev.data for ev in put if type(ev) is Chunk) == body  # and the writer gets the same
    assert got == reference_events(body, limit)  # (b)


def test_sse_reader_one_huge_line_in_small_chunks_is_one_pass_and_bounded() -> None:
    """The issue's case, scaled: one 8 MB ``data:`` line in 4 KiB chunks, then an event after it."""
    value = b"x" * (8 << 20)
    body = b"data: " + value + b"\n\ndata: {\"choices\":[]}\n\n"
    reader = SseReader(1 << 20)
    got: list[SseItem] = []
    for i in range(0, len(body), 4096):
        got += reader.feed(body[i:i + 4096])
        assert reader.held <= 1 << 20
    got += reader.close()
    assert got == [SseOversize(False, None, len(value), hashlib.sha256(value).hexdigest(), 1 << 20),
                   SseEvent(None, b'{"choices":[]}')]


# the decoder and everything after it ------------------------------------------------------------

def deep(depth: int, opener: str) -> str:
    if opener == "{":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20)
# raw JSON text: any value, nested around and far past the limit (closed or not), huge strings
json_texts = st.one_of(
    json_values.map(json.dumps),
    st.tuples(st.sampled_from([NESTING_LIMIT - 2, NESTING_LIMIT + 1, 1000, 100_000]),
              st.sampled_from(["[", "{"]), st.booleans()).map(
        lambda t: deep(t[0], t[1]) if t[2] else t[1] * t[0]),
    st.sampled_from([1 << 20, 3 << 20]).map(lambda n: json.dumps("é\n" * (n // 2))),
    st.text(max_size=40),
)
_KEYS = ["model", "messages", "input", "tools", "stream", "choices", "delta", "content", "tool_calls", "id",
         "function", "name", "arguments", "error", "type", "code", "message", "usage", "object", "output",
         "response", "item", "call_id", "finish_reason", "role", "status", "api_key"]


@st.composite
def openai_docs(draw: st.DrawFn) -> str:
    """A document shaped like a request, an answer or a chunk, with hostile values in its fields."""
    def fill(depth: int) -> Any:
        if depth > 3 or draw(st.booleans()):
            return json.loads(draw(json_texts)) if draw(st.integers(0, 3)) == 0 else draw(json_values)
        if draw(st.booleans()):
            return [fill(depth + 1) for _ in range(draw(st.integers(0, 2)))]
        return {k: fill(depth + 1) for k in draw(st.lists(st.sampled_from(_KEYS), max_size=4, unique=True))}

    try:
        return json.dumps(fill(0))
    except (RecursionError, ValueError):  # a value too deep for json itself: the raw text then
        return draw(json_texts)


bodies = st.one_of(json_texts, openai_docs()).map(lambda t: t.encode("utf-8", "surrogatepass"))


def _check_frames(frames: list[Any], size: int) -> None:
    for f in frames:
        assert len(f.summary) <= SUMMARY_LIMIT, f.summary[:200]  # (c)
        assert f.error is None or len(f.error) <= ERROR_LIMIT
        assert f.call_id is None or len(f.call_id) <= CALL_ID_LIMIT
        assert len(f.payload) <= max(size, 4096)
        for content in (False, True):  # (a): the gate, both redaction levels, the readings, the views
            g = gate_frame(redact_frame(type(f)(f.kind, f.summary, f.payload, error=f.error), content=content))
            fields_of(default_decoder(), g.kind, g.payload, g.msg_type, g.flags)
    request_facts(frames[0].payload if frames else None)
    answer_facts((i, i, f.kind, f.payload) for i, f in enumerate(frames))


@hostile(60)
@given(body=bodies, as_sse=st.booleans(), transport=st.sampled_from(["openai_chat", "openai_responses"]))
def test_openai_decoder_any_json(body: bytes, as_sse: bool, transport: str) -> None:
    tried("test_openai_decoder_any_json")
    dec = default_decoder()
    req = dec.decode_body(body, transport, "client")
    _check_frames(req, len(body))
    answer = b"data: " + body.replace(b"\n", b"\\n") + b"\n\ndata: [DONE]\n\n" if as_sse else body
    ans = dec.decode_body(answer, transport, "server")
    _check_frames(ans, len(answer))
    if as_sse:
        assert ans[-1].kind == kinds.OPENAI_DONE and len(ans) == 2


def test_too_deep_bodies_are_kept_with_their_error() -> None:
    """The issue's inputs: a request of ``[`` × 100,000 and an answer of ``[`` × 200,000."""
    req = decode_openai_body(b"[" * 100_000, "client")
    ans = decode_openai_body(b"[" * 200_000, "server")
    sse = decode_openai_body(b"data: " + b"[" * 200_000 + b"\n\ndata: [DONE]\n\n", "server")
    for frames, kind in ((req, kinds.OPENAI_REQUEST), (ans, kinds.OPENAI_RESPONSE), (sse[:1], kinds.OPENAI_EVENT)):
        assert [f.kind for f in frames] == [kind]
        assert frames[0].error and f"deeper than {NESTING_LIMIT}" in frames[0].error
    assert ans[0].payload == b"[" * 200_000 and gate_frame(ans[0]).payload == b"[" * 200_000  # raw
    assert sse[1].kind == kinds.OPENAI_DONE


def test_a_credential_in_a_too_deep_answer_is_not_kept() -> None:
    body = ('{"api_key": "sk-DEEP-SECRET", "x": ' + deep(500, "[") + ', "\\u0074oken": "t-SECRET"}').encode()
    f = gate_frame(decode_openai_body(body, "server")[0])
    assert f.error and b"SECRET" not in f.payload and f.payload.count(b"[redacted sha256:") == 2


def test_load_json_limit() -> None:
    assert load_json(deep(NESTING_LIMIT, "[")) == json.loads(deep(NESTING_LIMIT, "["))
    for text in (deep(NESTING_LIMIT + 1, "["), deep(NESTING_LIMIT + 1, "{"), "[" * 100_000):
        try:
            load_json(text)
        except TooDeep:
            continue
        raise AssertionError(f"{text[:20]}… parsed")


def test_whole_body_past_the_body_limit_says_its_size_and_hash() -> None:
    s = OpenAIStream("server")
    from workbench.decode.openai import BODY_LIMIT

    chunk = b"{" + b" " * ((BODY_LIMIT // 4) - 1)
    for _ in range(5):
        assert s.feed(chunk) == []
    (f,) = s.close()
    whole = chunk * 5
    assert f.error and hashlib.sha256(whole).hexdigest() in f.error and f.payload == whole[:4096]
