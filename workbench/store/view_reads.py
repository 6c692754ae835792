"""The reads the TUI (and the web view, which runs it) makes: one named function per question.

A session's timeline is read as an index (seq, heartbeat flag, direction for every matching frame)
and then the few rows on screen by seq, so nothing here returns a million rows of text. Each read
takes a reader (``store.analysis_reads.Source``: anything with ``query(sql, params)``). A frame
filter (``FrameMatch``) is the filter bar's query as values; the SQL for it is built here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import pyarrow as pa

from workbench.protocol import kinds
from workbench.store.analysis_reads import Source, run

# Both directions' keep-alives: a heartbeat loop is server and client heartbeats interleaved.
_HEARTBEAT = "kind IN " + kinds.sql_list(kinds.HEARTBEATS)


@dataclass(frozen=True)
class FrameMatch:
    """Which frames a view shows: kinds starting with one of ``prefixes``, one ``direction``, and
    ``needle`` (lower case) in the summary or kind or ``payload_needle`` in the payload's text."""

    prefixes: tuple[str, ...] = ()
    direction: str | None = None
    needle: str = ""
    payload_needle: str = ""

    def sql(self) -> tuple[str, list[Any]]:
        """An ``AND …`` clause (possibly empty) and its parameters."""
        clause = ""
        params: list[Any] = []
        if self.prefixes:
            clause += " AND (" + " OR ".join("starts_with(kind, ?)" for _ in self.prefixes) + ")"
            params.extend(self.prefixes)
        if self.direction:
            clause += " AND direction = ?"
            params.append(self.direction)
        if self.needle:
            clause += (" AND (contains(lower(coalesce(summary, '')), ?) OR contains(kind, ?)"
                       " OR contains(lower(CAST(payload AS VARCHAR)), ?))")
            params.extend([self.needle, self.needle, self.payload_needle])
        return clause, params


ALL = FrameMatch()


# sessions ----------------------------------------------------------------------------------------

def session_summaries(src: Source, only: str | None = None) -> pa.Table:
    """The sessions (or one) in start order: id, source, transport, model, ``started_us``, ``dur_us``,
    frame_count, status, label (text columns never NULL)."""
    where, params = ("WHERE session_id = ?", [only]) if only is not None else ("", [])
    return run(src,
               "SELECT session_id, coalesce(source, '') AS source, coalesce(transport, '') AS transport, "
               "coalesce(model, '') AS model, epoch_us(started_at) AS started_us, "
               "epoch_us(ended_at) - epoch_us(started_at) AS dur_us, coalesce(frame_count, 0) AS frame_count, "
               f"coalesce(status, '') AS status, coalesce(label, '') AS label FROM sessions {where} "
               "ORDER BY started_at, session_id", params)


def finding_heads(src: Source, only: str | None = None) -> pa.Table:
    """Stored findings (or one session's) without evidence or fix: session_id, code, severity,
    message, first_seq, last_seq (what a sessions list counts and picks the top finding from)."""
    where, params = ("WHERE session_id = ?", [only]) if only is not None else ("", [])
    return run(src, "SELECT session_id, code, severity, coalesce(message, '') AS message, first_seq, last_seq "
                    f"FROM findings {where}", params)


def sessions_starting(src: Source, prefix: str, limit: int = 2) -> list[str]:
    """Session ids starting with ``prefix`` (at most ``limit``, in id order)."""
    t = run(src, "SELECT session_id FROM sessions WHERE starts_with(session_id, ?) ORDER BY session_id LIMIT ?",
            [prefix, limit])
    return [str(s) for s in t.column(0).to_pylist()]


# a session's frames ------------------------------------------------------------------------------

def frame_count(src: Source, session_id: str, match: FrameMatch = ALL) -> int:
    clause, params = match.sql()
    t = run(src, f"SELECT count(*) FROM frames WHERE session_id = ?{clause}", [session_id, *params])
    return int(t.column(0)[0].as_py())


def first_ts_us(src: Source, session_id: str) -> int | None:
    """The time of the session's first frame (µs since the epoch)."""
    t = run(src, "SELECT epoch_us(min(ts)) FROM frames WHERE session_id = ?", [session_id])
    return t.column(0)[0].as_py()


def index_columns(src: Source, session_id: str, match: FrameMatch = ALL, after_seq: int = -1,
                  upto_seq: int | None = None) -> pa.Table:
    """(seq, hb, up) of the matching frames after ``after_seq`` (and at most ``upto_seq``): ``hb`` 1 for
    a heartbeat of either side, ``up`` 1 for a client frame. Scan order, which is seq order almost
    always: the caller checks (sorting here costs more)."""
    clause, params = match.sql()
    if upto_seq is not None:
        clause, params = " AND seq <= ?" + clause, [upto_seq, *params]
    return run(src, f"SELECT seq, CAST({_HEARTBEAT} AS TINYINT) AS hb, "
                    "CAST(direction = 'client' AS TINYINT) AS up FROM frames "
                    f"WHERE session_id = ? AND seq > ?{clause}", [session_id, after_seq, *params])


