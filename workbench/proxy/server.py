"""The OpenAI-compatible proxy: ``/v1/models`` and ``/v1/chat/completions`` over the agent client.

A small asyncio HTTP/1.1 server rather than an ASGI stack: the proxy's job is to add as little as
possible to time-to-first-token, so each upstream text delta is written to the socket as one SSE
chunk the moment it arrives. Every OpenAI request is a fresh run (full history flattened into the
user text, tools offered every time) — on the conversation the tool call came from, with its last
checkpoint echoed when one arrived; all runs share one warm upstream connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.client.agent import AgentClient, Connections
from workbench.client.events import Error, ExecRequest, TextDelta, ThinkingDelta, TurnEnded, Usage
from workbench.client.net import Verify, cancel_and_wait
from workbench.client.transport import list_usable_models
from workbench.proxy import mapping as M
from workbench.security.origin import AccessPolicy

log = logging.getLogger("workbench.proxy")

DEFAULT_PORT = 18741
DEFAULT_UPSTREAM = "https://api2.cursor.sh"
_MAX_BODY = 64 * 1024 * 1024
_MAX_REMEMBERED = 4096
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 413: "Payload Too Large", 429: "Too Many Requests",
            500: "Internal Server Error", 502: "Bad Gateway", 504: "Gateway Timeout"}


@dataclass
class ProxyConfig:
    token: str
    upstream: str = DEFAULT_UPSTREAM
    transport: str = "run"
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    verify: Verify = None
    faults: frozenset[str] = frozenset()
    heartbeat_budget: int | None = None
    heartbeat_interval: float = 5.0
    execute_locally: bool = False
    workspace: str | None = None
    models: list[str] = field(default_factory=list)
    framing: str = "connect"  # connect | grpc-web (mode D)
    # Who may call the proxy (Host/Origin checks, optional API key); None = loopback only, no key.
    access: AccessPolicy | None = None

    def __repr__(self) -> str:  # the token must never reach a log line
        return (f"ProxyConfig(upstream={self.upstream!r}, transport={self.transport!r}, framing={self.framing!r}, "
                f"host={self.host!r}, port={self.port}, faults={sorted(self.faults)})")


class _HttpError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _Responder:
    """Writes one chat completion, streamed (SSE) or whole; the HTTP status is chosen lazily so an
    upstream failure before the first token still becomes a proper 4xx/5xx."""

    def __init__(self, writer: asyncio.StreamWriter, model: str, stream: bool, include_usage: bool,
                 keep_alive: bool) -> None:
        self.writer = writer
        self.model = model
        self.stream = stream
        self.include_usage = include_usage
        self.keep_alive = keep_alive
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.started = False
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[dict[str, Any]] = []

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        doc = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"

    async def _write_chunked(self, data: bytes, last: bool = False) -> None:
        head = self._head()
        self.writer.write(head + b"%x\r\n%s\r\n" % (len(data), data) + (b"0\r\n\r\n" if last else b""))
        await self.writer.drain()

    def _head(self) -> bytes:
        """The status line and role chunk, sent with the first real chunk (one write, one packet)."""
        if self.started:
            return b""
        self.started = True
        role = self._chunk({"role": "assistant", "content": ""})
        return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n"
                + (b"connection: keep-alive\r\n" if self.keep_alive else b"connection: close\r\n")
                + b"\r\n" + b"%x\r\n%s\r\n" % (len(role), role))

    async def add_text(self, text: str) -> None:
        if not self.stream:
            self.text.append(text)
            return
        await self._write_chunked(self._chunk({"content": text}))

    async def add_reasoning(self, text: str) -> None:
        if not self.stream:
            self.reasoning.append(text)
            return
        await self._write_chunked(self._chunk({"reasoning_content": text}))

    async def add_tool_call(self, call_id: str, name: str, arguments: str) -> None:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        index = len(self.tool_calls)
        self.tool_calls.append(call)
        if self.stream:
            await self._write_chunked(self._chunk({"tool_calls": [{"index": index, **call}]}))

    async def finish(self, reason: str, usage: dict[str, int]) -> None:
        if self.stream:
            out = self._chunk({}, reason)
            if self.include_usage:
                doc = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model, "choices": [], "usage": usage}
                out += b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
            out += b"data: [DONE]\n\n"
            await self._write_chunked(out, last=True)
            return
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.text) if self.text or not
                                   self.tool_calls else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        doc = {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "message": message, "finish_reason": reason}], "usage": usage}
        await send_json(self.writer, 200, doc, self.keep_alive)

    async def fail(self, status: int, body: dict[str, Any]) -> None:
        if not self.started:
            await send_json(self.writer, status, body, self.keep_alive)
            return
        # Mid-stream: the OpenAI SDK raises on an SSE event carrying "error".
        data = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"
        await self._write_chunked(data, last=True)


async def send_json(writer: asyncio.StreamWriter, status: int, doc: Any, keep_alive: bool = True) -> None:
    body = json.dumps(doc, ensure_ascii=False).encode()
    writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\nconnection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
                 .encode() + body)
    await writer.drain()


def _usage(u: Usage | None, prompt: str) -> dict[str, int]:
    out_tokens = u.output_tokens if u else 0
    ctx = u.context_tokens if u else 0
    prompt_tokens = max(ctx - out_tokens, 0) if ctx else max(1, len(prompt) // 4)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": out_tokens,
            "total_tokens": prompt_tokens + out_tokens}


@dataclass
class _Parked:
    """``reuse_session`` fault: a run left open after handing out a tool call."""

    client: AgentClient
    events: AsyncIterator[Any]
    request: ExecRequest
    prompt: str


class ProxyServer:
    def __init__(self, config: ProxyConfig) -> None:
        if not config.token:
            raise ValueError("no upstream token: set CURSOR_ACCESS_TOKEN or pass --token-file")
        self.config = config
        self.connections = Connections(config.upstream, config.verify)
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()
        self._models: tuple[float, list[str]] | None = None
        self._parked: dict[str, _Parked] = {}
        # tool_call id handed out → (conversation_id, last checkpoint) of the run it came from
        self._issued: OrderedDict[str, tuple[str, bytes | None]] = OrderedDict()
        self.port = config.port
        self.access = config.access or AccessPolicy.build(config.host)

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    async def start(self) -> ProxyServer:
        self._server = await asyncio.start_server(self._on_client, self.config.host, self.config.port,
                                                  limit=1 << 20)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await cancel_and_wait(list(self._clients))
        for parked in list(self._parked.values()):
            await self._drop(parked)
        self._parked.clear()
        await self.connections.aclose()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # HTTP/1.1 ---------------------------------------------------------------------------------

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._clients.add(task)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                if len(parts) != 3:
                    await send_json(writer, 400, M.error_body("invalid_argument", "malformed request line"), False)
                    return
                method, target, version = parts
                headers: dict[str, str] = {}
                for line in lines[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                conn_hdr = headers.get("connection", "").lower()
                keep_alive = conn_hdr != "close" and (version == "HTTP/1.1" or conn_hdr == "keep-alive")
                refusal = self.access.refusal(method, headers)
                if refusal is not None:
                    # Before reading the body: a refused request gets nothing buffered, and the
                    # connection closes (its body, unread, cannot be mistaken for a next request).
                    status, why = refusal
                    log.info("refused %s %s: %s", method, target.split("?", 1)[0], why)
                    await send_json(writer, status, M.error_body(
                        "permission_denied" if status == 403 else "unauthenticated", why), False)
                    return
                try:
                    body = await self._read_body(reader, headers)
                except _HttpError as exc:
                    await send_json(writer, exc.status, M.error_body(exc.code, exc.message), False)
                    return
                except asyncio.LimitOverrunError:
                    await send_json(writer, 400, M.error_body("invalid_argument", "malformed chunked body: "
                                                              "line too long"), False)
                    return
                await self._route(method, target.split("?", 1)[0], body, writer, keep_alive)
                if not keep_alive:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        except asyncio.CancelledError:
            # close() is shutting us down; ending quietly avoids asyncio 3.11's streams callback
            # reporting the cancelled handler as an unhandled exception.
            return
        finally:
            if task is not None:
                self._clients.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_body(self, reader: asyncio.StreamReader, headers: Mapping[str, str]) -> bytes:
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = bytearray()
            while True:
                try:
                    size_line = await reader.readuntil(b"\r\n")
                except asyncio.LimitOverrunError as exc:
                    raise _HttpError(400, "invalid_argument", "malformed chunked body: chunk size line too long") from exc
                size = _hex_size(size_line.split(b";")[0].strip())
                if size == 0:
                    # trailer fields (ignored) up to the empty line
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass
                    return bytes(out)
                if len(out) + size > _MAX_BODY:
                    raise _HttpError(413, "invalid_argument", "request body too large")
                out += await reader.readexactly(size)
                if await reader.readexactly(2) != b"\r\n":
                    raise _HttpError(400, "invalid_argument", "malformed chunked body: chunk not followed by CRLF")
        raw_length = headers.get("content-length", "0").strip() or "0"
        if not raw_length.isdigit():
            raise _HttpError(400, "invalid_argument", f"bad content-length {raw_length[:40]!r}")
        length = int(raw_length)
        if length > _MAX_BODY:
            raise _HttpError(413, "invalid_argument", "request body too large")
        return await reader.readexactly(length) if length else b""

    async def _route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter,
                     keep_alive: bool) -> None:
        path = path.rstrip("/") or "/"
        if path in ("/v1/chat/completions", "/chat/completions"):
            if method != "POST":
                await send_json(writer, 405, M.error_body("invalid_argument", "use POST"), keep_alive)
                return
            await self._chat(body, writer, keep_alive)
        elif path in ("/v1/models", "/models") and method == "GET":
            await self._list_models(writer, keep_alive)
        elif path.startswith("/v1/models/") and method == "GET":
            await self._list_models(writer, keep_alive, path.split("/v1/models/", 1)[1])
        elif path in ("/", "/health") and method == "GET":
            await send_json(writer, 200, {"status": "ok", "upstream": self.config.upstream,
                                          "transport": self.config.transport, "framing": self.config.framing},
                            keep_alive)
        else:
            await send_json(writer, 404, M.error_body("not_found", f"{method} {path} is not an endpoint of "
                                                      "this proxy (try /v1/chat/completions, /v1/models)"),
                            keep_alive)

    # endpoints --------------------------------------------------------------------------------

    def _client(self) -> AgentClient:
        c = self.config
        return AgentClient(c.upstream, c.token, transport=c.transport, workspace=c.workspace,
                           execute_locally=c.execute_locally, faults=c.faults, heartbeat_budget=c.heartbeat_budget,
                           heartbeat_interval=c.heartbeat_interval, verify=c.verify, connections=self.connections,
                           framing=c.framing)

    async def _list_models(self, writer: asyncio.StreamWriter, keep_alive: bool, one: str | None = None) -> None:
        ids = list(self.config.models)
        if not ids:
            now = time.monotonic()
            if self._models is None or now - self._models[0] > 60:
                try:
                    # Either listing: agent.v1, else aiserver.v1.AiService when the first is unimplemented.
                    self._models = (now, await list_usable_models(self.connections.http(), self.config.upstream,
                                                                  self.config.token, self.config.framing))
                except Exception as exc:
                    err = _as_error(exc)
                    await send_json(writer, M.error_status(err.code), M.error_body(err.code, err.message), keep_alive)
                    return
            ids = self._models[1]
        data = [{"id": i, "object": "model", "created": 0, "owned_by": "cursor"} for i in ids]
        if one is not None:
            match = [d for d in data if d["id"] == one]
            if not match:
                await send_json(writer, 404, M.error_body("not_found", f"model {one!r} is not offered upstream"),
                                keep_alive)
                return
            await send_json(writer, 200, match[0], keep_alive)
            return
        await send_json(writer, 200, {"object": "list", "data": data}, keep_alive)

    async def _chat(self, body: bytes, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        try:
            req = json.loads(body or b"{}")
            if not isinstance(req, dict):
                raise M.MappingError("the request body must be a JSON object")
            messages = req.get("messages")
            if not isinstance(messages, list):
                raise M.MappingError("messages must be a non-empty list")
            tools = req.get("tools") or []
            defs = M.tools_to_mcp(tools)
            prompt = M.flatten_messages(messages)
        except (ValueError, M.MappingError) as exc:
            await send_json(writer, 400, M.error_body("invalid_argument", f"bad chat request: {exc}"), keep_alive)
            return
        model = str(req.get("model") or "default")
        stream = bool(req.get("stream"))
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        out = _Responder(writer, model, stream, include_usage, keep_alive)
        offered = M.offered_schemas(tools)

        parked = self._resume(messages) if "reuse_session" in self.config.faults else None
        if parked is not None:
            client, events = parked.client, parked.events
            result = next((M.content_text(m.get("content")) for m in messages
                           if m.get("role") == "tool"
                           and m.get("tool_call_id") == M.openai_call_id(parked.request)), "")
            # Same-session continuation (the bug the seeds document): answer the old exec inside
            # the still-open run instead of starting a fresh one.
            await parked.request.respond(result)
        else:
            client = self._client()
            prior = self._prior(messages)
            if prior is not None:
                # A fresh run, but on the same conversation with its last checkpoint echoed
                # (docs/protocol.md §6, §7 kv_only_response); the whole history is in the prompt either way.
                client.conversation_id, client.checkpoint = prior
            events = client.stream_turn(prompt, model, defs)
        keep_open = False
        started = time.perf_counter()
        outcome = "stop"
        try:
            finish, usage = "stop", None
            async for ev in events:
                if isinstance(ev, TextDelta):
                    await out.add_text(ev.text)
                elif isinstance(ev, ThinkingDelta):
                    await out.add_reasoning(ev.text)
                elif isinstance(ev, ExecRequest):
                    if not tools:
                        await ev.fail("the OpenAI client offered no tools, so the proxy cannot hand this exec out")
                        continue
                    call_id = M.openai_call_id(ev)
                    name, arguments = M.exec_to_tool_call(ev, offered)
                    await out.add_tool_call(call_id, name, arguments)
                    self._remember(call_id, client)
                    finish = "tool_calls"
                    if "reuse_session" in self.config.faults:
                        self._parked[call_id] = _Parked(client, events, ev, prompt)
                        keep_open = True
                    break
                elif isinstance(ev, TurnEnded):
                    usage = ev.usage
                    break
                elif isinstance(ev, Error):
                    outcome = f"error {ev.code}"
                    await out.fail(M.error_status(ev.code), M.error_body(ev.code, ev.message, ev.details))
                    return
            outcome = finish
            await out.finish(finish, _usage(usage, prompt))
        except (ConnectionError, asyncio.IncompleteReadError):
            outcome = "client went away"
            return  # abandon the run
        except Exception as exc:  # a proxy bug must still answer the request, not drop it
            log.exception("chat completion failed")
            outcome = f"internal error {type(exc).__name__}"
            with contextlib.suppress(Exception):
                await out.fail(502, M.error_body("internal", f"workbench proxy error: {type(exc).__name__}: {exc}"))
        finally:
            log.info("chat %s %s -> %s in %.0f ms (request %s)", model, "stream" if stream else "whole", outcome,
                     (time.perf_counter() - started) * 1000, client.last_request_id or "-")
            if not keep_open:
                await _aclose(events)
                await client.aclose()

    def _remember(self, call_id: str, client: AgentClient) -> None:
        if client.conversation_id:
            self._issued[call_id] = (client.conversation_id, client.checkpoint)
            while len(self._issued) > _MAX_REMEMBERED:
                self._issued.popitem(last=False)

    def _prior(self, messages: list[Any]) -> tuple[str, bytes | None] | None:
        for m in reversed(messages):
            if isinstance(m, Mapping) and m.get("role") == "tool":
                prior = self._issued.get(str(m.get("tool_call_id")))
                if prior is not None:
                    return prior
        return None

    def _resume(self, messages: list[Any]) -> _Parked | None:
        for m in messages:
            if isinstance(m, Mapping) and m.get("role") == "tool":
                parked = self._parked.pop(str(m.get("tool_call_id")), None)
                if parked is not None:
                    return parked
        return None

    async def _drop(self, parked: _Parked) -> None:
        await _aclose(parked.events)
        await parked.client.aclose()


def _hex_size(text: bytes) -> int:
    """A chunk size: hex digits only (``int(…, 16)`` would also take "0x", "+", "_" and spaces)."""
    if not text or len(text) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in text):
        shown = text[:20].decode("latin-1")
        raise _HttpError(400, "invalid_argument", f"malformed chunked body: bad chunk size {shown!r}")
    return int(text, 16)


async def _aclose(events: AsyncIterator[Any]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()


def _as_error(exc: BaseException) -> Error:
    from workbench.client.agent import _error_from

    return _error_from(exc)
