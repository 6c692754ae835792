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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


__all__ = ["CONNECT", "GRPC", "GRPC_WEB", "NO_END", "NO_RESPONSE", "RESET_METADATA_KEY", "STATUSES",
           "STREAM_TRANSPORTS", "ExchangeEnd", "describe_reset", "framing_of", "grpc_fields", "h2_error_name",
           "http_ok", "reset_facts", "session_status", "with_append"]
