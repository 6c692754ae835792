"""``cursor-agent --output-format stream-json``: the event model, for every reader of it.

One JSON object per line. What the code relies on (docs/protocol.md §8):

- **kind**: ``type`` and ``subtype`` joined with a dot (``system.init``, ``tool_call.started``,
  ``result.success``), or ``type`` alone (``assistant``, ``user``); ``untyped`` when ``type`` is
  missing.
- **assistant forms**: with partial output on, the CLI sends the same words several ways. An event
  with ``timestamp_ms`` and no ``model_call_id`` is a *delta* (new text only); with both it is a
  *snapshot* (the segment streamed since the previous snapshot, again); without ``timestamp_ms`` it
  is the *full* cumulative message. Without partial output there is one full message per segment.
  ``reconstruct_assistant_text`` is what a correct consumer shows; ``naive_assistant_text`` what
  concatenating every assistant event shows (text repeated).
- **tool calls**: ``tool_call.started`` / ``tool_call.completed`` share a ``call_id``; the call is
  ``tool_call.<camelName>ToolCall{args, result}`` (``result`` is ``{"success": …}`` or another
  member naming the failure), or a ``{"function": {name, arguments}}`` shape.
- **result**: ``result.success`` ends a session well unless ``is_error``; any other result is an
  error (``error.message``, else ``result``); a session without a result event is incomplete.

The importer (``workbench.ingest.ndjson``) turns lines into frames with these functions; analysis
(``workbench.analysis.ndjson``) reads stored events with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.nesting import load_json

DELTA, SNAPSHOT, FULL = "delta", "snapshot", "full"


def parse_event(data: bytes | str | None) -> JsonObject | None:
    """One line (or stored payload) as an event object; None when it is not a JSON object."""
    if not data:
        return None
    try:
        ev = load_json(data)
    except ValueError:  # not JSON, not UTF-8, or nested past the limit every reader shares
        return None
    return ev if isinstance(ev, dict) else None


def event_kind(ev: JsonObject) -> str:
    t = ev.get("type")
    kind = t if isinstance(t, str) and t else "untyped"
    sub = ev.get("subtype")
    if isinstance(sub, str) and sub:
        kind += "." + sub
    return kind


def call_id_of(ev: JsonObject) -> str | None:
    """The ``call_id`` joining a tool call's started and completed events (None when absent)."""
    call_id = ev.get("call_id")
    return call_id if isinstance(call_id, str) else None


def text_field(ev: JsonObject, name: str) -> str | None:
    """A string-valued top-level field (``session_id``, ``request_id``, …); None when absent or not text."""
    value = ev.get(name)
    return value if isinstance(value, str) and value else None


def timestamp_us(ev: JsonObject) -> int | None:
    """``timestamp_ms`` in microseconds (None when absent, not a number, not positive, infinite or
    past year 9999, which no datetime holds: a time the store's readers could not show)."""
    try:
        ms = float(ev.get("timestamp_ms"))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return int(ms * 1000) if 0 < ms <= _MAX_MS else None


_MAX_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999 UTC


def message_text(ev: JsonObject) -> str:
    """The text of a user/assistant event (``message.content[].text`` joined)."""
    msg = ev.get("message")
    if isinstance(msg, str):
        return msg
    if not isinstance(msg, dict):
        return str(ev.get("text") or "")
    content = msg.get("content")
    if isinstance(content, str):
        return content
    parts = []
    if isinstance(content, list):
        for c in content:
            if isinstance(c, dict) and isinstance(c.get("text"), str):
                parts.append(c["text"])
            elif isinstance(c, str):
                parts.append(c)
    return "".join(parts)


def assistant_form(ev: JsonObject) -> str:
    """``delta`` (timestamp_ms, no model_call_id), ``snapshot`` (both) or ``full`` (no timestamp_ms)."""
    if ev.get("timestamp_ms") is None:
        return FULL
    return SNAPSHOT if ev.get("model_call_id") else DELTA


