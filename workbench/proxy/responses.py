"""The OpenAI Responses API (``POST /v1/responses``) on top of the proxy's chat mapping.

A Responses request is turned into the chat-completions shape the rest of the proxy already
speaks (``to_chat``): ``instructions`` and system/developer items become rules, messages keep
their role, ``function_call`` items become an assistant's ``tool_calls`` and
``function_call_output`` items become ``role: "tool"`` results; function tools are rewritten to
chat tools. So a tool round trip takes the same path as in chat completions: a fresh run on the
conversation the call came from, the whole history flattened into the prompt.

``ResponsesWriter`` writes the answer: one ``response`` object, or (``stream: true``) the typed
SSE events the SDK parses (``response.created`` … ``response.output_text.delta`` …
``response.function_call_arguments.done`` … ``response.completed``, or ``response.failed``).
Like the chat responder it chooses the HTTP status lazily, so an upstream error before the first
token is an HTTP error the SDK raises (``NotFoundError`` for an unknown model), not a 200 stream.

``previous_response_id`` works for responses this proxy made since it started (kept in memory,
the newest ``_KEPT`` of them): their input and output are prepended to the new input.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.proxy.mapping import MappingError, content_text
from workbench.proxy.sse import SseStream, send_json
from workbench.transport import Exchange

_KEPT = 1024


class ResponseStore:
    """Response id → the chat-shaped history it ended with (for ``previous_response_id``)."""

    def __init__(self, keep: int = _KEPT) -> None:
        self.keep = keep
        self._items: OrderedDict[str, list[JsonObject]] = OrderedDict()

    def get(self, response_id: str) -> list[JsonObject] | None:
        return self._items.get(response_id)

    def put(self, response_id: str, messages: list[JsonObject]) -> None:
        self._items[response_id] = messages
        while len(self._items) > self.keep:
            self._items.popitem(last=False)


def tools_to_chat(tools: Any) -> list[JsonObject]:
    """Responses function tools (``{"type": "function", "name", "parameters"}``) → chat tools."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise MappingError("tools must be a list")
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function" or not tool.get("name"):
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise MappingError(f"tools[{i}]: only function tools ({{\"type\": \"function\", \"name\": …}}) are "
                               f"supported, not {kind!r}")
        out.append({"type": "function", "function": {
            "name": str(tool["name"]), "description": str(tool.get("description") or ""),
            "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}})
    return out


def input_to_messages(items: Any) -> list[JsonObject]:
    """Responses ``input`` (a string or a list of items) → chat messages."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise MappingError("input must be a string or a non-empty list of items")
    out: list[JsonObject] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise MappingError(f"input[{i}] must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise MappingError(f"input[{i}]: role must be user, assistant, system or developer")
            out.append({"role": role, "content": content_text(item.get("content"))})
        elif kind == "function_call":
            if not item.get("call_id") or not item.get("name"):
                raise MappingError(f"input[{i}]: a function_call needs call_id and name")
            call = {"id": str(item["call_id"]), "type": "function",
                    "function": {"name": str(item["name"]), "arguments": str(item.get("arguments") or "")}}
            if out and out[-1]["role"] == "assistant" and not out[-1].get("content") and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not item.get("call_id"):
                raise MappingError(f"input[{i}]: a function_call_output needs call_id")
            output = item.get("output")
            out.append({"role": "tool", "tool_call_id": str(item["call_id"]),
                        "content": output if isinstance(output, str) else content_text(output)})
        elif kind == "reasoning":
            continue  # the model's own summary of an earlier turn: not part of the prompt
        else:
            raise MappingError(f"input[{i}]: item type {kind!r} is not supported (message, function_call, "
                               "function_call_output)")
    return out


def to_chat(req: Mapping[str, Any], store: ResponseStore) -> tuple[list[JsonObject], list[JsonObject]]:
    """(chat messages, chat tools) for a Responses request; raises MappingError naming the field."""
    messages: list[JsonObject] = []
    prev = req.get("previous_response_id")
    if prev:
        earlier = store.get(str(prev))
        if earlier is None:
            raise MappingError(f"previous_response_id {prev!r} is not known to this proxy (it keeps the last "
                               f"{store.keep} responses it made since it started, in memory)")
        messages += [dict(m) for m in earlier if m.get("role") not in ("system", "developer")]
    if "input" not in req:
        raise MappingError("input is required")
    messages += input_to_messages(req.get("input"))
    instructions = req.get("instructions")
    if instructions:
        messages.insert(0, {"role": "system", "content": str(instructions)})
    return messages, tools_to_chat(req.get("tools"))


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    doc = {"type": kind, "sequence_number": seq, **fields}
    return (f"event: {kind}\ndata: ".encode() + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
            + b"\n\n")


class ResponsesWriter:
    """Writes one Responses answer (whole or streamed); same interface as the chat responder."""

    def __init__(self, ex: Exchange, model: str, stream: bool, req: Mapping[str, Any]) -> None:
        self.ex = ex
        self.model = model
        self.stream = stream
        self.req = req
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.sse = SseStream(ex)
        self.seq = 0
        self.output: list[JsonObject] = []
        self.open: JsonObject | None = None  # the message or reasoning item being streamed
        self.usage: JsonObject | None = None

    # the response object -----------------------------------------------------------------------

    def response(self, status: str, error: JsonObject | None = None) -> JsonObject:
        return {"id": self.id, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": self.output, "output_text": self.text(),
                "parallel_tool_calls": True, "tool_choice": self.req.get("tool_choice") or "auto",
                "tools": self.req.get("tools") or [], "instructions": self.req.get("instructions"),
                "previous_response_id": self.req.get("previous_response_id"), "error": error,
                "incomplete_details": None, "metadata": self.req.get("metadata") or {}, "temperature": None,
                "top_p": None, "text": {"format": {"type": "text"}}, "store": True, "usage": self.usage}

    def text(self) -> str:
        return "".join(part["text"] for item in self.output if item["type"] == "message"
                       for part in item["content"] if part["type"] == "output_text")

    def history(self) -> list[JsonObject]:
        """This response's output as chat messages (for the next ``previous_response_id``)."""
        out: list[JsonObject] = []
        for item in self.output:
            if item["type"] == "message":
                out.append({"role": "assistant", "content": self.text_of(item)})
            elif item["type"] == "function_call":
                out.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": item["call_id"], "type": "function",
                     "function": {"name": item["name"], "arguments": item["arguments"]}}]})
        return out

    @staticmethod
    def text_of(item: Mapping[str, Any]) -> str:
        return "".join(p["text"] for p in item["content"] if p["type"] == "output_text")

    # streaming ---------------------------------------------------------------------------------

    def _ev(self, kind: str, **fields: Any) -> bytes:
        head = b""
        if self.seq == 0:  # the first event of the stream: announce the response, numbered first
            empty = {**self.response("in_progress"), "output": [], "output_text": ""}
            head = _event("response.created", 0, response=empty)
            head += _event("response.in_progress", 1, response=empty)
            self.seq = 2
        data = _event(kind, self.seq, **fields)
        self.seq += 1
        return head + data

    def _close_open(self) -> bytes:
        item, self.open = self.open, None
        if item is None:
            return b""
        index = self.output.index(item)
        item["status"] = "completed"
        if not self.stream:
            return b""
        if item["type"] == "message":
            part = item["content"][0]
            return (self._ev("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                             text=part["text"], logprobs=[])
                    + self._ev("response.content_part.done", item_id=item["id"], output_index=index,
                               content_index=0, part=part)
                    + self._ev("response.output_item.done", output_index=index, item=item))
        summary = item["summary"][0]
        return (self._ev("response.reasoning_summary_text.done", item_id=item["id"], output_index=index,
                         summary_index=0, text=summary["text"])
                + self._ev("response.reasoning_summary_part.done", item_id=item["id"], output_index=index,
                           summary_index=0, part=summary)
                + self._ev("response.output_item.done", output_index=index, item=item))

    def _open(self, kind: str) -> tuple[JsonObject, bytes]:
        if self.open is not None and self.open["type"] == kind:
            return self.open, b""
        out = self._close_open()
        if kind == "message":
            item: JsonObject = {"type": "message", "id": "msg_" + uuid.uuid4().hex, "status": "in_progress",
                                    "role": "assistant", "content": [{"type": "output_text", "text": "",
                                                                      "annotations": []}]}
        else:
            item = {"type": "reasoning", "id": "rs_" + uuid.uuid4().hex, "status": "in_progress",
                    "summary": [{"type": "summary_text", "text": ""}]}
        self.output.append(item)
        self.open = item
        if self.stream:
            index = len(self.output) - 1
            shown = {**item, "content": []} if kind == "message" else {**item, "summary": []}
            out += self._ev("response.output_item.added", output_index=index, item=shown)
            if kind == "message":
                out += self._ev("response.content_part.added", item_id=item["id"], output_index=index,
                                content_index=0, part={"type": "output_text", "text": "", "annotations": []})
            else:
                out += self._ev("response.reasoning_summary_part.added", item_id=item["id"], output_index=index,
                                summary_index=0, part={"type": "summary_text", "text": ""})
        return item, out

    async def add_text(self, text: str) -> None:
        item, out = self._open("message")
        item["content"][0]["text"] += text
        if self.stream:
            await self.sse.send(out + self._ev("response.output_text.delta", item_id=item["id"],
                                            output_index=self.output.index(item), content_index=0, delta=text,
                                            logprobs=[]))

    async def add_reasoning(self, text: str) -> None:
        item, out = self._open("reasoning")
        item["summary"][0]["text"] += text
        if self.stream:
            await self.sse.send(out + self._ev("response.reasoning_summary_text.delta", item_id=item["id"],
                                            output_index=self.output.index(item), summary_index=0, delta=text))

    async def add_tool_call(self, call_id: str, name: str, arguments: str) -> None:
        out = self._close_open()
        item = {"type": "function_call", "id": "fc_" + uuid.uuid4().hex, "call_id": call_id, "name": name,
                "arguments": arguments, "status": "completed"}
        self.output.append(item)
        if not self.stream:
            return
        index = len(self.output) - 1
        out += self._ev("response.output_item.added", output_index=index,
                        item={**item, "arguments": "", "status": "in_progress"})
        out += self._ev("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                        delta=arguments)
        out += self._ev("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                        name=name, arguments=arguments)
        out += self._ev("response.output_item.done", output_index=index, item=item)
        await self.sse.send(out)

    async def finish(self, reason: str, usage: Mapping[str, int]) -> None:
        out = self._close_open()
        self.usage = {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                      "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}
        if self.stream:
            await self.sse.send(out + self._ev("response.completed", response=self.response("completed")), last=True)
            return
        await send_json(self.ex, 200, self.response("completed"))

    async def fail(self, status: int, body: JsonObject) -> None:
        if not self.sse.started:
            await send_json(self.ex, status, body)
            return
        # Mid-stream, as the Responses API reports it: the response, failed, with its error.
        out = self._close_open()
        await self.sse.send(out + self._ev("response.failed", response=self.response("failed", body.get("error"))),
                         last=True)


def history_after(messages: Sequence[Mapping[str, Any]], writer: ResponsesWriter) -> list[JsonObject]:
    """The conversation a finished response leaves for ``previous_response_id``."""
    return [dict(m) for m in messages] + writer.history()
