"""Conversation history a stateless client sends with a fresh run, read the way a model would.

Stateless proxies (OpenAI-compatible bridges) never resume the run that handed out a tool call:
the ``role: tool`` follow-up starts a fresh run, often on a new ``conversation_id``, carrying the
whole history either

* flattened into the prompt text — role-labelled turns (``USER:``/``User:``, ``ASSISTANT:``) and
  tool results as blocks such as ``TOOL_RESULT (call_id: …):`` (our proxy, the OpenCode plugin)
  or ``[Tool result for call_…]: …`` (the seed proxy of the December 2025 notes); or
* structured, as AI-SDK ``ModelMessage`` JSON (``{"role": "tool", "content": [{"type":
  "tool-result", "toolCallId": …}]}``) in blobs the run's ``root_prompt_messages_json`` names.

``History.answered`` lists the tool results given since the last user message: the simulated
model has seen its tool calls answered and goes on after them (``resume_steps``) instead of
asking again. Nothing here trusts call ids to be ones this server handed out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Line-start labels of a flattened history. The tool-result forms carry the call id.
_LABEL = re.compile(
    r"^[ \t]*(?:"
    r"(?P<tool_result>TOOL_RESULT\s*\(\s*call_id\s*:\s*(?P<id1>[^,)\s]+)(?:\s*,\s*name\s*:\s*(?P<name1>[^)]*?))?\s*\)\s*:?)"
    r"|(?P<tool_result2>\[Tool result for (?P<id2>[^\]\s]+)\]\s*:)"
    r"|(?P<tool_result3>(?:TOOL|Tool|tool)(?:[ _](?:RESULT|Result|result))?\s*"
    r"(?:\(\s*(?:call_id|id)\s*[:=]\s*(?P<id3>[^,)\s]+)[^)\n]*\))?\s*:)"
    r"|(?P<call>ASSISTANT\s+TOOL_CALL\s*\(\s*call_id\s*:\s*(?P<call_id>[^,)\s]+)[^)\n]*\)\s*:)"
    r"|(?P<user>(?:USER|User|user|HUMAN|Human|human)\s*:)"
    r"|(?P<assistant>(?:ASSISTANT|Assistant|assistant)\b[^\n:]*:)"
    r")",
    re.MULTILINE,
)
_END_OF_HISTORY = re.compile(r"</conversation_history>|</history>")
_CALLED_TOOL = re.compile(r"\[Called tool:\s*([^\s(\]]+)")  # the seed proxy's assistant tool-call line


@dataclass(slots=True)
class ToolTurn:
    """A tool call the history shows answered."""

    call_id: str
    name: str = ""
    result: str = ""


@dataclass(slots=True)
class History:
    source: str  # "prompt" | "root_prompt_messages_json"
    answered: list[ToolTurn] = field(default_factory=list)  # since the last user message, in order
    all_results: list[ToolTurn] = field(default_factory=list)
    last_user: str | None = None

    def result_for(self, call_id: str) -> str | None:
        for t in reversed(self.all_results):
            if t.call_id == call_id:
                return t.result
        return None


@dataclass(slots=True)
class _Entry:
    role: str  # user | assistant | call | tool
    text: str
    call_id: str = ""
    name: str = ""


def _entries(text: str) -> list[_Entry]:
    end = _END_OF_HISTORY.search(text)
    body = text[:end.start()] if end else text
    matches = list(_LABEL.finditer(body))
    out: list[_Entry] = []
    for i, m in enumerate(matches):
        stop = matches[i + 1].start() if i + 1 < len(matches) else len(body)
        chunk = body[m.end():stop]
        if i + 1 == len(matches) and end is None:
            chunk = chunk.strip("\n").split("\n\n", 1)[0]  # what follows a blank line is no longer the turn
        chunk = chunk.strip()
        if m.group("user"):
            out.append(_Entry("user", chunk))
        elif m.group("call"):
            out.append(_Entry("call", chunk, m.group("call_id"), chunk.split(None, 1)[0] if chunk else ""))
        elif m.group("assistant"):
            out.append(_Entry("assistant", chunk))
            out += [_Entry("call", "", "", name) for name in _CALLED_TOOL.findall(chunk)]
        else:
            cid = m.group("id1") or m.group("id2") or m.group("id3") or ""
            out.append(_Entry("tool", chunk, cid, (m.group("name1") or "").strip()))
    return out


def _history(source: str, entries: Sequence[_Entry]) -> History | None:
    # A result without a name takes its call's: same call id, else the calls in order.
    by_id = {e.call_id: e.name for e in entries if e.role == "call" and e.call_id}
    in_order = [e.name for e in entries if e.role == "call"]
    named: list[tuple[int, ToolTurn]] = []
    for i, e in enumerate(entries):
        if e.role == "tool":
            k = len(named)
            name = e.name or by_id.get(e.call_id) or (in_order[k] if k < len(in_order) else "")
            named.append((i, ToolTurn(e.call_id, name, e.text)))
    if not named:
        return None
    users = [i for i, e in enumerate(entries) if e.role == "user"]
    after = users[-1] + 1 if users else 0
    answered = [t for i, t in named if i >= after]
    return History(source, answered, [t for _, t in named], entries[users[-1]].text if users else None)


def from_prompt(text: str) -> History | None:
    """The history flattened into a prompt, or None when the text carries no tool result."""
    if not text:
        return None
    return _history("prompt", _entries(text))


def _part_text(value: Any) -> str:
    """A tool result's output in any of the AI SDK's shapes (string, {type, value}, parts, JSON)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        if "value" in value:
            return _part_text(value["value"])
        if "text" in value:
            return str(value["text"])
    if isinstance(value, list):
        return "\n".join(_part_text(v) for v in value)
    return json.dumps(value, ensure_ascii=False) if value is not None else ""


