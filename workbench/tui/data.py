"""What the TUI shows, as plain Python over a capture reader (no Textual here).

Everything in this module may block (SQL, decoding), so the app calls it from worker threads
only. A session's timeline is addressed through a ``FrameIndex`` (``workbench.tui.rows``, re-exported
here): the filtered frames' seq numbers and heartbeat flags as numpy arrays (8 bytes a frame, one
query), from which display rows are computed (heartbeat runs folded, replay cut-off applied). Row
contents are then fetched by seq for the handful of rows on screen, so a million-frame session
never loads a million rows.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from workbench.analysis.findings import session_findings, stored_findings
from workbench.analysis.model import Finding
from workbench.decode import fields_of
from workbench.decode.classify import COMPRESSED, ENVELOPED, WIRE_LENGTH, Decoder, default_decoder
from workbench.decode.frame import StoredFrame, stored_meta
from workbench.nesting import load_json
from workbench.overview import finding_states, top_findings
from workbench.store import queries
from workbench.store import view_reads as reads
from workbench.store.db import StoreError
from workbench.store.live import pid_alive
from workbench.store.queries import Row
from workbench.store.reader import LocalReader, RemoteReader, open_reader
from workbench.store.view_reads import BlobView, ToolCallView
from workbench.tui.rows import HEARTBEAT_KINDS, MIN_FOLD, FrameFilter, FrameIndex, RowRef, blob_needle
from workbench.wire.envelope import FLAG_COMPRESSED
from workbench.wire.envelope import header as envelope_header

# Payload bytes one read of full frame rows may bring (``frames_after``).
PAGE_BYTES = 64 * 1024 * 1024
# notes come last and never count as findings; "info" only in rows an older workbench wrote
SEVERITIES = ("error", "warning", "info", "note")

Reader = LocalReader | RemoteReader

# re-exported: the views and tests import these from here
__all__ = ["HEARTBEAT_KINDS", "MIN_FOLD", "PAGE_BYTES", "SEVERITIES", "FrameDetail", "FrameFilter", "FrameIndex",
           "LiveFindings", "RowRef", "SessionSummary", "TuiData", "blob_needle", "column_array", "pretty_blob",
           "pretty_json", "sha256_check"]


# detail records ----------------------------------------------------------------------------------

@dataclass
class FrameDetail(StoredFrame):
    raw: bytes | None
    error: str | None
    ids: dict[str, int | str | None]   # ref_id, call_id, append_seqno, request_id, stream
    tree: Any
    enveloped: bool
    meta: dict[str, Any] | None = None

    @property
    def wire_length(self) -> int | None:
        """The payload's length on the wire: the compressed length of a gzip frame stored inflated
        (``frames.meta.wire_length``; None when an older recording did not keep it)."""
        if self.meta and isinstance(self.meta.get(WIRE_LENGTH), int):
            return int(self.meta[WIRE_LENGTH])
        if self.flags & FLAG_COMPRESSED and self.kind != COMPRESSED:
            return None  # stored inflated: ``payload`` is not what crossed the wire
        return len(self.payload)

    @property
    def header(self) -> bytes:
        """The 5-byte envelope header this frame travelled under (flags | length on the wire); empty
        when the transport does not envelope it or the wire length is not known."""
        length = self.wire_length
        if not self.enveloped or length is None:
            return b""
        return envelope_header(self.flags, length)

    def as_json(self) -> str:
        out: dict[str, Any] = {"seq": self.seq, "kind": self.kind, "summary": self.summary,
                               "direction": self.direction, "transport": self.transport,
                               "msg_type": self.msg_type, "flags": self.flags, "size": self.size}
        out.update({k: v for k, v in self.ids.items() if v is not None})
        if self.error:
            out["error"] = self.error
        out["fields"] = self.tree
        return json.dumps(out, indent=2, ensure_ascii=False, default=str)


@dataclass
class SessionSummary:
    session_id: str
    source: str
    transport: str
    model: str
    started_us: int | None
    duration_s: float | None
    frame_count: int
    status: str
    findings: dict[str, int] = field(default_factory=dict)
    label: str = ""
    top_finding: Finding | None = None  # the root cause first (workbench.overview)
    # current | stale | not analysed | open (workbench.overview.FindingState)
    analysis: str = "current"

    def findings_text(self) -> str:
        """``1E 2W``, then notes (``1N``); ``-`` for none; ``not analysed`` when no analysis stored."""
        if self.analysis in ("not analysed", "open"):
            return self.analysis
        parts = [f"{self.findings[s]}{s[0].upper()}" for s in SEVERITIES if self.findings.get(s)]
        stale = " (stale)" if self.analysis == "stale" else ""
        return (" ".join(parts) or "-") + stale


# the data source ---------------------------------------------------------------------------------

class TuiData:
    """Queries for the TUI over ``open_reader(path)``.

    With ``transient=True`` (follow mode on a file nobody writes yet) the file is opened per
    query and closed again, so a capture can start writing it meanwhile; once a capture runs,
    ``open_reader`` finds its live service and reads go through it.
    """

    def __init__(self, path: str | Path, decoder: Decoder | None = None, *, transient: bool = False) -> None:
        self.path = str(path)
        self.transient = transient
        self._decoder = decoder
        self._lock = threading.Lock()
        self._query_lock = threading.Lock()
        self._reader: Reader | None = None
        self._last: Reader | None = None  # follow mode: the reader of the last query (``live``)
        if not transient:
            self._reader = open_reader(self.path)

    # plumbing --------------------------------------------------------------------------------

    @property
    def decoder(self) -> Decoder:
        with self._lock:
            if self._decoder is None:
                self._decoder = default_decoder()
            return self._decoder

    @property
    def live(self) -> bool:
        """A capture is writing this database right now: the reader in use (in follow mode, the last
        one opened) is its live service, which ``open_reader`` trusted only after the handshake, and
        that capture is still running. A sidecar alone proves nothing: a stale one may name a live pid."""
        reader = self._reader if self._reader is not None else self._last
        return isinstance(reader, RemoteReader) and (reader.pid is None or pid_alive(reader.pid))

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        # One query at a time: a file reader serialises anyway, and a capture's live service has
        # been seen to hang when several of its request threads open cursors at once.
        with self._query_lock:
            return self._read(lambda r: r.query(sql, params))

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
        with self._query_lock:
            return self._read(lambda r: r.rows(sql, params))

    def _read(self, run: Callable[[LocalReader | RemoteReader], Any]) -> Any:
        if self.transient:
            reader = self._last = open_reader(self.path)
            try:
                return run(reader)
            finally:
                reader.close()
        if self._reader is None:
            self._reader = open_reader(self.path)
        try:
            return run(self._reader)
        except StoreError:
            if not self._reader.live:
                raise
            # the capture we were reading through has stopped: the file is now readable directly
            self._reader = open_reader(self.path)
            return run(self._reader)

    def close(self) -> None:
        # let a worker's query in flight finish first: closing a busy connection raises
        got = self._query_lock.acquire(timeout=10)
        try:
            if self._reader is not None:
                try:
                    self._reader.close()
                except Exception:   # quitting must not fail because a worker still holds the reader
                    pass
                self._reader = None
        finally:
            if got:
                self._query_lock.release()

    # sessions --------------------------------------------------------------------------------

    def sessions(self, only: str | None = None) -> list[SessionSummary]:
        t = reads.session_summaries(self, only)
        rows = reads.finding_heads(self, only).to_pylist()
        counts: dict[str, dict[str, int]] = {}
        for r in rows:
            by_sev = counts.setdefault(r["session_id"], {})
            by_sev[r["severity"]] = by_sev.get(r["severity"], 0) + 1
        top = top_findings(rows)
        sessions = t.to_pylist()
        states = finding_states(self, {r["session_id"]: r["status"] for r in sessions})
        out = []
        for r in sessions:
            dur = r["dur_us"]
            sid = r["session_id"]
            out.append(SessionSummary(sid, r["source"], r["transport"], r["model"],
                                      r["started_us"], None if dur is None else dur / 1e6,
                                      int(r["frame_count"]), r["status"], counts.get(sid, {}),
                                      r["label"], top.get(sid), states[sid].analysis))
        return out

    def session(self, session_id: str) -> SessionSummary | None:
        found = self.sessions(session_id)
        return found[0] if found else None

    def resolve(self, wanted: str) -> str | None:
        rows = reads.sessions_starting(self, wanted, 2)
        if wanted in rows or len(rows) == 1:
            return wanted if wanted in rows else str(rows[0])
        return None

    # frames ----------------------------------------------------------------------------------

    def frame_count(self, session_id: str, flt: FrameFilter | None = None) -> int:
        return reads.frame_count(self, session_id, (flt or FrameFilter()).match())

    def start_us(self, session_id: str) -> int:
        v = reads.first_ts_us(self, session_id)
        return int(v) if v is not None else 0

    def frame_index(self, session_id: str, flt: FrameFilter | None = None, after_seq: int = -1,
                    upto_seq: int | None = None) -> FrameIndex:
        return FrameIndex(*self._index_arrays(session_id, flt, after_seq, upto_seq))

    def _index_arrays(self, session_id: str, flt: FrameFilter | None, after_seq: int,
                      upto_seq: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        t = reads.index_columns(self, session_id, (flt or FrameFilter()).match(), after_seq, upto_seq)
        seqs = column_array(t, "seq", np.int64)
        hb = column_array(t, "hb", np.int8).astype(bool)
        up = column_array(t, "up", np.int8).astype(bool)
        # Sorting in SQL costs more than checking here: scans return insertion (= seq) order
        # almost always, and numpy sorts the rare exception.
        if len(seqs) > 1 and not bool(np.all(seqs[1:] > seqs[:-1])):
            order = np.argsort(seqs, kind="stable")
            seqs, hb, up = seqs[order], hb[order], up[order]
        return seqs, hb, up

    def new_frames_since(self, session_id: str, seq: int, flt: FrameFilter | None = None,
                         upto_seq: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Seqs (and heartbeat flags) of matching frames after ``seq``: what follow mode appends.

        Pass ``upto_seq`` (a ``max_seq`` read first) so the caller knows exactly which range it
        has seen even while a capture keeps appending.
        """
        return self._index_arrays(session_id, flt, seq, upto_seq)

    def max_seq(self, session_id: str) -> int:
        return queries.last_seq(self, session_id)

    def kind_counts(self, session_id: str) -> list[tuple[str, int]]:
        """Kinds present in a session with their frame counts, most frequent first."""
        return list(queries.kind_counts(self, session_id).items())

    def frame_rows(self, session_id: str, seqs: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Timeline columns for the given seqs (the rows on screen)."""
        if not seqs:
            return {}
        return {int(r["seq"]): r for r in reads.timeline_rows(self, session_id, seqs).to_pylist()}

    def frame_page(self, session_id: str, offset: int, limit: int, flt: FrameFilter | None = None,
                   index: FrameIndex | None = None) -> list[dict[str, Any]]:
        """Display rows ``offset … offset+limit`` (heartbeat runs folded) with their columns."""
        index = index or self.frame_index(session_id, flt)
        refs = index.rows(offset, offset + limit)
        cols = self.frame_rows(session_id, index.seqs_for(refs))
        out = []
        for rr in refs:
            row = dict(cols.get(rr.seq, {}))
            row.update(row=rr.row, fold=rr.fold, count=rr.count, client_count=rr.client_count)
            if rr.fold:
                last = cols.get(rr.last_seq, {})
                row.update(last_seq=rr.last_seq, last_ts_us=last.get("ts_us"), expanded=rr.expanded)
            out.append(row)
        return out

    def timestamps(self, session_id: str) -> tuple[np.ndarray, np.ndarray]:
        """All seqs and their wire times (µs) in order: the replay clock."""
        t = reads.seq_times(self, session_id)
        return column_array(t, "seq", np.int64), column_array(t, "ts", np.int64)

    def frame_detail(self, session_id: str, seq: int) -> FrameDetail | None:
        t = reads.frame_record(self, session_id, seq)
        if not t.num_rows:
            return None
        r = t.to_pylist()[0]
        payload = r["payload"] or b""
        try:
            tree = fields_of(self.decoder, r["kind"], payload, r["msg_type"], int(r["flags"]))
        except Exception as exc:  # a frame that cannot be decoded is shown, not fatal
            tree = {"$error": f"cannot decode frame {seq}: {exc}", "$hex": payload.hex()}
        return FrameDetail(
            seq=int(r["seq"]), ts_us=int(r["ts_us"]), direction=r["direction"], transport=r["transport"],
            kind=r["kind"], summary=r["summary"], msg_type=r["msg_type"], flags=int(r["flags"]),
            size=int(r["size"]), payload=payload, raw=r["raw"], error=r["error"],
            ids={k: r[k] for k in ("ref_id", "call_id", "append_seqno", "request_id", "stream")},
            tree=tree, enveloped=(r["transport"], r["direction"]) in ENVELOPED, meta=stored_meta(r["meta"]))

    # derived tables --------------------------------------------------------------------------

    def findings(self, session_id: str) -> list[Finding]:
        """The session's findings, root cause first: stored, else computed (``session_findings``)."""
        return session_findings(self, session_id)

    def stored_findings(self, session_id: str) -> list[Finding] | None:
        """The stored findings; None when the session was never analysed (follow mode then asks
        ``LiveFindings``)."""
        return stored_findings(self, session_id)

    def tool_calls(self, session_id: str) -> list[ToolCallView]:
        return reads.tool_call_rows(self, session_id)

    def blobs(self, session_id: str) -> list[BlobView]:
        return reads.blob_rows(self, session_id)

    def frames_after(self, session_id: str, seq: int, limit: int = 50_000) -> pa.Table:
        """Full frame rows after ``seq`` (what a live analyzer is fed), in seq order: at most ``limit``
        rows and ``PAGE_BYTES`` of payload (a single larger frame alone), so reading never holds a
        whole session's payloads."""
        sizes = reads.stored_sizes_after(self, session_id, seq, limit)
        if not sizes.num_rows:
            return reads.no_frames(self)
        total, last = 0, -1
        for s, n in zip(sizes.column("seq").to_pylist(), sizes.column("n").to_pylist(), strict=True):
            if total and total + n > PAGE_BYTES:
                break
            total += n
            last = s
        return reads.full_frames(self, session_id, seq, last)

    def blob_data(self, session_id: str, blob_id: str) -> bytes | None:
        return reads.blob_bytes(self, session_id, blob_id)


def column_array(table: pa.Table, name: str, dtype: type[np.generic]) -> np.ndarray:
    """A non-null fixed-width Arrow column as numpy without pyarrow's to_numpy.

    ``to_numpy`` imports pandas on first use (1.5 s here), more than the whole first-paint budget.
    """
    col = table.column(name)
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if not len(arr):
        return np.zeros(0, dtype=dtype)
    if arr.null_count:
        raise ValueError(f"column {name} has NULLs")
    size = np.dtype(dtype).itemsize
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * size)


