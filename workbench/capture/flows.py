"""The proxy-to-writer vocabulary: event tags, what a flow is at request headers, and the
writer's per-flow state.

``addon.py`` (proxy side) builds ``FlowOpen`` records and typed events (``Open``, ``Chunk``, …); ``writer.py``
(writer thread) consumes them and keeps one ``Flow`` per HTTP exchange. Split out of
``writer.py`` so both sides share these definitions without the writer's machinery; they are
re-exported from ``workbench.capture.writer``. Plain slotted dataclasses and int constants: no
per-frame indirection is added on the capture hot path (a NamedTuple costs what a tuple does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from workbench.decode.classify import Frame, StreamDecoder
from workbench.protocol import kinds
from workbench.protocol.status import ExchangeEnd, framing_of


@dataclass(slots=True)
class FlowOpen:
    """What the proxy knows at request headers, already redacted."""

    key: str
    transport: str
    streaming: bool
    host: str
    path: str
    ts_us: int
    request_id: str | None = None
    client_version: str | None = None
    auth_hash: str | None = None
    request_type: str | None = None
    response_type: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    content_type: str | None = None


# Events, proxy thread → writer thread: one NamedTuple per kind (one allocation per chunk, as a
# plain tuple), dispatched on its type by ``CaptureWriter``.

class Open(NamedTuple):
    """Request headers of a flow the matcher routed."""

    flow: FlowOpen


class Chunk(NamedTuple):
    """Bytes of a streamed body."""

    key: str
    direction: str
    ts_us: int
    data: bytes


class Eof(NamedTuple):
    """The end of one direction's streamed body."""

    key: str
    direction: str
    ts_us: int


class Response(NamedTuple):
    """Response headers (already redacted)."""

    key: str
    ts_us: int
    status: int
    headers: list[tuple[str, str]]
    http_version: str
    alpn: str | None


class Body(NamedTuple):
    """The whole buffered body of a unary call, a BidiAppend or a unary response."""

    key: str
    direction: str
    ts_us: int
    body: bytes  # as it crossed the wire: its content-coding is undone on the writer thread, within the budgets
    codings: tuple[str, ...] = ()  # the body's content-encoding, as applied (``codings_of``)


class Done(NamedTuple):
    """The response finished (``error`` None) or the flow failed; ``reset``: how a side failed."""

    key: str
    ts_us: int
    error: str | None
    trailers: dict[str, str]
    reset: dict[str, Any] | None = None


class Late(NamedTuple):
    """A side failed (reset, connection lost) after the response had ended."""

    key: str
    ts_us: int
    reset: dict[str, Any]


class Stop(NamedTuple):
    """The capture stops: finish every flow and flush."""


class Batch(NamedTuple):
    """The writer process's sender's batch ``number`` of ``events``: handled whole, then the writer
    confirms, with its next commit, the last batch it handled (``CaptureWriter.mark``)."""

    number: int
    events: list[Any]


Event = Open | Chunk | Eof | Response | Body | Done | Late | Stop | Batch


@dataclass(slots=True)
class Flow:
    """One HTTP exchange as the writer follows it: its session, stream decoders, held frames and
    what it has shown of its end (status, end-stream frame, error body, append bookkeeping)."""

    open: FlowOpen
    session_id: str | None = None
    decoders: dict[str, StreamDecoder] = field(default_factory=dict)
    pending: list[tuple[int, str, Frame]] = field(default_factory=list)
    http_status: int | None = None
    response_headers: list[tuple[str, str]] = field(default_factory=list)
    error_body: bytearray | None = None
    saw_end: bool = False  # an end-stream or gRPC-Web trailer frame came from the server
    end_error: str | None = None
    http_error: str | None = None  # the text of the http_error frame a non-200 answer became
    eof: set[str] = field(default_factory=set)
    append_seqno: int | None = None
    append_frames: list[Frame] = field(default_factory=list)  # this append exchange's client frames
    append_emitted: dict[int, tuple[str, int | None]] = field(default_factory=dict)  # id(frame) → (session, seq)
    append_response: bytes | None = None
    done: bool = False
    secret: bool = False  # an RPC whose bodies are credentials: store markers only

    def note_end(self, f: Frame) -> None:
        """A server frame; one that ends the response (end-stream, gRPC-Web trailer frame) is noted."""
        if kinds.is_end_stream(f.kind):
            self.saw_end = True
            if kinds.is_end_stream_error(f.kind):
                self.end_error = f.summary

    def ending(self, grpc: dict[str, str], failure: str | None, reset: dict[str, Any] | None = None) -> ExchangeEnd:
        """What this exchange showed of its end, for ``workbench.protocol.status``."""
        return ExchangeEnd(self.open.transport, self.http_status, framing_of(self.open.content_type),
                           grpc.get("grpc-status"), grpc.get("grpc-message"), self.saw_end, self.end_error,
                           self.http_error, failure=failure, reset=reset)
