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
- ``mask_error``: a service error becomes an empty ``stop`` answer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import time
import uuid
from typing import Any

from workbench.client.agent import AgentClient
from workbench.client.events import Error, ExecRequest, TextDelta, TurnEnded
from workbench.proxy import mapping

FAULTS = ("none", "concat_args", "drop_key", "drop_text", "lose_tool_result", "hang_after_tool", "stop_on_tool",
          "close_early", "end_late", "mask_error")
HOLD_S = 2.5


class Bridge:
    def __init__(self, upstream: str, ca: str, fault: str) -> None:
        self.upstream, self.ca, self.fault = upstream, ca, fault
        self.token = os.environ.get("CURSOR_ACCESS_TOKEN", "t")

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
            await self.chat(json.loads(body), writer)
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

    async def chat(self, req: dict[str, Any], writer: asyncio.StreamWriter) -> None:
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
        done = False
        try:
            async for ev in client.stream_turn(prompt, "default", mapping.tools_to_mcp(tools)):
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
                    if self.fault == "concat_args":
                        args = args + args
                    elif self.fault == "drop_key":
                        doc = json.loads(args)
                        doc.pop(next(iter(doc)), None)
                        args = json.dumps(doc)
                    await event({"tool_calls": [{"index": 0, "id": mapping.openai_call_id(ev), "type": "function",
                                                 "function": {"name": name, "arguments": args}}]})
                    await finish("tool_calls")
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
