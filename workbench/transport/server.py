"""The listening socket of workbench's HTTP servers: TLS with ALPN, connection dispatch, shutdown.

Every connection is served as HTTP/2 (``h2_server``) or HTTP/1.1 (``h1_server``): over TLS as
ALPN chose, on plain TCP by the HTTP/2 prior-knowledge preface (h2c) or its absence. Each request
becomes an ``Exchange`` handed to the app (``HttpApp``: a ``router.Router``); an app that wrote
nothing gets a 500, a response left open is finished.

Built on asyncio + ``h2`` + ``h11`` directly rather than an ASGI server, because the interesting
behaviour (full duplex, per-frame flushing, large frames, flow-control windows, GOAWAY) has to be
controlled exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path
from typing import Protocol

from workbench.transport.certs import ensure_cert
from workbench.transport.exchange import Exchange
from workbench.transport.h1_server import H1Session
from workbench.transport.h2_server import H2Session

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


class HttpApp(Protocol):
    """What a server serves: every request, and the answer to one that does not parse."""

    async def handle(self, ex: Exchange) -> None:
        ...

    def bad_request(self, reason: str) -> tuple[int, str, bytes] | None:
        """(status, content type, body) for an HTTP/1.1 request h11 rejected; None: just close."""
        ...

    def close(self) -> None:
        """The server is closing: let go of what outlives a request (bidi channels)."""
        ...


async def serve_exchange(app: HttpApp, ex: Exchange) -> None:
    """Route one request; a handler that wrote nothing gets a 500, one left open is finished."""
    await app.handle(ex)
    if not ex.started:
        await ex.respond(500, b"", "text/plain")
    elif not ex.finished:
        await ex.finish()


class HttpServer:
    """A listening socket; ``url`` is what clients connect to."""

    def __init__(self, app: HttpApp, host: str, tls: bool, cert_path: Path | None, http2: bool = True) -> None:
        self.app = app
        self.host = host
        self.tls = tls
        self.cert_path = cert_path
        self.http2 = http2
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._sessions: set[H2Session | H1Session] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handler_tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def _serve(self, ex: Exchange) -> None:
        await serve_exchange(self.app, ex)

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        session: H2Session | H1Session
        try:
            sslobj = writer.get_extra_info("ssl_object")
            initial = b""
            if sslobj is not None:
                use_h2 = sslobj.selected_alpn_protocol() == "h2"
            elif self.http2:
                initial, use_h2 = await _sniff_preface(reader)
            else:
                use_h2 = False
            if use_h2:
                session = H2Session(reader, writer, self._serve, self._handler_tasks, initial)
            else:
                session = H1Session(reader, writer, self._serve, self.app.bad_request, initial)
            self._sessions.add(session)
            try:
                await session.run()
            finally:
                # Handlers of a lost connection are not cancelled: they see receive() -> None and
                # ConnectionClosed on their next send, and finish their own bookkeeping.
                self._sessions.discard(session)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            with contextlib.suppress(Exception):
                writer.close()
        except asyncio.CancelledError:
            # A per-connection task cancelled by close(): finish quietly (asyncio's stream callback
            # would otherwise log the cancellation as an error).
            with contextlib.suppress(Exception):
                writer.close()
        finally:
            if task is not None:
                self._tasks.discard(task)

    async def close(self) -> None:
        """Stop listening, GOAWAY the h2 connections, cancel running handlers."""
        if self._server is not None:
            self._server.close()
        handler_tasks = list(self._handler_tasks)
        for s in list(self._sessions):
            await s.shutdown()
        for t in list(self._tasks) + handler_tasks:
            t.cancel()
        pending = list(self._tasks) + handler_tasks
        if pending:
            await asyncio.wait(pending, timeout=5)
        self.app.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> HttpServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Endpoint:
    """``url``, ``port`` and ``cert_path`` (the certificate a client trusts) of the listening
    ``HttpServer`` that ``http_server()`` gives: for the objects that run one (the simulator, the
    replay server) and are what their callers point a client at."""

    def http_server(self) -> HttpServer:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return self.http_server().url

    @property
    def port(self) -> int:
        return self.http_server().port

    @property
    def cert_path(self) -> Path | None:
        return self.http_server().cert_path


async def _sniff_preface(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """Plain TCP: HTTP/2 prior knowledge (h2c) starts with the fixed preface, anything else is 1.1."""
    buf = b""
    while len(buf) < len(H2_PREFACE) and H2_PREFACE.startswith(buf):
        chunk = await reader.read(len(H2_PREFACE) - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf, buf == H2_PREFACE


def tls_context(certfile: str | Path, keyfile: str | Path | None = None, http2: bool = True) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    ctx.set_alpn_protocols(["h2", "http/1.1"] if http2 else ["http/1.1"])
    return ctx


async def listen(app: HttpApp, *, host: str = "127.0.0.1", port: int = 0, tls: bool = True,
                 certfile: str | Path | None = None, keyfile: str | Path | None = None,
                 cert_dir: str | Path | None = None, http2: bool = True) -> HttpServer:
    """Serve ``app`` on ``host:port`` (0 = a free port).

    With ``tls`` and no ``certfile``, the self-signed loopback certificate of
    ``workbench.transport.certs`` is used (made on first use in ``cert_dir``). ``http2=False``
    serves HTTP/1.1 only (no h2c preface sniffing on plain TCP).
    """
    ctx: ssl.SSLContext | None = None
    cert_path: Path | None = None
    if tls:
        if certfile is None:
            pair = ensure_cert(cert_dir)
            certfile, keyfile = pair.cert_path, pair.key_path
        cert_path = Path(certfile)
        ctx = tls_context(certfile, keyfile, http2)
    server = HttpServer(app, host, tls, cert_path, http2)
    server._server = await asyncio.start_server(server._on_client, host, port, ssl=ctx,
                                                limit=1 << 20, backlog=256)
    server.port = server._server.sockets[0].getsockname()[1]
    return server
