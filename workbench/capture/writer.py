"""The capture writer: one thread that turns proxy events into sessions and frames in the store.

The proxy side (``addon.py``) only stamps and enqueues; everything else happens here, off the
proxy's event loop: envelope reassembly, classification, session bookkeeping, BidiAppend joining
and reordering, redaction, and batched commits (at most one commit per flush interval, each a
committed transaction, so live readers see whole batches and ``seq > last`` polling never
duplicates or skips a frame).

When the database cannot be opened or a commit fails, the writer says so loudly and switches to
the spool (``spool.py``) for the rest of the run; nothing is dropped.

BidiAppend ordering: up to 16 appends of one run are in flight at once, so they reach the proxy
out of order. The writer holds appends that arrive ahead of the next expected ``append_seqno`` in
a small per-run window and releases them in seqno order; a gap that does not fill within
``REORDER_WINDOW_S`` (``REORDER_AFTER_END_S`` once the run's stream has ended, or more than
``REORDER_MAX`` held appends) is released as is, so a lost
append shows up as a gap in ``append_seqno`` instead of stalling the capture. Frames keep their
arrival time in ``ts``; ``seq`` follows seqno order.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.capture.spool import FrameRecord, Spool, merge_spools
from workbench.decode.classify import (
    CLIENT_MSG,
    Decoder,
    Frame,
    StreamDecoder,
    default_decoder,
    http_error_frame,
)
from workbench.redact import marker, redact_frame, secret_method
from workbench.store.db import SESSION_FIELDS, FrameBatch, SessionInfo, Store, StoreError, us_to_datetime
from workbench.store.reader import LiveService
from workbench.store.recorder import Recorder

log = logging.getLogger("workbench.capture")

REORDER_WINDOW_S = 10.0
REORDER_AFTER_END_S = 2.0
REORDER_MAX = 64

# Event tags (tuples keep the proxy-side cost to one allocation per chunk).
EV_OPEN = 0       # (EV_OPEN, FlowOpen)
EV_CHUNK = 1      # (EV_CHUNK, key, direction, ts_us, bytes)
EV_EOF = 2        # (EV_EOF, key, direction, ts_us)
EV_RESPONSE = 3   # (EV_RESPONSE, key, ts_us, status, headers, http_version, alpn)
EV_BODY = 4       # (EV_BODY, key, direction, ts_us, bytes)  whole body of a buffered message
EV_DONE = 5       # (EV_DONE, key, ts_us, error or None, trailers dict)
EV_STOP = 6       # (EV_STOP,)


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


@dataclass(slots=True)
class _Flow:
    open: FlowOpen
    session_id: str | None = None
    decoders: dict[str, StreamDecoder] = field(default_factory=dict)
    pending: list[tuple[int, str, Frame]] = field(default_factory=list)
    http_status: int | None = None
    error_body: bytearray | None = None
    saw_end: bool = False
    end_error: str | None = None
    eof: set[str] = field(default_factory=set)
    append_seqno: int | None = None
    done: bool = False
    secret: bool = False  # an RPC whose bodies are credentials: store markers only


@dataclass(slots=True)
class _Reorder:
    next: int = 0
    started: bool = False
    held: dict[int, tuple[float, int, str, str, str | None, Frame]] = field(default_factory=dict)
    oldest: float = 0.0
    ended: float | None = None  # when the run's stream finished


@dataclass
class WriterConfig:
    db_path: str
    flush_interval: float = 0.25
    content: bool = False
    live: bool = True
    stats_path: str | None = None


class CaptureWriter:
    """Owns the store (or the spool) for one capture process."""

    def __init__(self, config: WriterConfig, decoder: Decoder | None = None,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.config = config
        self.decoder = decoder or default_decoder()
        self.queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._on_error = on_error
        self.store: Store | None = None
        self.recorder: Recorder | None = None
        self.live: LiveService | None = None
        self.spool: Spool | None = None
        self.sessions: dict[str, SessionInfo] = {}
        self._spool_seq: dict[str, int] = {}
        self._pending_records: list[FrameRecord] = []
        self._dirty: set[str] = set()
        self.flows: dict[str, _Flow] = {}
        self._reorder: dict[str, _Reorder] = {}
        self._live_run_ids: dict[str, str] = {}
        self.frames_total = 0
        self.frames_committed = 0
        self._thread = threading.Thread(target=self._run, name="workbench-capture-writer", daemon=True)
        self._stopped = threading.Event()
        self._wake = threading.Event()

    # lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._open()
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        if self._thread.is_alive():
            self.queue.put((EV_STOP,))
            self._wake.set()
            self._thread.join(timeout)
        self._close()

    def _open(self) -> None:
        path = self.config.db_path
        try:
            self.store = Store(path)
        except (StoreError, OSError) as exc:
            self._fail(f"cannot open capture database {path}: {exc}")
            return
        try:
            merge_spools(self.store, path)
            # A previous capture killed mid-stream left sessions marked open; nobody else can be
            # writing them now that we hold the file.
            self.store.con.execute(
                "UPDATE sessions SET status = 'incomplete', "
                "error = coalesce(error, 'capture ended before the stream finished') "
                "WHERE status = 'open' AND source = 'capture'")
        except Exception as exc:  # a broken spool must not stop the capture
            self._loud(f"could not merge the spool into {path}: {exc}")
        self.recorder = Recorder(self.store)
        self._warm_up()
        if self.config.live:
            try:
                self.live = LiveService(self.store.con, path)
                self.live.start()
            except OSError as exc:
                self._loud(f"live read service not started ({exc}); readers must wait for the capture to end")
                self.live = None

    def _warm_up(self) -> None:
        """Pay the first insert's one-time cost (~0.3 s of lazy Arrow/DuckDB set-up) before traffic.

        Otherwise the first commit of a capture lags by that much, and a crash right then loses
        frames that were older than one flush interval.
        """
        assert self.store is not None
        con = self.store.con
        try:
            batch = FrameBatch()
            batch.add("warm-up", 0, time.time_ns() // 1000, "server", "run", None, Frame("empty", "", b""))
            con.register("_wb_warm", batch.to_arrow())
            try:
                con.execute("INSERT INTO frames SELECT * FROM _wb_warm WHERE false")
            finally:
                con.unregister("_wb_warm")
            cols = ", ".join(SESSION_FIELDS)
            con.execute("BEGIN")
            try:
                con.execute(f"INSERT OR REPLACE INTO sessions ({cols}) VALUES ({', '.join('?' for _ in SESSION_FIELDS)})",
                            SessionInfo("warm-up").row())
            finally:
                con.execute("ROLLBACK")
        except Exception as exc:  # only an optimisation
            log.debug("warm-up failed: %s", exc)

    def _close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.store is not None:
            try:
                self.store.checkpoint()
            except Exception:
                pass
            self.store.close()
            self.store = None
        if self.spool is not None:
            self.spool.close()
        self._write_stats()

    def _loud(self, msg: str) -> None:
        # mitmdump exits when an error is logged during its start-up, and a capture that cannot
        # write its database must keep proxying (and spool): warn then, error afterwards.
        (log.error if self._thread.is_alive() else log.warning)(msg)
        print(f"workbench capture: ERROR: {msg}", file=sys.stderr, flush=True)
        if self._on_error is not None:
            self._on_error(msg)

    def _fail(self, msg: str) -> None:
        """Switch to the spool: the database is unusable for the rest of this run."""
        if self.spool is None:
            try:
                self.spool = Spool(self.config.db_path)
            except OSError as exc:
                self._loud(f"{msg}; and {exc}: frames are kept in memory only")
                return
        self._loud(f"{msg}; frames go to the spool {self.spool.path} and are merged on the next start")
        if self.recorder is not None:
            self.sessions.update(self.recorder.sessions)
            self._spool_seq.update({s: i.frame_count for s, i in self.recorder.sessions.items()})
            self._dirty.update(self.recorder.sessions)
            self.recorder = None
        if self.live is not None:
            self.live.stop()
            self.live = None
        if self.store is not None:
            try:
                self.store.close()
            except Exception:
                pass
            self.store = None

    # the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        # The thread sleeps between ticks and drains the queue in one go: waking per chunk would
        # make it contend for the GIL with the proxy's event loop on every frame, which is what
        # adds latency to a ping-pong exchange. Each tick starts early by what the previous one
        # cost, so a frame is committed about one flush interval after it passed the proxy.
        interval = self.config.flush_interval
        get = self.queue.get_nowait
        handle = self._handle
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
            while True:
                n += 1
                if not n & 255 and time.monotonic() > drain_until and not stop:
                    break
                try:
                    ev = get()
                except queue.Empty:
                    break
                if ev[0] == EV_STOP:
                    stop = True
                    continue
                try:
                    handle(ev)
                except Exception as exc:  # keep recording whatever one bad event did
                    log.exception("capture writer: event failed")
                    self._loud(f"internal error on a capture event: {exc!r}")
            self._release_reorder(time.monotonic(), force=stop)
            if stop:
                self._finish_all()
            self.flush()
            cost = time.monotonic() - tick
            next_tick = tick + max(interval / 2, interval - cost)
        self._stopped.set()

    # events ------------------------------------------------------------------------------------

    def _handle(self, ev: tuple[Any, ...]) -> None:
        tag = ev[0]
        if tag == EV_CHUNK:
            self._chunk(ev[1], ev[2], ev[3], ev[4])
        elif tag == EV_OPEN:
            self._open_flow(ev[1])
        elif tag == EV_EOF:
            self._eof(ev[1], ev[2], ev[3])
        elif tag == EV_RESPONSE:
            self._response(*ev[1:])
        elif tag == EV_BODY:
            self._body(ev[1], ev[2], ev[3], ev[4])
        elif tag == EV_DONE:
            self._done(ev[1], ev[2], ev[3], ev[4])

    def _open_flow(self, fo: FlowOpen) -> None:
        fl = _Flow(fo, secret=fo.transport == "unary" and secret_method(fo.path))
        self.flows[fo.key] = fl
        if fo.streaming:
            fl.decoders = {"client": self.decoder.stream(fo.transport, "client"),
                           "server": self.decoder.stream(fo.transport, "server")}
        if fo.transport == "run":
            sid = fo.request_id or str(uuid.uuid4())
            if sid in self._live_run_ids.values():
                sid = f"{sid}#{fo.key[:8]}"  # two live Run streams reusing one request id
            self._live_run_ids[fo.key] = sid
            self._bind(fl, sid)
        elif fo.transport == "unary":
            self._bind(fl, str(uuid.uuid4()))
        # runsse / runpoll wait for the BidiRequestId in the body; bidi_append joins by body.

    def _session_info(self, fl: _Flow, sid: str) -> SessionInfo:
        fo = fl.open
        return SessionInfo(session_id=sid, source="capture", transport=fo.transport,
                           request_id=fo.request_id, client_version=fo.client_version,
                           started_at=us_to_datetime(fo.ts_us), host=fo.host, path=fo.path,
                           auth_hash=fo.auth_hash, meta=dict(fo.meta))

    def _bind(self, fl: _Flow, sid: str) -> None:
        """Attach a flow to its session (creating or completing the session row)."""
        fl.session_id = sid
        fo = fl.open
        info = self._get_session(sid)
        if info is None:
            info = self._open_session(self._session_info(fl, sid))
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
            self._touch(sid)
        for ts_us, direction, f in fl.pending:
            self._emit(sid, ts_us, direction, fo.transport, fo.key, f)
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

    def _frame(self, fl: _Flow, ts_us: int, direction: str, f: Frame) -> None:
        fo = fl.open
        if direction == "server" and f.kind.startswith("end_stream"):
            fl.saw_end = True
            if f.kind == "end_stream.error":
                fl.end_error = f.summary
        if fl.session_id is None:
            if direction == "client" and f.request_id and fo.transport in ("runsse", "runpoll"):
                self._bind(fl, f.request_id)
            else:
                fl.pending.append((ts_us, direction, f))
                if direction == "server" or len(fl.pending) > 4:
                    self._bind(fl, fo.request_id or str(uuid.uuid4()))
                return
        if fl.secret:
            self._scrub(f)
        self._emit(fl.session_id, ts_us, direction, fo.transport, fo.key, f)  # type: ignore[arg-type]

    @staticmethod
    def _scrub(f: Frame) -> None:
        if f.payload and not f.kind.startswith("end_stream"):
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
        meta = {"response_headers": headers, "response_http_version": http_version}
        if alpn:
            meta["server_alpn"] = alpn
        if fl.open.transport != "bidi_append":
            fl.open.meta.update(meta)
            if fl.session_id is not None:
                info = self._get_session(fl.session_id)
                if info is not None:
                    info.http_status = status
                    info.meta.update(meta)
                    self._touch(fl.session_id)
        if status != 200 and fl.open.streaming:
            fl.error_body = bytearray()

    def _body(self, key: str, direction: str, ts_us: int, body: bytes) -> None:
        """A whole buffered body: a unary call, a BidiAppend, or a unary response."""
        fl = self.flows.get(key)
        if fl is None:
            return
        fo = fl.open
        if direction == "server":
            if fl.http_status not in (None, 200):
                self._http_error_frame(fl, ts_us, body)
                return
            if fo.transport == "bidi_append":
                return  # empty BidiAppendResponse: one per client message, nothing to learn
            frames = self.decoder.decode_body(body, "unary", "server", fo.response_type)
            for f in frames:
                self._emit_flow(fl, ts_us, direction, self._typed(f, fo.response_type))
            return
        if fo.transport == "bidi_append":
            for f in self.decoder.decode_body(body, "bidi_append", "client"):
                self._append(fl, ts_us, f)
            return
        for f in self.decoder.decode_body(body, "unary", "client", fo.request_type):
            self._emit_flow(fl, ts_us, direction, self._typed(f, fo.request_type))

    def _typed(self, f: Frame, msg_type: str | None) -> Frame:
        if msg_type and f.kind == "unary" and not self.decoder.schema.has(msg_type):
            f.msg_type = None  # a guessed name the schema does not know: do not claim it
        return f

    def _emit_flow(self, fl: _Flow, ts_us: int, direction: str, f: Frame) -> None:
        if fl.secret:
            self._scrub(f)
        if fl.session_id is None:
            self._bind(fl, fl.open.request_id or str(uuid.uuid4()))
        self._emit(fl.session_id, ts_us, direction, fl.open.transport, fl.open.key, f)  # type: ignore[arg-type]

    def _append(self, fl: _Flow, ts_us: int, f: Frame) -> None:
        fo = fl.open
        rid = f.request_id or fo.request_id or str(uuid.uuid4())
        f.request_id = rid
        fl.session_id = rid
        fl.append_seqno = f.append_seqno
        if self._get_session(rid) is None:
            info = SessionInfo(session_id=rid, source="capture", transport=None, request_id=rid,
                               client_version=fo.client_version, started_at=us_to_datetime(fo.ts_us),
                               host=fo.host, auth_hash=fo.auth_hash)
            self._open_session(info)
        ro = self._reorder.get(rid)
        if ro is None:
            ro = self._reorder[rid] = _Reorder()
        seqno = f.append_seqno if f.append_seqno is not None else 0
        if not ro.started and seqno == 0:
            ro.started = True
        if seqno < ro.next or (seqno == ro.next):
            self._emit(rid, ts_us, "client", "bidi_append", fo.key, f)
            if seqno == ro.next:
                ro.next += 1
                ro.started = True
                self._drain(rid, ro)
            return
        if not ro.held:
            ro.oldest = time.monotonic()
        ro.held[seqno] = (time.monotonic(), ts_us, "client", "bidi_append", fo.key, f)
        if len(ro.held) > REORDER_MAX:
            self._release(rid, ro)

    def _drain(self, rid: str, ro: _Reorder) -> None:
        while ro.next in ro.held:
            _, ts_us, direction, transport, stream, f = ro.held.pop(ro.next)
            self._emit(rid, ts_us, direction, transport, stream, f)
            ro.next += 1
        if ro.held:
            ro.oldest = min(v[0] for v in ro.held.values())

    def _release(self, rid: str, ro: _Reorder) -> None:
        """Give up waiting for a gap: emit what is held, in seqno order."""
        for seqno in sorted(ro.held):
            _, ts_us, direction, transport, stream, f = ro.held.pop(seqno)
            self._emit(rid, ts_us, direction, transport, stream, f)
            ro.next = seqno + 1

    def _release_reorder(self, now: float, force: bool = False) -> None:
        for rid in [r for r, ro in self._reorder.items() if not ro.held and ro.ended and now - ro.ended > 60]:
            del self._reorder[rid]  # a finished run: forget its counter
        for rid, ro in self._reorder.items():
            if not ro.held:
                continue
            if (force or now - ro.oldest >= REORDER_WINDOW_S
                    or (ro.ended is not None and now - ro.ended >= REORDER_AFTER_END_S)):
                self._release(rid, ro)

    def _http_error_frame(self, fl: _Flow, ts_us: int, body: bytes) -> None:
        status = fl.http_status
        f = http_error_frame(status, body)
        text = f.summary
        if fl.open.transport == "bidi_append":
            f.request_id = fl.session_id
            f.append_seqno = fl.append_seqno
        self._emit_flow(fl, ts_us, "server", f)
        if fl.open.transport != "bidi_append":
            info = self._get_session(fl.session_id) if fl.session_id else None
            if info is not None:
                info.error = text
                info.http_status = status
                self._touch(info.session_id)

    def _done(self, key: str, ts_us: int, error: str | None, trailers: dict[str, str]) -> None:
        fl = self.flows.get(key)
        if fl is None:
            return
        if fl.done:
            # The response had already finished; this is the request side closing (or failing).
            self._eof_flow(fl, "client", ts_us)
            self.flows.pop(key, None)
            return
        fl.done = True
        self._eof_flow(fl, "server", ts_us)
        if error is not None or "client" in fl.eof or not fl.open.streaming:
            self._eof_flow(fl, "client", ts_us)
            self.flows.pop(key, None)
        # else: a bidi Run whose response ended first: the client may still write (the flow is
        # dropped at its EOF), and its frames still belong to this session.
        self._live_run_ids.pop(key, None)
        fo = fl.open
        if fo.transport == "bidi_append":
            return
        if fl.session_id is None:
            self._bind(fl, fo.request_id or str(uuid.uuid4()))
        sid = fl.session_id
        assert sid is not None
        info = self._get_session(sid)
        if info is None:
            return
        grpc_status = trailers.get("grpc-status")
        if trailers:
            info.meta["trailers"] = trailers
        if fl.http_status is not None:
            info.http_status = fl.http_status
        if error is not None:
            info.status = "aborted"
            info.error = error
        elif fl.http_status is not None and fl.http_status >= 400:
            info.status = "error"
        elif fl.end_error is not None:
            info.status = "error"
            info.error = fl.end_error
        elif grpc_status not in (None, "0"):
            info.status = "error"
            info.error = f"grpc-status {grpc_status} {trailers.get('grpc-message', '')}".rstrip()
        elif fo.streaming and fo.transport in ("run", "runsse", "runpoll") and not (fl.saw_end or grpc_status == "0"):
            info.status = "incomplete"
            info.error = info.error or "stream ended without an end-stream frame"
        else:
            info.status = "complete"
        end = us_to_datetime(ts_us)
        if info.ended_at is None or end > info.ended_at:
            info.ended_at = end
        self._touch(sid)
        ro = self._reorder.get(sid)
        if ro is not None and fo.transport in ("runsse", "runpoll"):
            # Appends still in flight when the stream ends (closing messages) may yet fill a gap:
            # wait a little longer, not the whole window.
            ro.ended = time.monotonic()

    def _eof_flow(self, fl: _Flow, direction: str, ts_us: int) -> None:
        """End of one direction's body (idempotent: the stream callable sees b"" more than once)."""
        if direction in fl.eof:
            return
        fl.eof.add(direction)
        dec = fl.decoders.get(direction)
        if dec is not None:
            for f in dec.close():
                self._frame(fl, ts_us, direction, f)
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

    # sessions and frames -------------------------------------------------------------------------

    def _get_session(self, sid: str) -> SessionInfo | None:
        if self.recorder is not None:
            return self.recorder.sessions.get(sid)
        return self.sessions.get(sid)

    def _open_session(self, info: SessionInfo) -> SessionInfo:
        if self.recorder is not None:
            try:
                return self.recorder.open_session(info)
            except Exception as exc:
                self._fail(f"cannot read session {info.session_id} from {self.config.db_path}: {exc}")
        self.sessions.setdefault(info.session_id, info)
        self._spool_seq.setdefault(info.session_id, 0)
        self._dirty.add(info.session_id)
        return self.sessions[info.session_id]

    def _touch(self, sid: str) -> None:
        if self.recorder is not None:
            self.recorder.touch(sid)
        else:
            self._dirty.add(sid)

    def _emit(self, sid: str, ts_us: int, direction: str, transport: str, stream: str | None, f: Frame) -> None:
        f = redact_frame(f, content=self.config.content, decoder=self.decoder)
        if direction == "client" and f.kind in ("run_request", "prewarm_request"):
            self._learn_run(sid, f)
        if self.recorder is not None:
            self.recorder.add(sid, ts_us, direction, transport, stream, f)
        else:
            info = self.sessions.get(sid) or self._open_session(SessionInfo(sid))
            n = self._spool_seq.get(sid, 0)
            self._spool_seq[sid] = n + 1
            info.frame_count = n + 1
            when = us_to_datetime(ts_us)
            info.started_at = min(info.started_at or when, when)
            info.ended_at = max(info.ended_at or when, when)
            self._dirty.add(sid)
        self._pending_records.append((sid, ts_us, direction, transport, stream, f))
        self.frames_total += 1

    def _learn_run(self, sid: str, f: Frame) -> None:
        info = self._get_session(sid)
        if info is None:
            return
        try:
            msg: Any = self.decoder.info(CLIENT_MSG).cls.FromString(f.payload)
            run = getattr(msg, f.kind)
        except Exception:
            return
        model = None
        if run.HasField("requested_model") and run.requested_model.model_id:
            model = run.requested_model.model_id
        elif run.HasField("model_details") and run.model_details.model_id:
            model = run.model_details.model_id
        if model:
            info.model = model
        if run.conversation_id:
            info.conversation_id = run.conversation_id
        self._touch(sid)

    # flushing ------------------------------------------------------------------------------------

    def flush(self) -> None:
        records = self._pending_records
        if self.recorder is not None:
            try:
                self.recorder.flush()
                self.frames_committed += len(records)
                records.clear()
            except Exception as exc:
                self._fail(f"writing {len(records)} frames to {self.config.db_path} failed: {exc}")
        if self.recorder is None and self.spool is not None:
            try:
                self.spool.write([self.sessions[s] for s in sorted(self._dirty) if s in self.sessions], records)
                self._dirty.clear()
                records.clear()
            except OSError as exc:
                self._loud(f"spool write to {self.spool.path} failed: {exc}; retrying at the next flush")
        self._write_stats()

    def stats(self) -> dict[str, Any]:
        sessions = self.recorder.sessions if self.recorder is not None else self.sessions
        return {
            "sessions": len(sessions),
            "open": sum(1 for s in sessions.values() if s.status == "open"),
            "frames": self.frames_total,
            "committed": self.frames_committed,
            "spooled": self.spool.frames if self.spool is not None else 0,
            "spool": str(self.spool.path) if self.spool is not None and self.spool.path else None,
            "db_ok": self.recorder is not None,
        }

    def _write_stats(self) -> None:
        path = self.config.stats_path
        if not path:
            return
        try:
            tmp = path + ".tmp"
            Path(tmp).write_text(json.dumps(self.stats()))
            os.replace(tmp, path)
        except OSError:
            pass

