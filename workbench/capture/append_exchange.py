"""The end of a BidiAppend exchange, for the capture writer (``writer.py``): its frames' meta
completed with the answer's facts, and the server's refusal recorded after the append it refuses
(in seqno order, ``appends.py``); the first append refused while its run was open makes the run
end ``error``. Split out of ``writer.py``; works on the writer's public parts only.
"""

from __future__ import annotations

from typing import Protocol

from workbench.capture.appends import AppendOrder, Held
from workbench.capture.flows import Flow
from workbench.capture.sink import Sink
from workbench.decode.classify import Decoder, Frame, http_error_frame
from workbench.protocol.append_meta import answer_grpc, append_answer, append_exchange_meta
from workbench.protocol.status import http_ok, session_status


class AppendWriter(Protocol):
    """The parts of the capture writer (``writer.CaptureWriter``) an append's end works on: named here,
    so that this module need not import the writer that imports it."""

    decoder: Decoder
    sink: Sink
    appends: AppendOrder
    refused: dict[str, tuple[str, str | None, str]]

    def emit(self, sid: str, ts_us: int, direction: str, transport: str, stream: str | None, f: Frame) -> None: ...

    def emit_flow(self, fl: Flow, ts_us: int, direction: str, f: Frame) -> None: ...


def finish_append(w: AppendWriter, fl: Flow, ts_us: int, error: str | None, trailers: dict[str, str]) -> None:
    """A BidiAppend exchange is over: complete its frames' meta, then record any refusal."""
    fo = fl.open
    status = fl.http_status
    answer: list[Frame] = []
    decoded: list[Frame] = []
    body = fl.append_response or b""
    if status is not None and not http_ok(status):
        answer.append(http_error_frame(status, body))
        fl.http_error = answer[0].summary
    elif body:
        decoded = w.decoder.decode_body(body, "bidi_append", "server")
        for f in decoded:
            fl.note_end(f)
        answer, _trailer = append_answer(decoded)  # the trailer frame's status: answer_grpc reads it
    grpc = answer_grpc(fl.response_headers, trailers, decoded)
    meta = append_exchange_meta(status, fo.meta.get("request_headers"), fo.content_type, grpc=grpc, error=error)
    frames, fl.append_frames = fl.append_frames, []
    _judge_append(w, fl, frames, grpc, error)
    for f in frames:
        f.meta = meta  # a frame still held for seqno order is emitted with it
        where = fl.append_emitted.pop(id(f), None)
        if where is not None:  # already recorded: complete its meta in place
            w.sink.patch_meta(where[0], where[1], f, meta)
    if not frames:  # nothing decodable arrived (an empty body): the refusal still belongs somewhere
        for f in answer:
            w.emit_flow(fl, ts_us, "server", f)
        return
    last = frames[-1]
    for a in answer:
        a.request_id, a.append_seqno = last.request_id, last.append_seqno
        item: Held = (ts_us, "server", "bidi_append", fo.key, a)
        if not w.appends.attach(last.request_id or "", last.append_seqno, item):
            w.emit(last.request_id or "", *item)


def _judge_append(w: AppendWriter, fl: Flow, frames: list[Frame], grpc: dict[str, str], error: str | None) -> None:
    """Remember the first append refused while its run was open: the run ends ``error`` then."""
    sid = fl.session_id
    info = w.sink.get_session(sid) if sid is not None else None
    if sid is None or info is None or info.status != "open" or sid in w.refused:
        return  # no run, the run is over (no stream left to harm), or refused before
    status, err = session_status(fl.ending(grpc, error))
    if status == "error":
        seqno = frames[0].append_seqno if frames else fl.append_seqno
        w.refused[sid] = (status, err, f"BidiAppend append_seqno {seqno}")