def from_messages(messages: Iterable[Any]) -> History | None:
    """Structured history: AI-SDK ModelMessages (or OpenAI chat messages) as parsed JSON."""
    entries: list[_Entry] = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = m.get("role")
        content = m.get("content")
        if role == "user":
            entries.append(_Entry("user", _part_text(content if isinstance(content, str) else [
                p for p in content or [] if isinstance(p, Mapping) and p.get("type") == "text"])))
        elif role == "assistant":
            entries.append(_Entry("assistant", ""))
            for p in content if isinstance(content, list) else []:
                if isinstance(p, Mapping) and p.get("type") == "tool-call":
                    entries.append(_Entry("call", "", str(p.get("toolCallId", "")), str(p.get("toolName", ""))))
            for c in m.get("tool_calls") or []:  # OpenAI shape
                if isinstance(c, Mapping):
                    fn = c.get("function")
                    fn = fn if isinstance(fn, Mapping) else {}
                    entries.append(_Entry("call", "", str(c.get("id", "")), str(fn.get("name", ""))))
        elif role == "tool":
            if isinstance(content, list):
                for p in content:
                    if isinstance(p, Mapping) and p.get("type") == "tool-result":
                        entries.append(_Entry("tool", _part_text(p.get("output", p.get("result"))),
                                              str(p.get("toolCallId", "")), str(p.get("toolName", ""))))
            else:  # OpenAI shape: {"role": "tool", "tool_call_id": …, "content": "…"}
                entries.append(_Entry("tool", _part_text(content), str(m.get("tool_call_id", ""))))
    return _history("root_prompt_messages_json", entries)


def messages_in_blob(data: bytes) -> list[Any]:
    """The JSON message(s) one root-prompt blob holds ([] when it is not JSON)."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return []
    return doc if isinstance(doc, list) else [doc]


def result_in_text(prompt: str, call_id: str) -> str:
    """The result a flattened history gives for ``call_id`` (labelled block, else the text after
    the last mention of the id up to a blank line)."""
    hist = from_prompt(prompt)
    found = hist.result_for(call_id) if hist is not None else None
    if found:
        return found
    at = prompt.rfind(call_id)
    nl = prompt.find("\n", at) if at >= 0 else -1
    block = prompt[nl + 1:].split("\n\n", 1)[0].strip() if nl >= 0 else ""
    return block or "(the result is not in the prompt)"


def default_prelude(steps: Sequence[Mapping[str, Any]]) -> int:
    """How many leading steps a resumed run replays: the KV set-up (kv_set / kv_get) before the turn."""
    n = 0
    for step in steps:
        if next(iter(step)) not in ("kv_set", "kv_get"):
            break
        n += 1
    return n


def resume_steps(steps: list[dict[str, Any]], answered: int, prelude: int | None) -> list[dict[str, Any]] | None:
    """The steps of a fresh run whose history answered ``answered`` tool calls of this turn.

    The prelude, then the scenario from the ``answered``-th tool step's ``resume_at`` (default: the
    step after it); more answers than tool steps resume after the last one. None: nothing to resume.
    """
    tools = [i for i, s in enumerate(steps) if next(iter(s)) == "tool"]
    if answered <= 0 or not tools:
        return None
    at_tool = tools[min(answered, len(tools)) - 1]
    resume_at = int(steps[at_tool]["tool"].get("resume_at", at_tool + 1))
    pre = default_prelude(steps) if prelude is None else prelude
    return steps[:pre] + steps[resume_at:]
