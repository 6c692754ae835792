"""The three ways a client talks to the agent backend (docs/protocol.md §1, §3).

- ``run``: one full-duplex HTTP/2 POST ``/agent.v1.AgentService/Run`` (enveloped both ways);
- ``runsse``: POST ``…/RunSSE`` carrying one enveloped BidiRequestId, read AgentServerMessages from
  its response; every client message goes out as a unary ``BidiAppend`` (hex payload, the run's
  request_id, append_seqno 0, 1, 2, … with up to 16 appends in flight);
- ``runpoll``: as runsse, but the read side is ``…/RunPoll`` returning BidiPollResponse records.

Two framings (``framing=``): ``connect`` (streams ``application/connect+proto`` ending in a 0x02
end-stream; BidiAppend and unary calls bare ``application/proto``) and ``grpc-web`` (everything
``application/grpc-web+proto`` and enveloped, BidiAppend included; the end of every response is a
0x80 trailer frame with ``grpc-status``/``grpc-message``) — mode D of docs/protocol.md §1.

Each channel turns its wire into one queue of :class:`Incoming` items (agent-message bytes, the
end of the stream, or a failure) so the turn logic above does not care which transport it runs on.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import functools
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from workbench.client._pb import pb
from workbench.client.ending import (
    EndSeen,
    TransportError,
    end_of,
    eof_end,
    error_from_http,
    grpc_web_end,
    judge_append,
)
from workbench.client.headers import (
    framed_headers,
)
from workbench.client.net import H2Connection, H2Stream, NetError, Verify, cancel_and_wait, ssl_context
from workbench.decode.classify import Frame, default_decoder, http_error_frame
from workbench.protocol.status import reset_facts
from workbench.schema import pb as schema_pb
from workbench.wire.endstream import EndStream
from workbench.wire.envelope import EnvelopeParser, encode, split_frames, split_unary

RUN_PATH = "/agent.v1.AgentService/Run"
RUNSSE_PATH = "/agent.v1.AgentService/RunSSE"
RUNPOLL_PATH = "/agent.v1.AgentService/RunPoll"
APPEND_PATH = "/aiserver.v1.BidiService/BidiAppend"
MODELS_PATH = "/agent.v1.AgentService/GetUsableModels"
AI_MODELS_PATH = "/aiserver.v1.AiService/GetUsableModels"
TRANSPORTS = ("run", "runsse", "runpoll")
FRAMINGS = ("connect", "grpc-web")
MAX_APPENDS_IN_FLIGHT = 16
# How long closing a RunSSE/RunPoll channel waits for BidiAppends still in flight (their messages
# are logged only once answered, so one cut short is left out of the frame log).
APPEND_DRAIN_S = 2.0
# After turn_ended the server still ends the stream; wait this long for it before closing.
END_WAIT_S = 1.0
# After a RunPoll eof record the server still owes the Connect end-stream; give up waiting after this.
EOF_GRACE_S = 5.0


@functools.cache
def _heartbeat() -> bytes:
    """A client heartbeat's bytes: built on first use, as building it loads the schema's classes."""
    return bytes(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())


_clock_lock = threading.Lock()
_clock_base = time.time_ns() // 1000 - time.monotonic_ns() // 1000
_clock_last = 0


def now_us() -> int:
    """Wall-clock microseconds that never go backwards and never repeat in this process, so
    sorting by timestamp gives the order in which the client sent and received things."""
    global _clock_last
    with _clock_lock:
        t = max(_clock_base + time.monotonic_ns() // 1000, _clock_last + 1)
        _clock_last = t
        return t


class Wire(Protocol):
    """Where a channel reports traffic: ``message`` for the frame log (agent messages only),
    ``frame`` for the recording (every frame as the decoder classifies it on the wire)."""

    recording: bool

    def message(self, ts_us: int, direction: str, transport: str, data: bytes) -> None: ...

    def frame(self, ts_us: int, direction: str, transport: str, frame: Frame) -> None: ...


@dataclass(slots=True)
class Incoming:
    """``kind``: "message" (payload = AgentServerMessage bytes), "end" (end-stream or EOF), "error"."""

    kind: str
    payload: bytes = b""
    end: EndStream | None = None
    error: BaseException | None = None


class Channel:
    """Base: a queue of incoming items plus a send method."""

    transport = "run"
    append_transport = "run"

    def __init__(self, base_url: str, token: str, wire: Wire, request_id: str | None = None,
                 framing: str = "connect") -> None:
        if framing not in FRAMINGS:
            raise ValueError(f"framing {framing!r}: choose one of {', '.join(FRAMINGS)}")
        self.base_url = base_url.rstrip("/")
        self.framing = framing
        self.token = token
        self.request_id = request_id or str(uuid.uuid4())
        self.queue: asyncio.Queue[Incoming] = asyncio.Queue()
        self.wire = wire
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reader: asyncio.Task[None] | None = None
        self.closed = False
        self.seen = EndSeen()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _fail(self, exc: BaseException) -> None:
        self.queue.put_nowait(Incoming("error", error=exc))

    async def open(self, first: bytes) -> None:
        raise NotImplementedError

    async def send(self, msg: bytes) -> None:
        raise NotImplementedError

    def delivering(self) -> bool:
        """True while a message other than a heartbeat is still on its way to the server (a
        BidiAppend not answered yet): the server cannot have acted on it, so its heartbeats
        meanwhile are no sign of a stall."""
        return False

    async def incoming(self) -> AsyncIterator[Incoming]:
        while True:
            item = await self.queue.get()
            yield item
            if item.kind != "message":
                return

    async def settle(self, timeout: float) -> None:
        """After turn_ended: let the response reach its end-stream (bounded), so it is recorded."""
        if self._reader is not None and not self._reader.done():
            await asyncio.wait([self._reader], timeout=timeout)

    async def close(self) -> None:
        self.closed = True
        await cancel_and_wait(list(self._tasks))

    async def abort(self, how: str, reason: str) -> None:
        """End the run from the client side at once, as a stream watchdog does: ``reset`` (HTTP/2
        RST_STREAM CANCEL; over HTTP/1.1 the response is dropped, and its connection with it) or
        ``disconnect`` (the whole connection closed, no GOAWAY). The run then ends with ``reason``."""
        if not (self.seen.response_ended or self.seen.failure):
            h2_code = 8 if how == "reset" and isinstance(self, RunChannel) else None
            self.seen.reset = reset_facts("client", False, h2_code, message=f"{how} by the client: {reason}")
        await self._cut(how)
        self._fail(TransportError("watchdog", reason))

    async def _cut(self, how: str) -> None:
        raise NotImplementedError

    def _http_error(self, status: int, body: bytes) -> None:
        """A non-200 answer to the stream: recorded as the ``http_error`` frame a capture stores."""
        f = http_error_frame(status, body)
        self.seen.http_error = f.summary
        self.seen.response_ended = True
        if self.wire.recording:
            self._record(now_us(), "server", self.transport, [f])

    def _unwrap(self, payload: bytes) -> list[Incoming]:
        """What one response envelope delivers (RunPoll overrides: records wrap the messages)."""
        return [Incoming("message", payload)]

    def _record(self, ts_us: int, direction: str, transport: str, frames: list[Frame]) -> None:
        for f in frames:
            self.wire.frame(ts_us, direction, transport, f)

    def _feed_envelopes(self, parser: EnvelopeParser, chunk: bytes) -> bool:
        """Queue the complete envelopes in ``chunk``; True once the stream has ended."""
        for env in parser.feed(chunk):
            ts = now_us()
            ending = env.is_end_stream or env.is_trailer
            if self.wire.recording or ending:
                frame = default_decoder().frames_from_envelope(env, self.transport, "server")
                if self.wire.recording:
                    self._record(ts, "server", self.transport, [frame])
                if ending and not env.error:
                    self.seen.note_end(frame)
            if env.error:
                self._fail(TransportError("internal", f"bad envelope from {self.transport}: {env.error}"))
                return True
            if env.is_end_stream or env.is_trailer:
                self.queue.put_nowait(Incoming("end", end=end_of(env)))
                return True
            try:
                items = self._unwrap(env.payload)
            except Exception as exc:  # a record we cannot parse ends the stream with a clear error
                items = [Incoming("error", error=TransportError(
                    "internal", f"{self.transport} record does not parse: {exc}"))]
            for item in items:
                if item.kind == "message":
                    self.wire.message(ts, "server", self.transport, item.payload)
                self.queue.put_nowait(item)
                if item.kind != "message":
                    return True
        return False


class RunChannel(Channel):
    """Bidi ``Run`` over our own HTTP/2 client (shares one connection between turns)."""

    transport = "run"
    append_transport = "run"

    def __init__(self, base_url: str, token: str, wire: Wire, conn: H2Connection,
                 request_id: str | None = None, framing: str = "connect") -> None:
        super().__init__(base_url, token, wire, request_id, framing)
        self.conn = conn
        self.stream: H2Stream | None = None

    async def open(self, first: bytes) -> None:
        self.stream = await self.conn.request(
            RUN_PATH, framed_headers(self.token, self.request_id, self.framing, unary=False))
        self._reader = self._spawn(self._read())
        await self.send(first)

    async def send(self, msg: bytes) -> None:
        assert self.stream is not None
        ts = now_us()
        data = encode(msg)
        try:
            await self.stream.send(data)
        except NetError as exc:
            self._fail(exc)
            return
        self.wire.message(ts, "client", "run", msg)
        if self.wire.recording:
            self._record(ts, "client", "run", default_decoder().decode_body(data, "run", "client"))

    async def _read(self) -> None:
        assert self.stream is not None
        try:
            hdrs = await self.stream.response()
            status = int(hdrs.get(":status", "0"))
            self.seen.http_status = status
            if status != 200:
                body = b"".join([c async for c in self.stream.chunks()])
                self._http_error(status, body)
                self._fail(error_from_http(status, body, RUN_PATH))
                return
            parser = EnvelopeParser()
            async for chunk in self.stream.chunks():
                if self._feed_envelopes(parser, chunk):
                    return
            self.seen.trailers = dict(self.stream.trailers)
            self.seen.response_ended = True
            for env in parser.close():
                self._fail(TransportError("internal", f"Run response: {env.error}"))
                return
            self.queue.put_nowait(Incoming("end", end=eof_end(self.stream.trailers)))
        except NetError as exc:
            self._failed(exc)
            self._fail(exc)

    def _failed(self, exc: NetError) -> None:
        """The stream failed while the response was running: a server reset, or the connection."""
        if self.seen.response_ended or self.seen.failure is not None:
            return
        self.seen.failure = str(exc)
        code = self.stream.reset_code if self.stream is not None else None
        if code is not None:
            self.seen.reset = reset_facts("server", False, code)

    async def _cut(self, how: str) -> None:
        if how == "disconnect":
            self.conn.drop()
        elif self.stream is not None:
            self.stream.cancel()

    async def close(self) -> None:
        if self.stream is not None:
            if not (self.seen.response_ended or self.stream.ended_remote or self.seen.failure):
                # the response is still running: cancel() resets the stream (RST_STREAM CANCEL)
                self.seen.reset = reset_facts("client", False, 8)
            with contextlib.suppress(NetError):
                if not self.stream.ended_local and not self.conn.closed:
                    await asyncio.wait_for(self.stream.end(), 2.0)
            self.stream.cancel()
        await super().close()


class _AppendingChannel(Channel):
    """Shared write side of RunSSE/RunPoll: one BidiAppend per client message."""

    append_transport = "bidi_append"
    read_path = RUNSSE_PATH

    def __init__(self, base_url: str, token: str, wire: Wire, http: httpx.AsyncClient,
                 request_id: str | None = None, reset_seqno: bool = False, framing: str = "connect") -> None:
        super().__init__(base_url, token, wire, request_id, framing)
        self.http = http
        self.seqno = 0
        self._reset_seqno = reset_seqno
        self._sem = asyncio.Semaphore(MAX_APPENDS_IN_FLIGHT)
        self._response: httpx.Response | None = None
        self._appends: set[asyncio.Task[None]] = set()
        self.appends_sent = 0
        self.append_drain_s = APPEND_DRAIN_S
        self._answers_posting = 0  # appends other than heartbeats not answered yet

    def _read_body(self) -> bytes:
        raise NotImplementedError

    async def open(self, first: bytes) -> None:
        body = encode(self._read_body())
        req = self.http.build_request(
            "POST", self.base_url + self.read_path, content=body,
            headers=framed_headers(self.token, self.request_id, self.framing, unary=False, http1=True),
            timeout=httpx.Timeout(30.0, read=None))
        ts = now_us()
        try:
            self._response = await self.http.send(req, stream=True)
        except httpx.HTTPError as exc:
            self.seen.failure = f"{self.read_path} to {self.base_url}: {exc!r}"
            raise NetError(self.seen.failure) from exc
        if self.wire.recording:
            self._record(ts, "client", self.transport, default_decoder().decode_body(body, self.transport, "client"))
        self.seen.http_status = self._response.status_code
        if self._response.status_code != 200:
            body = await self._response.aread()
            await self._response.aclose()
            self._http_error(self._response.status_code, body)
            raise error_from_http(self._response.status_code, body, self.read_path)
        self._reader = self._spawn(self._read())
        await self.send(first)

    async def send(self, msg: bytes) -> None:
        seq = self.seqno
        self.seqno += 1
        if self._reset_seqno and seq == 0 and self.appends_sent == 0:
            # Fault: behave like a client that restarts its counter (retry/reconnect) after the
            # run request, so the next message repeats seqno 0 (docs/protocol.md §3, §7 append_seqno_anomaly).
            self.seqno = 0
            self._reset_seqno = False
        self.appends_sent += 1
        body = bytes(pb.BidiAppendRequest(data=msg.hex(), request_id=pb.BidiRequestId(request_id=self.request_id),
                                          append_seqno=seq).SerializeToString())
        if self.framing == "grpc-web":
            body = encode(body)  # gRPC-Web unary calls are enveloped too
        await self._sem.acquire()
        answer = msg != _heartbeat()
        self._answers_posting += answer
        task = self._spawn(self._append(seq, msg, body, answer))
        self._appends.add(task)
        task.add_done_callback(self._appends.discard)

    def delivering(self) -> bool:
        return self._answers_posting > 0

    async def _append(self, seq: int, msg: bytes, body: bytes, answer: bool) -> None:
        ts = now_us()  # tasks start in send order, so timestamps follow append_seqno
        try:
            resp = await self.http.post(
                self.base_url + APPEND_PATH, content=body,
                headers=framed_headers(self.token, self.request_id, self.framing, unary=True, http1=True))
        except httpx.HTTPError as exc:
            self._fail(NetError(f"BidiAppend seqno {seq} failed: {exc!r}"))
            return
        finally:
            self._sem.release()
            self._answers_posting -= answer
        # Any HTTP answer, even an error status, means the server read the whole message (and a
        # capture in between stored it); cancelled or failed posts are never logged.
        self.wire.message(ts, "client", "bidi_append", msg)
        if self.wire.recording:
            self._record(ts, "client", "bidi_append", [_append_frame(body, self.framing)])
        self._judge_append(seq, resp)
        if resp.status_code != 200:
            self._fail(error_from_http(resp.status_code, resp.content, f"BidiAppend seqno {seq}"))
        elif self.framing == "grpc-web":
            end = grpc_web_end(resp.content)
            if end is None or end.is_error:
                self._fail(TransportError(end.code or "internal", end.message or "", end.details, 200) if end
                           else TransportError("internal", f"BidiAppend seqno {seq}: no grpc-status trailer"))

    def _judge_append(self, seq: int, resp: httpx.Response) -> None:
        """Record a refusal (as a capture would) and remember the first one that came while the
        response was running: it makes the recorded run ``error`` (``protocol.status.with_append``)."""
        status, err, refusal = judge_append(resp.status_code, resp.content, resp.headers.multi_items(), self.framing)
        if self.wire.recording and refusal:
            for f in refusal:
                f.request_id, f.append_seqno = self.request_id, seq
            self._record(now_us(), "server", "bidi_append", refusal)
        if status == "error" and not self.seen.response_ended and self.seen.refused is None:
            self.seen.refused = (status, err, f"BidiAppend append_seqno {seq}")

    async def _read(self) -> None:
        assert self._response is not None
        parser = EnvelopeParser()
        chunks = self._response.aiter_raw().__aiter__()
        try:
            while True:
                try:
                    # After a RunPoll eof record only the end-stream may follow: do not wait forever.
                    chunk = await asyncio.wait_for(anext(chunks), EOF_GRACE_S if self._eof_seen() else None)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    self.queue.put_nowait(Incoming("end", end=EndStream(metadata={"eof": True})))
                    return
                if self._feed_envelopes(parser, chunk):
                    return
            self.seen.response_ended = True
            for env in parser.close():
                self._fail(TransportError("internal", f"{self.read_path} response: {env.error}"))
                return
            self.queue.put_nowait(Incoming("end", end=EndStream(metadata={"eof": True})))
        except httpx.HTTPError as exc:
            if not self.seen.response_ended and self.seen.failure is None:
                self.seen.failure = f"{self.read_path} read failed: {exc!r}"
            self._fail(NetError(f"{self.read_path} read failed: {exc!r}"))

    def _eof_seen(self) -> bool:
        return False

    async def _cut(self, how: str) -> None:
        # HTTP/1.1 has no stream reset: dropping the response closes its connection either way
        if self._reader is not None:
            await cancel_and_wait([self._reader])
        if self._response is not None:
            with contextlib.suppress(Exception):
                await self._response.aclose()

    async def close(self) -> None:
        self.closed = True
        pending = [t for t in self._appends if not t.done()]
        try:
            if pending and self.append_drain_s > 0:
                # Let appends already posted get their answer (bounded); the rest are cancelled
                # below and stay out of the frame log.
                await asyncio.wait(pending, timeout=self.append_drain_s)
        finally:
            if self._response is not None:
                if not (self.seen.response_ended or self.seen.failure):
                    # closing a response still running drops its connection: the client is gone
                    self.seen.reset = reset_facts("client", False, message="connection closed by the client")
                with contextlib.suppress(Exception):
                    await self._response.aclose()
            await super().close()


def _append_frame(body: bytes, framing: str) -> Frame:
    """The recorded frame of one BidiAppend: a gRPC-Web one keeps its whole enveloped body in ``raw``."""
    if framing != "grpc-web":
        return default_decoder().unwrap_append(body)
    [env] = split_frames(body)
    f = default_decoder().unwrap_append(env.payload)
    f.raw = body
    f.flags = env.flags
    return f


class RunSSEChannel(_AppendingChannel):
    transport = "runsse"
    read_path = RUNSSE_PATH

    def _read_body(self) -> bytes:
        return bytes(pb.BidiRequestId(request_id=self.request_id).SerializeToString())


class RunPollChannel(_AppendingChannel):
    transport = "runpoll"
    read_path = RUNPOLL_PATH

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._expect = 0
        self._eof = False

    def _eof_seen(self) -> bool:
        return self._eof

    def _read_body(self) -> bytes:
        return bytes(pb.BidiPollRequest(request_id=pb.BidiRequestId(request_id=self.request_id),
                                        start_request=True).SerializeToString())

    def _unwrap(self, payload: bytes) -> list[Incoming]:
        rec = pb.BidiPollResponse.FromString(payload)
        if rec.seqno != self._expect:
            return [Incoming("error", error=TransportError(
                "internal", f"RunPoll seqno {rec.seqno} where {self._expect} was expected"))]
        self._expect += 1
        out: list[Incoming] = []
        if rec.data:
            try:
                inner = base64.b64decode(rec.data + "=" * (-len(rec.data) % 4), validate=True)
            except (binascii.Error, ValueError) as exc:
                return [Incoming("error", error=TransportError(
                    "internal", f"RunPoll seqno {rec.seqno}: data is not base64: {exc}"))]
            out.append(Incoming("message", inner))
        if rec.HasField("eof") and rec.eof:
            # The Connect end-stream comes after the eof record and may carry the run's error
            # (e.g. resource_exhausted), so keep reading: the end-stream (or EOF) ends the stream.
            self._eof = True
        return out  # empty: a keep-alive or eof record


def make_http_client(verify: Verify, http2: bool = False) -> httpx.AsyncClient:
    """httpx for RunSSE/RunPoll/BidiAppend/unary; ``trust_env`` keeps HTTPS_PROXY working."""
    ctx = ssl_context(verify, alpn=("h2", "http/1.1") if http2 else ("http/1.1",))
    return httpx.AsyncClient(verify=ctx, http2=http2, trust_env=True,
                             limits=httpx.Limits(max_connections=MAX_APPENDS_IN_FLIGHT + 8,
                                                 max_keepalive_connections=MAX_APPENDS_IN_FLIGHT + 4),
                             timeout=httpx.Timeout(30.0))


async def unary(http: httpx.AsyncClient, base_url: str, token: str, path: str, body: bytes = b"",
                framing: str = "connect") -> bytes:
    """One unary call: Connect (bare protobuf both ways; tolerate an enveloped answer) or gRPC-Web
    (enveloped both ways, status in the trailer frame)."""
    rid = str(uuid.uuid4())
    try:
        resp = await http.post(base_url.rstrip("/") + path, content=encode(body) if framing == "grpc-web" else body,
                               headers=framed_headers(token, rid, framing, unary=True))
    except httpx.HTTPError as exc:
        raise NetError(f"{path} to {base_url}: {exc!r}") from exc
    if resp.status_code != 200:
        raise error_from_http(resp.status_code, resp.content, path)
    if framing == "grpc-web":
        end = grpc_web_end(resp.content)
        if end is None:
            raise TransportError("internal", f"{path}: gRPC-Web answer without a grpc-status trailer", http_status=200)
        if end.is_error:
            raise TransportError(end.code or "unknown", f"{end.message} ({path})", end.details, 200)
    envs = split_frames(resp.content) if framing == "grpc-web" else split_unary(resp.content)
    return b"".join(e.payload for e in envs if not e.is_end_stream and not e.is_trailer)


async def list_usable_models(http: httpx.AsyncClient, base_url: str, token: str,
                             framing: str = "connect") -> list[str]:
    """Model ids from ``agent.v1.AgentService/GetUsableModels``, or — when the upstream does not
    implement it (404/501/unimplemented) — from ``aiserver.v1.AiService/GetUsableModels``.

    Both answer the overlay's ``GetUsableModelsResponse`` (field 1: the models)."""
    try:
        body = await unary(http, base_url, token, MODELS_PATH, framing=framing)
        response = pb.GetUsableModelsResponse
    except TransportError as exc:
        if exc.code not in ("unimplemented", "not_found"):
            raise
        body = await unary(http, base_url, token, AI_MODELS_PATH, framing=framing)
        response = schema_pb.message("aiserver.v1.GetUsableModelsResponse")
    try:
        return [m.model_id for m in response.FromString(body).models]
    except Exception as exc:
        raise TransportError("internal", f"GetUsableModels answer does not parse: {exc}") from exc
