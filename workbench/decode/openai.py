"""The OpenAI side of a bridge as frames: a request body, each SSE event, a whole JSON answer.

A bridge turns chat completions (or Responses) into agent runs; to say where the translation
went wrong, the capture records what the OpenAI client sent and received beside the agent
frames (issue 25, docs/bridge.md). One frame per request body (``openai.request``), per SSE event
(``openai.delta.content``, ``openai.delta.tool_calls``, ``openai.finish``, ``openai.error``,
``openai.done``, ``openai.comment`` for a ``: ping`` line, …) and per whole answer
(``openai.response``, ``openai.models``, ``openai.error``). The payload is the event's JSON as it
crossed the wire, so nothing is lost; the kind and summary say what it is.

The answer's framing is read from its bytes, not its headers: a body that starts with an SSE
field (``data:``, ``event:``, ``:``) is a stream, anything else one JSON document. A body that is
not JSON keeps its bytes with an ``error``; a request body like that is stored as a hash by the
write gate, since what cannot be parsed cannot be redacted.

Budgets (docs/bridge.md "What the OpenAI side holds"): JSON is read under the nesting limit every
reader shares (``workbench.nesting``; deeper is "not JSON" with its own error), a stream through
``SseReader`` (linear, at most the SSE event limit held; an event past it is a marker frame with
its size and SHA-256), a whole body up to ``BODY_LIMIT``; summaries, errors and call ids are cut.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from workbench.decode.frame import Frame
from workbench.decode.sse import ENV_SSE_EVENT, SseComment, SseEvent, SseItem, SseOversize, SseReader
from workbench.decode.summary import quote
from workbench.nesting import TooDeep, load_json
from workbench.protocol import kinds

# A request or whole answer past this is kept as its first bytes with an error (a bridge body is
# kilobytes; this bounds what a hostile peer can make the writer hold).
BODY_LIMIT = 64 << 20
_SSE_FIELDS = (b"data:", b"event:", b"id:", b"retry:", b":")
# What one frame's summary and error quote at most (a model name or an error type can be any size)
SUMMARY_LIMIT = 300
ERROR_LIMIT = 1000
# a call id longer than this is no id a client can use: cut (it is a column of the frame)
CALL_ID_LIMIT = 256


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _arr(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _short(text: Any, width: int = 60) -> str:
    # quoted the way the agent side's summaries are: each newline escaped once (escaping it and then
    # JSON-encoding the result escaped it twice, issue 35)
    return quote(text if isinstance(text, str) else json.dumps(text, ensure_ascii=False), width + 1)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _frame(kind: str, summary: str, data: bytes, *, error: str | None = None, call_id: Any = None) -> Frame:
    """A frame whose summary, error and call id are bounded whatever the body held."""
    if len(summary) > SUMMARY_LIMIT:
        summary = _cut(summary, SUMMARY_LIMIT)
    if error is not None and len(error) > ERROR_LIMIT:
        error = _cut(error, ERROR_LIMIT)
    return Frame(kind, summary, data, error=error, call_id=str(call_id)[:CALL_ID_LIMIT] if call_id else None)


def _doc(data: bytes) -> tuple[Any, str | None]:
    try:
        return load_json(data), None
    except TooDeep as exc:  # nested past the limit every reader shares (workbench.nesting): kept raw
        return None, str(exc)
    except ValueError as exc:  # not JSON, not UTF-8
        return None, f"not JSON: {_cut(str(exc), 200)}"


def _error_text(err: Any) -> str:
    if isinstance(err, dict):
        bits = [_cut(str(err[k]), 100) for k in ("type", "code") if err.get(k)]
        msg = err.get("message")
        return (" ".join(bits) + ": " if bits else "") + (_cut(str(msg), ERROR_LIMIT) if msg else json.dumps(err)[:200])
    return _cut(str(err), ERROR_LIMIT)


def request_frame(data: bytes) -> Frame:
    """The frame of one request body (chat completions, Responses)."""
    doc, err = _doc(data)
    if not isinstance(doc, dict):
        return _frame(kinds.OPENAI_REQUEST, "request body (not a JSON object)", data,
                      error=err or "request body is not a JSON object")
    bits = [f"model={doc.get('model')}"] if doc.get("model") else []
    if doc.get("stream"):
        bits.append("stream")
    msgs = doc.get("messages") if isinstance(doc.get("messages"), list) else doc.get("input")
    if isinstance(msgs, list):
        bits.append(f"{len(msgs)} messages")
        last = msgs[-1] if msgs else None
        if isinstance(last, dict):
            role = last.get("role") or last.get("type")
            content = last.get("content") if "content" in last else last.get("output")
            bits.append(f"last {role}: {_short(content, 40)}")
    elif isinstance(msgs, str):
        bits.append(f"input: {_short(msgs, 40)}")
    if isinstance(doc.get("tools"), list) and doc["tools"]:
        bits.append(f"{len(doc['tools'])} tools")
    return _frame(kinds.OPENAI_REQUEST, "request " + " ".join(_cut(b, 100) for b in bits), data)


def _chat_chunk(doc: dict[str, Any]) -> tuple[str, str, str | None]:
    """(kind, summary, call id) of one chat.completion.chunk."""
    choices = doc.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if choice is None:
        if doc.get("usage"):
            return kinds.OPENAI_USAGE, f"usage {json.dumps(doc['usage'])[:80]}", None
        return kinds.OPENAI_EVENT, "chunk without choices", None
    delta = _obj(choice.get("delta"))
    finish = choice.get("finish_reason")
    tail = f" finish={finish}" if finish else ""
    calls = delta.get("tool_calls")
    if isinstance(calls, list) and calls:
        first = calls[0] if isinstance(calls[0], dict) else {}
        fn = _obj(first.get("function"))
        bits = [f"[{first.get('index')}]"]
        if first.get("id"):
            bits.append(f"id={first['id']}")
        if fn.get("name"):
            bits.append(f"name={fn['name']}")
        if fn.get("arguments"):
            bits.append(f"args+={_short(fn['arguments'], 40)}")
        return kinds.OPENAI_TOOL_CALLS, "tool_calls " + " ".join(bits) + tail, first.get("id") or None
    if delta.get("content"):
        return kinds.OPENAI_CONTENT, f"content {_short(delta['content'])}{tail}", None
    reasoning = delta.get("reasoning_content") or delta.get("reasoning")
    if reasoning:
        return kinds.OPENAI_REASONING, f"reasoning {_short(reasoning)}{tail}", None
    if finish:
        return kinds.OPENAI_FINISH, f"finish {finish}", None
    if delta.get("role"):
        return kinds.OPENAI_ROLE, f"role {delta['role']}", None
    return kinds.OPENAI_EVENT, "empty delta", None


_RESPONSES_KINDS = {
    "response.output_text.delta": kinds.OPENAI_CONTENT,
    "response.function_call_arguments.delta": kinds.OPENAI_TOOL_CALLS,
    "response.function_call_arguments.done": kinds.OPENAI_TOOL_CALLS,
    "response.reasoning_summary_text.delta": kinds.OPENAI_REASONING,
    "response.reasoning_text.delta": kinds.OPENAI_REASONING,
    "response.completed": kinds.OPENAI_FINISH,
    "response.incomplete": kinds.OPENAI_FINISH,
    "response.failed": kinds.OPENAI_ERROR,
    "error": kinds.OPENAI_ERROR,
}


def _responses_event(doc: dict[str, Any], event: str | None) -> tuple[str, str, str | None]:
    typ = str(doc.get("type") or event or "")
    kind = _RESPONSES_KINDS.get(typ, kinds.OPENAI_EVENT)
    item = _obj(doc.get("item"))
    call_id = item.get("call_id") if item.get("type") == "function_call" else None
    if typ in ("response.output_item.added", "response.output_item.done") and call_id:
        kind = kinds.OPENAI_TOOL_CALLS
        return kind, f"{typ} function_call {item.get('name')} call_id={call_id}", call_id
    if kind == kinds.OPENAI_CONTENT or kind == kinds.OPENAI_REASONING:
        return kind, f"{typ} {_short(doc.get('delta', ''))}", None
    if kind == kinds.OPENAI_TOOL_CALLS:
        return kind, f"{typ} {_short(doc.get('delta', doc.get('arguments', '')), 40)}", None
    if kind == kinds.OPENAI_FINISH:
        resp = _obj(doc.get("response"))
        return kind, f"{typ} status={resp.get('status')}", None
    return kind, typ or "event", None


def event_frame(data: bytes, event: str | None = None) -> Frame:
    """The frame of one SSE event's data (its ``event:`` name, if it had one)."""
    if data.strip() == b"[DONE]":
        return _frame(kinds.OPENAI_DONE, "[DONE]", data)
    doc, err = _doc(data)
    if not isinstance(doc, dict):
        name = _cut(event, 60) if event else ""
        return _frame(kinds.OPENAI_EVENT, f"event {name} (not a JSON object)".replace("  ", " "), data,
                      error=err or "event data is not a JSON object")
    if doc.get("error") is not None and "choices" not in doc or doc.get("type") == "error":
        text = _error_text(doc.get("error", doc))
        return _frame(kinds.OPENAI_ERROR, f"error {text[:120]}", data, error=text)
    if "choices" in doc or doc.get("object") == "chat.completion.chunk":
        kind, summary, call_id = _chat_chunk(doc)
    else:
        kind, summary, call_id = _responses_event(doc, event)
    error = None
    if kind == kinds.OPENAI_ERROR:
        resp = _obj(doc.get("response"))
        error = _error_text(resp.get("error") or doc)
    return _frame(kind, summary, data, error=error, call_id=call_id)


