"""HTTP/2 server connections on ``h2``: one ``H2Session`` per connection, one ``H2Exchange`` per stream.

Full duplex: a handler may write before the client finished (or started) its request body.
Each DATA frame is written and drained as it is sent, within the peer's flow-control window; the
windows we grant are large, because a MITM or client with the 16 KiB defaults caused
FRAME_SIZE_ERROR GOAWAYs in the field and big KV blobs must not stall on flow control.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from workbench.transport.exchange import ConnectionClosed, Exchange

log = logging.getLogger("workbench.transport")

MAX_FRAME_SIZE = (1 << 24) - 1
WINDOW = 1 << 24

ServeExchange = Callable[[Exchange], Awaitable[None]]


class H2Exchange(Exchange):
    def __init__(self, session: H2Session, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
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

    async def start(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        if self.gone.is_set():
            raise ConnectionClosed("stream reset by the client")
        self.started = True
        hdrs = [(":status", str(status))] + [(k.lower(), v) for k, v in headers if k.lower() != "connection"]
        self.session.send_headers(self.stream_id, hdrs)
        if body:
            await self.session.send_data(self, body, end=False)  # flushes the headers with it
        else:
            await self.session.flush()

    async def write(self, data: bytes) -> None:
        if self.gone.is_set() or self.finished:
            raise ConnectionClosed("stream reset by the client")
        await self.session.send_data(self, data, end=False)

    async def finish(self, data: bytes = b"", trailers: list[tuple[str, str]] | None = None) -> None:
        if self.finished:
            return
        if trailers and data:
            await self.write(data)
            data = b""
        self.finished = True
        if self.gone.is_set():
            return
        if trailers:
            self.session.send_headers(self.stream_id, trailers, end_stream=True)
            await self.session.flush()
            return
        await self.session.send_data(self, data, end=True)

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


class H2Session:
    """One HTTP/2 connection: reads frames, starts a handler task per request stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, serve: ServeExchange,
                 handler_tasks: set[asyncio.Task[None]], initial: bytes = b"") -> None:
        self.reader = reader
        self.writer = writer
        self.serve = serve
        self.handler_tasks = handler_tasks  # the server's: cancelled when it closes
        self.initial = initial
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding=None))
        self.streams: dict[int, H2Exchange] = {}
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

    async def send_data(self, ex: H2Exchange, data: bytes, end: bool) -> None:
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
            ex = H2Exchange(self, event.stream_id, event.headers)
            self.streams[event.stream_id] = ex
            task = asyncio.get_running_loop().create_task(self._serve(ex))
            self.tasks.add(task)
            self.handler_tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            task.add_done_callback(self.handler_tasks.discard)
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

    async def _serve(self, ex: H2Exchange) -> None:
        try:
            await self.serve(ex)
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
