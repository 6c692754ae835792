"""Named reads of a capture database: every read a view does, written once, over one ``Reader``.

Views (the CLI, notebooks, fixtures, imports, the capture's spool merge) ask for what they want by
name (``session_ids``, ``last_seq``, ``finding_rows``…) and never write SQL themselves; the one
place SQL text lives outside ``workbench.store`` is where the user writes it (``workbench sql``,
notebook cells). Each read takes a ``Reader``: anything with ``query(sql, params)`` returning
Arrow and ``rows(sql, params)`` returning Python rows — a file reader, the live service's client,
the writer (``Store``) reading its own file, or a view's own data source wrapping one of those. The
reads here that hand Python values use ``rows``: a file reader fetches those as tuples, so a
listing (``workbench sessions``) loads no pyarrow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from workbench.errors import WorkbenchError
from workbench.protocol import kinds

if TYPE_CHECKING:  # only named in annotations: importing the reads loads no pyarrow
    import pyarrow as pa


Row = dict[str, Any]  # one result row: column name → value


class SessionNotFound(WorkbenchError):
    """A session id or prefix that names no session, or more than one."""


class Reader(Protocol):
    """Something that reads a capture database (``LocalReader``, ``RemoteReader``, ``Store``)."""

    @property
    def path(self) -> str: ...

    @property
    def live(self) -> bool: ...

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table: ...

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
        """The same read as Python rows (column name → value), for reads that want Python values: a
        file reader fetches them without Arrow, so a listing loads no pyarrow; a time Python cannot
        hold comes as DuckDB's text, as ``arrow_rows.table_rows`` gives it."""
        ...

    def close(self) -> None: ...


