"""HTTP/1.1 server connections on ``h11``: one ``H1Session`` per connection, one ``H1Exchange``
per request, with keep-alive.

``h11`` does the message framing both ways (content-length, chunked bodies and their trailers,
``Expect: 100-continue``, HTTP/1.0 peers); a request that breaks it is answered by the app's
``bad_request`` (a 400 that names what was wrong) and the connection is closed. While a response
streams, the session keeps reading so that a client hanging up is noticed at the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
from collections.abc import Awaitable, Callable
from typing import Any

import h11

from workbench.transport.exchange import ConnectionClosed, Exchange, RequestError

ServeExchange = Callable[[Exchange], Awaitable[None]]
# reason → (status, content type, body) of the answer to a request h11 cannot parse; None: just close.
BadRequest = Callable[[str], "tuple[int, str, bytes] | None"]

MAX_HEAD = 1 << 20  # request line + header fields


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


class H1Exchange(Exchange):
    def __init__(self, session: H1Session, request: h11.Request) -> None:
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
        self._early: list[bytes] = []  # body bytes taken from h11's buffer by _settle_body
        self._watcher: asyncio.Task[None] | None = None

    async def read_chunk(self) -> bytes | None:
        if self._early:
            return self._early.pop(0)
        if self.body_done:
            return None
        if self.session.conn.they_are_waiting_for_100_continue:
            await self.session.send(self.session.encode(h11.InformationalResponse(status_code=100, headers=[])), self)
        try:
            ev = await self.session.next_event()
        except h11.RemoteProtocolError as exc:
            self.body_done = True
            self.keep_alive = False
            raise RequestError(400, body_problem(self.headers, exc)) from exc
        if isinstance(ev, h11.Data):
            return bytes(ev.data)
        self.body_done = True
        if not isinstance(ev, h11.EndOfMessage):
            self.gone.set()
        return None

    def _settle_body(self) -> None:
        """Without waiting: take what h11 already holds of the body, noting whether it has ended
        (an unread body that has not ended means the connection cannot be reused)."""
        while not self.body_done:
            try:
                ev = self.session.conn.next_event()
            except h11.RemoteProtocolError:
                self.body_done = True
                self.keep_alive = False
                return
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                return
            if isinstance(ev, h11.Data):
                self._early.append(bytes(ev.data))
                continue
            self.body_done = True
            if not isinstance(ev, h11.EndOfMessage):
                self.keep_alive = False

    async def start(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        if self.gone.is_set():
            raise ConnectionClosed("client closed the connection")
        self.started = True
        self._settle_body()
        hdrs = list(headers)
        if not (self.body_done and self.keep_alive):
            # We answer before the body ended (a 464 for Run, a refused request), or were told to
            # close: the connection cannot be reused.
            self.keep_alive = False
            hdrs.append(("connection", "close"))
        data = self.session.encode(h11.Response(status_code=status, headers=hdrs, reason=_reason(status)))
        if body:
            data += self.session.encode(h11.Data(data=body))
        await self.session.send(data, self)
        if self.body_done and self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self.session.watch(self))

    async def write(self, data: bytes) -> None:
        if self.gone.is_set() or self.finished:
            raise ConnectionClosed("client closed the connection")
        if data:
            await self.session.send(self.session.encode(h11.Data(data=data)), self)

    async def finish(self, data: bytes = b"", trailers: list[tuple[str, str]] | None = None) -> None:
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
        out = self.session.encode(h11.Data(data=data)) if data else b""
        out += self.session.encode(h11.EndOfMessage(headers=trailers or []))
        await self.session.send(out, self)

    async def goaway(self) -> None:
        self.keep_alive = False

    async def reset(self) -> None:
        self.finished = True
        self.gone.set()
        if self._watcher is not None:
            self._watcher.cancel()
        self.session.writer.transport.abort()


def body_problem(headers: dict[str, str], exc: h11.RemoteProtocolError) -> str:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return f"malformed chunked body (bad chunk size line or framing): {exc}"
    return f"malformed request body: {exc}"


class H1Session:
    """One HTTP/1.1 connection: requests one after the other (keep-alive), each served inline."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, serve: ServeExchange,
                 bad_request: BadRequest | None = None, initial: bytes = b"") -> None:
        self.reader = reader
        self.writer = writer
        self.serve = serve
        self.bad_request = bad_request
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        if initial:
            self.conn.receive_data(initial)
        self.current: H1Exchange | None = None
        self.closed = False

    async def next_event(self) -> Any:
        """The next h11 event, reading as needed; raises h11.RemoteProtocolError on bad input."""
        while True:
            ev = self.conn.next_event()
            if ev is h11.NEED_DATA:
                try:
                    data = await self.reader.read(1 << 16)
                except ConnectionError:
                    data = b""
                self.conn.receive_data(data)
                continue
            return ev

    async def watch(self, ex: H1Exchange) -> None:
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

    def encode(self, event: Any) -> bytes:
        try:
            return self.conn.send(event) or b""
        except h11.LocalProtocolError as exc:
            raise ConnectionClosed(f"HTTP/1.1 state: {exc}") from exc

    async def send(self, data: bytes, ex: H1Exchange) -> None:
        """Write and drain (one write: a status line with its first body bytes leaves as one)."""
        if not data:
            return
        self.writer.write(data)
        try:
            await self.writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            ex.gone.set()
            raise ConnectionClosed(str(exc)) from exc

    async def run(self) -> None:
        try:
            while not self.closed:
                try:
                    ev = await self.next_event()
                except h11.RemoteProtocolError as exc:
                    await self._refuse(str(exc))
                    break
                if not isinstance(ev, h11.Request):
                    break
                ex = self.current = H1Exchange(self, ev)
                try:
                    await self.serve(ex)
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

    async def _refuse(self, reason: str) -> None:
        """Answer a request h11 could not parse (if the app wants to) before closing."""
        answer = self.bad_request(reason) if self.bad_request is not None else None
        if answer is None or self.conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        status, content_type, body = answer
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError, RuntimeError):
            self.writer.write(self.conn.send(h11.Response(
                status_code=status, reason=_reason(status),
                headers=[("content-type", content_type), ("content-length", str(len(body))),
                         ("connection", "close")])) or b"")
            self.writer.write((self.conn.send(h11.Data(data=body)) or b"")
                              + (self.conn.send(h11.EndOfMessage()) or b""))
            await self.writer.drain()

    async def shutdown(self) -> None:
        self.closed = True
        if self.current is not None:
            self.current.gone.set()
        with contextlib.suppress(Exception):
            self.writer.close()
