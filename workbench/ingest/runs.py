"""Sessions from decoded exchanges: a stream with its BidiAppends, in causal order, with times and meta.

- A Run/RunSSE/RunPoll exchange starts a session; BidiAppends join the RunSSE/RunPoll with the same
  request id, ordered by ``append_seqno`` (appends are in flight together and recorded out of order).
  Appends whose stream is not in the file form a group of their own (``appends_without_stream``).
- **Order.** Each session is put in causal order (``workbench.ingest.causal``): ``sessions.meta``
  says ``"order": "causal"``. When the ids do not allow it, the session keeps *body order* — the
  stream's client frames, each append's frames by ``append_seqno``, then the stream's server
  frames — and says ``"order": "body"`` with the reason in ``order_note``. Either way every frame
  has ``body_index`` in ``frames.meta``: its place in body order, so ``ORDER BY
  (meta->>'body_index')::INT`` recovers it.
- **Times.** In causal order a frame's ``ts`` is the earliest time consistent with the four times of
  the exchange that carried it and with the order (never decreasing along ``seq``). In body order it
  is the time of the HTTP message that carried it, as recorded.
- **Evidence of appends.** Every frame a BidiAppend carried gets the append's ``http_status``, and
  its client frame the ``content_type`` and redacted ``request_headers`` (``frames.meta``), the
  same keys live capture writes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.decode.classify import Decoder, Frame
from workbench.ingest.causal import ClientMessage, OrderUnknown, causal_positions, interleave
from workbench.ingest.exchange import Part, _first, _us, exchange_meta, exchange_status, learn_run
from workbench.ingest.identity import PlannedFrame, SessionPlan, frame_key
from workbench.protocol.append_meta import answer_grpc, append_exchange_meta
from workbench.protocol.status import with_append
from workbench.redact import bearer_hash, redact_headers
from workbench.schema.active import schema_stamp
from workbench.store.db import SessionInfo

TIMING_CAUSAL = ("the file has no per-frame timing: frames are in causal order (each answer right after the "
                 "server message it answers) and ts is the earliest time consistent with the four times of "
                 "the HTTP exchange that carried a frame")
TIMING_BODY = ("the file has no per-frame timing and its order could not be rebuilt (see order_note): "
               "client frames of a run precede its server frames; ts is the time of the HTTP message "
               "that carried a frame")


@dataclass(slots=True, eq=False)
class _Item:
    """One decoded frame and where it came from."""

    part: Part
    frame: Frame
    direction: str
    index: int  # place in its exchange (client frames, then server frames): the source_key suffix
    append: bool = False


def _items(part: Part, append: bool = False) -> tuple[list[_Item], list[_Item]]:
    client = [_Item(part, f, "client", i, append) for i, f in enumerate(part.client)]
    server = [_Item(part, f, "server", len(client) + i, append) for i, f in enumerate(part.server)]
    return client, server


def _body_ts(it: _Item) -> int:
    ex = it.part.ex
    t_client = _first(_us(ex.t_req_end), _us(ex.t_req_start))
    if it.direction == "client":
        return t_client
    return _first(_us(ex.t_resp_end), _us(ex.t_resp_start), t_client)


def _earliest(it: _Item, last_server: bool) -> int:
    """The earliest time the exchange's four times allow for this frame."""
    ex = it.part.ex
    if it.direction == "client":
        if it.append:
            return _first(_us(ex.t_req_end), _us(ex.t_req_start))
        return _first(_us(ex.t_req_start), _us(ex.t_req_end))
    if it.append or last_server:
        return _first(_us(ex.t_resp_end), _us(ex.t_resp_start))
    return _first(_us(ex.t_resp_start), _us(ex.t_resp_end))


def _append_meta(part: Part, client: bool) -> dict[str, Any]:
    """The facts of a BidiAppend's exchange (``workbench.protocol.append_meta``, the keys live capture
    writes) on its request frame; its answer frames get the ``http_status``."""
    ex = part.ex
    if not client:
        return {"http_status": ex.status}
    return append_exchange_meta(ex.status, redact_headers(ex.req_headers), ex.header("content-type"),
                                grpc=answer_grpc(ex.resp_headers, ex.trailers, part.server), error=ex.error)


