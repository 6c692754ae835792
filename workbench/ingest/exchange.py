"""Recorded HTTP exchanges (from flow files, HAR or packet captures): decoding and status.

The formats keep whole bodies and four times per exchange (request start/end, response
start/end), nothing per frame. ``decode_exchange`` turns one exchange into client and server frames
(redacted like live capture). This module only decodes: ``workbench.ingest.exchange_import`` is the
pipeline that writes them (``workbench.ingest.runs`` groups them into sessions, a stream with its
BidiAppends, and rebuilds their order; ``workbench.ingest.identity`` writes what is new).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.decode.classify import CLIENT_MSG, Decoder, Frame, http_error_frame
from workbench.protocol import kinds
from workbench.protocol.append_meta import append_answer
from workbench.protocol.content_coding import undo_body
from workbench.protocol.labels import fill_label
from workbench.protocol.openai import fill_openai_session
from workbench.protocol.routes import DEFAULT_PATHS, Matcher, Route, is_openai_transport
from workbench.protocol.run_request import OPENING_KINDS, fill_session, run_request_facts
from workbench.protocol.status import (
    STREAM_TRANSPORTS,
    ExchangeEnd,
    framing_of,
    grpc_fields,
    http_ok,
    session_status,
)
from workbench.redact import marker, redact_frame, redact_headers, secret_method
from workbench.store.db import SessionInfo

# Classify by path, never by host (docs/protocol.md §1): every aiserver RPC counts as agent traffic.
_MATCHER = Matcher(hosts=(), paths=DEFAULT_PATHS + ("/aiserver.v1.*/*", "/agent.v1.*/*"))


@dataclass
class Exchange:
    """One HTTP request/response as a file recorded it."""

    ident: str                       # "flow <id>" / "entry 12": names it in messages
    stream_key: str                  # the frames' ``stream`` column
    session_key: str                 # stable id for the session this exchange may start
    method: str
    host: str
    path: str
    unit: str = ""                   # identity of the recorded unit: "flow:<id>", "har:<entry hash>"
    http_version: str = ""
    req_headers: list[tuple[str, str]] = field(default_factory=list)
    req_body: bytes | None = b""
    req_missing: str | None = None   # why req_body is None / unusable ("streamed", "mangled …")
    status: int | None = None
    resp_headers: list[tuple[str, str]] = field(default_factory=list)
    resp_body: bytes | None = b""
    resp_missing: str | None = None
    trailers: list[tuple[str, str]] = field(default_factory=list)
    t_req_start: float | None = None
    t_req_end: float | None = None
    t_resp_start: float | None = None
    t_resp_end: float | None = None
    error: str | None = None         # connection error the recorder saw (flow.error, HAR _error)
    reset: dict[str, Any] | None = None  # which side failed and how, when the recorder kept it (capture's meta.reset)
    meta: dict[str, Any] = field(default_factory=dict)
    # HTTP content-codings still applied to a body (``content-encoding``, in the order applied):
    # undone in ``decode_exchange`` within the inflate budgets, never before
    req_coding: list[str] = field(default_factory=list)
    resp_coding: list[str] = field(default_factory=list)

    def header(self, name: str, response: bool = False) -> str | None:
        for k, v in self.resp_headers if response else self.req_headers:
            if k.lower() == name:
                return v
        return None

    @property
    def route(self) -> Route | None:
        return _MATCHER.route("", self.path)

    def where(self) -> str:
        return f"{self.ident} ({self.method} {self.path})"


# The last microsecond a datetime can hold (9999-12-31T23:59:59.999999 UTC): readers of the store
# turn ``ts`` into datetimes, so a time past it is as unknown as a negative, NaN or infinite one.
MAX_EPOCH_US = 253_402_300_799_999_999


def sane_time(t: Any) -> float | None:
    """An epoch time in seconds a file recorded, or None when it is not one (not a finite number,
    not after 1970, past year 9999): a hostile or damaged time is unknown, never an error."""
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
        return None
    return float(t) if t * 1_000_000 <= MAX_EPOCH_US else None


def _us(t: float | None) -> int | None:
    t = sane_time(t)
    return int(t * 1_000_000) if t else None


def _first(*values: int | None) -> int:
    for v in values:
        if v:
            return v
    return 0


@dataclass
class Part:
    """Frames of one exchange, decoded, with the times they get."""

    ex: Exchange
    route: Route
    client: list[Frame] = field(default_factory=list)
    server: list[Frame] = field(default_factory=list)
    request_id: str | None = None
    seqno: int | None = None


def undo_content_coding(ex: Exchange, route: Route) -> dict[str, Frame]:
    """Undo each body's ``content-encoding`` within the inflate budgets (``workbench.wire.inflate``).

    A body that would inflate past a budget becomes one ``compressed`` frame with an error naming
    the budget (``protocol.content_coding``; returned by side: "client"/"server"); a body whose coding cannot
    be undone (broken, unknown) is reported like a mangled body.
    """
    kept: dict[str, Frame] = {}
    if route.transport == "unary" and secret_method(ex.path):
        return kept  # stored as a hash whatever its coding: nothing to inflate
    for side, codings in (("client", ex.req_coding), ("server", ex.resp_coding)):
        body = ex.req_body if side == "client" else ex.resp_body
        missing = ex.req_missing if side == "client" else ex.resp_missing
        if not codings or not body or missing is not None:
            continue
        done = undo_body(body, codings, session_key=ex.session_key, side=side, unary=route.transport == "unary",
                         msg_type=route.request_type if side == "client" else route.response_type, ident=ex.ident)
        if done.kept is not None:
            kept[side] = done.kept
        elif side == "client":
            ex.req_body, ex.req_missing = done.plain, done.problem
        else:
            ex.resp_body, ex.resp_missing = done.plain, done.problem
    return kept


def decode_exchange(dec: Decoder, ex: Exchange, route: Route) -> Part:
    part = Part(ex, route)
    transport = route.transport
    kept = undo_content_coding(ex, route)
    secret = route.transport == "unary" and secret_method(ex.path)
    if "client" in kept:
        part.client = [kept["client"]]
    elif ex.req_body and ex.req_missing is None:
        if secret:
            part.client = [Frame("unary", "credential RPC body (redacted)", marker(ex.req_body).encode())]
        else:
            part.client = dec.decode_body(ex.req_body, transport, "client", msg_type=route.request_type,
                                          session=ex.session_key)
    elif ex.req_body is not None and ex.req_missing is not None:  # present but unusable (mangled text in a HAR)
        # A client body can hold model credentials, and one we cannot parse cannot be redacted:
        # keep its hash only (the bytes are corrupt anyway).
        part.client = [Frame("malformed", f"request body unusable: {ex.req_missing}", marker(ex.req_body).encode(),
                             error=f"{ex.ident}: request body {ex.req_missing}; stored as a hash "
                             f"({len(ex.req_body)} bytes) since it could not be parsed to redact credentials")]
    ok = http_ok(ex.status)
    if "server" in kept:
        part.server = [kept["server"]]
    elif ex.resp_body is not None and ex.resp_missing is None:
        if ex.status is not None and not ok and not is_openai_transport(transport):
            if ex.resp_body or transport != "bidi_append":
                part.server = [http_error_frame(ex.status, ex.resp_body)]
        elif secret:
            if ex.resp_body:
                part.server = [Frame("unary", "credential RPC body (redacted)", marker(ex.resp_body).encode())]
        elif transport == "bidi_append":
            if ex.resp_body:
                # As live capture keeps it: an accepted answer is the append's meta (a gRPC-Web
                # trailer's status joins the exchange's trailers), a refusal is a frame.
                part.server, trailer = append_answer(dec.decode_body(ex.resp_body, "bidi_append", "server",
                                                                     session=ex.session_key))
                ex.trailers = [*ex.trailers, *trailer.items()]
        elif ex.resp_body or transport in STREAM_TRANSPORTS:
            part.server = dec.decode_body(ex.resp_body, transport, "server", msg_type=route.response_type,
                                          session=ex.session_key)
    elif ex.resp_body is not None:
        part.server = [Frame("malformed", f"response body unusable: {ex.resp_missing}", ex.resp_body,
                             error=f"{ex.ident}: response body {ex.resp_missing}")]
    part.client = [redact_frame(f, decoder=dec) for f in part.client]
    part.server = [redact_frame(f, decoder=dec) for f in part.server]
    for f in part.client:
        if f.request_id:
            part.request_id = f.request_id
            break
    if transport == "bidi_append" and part.client:
        part.seqno = part.client[0].append_seqno
        for f in part.server:
            f.request_id, f.append_seqno = part.client[0].request_id, part.seqno
    part.request_id = part.request_id or ex.header("x-request-id")
    return part


def exchange_end(part: Part) -> ExchangeEnd:
    """What the file says about how this exchange ended (``workbench.protocol.status``)."""
    ex = part.ex
    grpc = grpc_fields(ex.resp_headers, ex.trailers)
    end_error = next((f.summary for f in part.server if kinds.is_end_stream_error(f.kind)), None)
    http_error = next((f.error for f in part.server if f.kind == kinds.HTTP_ERROR), None)
    missing = tuple((side, why) for side, why in (("response", ex.resp_missing), ("request", ex.req_missing)) if why)
    return ExchangeEnd(part.route.transport, ex.status, framing_of(ex.header("content-type")),
                       grpc.get("grpc-status"), grpc.get("grpc-message"),
                       any(kinds.is_end_stream(f.kind) for f in part.server), end_error, http_error,
                       failure=ex.error, reset=ex.reset, missing=missing)


def exchange_status(part: Part) -> tuple[str, str | None]:
    return session_status(exchange_end(part))


def learn_run(dec: Decoder, info: SessionInfo, frames: Sequence[Frame]) -> None:
    """Label, model and conversation id from the first run_request / prewarm_request among ``frames``."""
    for f in frames:
        if f.kind == kinds.OPENAI_REQUEST:
            fill_openai_session(info, f.payload)
            return
        if f.kind not in OPENING_KINDS:
            continue
        fill_label(info, kind=f.kind, payload=f.payload)  # frames are redacted by now
        facts = run_request_facts(f.kind, f.payload, dec.info(CLIENT_MSG).cls)
        if facts is not None:
            fill_session(info, facts)
        return


def exchange_meta(ex: Exchange) -> dict[str, Any]:
    m: dict[str, Any] = {"method": ex.method, "http_version": ex.http_version,
                         "request_headers": [list(p) for p in redact_headers(ex.req_headers)]}
    if ex.status is not None:
        m["response_headers"] = [list(p) for p in redact_headers(ex.resp_headers)]
    if ex.trailers:
        m["trailers"] = dict(redact_headers(ex.trailers))
    if ex.reset is not None:
        m["reset"] = ex.reset
    for k, v in ex.meta.items():
        m[k] = v
    return m