def oversize_frame(item: SseOversize) -> Frame:
    """What stands for an SSE event (or comment line) past the SSE event limit: its size and hash.

    Its bytes were forwarded to the client whole; only the recording leaves them out (a cut JSON
    prefix could not be parsed, so neither searched for credentials nor summarised)."""
    what = "comment line" if item.comment else "event data"
    name = f" {_cut(item.event, 60)}" if item.event else ""
    doc = {"sse_over_limit": {"what": what, "event": item.event and _cut(item.event, 200), "bytes": item.size,
                              "sha256": item.sha256, "limit": item.limit}}
    kind = kinds.OPENAI_COMMENT if item.comment else kinds.OPENAI_EVENT
    return _frame(kind, f"{'comment' if item.comment else 'event' + name} over the SSE limit: {item.size:,} bytes, "
                        f"sha256 {item.sha256[:16]}", json.dumps(doc).encode(),
                  error=f"SSE {what} of {item.size:,} bytes is over the {item.limit:,}-byte limit "
                        f"({ENV_SSE_EVENT}): not stored, sha256 {item.sha256}")


def answer_frames(data: bytes) -> list[Frame]:
    """The frames of a whole (not streamed) answer body."""
    if not data.strip():
        return []
    doc, err = _doc(data)
    if not isinstance(doc, dict):
        return [_frame(kinds.OPENAI_RESPONSE, "answer (not a JSON object)", data,
                       error=err or "answer is not a JSON object")]
    if doc.get("error") is not None:
        text = _error_text(doc["error"])
        return [_frame(kinds.OPENAI_ERROR, f"error {text[:120]}", data, error=text)]
    if doc.get("object") == "list":
        items = _arr(doc.get("data"))
        return [_frame(kinds.OPENAI_MODELS, f"{len(items)} models", data)]
    bits: list[str] = []
    choices = doc.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        msg = _obj(choices[0].get("message"))
        if msg.get("content"):
            bits.append(f"content {_short(msg['content'])}")
        if msg.get("tool_calls"):
            bits.append(f"{len(msg['tool_calls'])} tool_calls")
        bits.append(f"finish={choices[0].get('finish_reason')}")
    elif isinstance(doc.get("output"), list):
        bits.append(f"{len(doc['output'])} output items status={_cut(str(doc.get('status')), 40)}")
    return [_frame(kinds.OPENAI_RESPONSE, "answer " + " ".join(bits), data)]


