"""One agent run as a handler sees it (``AgentConnection``), whatever transport carries it.

* ``run``     — ``/agent.v1.AgentService/Run`` over h2, full duplex: the handler may send before
                the client finishes (or even starts) its request body.
* ``runsse``  — ``RunSSE`` (one enveloped BidiRequestId in, envelopes streamed out) with the write
                side arriving as ``/aiserver.v1.BidiService/BidiAppend`` unary calls, put back in
                ``append_seqno`` order before ``receive()`` returns them (``bidi_append``).
* ``runpoll`` — ``RunPoll``: like RunSSE, but each outgoing message is wrapped in a
                BidiPollResponse record (seqno, base64 data, eof on the last).

``ExchangeConnection`` implements it over one ``Exchange``, in the caller's framing (``framing``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from workbench.transport.bidi_append import AppendChannel, poll_record
from workbench.transport.exchange import ConnectionClosed, Exchange
from workbench.transport.framing import Framing, FramingError, RequestDecoder, ResponseEncoder
from workbench.wire.envelope import EnvelopeParser

log = logging.getLogger("workbench.transport")


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


class ExchangeConnection:
    """AgentConnection over one exchange; ``appends`` is the BidiAppend side for runsse/runpoll."""

    def __init__(self, transport: str, request_id: str | None, ex: Exchange, framing: Framing,
                 appends: AppendChannel | None = None, gzip_min: int | None = None) -> None:
        self.transport = transport
        self.framing = framing
        self.request_id = request_id
        self.headers: Mapping[str, str] = ex.headers
        self._ex = ex
        self._enc = ResponseEncoder(framing, gzip_min)
        self._appends = appends
        self._parser = EnvelopeParser() if appends is None else None
        self._decoder = RequestDecoder(framing)
        self._pending: list[bytes] = []
        self._client_done = False
        self._poll_seq = 0
        self.ended = False
        self.sent = 0

    @property
    def append_faults(self) -> list[str]:
        """Seqno faults seen on the BidiAppend side (duplicates, long gaps); empty for ``run``."""
        return self._appends.faults if self._appends is not None else []

    @property
    def client_gone(self) -> bool:
        return self._ex.gone.is_set()

    async def receive(self) -> bytes | None:
        if self._appends is not None:
            if self._client_done:
                return None
            item = await self._appends.queue.get()
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
            except FramingError as exc:
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

    async def send_misframed(self, message: bytes, off_by: int) -> None:
        """Like ``send``, but the envelope's length prefix is ``off_by`` bytes wrong (a deliberately
        corrupted frame boundary: every frame after it is out of sync for the reader)."""
        if self.ended:
            raise ConnectionClosed("stream already ended")
        if self.transport == "runpoll":
            message = poll_record(self._poll_seq, message, False)
            self._poll_seq += 1
        await self._ex.write(self._enc.misframed(message, off_by))
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
        with contextlib.suppress(ConnectionClosed):
            await self._ex.finish(out + body, trailers)
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
        if self._appends is not None:
            self._appends.close()
