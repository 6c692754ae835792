"""A small OpenAI-compatible bridge with one injectable fault per bridge finding (tests only).

``python fault_bridge.py --port P --upstream URL --ca-file CA --fault F`` serves streamed
``POST /v1/chat/completions`` on 127.0.0.1:P over plain HTTP/1.1 (one request per connection), and
runs each request as an agent turn with workbench's own client (through ``HTTPS_PROXY`` when set,
so a capture sees both sides). Without a fault it translates faithfully; each fault breaks the
translation the way a real bridge did (the seeds of issue 25):

- ``concat_args``: tool-call arguments sent twice, one after the other (snapshots appended);
- ``drop_key``: the arguments lose their first key;
- ``drop_text``: no text_delta reaches the client (the answer stays on the agent side);
- ``lose_tool_result``: a follow-up's tool results are left out of the run it starts;
- ``hang_after_tool``: a tool call is held back while the run heartbeats, then handed over;
- ``stop_on_tool``: a tool call ends the answer with ``finish_reason: stop`` and no call;
- ``close_early``: the client's stream is finished after the first text while the run goes on;
- ``end_late``: the client's stream is finished two seconds after the run's turn ended;
- ``mask_error``: a service error becomes an empty ``stop`` answer;
- ``leave_open``: a tool call is handed over and its run left open (heartbeating) for three more
  seconds before the bridge closes it (a stateless bridge that forgets to cancel the run it left);
- ``first_tool``: the client's tools are not passed to the run, and the agent's own (built-in) tool
  call is handed out under the name of the client's first tool, with the agent's arguments;
- ``retry_5xx``: the first attempt of a body runs until the run's checkpoint, then answers HTTP 503;
  the client's retry of the same body resumes that conversation and checkpoint in a fresh agent
  client, without the blobs the first attempt's client was given.

Without a fault (and under each), the bridge is stateless: a follow-up with tool results starts a
fresh run with the whole history flattened into its prompt (the run it left was closed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import socket
import time
import uuid
from typing import Any

from workbench.client.agent import AgentClient
from workbench.client.events import Checkpoint, Error, ExecRequest, TextDelta, TurnEnded
from workbench.proxy import mapping

FAULTS = ("none", "concat_args", "drop_key", "drop_text", "lose_tool_result", "hang_after_tool", "stop_on_tool",
          "close_early", "end_late", "mask_error", "leave_open", "retry_5xx", "first_tool")
HOLD_S = 2.5
LEAVE_S = 3.0


class Bridge:
    def __init__(self, upstream: str, ca: str, fault: str) -> None:
        self.upstream, self.ca, self.fault = upstream, ca, fault
        self.token = os.environ.get("CURSOR_ACCESS_TOKEN", "t")
        self.left: set[asyncio.Task[None]] = set()       # leave_open: runs closed later
        self.failed: dict[str, tuple[str, bytes | None]] = {}   # retry_5xx: body hash → (conversation, checkpoint)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if method != "POST" or not path.endswith("/chat/completions"):
                await self._send(writer, 404, {"error": {"message": f"no route {method} {path}"}})
                return
            if self.fault == "retry_5xx" and await self.fail_first_attempt(body, writer):
                return
            await self.chat(json.loads(body), writer, self.failed.get(hashlib.sha256(body).hexdigest()))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()
                await writer.wait_closed()

    async def _send(self, writer: asyncio.StreamWriter, status: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
                     "connection: close\r\n\r\n".encode() + data)
        await writer.drain()

    async def fail_first_attempt(self, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """retry_5xx: the first attempt of a body runs until its checkpoint, then the client gets a 503."""
        key = hashlib.sha256(body).hexdigest()
        if key in self.failed:
            return False
        req = json.loads(body)
        client = AgentClient(self.upstream, self.token, verify=self.ca)
        try:
            async for ev in client.stream_turn(mapping.flatten_messages(req.get("messages") or []), "default",
                                               mapping.tools_to_mcp(req.get("tools") or [])):
                if isinstance(ev, Checkpoint | TurnEnded | Error):
                    break
            self.failed[key] = (client.conversation_id or "", client.checkpoint)
        finally:
            await client.aclose()  # (its blobs go with it)
        await self._send(writer, 503, {"error": {"message": "upstream hiccup", "type": "server_error"}})
        return True

    async def _close_later(self, client: AgentClient, events: Any) -> None:
        await asyncio.sleep(LEAVE_S)
        with contextlib.suppress(Exception):
            await events.aclose()
        await client.aclose()

    async def chat(self, req: dict[str, Any], writer: asyncio.StreamWriter,
                   resume: tuple[str, bytes | None] | None = None) -> None:
        messages = req.get("messages") or []
        tools = req.get("tools") or []
        if self.fault == "lose_tool_result":
            messages = [m for m in messages if m.get("role") == "user"][-1:]
        prompt = mapping.flatten_messages(messages)
        offered = mapping.offered_schemas(tools)
        cid = "chatcmpl-" + uuid.uuid4().hex
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
                     b"connection: close\r\n\r\n")

        async def event(delta: dict[str, Any], finish: str | None = None) -> None:
            doc = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": "default",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            writer.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
            await writer.drain()

        async def finish(reason: str) -> None:
            await event({}, reason)
            writer.write(b"data: [DONE]\n\n")
            await writer.drain()

        await event({"role": "assistant", "content": ""})
        client = AgentClient(self.upstream, self.token, verify=self.ca)
        if resume is not None:  # retry_5xx: the failed attempt's conversation, in a fresh client
            client.conversation_id, client.checkpoint = resume
        done = keep = False
        events = client.stream_turn(prompt, "default", [] if self.fault == "first_tool" else mapping.tools_to_mcp(tools))
        try:
            async for ev in events:
                if isinstance(ev, TextDelta):
                    if done or self.fault == "drop_text":
                        continue
                    await event({"content": ev.text})
                    if self.fault == "close_early":
                        await finish("stop")
                        writer.close()
                        done = True
                elif isinstance(ev, ExecRequest):
                    if self.fault == "stop_on_tool":
                        await finish("stop")
                        return
                    if self.fault == "hang_after_tool":
                        await asyncio.sleep(HOLD_S)  # the run heartbeats meanwhile; the client hears nothing
                    name, args = mapping.exec_to_tool_call(ev, offered)
                    if self.fault == "first_tool" and tools:
                        name = str(tools[0]["function"]["name"])  # args stay the agent's own
                        args = mapping.exec_to_tool_call(ev)[1]
                    if self.fault == "concat_args":
                        args = args + args
                    elif self.fault == "drop_key":
                        doc = json.loads(args)
                        doc.pop(next(iter(doc)), None)
                        args = json.dumps(doc)
                    await event({"tool_calls": [{"index": 0, "id": mapping.openai_call_id(ev), "type": "function",
                                                 "function": {"name": name, "arguments": args}}]})
                    await finish("tool_calls")
                    keep = self.fault == "leave_open"
                    return
                elif isinstance(ev, TurnEnded):
                    if self.fault == "end_late":
                        await asyncio.sleep(HOLD_S)
                    if not done:
                        await finish("stop")
                    return
                elif isinstance(ev, Error):
                    if self.fault == "mask_error":
                        await finish("stop")
                    else:
                        writer.write(b"data: " + json.dumps({"error": {"message": ev.message, "code": ev.code}}).encode()
                                     + b"\n\n")
                        await writer.drain()
                    return
            if not done:
                await finish("stop")
        finally:
            if keep:  # the run stays open (heartbeating) after the client got its tool call
                task = asyncio.create_task(self._close_later(client, events))
                self.left.add(task)
                task.add_done_callback(self.left.discard)
            else:
                await client.aclose()


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--fd", type=int, help="serve on this inherited listening socket (bound to --port)")
    p.add_argument("--upstream", required=True)
    p.add_argument("--ca-file", required=True)
    p.add_argument("--fault", choices=FAULTS, default="none")
    args = p.parse_args()
    bridge = Bridge(args.upstream, args.ca_file, args.fault)
    if args.fd is not None:  # the test bound the port and holds it for us: no other process can take it meanwhile
        server = await asyncio.start_server(bridge.handle, sock=socket.socket(fileno=args.fd))
    else:
        server = await asyncio.start_server(bridge.handle, "127.0.0.1", args.port)
    print(f"http://127.0.0.1:{args.port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