def _rows(reader: Reader, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
    """The rows of a query as Python values; a time Python cannot hold comes as its text."""
    return reader.rows(sql, params)


_PAGE_ROWS = 20_000   # rows of a paged read at a time (``_paged_rows``)


def _paged_rows(reader: Reader, sql: str, params: Sequence[Any]) -> list[Row]:
    """The rows of a query that has a ``seq`` column, read ``_PAGE_ROWS`` at a time in seq order, so
    that the reader's result cap (``readonly.ReadLimits``) bounds a page, not a whole session (a
    1M-frame session's payloads are over the 256 MiB cap); a page over the cap is read in halves."""
    from workbench.store.readonly import ResultTooLarge  # deferred: a listing never pages

    out: list[Row] = []
    after, page = -(2 ** 62), _PAGE_ROWS
    while True:
        try:
            rows = reader.rows(f"SELECT * FROM ({sql}) AS whole WHERE seq > ? ORDER BY seq LIMIT {page}",
                               [*params, after])
        except ResultTooLarge:
            if page == 1:
                raise   # one row over the cap: the error says how to raise it
            page //= 2
            continue
        out.extend(rows)
        if len(rows) < page:
            return out
        after = int(rows[-1]["seq"])


def _column(rows: list[Row]) -> list[Any]:
    """The first column's values."""
    return [next(iter(r.values())) for r in rows]


# the database as a whole --------------------------------------------------------------------------

def meta_keys_and_rows(reader: Reader) -> tuple[set[str], int]:
    """The keys of the ``meta`` table and how many rows ``sessions`` and ``frames`` hold together
    (a table the file lacks counts 0): is it a workbench database, and does it hold anything?"""
    tables = set(_column(reader.rows("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'")))
    keys = {str(k) for k in _column(reader.rows("SELECT key FROM meta"))} if "meta" in tables else set()
    held = 0
    for table in ("sessions", "frames"):
        if table in tables:
            held += int(_column(reader.rows(f"SELECT count(*) FROM {table}"))[0])
    return keys, held


# sessions ----------------------------------------------------------------------------------------

def session_ids(reader: Reader) -> list[str]:
    """Every session, oldest first (ties by id, so the order is the same on every run)."""
    t = reader.rows("SELECT session_id FROM sessions ORDER BY started_at, session_id")
    return [str(s) for s in _column(t)]


def sessions_with_prefix(reader: Reader, prefix: str, limit: int) -> list[str]:
    """Up to ``limit`` session ids starting with ``prefix``, in id order (resolving a short id)."""
    t = reader.rows("SELECT session_id FROM sessions WHERE starts_with(session_id, ?) ORDER BY session_id "
                     f"LIMIT {int(limit)}", [prefix])
    return [str(s) for s in _column(t)]


def resolve_session(reader: Reader, wanted: str) -> str:
    """The session id ``wanted`` names: itself, or the one session it is a unique prefix of
    (``SessionNotFound`` naming the database when there is none, or several)."""
    rows = sessions_with_prefix(reader, wanted, 5)
    if wanted in rows:
        return wanted
    if not rows:
        raise SessionNotFound(f"no session {wanted!r} in {reader.path} "
                              f"(see 'workbench sessions --db {reader.path}')")
    if len(rows) > 1:
        raise SessionNotFound(f"session prefix {wanted!r} in {reader.path} is ambiguous: {', '.join(rows)}")
    return rows[0]


def session_row(reader: Reader, session_id: str, columns: Sequence[str]) -> Row | None:
    """One session's row (``columns`` of ``sessions``, as stored: ``meta`` is JSON text), or None."""
    rows = _rows(reader, f"SELECT {', '.join(columns)} FROM sessions WHERE session_id = ?", [session_id])
    return rows[0] if rows else None


def session_shown_whole(reader: Reader, session_id: str) -> list[Row]:
    """A session's facts for a view that shows it whole (report, diff): times as text."""
    return _rows(reader,
        "SELECT session_id, source, transport, model, client_version, label, status, error, "
        "CAST(started_at AS VARCHAR) AS started_at, CAST(ended_at AS VARCHAR) AS ended_at, frame_count, host, path, "
        "http_status FROM sessions WHERE session_id = ?", [session_id])


def session_status(reader: Reader, session_id: str) -> str | None:
    """A session's status (open, complete…); None when no such session is stored (yet)."""
    rows = _column(reader.rows("SELECT status FROM sessions WHERE session_id = ?", [session_id]))
    return rows[0] if rows else None


SESSION_LIST_COLUMNS = ("session_id", "label", "source", "transport", "model", "started_at", "duration_s",
                        "frame_count", "status")


def session_list(reader: Reader) -> list[Row]:
    """The sessions list ``workbench sessions`` prints (``SESSION_LIST_COLUMNS``): one row per session,
    oldest first."""
    return reader.rows(
        "SELECT s.session_id, s.label, s.source, s.transport, s.model, s.started_at, "
        "round(epoch(s.ended_at) - epoch(s.started_at), 2) AS duration_s, s.frame_count, s.status "
        "FROM sessions s ORDER BY s.started_at NULLS LAST, s.session_id")


def sessions_of_file_hash(reader: Reader, sha: str) -> list[str]:
    """Sessions an import older than schema 3 made from a file with this SHA-256: frames stored,
    none of them with a ``source_key`` (those imports recorded only the file's hash)."""
    t = reader.rows(
        "SELECT s.session_id FROM sessions s WHERE json_extract_string(s.meta, '$.file_sha256') = ? "
        "AND EXISTS (SELECT 1 FROM frames f WHERE f.session_id = s.session_id) "
        "AND NOT EXISTS (SELECT 1 FROM frames f WHERE f.session_id = s.session_id AND f.source_key IS NOT NULL) "
        "ORDER BY 1", [sha])
    return [str(s) for s in _column(t)]


def stored_units_of_sessions(reader: Reader, session_ids: Sequence[str]) -> list[Row]:
    """For each stored session of ``session_ids``: its label, whether appends without a stream may
    join it (``absorbable``), the import units its keyed frames came from (``units``: source keys
    without their ``#n``) and how many frames have no key (``unkeyed``)."""
    if not session_ids:
        return []
    return _rows(reader,
        "SELECT s.session_id, s.label, "
        "coalesce(CAST(json_extract(s.meta, '$.appends_without_stream') AS BOOLEAN), false) AS absorbable, "
        "(SELECT list(DISTINCT regexp_replace(source_key, '#[0-9]+$', '')) FROM frames f "
        " WHERE f.session_id = s.session_id AND f.source_key IS NOT NULL) AS units, "
        "(SELECT count(*) FROM frames f WHERE f.session_id = s.session_id AND f.source_key IS NULL) AS unkeyed "
        "FROM sessions s WHERE s.session_id IN (SELECT unnest(?))", [list(session_ids)])


# frames ------------------------------------------------------------------------------------------

def last_seq(reader: Reader, session_id: str) -> int:
    """The highest seq stored for a session, -1 when it has no frames."""
    t = reader.rows("SELECT coalesce(max(seq), -1) FROM frames WHERE session_id = ?", [session_id])
    return int(_column(t)[0])


def last_seqs(reader: Reader, session_ids: Sequence[str]) -> dict[str, int]:
    """session_id → highest stored seq, for those of ``session_ids`` that have frames."""
    t = reader.rows("SELECT session_id, max(seq) AS seq FROM frames WHERE session_id IN (SELECT unnest(?)) "
                     "GROUP BY session_id", [list(session_ids)])
    return {str(r["session_id"]): int(r["seq"]) for r in t}


def kind_counts(reader: Reader, session_id: str) -> dict[str, int]:
    """kind → how many frames of it a session has, most frequent first (ties by kind)."""
    t = reader.rows("SELECT kind, count(*) AS n FROM frames WHERE session_id = ? GROUP BY kind "
                     "ORDER BY n DESC, kind", [session_id])
    return {str(r["kind"]): int(r["n"]) for r in t}


def frame_kinds(reader: Reader, session_id: str) -> dict[int, str]:
    """seq → kind of every frame of a session, in seq order."""
    t = reader.rows("SELECT seq, kind FROM frames WHERE session_id = ? ORDER BY seq", [session_id])
    return {int(r["seq"]): str(r["kind"]) for r in t}


def frame_identities(reader: Reader, session_ids: Sequence[str]) -> list[Row]:
    """(session_id, seq, ts_us, direction, kind) of every stored frame of these sessions: what tells
    a frame already stored from another one at the same seq (merging a capture's spool)."""
    if not session_ids:
        return []
    return _rows(reader, "SELECT session_id, seq, epoch_us(ts) AS ts_us, direction, kind FROM frames "
                        "WHERE session_id IN (SELECT unnest(?))", [list(session_ids)])


FIXTURE_FRAME_COLUMNS = ("seq, ts, direction, transport, stream, kind, payload, raw, flags, msg_type, ref_id, "
                         "call_id, append_seqno, request_id, error")


def session_frames(reader: Reader, session_id: str) -> list[Row]:
    """Every frame of a session with its bytes, in seq order (what a fixture holds)."""
    return _rows(reader, f"SELECT {FIXTURE_FRAME_COLUMNS} FROM frames WHERE session_id = ? ORDER BY seq",
                        [session_id])


LIST_FRAME_COLUMNS = ("seq, ts, direction, transport, kind, summary, flags, msg_type, error, ref_id, call_id, "
                      "append_seqno, request_id")


def frames_shown_whole(reader: Reader, session_id: str) -> list[Row]:
    """Every frame of a session with its payload, times in µs, for a view that shows it whole (read
    a page at a time: a session of any length)."""
    return _paged_rows(reader,
        "SELECT seq, epoch_us(ts) AS ts_us, direction, transport, kind, coalesce(summary, '') AS summary, msg_type, "
        "coalesce(flags, 0) AS flags, coalesce(size, 0) AS size, payload, raw, ref_id, call_id, append_seqno, "
        "request_id, error, CAST(meta AS VARCHAR) AS meta FROM frames WHERE session_id = ? ORDER BY seq",
        [session_id])


def frame_span(reader: Reader, session_id: str) -> Row:
    """How many frames a session has, its first and last frame's time (µs) and its seqs' range."""
    return _rows(reader, "SELECT count(*) AS frames, min(epoch_us(ts)) AS t0, max(epoch_us(ts)) AS t1, "
                         "min(seq) AS first_seq, max(seq) AS last_seq FROM frames WHERE session_id = ?",
                 [session_id])[0]


def frame_lines_page(reader: Reader, session_id: str, after: int, limit: int) -> pa.Table:
    """The next ``limit`` frames after seq ``after`` without payloads (``seq``, ``ts_us``,
    ``direction``, ``kind``, ``ref_id``): a view that walks a whole session reads it page by page."""
    return reader.query("SELECT seq, epoch_us(ts) AS ts_us, direction, kind, ref_id FROM frames "
                        f"WHERE session_id = ? AND seq > ? ORDER BY seq LIMIT {int(limit)}", [session_id, after])


def frames_shown_with_seqs(reader: Reader, session_id: str, seqs: Sequence[int]) -> list[Row]:
    """``frames_shown_whole`` for the frames of ``seqs`` only (a view that shows a sample)."""
    return _rows(reader,
        "SELECT seq, epoch_us(ts) AS ts_us, direction, transport, kind, coalesce(summary, '') AS summary, msg_type, "
        "coalesce(flags, 0) AS flags, coalesce(size, 0) AS size, payload, raw, ref_id, call_id, append_seqno, "
        "request_id, error, CAST(meta AS VARCHAR) AS meta FROM frames WHERE session_id = ? "
        "AND seq IN (SELECT unnest(?)) ORDER BY seq", [session_id, [int(s) for s in seqs]])


def frame_timeline_flags(reader: Reader, session_id: str) -> pa.Table:
    """Per frame of a session, for a timeline: ``seq``, ``ts`` (µs) and flags ``up`` (client),
    ``beat`` (a heartbeat), ``progress`` (a server message other than heartbeats, empty frames and
    the end) and ``server_beat``."""
    # flags as TINYINT: Arrow packs booleans in bits, which numpy cannot view without a copy per column
    return reader.query(
        "SELECT seq, epoch_us(ts) AS ts, (direction = 'client')::TINYINT AS up, "
        f"(kind IN {kinds.sql_list(kinds.HEARTBEATS)})::TINYINT AS beat, "
        f"(direction = 'server' AND kind NOT IN {kinds.sql_list((kinds.SERVER_HEARTBEAT, kinds.EMPTY))} "
        f"AND NOT starts_with(kind, '{kinds.END_STREAM}'))::TINYINT AS progress, "
        f"(direction = 'server' AND kind = '{kinds.SERVER_HEARTBEAT}')::TINYINT AS server_beat "
        "FROM frames WHERE session_id = ? ORDER BY seq", [session_id])


def frames_after(reader: Reader, session_id: str, after: int, limit: int, *, direction: str | None = None,
                 kind_prefixes: Sequence[str] = (), payload_bytes: int | None = None) -> list[Row]:
    """The next frames of a session after seq ``after``, in seq order: at most ``limit`` rows, only
    ``direction`` and kinds starting with one of ``kind_prefixes`` when given.

    ``payload_bytes``: the rows carry their payloads too, and a page holds at most that many payload
    bytes (a single larger frame alone), so following a session never holds all its payloads.
    """
    where = ["session_id = ?", "seq > ?"]
    params: list[Any] = [session_id, after]
    if direction:
        where.append("direction = ?")
        params.append(direction)
    if kind_prefixes:
        where.append("(" + " OR ".join("starts_with(kind, ?)" for _ in kind_prefixes) + ")")
        params += list(kind_prefixes)
    cond = " AND ".join(where)
    if payload_bytes is None:
        return _rows(reader, f"SELECT {LIST_FRAME_COLUMNS} FROM frames WHERE {cond} ORDER BY seq LIMIT {int(limit)}",
                            params)
    sizes = _rows(reader, f"SELECT seq, coalesce(octet_length(payload), 0) AS n FROM frames WHERE {cond} "
                         f"ORDER BY seq LIMIT {int(limit)}", params)
    if not sizes:
        return []
    total, last = 0, sizes[0]["seq"]
    for r in sizes:
        if total and total + r["n"] > payload_bytes:
            break
        total += r["n"]
        last = r["seq"]
    return _rows(reader, f"SELECT {LIST_FRAME_COLUMNS}, payload FROM frames WHERE {cond} AND seq <= ? ORDER BY seq",
                        [*params, last])


def source_keys_with_prefix(reader: Reader, prefix: str) -> list[str]:
    """Every stored frame's ``source_key`` that starts with ``prefix`` (an import lineage's lines)."""
    t = reader.rows("SELECT source_key FROM frames WHERE starts_with(source_key, ?)", [prefix])
    return [str(k) for k in _column(t)]


def sessions_of_source_keys(reader: Reader, keys: Sequence[str]) -> dict[str, str]:
    """source_key → session_id of the stored frames carrying one of ``keys``."""
    if not keys:
        return {}
    t = reader.rows("SELECT source_key, session_id FROM frames WHERE source_key IN (SELECT unnest(?))", [list(keys)])
    return {str(r["source_key"]): str(r["session_id"]) for r in t}


def holds_prefixed(reader: Reader, source_key_prefix: str, session_id_prefix: str) -> bool:
    """Whether any frame's source_key or any session's id starts with the given prefix."""
    t = reader.rows("SELECT EXISTS (SELECT 1 FROM frames WHERE starts_with(source_key, ?)) "
                     "OR EXISTS (SELECT 1 FROM sessions WHERE starts_with(session_id, ?))",
                     [source_key_prefix, session_id_prefix])
    return bool(_column(t)[0])


def source_keys_of(reader: Reader, session_id: str) -> set[str]:
    """Every ``source_key`` of one stored session."""
    t = reader.rows("SELECT source_key FROM frames WHERE session_id = ? AND source_key IS NOT NULL", [session_id])
    return {str(k) for k in _column(t)}


# findings and derived tables ---------------------------------------------------------------------

FINDING_COLUMNS = "session_id, code, severity, coalesce(message, '') AS message, first_seq, last_seq"


def finding_rows(reader: Reader, session_ids: Sequence[str] | None = None) -> list[Row]:
    """Stored findings (``FINDING_COLUMNS``) of every session, or of ``session_ids``."""
    if session_ids is None:
        return _rows(reader, f"SELECT {FINDING_COLUMNS} FROM findings")
    return _rows(reader, f"SELECT {FINDING_COLUMNS} FROM findings WHERE session_id IN (SELECT unnest(?))",
                        [list(session_ids)])


def finding_counts(reader: Reader) -> list[Row]:
    """(session_id, severity, n): how many stored findings each session has of each severity."""
    return _rows(reader, "SELECT session_id, severity, count(*) AS n FROM findings GROUP BY ALL")


def session_findings(reader: Reader, session_id: str) -> list[Row]:
    """A session's stored findings in full (evidence, suggested fix), in the order they occurred."""
    return _rows(reader, "SELECT code, severity, message, first_seq, last_seq, evidence, suggested_fix FROM findings "
                        "WHERE session_id = ? ORDER BY first_seq NULLS LAST, code", [session_id])


def has_derived_rows(reader: Reader, session_id: str) -> bool:
    """Did an analysis store blobs or tool calls for this session?"""
    t = reader.rows("SELECT (SELECT count(*) FROM blobs WHERE session_id = ?) + "
                     "(SELECT count(*) FROM tool_calls WHERE session_id = ?)", [session_id, session_id])
    return bool(_column(t)[0])
