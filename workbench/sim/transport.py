"""Connect transport for agent backends: HTTP/2 and HTTP/1.1 on one loopback socket.

Any server that speaks the agent protocol (the simulator, the fixture replay server) plugs a
``Handler`` in here and sees one ``AgentConnection`` per run, whatever transport the client chose:

* ``run``     — ``/agent.v1.AgentService/Run`` over h2, full duplex: the handler may send before
                the client finishes (or even starts) its request body.
* ``runsse``  — ``RunSSE`` (one enveloped BidiRequestId in, envelopes streamed out) with the write
                side arriving as ``/aiserver.v1.BidiService/BidiAppend`` unary calls, put back in
                ``append_seqno`` order before ``receive()`` returns them.
* ``runpoll`` — ``RunPoll``: like RunSSE, but each outgoing message is wrapped in a
                BidiPollResponse record (seqno, base64 data, eof on the last).

Every call is answered in the caller's framing (Connect, gRPC-Web, gRPC; ``workbench.sim.framing``).

Built on asyncio + ``h2`` + ``h11`` directly rather than an ASGI server, because the interesting
behaviour (full duplex, per-frame flushing, large frames, flow-control windows, GOAWAY) has to be
controlled exactly. Each frame is written and drained as it is sent: nothing is buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import h11

from workbench.sim import framing as F
from workbench.sim.bidi_append import APPEND_GRACE, BidiChannel, BidiChannels, bidi_request_id, poll_record
from workbench.sim.unary import (  # re-exported: the transport's public interface
    HTTP_STATUS,
    UNARY_CT,
    UnaryHandler,
    UnaryRequest,
    UnaryResponse,
    connect_error,
    unary_error,
)
from workbench.wire.envelope import EnvelopeParser

log = logging.getLogger("workbench.sim.transport")

RUN_PATH = "/agent.v1.AgentService/Run"
RUNSSE_PATH = "/agent.v1.AgentService/RunSSE"
RUNPOLL_PATH = "/agent.v1.AgentService/RunPoll"
APPEND_PATH = "/aiserver.v1.BidiService/BidiAppend"

STREAM_CT = "application/connect+proto"
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Large windows and frames: a MITM or client with the 16 KiB default caused FRAME_SIZE_ERROR
# GOAWAYs in the field, and big KV blobs must not stall on flow control.
MAX_FRAME_SIZE = (1 << 24) - 1
WINDOW = 1 << 24
MAX_BODY = 64 * 1024 * 1024

__all__ = ["APPEND_GRACE", "HTTP_STATUS", "STREAM_CT", "UNARY_CT", "AgentConnection", "AgentServer",
           "ConnectionClosed", "Handler", "UnaryHandler", "UnaryRequest", "UnaryResponse", "connect_error",
           "serve", "tls_context", "unary_error"]


class ConnectionClosed(Exception):
    """The client went away (reset, GOAWAY, TCP close) or the stream was already ended."""


class AgentConnection(Protocol):
    """One agent run as a handler sees it, independent of the transport."""

    transport: str  # "run" | "runsse" | "runpoll"
    request_id: str | None
    headers: Mapping[str, str]  # request headers, lower-case names

    async def receive(self) -> bytes | None:
        """Next serialized AgentClientMessage; None once the client side has ended."""
        ...

    async def send(self, message: bytes) -> None:
        """One serialized AgentServerMessage, flushed at once. Raises ConnectionClosed."""
        ...

    async def end(self, error: dict[str, Any] | None = None) -> None:
        """Connect end-stream: ``{}``, or ``{"error": …}`` (pass the error object or the whole doc)."""
        ...

    async def close(self) -> None:
        """Finish the response without an end-stream frame (a truncated stream)."""
        ...


Handler = Callable[[AgentConnection], Awaitable[None]]
AuthCheck = Callable[[Mapping[str, str]], "dict[str, Any] | None"]


# --------------------------------------------------------------------------------------------
# HTTP exchanges: one request/response pair, h2 stream or HTTP/1.1 message
# --------------------------------------------------------------------------------------------


class _Exchange:
    method: str
    path: str
    headers: dict[str, str]
    http_version: str

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.started = False
        self.finished = False

    async def read_chunk(self) -> bytes | None:
        raise NotImplementedError

    async def read_body(self, limit: int = MAX_BODY) -> bytes:
        buf = bytearray()
        while (chunk := await self.read_chunk()) is not None:
            buf += chunk
            if len(buf) > limit:
                raise ValueError(f"request body larger than {limit} bytes")
        return bytes(buf)

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        raise NotImplementedError

    async def finish(self, trailers: list[tuple[str, str]] | None = None) -> None:
        """End the response; ``trailers`` are sent as HTTP trailers (gRPC's status)."""
        raise NotImplementedError

    async def goaway(self) -> None:
        """No more requests on this connection (h2 GOAWAY; HTTP/1.1 closes after this response)."""
        raise NotImplementedError

    async def reset(self) -> None:
        """Abort this exchange abruptly (h2 RST_STREAM; HTTP/1.1 drops the connection)."""
        raise NotImplementedError

    async def respond(self, status: int, body: bytes, content_type: str,
                      headers: Mapping[str, str] | None = None) -> None:
        hdrs = [("content-type", content_type), ("content-length", str(len(body)))]
        hdrs += list((headers or {}).items())
        await self.start(status, hdrs)
        if body:
            await self.write(body)
        await self.finish()


class _H2Exchange(_Exchange):
    def __init__(self, session: _H2Session, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        super().__init__()
        self.session = session
        self.stream_id = stream_id
        self.http_version = "2"
        self.headers = {}
        pseudo: dict[str, str] = {}
        for k, v in headers:
            name, value = k.decode("latin-1").lower(), v.decode("latin-1")
            if name.startswith(":"):
                pseudo[name] = value
            elif name in self.headers:
                self.headers[name] += ", " + value
            else:
                self.headers[name] = value
        self.method = pseudo.get(":method", "GET")
        self.path = pseudo.get(":path", "/")
        self.body: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.body_done = False

    async def read_chunk(self) -> bytes | None:
        if self.body_done:
            return None
        item = await self.body.get()
        if item is None:
            self.body_done = True
        return item

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        if self.gone.is_set():
            raise ConnectionClosed("stream reset by the client")
        self.started = True
        hdrs = [(":status", str(status))] + [(k.lower(), v) for k, v in headers if k.lower() != "connection"]
        self.session.send_headers(self.stream_id, hdrs)
        await self.session.flush()

    async def write(self, data: bytes) -> None:
        if self.gone.is_set() or self.finished:
            raise ConnectionClosed("stream reset by the client")
        await self.session.send_data(self, data, end=False)

    async def finish(self, trailers: list[tuple[str, str]] | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        if self.gone.is_set():
            return
        if trailers:
            self.session.send_headers(self.stream_id, trailers, end_stream=True)
            await self.session.flush()
            return
        await self.session.send_data(self, b"", end=True)

    async def goaway(self) -> None:
        await self.session.drain_and_close()

    async def reset(self) -> None:
        self.finished = True
        if self.gone.is_set():
            return
        self.gone.set()
        with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            self.session.conn.reset_stream(self.stream_id, error_code=2)  # INTERNAL_ERROR
        with contextlib.suppress(ConnectionClosed):
            await self.session.flush()


class _H2Session:
    def __init__(self, server: AgentServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 initial: bytes = b"") -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.initial = initial
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.streams: dict[int, _H2Exchange] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.draining = False
        self._flow_waiters: list[asyncio.Future[None]] = []

    def send_headers(self, stream_id: int, headers: list[tuple[str, str]], end_stream: bool = False) -> None:
        try:
            self.conn.send_headers(stream_id, headers, end_stream=end_stream)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
            raise ConnectionClosed(f"h2 stream {stream_id}: {exc}") from exc

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if not data:
            return
        if self.closed:
            raise ConnectionClosed("connection closed")
        try:
            self.writer.write(data)
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            self._lost()
            raise ConnectionClosed(str(exc)) from exc

    async def send_data(self, ex: _H2Exchange, data: bytes, end: bool) -> None:
        sid = ex.stream_id
        view = memoryview(data)
        while True:
            if self.closed or ex.gone.is_set():
                raise ConnectionClosed("client went away")
            try:
                if not view:
                    if end:
                        self.conn.end_stream(sid)
                        await self.flush()
                    return
                size = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size,
                           len(view))
                if size <= 0:
                    await self._wait_flow()
                    continue
                last = size == len(view)
                self.conn.send_data(sid, bytes(view[:size]), end_stream=end and last)
            except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError) as exc:
                ex.gone.set()
                raise ConnectionClosed(f"h2 stream {sid}: {exc}") from exc
            view = view[size:]
            await self.flush()
            if not view:
                return

    async def _wait_flow(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flow_waiters.append(fut)
        await fut

    def _wake_flow(self) -> None:
        waiters, self._flow_waiters = self._flow_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        for ex in self.streams.values():
            ex.gone.set()
            ex.body.put_nowait(None)
        self._wake_flow()

    async def run(self) -> None:
        conn = self.conn
        conn.initiate_connection()
        conn.update_settings({
            h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW,
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 1000,
        })
        conn.increment_flow_control_window(WINDOW)
        try:
            await self.flush()
            data = self.initial
            while not self.closed:
                if not data:
                    data = await self.reader.read(1 << 16)
                    if not data:
                        break
                try:
                    events = conn.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    log.info("h2 protocol error from client: %s", exc)
                    with contextlib.suppress(ConnectionClosed):
                        await self.flush()
                    break
                data = b""
                for event in events:
                    self._on_event(event)
                await self.flush()
        except (ConnectionError, ConnectionClosed, asyncio.IncompleteReadError):
            pass
        finally:
            self._lost()
            with contextlib.suppress(Exception):
                self.writer.close()

    def _on_event(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            ex = _H2Exchange(self, event.stream_id, event.headers)
            self.streams[event.stream_id] = ex
            task = asyncio.get_running_loop().create_task(self._serve(ex))
            self.tasks.add(task)
            self.server._handler_tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            task.add_done_callback(self.server._handler_tasks.discard)
        elif isinstance(event, h2.events.DataReceived):
            ex_d = self.streams.get(event.stream_id)
            with contextlib.suppress(h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if ex_d is not None and event.data:
                ex_d.body.put_nowait(event.data)
        elif isinstance(event, h2.events.StreamEnded):
            ex_e = self.streams.get(event.stream_id)
            if ex_e is not None:
                ex_e.body.put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            ex_r = self.streams.get(event.stream_id)
            if ex_r is not None:
                ex_r.gone.set()
                ex_r.body.put_nowait(None)
            self._wake_flow()
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._wake_flow()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._lost()

    async def _serve(self, ex: _H2Exchange) -> None:
        try:
            await _handle_exchange(self.server.router, ex)
        except ConnectionClosed:
            pass
        finally:
            self.streams.pop(ex.stream_id, None)
            if self.draining and not self.streams:
                await self.shutdown(goaway_sent=True)

    async def drain_and_close(self) -> None:
        """GOAWAY (NO_ERROR) now; close the socket once the streams still open have finished."""
        if self.draining or self.closed:
            return
        self.draining = True
        with contextlib.suppress(Exception):
            self.conn.close_connection()
            await self.flush()

    async def shutdown(self, goaway_sent: bool = False) -> None:
        if self.closed:
            return
        if not goaway_sent:
            with contextlib.suppress(Exception):
                self.conn.close_connection()
                await self.flush()
        self._lost()
        with contextlib.suppress(Exception):
            self.writer.close()


class _H1Exchange(_Exchange):
    def __init__(self, session: _H1Session, request: h11.Request) -> None:
        super().__init__()
        self.session = session
        self.http_version = request.http_version.decode()
        self.method = request.method.decode()
        self.path = request.target.decode("latin-1")
        self.headers = {}
        for k, v in request.headers:
            name = k.decode("latin-1").lower()
            value = v.decode("latin-1")
            self.headers[name] = self.headers[name] + ", " + value if name in self.headers else value
        self.body_done = False
        self.keep_alive = True
        self._watcher: asyncio.Task[None] | None = None

    async def read_chunk(self) -> bytes | None:
        if self.body_done:
            return None
        if self.session.conn.they_are_waiting_for_100_continue:
            self.session.write(h11.InformationalResponse(status_code=100, headers=[]))
            await self.session.drain(self)
        ev = await self.session.next_event()
        if isinstance(ev, h11.Data):
            return bytes(ev.data)
        self.body_done = True
        if not isinstance(ev, h11.EndOfMessage):
            self.gone.set()
        return None

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        if self.gone.is_set():
            raise ConnectionClosed("client closed the connection")
        self.started = True
        hdrs = list(headers)
        if not self.body_done:
            # We answer before the body ended (a 464 for Run): the connection cannot be reused.
            self.keep_alive = False
            hdrs.append(("connection", "close"))
        self.session.write(h11.Response(status_code=status, headers=hdrs))
        await self.session.drain(self)
        if self.body_done and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self.session.watch(self))

    async def write(self, data: bytes) -> None:
        if self.gone.is_set() or self.finished:
            raise ConnectionClosed("client closed the connection")
        if data:
            self.session.write(h11.Data(data=data))
            await self.session.drain(self)

    async def finish(self, trailers: list[tuple[str, str]] | None = None) -> None:
        if self.finished:
            return
        self.finished = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        if self.gone.is_set():
            return
        # Trailers need chunked framing (responses started without content-length get it).
        self.session.write(h11.EndOfMessage(headers=trailers or []))
        await self.session.drain(self)

    async def goaway(self) -> None:
        self.keep_alive = False

    async def reset(self) -> None:
        self.finished = True
        self.gone.set()
        if self._watcher is not None:
            self._watcher.cancel()
        transport = self.session.writer.transport
        transport.abort()


class _H1Session:
    def __init__(self, server: AgentServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 initial: bytes = b"") -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=1 << 20)
        if initial:
            self.conn.receive_data(initial)
        self.current: _H1Exchange | None = None
        self.closed = False

    async def next_event(self) -> Any:
        while True:
            try:
                ev = self.conn.next_event()
            except h11.RemoteProtocolError:
                return h11.ConnectionClosed()
            if ev is h11.NEED_DATA:
                try:
                    data = await self.reader.read(1 << 16)
                except ConnectionError:
                    data = b""
                self.conn.receive_data(data)
                continue
            return ev

    async def watch(self, ex: _H1Exchange) -> None:
        """While a response streams, notice the client hanging up (and keep pipelined bytes)."""
        try:
            while True:
                data = await self.reader.read(1 << 16)
                if not data:
                    break
                self.conn.receive_data(data)
        except (ConnectionError, h11.RemoteProtocolError):
            pass
        ex.gone.set()

    def write(self, event: Any) -> None:
        try:
            data = self.conn.send(event)
        except h11.LocalProtocolError as exc:
            raise ConnectionClosed(f"HTTP/1.1 state: {exc}") from exc
        if data:
            self.writer.write(data)

    async def drain(self, ex: _H1Exchange) -> None:
        try:
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            ex.gone.set()
            raise ConnectionClosed(str(exc)) from exc

    async def run(self) -> None:
        try:
            while not self.closed:
                ev = await self.next_event()
                if not isinstance(ev, h11.Request):
                    break
                ex = self.current = _H1Exchange(self, ev)
                try:
                    await _handle_exchange(self.server.router, ex)
                except ConnectionClosed:
                    break
                if ex.gone.is_set() or not ex.keep_alive or self.conn.our_state is not h11.DONE:
                    break
                try:
                    self.conn.start_next_cycle()
                except h11.LocalProtocolError:
                    break
        finally:
            self.closed = True
            if self.current is not None:
                self.current.gone.set()
            with contextlib.suppress(Exception):
                self.writer.close()

    async def shutdown(self) -> None:
        self.closed = True
        if self.current is not None:
            self.current.gone.set()
        with contextlib.suppress(Exception):
            self.writer.close()


# --------------------------------------------------------------------------------------------
# Agent connections
# --------------------------------------------------------------------------------------------


class _Conn:
    """AgentConnection over one exchange; ``channel`` is the BidiAppend side for runsse/runpoll."""

    def __init__(self, transport: str, request_id: str | None, ex: _Exchange, framing: F.Framing,
                 channel: BidiChannel | None = None, gzip_min: int | None = None) -> None:
        self.transport = transport
        self.framing = framing
        self.request_id = request_id
        self.headers: Mapping[str, str] = ex.headers
        self._ex = ex
        self._enc = F.ResponseEncoder(framing, gzip_min)
        self._channel = channel
        self._parser = EnvelopeParser() if channel is None else None
        self._decoder = F.RequestDecoder(framing)
        self._pending: list[bytes] = []
        self._client_done = False
        self._poll_seq = 0
        self.ended = False
        self.sent = 0

    @property
    def append_faults(self) -> list[str]:
        """Seqno faults seen on the BidiAppend side (duplicates, long gaps); empty for ``run``."""
        return self._channel.faults if self._channel is not None else []

    @property
    def client_gone(self) -> bool:
        return self._ex.gone.is_set()

    async def receive(self) -> bytes | None:
        if self._channel is not None:
            if self._client_done:
                return None
            item = await self._channel.queue.get()
            if item is None:
                self._client_done = True
            return item
        assert self._parser is not None
        while not self._pending:
            if self._client_done:
                return None
            chunk = await self._ex.read_chunk()
            try:
                data = self._decoder.feed(chunk) if chunk is not None else self._decoder.close()
            except F.FramingError as exc:
                log.info("run %s: %s", self.request_id, exc)
                self._client_done = True
                return None
            envs = self._parser.feed(data) if chunk is not None else self._parser.close()
            if chunk is None:
                self._client_done = True
            for env in envs:
                if env.error is not None and (env.flags < 0 or chunk is None):
                    log.info("run %s: unframeable client bytes: %s", self.request_id, env.error)
                    self._client_done = True
                    break
                if env.is_end_stream or env.is_trailer:
                    self._client_done = True
                    break
                self._pending.append(env.payload)
        return self._pending.pop(0)

    async def send(self, message: bytes) -> None:
        if self.ended:
            raise ConnectionClosed("stream already ended")
        if self.transport == "runpoll":
            message = poll_record(self._poll_seq, message, False)
            self._poll_seq += 1
        await self._ex.write(self._enc.message(message))
        self.sent += 1

    async def end(self, error: dict[str, Any] | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        out = b""
        if self.transport == "runpoll":
            out += self._enc.message(poll_record(self._poll_seq, None, True))
            self._poll_seq += 1
        body, trailers = self._enc.end(error)
        try:
            if out + body:
                await self._ex.write(out + body)
            await self._ex.finish(trailers)
        except ConnectionClosed:
            pass
        self._release()

    async def close(self) -> None:
        if self.ended:
            return
        self.ended = True
        with contextlib.suppress(ConnectionClosed):
            await self._ex.finish()
        self._release()

    async def goaway(self) -> None:
        """After ``end()``: tell the client this connection takes no more runs (GOAWAY 0)."""
        with contextlib.suppress(ConnectionClosed):
            await self._ex.goaway()

    async def reset(self) -> None:
        """Abort the stream without end-stream (RST_STREAM / dropped connection), like a network drop."""
        if self.ended:
            return
        self.ended = True
        await self._ex.reset()
        self._release()

    def _release(self) -> None:
        if self._channel is not None:
            self._channel.close()


# --------------------------------------------------------------------------------------------
# Routing
# --------------------------------------------------------------------------------------------


async def _handle_exchange(router: _Router, ex: _Exchange) -> None:
    """Route one request; a handler that wrote nothing gets a 500, one left open is finished."""
    await router.handle(ex)
    if not ex.started:
        await ex.respond(500, b"", "text/plain")
    elif not ex.finished:
        await ex.finish()


class _Router:
    def __init__(self, handler: Handler, unary: Mapping[str, UnaryHandler], auth: AuthCheck | None,
                 append_grace: float = APPEND_GRACE, gzip_min: int | None = None) -> None:
        self.handler = handler
        self.gzip_min = gzip_min
        self.unary = dict(unary)
        self.auth = auth
        self.appends = BidiChannels(append_grace)

    @property
    def channels(self) -> dict[str, BidiChannel]:
        return self.appends.channels

    def _gzip_for(self, headers: Mapping[str, str], framing: F.Framing) -> tuple[int | None, list[tuple[str, str]]]:
        """Envelope compression only for Connect clients that accept it (connect-accept-encoding: gzip)."""
        accepted = "gzip" in headers.get("connect-accept-encoding", "").lower()
        if self.gzip_min is None or not accepted or framing.name != F.CONNECT:
            return None, []
        return self.gzip_min, [("connect-content-encoding", "gzip")]

    async def handle(self, ex: _Exchange) -> None:
        path = ex.path.split("?", 1)[0]
        if ex.method == "GET" and path in ("/", "/health"):
            await ex.respond(200, b"workbench agent backend\n", "text/plain")
            return
        if ex.method != "POST":
            await ex.respond(405, b"", "text/plain")
            return
        if path == RUN_PATH:
            await self._run(ex)
        elif path in (RUNSSE_PATH, RUNPOLL_PATH):
            await self._bidi(ex, "runsse" if path == RUNSSE_PATH else "runpoll")
        elif path == APPEND_PATH:
            await self._unary(ex, path, self.appends.handle)
        elif path in self.unary:
            await self._unary(ex, path, self.unary[path])
        else:
            await ex.read_body()
            await _send_unary(ex, F.guess(ex.headers), unary_error(
                connect_error("unimplemented", f"{path} is not implemented")))

    def _auth_error(self, headers: Mapping[str, str]) -> dict[str, Any] | None:
        return self.auth(headers) if self.auth is not None else None

    async def _run(self, ex: _Exchange) -> None:
        if ex.http_version != "2":
            # What the real load balancer answers to Run over HTTP/1.1.
            await ex.respond(464, b"", "text/plain")
            return
        try:
            framing = F.for_stream(ex.headers)
        except F.FramingRefused:
            await ex.respond(415, b"", "text/plain")
            return
        gzip_min, extra = self._gzip_for(ex.headers, framing)
        await ex.start(200, [("content-type", framing.content_type), *extra])
        conn = _Conn("run", ex.headers.get("x-request-id"), ex, framing, gzip_min=gzip_min)
        await self._drive(conn)

    async def _bidi(self, ex: _Exchange, transport: str) -> None:
        body = await ex.read_body()
        try:
            framing = F.for_stream(ex.headers)
        except F.FramingRefused:
            await ex.respond(415, b"", "text/plain")
            return
        ctype = framing.content_type
        if framing.name == F.CONNECT and transport == "runsse" and "text/event-stream" in ex.headers.get("accept", ""):
            ctype = "text/event-stream"
        gzip_min, extra = self._gzip_for(ex.headers, framing)
        await ex.start(200, [("content-type", ctype), ("cache-control", "no-cache"),
                             ("x-accel-buffering", "no"), *extra])
        try:
            request_id, problem = bidi_request_id(F.stream_request_envelopes(framing, body), transport)
        except F.FramingError as exc:
            request_id, problem = None, str(exc)
        channel = BidiChannel(request_id or "")
        conn = _Conn(transport, request_id, ex, framing, channel, gzip_min=gzip_min)
        if problem is not None:
            await conn.end(connect_error("invalid_argument", problem))
            return
        problem = self.appends.register(channel)
        if problem is not None:
            await conn.end(connect_error("already_exists", problem))
            return
        header_id = ex.headers.get("x-request-id")
        if header_id and header_id != request_id:
            channel.faults.append(f"x-request-id header {header_id} differs from body request_id {request_id}")
        watcher = asyncio.get_running_loop().create_task(_close_on_gone(ex, channel))
        try:
            await self._drive(conn)
        finally:
            watcher.cancel()
            self.appends.release(channel)

    async def _drive(self, conn: _Conn) -> None:
        err = self._auth_error(conn.headers)
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

    async def _unary(self, ex: _Exchange, path: str, handler: UnaryHandler) -> None:
        body = await ex.read_body()
        try:
            framing = F.for_unary(ex.headers, body)
        except F.FramingRefused:
            # What the service answers an envelope sent as Connect unary, or connect+proto on a
            # unary method: a bare 415, no body.
            await ex.respond(415, b"", "text/plain")
            return
        err = self._auth_error(ex.headers)
        if err is not None:
            await _send_unary(ex, framing, unary_error(err))
            return
        try:
            payload = F.unary_payload(framing, body)
        except F.FramingError as exc:
            await _send_unary(ex, framing, unary_error(connect_error("invalid_argument", str(exc))))
            return
        try:
            resp = await handler(UnaryRequest(path, ex.headers, payload))
        except Exception as exc:
            log.exception("unary handler %s failed", path)
            resp = unary_error(connect_error("internal", f"{path}: {exc}"))
        await _send_unary(ex, framing, resp)


async def _close_on_gone(ex: _Exchange, channel: BidiChannel) -> None:
    await ex.gone.wait()
    channel.close()


async def _send_unary(ex: _Exchange, framing: F.Framing, resp: UnaryResponse) -> None:
    """A unary answer in the caller's framing: Connect as the handler wrote it; gRPC and gRPC-Web
    always HTTP 200, the message enveloped and the status in trailers (a Connect error re-coded)."""
    if not framing.grpc_family:
        await ex.respond(resp.status, resp.body, resp.content_type, resp.headers)
        return
    enc = F.ResponseEncoder(framing)
    message = enc.message(resp.body) if resp.status == 200 else b""
    end, trailers = enc.end(None if resp.status == 200 else F.connect_error_of(resp.body, resp.status))
    headers = [("content-type", framing.content_type), *resp.headers.items()]
    if trailers is None:
        await ex.respond(200, message + end, framing.content_type, resp.headers)
        return
    await ex.start(200, headers)
    if message:
        await ex.write(message)
    await ex.finish(trailers)

# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class AgentServer:
    """A listening socket; ``url`` is what clients connect to."""

    def __init__(self, router: _Router, host: str, tls: bool, cert_path: Path | None) -> None:
        self.router = router
        self.host = host
        self.tls = tls
        self.cert_path = cert_path
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._sessions: set[_H2Session | _H1Session] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._handler_tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        session: _H2Session | _H1Session
        try:
            sslobj = writer.get_extra_info("ssl_object")
            initial = b""
            if sslobj is not None:
                use_h2 = sslobj.selected_alpn_protocol() == "h2"
            else:
                initial, use_h2 = await _sniff_preface(reader)
            session = (_H2Session if use_h2 else _H1Session)(self, reader, writer, initial)
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
        for ch in list(self.router.channels.values()):
            ch.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> AgentServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def _sniff_preface(reader: asyncio.StreamReader) -> tuple[bytes, bool]:
    """Plain TCP: HTTP/2 prior knowledge (h2c) starts with the fixed preface, anything else is 1.1."""
    buf = b""
    while len(buf) < len(H2_PREFACE) and H2_PREFACE.startswith(buf):
        chunk = await reader.read(len(H2_PREFACE) - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf, buf == H2_PREFACE


def tls_context(certfile: str | Path, keyfile: str | Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(str(certfile), str(keyfile) if keyfile else None)
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    return ctx


async def serve(handler: Handler, *, host: str = "127.0.0.1", port: int = 0, tls: bool = True,
                certfile: str | Path | None = None, keyfile: str | Path | None = None,
                unary: Mapping[str, UnaryHandler] | None = None, auth: AuthCheck | None = None,
                cert_dir: str | Path | None = None, append_grace: float = APPEND_GRACE,
                gzip_min: int | None = None) -> AgentServer:
    """Listen on ``host:port`` (0 = a free port) and run ``handler`` for every agent run.

    With ``tls`` and no ``certfile``, the self-signed loopback certificate from
    ``workbench.sim.certs`` is used (made on first use in ``cert_dir``). ``append_grace`` is how
    long a BidiAppend waits for its RunSSE/RunPoll stream to appear before it gets a 404.
    ``gzip_min``: gzip (flag 0x01) every envelope of at least that many bytes, for clients that
    send ``connect-accept-encoding: gzip``.
    """
    ctx: ssl.SSLContext | None = None
    cert_path: Path | None = None
    if tls:
        if certfile is None:
            from workbench.sim.certs import ensure_cert

            pair = ensure_cert(cert_dir)
            certfile, keyfile = pair.cert_path, pair.key_path
        cert_path = Path(certfile)
        ctx = tls_context(certfile, keyfile)
    server = AgentServer(_Router(handler, unary or {}, auth, append_grace, gzip_min), host, tls, cert_path)
    server._server = await asyncio.start_server(server._on_client, host, port, ssl=ctx,
                                                limit=1 << 20, backlog=256)
    server.port = server._server.sockets[0].getsockname()[1]
    return server
