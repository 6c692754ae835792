"""Network plumbing shared by the client transports: TLS contexts, proxy discovery, a full-duplex
HTTP/2 client.

httpx (httpcore) sends a whole request body before it reads the response, which deadlocks the bidi
``Run`` RPC, so Run goes through :class:`H2Connection`: asyncio + ``h2`` over TLS (ALPN h2), through
an HTTP CONNECT tunnel when ``HTTPS_PROXY`` applies, so the built-in flow can be captured by
mitmproxy like any other client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from workbench.errors import WorkbenchError

# Advertised to the server (docs/protocol.md §1, "HTTP/2 connections"): a 16 KiB max frame size made MITMs GOAWAY.
_MAX_FRAME = (1 << 24) - 1
_WINDOW = (1 << 31) - 1
_PING_EVERY = 15.0

# What a caller may pass as ``verify``: a CA file (str or path-like, e.g. a replay server's
# ``cert_path``), True/None for system trust, False for none, or a ready SSLContext.
Verify = ssl.SSLContext | str | os.PathLike[str] | bool | None


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel helper tasks and wait for them to finish.

    ``gather(return_exceptions=True)`` keeps the helpers' CancelledError out of our way while still
    letting a cancellation of the *calling* task through — suppressing CancelledError around
    ``await task`` would swallow that too, and a shutdown would then hang.
    """
    pending = [t for t in tasks if not t.done()]
    for t in pending:
        if not t.cancelling():  # one already being cancelled may be cleaning up: just wait for it
            t.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


class NetError(WorkbenchError):
    """A transport-level failure (connect, TLS, proxy tunnel, HTTP/2 reset or GOAWAY)."""


