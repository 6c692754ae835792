"""The OpenAI-compatible proxy: ``/v1/models``, ``/v1/chat/completions`` and ``/v1/responses``
(``workbench.proxy.responses``) over the agent client.

Served by workbench's own HTTP/1.1 server (``workbench.transport``, on ``h11``) rather than an
ASGI stack: the proxy's job is to add as little as possible to time-to-first-token, so each
upstream text delta is written to the socket as one SSE chunk the moment it arrives. Every
OpenAI request is a fresh run (full history flattened into the user text, tools offered every
time) — on the conversation the tool call came from, with its last checkpoint echoed when one
arrived; all runs share one warm upstream connection. Who may call it is checked before a
request's body is read (``workbench.security.origin``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.client.agent import AgentClient, Connections
from workbench.client.events import Error, ExecRequest, TextDelta, ThinkingDelta, TurnEnded, Usage
from workbench.client.net import Verify
from workbench.client.transport import list_usable_models
from workbench.client.turn_end import error_from
from workbench.jsontypes import JsonObject
from workbench.proxy import mapping, responses
from workbench.proxy.sse import SseStream, send_json
from workbench.security.origin import AccessPolicy
from workbench.transport import ConnectionClosed, Exchange, HttpServer, Router, listen

log = logging.getLogger("workbench.proxy")

DEFAULT_PORT = 18741
DEFAULT_UPSTREAM = "https://api2.cursor.sh"
_MAX_REMEMBERED = 4096
_Chat = tuple[list[Any], list[Any]]  # an OpenAI request's chat messages and tools


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


class _Responder:
    """Writes one chat completion, streamed (SSE) or whole; the HTTP status is chosen lazily so an
    upstream failure before the first token still becomes a proper 4xx/5xx."""

    def __init__(self, ex: Exchange, model: str, stream: bool, include_usage: bool) -> None:
        self.ex = ex
        self.model = model
        self.stream = stream
        self.include_usage = include_usage
        self.id = "chatcmpl-" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        # The role chunk rides with the first event, in the packet that carries the status line.
        self.sse = SseStream(ex, preamble=self._chunk({"role": "assistant", "content": ""}))
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.tool_calls: list[JsonObject] = []

    def _chunk(self, delta: JsonObject, finish: str | None = None) -> bytes:
        doc = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"

    async def add_text(self, text: str) -> None:
        if not self.stream:
            self.text.append(text)
            return
        await self.sse.send(self._chunk({"content": text}))

    async def add_reasoning(self, text: str) -> None:
        if not self.stream:
            self.reasoning.append(text)
            return
        await self.sse.send(self._chunk({"reasoning_content": text}))

    async def add_tool_call(self, call_id: str, name: str, arguments: str) -> None:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        index = len(self.tool_calls)
        self.tool_calls.append(call)
        if self.stream:
            await self.sse.send(self._chunk({"tool_calls": [{"index": index, **call}]}))

    async def finish(self, reason: str, usage: dict[str, int]) -> None:
        if self.stream:
            out = self._chunk({}, reason)
            if self.include_usage:
                doc = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model, "choices": [], "usage": usage}
                out += b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"
            out += b"data: [DONE]\n\n"
            await self.sse.send(out, last=True)
            return
        message: JsonObject = {"role": "assistant", "content": "".join(self.text) if self.text or not
                                   self.tool_calls else None}
        if self.reasoning:
            message["reasoning_content"] = "".join(self.reasoning)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        doc = {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "message": message, "finish_reason": reason}], "usage": usage}
        await send_json(self.ex, 200, doc)

    async def fail(self, status: int, body: JsonObject) -> None:
        if not self.sse.started:
            await send_json(self.ex, status, body)
            return
        # Mid-stream: the OpenAI SDK raises on an SSE event carrying "error".
        data = b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n"
        await self.sse.send(data, last=True)


def _json_error(status: int, message: str) -> tuple[str, bytes]:
    """The body of a refused or unusable request (malformed HTTP, body too large), OpenAI-style."""
    return "application/json", json.dumps(mapping.error_body("invalid_argument", message)).encode()


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
        self._http: HttpServer | None = None
        self._models: tuple[float, list[str]] | None = None
        self._parked: dict[str, _Parked] = {}
        # tool_call id handed out → (conversation_id, last checkpoint) of the run it came from
        self._issued: OrderedDict[str, tuple[str, bytes | None]] = OrderedDict()
        self._responses_kept = responses.ResponseStore()
        self.port = config.port
        self.access = config.access or AccessPolicy.build(config.host)

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    def router(self) -> Router:
        """The proxy's endpoints (a trailing slash is ignored); anything else is a 404."""
        router = Router(self._not_found, guard=self._admit, normalize=lambda p: p.rstrip("/") or "/",
                        error_body=_json_error)
        for path in ("/v1/chat/completions", "/chat/completions"):
            router.route(path, self._chat)
        for path in ("/v1/responses", "/responses"):
            router.route(path, self._responses)
        for path in ("/v1/models", "/models"):
            router.route(path, self._list_models)
        router.route_prefix("/v1/models/", self._one_model)
        for path in ("/", "/health"):
            router.route(path, self._health)
        return router

    async def start(self) -> ProxyServer:
        self._http = await listen(self.router(), host=self.config.host, port=self.config.port, tls=False,
                                  http2=False)
        self.port = self._http.port
        return self

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        for parked in list(self._parked.values()):
            await self._drop(parked)
        self._parked.clear()
        await self.connections.aclose()

    async def __aenter__(self) -> ProxyServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # HTTP -------------------------------------------------------------------------------------

    async def _admit(self, ex: Exchange) -> bool:
        """Host/Origin/preflight/API-key checks, then the body (read whole: requests are small)."""
        refusal = self.access.refusal(ex.method, ex.headers)
        if refusal is not None:
            # Before reading the body: a refused request gets nothing buffered, and the
            # connection closes (its body, unread, cannot be mistaken for a next request).
            status, why = refusal
            log.info("refused %s %s: %s", ex.method, ex.path.split("?", 1)[0], why)
            await ex.goaway()
            await send_json(ex, status, mapping.error_body(
                "permission_denied" if status == 403 else "unauthenticated", why))
            return False
        await ex.read_body()  # a RequestError (malformed chunked body, too large) is answered by the router
        return True

    async def _not_found(self, ex: Exchange) -> None:
        path = ex.path.split("?", 1)[0].rstrip("/") or "/"
        await send_json(ex, 404, mapping.error_body("not_found", f"{ex.method} {path} is not an endpoint of "
                                                    "this proxy (try /v1/chat/completions, /v1/responses, /v1/models)"))

    async def _health(self, ex: Exchange) -> None:
        if ex.method != "GET":
            await self._not_found(ex)
            return
        await send_json(ex, 200, {"status": "ok", "upstream": self.config.upstream,
                                  "transport": self.config.transport, "framing": self.config.framing})

    # endpoints --------------------------------------------------------------------------------

    def _client(self) -> AgentClient:
        c = self.config
        return AgentClient(c.upstream, c.token, transport=c.transport, workspace=c.workspace,
                           execute_locally=c.execute_locally, faults=c.faults, heartbeat_budget=c.heartbeat_budget,
                           heartbeat_interval=c.heartbeat_interval, verify=c.verify, connections=self.connections,
                           framing=c.framing)

    async def _list_models(self, ex: Exchange) -> None:
        await self._models_answer(ex, None)

    async def _one_model(self, ex: Exchange) -> None:
        path = ex.path.split("?", 1)[0].rstrip("/")
        await self._models_answer(ex, path.split("/v1/models/", 1)[1])

    async def _models_answer(self, ex: Exchange, one: str | None) -> None:
        if ex.method != "GET":
            await self._not_found(ex)
            return
        ids = list(self.config.models)
        if not ids:
            now = time.monotonic()
            if self._models is None or now - self._models[0] > 60:
                try:
                    # Either listing: agent.v1, else aiserver.v1.AiService when the first is unimplemented.
                    self._models = (now, await list_usable_models(self.connections.http(), self.config.upstream,
                                                                  self.config.token, self.config.framing))
                except Exception as exc:
                    err = error_from(exc)
                    await send_json(ex, mapping.error_status(err.code), mapping.error_body(err.code, err.message))
                    return
            ids = self._models[1]
        data = [{"id": i, "object": "model", "created": 0, "owned_by": "cursor"} for i in ids]
        if one is not None:
            match = [d for d in data if d["id"] == one]
            if not match:
                await send_json(ex, 404, mapping.error_body("not_found", f"model {one!r} is not offered upstream"))
                return
            await send_json(ex, 200, match[0])
            return
        await send_json(ex, 200, {"object": "list", "data": data})

    async def _json_request(self, ex: Exchange, what: str) -> JsonObject | None:
        """The POSTed JSON object, or None after answering 405/400."""
        if ex.method != "POST":
            await send_json(ex, 405, mapping.error_body("invalid_argument", "use POST"))
            return None
        body = await ex.read_body()
        try:
            req = json.loads(body or b"{}")
        except ValueError as exc:
            await send_json(ex, 400, mapping.error_body("invalid_argument", f"bad {what} request: {exc}"))
            return None
        if not isinstance(req, dict):
            await send_json(ex, 400, mapping.error_body("invalid_argument",
                                                        f"bad {what} request: the request body must be a JSON object"))
            return None
        return req

    async def _turn_request(self, ex: Exchange, what: str, to_chat: Callable[[Mapping[str, Any]], _Chat]
                            ) -> tuple[Mapping[str, Any], str, list[Any], list[Any]] | None:
        """The POSTed request, its model, chat messages and tools; None after answering 405/400.

        ``to_chat`` reads the endpoint's request as chat messages and tools; both are checked here
        (each tool maps to an MCP definition, the messages flatten to a prompt) before a turn starts.
        """
        req = await self._json_request(ex, what)
        if req is None:
            return None
        try:
            messages, tools = to_chat(req)
            mapping.tools_to_mcp(tools)
            mapping.flatten_messages(messages)
        except (ValueError, mapping.MappingError) as exc:
            await send_json(ex, 400, mapping.error_body("invalid_argument", f"bad {what} request: {exc}"))
            return None
        return req, str(req.get("model") or "default"), messages, tools

    async def _chat(self, ex: Exchange) -> None:
        got = await self._turn_request(ex, "chat", _chat_messages)
        if got is None:
            return
        req, model, messages, tools = got
        stream = bool(req.get("stream"))
        include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
        await self._answer(_Responder(ex, model, stream, include_usage), "chat", model, messages, tools)

    async def _responses(self, ex: Exchange) -> None:
        got = await self._turn_request(ex, "responses", lambda req: responses.to_chat(req, self._responses_kept))
        if got is None:
            return
        req, model, messages, tools = got
        out = responses.ResponsesWriter(ex, model, bool(req.get("stream")), req)
        if await self._answer(out, "responses", model, messages, tools):
            self._responses_kept.put(out.id, responses.history_after(messages, out))

    async def _answer(self, out: Any, label: str, model: str, messages: list[Any], tools: list[Any]) -> bool:
        """Run the turn for one OpenAI request and write it with ``out`` (a chat or Responses writer).

        True when the answer finished (text or tool calls), False after an error or a lost client.
        """
        defs = mapping.tools_to_mcp(tools)
        prompt = mapping.flatten_messages(messages)
        offered = mapping.offered_schemas(tools)
        parked = self._resume(messages) if "reuse_session" in self.config.faults else None
        if parked is not None:
            client, events = parked.client, parked.events
            result = next((mapping.content_text(m.get("content")) for m in messages
                           if m.get("role") == "tool"
                           and m.get("tool_call_id") == mapping.openai_call_id(parked.request)), "")
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
                    call_id = mapping.openai_call_id(ev)
                    name, arguments = mapping.exec_to_tool_call(ev, offered)
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
                    await out.fail(mapping.error_status(ev.code), mapping.error_body(ev.code, ev.message, ev.details))
                    return False
            outcome = finish
            await out.finish(finish, _usage(usage, prompt))
            return True
        except ConnectionClosed:
            outcome = "client went away"
            return False  # abandon the run
        except Exception as exc:  # a proxy bug must still answer the request, not drop it
            log.exception("%s request failed", label)
            outcome = f"internal error {type(exc).__name__}"
            with contextlib.suppress(Exception):
                await out.fail(502, mapping.error_body("internal", f"workbench proxy error: {type(exc).__name__}: {exc}"))
            return False
        finally:
            log.info("%s %s %s -> %s in %.0f ms (request %s)", label, model, "stream" if out.stream else "whole",
                     outcome, (time.perf_counter() - started) * 1000, client.last_request_id or "-")
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


def _chat_messages(req: Mapping[str, Any]) -> _Chat:
    """A chat completions request's messages and tools, as they come."""
    messages = req.get("messages")
    if not isinstance(messages, list):
        raise mapping.MappingError("messages must be a non-empty list")
    return messages, req.get("tools") or []


async def _aclose(events: AsyncIterator[Any]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        with contextlib.suppress(Exception):
            await aclose()