def _result_parts(result: Any) -> tuple[Any, Any]:
    """``{"success": X}`` → (X, None); any other member (error, failure, rejected…) → (None, {k: v})."""
    if not isinstance(result, dict):
        return None, (None if result is None else {"result": result})
    if "success" in result:
        return result["success"], None
    if not result:
        return None, None
    return None, result


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return load_json(value)
        except ValueError:  # not JSON, or nested past the limit: the text as it is
            return value
    return value


def tool_info(tool_call: Any) -> JsonObject | None:
    """Name, args, result and error of a ``tool_call`` object (camelCase proto3-JSON of ToolCall)."""
    if not isinstance(tool_call, dict):
        return None
    for key, value in tool_call.items():
        if key.endswith("ToolCall") and len(key) > len("ToolCall") and isinstance(value, dict):
            result, error = _result_parts(value.get("result"))
            return {"name": key[: -len("ToolCall")], "args": value.get("args"), "result": result,
                    "error": error}
    fn = tool_call.get("function")
    if isinstance(fn, dict):
        result, error = _result_parts(tool_call.get("result"))
        return {"name": fn.get("name"), "args": _maybe_json(fn.get("arguments", fn.get("args"))),
                "result": result, "error": error}
    if isinstance(tool_call.get("name"), str):
        result, error = _result_parts(tool_call.get("result"))
        return {"name": tool_call["name"], "args": _maybe_json(tool_call.get("arguments", tool_call.get("args"))),
                "result": result, "error": error}
    return None


def result_outcome(kind: str, ev: JsonObject) -> tuple[str, str | None]:
    """(status, error) a ``result`` event gives its session: ``complete`` for a successful result,
    else ``error`` with the event's message."""
    if kind == "result.success" and not ev.get("is_error"):
        return "complete", None
    err = ev.get("error")
    msg = err.get("message") if isinstance(err, dict) else err
    return "error", str(msg or ev.get("result") or kind)


def is_error_result(kind: str, ev: JsonObject) -> bool:
    """A ``result`` event that reports an error (subtype ``error``, or ``is_error``)."""
    return kind.startswith("result") and (kind == "result.error" or bool(ev.get("is_error")))


# assistant text --------------------------------------------------------------------------------

def assistant_events(events: Iterable[Any]) -> Iterable[JsonObject]:
    """The assistant events among ``events`` (objects, or lines/payloads to parse)."""
    for e in events:
        if isinstance(e, bytes | str):
            e = parse_event(e)
        if isinstance(e, dict) and e.get("type") == "assistant":
            yield e


def _squash(text: str) -> str:
    return "".join(text.split())


def naive_assistant_text(events: Iterable[Any]) -> str:
    """Every assistant event's text concatenated: what a consumer unaware of the forms shows."""
    return "".join(message_text(e) for e in assistant_events(events))


def reconstruct_assistant_text(events: Iterable[Any]) -> str:
    """The assistant text as the CLI meant it: accumulate deltas, let snapshots and full messages replace.

    A snapshot (timestamp_ms + model_call_id) repeats the segment streamed since the previous
    snapshot and replaces it. A full message (no timestamp_ms) is cumulative and replaces all
    text so far; when it is not cumulative (CLIs without partial output send one full message per
    segment) it is appended, and a repeat of text already shown is ignored.
    """
    base = ""      # settled text: full messages and closed segments
    segment = ""   # deltas since the last snapshot
    closed_last = ""  # the most recent snapshot, to drop a repeated one
    for ev in assistant_events(events):
        text = message_text(ev)
        form = assistant_form(ev)
        if form == DELTA:
            segment += text
        elif form == SNAPSHOT:
            if not segment and text == closed_last:
                continue
            base += text
            segment = ""
            closed_last = text
        else:
            shown = base + segment
            if not shown or _squash(text).startswith(_squash(shown)):
                base = text  # cumulative (segments may be joined with blank lines)
            elif _squash(shown).endswith(_squash(text)):
                base = shown
            else:
                base = shown + text
            segment = ""
            closed_last = ""
    return base + segment


__all__ = ["DELTA", "FULL", "SNAPSHOT", "assistant_events", "assistant_form", "call_id_of", "event_kind",
           "is_error_result", "message_text", "naive_assistant_text", "parse_event", "reconstruct_assistant_text",
           "result_outcome", "text_field", "timestamp_us", "tool_info"]