def _planned(items: Sequence[_Item], body_index: dict[int, int], times: Sequence[int],
             transport_of: Callable[[_Item], str]) -> list[PlannedFrame]:
    out = []
    for it, ts in zip(items, times, strict=True):
        meta = dict(it.frame.meta or {})
        meta["body_index"] = body_index[id(it)]
        if it.append:
            meta.update(_append_meta(it.part, it.direction == "client"))
        it.frame.meta = meta
        out.append(PlannedFrame(ts, it.direction, transport_of(it), it.part.ex.stream_key, it.frame,
                                frame_key(it.part.ex.unit, it.index) if it.part.ex.unit else None))
    return out


def _units(parts: Sequence[Part]) -> list[str]:
    """Units that gave frames (a unit without frames cannot be recognised again, its session can)."""
    return [p.ex.unit for p in parts if p.ex.unit and (p.client or p.server)]


def _moment(it: _Item) -> float | None:
    """When an append's message was seen: its request start, or its response's end."""
    ex = it.part.ex
    if not it.append:
        return None
    return ex.t_req_start if it.direction == "client" else (ex.t_resp_end or ex.t_resp_start)


def _with_late_answers(ordered: list[_Item], late: list[_Item], tail_from: int) -> list[_Item]:
    """Put append answers that arrived after the stream's end among the frames after it, by time."""
    keyed = []
    last = float("-inf")
    for it in ordered[tail_from:]:  # already in order: keep it, times made non-decreasing
        t = _moment(it)
        last = max(last, t) if t is not None else last
        keyed.append((last, it))
    keyed += [(_moment(it) or last, it) for it in late]
    keyed.sort(key=lambda p: p[0])
    return ordered[:tail_from] + [it for _, it in keyed]


