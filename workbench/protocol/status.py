"""How a recorded exchange ended: the one rule for a session's ``status`` and ``error``.

Every source of sessions asks this module: live capture (``workbench.capture.writer``), imports of
flow files and HAR (``workbench.ingest``), and the built-in client's own recording
(``workbench.client``). Each collects what it saw of one exchange into an ``ExchangeEnd`` and calls
``session_status``, so the same bytes get the same status whichever way they were recorded
(docs/protocol.md §2, "How a recorded exchange ends").

The rule, first match wins:

1. ``aborted``: the exchange failed before its response ended: a reset (RST_STREAM) from either
   side, a lost connection, a recorder's error. A failure after the response ended (a server's
   RST_STREAM(NO_ERROR) after END_STREAM, a client resetting once it has the whole answer) leaves
   the status the response earned; it is kept in ``meta.reset`` only.
2. A body the recording did not keep (imports only): ``incomplete`` when it was not recorded
   (streamed by the recorder), ``error`` when it is unusable (mangled text in a HAR).
3. ``incomplete``: no response at all (no status, no end frame, no trailers; a recorder that
   kept the end of a response but not its status still has a response).
4. ``error``: an HTTP status other than 200. Connect and gRPC answer every successful call with
   200 and put any error in the body or the trailers; any other final status (a 3xx, 4xx, 5xx, or
   a 1xx a recorder kept as final) means the call did not succeed.
5. ``error``: an end-stream frame carrying an error (Connect 0x02 ``{"error": …}``, or a gRPC-Web
   trailer frame with a non-zero ``grpc-status``).
6. ``error``: a non-zero ``grpc-status`` in the HTTP trailers (or in the headers of a
   trailers-only gRPC answer).
7. ``incomplete``: a Run/RunSSE/RunPoll stream that ended without its end: the end-stream frame in
   Connect framing (0x02), the trailer frame in gRPC-Web (0x80), or the trailers in gRPC. A clean
   ``grpc-status: 0`` trailer is that end for the gRPC family; a Connect stream must still carry
   its end-stream frame (Connect has no trailers to end a stream).
8. ``complete``.

A RunSSE/RunPoll session is its stream plus the BidiAppends that carried the client's messages:
``with_append`` turns a complete session into ``error`` when one of its appends was refused while
the run was going on (an append refused after the stream ended has no run left to harm; one the
client cut off, or whose answer was not recorded, is no refusal).

What a status or an error *means* lives here too (docs/protocol.md §7): Connect error codes and gRPC
status numbers by name, the advice for each, the likely cause of a non-200 HTTP answer, and the
error a stream ended with, read whatever its framing (``parse_stream_error``: a Connect end-stream
or a gRPC-Web trailer frame, with its ``ErrorDetails``). Parsing and building the wire forms of an
end (the end-stream JSON, trailer lines, the code table) stays in ``workbench.wire.endstream``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.wire.endstream import (
    CONNECT_CODE,
    DetailsDecoder,
    b64decode_loose,
    parse_end_stream,
    parse_grpc_web_trailer,
)
from workbench.wire.varint import top_level_fields

STREAM_TRANSPORTS = ("run", "runsse", "runpoll")
CONNECT, GRPC, GRPC_WEB = "connect", "grpc", "grpc-web"
# Where the capture addon keeps a flow's reset facts (``flow.metadata``); a flow file saved with
# the addon loaded carries them, and the flow-file importer reads them back.
RESET_METADATA_KEY = "workbench_reset"

STATUSES = ("open", "complete", "incomplete", "error", "aborted")
NO_END = "stream ended without an end-stream frame"
NO_RESPONSE = "no response recorded"


def framing_of(content_type: str | None) -> str:
    """The framing a content type asks for: ``connect`` (also plain ``application/proto`` and JSON),
    ``grpc`` (``application/grpc…``) or ``grpc-web`` (``application/grpc-web…``)."""
    ct = (content_type or "").strip().lower()
    if ct.startswith("application/grpc-web"):
        return GRPC_WEB
    if ct.startswith("application/grpc"):
        return GRPC
    return CONNECT


def http_ok(status: int | None) -> bool:
    """Did the HTTP layer answer with success? Connect and gRPC use exactly 200 (docs/protocol.md §2)."""
    return status == 200


def grpc_fields(*sources: Iterable[tuple[str, str]] | Mapping[str, str] | None) -> dict[str, str]:
    """``grpc-status`` / ``grpc-message`` from headers, trailers or a parsed trailer frame; a later
    source wins (pass response headers, then trailers, then trailer frames)."""
    out: dict[str, str] = {}
    for src in sources:
        if not src:
            continue
        pairs = src.items() if isinstance(src, Mapping) else src
        for name, value in pairs:
            key = name.lower()
            if key in ("grpc-status", "grpc-message"):
                out[key] = value
    return out


def reset_facts(side: str, after_response_end: bool, h2_error_code: int | None = None,
                message: str = "") -> dict[str, Any]:
    """The ``meta.reset`` record of a failed stream: which side (``client`` | ``server``), the HTTP/2
    error code of its RST_STREAM (with its name, e.g. ``CANCEL``; none for a lost connection), and
    whether the response had already ended. ``message`` is ``describe_reset`` of it for a reset."""
    info: dict[str, Any] = {"side": side, "message": message, "after_response_end": after_response_end}
    if h2_error_code is not None:
        info["h2_error_code"] = h2_error_code
        info["code"] = h2_error_name(h2_error_code)
        info["message"] = describe_reset(info)
    return info


def h2_error_name(code: int) -> str:
    """``CANCEL`` for 8, … (the number as text for a code HTTP/2 does not define)."""
    # h2 loads only to name a reset code
    import h2.errors

    try:
        return h2.errors.ErrorCodes(code).name
    except ValueError:
        return str(code)


def describe_reset(info: Mapping[str, Any]) -> str:
    """A session error line: ``stream reset by client (CANCEL)`` or ``server connection lost (…)``."""
    if info.get("code") is not None:
        return f"stream reset by {info.get('side', '?')} ({info['code']})"
    return f"{info.get('side', '?')} connection lost ({info.get('message', '')})"


@dataclass(frozen=True, slots=True)
class ExchangeEnd:
    """What a recording saw of how one HTTP exchange ended.

    ``transport``: run | runsse | runpoll | bidi_append | unary. ``framing``: ``framing_of`` the
    request's content type. ``grpc_status``/``grpc_message``: from the HTTP trailers (or the
    headers of a trailers-only answer), as text. ``end_frame``: an end-stream envelope (0x02) or a
    gRPC-Web trailer frame (0x80) was seen; ``end_error``: the summary of the one that carried an
    error. ``http_error``: the text of the ``http_error`` frame a non-200 answer became.
    ``failure``: the recorder's error for a failed exchange; ``reset``: which side failed and how
    (``side``, ``code``, ``h2_error_code``, ``message``, ``after_response_end``; capture's
    ``meta.reset``). ``missing``: ``(side, why)`` for each body the recording did not keep.
    """

    transport: str
    http_status: int | None = None
    framing: str = CONNECT
    grpc_status: str | None = None
    grpc_message: str | None = None
    end_frame: bool = False
    end_error: str | None = None
    http_error: str | None = None
    failure: str | None = None
    reset: Mapping[str, Any] | None = None
    missing: Sequence[tuple[str, str]] = field(default_factory=tuple)

    @property
    def failed_before_end(self) -> bool:
        """The exchange failed while its response was still running."""
        if self.reset is not None:
            return not self.reset.get("after_response_end")
        return self.failure is not None


def session_status(end: ExchangeEnd) -> tuple[str, str | None]:
    """(status, error) of the session an exchange forms (the rule in this module's docstring)."""
    if end.failed_before_end:
        if end.reset is not None:
            return "aborted", describe_reset(end.reset)
        return "aborted", end.failure
    missing = dict(end.missing)
    for side in ("response", "request"):
        if missing.get(side) == "streamed":
            return "incomplete", ("body" if side == "response" else "request body") + " not recorded (streamed)"
    for side in ("response", "request"):
        why = missing.get(side)
        if why:
            return ("incomplete" if why.startswith("not recorded") else "error"), f"{side} body {why}"
    if end.http_status is None and not (end.end_frame or end.grpc_status is not None):
        return "incomplete", NO_RESPONSE
    if end.http_status is not None and not http_ok(end.http_status):
        return "error", end.http_error or f"HTTP {end.http_status}"
    if end.end_error is not None:
        return "error", end.end_error
    if end.grpc_status not in (None, "0"):
        return "error", f"grpc-status {end.grpc_status} {end.grpc_message or ''}".rstrip()
    if end.transport in STREAM_TRANSPORTS and not _ended(end):
        return "incomplete", NO_END
    return "complete", None


def _ended(end: ExchangeEnd) -> bool:
    if end.end_frame:
        return True
    return end.grpc_status == "0" and end.framing != CONNECT


def with_append(status: str, error: str | None, append_status: str, append_error: str | None,
                label: str) -> tuple[str, str | None]:
    """A run's (status, error) once one of its BidiAppends ended with (append_status, append_error)
    while the run was going on. ``label`` names the append in the error ("flow 3 (append_seqno 2)").

    Only a complete run changes, and only a refusal changes it (the append ``error``: a non-200
    answer, an error trailer or end-stream, a body a recorder mangled): its first refused append
    makes the run ``error``. An append the client cut off (``aborted``) is the client leaving; one
    whose answer the recording does not hold (``incomplete``) says nothing either way.
    """
    if status != "complete" or append_status != "error":
        return status, error
    return "error", f"{label}: {append_error}"


# --- what an error means ------------------------------------------------------------------------

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


_AUTH = "authentication: the bearer token is missing, expired or not allowed (log in again)"
_TIMEOUT = "timeout between client and server (a proxy gave up, or the server did not answer in time)"
_UNAVAILABLE = "the server or a proxy in between is unavailable: retry with backoff"
# What a status means on an agent path whatever the request (a 415's cause depends on it: ``http_cause``).
_HTTP_CAUSES: dict[int, str] = {
    464: "HTTP/1.1 on a path that needs HTTP/2 (Run is full-duplex h2; use RunSSE + BidiAppend over HTTP/1.1)",
    401: _AUTH, 403: _AUTH,
    404: "path or service not found (wrong host, path or method name)",
    400: "the server could not parse the request (body encoding, e.g. BidiAppend data not hex)",
    408: _TIMEOUT, 504: _TIMEOUT,
    429: "rate limited: back off and retry",
    501: "the server does not implement this method (wrong service, or a server/simulator that lacks it)",
    502: _UNAVAILABLE, 503: _UNAVAILABLE,
}


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
    if status in _HTTP_CAUSES:
        return _HTTP_CAUSES[status]
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
                       details: DetailsDecoder | None = None) -> StreamError:
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


