"""Status codes as the diagnosis reads them: Connect error codes, gRPC status numbers, HTTP statuses,
and what each usually means for a Cursor agent client (docs/protocol.md §7).

Also parses the error a stream ended with, whatever its framing: a Connect end-stream (flag 0x02,
JSON) or a gRPC-Web trailer frame (flag 0x80, ``grpc-status`` / ``grpc-message`` /
``grpc-status-details-bin``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from workbench.wire.endstream import CONNECT_CODE, b64decode_loose, parse_end_stream, parse_grpc_web_trailer
from workbench.wire.varint import top_level_fields

# gRPC status numbers and the Connect code of the same meaning (lower_snake): the wire's one table.
GRPC_CODES = ("ok", *(CONNECT_CODE[n] for n in range(1, len(CONNECT_CODE) + 1)))
CONNECT_CODES = frozenset(GRPC_CODES[1:])
ERROR_DETAILS_TYPE = "aiserver.v1.ErrorDetails"

# Advice per error code, for end-stream errors and failed calls.
ERROR_FIX = {
    "resource_exhausted": "Usage or rate limit (ERROR_RATE_LIMITED_CHANGEABLE): wait, switch model, or raise the plan.",
    "not_found": "Wrong model id (ERROR_BAD_MODEL_NAME): use a model_id the account offers.",
    "unauthenticated": "Token expired or missing (ERROR_NOT_LOGGED_IN / ERROR_UNAUTHORIZED): log in again.",
    "unavailable": "Provider outage (ERROR_OPENAI, retryable): retry with backoff.",
    "permission_denied": "The account may not use this feature or model.",
    "invalid_argument": "The server rejected the request itself (e.g. \"Conversation state is required\"): fix "
                        "the request encoding.",
    "deadline_exceeded": "The server gave up waiting: look for the obligation it was waiting on (an exec result or "
                         "stream_close, a KV answer, an interaction_response) earlier in the run.",
    "unimplemented": "The server does not implement this method or path (wrong service, or a server that lacks it).",
}
DEFAULT_FIX = "Read the error details (message is often just 'Error'); retry only if they say it is retryable."


def grpc_code_name(status: str | int | None) -> str | None:
    """``"8"`` → ``resource_exhausted``; None for OK, a missing or a non-numeric status."""
    try:
        n = int(status)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    if n == 0:
        return None
    return GRPC_CODES[n] if 0 < n < len(GRPC_CODES) else f"grpc-status {n}"


def http_cause(status: int | None, *, content_type: str | None = None, enveloped: bool | None = None,
               transport: str = "") -> str:
    """The likely cause of a non-2xx HTTP answer on a Cursor agent path."""
    ct = (content_type or "").lower()
    if status == 415:
        if "connect+" in ct and transport in ("bidi_append", "unary"):
            return (f"framing/content type: {content_type} is a streaming content type, but this call is unary "
                    "(a BidiAppend takes application/proto with a bare body, or application/grpc-web+proto with "
                    "an enveloped one)")
        if enveloped and ("application/proto" in ct or not ct):
            return ("framing/content type: an enveloped body (5-byte header) sent as Connect unary "
                    f"{content_type or 'without a content type'}; send the bare message, or declare "
                    "application/grpc-web+proto for an enveloped one")
        return (f"framing/content type: the server does not accept {content_type or 'this content type'} "
                "with this body on this path (enveloped vs bare body, Connect vs gRPC-Web)")
    if status == 464:
        return "HTTP/1.1 on a path that needs HTTP/2 (Run is full-duplex h2; use RunSSE + BidiAppend over HTTP/1.1)"
    if status in (401, 403):
        return "authentication: the bearer token is missing, expired or not allowed (log in again)"
    if status == 404:
        return "path or service not found (wrong host, path or method name)"
    if status == 400:
        return "the server could not parse the request (body encoding, e.g. BidiAppend data not hex)"
    if status in (408, 504):
        return "timeout between client and server (a proxy gave up, or the server did not answer in time)"
    if status == 429:
        return "rate limited: back off and retry"
    if status == 501:
        return "the server does not implement this method (wrong service, or a server/simulator that lacks it)"
    if status in (502, 503):
        return "the server or a proxy in between is unavailable: retry with backoff"
    if status is not None and status >= 500:
        return "server error: retry; if it persists, the request may trigger a server bug"
    return "an unexpected HTTP status for this call"


def status_in_text(text: str) -> int | None:
    """The HTTP status in an ``http_error`` frame's text (``HTTP 415 …``)."""
    bits = text.split()
    return int(bits[1]) if len(bits) >= 2 and bits[0] == "HTTP" and bits[1].isdigit() else None


