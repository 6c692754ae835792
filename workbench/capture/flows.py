"""The proxy-to-writer vocabulary: event tags, what a flow is at request headers, and the
writer's per-flow state.

``addon.py`` (proxy side) builds ``FlowOpen`` records and tagged event tuples; ``writer.py``
(writer thread) consumes them and keeps one ``Flow`` per HTTP exchange. Split out of
``writer.py`` so both sides share these definitions without the writer's machinery; they are
re-exported from ``workbench.capture.writer``. Plain slotted dataclasses and int constants: no
per-frame indirection is added on the capture hot path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from workbench.decode.classify import Frame, StreamDecoder
from workbench.protocol.status import ExchangeEnd, framing_of

# Event tags (tuples keep the proxy-side cost to one allocation per chunk).
EV_OPEN = 0       # (EV_OPEN, FlowOpen)
EV_CHUNK = 1      # (EV_CHUNK, key, direction, ts_us, bytes)
EV_EOF = 2        # (EV_EOF, key, direction, ts_us)
EV_RESPONSE = 3   # (EV_RESPONSE, key, ts_us, status, headers, http_version, alpn)
EV_BODY = 4       # (EV_BODY, key, direction, ts_us, bytes)  whole body of a buffered message
EV_DONE = 5       # (EV_DONE, key, ts_us, error or None, trailers dict[, reset dict or None])
EV_STOP = 6       # (EV_STOP,)
EV_LATE = 7       # (EV_LATE, key, ts_us, reset dict)  a side failed after the response ended


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
        if f.kind.startswith("end_stream"):
            self.saw_end = True
            if f.kind == "end_stream.error":
                self.end_error = f.summary

    def ending(self, grpc: dict[str, str], failure: str | None, reset: dict[str, Any] | None = None) -> ExchangeEnd:
        """What this exchange showed of its end, for ``workbench.protocol.status``."""
        return ExchangeEnd(self.open.transport, self.http_status, framing_of(self.open.content_type),
                           grpc.get("grpc-status"), grpc.get("grpc-message"), self.saw_end, self.end_error,
                           self.http_error, failure=failure, reset=reset)
