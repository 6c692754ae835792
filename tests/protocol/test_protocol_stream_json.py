"""The stream-json event model (``workbench.protocol.stream_json``): kinds, forms, tools, results, text."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from workbench.protocol.stream_json import (
    assistant_form,
    call_id_of,
    event_kind,
    is_error_result,
    naive_assistant_text,
    parse_event,
    reconstruct_assistant_text,
    result_outcome,
    text_field,
    timestamp_us,
)


def _assistant(text: str, *, ts: int | None = None, mcid: str | None = None) -> dict:
    ev: dict = {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}
    if ts is not None:
        ev["timestamp_ms"] = ts
    if mcid is not None:
        ev["model_call_id"] = mcid
    return ev


def test_event_fields() -> None:
    assert event_kind({"type": "result", "subtype": "success"}) == "result.success"
    assert event_kind({"type": "assistant"}) == "assistant"
    assert event_kind({"subtype": "x"}) == "untyped.x"
    assert call_id_of({"call_id": "toolu_1\nfc"}) == "toolu_1\nfc"
    assert call_id_of({"call_id": 3}) is None
    assert text_field({"session_id": ""}, "session_id") is None
    assert timestamp_us({"timestamp_ms": 1.5}) == 1500
    assert timestamp_us({"timestamp_ms": "x"}) is None
    assert timestamp_us({}) is None
    assert parse_event(b'{"type": "user"}') == {"type": "user"}
    assert parse_event(b"[1]") is None
    assert parse_event(b"\xff") is None


def test_the_three_assistant_forms() -> None:
    assert assistant_form(_assistant("a", ts=1)) == "delta"
    assert assistant_form(_assistant("a", ts=1, mcid="m")) == "snapshot"
    assert assistant_form(_assistant("a")) == "full"


def test_results() -> None:
    assert result_outcome("result.success", {}) == ("complete", None)
    assert result_outcome("result.success", {"is_error": True, "result": "boom"}) == ("error", "boom")
    assert result_outcome("result.error", {"error": {"message": "usage limit reached"}}) == (
        "error", "usage limit reached")
    assert result_outcome("result.error", {}) == ("error", "result.error")
    assert is_error_result("result.error", {})
    assert is_error_result("result.success", {"is_error": True})
    assert not is_error_result("result.success", {})
    assert not is_error_result("assistant", {"is_error": True})


words = st.lists(st.text(alphabet="abc xyz", min_size=1, max_size=6), min_size=1, max_size=8)


@given(words)
def test_deltas_then_a_snapshot_then_the_full_message_give_the_text_once(parts: list[str]) -> None:
    text = "".join(parts)
    events = [_assistant(p, ts=i + 1) for i, p in enumerate(parts)]
    events.append(_assistant(text, ts=100, mcid="m1"))  # the segment again, as a snapshot
    events.append(_assistant(text))                      # and the full message
    assert reconstruct_assistant_text(events) == text
    assert naive_assistant_text(events) == text * 3
    # the same events as stored lines read the same
    assert reconstruct_assistant_text([json.dumps(e).encode() for e in events]) == text


def test_full_messages_per_segment_are_joined_and_a_repeat_is_ignored() -> None:
    """Without partial output the CLI sends one full message per segment: they add up; a repeated
    one (or a cumulative one) does not add the text again."""
    first, second = "I'll run the tests.", "They pass."
    assert reconstruct_assistant_text([_assistant(first), _assistant(second)]) == first + second
    assert reconstruct_assistant_text([_assistant(first), _assistant(second), _assistant(second)]) == first + second
    assert reconstruct_assistant_text([_assistant(first), _assistant(first + "\n\n" + second)]) == \
        first + "\n\n" + second
