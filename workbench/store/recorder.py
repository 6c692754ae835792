"""Turn classified frames from many sessions into batched store writes.

The recorder owns sequence numbers (``seq`` counts a session's frames in wire order, both
directions together) and session bookkeeping (frame_count, time bounds). It is not thread-safe:
one writer thread, or one importing process, drives it.

With ``background=True`` the DuckDB inserts run on a worker thread. It buys a caller that must not
wait for a write (``flush()`` returns at once), not throughput: DuckDB's Python client takes the GIL
back between the tasks of an insert, so an insert runs several times slower while another Python
thread is busy, and ``benchmarks/ingest.py`` measures no gain over writing in line (nothing in the
product uses it). ``flush()`` then hands the batch over and returns;
``wait()`` blocks until everything handed over is stored, and re-raises a write error, as does
the next ``flush()``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from workbench.decode.classify import Frame
from workbench.decode.frame import BIDI_APPEND, BIDI_POLL_RESP, CLIENT_MSG, SERVER_MSG
from workbench.redact import SECRET_MESSAGE_TYPES
from workbench.store.db import FrameBatch, SessionInfo, Store, json_text, us_to_datetime
from workbench.store.gate import gate_frame, gate_meta


class _Worker:
    """One thread applying store writes in submission order (bounded, so memory stays bounded)."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[Callable[..., Any], tuple[Any, ...]] | None] = queue.Queue(maxsize=2)
        self.error: BaseException | None = None
        self.unwritten: list[Any] = []  # frame tables not stored because of an error
        self._thread = threading.Thread(target=self._run, name="workbench-recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                fn, args = item
                if self.error is None:
                    fn(*args)
                elif fn.__name__ == "commit_batch":  # after a failure, keep later frames, do not reorder
                    self.unwritten.append(args[0])
            except BaseException as exc:
                self.error = exc
                if item is not None and item[0].__name__ == "commit_batch":
                    self.unwritten.append(item[1][0])
            finally:
                self._q.task_done()

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        self._q.put((fn, args))

    def wait(self) -> None:
        self._q.join()

    def stop(self) -> None:
        self._q.put(None)
        self._thread.join()


class Recorder:
    def __init__(self, store: Store, *, background: bool = False) -> None:
        self.store = store
        self.batch = FrameBatch()
        self.sessions: dict[str, SessionInfo] = {}
        self._next: dict[str, int] = {}
        self._dirty: set[str] = set()
        self._bounds: dict[str, list[int]] = {}
        self.frames_written = 0
        # (meta JSON, session, seq) of frames already flushed whose meta changed since
        self._meta_updates: list[tuple[str | None, str, int]] = []
        self._worker = _Worker() if background else None
        # Background mode: Arrow tables of frames a failed write did not store (for a spool).
        self.unwritten: list[Any] = []

    def open_session(self, info: SessionInfo) -> SessionInfo:
        """Register a session (or pick up an existing one so its frames continue its seq)."""
        known = self.sessions.get(info.session_id)
        if known is not None:
            return known
        stored = self.store.session(info.session_id)
        if stored is not None:
            stored.session_id = info.session_id  # as the caller names it (stored: wire text escaped)
            info = stored
            self._next[info.session_id] = self.store.next_seq(info.session_id)
        else:
            self._next[info.session_id] = 0
        self.sessions[info.session_id] = info
        self._dirty.add(info.session_id)
        return info

    def put_session(self, info: SessionInfo) -> None:
        """Register ``info`` as the session's row as given (an import that numbers its frames from
        0 and replaces what was stored, in the same transaction), written at the next flush."""
        self.sessions[info.session_id] = info
        self._next[info.session_id] = 0
        self._dirty.add(info.session_id)

    def touch(self, session_id: str) -> None:
        """Mark a session's metadata as changed so the next flush writes it."""
        self._dirty.add(session_id)

    def add(self, session_id: str, ts_us: int, direction: str, transport: str, stream: str | None,
            frame: Frame, decoded: str | None = None, source_key: str | None = None, *,
            seq: int | None = None) -> int:
        """Add one frame (through the write gate); ``seq``: its place when the caller numbered it
        (a spool merge), else the session's next."""
        info = self.sessions.get(session_id)
        if info is None:
            info = self.open_session(SessionInfo(session_id))
        nxt = self._next[session_id]
        if seq is None:
            seq = nxt
            self._next[session_id] = nxt + 1
        elif seq >= nxt:
            self._next[session_id] = seq + 1
        self.batch.add(session_id, seq, ts_us, direction, transport, stream, frame, decoded, source_key)
        if seq >= info.frame_count:
            info.frame_count = seq + 1
        # Time bounds are kept as integers here and turned into datetimes once per flush: the
        # conversion costs more than the rest of this method. A session with bounds pending has
        # changed: it is marked for the next flush with its first frame, not with every frame.
        bounds = self._bounds.get(session_id)
        if bounds is None:
            self._bounds[session_id] = [ts_us, ts_us]
            self._dirty.add(session_id)
        elif ts_us > bounds[1]:
            bounds[1] = ts_us
        elif ts_us < bounds[0]:
            bounds[0] = ts_us
        return seq

    def patch_meta(self, session_id: str, seq: int, meta: dict[str, Any] | None) -> None:
        """Replace the ``meta`` of a frame already added (a BidiAppend whose answer came later):
        in the pending batch when it is still there, else with the next flush's transaction.
        Through the write gate like a frame's own meta (credential headers redacted, wire text
        escaped): this write bypasses ``FrameBatch.add``."""
        meta = gate_meta(meta)
        text = json_text(meta) if meta else None
        batch = self.batch
        for i in range(len(batch.seq) - 1, -1, -1):
            if batch.seq[i] == seq and batch.session_id[i] == session_id:
                batch.meta[i] = text
                return
        self._meta_updates.append((text, session_id, seq))

    def _apply_bounds(self) -> None:
        for sid, (lo, hi) in self._bounds.items():
            info = self.sessions[sid]
            start, end = us_to_datetime(lo), us_to_datetime(hi)
            if info.started_at is None or start < info.started_at:
                info.started_at = start
            if info.ended_at is None or end > info.ended_at:
                info.ended_at = end
        self._bounds.clear()

    def flush(self) -> int:
        """Write pending frames and changed sessions; returns the number of frames written.

        In background mode: hands them to the writer thread (blocking while two earlier flushes are
        still being written) and returns the number handed over.
        """
        worker = self._worker
        if worker is not None:
            self._raise_pending()
        if not len(self.batch) and not self._dirty and not self._meta_updates:
            return 0
        if self._bounds:
            self._apply_bounds()
        infos = [self.sessions[s] for s in sorted(self._dirty)]
        updates = self._meta_updates
        # frames, their sessions and meta updates: one transaction (``Store.commit_batch``)
        if worker is None:
            n = self.store.commit_batch(self.batch if len(self.batch) else None, infos, updates)
        else:
            table = self.batch.to_arrow() if len(self.batch) else None
            n = table.num_rows if table is not None else 0
            # snapshots: the caller keeps changing the live objects
            worker.submit(self.store.commit_batch, table,
                          [dataclasses.replace(i, meta=copy.deepcopy(i.meta)) for i in infos], updates)
        self.batch.clear()
        self._meta_updates = []
        self._dirty.clear()
        self.frames_written += n
        return n

    def wait(self) -> None:
        """Block until every flushed write is stored (background mode); re-raise a write error."""
        if self._worker is not None:
            self._worker.wait()
            self._raise_pending()

    def close(self) -> None:
        """Flush, wait, and stop the writer thread (background mode); a plain flush otherwise."""
        try:
            self.flush()
            self.wait()
        finally:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def _raise_pending(self) -> None:
        worker = self._worker
        if worker is not None and worker.error is not None:
            worker.wait()
            exc = worker.error
            self.unwritten += worker.unwritten
            worker.stop()
            self._worker = _Worker()
            raise exc


_GATED_TYPES = (CLIENT_MSG, SERVER_MSG, BIDI_APPEND, BIDI_POLL_RESP, *sorted(SECRET_MESSAGE_TYPES))


def gate_stored(store: Store, session_ids: Sequence[str], chunk: int = 2000) -> int:
    """Pass rows that reached ``frames``/``sessions`` by SQL (a Parquet import copies a whole
    export in one statement) through the write gate, in the caller's transaction; returns the
    number of rows changed. Only rows that can hold a credential are read, a chunk at a time."""
    if not session_ids:
        return 0
    changed = 0
    con = store.con  # not a cursor: the rows are not committed yet, only this connection sees them
    updates: list[tuple[Any, ...]] = []
    with store.lock:
        res = con.execute(
            "SELECT rowid, kind, summary, payload, raw, flags, msg_type, error, meta, append_seqno FROM frames "
            "WHERE session_id IN (SELECT unnest(?)) AND (kind = 'compressed' OR msg_type IN (SELECT unnest(?)) "
            "OR meta LIKE '%headers%' OR meta LIKE '%trailers%')",
            [list(session_ids), list(_GATED_TYPES)])
        while rows := res.fetchmany(chunk):
            for rid, kind, summary, payload, raw, flags, msg_type, error, meta, seqno in rows:
                m = json.loads(meta) if meta else None
                f = Frame(kind, summary, payload or b"", flags or 0, msg_type, error, raw, append_seqno=seqno, meta=m)
                gate_frame(f)
                if f.payload != (payload or b"") or f.raw != raw or f.error != error or f.meta != m:
                    updates.append((f.payload, f.raw, f.error, json.dumps(f.meta) if f.meta else None, rid))
        metas = con.execute("SELECT session_id, meta FROM sessions WHERE session_id IN (SELECT unnest(?)) "
                            "AND meta IS NOT NULL", [list(session_ids)]).fetchall()
        for sid, meta in metas:
            m = json.loads(meta)
            if isinstance(m, dict) and gate_meta(m) != m:
                con.execute("UPDATE sessions SET meta = ? WHERE session_id = ?", [json.dumps(gate_meta(m)), sid])
                changed += 1
        if updates:
            con.executemany("UPDATE frames SET payload = ?, raw = ?, error = ?, meta = ? WHERE rowid = ?", updates)
    return changed + len(updates)