class OpenAIStream:
    """Incremental: the chunks of one OpenAI body (either direction) in, frames out.

    An answer that is a stream is read by ``SseReader`` (linear, at most the SSE event limit held);
    any other body is held up to ``BODY_LIMIT`` and decoded whole at ``close``."""

    __slots__ = ("direction", "_buf", "_sse", "_reader", "_total", "_hash")

    def __init__(self, direction: str, sse_limit: int | None = None) -> None:
        self.direction = direction
        self._buf = bytearray()
        self._sse: bool | None = None   # unknown until the first bytes of an answer
        self._reader = SseReader(sse_limit)
        self._total = 0
        self._hash: hashlib._Hash | None = None  # of a whole body past BODY_LIMIT

    def feed(self, chunk: bytes) -> list[Frame]:
        self._total += len(chunk)
        if self._sse is None and self.direction == "server":
            head = (bytes(self._buf) + chunk).lstrip()
            if len(head) >= 6 or head[:1] in (b"{", b"[", b":"):  # enough to tell "event:" from JSON
                self._sse = head.startswith(_SSE_FIELDS)
                chunk, self._buf = bytes(self._buf) + chunk, bytearray()
            else:
                self._buf = bytearray(head)  # (leading whitespace is dropped, however much of it comes)
                return []
        if self._sse:
            return self._frames(self._reader.feed(chunk))
        if self._hash is None and len(self._buf) + len(chunk) <= BODY_LIMIT:
            self._buf += chunk
        else:
            if self._hash is None:
                self._hash = hashlib.sha256(self._buf)
            self._hash.update(chunk)
        return []

    @staticmethod
    def _frames(items: list[SseItem]) -> list[Frame]:
        out = []
        for item in items:
            if type(item) is SseEvent:
                out.append(event_frame(item.data, item.event))
            elif type(item) is SseComment:
                text = item.line[1:SUMMARY_LIMIT].decode("utf-8", "replace").strip()
                out.append(_frame(kinds.OPENAI_COMMENT, f"comment {_short(text, 40)}", item.line))
            else:
                assert type(item) is SseOversize
                out.append(oversize_frame(item))
        return out

    def close(self) -> list[Frame]:
        if self._sse is None and self.direction == "server":
            self._sse = bytes(self._buf).lstrip().startswith(_SSE_FIELDS)
            if self._sse:
                data, self._buf = bytes(self._buf), bytearray()
                return self._frames(self._reader.feed(data) + self._reader.close())
        if self._sse:
            return self._frames(self._reader.close())
        data, self._buf = bytes(self._buf), bytearray()
        if self._hash is not None:
            kind = kinds.OPENAI_REQUEST if self.direction == "client" else kinds.OPENAI_RESPONSE
            return [_frame(kind, "body too large", data[:4096],
                           error=f"body of {self._total} bytes is over {BODY_LIMIT} bytes: first 4096 kept, "
                                 f"sha256 of the whole {self._hash.hexdigest()}")]
        if self.direction == "client":
            return [request_frame(data)] if data.strip() else []
        return answer_frames(data)


def decode_openai_body(data: bytes, direction: str) -> list[Frame]:
    """Every frame of a complete OpenAI body (imports: flow and HAR files keep whole bodies)."""
    s = OpenAIStream(direction)
    return s.feed(data) + s.close()