def looks_enveloped(body: bytes | None) -> bool:
    """True when ``body`` is exactly one Connect/gRPC-Web envelope (flags byte, 4-byte length, payload)."""
    if not body or len(body) < 5 or body[0] not in (0x00, 0x01, 0x02, 0x03, 0x80):
        return False
    return int.from_bytes(body[1:5], "big") == len(body) - 5


@dataclass
class StreamError:
    """The error a stream ended with, whatever its framing."""

    code: str
    message: str = ""
    label: str = ""          # ErrorDetails.error, e.g. ERROR_RATE_LIMITED_CHANGEABLE
    title: str = ""
    detail: str = ""
    retryable: bool | None = None
    framing: str = "connect"  # connect | grpc-web


def parse_stream_error(payload: bytes, flags: int,
                       details: Callable[[bytes], dict[str, Any]] | None = None) -> StreamError:
    """Raises ValueError when a Connect end-stream is not the JSON Connect requires."""
    if flags & 0x80:
        t = parse_grpc_web_trailer(payload)
        err = StreamError(grpc_code_name(t.get("grpc-status")) or "unknown", t.get("grpc-message", ""),
                          framing="grpc-web")
        raw = t.get("grpc-status-details-bin")
        if raw:
            _apply_status_details(err, raw, details)
        return err
    es = parse_end_stream(payload, details)
    err = StreamError(es.code or "unknown", es.message or "")
    for d in es.details:
        _apply_detail(err, d.get("value") or {}, d.get("debug") or {})
    return err


def error_facts(code: str, message: str, details: Iterable[Mapping[str, Any]] = ()) -> StreamError:
    """A Connect error with its ``details[]`` read: ErrorDetails label, title, detail, retryable.

    ``details`` as ``parse_end_stream`` gives them (``value`` decoded, ``debug`` as sent); the
    decoded value wins over the debug JSON, which wins over nothing.
    """
    err = StreamError(code, message)
    for d in details:
        value, debug = d.get("value"), d.get("debug")
        _apply_detail(err, value if isinstance(value, dict) else {}, debug if isinstance(debug, dict) else {})
    return err


def _apply_detail(err: StreamError, value: dict[str, Any], debug: dict[str, Any]) -> None:
    err.label = err.label or str(value.get("error") or debug.get("error") or "")
    cd = value.get("details") or debug.get("details") or {}
    if isinstance(cd, dict):
        err.title = err.title or str(cd.get("title") or "")
        err.detail = err.detail or str(cd.get("detail") or "")
        if "is_retryable" in cd or "isRetryable" in cd:
            err.retryable = bool(cd.get("is_retryable", cd.get("isRetryable")))


def _apply_status_details(err: StreamError, text: str, details: Callable[[bytes], dict[str, Any]] | None) -> None:
    """google.rpc.Status{1 code, 2 message, 3 details Any{1 type_url, 2 value}} in base64."""
    try:
        raw = b64decode_loose(text)
    except (binascii.Error, ValueError):
        try:
            raw = base64.b64decode(text)
        except (binascii.Error, ValueError):
            return
    for num, value in top_level_fields(raw):
        if num == 2 and isinstance(value, bytes) and not err.message:
            err.message = value.decode("utf-8", "replace")
        elif num == 3 and isinstance(value, bytes) and details is not None:
            any_fields = dict(top_level_fields(value))
            type_url = any_fields.get(1)
            inner = any_fields.get(2)
            if isinstance(type_url, bytes) and type_url.decode("utf-8", "replace").endswith(ERROR_DETAILS_TYPE) \
                    and isinstance(inner, bytes):
                try:
                    _apply_detail(err, details(inner), {})
                except Exception:  # a detail we cannot decode must not hide the error itself
                    continue