class PlanBuilder:
    """Builds the SessionPlans of one file (``source``, ``file_meta``) with one decoder."""

    def __init__(self, dec: Decoder, source: str, file_meta: dict[str, Any]) -> None:
        self.dec = dec
        self.source = source
        self.file_meta = file_meta

    def session_info(self, part: Part, transport: str) -> SessionInfo:
        ex = part.ex
        status, error = exchange_status(part)
        info = SessionInfo(ex.session_key, source=self.source, transport=transport, request_id=part.request_id,
                           client_version=ex.header("x-cursor-client-version"), host=ex.host,
                           path=ex.path.split("?", 1)[0], http_status=ex.status,
                           auth_hash=bearer_hash(ex.header("authorization")), status=status, error=error,
                           meta={**self.file_meta, "exchange": ex.ident, "timing": "per-message",
                                 **exchange_meta(ex), **schema_stamp(self.dec.schema)})
        rid_header = ex.header("x-request-id")
        if part.request_id and rid_header and rid_header != part.request_id:
            info.meta["request_id_mismatch"] = {"header": rid_header, "body": part.request_id}
        return info

    def _note_appends(self, info: SessionInfo, appends: list[Part], stream_end: float | None = None) -> None:
        appends.sort(key=lambda a: (a.seqno if a.seqno is not None else -1, a.ex.t_req_start or 0.0))
        seqnos = [a.seqno for a in appends if a.seqno is not None]
        info.meta["appends"] = [{"exchange": a.ex.ident, "append_seqno": a.seqno, "http_status": a.ex.status}
                                for a in appends]
        if seqnos:
            dup = sorted(s for s, k in Counter(seqnos).items() if k > 1)
            gaps = sorted(set(range(min(seqnos), max(seqnos) + 1)) - set(seqnos))
            if dup:
                info.meta["append_duplicates"] = dup
            if gaps:
                info.meta["append_gaps"] = gaps
        for a in appends:
            learn_run(self.dec, info, a.client)
            st, err = exchange_status(a)
            last_seen = a.ex.t_resp_end or a.ex.t_resp_start or a.ex.t_req_end or a.ex.t_req_start
            if st == "aborted" or (stream_end is not None and last_seen is not None and last_seen > stream_end):
                # cut off by the client, or refused once the run was over (no stream left to join):
                # the run's outcome is its stream's (live capture judges the same way)
                continue
            info.status, info.error = with_append(info.status, info.error, st, err,
                                                  f"{a.ex.ident} (append_seqno {a.seqno})")

    def stream(self, part: Part, appends: list[Part]) -> SessionPlan:
        """A Run/RunSSE/RunPoll session with the appends that joined it."""
        transport = part.route.transport
        info = self.session_info(part, transport)
        learn_run(self.dec, info, part.client)
        self._note_appends(info, appends, part.ex.t_resp_end)
        s_client, s_server = _items(part)
        body: list[_Item] = list(s_client)
        clients: list[ClientMessage] = [ClientMessage(it.frame) for it in s_client]
        client_items: list[_Item] = list(s_client)
        follow: list[list[_Item]] = [[] for _ in s_client]  # an append's response right after its request
        lead: list[_Item] = []
        late: list[_Item] = []  # append answers that arrived after the stream had ended
        end = part.ex.t_resp_end
        for a in appends:
            a_client, a_server = _items(a, append=True)
            body += a_client + a_server
            for it in a_client:
                clients.append(ClientMessage(it.frame, a.ex.t_req_start))
                client_items.append(it)
                follow.append([])
            answered = a.ex.t_resp_end or a.ex.t_resp_start or a.ex.t_req_end
            if end is not None and answered is not None and answered > end:
                late += a_server
            else:
                (follow[-1] if follow else lead).extend(a_server)
        body += s_server
        body_index = {id(it): i for i, it in enumerate(body)}

        def transport_of(it: _Item) -> str:
            return "bidi_append" if it.append else transport

        try:
            positions = causal_positions([it.frame for it in s_server], clients,
                                         response_start=part.ex.t_resp_start, response_end=part.ex.t_resp_end)
        except OrderUnknown as exc:
            info.meta.update(order="body", order_note=str(exc), timing_note=TIMING_BODY)
            frames = _planned(body, body_index, [_body_ts(it) for it in body], transport_of)
            return SessionPlan(info, _units([part, *appends]), frames)
        ordered: list[_Item] = list(lead)
        for side, i in interleave(len(s_server), positions):
            if side == "server":
                ordered.append(s_server[i])
            else:
                ordered.append(client_items[i])
                ordered.extend(follow[i])
        if late:
            final_server = s_server[-1] if s_server else None
            tail_from = next((len(ordered) - k for k, it in enumerate(reversed(ordered)) if it is final_server), 0)
            ordered = _with_late_answers(ordered, late, tail_from)
        times = []
        last = 0
        final = s_server[-1] if s_server else None
        for it in ordered:
            last = max(last, _earliest(it, it is final))
            times.append(last)
        info.meta.update(order="causal", timing_note=TIMING_CAUSAL)
        return SessionPlan(info, _units([part, *appends]), _planned(ordered, body_index, times, transport_of))

    def orphan_appends(self, request_id: str, appends: list[Part]) -> SessionPlan:
        """Appends whose RunSSE/RunPoll is not in the file: a session of their own, by append_seqno."""
        appends.sort(key=lambda a: (a.seqno if a.seqno is not None else -1))
        info = self.session_info(appends[0], "bidi_append")
        info.status = "incomplete"
        info.error = f"BidiAppend request_id {request_id} has no RunSSE/RunPoll stream in this file"
        self._note_appends(info, appends)
        body: list[_Item] = []
        for a in appends:
            c, s = _items(a, append=True)
            body += c + s
        info.meta.update(order="causal", appends_without_stream=True)
        frames = _planned(body, {id(it): i for i, it in enumerate(body)}, [_body_ts(it) for it in body],
                          lambda _it: "bidi_append")
        return SessionPlan(info, _units(appends), frames, absorbable=True)

    def single(self, part: Part) -> SessionPlan:
        """A unary call: its request, then its response."""
        info = self.session_info(part, part.route.transport)
        info.meta["order"] = "causal"
        learn_run(self.dec, info, part.client)  # an OpenAI request: model and label
        c, s = _items(part)
        body = c + s
        frames = _planned(body, {id(it): i for i, it in enumerate(body)}, [_body_ts(it) for it in body],
                          lambda _it: part.route.transport)
        return SessionPlan(info, _units([part]), frames)
