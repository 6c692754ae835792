"""The Connect surface of an agent backend, for any server that speaks the agent protocol.

A server (the simulator, the fixture replay server) plugs a ``Handler`` in here and sees one
``AgentConnection`` per run whatever transport the client chose (``channel``): ``Run`` over h2,
``RunSSE``/``RunPoll`` with their ``BidiAppend`` write side, plus a table of unary methods. Every
call is answered in the caller's framing (Connect, gRPC-Web, gRPC; ``framing``). ``serve`` starts
one on a loopback socket (``server.listen``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from functools import partial
from pathlib import Path

from workbench.transport.bidi_append import APPEND_GRACE, AppendChannel, AppendChannels, bidi_request_id
from workbench.transport.channel import ExchangeConnection, Handler
from workbench.transport.exchange import ConnectionClosed, Exchange
from workbench.transport.framing import (
    CONNECT,
    Framing,
    FramingError,
    FramingRefused,
    ResponseEncoder,
    connect_error_of,
    for_stream,
    for_unary,
    guess,
    stream_request_envelopes,
    unary_payload,
)
from workbench.transport.router import ExchangeHandler, Router, request_path
from workbench.transport.server import HttpServer, listen
from workbench.transport.unary import (
    AuthCheck,
    UnaryHandler,
    UnaryRequest,
    UnaryResponse,
    connect_error,
    unary_error,
)

log = logging.getLogger("workbench.transport")

RUN_PATH = "/agent.v1.AgentService/Run"
RUNSSE_PATH = "/agent.v1.AgentService/RunSSE"
RUNPOLL_PATH = "/agent.v1.AgentService/RunPoll"
APPEND_PATH = "/aiserver.v1.BidiService/BidiAppend"
HEALTH_PATHS = ("/", "/health")


class AgentService:
    """Routes of an agent backend: the three run transports, BidiAppend, the unary methods.

    ``auth`` sees the request headers of every run and unary call and returns a Connect error
    object to refuse it (a run ends with it, a unary call gets it as its error), else None.
    ``gzip_min``: gzip (flag 0x01) every envelope of at least that many bytes, for Connect
    clients that send ``connect-accept-encoding: gzip``.
    """

    def __init__(self, handler: Handler, unary: Mapping[str, UnaryHandler] | None = None,
                 auth: AuthCheck | None = None, append_grace: float = APPEND_GRACE,
                 gzip_min: int | None = None) -> None:
        self.handler = handler
        self.gzip_min = gzip_min
        self.unary = dict(unary or {})
        self.auth = auth
        self.appends = AppendChannels(append_grace)

    def router(self) -> Router:
        """A router serving this service (only POST reaches a method; GET / and /health answer 200)."""
        router = Router(self._other)
        for path, handler in self.unary.items():
            router.route(path, _post_only(partial(self._unary, path=path, handler=handler)))
        router.route(RUN_PATH, _post_only(self._run))
        router.route(RUNSSE_PATH, _post_only(partial(self._bidi, transport="runsse")))
        router.route(RUNPOLL_PATH, _post_only(partial(self._bidi, transport="runpoll")))
        router.route(APPEND_PATH, _post_only(partial(self._unary, path=APPEND_PATH, handler=self.appends.handle)))
        router.on_close(self.appends.close_all)
        return router

    async def _other(self, ex: Exchange) -> None:
        """Health checks; any other method 405; an unknown POST ``unimplemented`` in its framing."""
        path = request_path(ex.path)
        if ex.method == "GET" and path in HEALTH_PATHS:
            await ex.respond(200, b"workbench agent backend\n", "text/plain")
            return
        if ex.method != "POST":
            await ex.respond(405, b"", "text/plain")
            return
        await ex.read_body()
        await send_unary(ex, guess(ex.headers), unary_error(
            connect_error("unimplemented", f"{path} is not implemented")))

    def _gzip_for(self, headers: Mapping[str, str], framing: Framing) -> tuple[int | None, list[tuple[str, str]]]:
        """Envelope compression only for Connect clients that accept it (connect-accept-encoding: gzip)."""
        accepted = "gzip" in headers.get("connect-accept-encoding", "").lower()
        if self.gzip_min is None or not accepted or framing.name != CONNECT:
            return None, []
        return self.gzip_min, [("connect-content-encoding", "gzip")]

    async def _run(self, ex: Exchange) -> None:
        if ex.http_version != "2":
            # What the real load balancer answers to Run over HTTP/1.1.
            await ex.respond(464, b"", "text/plain")
            return
        try:
            framing = for_stream(ex.headers)
        except FramingRefused:
            await ex.respond(415, b"", "text/plain")
            return
        gzip_min, extra = self._gzip_for(ex.headers, framing)
        await ex.start(200, [("content-type", framing.content_type), *extra])
        conn = ExchangeConnection("run", ex.headers.get("x-request-id"), ex, framing, gzip_min=gzip_min)
        await self._drive(conn)

    async def _bidi(self, ex: Exchange, transport: str) -> None:
        body = await ex.read_body()
        try:
            framing = for_stream(ex.headers)
        except FramingRefused:
            await ex.respond(415, b"", "text/plain")
            return
        ctype = framing.content_type
        if framing.name == CONNECT and transport == "runsse" and "text/event-stream" in ex.headers.get("accept", ""):
            ctype = "text/event-stream"
        gzip_min, extra = self._gzip_for(ex.headers, framing)
        await ex.start(200, [("content-type", ctype), ("cache-control", "no-cache"),
                             ("x-accel-buffering", "no"), *extra])
        try:
            request_id, problem = bidi_request_id(stream_request_envelopes(framing, body), transport)
        except FramingError as exc:
            request_id, problem = None, str(exc)
        appends = AppendChannel(request_id or "")
        conn = ExchangeConnection(transport, request_id, ex, framing, appends, gzip_min=gzip_min)
        if problem is not None:
            await conn.end(connect_error("invalid_argument", problem))
            return
        problem = self.appends.register(appends)
        if problem is not None:
            await conn.end(connect_error("already_exists", problem))
            return
        header_id = ex.headers.get("x-request-id")
        if header_id and header_id != request_id:
            appends.faults.append(f"x-request-id header {header_id} differs from body request_id {request_id}")
        watcher = asyncio.get_running_loop().create_task(_close_on_gone(ex, appends))
        try:
            await self._drive(conn)
        finally:
            watcher.cancel()
            self.appends.release(appends)

    async def _drive(self, conn: ExchangeConnection) -> None:
        err = self.auth(conn.headers) if self.auth is not None else None
        if err is not None:
            await conn.end(err)
            return
        try:
            await self.handler(conn)
        except ConnectionClosed:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("handler failed on %s %s", conn.transport, conn.request_id)
            await conn.end(connect_error("internal", f"simulated backend error: {exc}"))
        finally:
            if not conn.ended:
                await conn.end()

    async def _unary(self, ex: Exchange, path: str, handler: UnaryHandler) -> None:
        body = await ex.read_body()
        try:
            framing = for_unary(ex.headers, body)
        except FramingRefused:
            # What the service answers an envelope sent as Connect unary, or connect+proto on a
            # unary method: a bare 415, no body.
            await ex.respond(415, b"", "text/plain")
            return
        err = self.auth(ex.headers) if self.auth is not None else None
        if err is not None:
            await send_unary(ex, framing, unary_error(err))
            return
        try:
            payload = unary_payload(framing, body)
        except FramingError as exc:
            await send_unary(ex, framing, unary_error(connect_error("invalid_argument", str(exc))))
            return
        try:
            resp = await handler(UnaryRequest(path, ex.headers, payload))
        except Exception as exc:
            log.exception("unary handler %s failed", path)
            resp = unary_error(connect_error("internal", f"{path}: {exc}"))
        await send_unary(ex, framing, resp)


def _post_only(fn: ExchangeHandler) -> ExchangeHandler:
    async def post_only(ex: Exchange) -> None:
        if ex.method != "POST":
            await ex.respond(405, b"", "text/plain")
            return
        await fn(ex)

    return post_only


async def _close_on_gone(ex: Exchange, appends: AppendChannel) -> None:
    await ex.gone.wait()
    appends.close()


async def send_unary(ex: Exchange, framing: Framing, resp: UnaryResponse) -> None:
    """A unary answer in the caller's framing: Connect as the handler wrote it; gRPC and gRPC-Web
    always HTTP 200, the message enveloped and the status in trailers (a Connect error re-coded)."""
    if not framing.grpc_family:
        await ex.respond(resp.status, resp.body, resp.content_type, resp.headers)
        return
    enc = ResponseEncoder(framing)
    message = enc.message(resp.body) if resp.status == 200 else b""
    end, trailers = enc.end(None if resp.status == 200 else connect_error_of(resp.body, resp.status))
    if trailers is None:
        await ex.respond(200, message + end, framing.content_type, resp.headers)
        return
    await ex.start(200, [("content-type", framing.content_type), *resp.headers.items()], message)
    await ex.finish(trailers=trailers)


async def serve(handler: Handler, *, host: str = "127.0.0.1", port: int = 0, tls: bool = True,
                certfile: str | Path | None = None, keyfile: str | Path | None = None,
                unary: Mapping[str, UnaryHandler] | None = None, auth: AuthCheck | None = None,
                cert_dir: str | Path | None = None, append_grace: float = APPEND_GRACE,
                gzip_min: int | None = None) -> HttpServer:
    """Listen on ``host:port`` (0 = a free port) and run ``handler`` for every agent run.

    With ``tls`` and no ``certfile``, the self-signed loopback certificate from
    ``workbench.transport.certs`` is used (made on first use in ``cert_dir``). ``append_grace`` is
    how long a BidiAppend waits for its RunSSE/RunPoll stream to appear before it gets a 404.
    ``gzip_min``: see ``AgentService``.
    """
    service = AgentService(handler, unary, auth, append_grace, gzip_min)
    return await listen(service.router(), host=host, port=port, tls=tls, certfile=certfile, keyfile=keyfile,
                        cert_dir=cert_dir)
