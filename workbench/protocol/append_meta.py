"""The facts of a BidiAppend's HTTP exchange, kept on its frames (``frames.meta``).

A BidiAppend carries one client message of a RunSSE/RunPoll run in its own unary HTTP exchange,
so whether the server took that message is a fact of the exchange, not of the message: its HTTP
status, its gRPC status (HTTP headers or trailers, or a gRPC-Web trailer frame in the body), the
request's content type and headers, and the recorder's error for a failed exchange. Live capture
(``workbench.capture.writer``) and imports (``workbench.ingest.runs``) build these keys here, so
analysis reads the same shapes from either (``workbench.analysis.exchanges.meta_fields``).

What of an answer is kept (``append_answer``): an accepted append's answer is facts in the meta
(a gRPC-Web trailer's status joins its ``grpc_*`` keys); only a refusal, or anything other than
the empty ``BidiAppendResponse`` and a clean end, stays a frame of its own. Live capture, flow/HAR
imports and packet-capture imports all keep it this way.

Keys: ``http_status`` (int or null), ``request_headers`` (dict: names lower-cased, a repeated
header's values joined with ", "; redacted by the caller), ``content_type``, and when there are
any ``grpc_status`` (int), ``grpc_message``, ``error``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from workbench.decode.classify import Frame
from workbench.protocol import kinds
from workbench.protocol.status import grpc_fields
from workbench.wire.endstream import parse_grpc_web_trailer
from workbench.wire.envelope import FLAG_TRAILER

# Appends of one run travel on parallel exchanges and overtake each other; whoever puts them back
# in append_seqno order (live capture, packet-capture import) holds a gap this long before giving
# up on it, and only this long once the run's stream has ended (the rest will not come).
REORDER_WINDOW_S = 10.0
REORDER_AFTER_END_S = 2.0


def headers_dict(headers: Iterable[tuple[str, str]] | None) -> dict[str, str]:
    """Headers as a dict: names lower-cased, the values of a repeated header joined with ", "."""
    out: dict[str, str] = {}
    for name, value in headers or ():
        key = name.lower()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def grpc_status_number(value: str | None) -> int | None:
    """A ``grpc-status`` value as a number (None when absent or not a number)."""
    return int(value) if value is not None and value.isdigit() else None


def answer_grpc(response_headers: Iterable[tuple[str, str]] | None, trailers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
                answer: Sequence[Frame] = ()) -> dict[str, str]:
    """``grpc-status``/``grpc-message`` of an exchange's answer: response headers, then HTTP
    trailers, then the gRPC-Web trailer frames (flag 0x80) among the decoded answer frames."""
    frames = [parse_grpc_web_trailer(f.payload) for f in answer
              if kinds.is_end_stream(f.kind) and f.flags & FLAG_TRAILER]
    return grpc_fields(response_headers, trailers, *frames)


def append_answer(frames: Iterable[Frame]) -> tuple[list[Frame], dict[str, str]]:
    """A BidiAppend's decoded answer as recordings keep it: the frames worth a row (a refusal such
    as ``end_stream.error`` or an error trailer, or anything but the empty ``BidiAppendResponse``
    and a clean end) and the ``grpc-status``/``grpc-message`` of its gRPC-Web trailer frame, which
    belong in the append's meta (pass them on as trailers to ``answer_grpc``)."""
    kept: list[Frame] = []
    grpc: dict[str, str] = {}
    for f in frames:
        if kinds.is_end_stream(f.kind) and f.flags & FLAG_TRAILER:
            grpc.update({k: v for k, v in parse_grpc_web_trailer(f.payload).items()
                         if k in ("grpc-status", "grpc-message")})
        if kinds.is_end_stream_error(f.kind) or not (kinds.is_end_stream(f.kind) or f.kind == kinds.EMPTY):
            kept.append(f)
    return kept, grpc


def append_exchange_meta(http_status: int | None, request_headers: Iterable[tuple[str, str]] | None,
                         content_type: str | None, *, grpc: Mapping[str, str] | None = None,
                         error: str | None = None) -> dict[str, Any]:
    """``frames.meta`` of a BidiAppend's request frame(s). ``grpc`` as ``answer_grpc`` returns it
    (None while the answer has not come); ``error``: the recorder's error for a failed exchange."""
    meta: dict[str, Any] = {"http_status": http_status, "request_headers": headers_dict(request_headers),
                            "content_type": content_type}
    grpc = grpc or {}
    number = grpc_status_number(grpc.get("grpc-status"))
    if number is not None:
        meta["grpc_status"] = number
    if grpc.get("grpc-message"):
        meta["grpc_message"] = grpc["grpc-message"]
    if error is not None:
        meta["error"] = error
    return meta


__all__ = ["answer_grpc", "append_answer", "append_exchange_meta", "grpc_status_number", "headers_dict"]