class LiveFindings:
    """Findings of a capture in progress, from ``workbench.analysis.IncrementalAnalyzer``.

    Used in follow mode while a capture is live and nothing has written ``findings`` rows for the
    session yet. Not thread-safe: one poll at a time feeds it.
    """

    def __init__(self, session_id: str) -> None:
        # deferred: the engine and its rules load only when a live capture is followed
        from workbench.analysis.engine import IncrementalAnalyzer

        self.analyzer = IncrementalAnalyzer(session_id)
        self.session_id = session_id

    def update(self, data: TuiData) -> list[Finding]:
        while True:
            last = self.analyzer.last_seq
            rows = data.frames_after(self.session_id, -1 if last is None else int(last))
            if not rows.num_rows or not self.analyzer.feed(rows) or rows.num_rows < 50_000:
                break
        # in root-cause order, evidence filled in: exactly as stored findings come (``Finding``)
        return self.analyzer.findings()


# helpers used by the views -----------------------------------------------------------------------

def sha256_check(blob_id: str, data: bytes | None) -> tuple[bool | None, str]:
    """Does the blob id equal SHA-256 of its bytes? (None when the bytes were never seen.)"""
    if data is None:
        return None, ""
    digest = hashlib.sha256(data).hexdigest()
    return digest == blob_id.lower(), digest


def pretty_blob(data: bytes | None) -> str:
    """Blob bytes for reading: indented JSON when they parse, else text, else hex."""
    if data is None:
        return "(no data captured)"
    try:
        return json.dumps(load_json(data), indent=2, ensure_ascii=False)
    except ValueError:  # not JSON, or nested past the limit every reader shares
        pass
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.hex(" ", 1)


def pretty_json(value: Any) -> str:
    """A JSON column (stored as text) indented; plain text when it does not parse."""
    if value is None:
        return "—"
    if isinstance(value, str):
        try:
            return json.dumps(load_json(value), indent=2, ensure_ascii=False)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)
