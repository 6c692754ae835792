"""The capture writer: one thread that turns proxy events into sessions and frames in the store.

The proxy side (``addon.py``) only stamps and enqueues; everything else happens here, off the
proxy's event loop: envelope reassembly, classification, session bookkeeping, BidiAppend joining
and reordering (``appends.py``), redaction, and batched commits through ``sink.py`` (at most one
commit per flush interval, each a committed transaction, so live readers see whole batches and
``seq > last`` polling never duplicates or skips a frame). The events, ``FlowOpen`` and the
per-flow state ``Flow`` live in ``flows.py`` (re-exported here): one NamedTuple per event
(``Open``, ``Chunk``, ``Eof``, ``Response``, ``Body``, ``Done``, ``Late``, ``Stop``), dispatched on
its type. Every frame and session row then goes through the store's write gate (``Recorder`` →
``workbench.store.gate``), which enforces redaction, UTF-8 text and one transaction per batch.

When the database cannot be opened or a commit fails, the sink says so loudly and switches to the
spool, then to a second spool location, then to memory up to a bound; frames beyond that are
counted as lost and reported at stop (``CaptureWriter.lost``), never dropped silently.

A BidiAppend frame is emitted once its HTTP exchange is over, carrying the exchange's facts in
``Frame.meta`` (status, redacted request headers, content type, gRPC status), followed by the
server's error frame if it refused the append.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from workbench.analysis.stored import refresh_ended
from workbench.capture.append_exchange import finish_append
from workbench.capture.appends import AppendOrder, Held
from workbench.capture.flows import (
    Batch,
    Body,
    Chunk,
    Done,
    Eof,
    Event,
    Flow,
    FlowOpen,
    Late,
    Open,
    Response,
    Stop,
)
from workbench.capture.pacing import Pacer, Pacing
from workbench.capture.sink import Sink, SinkConfig
from workbench.capture.writer_config import CommitListener, WriterConfig
from workbench.decode.classify import (
    CLIENT_MSG,
    Decoder,
    Frame,
    default_decoder,
    http_error_frame,
)
from workbench.protocol import kinds
from workbench.protocol.append_meta import append_exchange_meta
from workbench.protocol.content_coding import undo_body
from workbench.protocol.labels import fill_label
from workbench.protocol.openai import fill_openai_session
from workbench.protocol.routes import is_openai_transport
from workbench.protocol.run_request import OPENING_KINDS, fill_session, run_request_facts
from workbench.protocol.status import (
    grpc_fields,
    http_ok,
    session_status,
    with_append,
)
from workbench.redact import marker, redact_frame, secret_method
from workbench.schema.active import schema_stamp
from workbench.store.db import SessionInfo, us_to_datetime

log = logging.getLogger("workbench.capture")

# re-exported: the addon, tests and benchmarks import the event vocabulary from here
__all__ = ["Batch", "Body", "CaptureWriter", "Chunk", "Done", "Eof", "Event", "FlowOpen", "Late", "Open",
           "Response", "Stop", "WriterConfig"]


class CaptureWriter:
    """Turns one capture process's proxy events into sessions and frames (through a ``Sink``).

    ``pacer``: how it shares the GIL (default ``Pacer``: with the proxy's event loop, as a thread);
    ``commits``: told before and after each commit, with the last ``Batch`` handled.
    """

    def __init__(self, config: WriterConfig, decoder: Decoder | None = None,
                 on_error: Callable[[str], None] | None = None, *, pacer: Pacing | None = None,
                 commits: CommitListener | None = None) -> None:
        self.config = config
        self.decoder = decoder or default_decoder()
        self.queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._on_error = on_error
        self.sink = Sink(SinkConfig(config.db_path, live=config.live, stats_path=config.stats_path,
                                    hold_frames=config.hold_frames, hold_bytes=config.hold_bytes),
                         self._loud, self._note)
        self.flows: dict[str, Flow] = {}
        self.appends = AppendOrder(self.emit)
        self.live_run_ids: dict[str, str] = {}
        # session → (status, error, label) of the first append refused while its run was open
        self.refused: dict[str, tuple[str, str | None, str]] = {}
        self.mark = 0  # the last ``Batch`` handled
        self._commits = commits
        self._session_ns = uuid.UUID(config.session_ns) if config.session_ns else None
        self._thread = threading.Thread(target=self._run, name="workbench-capture-writer", daemon=True)
        self._stopped = threading.Event()
        self._wake = threading.Event()
        self.pacer: Pacing = pacer if pacer is not None else Pacer(self.queue)

    # counters callers read (the database and the recorder stay the sink's) ------------------------

    @property
    def frames_total(self) -> int:
        return self.sink.frames_total

    @property
    def frames_committed(self) -> int:
        return self.sink.frames_committed

    @property
    def lost(self) -> int:
        """Frames that reached the writer but are in neither the database nor a spool file."""
        return self.sink.lost

    def stats(self) -> dict[str, Any]:
        return self.sink.stats()

    def flush(self) -> None:
        commits = self._commits
        if commits is None:
            self.sink.flush()
            return
        commits.committing(self.mark)
        self.sink.flush()
        commits.committed(self.mark)

    # lifecycle ---------------------------------------------------------------------------------

    def start(self, before: Callable[[], None] | None = None, settle_open: bool = True) -> None:
        """Open the sink and start the thread; ``before`` runs in between (a resume). With
        ``settle_open`` off the sessions left open in the database stay open (their flows go on)."""
        self.sink.open(settle_open)
        if before is not None:
            before()
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self.queue.put(Stop())
            self._wake.set()
            self._thread.join(timeout)
        self.sink.close()

    def _loud(self, msg: str) -> None:
        # mitmdump exits when an error is logged during its start-up, and a capture that cannot
        # write its database must keep proxying (and spool): warn then, error afterwards.
        (log.error if self._thread.is_alive() else log.warning)(msg)
        print(f"workbench capture: ERROR: {msg}", file=sys.stderr, flush=True)
        if self._on_error is not None:
            self._on_error(msg)

    def _note(self, msg: str) -> None:
        log.warning(msg)
        print(f"workbench capture: {msg}", file=sys.stderr, flush=True)

    # the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        # The thread sleeps between ticks and drains the queue in one go: waking per chunk would
        # make it contend for the GIL with the proxy's event loop on every frame, which is what
        # adds latency to a ping-pong exchange. Each tick starts early by what the previous one
        # cost, so a frame is committed about one flush interval after it passed the proxy.
        interval = self.config.flush_interval
        get = self.queue.get_nowait
        handle = self._handle
        pacer = self.pacer
        cost = 0.0
        next_tick = time.monotonic() + interval
        stop = False
        while not stop:
            self._wake.wait(max(0.0, next_tick - time.monotonic()))
            tick = time.monotonic()
            # Under a flood the queue refills while it drains: stop after most of an interval so
            # commits keep coming (and a crash loses at most about one interval).
            drain_until = tick + interval * 0.8
            n = 0
            pacer.begin()
            while True:
                n += 1
                if not n & 255 and time.monotonic() > drain_until and not stop:
                    break
                try:
                    ev = get()
                except queue.Empty:
                    break
                if type(ev) is Stop:
                    stop = True
                    continue
                try:
                    handle(ev)
                except Exception as exc:  # keep recording whatever one bad event did
                    log.exception("capture writer: event failed")
                    self._loud(f"internal error on a capture event: {exc!r}")
                pacer.step()  # lets a busy event loop have the GIL (pacing.py)
            self.appends.release_due(time.monotonic(), force=stop)
            if stop:
                self._finish_all()
            self.flush()
            refresh_ended(self.sink, final=stop)  # findings of sessions that ended, stored after their commit
            cost = time.monotonic() - tick
            next_tick = tick + max(interval / 2, interval - cost)
        self._stopped.set()

    # events ------------------------------------------------------------------------------------

    def _handle(self, ev: Event) -> None:
        t = type(ev)
        if t is Chunk:
            self._chunk(*ev)
        elif t is Open:
            self._open_flow(ev.flow)  # type: ignore[union-attr]
        elif t is Eof:
            self._eof(*ev)
        elif t is Response:
            self._response(*ev)
        elif t is Body:
            self._body(*ev)
        elif t is Done:
            self._done(*ev)
        elif t is Late:
            self._late(*ev)
        elif t is Batch:
            self._batch(ev)  # type: ignore[arg-type]

    def _batch(self, batch: Batch) -> None:
        """One batch of the writer process's sender, handled whole (a drain never stops inside one,
        so what a confirmation covers is always whole batches)."""
        handle = self._handle
        for ev in batch.events:
            try:
                handle(ev)
            except Exception as exc:  # keep recording whatever one bad event did
                log.exception("capture writer: event failed")
                self._loud(f"internal error on a capture event: {exc!r}")
        self.mark = batch.number

    def new_session_id(self, key: str) -> str:
        """A new session's id: random, or derived from the flow with ``config.session_ns``."""
        if self._session_ns is None:
            return str(uuid.uuid4())
        return str(uuid.uuid5(self._session_ns, key))

    def _open_flow(self, fo: FlowOpen) -> None:
        fl = Flow(fo, secret=fo.transport == "unary" and secret_method(fo.path))
        self.flows[fo.key] = fl
        if fo.streaming:
            fl.decoders = {"client": self.decoder.stream(fo.transport, "client"),
                           "server": self.decoder.stream(fo.transport, "server")}
        if fo.transport == "run":
            sid = fo.request_id or self.new_session_id(fo.key)
            if sid in self.live_run_ids.values():
                sid = f"{sid}#{fo.key[:8]}"  # two live Run streams reusing one request id
            self.live_run_ids[fo.key] = sid
            self._bind(fl, sid)
        elif fo.transport == "unary" or is_openai_transport(fo.transport):
            self._bind(fl, self.new_session_id(fo.key))
        elif fo.transport in ("runsse", "runpoll"):
            self.appends.stream_opened(fo.key)  # names its run with the BidiRequestId in its body
        # bidi_append joins its run by the body

    def session_info(self, fl: Flow, sid: str) -> SessionInfo:
        fo = fl.open
        return SessionInfo(session_id=sid, source="capture", transport=fo.transport,
                           request_id=fo.request_id, client_version=fo.client_version,
                           started_at=us_to_datetime(fo.ts_us), host=fo.host, path=fo.path,
                           auth_hash=fo.auth_hash, meta={**fo.meta, **schema_stamp(self.decoder.schema)})

    def _bind(self, fl: Flow, sid: str) -> None:
        """Attach a flow to its session (creating or completing the session row)."""
        fl.session_id = sid
        fo = fl.open
        info = self.sink.get_session(sid)
        if info is None:
            info = self.sink.open_session(self.session_info(fl, sid))
        else:
            # Appends may have created the row first: the stream flow fills in the rest.
            info.transport = fo.transport
            info.host, info.path = fo.host, fo.path
            info.request_id = info.request_id or fo.request_id
            info.client_version = info.client_version or fo.client_version
            info.auth_hash = info.auth_hash or fo.auth_hash
            info.meta = {**info.meta, **fo.meta}
            info.status = "open"
            start = us_to_datetime(fo.ts_us)
            if info.started_at is None or start < info.started_at:
                info.started_at = start
            self.sink.touch(sid)
        for ts_us, direction, f in fl.pending:
            self.emit(sid, ts_us, direction, fo.transport, fo.key, f)
        fl.pending.clear()

    def _chunk(self, key: str, direction: str, ts_us: int, chunk: bytes) -> None:
        fl = self.flows.get(key)
        if fl is None:
            return
        if direction == "server" and fl.error_body is not None:
            fl.error_body += chunk
            return
        dec = fl.decoders.get(direction)
        if dec is None:
            return
        for f in dec.feed(chunk):
            self._frame(fl, ts_us, direction, f)

    def _frame(self, fl: Flow, ts_us: int, direction: str, f: Frame) -> None:
        fo = fl.open
        if direction == "server":
            fl.note_end(f)
        if fl.session_id is None:
            if direction == "client" and f.request_id and fo.transport in ("runsse", "runpoll"):
                self._bind(fl, f.request_id)
            else:
                fl.pending.append((ts_us, direction, f))
                if direction == "server" or len(fl.pending) > 4:
                    self._bind(fl, fo.request_id or self.new_session_id(fo.key))
                    self._settle(fo.key)
                return
        if fl.secret:
            self._scrub(f)
        self.emit(fl.session_id, ts_us, direction, fo.transport, fo.key, f)  # type: ignore[arg-type]
        if direction == "client":
            self._settle(fo.key)

    def _settle(self, key: str) -> None:
        """A RunSSE/RunPoll stream showed its first frame or ended: appends behind it go on."""
        fl = self.flows.get(key)
        self.appends.stream_settled(key, fl.session_id if fl is not None else None)

    @staticmethod
    def _scrub(f: Frame) -> None:
        if f.payload and not kinds.is_end_stream(f.kind):
            f.payload = marker(f.payload).encode()
            f.raw = None
            f.summary = f"{f.kind}: credential payload redacted"

    def _eof(self, key: str, direction: str, ts_us: int) -> None:
        fl = self.flows.get(key)
        if fl is not None:
            self._eof_flow(fl, direction, ts_us)

    def _response(self, key: str, ts_us: int, status: int, headers: list[tuple[str, str]],
                  http_version: str, alpn: str | None) -> None:
        fl = self.flows.get(key)
        if fl is None:
            return
        fl.http_status = status
        fl.response_headers = list(headers)
        meta = {"response_headers": headers, "response_http_version": http_version}
        if alpn:
            meta["server_alpn"] = alpn
        if fl.open.transport != "bidi_append":
            fl.open.meta.update(meta)
            if fl.session_id is not None:
                info = self.sink.get_session(fl.session_id)
                if info is not None:
                    info.http_status = status
                    info.meta.update(meta)
                    self.sink.touch(fl.session_id)
        if not http_ok(status) and fl.open.streaming and not is_openai_transport(fl.open.transport):
            fl.error_body = bytearray()  # (an OpenAI error body is JSON its decoder reads: openai.error)

    def _body(self, key: str, direction: str, ts_us: int, body: bytes, codings: tuple[str, ...] = ()) -> None:
        """A whole buffered body: a unary call, a BidiAppend, or a unary response."""
        fl = self.flows.get(key)
        if fl is None:
            return
        fo = fl.open
        if codings and body and not (fl.secret and direction == "client"):
            msg_type = fo.request_type if direction == "client" else fo.response_type
            done = undo_body(body, codings, session_key=key, side=direction, unary=fo.transport == "unary",
                             msg_type=msg_type, ident=f"flow {key}")
            if done.kept is not None:  # past a budget: one frame stands for the body
                if fo.transport == "bidi_append" and direction == "server":
                    fl.append_response = b""
                    return
                self.emit_flow(fl, ts_us, direction, done.kept)
                return
            body = done.plain
            if done.problem is not None:
                log.warning("flow %s: %s body %s", key, direction, done.problem)
        if fo.transport == "bidi_append":
            if direction == "server":
                fl.append_response = body  # judged with the status when the exchange ends
                return
            # Recorded where it arrived (its place among the run's frames); the answer's facts are
            # filled into its meta when the exchange ends (``append_exchange.finish_append``).
            request_meta = append_exchange_meta(None, fo.meta.get("request_headers"), fo.content_type)
            for f in self.decoder.decode_body(body, "bidi_append", "client"):
                f.meta = dict(request_meta)
                fl.append_frames.append(f)
                self._append(fl, f, [(ts_us, "client", "bidi_append", fo.key, f)])
            return
        if direction == "server":
            if fl.http_status is not None and not http_ok(fl.http_status):
                self._http_error_frame(fl, ts_us, body)
                return
            frames = self.decoder.decode_body(body, "unary", "server", fo.response_type)
            for f in frames:
                fl.note_end(f)
                self.emit_flow(fl, ts_us, direction, self._typed(f, fo.response_type))
            return
        for f in self.decoder.decode_body(body, "unary", "client", fo.request_type):
            self.emit_flow(fl, ts_us, direction, self._typed(f, fo.request_type))

    def _typed(self, f: Frame, msg_type: str | None) -> Frame:
        if msg_type and f.kind == "unary" and not self.decoder.schema.has(msg_type):
            f.msg_type = None  # a guessed name the schema does not know: do not claim it
        return f

    def emit_flow(self, fl: Flow, ts_us: int, direction: str, f: Frame) -> None:
        if fl.secret:
            self._scrub(f)
        if fl.session_id is None:
            self._bind(fl, fl.open.request_id or self.new_session_id(fl.open.key))
        self.emit(fl.session_id, ts_us, direction, fl.open.transport, fl.open.key, f)  # type: ignore[arg-type]

    def _append(self, fl: Flow, f: Frame, items: list[Held]) -> None:
        fo = fl.open
        rid = f.request_id or fo.request_id or self.new_session_id(fo.key)
        f.request_id = rid
        fl.session_id = rid
        fl.append_seqno = f.append_seqno
        if self.sink.get_session(rid) is None:
            info = SessionInfo(session_id=rid, source="capture", transport=None, request_id=rid,
                               client_version=fo.client_version, started_at=us_to_datetime(fo.ts_us),
                               host=fo.host, auth_hash=fo.auth_hash, meta=schema_stamp(self.decoder.schema))
            self.sink.open_session(info)
        self.appends.append(rid, f.append_seqno, items)

    def _http_error_frame(self, fl: Flow, ts_us: int, body: bytes) -> None:
        status = fl.http_status
        f = http_error_frame(status, body)
        fl.http_error = f.summary
        self.emit_flow(fl, ts_us, "server", f)
        info = self.sink.get_session(fl.session_id) if fl.session_id else None
        if info is not None:
            info.error = f.summary
            info.http_status = status
            self.sink.touch(info.session_id)

    def _done(self, key: str, ts_us: int, error: str | None, trailers: dict[str, str],
              reset: dict[str, Any] | None = None) -> None:
        """The response finished (or the flow failed); for a bidi Run the request side may go on.

        ``reset`` says which side failed and how (``stream_end.reset_info``); it is kept in the
        session's ``meta.reset``.
        """
        fl = self.flows.get(key)
        if fl is None:
            return
        if fl.done:
            # The response had already finished; this is the request side closing (or failing).
            self._eof_flow(fl, "client", ts_us)
            self.flows.pop(key, None)
            return
        fl.done = True
        self._settle(key)  # a stream that answered without a body: nothing more to wait for
        self._eof_flow(fl, "server", ts_us)
        if error is not None or "client" in fl.eof or not fl.open.streaming:
            self._eof_flow(fl, "client", ts_us)
            self.flows.pop(key, None)
        # else: a bidi Run whose response ended first: the client may still write (the flow is
        # dropped at its EOF), and its frames still belong to this session.
        self.live_run_ids.pop(key, None)
        fo = fl.open
        if fo.transport == "bidi_append":
            finish_append(self, fl, ts_us, error, trailers)
            return
        if fl.session_id is None:
            self._bind(fl, fo.request_id or self.new_session_id(fo.key))
        sid = fl.session_id
        assert sid is not None
        info = self.sink.get_session(sid)
        if info is None:
            return
        if trailers:
            info.meta["trailers"] = trailers
        if reset is not None:
            info.meta["reset"] = reset
        if fl.http_status is not None:
            info.http_status = fl.http_status
        info.status, info.error = session_status(fl.ending(grpc_fields(fl.response_headers, trailers), error, reset))
        refused = self.refused.pop(sid, None)
        if refused is not None:
            info.status, info.error = with_append(info.status, info.error, *refused)
        end = us_to_datetime(ts_us)
        if info.ended_at is None or end > info.ended_at:
            info.ended_at = end
        self.sink.touch(sid)
        if fo.transport in ("runsse", "runpoll"):
            self.appends.ended(sid)

    def _late(self, key: str, ts_us: int, reset: dict[str, Any]) -> None:
        """A side failed (reset, connection lost) after the response had ended.

        The session keeps the status its response earned (a server may answer END_STREAM and
        then RST_STREAM(NO_ERROR) to stop a request body; a client may reset its request stream
        once it has the whole answer); the failure is kept in ``meta.reset``, and the request side
        is over.
        """
        fl = self.flows.get(key)
        if fl is None:
            return
        if not fl.done:
            self._done(key, ts_us, None, {}, reset)
        elif fl.session_id is not None:
            info = self.sink.get_session(fl.session_id)
            if info is not None:
                info.meta["reset"] = reset
                self.sink.touch(fl.session_id)
        self._eof_flow(fl, "client", ts_us)
        self.flows.pop(key, None)

    def _eof_flow(self, fl: Flow, direction: str, ts_us: int) -> None:
        """End of one direction's body (idempotent: the stream callable sees b"" more than once)."""
        if direction in fl.eof:
            return
        fl.eof.add(direction)
        dec = fl.decoders.get(direction)
        if dec is not None:
            for f in dec.close():
                self._frame(fl, ts_us, direction, f)
        if direction == "client":
            self._settle(fl.open.key)
        if direction == "server" and fl.error_body is not None:
            self._http_error_frame(fl, ts_us, bytes(fl.error_body))
            fl.error_body = None
        if direction == "client" and fl.done:
            self.flows.pop(fl.open.key, None)

    def _finish_all(self) -> None:
        """Shutdown with flows still open: keep what arrived, mark them incomplete."""
        now = time.time_ns() // 1000
        for key in list(self.flows):
            fl = self.flows[key]
            if not fl.done:
                self._eof_flow(fl, "server", now)
                self._done(key, now, None, {})
            self._eof_flow(fl, "client", now)

    # frames ------------------------------------------------------------------------------------

    def emit(self, sid: str, ts_us: int, direction: str, transport: str, stream: str | None, f: Frame) -> None:
        f = redact_frame(f, content=self.config.content, decoder=self.decoder)
        if direction == "client" and f.kind in OPENING_KINDS:
            self._learn_run(sid, f)
        elif direction == "client" and f.kind == kinds.OPENAI_REQUEST and (info := self.sink.get_session(sid)):
            fill_openai_session(info, f.payload)
            self.sink.touch(sid)
        seq = self.sink.emit(sid, ts_us, direction, transport, stream, f)
        if transport == "bidi_append" and direction == "client" and stream is not None:
            fl = self.flows.get(stream)
            if fl is not None and any(x is f for x in fl.append_frames):
                fl.append_emitted[id(f)] = (sid, seq)  # its exchange is still open

    def _learn_run(self, sid: str, f: Frame) -> None:
        info = self.sink.get_session(sid)
        if info is None:
            return
        fill_label(info, kind=f.kind, payload=f.payload)  # the frame is already redacted
        facts = run_request_facts(f.kind, f.payload, self.decoder.info(CLIENT_MSG).cls)
        if facts is not None:
            fill_session(info, facts)
        self.sink.touch(sid)

