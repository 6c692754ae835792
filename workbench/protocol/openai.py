"""What an OpenAI-compatible request and its answer carry, as the join and the bridge rules read them.

One reading of ``openai.request`` bodies (chat completions and Responses) and of the answer's
frames, shared by the capture and imports (a session's model and label) and by the analysis
(``workbench.analysis.bridge``: joining the two sides of a bridge and comparing them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.nesting import load_json
from workbench.protocol import kinds
from workbench.protocol.labels import fill_label


def _obj(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _arr(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _json(data: bytes | None) -> Any:
    if not data:
        return None
    try:
        return load_json(data)
    except ValueError:  # not JSON, or nested past the limit (its frame says so): nothing to read
        return None


def _text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _key(value: Any) -> Any:
    """A tool call's index or id as a dict key: whatever JSON the sender put there."""
    return value if value is None or isinstance(value, str | int | float | bool) else json.dumps(value)[:200]


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass
class RequestFacts:
    """What one OpenAI request asks for."""

    model: str | None = None
    stream: bool = False
    last_user: str | None = None              # the newest user message's text
    tool_results: dict[str, str] = field(default_factory=dict)  # call id → the result the client sent
    tool_calls_sent: set[str] = field(default_factory=set)      # assistant tool-call ids in the history
    tool_results_last: bool = False           # the request ends with tool results (a follow-up)
    new_results: dict[str, str] = field(default_factory=dict)   # results after the last assistant turn


def request_facts(payload: bytes | None) -> RequestFacts | None:
    doc = _json(payload)
    if not isinstance(doc, dict):
        return None
    out = RequestFacts(model=str(doc["model"]) if doc.get("model") else None, stream=bool(doc.get("stream")))
    items = doc.get("messages") if isinstance(doc.get("messages"), list) else doc.get("input")
    if isinstance(items, str):
        out.last_user = items
        return out
    if not isinstance(items, list):
        return out
    for m in items:
        if not isinstance(m, dict):
            continue
        role, typ = m.get("role"), m.get("type")
        if role == "user":
            out.last_user = _text(m.get("content"))
            out.tool_results_last = False
            out.new_results = {}
        elif role == "tool" and m.get("tool_call_id"):
            out.tool_results[str(m["tool_call_id"])] = out.new_results[str(m["tool_call_id"])] = _text(m.get("content"))
            out.tool_results_last = True
        elif typ == "function_call_output" and m.get("call_id"):
            out.tool_results[str(m["call_id"])] = out.new_results[str(m["call_id"])] = _text(m.get("output"))
            out.tool_results_last = True
        elif role == "assistant":
            out.new_results = {}
            for c in _arr(m.get("tool_calls")):
                if isinstance(c, dict) and c.get("id"):
                    out.tool_calls_sent.add(str(c["id"]))
        elif typ == "function_call" and m.get("call_id"):
            out.tool_calls_sent.add(str(m["call_id"]))
    return out


def fill_openai_session(info: Any, payload: bytes | None) -> None:
    """A session's model and label from its ``openai.request`` (already redacted)."""
    facts = request_facts(payload)
    if facts is None:
        return
    if facts.model:
        info.model = facts.model
    if facts.last_user:
        fill_label(info, prompt=facts.last_user)


@dataclass
class ClientCall:
    """A tool call as the OpenAI client received it (arguments concatenated from the deltas)."""

    call_id: str
    name: str | None
    arguments: str
    seqs: list[int]


@dataclass
class AnswerFacts:
    """What the OpenAI client received, from the answer frames (seq, ts_us, kind, payload)."""

    text: str = ""
    text_seqs: list[int] = field(default_factory=list)
    calls: list[ClientCall] = field(default_factory=list)
    finish_reason: str | None = None
    finish_seq: int | None = None
    error: str | None = None
    error_seq: int | None = None
    first_answer_ts: int | None = None        # the first frame that brought content/tool calls
    done: bool = False


