"""How the client's exchanges end: what the server said (``TransportError``, ``end_of``) and how the
client's recording judges it.

Reading an end: a non-200 answer's Connect JSON error (``error_from_http``), the end-stream
envelope or gRPC-Web trailer frame (``end_of``), HTTP/2 trailers after the data (``eof_end``).

Judging it: the client records its runs (``record_to``) like a capture would; the session's status comes from
``workbench.protocol.status`` on what the client saw of the wire — the HTTP status, the end-stream
or gRPC-Web trailer frame, HTTP/2 trailers, a reset or a lost connection, and the first BidiAppend
refused while the run was going on — not from how the turn went for the application (a stream that
ends cleanly without ``turn_ended`` is a complete exchange and an incomplete turn; the caller gets
the latter as an ``Error`` event).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from workbench.client._pb import pb
from workbench.decode.classify import Frame, default_decoder, http_error_frame
from workbench.errors import WorkbenchError
from workbench.jsontypes import JsonObject
from workbench.protocol import kinds
from workbench.protocol.append_meta import answer_grpc
from workbench.protocol.status import GRPC_WEB, ExchangeEnd, session_status
from workbench.wire.endstream import EndStream, end_from_grpc, parse_end_stream, parse_grpc_web_trailer
from workbench.wire.envelope import Envelope, split_frames


class TransportError(WorkbenchError):
    """The upstream refused or broke the exchange; ``code`` follows Connect (lower_snake)."""

    def __init__(self, code: str, message: str, details: list[JsonObject] | None = None,
                 http_status: int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details = details or []
        self.http_status = http_status


def grpc_web_end(body: bytes) -> EndStream | None:
    """The status of a whole gRPC-Web body (its 0x80 trailer frame), None when it has none."""
    for env in split_frames(body):
        if env.is_trailer:
            return end_of(env)
    return None


_HTTP_CODES = {400: "invalid_argument", 401: "unauthenticated", 403: "permission_denied", 404: "not_found",
               408: "deadline_exceeded", 409: "aborted", 415: "internal", 429: "resource_exhausted",
               464: "unimplemented", 500: "internal", 501: "unimplemented", 502: "unavailable",
               503: "unavailable", 504: "deadline_exceeded"}


def error_from_http(status: int, body: bytes, what: str) -> TransportError:
    """A non-200 answer: Connect puts a JSON error in the body (docs/protocol.md §2)."""
    code = _HTTP_CODES.get(status, "unknown")
    message = f"HTTP {status} from {what}"
    details: list[JsonObject] = []
    try:
        doc = json.loads(body.decode("utf-8")) if body.strip() else None
    except (UnicodeDecodeError, ValueError):
        doc = None
    if isinstance(doc, dict):
        code = str(doc.get("code") or code)
        if doc.get("message"):
            message = f"{doc['message']} (HTTP {status} from {what})"
        details = [d for d in doc.get("details") or [] if isinstance(d, dict)]
    elif body:
        message += ": " + body[:200].decode("utf-8", "replace")
    return TransportError(code, message, details, status)


def end_of(env: Envelope) -> EndStream:
    """The end-stream envelope (Connect 0x02 or gRPC-Web trailer 0x80), its ErrorDetails decoded
    (what the server says went wrong)."""
    if env.is_trailer:
        return end_from_grpc(parse_grpc_web_trailer(env.payload), _status_details)
    try:
        return parse_end_stream(env.payload, default_decoder().error_details)
    except ValueError as exc:
        return EndStream(code="internal", message=str(exc))


def _status_details(raw: bytes) -> JsonObject:
    """grpc-status-details-bin (a google.rpc.Status) → Connect-style ``details`` with decoded values."""
    status = pb.RpcStatus.FromString(raw)
    details = []
    for anything in status.details:
        type_name = anything.type_url.rsplit("/", 1)[-1]
        entry: JsonObject = {"type": type_name, "value_hex": bytes(anything.value).hex()}
        if type_name == "aiserver.v1.ErrorDetails":
            entry["value"] = default_decoder().error_details(bytes(anything.value))
        details.append(entry)
    return {"details": details}


def eof_end(trailers: dict[str, str]) -> EndStream:
    """No end-stream envelope: gRPC-style trailers may still say how it ended."""
    if trailers.get("grpc-status", "0") != "0":
        grpc = {k: v for k, v in trailers.items() if k.startswith("grpc-")}
        if "grpc-message" in grpc:
            grpc["grpc-message"] = urllib.parse.unquote(grpc["grpc-message"])
        return end_from_grpc(grpc, _status_details)
    return EndStream(metadata={"eof": True})


@dataclass
class EndSeen:
    """What a channel saw of how its stream's exchange ended."""

    http_status: int | None = None
    trailers: dict[str, str] = field(default_factory=dict)
    end_frame: bool = False      # an end-stream (0x02) or gRPC-Web trailer frame (0x80) came
    end_error: str | None = None
    http_error: str | None = None
    failure: str | None = None
    reset: dict[str, Any] | None = None
    response_ended: bool = False
    # (status, error, label) of the first BidiAppend refused while the response was running
    refused: tuple[str, str | None, str] | None = None

    def note_end(self, frame: Frame) -> None:
        self.end_frame = self.response_ended = True
        if kinds.is_end_stream_error(frame.kind):
            self.end_error = frame.summary

    def exchange_end(self, transport: str, framing: str) -> ExchangeEnd:
        return ExchangeEnd(transport, self.http_status, framing, self.trailers.get("grpc-status"),
                           self.trailers.get("grpc-message"), self.end_frame, self.end_error, self.http_error,
                           failure=self.failure, reset=self.reset)


def judge_append(http_status: int, body: bytes, headers: Iterable[tuple[str, str]],
                 framing: str) -> tuple[str, str | None, list[Frame]]:
    """(status, error, refusal frames) of one BidiAppend's answer: the refusal frames are what a
    capture stores after the append (an ``http_error``, or a gRPC-Web error trailer frame)."""
    answer: list[Frame] = []
    if http_status != 200:
        answer = [http_error_frame(http_status, body)]
    elif framing == GRPC_WEB and body:
        answer = default_decoder().decode_body(body, "bidi_append", "server")
    ends = [f for f in answer if kinds.is_end_stream(f.kind)]
    grpc = answer_grpc(headers, None, answer)
    status, err = session_status(ExchangeEnd(
        "bidi_append", http_status, framing, grpc.get("grpc-status"), grpc.get("grpc-message"), bool(ends),
        next((f.summary for f in ends if kinds.is_end_stream_error(f.kind)), None),
        next((f.summary for f in answer if f.kind == kinds.HTTP_ERROR), None)))
    return status, err, [f for f in answer if f.kind in (kinds.HTTP_ERROR, kinds.END_STREAM_ERROR)]


__all__ = ["EndSeen", "TransportError", "end_of", "eof_end", "error_from_http", "grpc_web_end", "judge_append"]
