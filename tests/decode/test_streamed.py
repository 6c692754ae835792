"""``frames --json`` of a big frame kept compressed (issue 24): the long strings are written from
an inflating stream, never held whole, and the text is the same as the ordinary ``json.dump`` of
``fields_of`` — for the frames the streamed path takes and for those it hands back."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc
from typing import Any

import pytest

from workbench.decode import fields_of, streamed
from workbench.decode.classify import default_decoder
from workbench.schema import pb
from workbench.wire.envelope import FLAG_COMPRESSED

DEC = default_decoder()
SERVER = "agent.v1.AgentServerMessage"
MIB = 1024 * 1024
ROW = {"seq": 3, "ts": "2026-11-27 10:00:00", "kind": "compressed", "error": "kept compressed"}


def _ordinary(payload: bytes, msg_type: str = SERVER) -> str:
    return json.dumps({**ROW, "fields": fields_of(DEC, "compressed", payload, msg_type, FLAG_COMPRESSED)},
                      ensure_ascii=False, default=str)


def _streamed(payload: bytes, msg_type: str = SERVER) -> str:
    out = io.StringIO()
    streamed.dump_frame(DEC, ROW, "compressed", payload, msg_type, FLAG_COMPRESSED, out)
    return out.getvalue()


def _took_stream(payload: bytes) -> bool:
    return streamed._streamed_fields(DEC, "compressed", payload, SERVER, FLAG_COMPRESSED) is not None


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Thresholds of a few KB, so the cases stay quick; PIECE small so strings cross pieces."""
    monkeypatch.setattr(streamed, "STREAM_FROM", 1024)
    monkeypatch.setattr(streamed, "BIG", 2048)
    monkeypatch.setattr(streamed, "PIECE", 1000)


def _text_delta(text: str, member: str = "text_delta") -> bytes:
    m = pb.AgentServerMessage()
    getattr(m.interaction_update, member).text = text
    return m.SerializeToString()


# quotes, backslashes, control characters, non-ASCII of 2, 3 and 4 bytes: escapes and characters
# that a piece boundary can cut
TRICKY = 'a"b\\c\nd\te\x01f é中😀' * 500


@pytest.mark.parametrize("member", ["text_delta", "thinking_delta"])
def test_a_long_text_is_streamed_and_written_the_same(small_limits: None, member: str) -> None:
    payload = gzip.compress(_text_delta(TRICKY, member))
    assert _took_stream(payload)
    assert _streamed(payload) == _ordinary(payload)


def test_a_long_text_with_other_fields_around_it(small_limits: None) -> None:
    m = pb.AgentServerMessage()
    m.interaction_update.text_delta.text = TRICKY
    raw = m.SerializeToString() + pb.AgentServerMessage(
        interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text="x" * 3000))).SerializeToString()
    raw += b"\xf8\x3f\x07"  # an unknown varint field (1023) after the strings
    payload = gzip.compress(raw)
    assert _took_stream(payload)
    assert _streamed(payload) == _ordinary(payload)


def test_frames_it_cannot_vouch_for_take_the_ordinary_path(small_limits: None) -> None:
    partial = pb.AgentServerMessage()
    partial.interaction_update.partial_tool_call.args_text_delta = "y" * 5000  # its summary counts chars
    bad_utf8 = _text_delta("z" * 5000).replace(b"zzzz", b"z\xffzz", 1)
    cases = {
        "summary reads the whole string": gzip.compress(partial.SerializeToString()),
        "not UTF-8": gzip.compress(bad_utf8),
        "bytes after the gzip data": gzip.compress(_text_delta(TRICKY)) + b"\x00\x01",
        "truncated gzip": gzip.compress(_text_delta(TRICKY))[:-20],
        "short": gzip.compress(_text_delta("short")),
    }
    for why, payload in cases.items():
        assert not _took_stream(payload), why
        assert _streamed(payload) == _ordinary(payload), why


def _sink_peak(fn: Any) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


class _Discard(io.TextIOBase):
    def __init__(self) -> None:
        self.n = 0

    def write(self, s: str) -> int:
        self.n += len(s)
        return len(s)


def test_a_48_mib_text_is_never_held_whole() -> None:
    payload = gzip.compress(_text_delta("w" * (48 * MIB)), 1)
    sink = _Discard()
    peak = _sink_peak(lambda: streamed.dump_frame(DEC, ROW, "compressed", payload, SERVER, FLAG_COMPRESSED, sink))
    assert sink.n > 48 * MIB
    assert peak < 12 * MIB, f"peak {peak / MIB:.0f} MiB while writing a 48 MiB text"
    # the ordinary path holds it several times over (what frames --json did before)
    ordinary = _sink_peak(lambda: json.dump({"fields": fields_of(DEC, "compressed", payload, SERVER,
                                                                 FLAG_COMPRESSED)}, _Discard()))
    assert ordinary > 96 * MIB