def _apply_detail(err: StreamError, value: JsonObject, debug: JsonObject) -> None:
    err.label = err.label or str(value.get("error") or debug.get("error") or "")
    cd = value.get("details") or debug.get("details") or {}
    if isinstance(cd, dict):
        err.title = err.title or str(cd.get("title") or "")
        err.detail = err.detail or str(cd.get("detail") or "")
        if "is_retryable" in cd or "isRetryable" in cd:
            err.retryable = bool(cd.get("is_retryable", cd.get("isRetryable")))


def _apply_status_details(err: StreamError, text: str, details: DetailsDecoder | None) -> None:
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


__all__ = ["CONNECT", "CONNECT_CODES", "DEFAULT_FIX", "ERROR_DETAILS_TYPE", "ERROR_FIX", "GRPC", "GRPC_CODES",
           "GRPC_WEB", "NO_END", "NO_RESPONSE", "RESET_METADATA_KEY", "STATUSES", "STREAM_TRANSPORTS", "ExchangeEnd",
           "StreamError", "describe_reset", "error_facts", "framing_of", "grpc_code_name", "grpc_fields",
           "h2_error_name", "http_cause", "http_ok", "looks_enveloped", "parse_stream_error", "reset_facts",
           "session_status", "status_in_text", "with_append"]