def timeline_rows(src: Source, session_id: str, seqs: Sequence[int]) -> pa.Table:
    """The timeline's columns (seq, ts_us, direction, kind, summary, size, error) of these seqs."""
    return run(src, "SELECT seq, epoch_us(ts) AS ts_us, direction, kind, coalesce(summary, '') AS summary, "
                    "size, error FROM frames WHERE session_id = ? AND seq BETWEEN ? AND ? "
                    "AND seq IN (SELECT unnest(?))",
               [session_id, min(seqs), max(seqs), list(seqs)])


def seq_times(src: Source, session_id: str) -> pa.Table:
    """(seq, ts) of every frame in seq order, ts in µs: the replay clock."""
    return run(src, "SELECT seq, epoch_us(ts) AS ts FROM frames WHERE session_id = ? ORDER BY seq", [session_id])


def frame_record(src: Source, session_id: str, seq: int) -> pa.Table:
    """One frame with everything its detail view shows (no row when there is none)."""
    return run(src, "SELECT seq, epoch_us(ts) AS ts_us, direction, transport, kind, coalesce(summary, '') AS summary, "
                    "msg_type, coalesce(flags, 0) AS flags, coalesce(size, 0) AS size, payload, raw, error, "
                    "ref_id, call_id, append_seqno, request_id, stream, meta FROM frames "
                    "WHERE session_id = ? AND seq = ?", [session_id, seq])


def stored_sizes_after(src: Source, session_id: str, seq: int, limit: int) -> pa.Table:
    """(seq, n) of the next ``limit`` frames after ``seq``: ``n`` the bytes of payload and raw kept."""
    return run(src, "SELECT seq, coalesce(octet_length(payload), 0) + coalesce(octet_length(raw), 0) AS n "
                    "FROM frames WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT ?", [session_id, seq, limit])


def full_frames(src: Source, session_id: str, after: int, upto: int) -> pa.Table:
    """Whole ``frames`` rows ``after < seq <= upto`` in seq order (what a live analyzer is fed)."""
    return run(src, "SELECT * FROM frames WHERE session_id = ? AND seq > ? AND seq <= ? ORDER BY seq",
               [session_id, after, upto])


def no_frames(src: Source) -> pa.Table:
    """An empty table with the ``frames`` columns."""
    return run(src, "SELECT * FROM frames WHERE false")


# derived tables ----------------------------------------------------------------------------------

class ToolCallView(TypedDict):
    """A stored tool call as the views show it (``tool_calls`` columns; args and result as JSON text)."""

    call_id: str
    tool_name: str
    exec_id: int | None
    first_seq: int | None
    last_seq: int | None
    exec_seq: int | None
    result_seq: int | None
    args_streamed: str | None
    args_completion: str | None
    args_merged: str | None
    args_naive: str | None
    result: str | None
    status: str


class BlobView(TypedDict):
    """A stored blob request as the views show it (``blobs`` columns, without the bytes)."""

    blob_id: str
    op: str
    seq: int | None
    result_seq: int | None
    size: int | None
    content_type: str
    role: str
    proto_type: str | None
    sha256_ok: bool | None
    status: str
    preview: str


# The views' columns of the derived tables; text columns never NULL.
_TOOL_CALL_COLUMNS = ("call_id, coalesce(tool_name, '') AS tool_name, exec_id, first_seq, last_seq, exec_seq, "
                      "result_seq, args_streamed, args_completion, args_merged, args_naive, result, "
                      "coalesce(status, '') AS status")
_BLOB_COLUMNS = ("blob_id, op, seq, result_seq, size, coalesce(content_type, '') AS content_type, "
                 "coalesce(role, '') AS role, proto_type, sha256_ok, coalesce(status, '') AS status, "
                 "coalesce(preview, '') AS preview")


def tool_call_rows(src: Source, session_id: str) -> list[ToolCallView]:
    """A session's stored tool calls, in order of their first frame."""
    t = run(src, f"SELECT {_TOOL_CALL_COLUMNS} FROM tool_calls WHERE session_id = ? "
                 "ORDER BY first_seq NULLS LAST, call_id", [session_id])
    return cast(list[ToolCallView], t.to_pylist())


def blob_rows(src: Source, session_id: str) -> list[BlobView]:
    """A session's stored blob requests, in seq order (without their bytes)."""
    t = run(src, f"SELECT {_BLOB_COLUMNS} FROM blobs WHERE session_id = ? ORDER BY seq NULLS LAST, blob_id",
            [session_id])
    return cast(list[BlobView], t.to_pylist())


def blob_bytes(src: Source, session_id: str, blob_id: str) -> bytes | None:
    """The bytes a session's blob carried, when they were captured."""
    t = run(src, "SELECT data FROM blobs WHERE session_id = ? AND blob_id = ? AND data IS NOT NULL LIMIT 1",
            [session_id, blob_id])
    return t.column(0)[0].as_py() if t.num_rows else None
