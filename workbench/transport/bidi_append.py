"""The HTTP/1.1 write channel of RunSSE/RunPoll runs: ``/aiserver.v1.BidiService/BidiAppend``.

Each client message arrives as its own unary call (in any unary framing the router accepts:
Connect proto, Connect JSON, gRPC-Web, gRPC) carrying ``request_id`` and ``append_seqno``. The
channels registered here put the payloads back in ``append_seqno`` order for the run's
``receive()``; faults (duplicates, long gaps) are kept for the run record. See docs/protocol.md §3.
"""

from __future__ import annotations

import asyncio
import base64

from workbench.decode.classify import append_payload
from workbench.schema import pb
from workbench.transport.unary import UnaryRequest, UnaryResponse, connect_error, typed_unary, unary_error
from workbench.wire.envelope import Envelope

APPEND_GRACE = 2.0  # seconds a BidiAppend may precede its RunSSE/RunPoll (separate connections)
MAX_HELD = 16  # appends held for a gap before it counts as a fault (the CLI keeps ≤16 in flight)


class AppendChannel:
    """The write side of one RunSSE/RunPoll run: BidiAppends put back in append_seqno order."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.next_seqno = 0
        self.held: dict[int, bytes] = {}
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.faults: list[str] = []
        self.closed = False

    def append(self, seqno: int, data: bytes) -> None:
        if seqno < self.next_seqno or seqno in self.held:
            self.faults.append(f"duplicate append_seqno {seqno} for {self.request_id}")
            return
        self.held[seqno] = data
        if len(self.held) > MAX_HELD:
            self.faults.append(f"append_seqno gap at {self.next_seqno}: {len(self.held)} later appends held")
        while self.next_seqno in self.held:
            self.queue.put_nowait(self.held.pop(self.next_seqno))
            self.next_seqno += 1

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.queue.put_nowait(None)


class AppendChannels:
    """Live channels by request_id, and the BidiAppend unary handler that feeds them."""

    def __init__(self, grace: float = APPEND_GRACE) -> None:
        self.grace = grace
        self.channels: dict[str, AppendChannel] = {}

        self.handle = typed_unary(pb.BidiAppendRequest, self._append)

    def register(self, channel: AppendChannel) -> str | None:
        """Make ``channel`` the target of its request_id's appends; a problem text if one is live."""
        if channel.request_id in self.channels:
            return f"request_id {channel.request_id} already has a live stream"
        self.channels[channel.request_id] = channel
        return None

    def release(self, channel: AppendChannel) -> None:
        if self.channels.get(channel.request_id) is channel:
            del self.channels[channel.request_id]

    def close_all(self) -> None:
        for ch in list(self.channels.values()):
            ch.close()

    async def _find(self, request_id: str) -> AppendChannel | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace
        while True:
            ch = self.channels.get(request_id)
            if ch is not None and not ch.closed:
                return ch
            if loop.time() >= deadline or (ch is not None and ch.closed):
                return None
            await asyncio.sleep(0.02)

    async def _append(self, req: object, call: UnaryRequest) -> UnaryResponse:
        request_id = req.request_id.request_id if req.HasField("request_id") else ""  # type: ignore[attr-defined]
        try:
            data = append_payload(req)
        except ValueError as exc:
            return unary_error(connect_error(
                "invalid_argument", f"BidiAppend data (field 1) is not even-length hex: {exc}"))
        channel = await self._find(request_id)
        if channel is None:
            return unary_error(connect_error(
                "not_found", f"no live RunSSE/RunPoll stream for request_id {request_id!r}"))
        channel.append(int(req.append_seqno), data)  # type: ignore[attr-defined]
        if call.is_json:
            return UnaryResponse(body=b"{}", content_type="application/json")
        return UnaryResponse()


def bidi_request_id(envelopes: list[Envelope], transport: str) -> tuple[str | None, str | None]:
    """(request_id, None) from a RunSSE/RunPoll request body's envelopes, or (None, problem)."""
    what = "BidiRequestId" if transport == "runsse" else "BidiPollRequest"
    frames = [f for f in envelopes if not f.is_end_stream and not f.is_trailer]
    if not frames or frames[0].error is not None:
        return None, f"{transport} request body must be one enveloped {what}"
    try:
        if transport == "runsse":
            rid = pb.BidiRequestId.FromString(frames[0].payload).request_id
        else:
            rid = pb.BidiPollRequest.FromString(frames[0].payload).request_id.request_id
    except Exception as exc:
        return None, f"{transport} request body is not a {what}: {exc}"
    if not rid:
        return None, f"{transport} {what} has no request_id"
    return str(rid), None


def poll_record(seqno: int, message: bytes | None, eof: bool) -> bytes:
    """One RunPoll BidiPollResponse record (base64 AgentServerMessage in ``data``)."""
    rec = pb.BidiPollResponse(seqno=seqno)
    if message is not None:
        rec.data = base64.b64encode(message).decode()
    if eof:
        rec.eof = True
    return bytes(rec.SerializeToString())