def ssl_context(verify: Verify = None, alpn: Sequence[str] = ("h2", "http/1.1")) -> ssl.SSLContext | bool:
    """A client TLS context.

    ``verify``: None/True = system trust (OpenSSL's default paths honour ``SSL_CERT_FILE``), a path
    (``str`` or ``os.PathLike``) = system trust plus that CA/certificate file (e.g. the simulator's
    self-signed certificate), False = no verification, or a ready SSLContext: its trust and client
    certificates are used as given, and the client offers ALPN ``h2`` and ``http/1.1`` on it (a
    context made by ``ssl.create_default_context()`` offers none, and Run needs h2; one context
    may serve the client's HTTP/2 and HTTP/1.1 connections alike). A CA file that cannot be read raises ``NetError``
    naming it, rather than surfacing later as a certificate failure.
    """
    if isinstance(verify, ssl.SSLContext):
        verify.set_alpn_protocols(["h2", "http/1.1"])
        return verify
    if verify is False:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    else:
        ctx = ssl.create_default_context()
        if isinstance(verify, str | os.PathLike) and os.fspath(verify):
            cafile = os.fspath(verify)
            try:
                ctx.load_verify_locations(cafile=cafile)
            except (OSError, ssl.SSLError) as exc:
                raise NetError(f"verify={cafile!r}: cannot load CA file: {exc}") from exc
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def proxy_for(url: str) -> str | None:
    """The HTTPS proxy the environment asks for (``HTTPS_PROXY``/``ALL_PROXY``, minus ``NO_PROXY``)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme or "https") or proxies.get("all")
    if not proxy:
        return None
    if urllib.request.proxy_bypass_environment(host, proxies):  # type: ignore[attr-defined]
        return None
    return proxy


def host_port(url: str) -> tuple[str, int, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("https", "http"):
        raise NetError(f"upstream URL {url!r}: scheme must be https or http")
    host = parts.hostname
    if not host:
        raise NetError(f"upstream URL {url!r} has no host")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    authority = host if parts.port is None else f"{host}:{port}"
    return host, port, authority


async def open_tls(url: str, ctx: ssl.SSLContext | bool, *, timeout: float = 30.0
                   ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """TCP (+ CONNECT through the environment's proxy) + TLS to ``url``'s host."""
    host, port, _ = host_port(url)
    tls: ssl.SSLContext | None = ctx if isinstance(ctx, ssl.SSLContext) else None
    if urllib.parse.urlsplit(url).scheme == "http":
        tls = None
    proxy = proxy_for(url)
    async with asyncio.timeout(timeout):
        if not proxy:
            try:
                return await asyncio.open_connection(host, port, ssl=tls, server_hostname=host if tls else None)
            except (OSError, ssl.SSLError) as exc:
                raise NetError(f"cannot connect to {host}:{port}: {exc}") from exc
        pparts = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        phost, pport = pparts.hostname or "127.0.0.1", pparts.port or 8080
        try:
            reader, writer = await asyncio.open_connection(phost, pport)
        except OSError as exc:
            raise NetError(f"cannot connect to proxy {phost}:{pport} (HTTPS_PROXY): {exc}") from exc
        writer.write(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200":
            writer.close()
            raise NetError(f"proxy {phost}:{pport} refused CONNECT {host}:{port}: {head.splitlines()[0]!r}")
        if tls is not None:
            try:
                await writer.start_tls(tls, server_hostname=host)
            except (OSError, ssl.SSLError) as exc:
                raise NetError(f"TLS to {host}:{port} through proxy {phost}:{pport} failed: {exc}") from exc
        return reader, writer


@dataclass
class H2Stream:
    """One request/response exchange on an :class:`H2Connection`, both halves open at once."""

    conn: H2Connection
    stream_id: int
    headers: dict[str, str] = field(default_factory=dict)
    trailers: dict[str, str] = field(default_factory=dict)
    got_headers: asyncio.Event = field(default_factory=asyncio.Event)
    queue: asyncio.Queue[bytes | BaseException | None] = field(default_factory=asyncio.Queue)
    ended_local: bool = False
    ended_remote: bool = False
    error: BaseException | None = None
    reset_code: int | None = None  # the error code of the server's RST_STREAM, when it reset the stream

    @property
    def status(self) -> int:
        return int(self.headers.get(":status", "0") or 0)

    async def send(self, data: bytes, end: bool = False) -> None:
        await self.conn.send_data(self.stream_id, data, end)
        if end:
            self.ended_local = True

    async def end(self) -> None:
        if not self.ended_local:
            self.ended_local = True
            await self.conn.send_data(self.stream_id, b"", True)

    async def response(self) -> dict[str, str]:
        """Wait for the response headers (raises if the stream fails first)."""
        await self.got_headers.wait()
        if not self.headers:
            raise self.error or NetError(f"HTTP/2 stream {self.stream_id} failed before response headers")
        return self.headers

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.queue.put_nowait(exc)
        self.got_headers.set()

    async def chunks(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.queue.get()
            if item is None:
                self.queue.put_nowait(None)
                return
            if isinstance(item, BaseException):
                self.queue.put_nowait(item)
                raise item
            yield item

    def cancel(self) -> None:
        self.conn.reset(self.stream_id)


class H2Connection:
    """A client HTTP/2 connection with explicit flow control, PING keepalive and GOAWAY handling."""

    def __init__(self, url: str, verify: Verify = None) -> None:
        self.url = url
        self.host, self.port, self.authority = host_port(url)
        self.scheme = urllib.parse.urlsplit(url).scheme
        self._ctx = ssl_context(verify, alpn=("h2",))
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        cfg = h2.config.H2Configuration(client_side=True, header_encoding="utf-8",
                                        validate_inbound_headers=False)
        self._h2 = h2.connection.H2Connection(config=cfg)
        self._streams: dict[int, H2Stream] = {}
        self._window = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.closed = False
        self.goaway = False
        self.goaway_seen = asyncio.Event()  # set when the server's GOAWAY arrives
        self.alpn: str | None = None
        self._lock = asyncio.Lock()

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    @property
    def usable(self) -> bool:
        return not self.closed and not self.goaway and self._writer is not None

    async def connect(self) -> None:
        self._reader, self._writer = await open_tls(self.url, self._ctx)
        sslobj = self._writer.get_extra_info("ssl_object")
        self.alpn = sslobj.selected_alpn_protocol() if sslobj is not None else None
        if sslobj is not None and self.alpn != "h2":
            self._writer.close()
            raise NetError(f"{self.authority} did not negotiate HTTP/2 (ALPN {self.alpn!r}); Run needs h2")
        h = self._h2
        h.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_FRAME,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
        })
        # h2 applies initial_values to what it advertises but keeps checking inbound frames against
        # the 16 KiB default; the server may use the larger size as soon as it reads our SETTINGS.
        h.max_inbound_frame_size = _MAX_FRAME
        h.initiate_connection()
        h.increment_flow_control_window(_WINDOW - 65535)
        self._flush_nowait()
        self._tasks.append(asyncio.create_task(self._read_loop()))
        self._tasks.append(asyncio.create_task(self._ping_loop()))

    def _flush_nowait(self) -> None:
        data = self._h2.data_to_send()
        if data and self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    async def _flush(self) -> None:
        self._flush_nowait()
        if self._writer is not None:
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()

    async def request(self, path: str, headers: Sequence[tuple[str, str]], *, end: bool = False) -> H2Stream:
        if not self.usable:
            raise NetError(f"HTTP/2 connection to {self.authority} is closed")
        async with self._lock:
            sid = self._h2.get_next_available_stream_id()
            stream = H2Stream(self, sid)
            self._streams[sid] = stream
            hdrs = [(":method", "POST"), (":scheme", self.scheme), (":authority", self.authority),
                    (":path", path), *headers]
            self._h2.send_headers(sid, hdrs, end_stream=end)
            stream.ended_local = end
            await self._flush()
        return stream

    async def send_data(self, sid: int, data: bytes, end: bool) -> None:
        view = memoryview(data)
        while True:
            if self.closed:
                raise NetError(f"HTTP/2 connection to {self.authority} closed while sending")
            if not view:
                if end:
                    try:
                        self._h2.end_stream(sid)
                    except h2.exceptions.StreamClosedError as exc:
                        raise NetError(f"HTTP/2 stream {sid} already closed") from exc
                    except h2.exceptions.ProtocolError as exc:  # a GOAWAY closed the connection (h2 state CLOSED)
                        raise NetError(f"HTTP/2 connection to {self.authority} closed by the server: {exc}") from exc
                    await self._flush()
                return
            try:
                window = self._h2.local_flow_control_window(sid)
            except h2.exceptions.StreamClosedError as exc:
                raise NetError(f"HTTP/2 stream {sid} closed by the server while sending") from exc
            if window <= 0:
                self._window.clear()
                await self._window.wait()
                continue
            n = min(window, self._h2.max_outbound_frame_size, len(view))
            last = end and n == len(view)
            try:
                self._h2.send_data(sid, bytes(view[:n]), end_stream=last)
            except h2.exceptions.StreamClosedError as exc:
                raise NetError(f"HTTP/2 stream {sid} closed by the server while sending") from exc
            except h2.exceptions.ProtocolError as exc:
                raise NetError(f"HTTP/2 connection to {self.authority} closed by the server: {exc}") from exc
            view = view[n:]
            await self._flush()
            if last:
                return

    def reset(self, sid: int) -> None:
        stream = self._streams.pop(sid, None)
        if stream is not None and not (stream.ended_local and stream.ended_remote):
            with contextlib.suppress(h2.exceptions.H2Error, KeyError):
                self._h2.reset_stream(sid, error_code=h2.errors.ErrorCodes.CANCEL)
            self._flush_nowait()

    async def _ping_loop(self) -> None:
        # Keep long thinking phases alive: servers GOAWAY idle connections (docs/protocol.md §1).
        while not self.closed:
            await asyncio.sleep(_PING_EVERY)
            if self._streams and not self.closed:
                with contextlib.suppress(h2.exceptions.H2Error):
                    self._h2.ping(os.urandom(8))
                    await self._flush()

    async def _read_loop(self) -> None:
        assert self._reader is not None
        error: BaseException | None = None
        try:
            while True:
                data = await self._reader.read(262144)
                if not data:
                    error = NetError(f"connection to {self.authority} closed by the server")
                    break
                try:
                    events = self._h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    error = NetError(f"HTTP/2 protocol error from {self.authority}: {exc}")
                    break
                for ev in events:
                    self._dispatch(ev)
                self._flush_nowait()
        except (OSError, ssl.SSLError, asyncio.IncompleteReadError) as exc:
            error = NetError(f"connection to {self.authority} failed: {exc}")
        except asyncio.CancelledError:
            error = NetError("connection closed")
        finally:
            self.closed = True
            self._window.set()
            for stream in list(self._streams.values()):
                if not stream.ended_remote:
                    stream.fail(error or NetError("connection closed"))

    def _dispatch(self, ev: h2.events.Event) -> None:
        sid = getattr(ev, "stream_id", None)
        stream = self._streams.get(sid) if sid is not None else None
        if isinstance(ev, h2.events.ResponseReceived) and stream is not None:
            stream.headers = {_s(k): _s(v) for k, v in ev.headers}
            stream.got_headers.set()
        elif isinstance(ev, h2.events.DataReceived):
            if ev.flow_controlled_length:
                with contextlib.suppress(h2.exceptions.H2Error):
                    self._h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if stream is not None and ev.data:
                stream.queue.put_nowait(bytes(ev.data))
        elif isinstance(ev, h2.events.TrailersReceived) and stream is not None:
            stream.trailers = {_s(k): _s(v) for k, v in ev.headers}
        elif isinstance(ev, h2.events.StreamEnded) and stream is not None:
            stream.ended_remote = True
            stream.queue.put_nowait(None)
            if stream.ended_local:
                self._streams.pop(ev.stream_id, None)
        elif isinstance(ev, h2.events.StreamReset) and stream is not None:
            stream.ended_remote = True
            stream.reset_code = int(ev.error_code)
            self._streams.pop(ev.stream_id, None)
            stream.fail(NetError(f"HTTP/2 stream {ev.stream_id} reset by the server "
                                 f"(error code {ev.error_code})"))
        elif isinstance(ev, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            self._window.set()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.goaway = True
            self.goaway_seen.set()
            last = ev.last_stream_id if ev.last_stream_id is not None else 0
            for s_id, s in list(self._streams.items()):
                if s_id > last and not s.ended_remote:
                    s.fail(NetError(f"GOAWAY (error code {ev.error_code}) before stream {s_id} ran"))

    def drop(self) -> None:
        """Close the TCP connection at once, without GOAWAY: a client that disconnects."""
        self.closed = True
        if self._writer is not None:
            self._writer.transport.abort()

    async def close(self) -> None:
        if self._writer is not None and not self.closed:
            with contextlib.suppress(h2.exceptions.H2Error):
                self._h2.close_connection()
                self._flush_nowait()
        await cancel_and_wait(self._tasks)
        self.closed = True
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._writer.wait_closed(), 2.0)


def _s(v: str | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
