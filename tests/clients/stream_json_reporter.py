"""A turn of our client reported the way ``cursor-agent -p --output-format stream-json
--stream-partial-output`` reports one (docs/protocol.md §8), for the stream-json source of the
healthy-traffic matrix.

The CLI is a client of the same service: it reads the agent stream and prints NDJSON events. This
module does the same from the events our client saw in a real turn (``TurnResult.events``), in the
CLI's forms: ``system.init``, the ``user`` prompt, ``thinking`` deltas then ``completed``, the
assistant text as increments (``timestamp_ms``, no ``model_call_id``), a snapshot of each segment
(``timestamp_ms`` and ``model_call_id``) when a tool call or the end closes it, ``tool_call``
``started``/``completed`` (``<camelName>ToolCall {args, result}``), then the whole message
without ``timestamp_ms`` and the ``result`` event (``success`` with the final text, or ``error``
with ``{message, code}`` and ``is_error``). The events carry no time of their own, so
``timestamp_ms`` is spread evenly between the turn's start and end.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workbench.client.events import (
    Error,
    ExecHandled,
    ExecRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    TurnResult,
)


def camel_tool_key(kind: str, name: str) -> str:
    """``shell`` → ``shellToolCall``, ``web_search`` → ``webSearchToolCall`` (the CLI's nested key)."""
    base = (kind or name or "unknown").removesuffix("_tool_call").removesuffix("ToolCall")
    head, *rest = base.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest) + "ToolCall"


@dataclass
class _Report:
    session_id: str
    model_call_id: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    segment: str = ""  # assistant text since the last snapshot
    segments: list[str] = field(default_factory=list)
    thinking_open: bool = False

    def emit(self, ev: dict[str, Any], timed: bool = True) -> None:
        ev["session_id"] = self.session_id
        if timed:
            ev["timestamp_ms"] = None  # filled in once the number of events is known
        self.lines.append(ev)

    def close_thinking(self) -> None:
        if self.thinking_open:
            self.emit({"type": "thinking", "subtype": "completed", "model_call_id": self.model_call_id})
            self.thinking_open = False

    def tool_call(self, call: ToolCall, outcome: dict[str, Any]) -> None:
        self.close_segment()
        key = camel_tool_key(call.kind, call.name)
        for subtype, body in (("started", {"args": call.args}), ("completed", {"args": call.args, "result": outcome})):
            self.emit({"type": "tool_call", "subtype": subtype, "call_id": call.call_id,
                       "tool_call": {key: body, "toolCallId": call.call_id}, "model_call_id": self.model_call_id})

    def close_segment(self) -> None:
        if self.segment:
            self.emit({"type": "assistant", "message": _message(self.segment), "model_call_id": self.model_call_id})
            self.segments.append(self.segment)
            self.segment = ""


def _message(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def stream_json_lines(prompt: str, result: TurnResult, *, session_id: str, cwd: str, model: str,
                      start_ms: int, end_ms: int) -> list[str]:
    """The NDJSON lines (without newlines) the CLI prints for this turn."""
    r = _Report(session_id, f"mc_{session_id[:8]}")
    r.emit({"type": "system", "subtype": "init", "apiKeySource": "login", "cwd": cwd, "model": model,
            "permissionMode": "default"}, timed=False)
    r.emit({"type": "user", "message": {"role": "user", "content": [{"type": "text", "text": prompt}]}}, timed=False)
    # The service reports a tool call complete only after its exec was answered; the CLI prints
    # ``started`` when it starts the tool and ``completed`` when the tool is done: both at the exec.
    calls = {ev.exec_id: ev for ev in result.events if isinstance(ev, ToolCall) and ev.exec_id}
    printed: set[str] = set()
    for ev in result.events:
        if isinstance(ev, ThinkingDelta):
            r.thinking_open = True
            r.emit({"type": "thinking", "subtype": "delta", "text": ev.text, "model_call_id": r.model_call_id})
            continue
        r.close_thinking()
        if isinstance(ev, TextDelta) and ev.text:
            r.segment += ev.text
            r.emit({"type": "assistant", "message": _message(ev.text)})
        elif isinstance(ev, ExecHandled | ExecRequest) and ev.exec_id in calls:
            ok = ev.ok if isinstance(ev, ExecHandled) else True
            detail = getattr(ev, "detail", "")
            outcome = {"success": {"kind": ev.kind, "detail": detail}} if ok else {"error": {"message": detail}}
            r.tool_call(calls[ev.exec_id], outcome)
            printed.add(calls[ev.exec_id].call_id)
        elif isinstance(ev, ToolCall) and ev.call_id not in printed:
            r.tool_call(ev, {"success": {}})  # a call the client ran no exec for
    r.close_thinking()
    r.close_segment()
    final = "\n\n".join(r.segments)
    if final:
        r.emit({"type": "assistant", "message": _message(final)}, timed=False)
    usage = {"inputTokens": result.usage.context_tokens, "outputTokens": result.usage.output_tokens}
    error = result.error if isinstance(result.error, Error) else None
    if error is None:
        r.emit({"type": "result", "subtype": "success", "is_error": False, "result": final,
                "request_id": result.request_id, "usage": usage, "duration_ms": end_ms - start_ms}, timed=False)
    else:
        r.emit({"type": "result", "subtype": "error", "is_error": True, "result": final,
                "error": {"message": error.message, "code": error.code}, "request_id": result.request_id,
                "duration_ms": end_ms - start_ms}, timed=False)
    timed = [ev for ev in r.lines if "timestamp_ms" in ev]
    step = (end_ms - start_ms) / max(len(timed), 1)
    for i, ev in enumerate(timed):
        ev["timestamp_ms"] = start_ms + int(i * step) + 1
    return [json.dumps(ev, separators=(",", ":")) for ev in r.lines]