def answer_facts(frames: Iterable[tuple[int, int, str, bytes | None]]) -> AnswerFacts:
    out = AnswerFacts()
    by_index: dict[Any, ClientCall] = {}
    for seq, ts, kind, payload in frames:
        if kind in kinds.OPENAI_ANSWER and out.first_answer_ts is None and kind != kinds.OPENAI_REASONING:
            out.first_answer_ts = ts
        if kind == kinds.OPENAI_DONE:
            out.done = True
            continue
        doc = _json(payload)
        if not isinstance(doc, dict):
            continue
        if kind == kinds.OPENAI_ERROR:
            err = doc.get("error") or _obj(doc.get("response")).get("error") or doc
            out.error = json.dumps(err)[:300] if not isinstance(err, str) else err
            out.error_seq = seq
            continue
        if "choices" in doc:
            _chat(doc, seq, out, by_index)
        elif doc.get("type"):
            _responses(doc, seq, out, by_index)
        elif doc.get("object") == "response":  # a whole Responses answer: as its completed event says it
            for item in _arr(doc.get("output")):
                if isinstance(item, dict) and item.get("type") == "function_call":
                    _responses({"type": "response.output_item.done", "item": item}, seq, out, by_index)
            _responses({"type": "response.completed" if doc.get("status") != "incomplete" else "response.incomplete",
                        "response": doc}, seq, out, by_index)
            if out.text:
                out.text_seqs.append(seq)
    out.calls = list(by_index.values())
    return out


def _call(by_index: dict[Any, ClientCall], key: Any, call_id: str | None) -> ClientCall:
    c = by_index.get(key)
    if c is None:
        c = by_index[key] = ClientCall(call_id or "", None, "", [])
    elif call_id and not c.call_id:
        c.call_id = call_id
    return c


def _chat(doc: dict[str, Any], seq: int, out: AnswerFacts, by_index: dict[Any, ClientCall]) -> None:
    for choice in _arr(doc.get("choices")):
        if not isinstance(choice, dict) or choice.get("index", 0) != 0:
            continue
        msg = choice.get("delta") if isinstance(choice.get("delta"), dict) else choice.get("message")
        msg = msg if isinstance(msg, dict) else {}
        if isinstance(msg.get("content"), str) and msg["content"]:
            out.text += msg["content"]
            out.text_seqs.append(seq)
        for i, tc in enumerate(_arr(msg.get("tool_calls"))):
            if not isinstance(tc, dict):
                continue
            c = _call(by_index, _key(tc.get("index", i)), _str(tc.get("id")))
            fn = _obj(tc.get("function"))
            c.name = c.name or _str(fn.get("name"))
            if isinstance(fn.get("arguments"), str):
                c.arguments += fn["arguments"]
            c.seqs.append(seq)
        if choice.get("finish_reason"):
            out.finish_reason, out.finish_seq = str(choice["finish_reason"]), seq


def _responses(doc: dict[str, Any], seq: int, out: AnswerFacts, by_index: dict[Any, ClientCall]) -> None:
    typ = doc["type"] if isinstance(doc.get("type"), str) else ""
    if typ == "response.output_text.delta" and isinstance(doc.get("delta"), str):
        out.text += doc["delta"]
        out.text_seqs.append(seq)
    elif typ in ("response.output_item.added", "response.output_item.done"):
        item = _obj(doc.get("item"))
        if item.get("type") == "function_call":
            c = _call(by_index, _key(item.get("id") or item.get("call_id")), _str(item.get("call_id")))
            c.name = c.name or _str(item.get("name"))
            if typ.endswith(".done") and isinstance(item.get("arguments"), str):
                c.arguments = item["arguments"]  # the final arguments (the deltas were their pieces)
            c.seqs.append(seq)
    elif typ == "response.function_call_arguments.delta":
        c = _call(by_index, _key(doc.get("item_id")), None)
        if isinstance(doc.get("delta"), str):
            c.arguments += doc["delta"]
        c.seqs.append(seq)
    elif typ in ("response.completed", "response.incomplete"):
        resp = _obj(doc.get("response"))
        has_call = any(isinstance(i, dict) and i.get("type") == "function_call" for i in _arr(resp.get("output")))
        out.finish_reason = "tool_calls" if has_call else ("stop" if typ == "response.completed" else "length")
        out.finish_seq = seq
        if not out.text:  # a whole Responses answer carried in the completed event
            out.text = "".join(p["text"] for i in _arr(resp.get("output")) if isinstance(i, dict)
                               for p in _arr(i.get("content")) if isinstance(p, dict) and isinstance(p.get("text"), str))
