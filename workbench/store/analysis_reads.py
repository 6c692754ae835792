"""The reads the analysis makes (``workbench.analysis``): one named function per question.

The analysis walks a session's frames, summarises the bulk in SQL, looks at the other sessions of
its conversation and reads and stamps stored findings. Every SQL text it needs is here, so a
schema change is made in ``store/`` and the rules never see SQL. Each read takes anything with
``query(sql, params) -> pa.Table`` (a ``store.queries.Reader``: ``Store``, ``LocalReader``,
``RemoteReader``, the TUI's data source) or that ``query`` callable itself. Reads other parts share
(kind counts, the highest seq) are in ``store.queries``. Kind lists that are the analysis's own choice (which
frames the walk skips, which payloads it parses) come in as arguments; kinds the protocol defines
come from ``protocol.kinds``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from workbench.protocol import kinds
from workbench.store.queries import Reader, Row

if TYPE_CHECKING:  # annotations only: a listing reads through here and loads no pyarrow
    import pyarrow as pa

    from workbench.store.db import Store

# A reader (``store.queries.Reader``), or its bound ``query`` for a caller that has only that.
Source = Reader | Callable[..., "pa.Table"]


def run(src: Source, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
    """``sql`` through a reader object or its ``query`` callable."""
    query = src.query if hasattr(src, "query") else src
    assert callable(query)
    return query(sql, params) if params is not None else query(sql)


def run_rows(src: Source, sql: str, params: Sequence[Any] | None = None) -> list[Row]:
    """``sql``'s rows as Python values: through the reader's ``rows`` (a file reader loads no
    pyarrow for them), or through Arrow for a bare ``query`` callable."""
    if hasattr(src, "rows"):
        return src.rows(sql, params)
    from workbench.store.arrow_rows import table_rows  # Arrow only for a bare query callable

    return table_rows(run(src, sql, params))


def _first(t: pa.Table) -> Any:
    return t.column(0)[0].as_py() if t.num_rows else None


# sessions ----------------------------------------------------------------------------------------

def session_ids(src: Source, *, finished: bool = False, among: Sequence[str] | None = None) -> list[str]:
    """Session ids in start order; ``finished``: not still ``open``; ``among``: only these."""
    where = ["status IS DISTINCT FROM 'open'"] if finished else []
    params: list[Any] = []
    if among is not None:
        where.append("session_id IN (SELECT unnest(?))")
        params.append(list(among))
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    t = run(src, f"SELECT session_id FROM sessions{clause} ORDER BY started_at, session_id", params)
    return [str(s) for s in t.column(0).to_pylist()]


def session_record(src: Source, session_id: str) -> pa.Table:
    """The session row the rules read (``meta`` as JSON text); no row for an unknown session."""
    return run(src, "SELECT status, error, conversation_id, source, transport, path, http_status, "
                    "CAST(meta AS VARCHAR) AS meta, epoch_us(started_at) AS started_us, "
                    "epoch_us(ended_at) AS ended_us FROM sessions WHERE session_id = ?", [session_id])


def body_offsets(src: Source, session_id: str, seqs: Sequence[int]) -> dict[int, int]:
    """seq -> the byte offset where that frame starts in its body: the enveloped sizes (5-byte
    header + payload) of the frames before it in the same direction and stream. Asked for the few
    malformed frames of a session (``analysis.rules_client.framing_lost``)."""
    if not seqs:
        return {}
    t = run(src,
            "SELECT seq, off FROM (SELECT seq, coalesce(sum(coalesce(size, octet_length(payload), 0) + 5) OVER ("
            "PARTITION BY direction, stream ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS off "
            "FROM frames WHERE session_id = ? AND seq <= ?) WHERE seq IN (SELECT unnest(?))",
            [session_id, max(seqs), list(seqs)])
    return {int(s): int(o) for s, o in zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True)}


def conversation_of(src: Source, session_id: str) -> str | None:
    return _first(run(src, "SELECT conversation_id FROM sessions WHERE session_id = ?", [session_id]))


# Start times for ordering sessions are epoch µs: every stored time is one (a TIMESTAMP past year
# 9999, which a hostile import can store, is not a datetime); ±infinity reads as unknown (None).

def started_at(src: Source, session_id: str) -> int | None:
    """The session's start in epoch µs."""
    return _first(run(src, "SELECT epoch_us(started_at) FROM sessions WHERE session_id = ?", [session_id]))


def session_conversations(src: Source) -> list[tuple[str, str | None, int | None]]:
    """(session_id, conversation_id, start in epoch µs) of every session."""
    t = run(src, "SELECT session_id, conversation_id, epoch_us(started_at) FROM sessions")
    return list(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), t.column(2).to_pylist(), strict=True))


def unlabelled_run_requests(src: Source) -> pa.Table:
    """(session_id, payload, started_at in epoch µs) of the run requests of sessions whose recorder
    did not fill ``conversation_id`` (the caller reads the id from the payload)."""
    return run(src, "SELECT f.session_id, f.payload, epoch_us(s.started_at) AS started_at FROM frames f JOIN sessions s USING (session_id) "
                    "WHERE f.kind = ? AND s.conversation_id IS NULL", [kinds.RUN_REQUEST])


# one session's frames ----------------------------------------------------------------------------

@dataclass(frozen=True)
class WalkSpec:
    """Which frames the analysis walk reads and which payloads it needs (the analysis decides)."""

    skip_kinds: tuple[str, ...]          # summarised by aggregates instead
    payload_kinds: tuple[str, ...]       # payload read for these kinds …
    payload_prefixes: tuple[str, ...]    # … and kinds starting with these …
    payload_transports: tuple[str, ...]  # … and every frame of these transports


# Facts of the exchange that carried a client frame (frames.meta): its HTTP status and content type.
_EXCHANGE = "transport IN ('bidi_append', 'unary') AND direction = 'client' AND meta IS NOT NULL"
_STATUS = "TRY_CAST(json_extract(meta, '$.http_status') AS INTEGER)"


@lru_cache(maxsize=4)
def _walk_sql(spec: WalkSpec) -> str:
    wanted = " OR ".join([f"kind IN {kinds.sql_list(spec.payload_kinds)}",
                          *(f"starts_with(kind, '{p}')" for p in spec.payload_prefixes),
                          f"transport IN {kinds.sql_list(spec.payload_transports)}"])
    skip = f" AND kind NOT IN {kinds.sql_list(spec.skip_kinds)}" if spec.skip_kinds else ""
    return (
        "SELECT seq, epoch_us(ts) AS ts_us, direction, transport, kind, ref_id, call_id, append_seqno, "
        f"request_id, flags, CASE WHEN {wanted} THEN payload END AS payload, "
        "CASE WHEN transport = 'cli_ndjson' THEN decoded END AS decoded, "
        f"CASE WHEN {_EXCHANGE} THEN {_STATUS} END AS http_status, "
        f"CASE WHEN {_EXCHANGE} THEN coalesce(json_extract_string(meta, '$.content_type'), "
        "json_extract_string(meta, '$.request_headers.\"content-type\"')) END AS content_type, "
        f"CASE WHEN kind IN ('{kinds.HTTP_ERROR}', '{kinds.MALFORMED}') THEN coalesce(error, summary) END AS error, "
        f"CASE WHEN {_EXCHANGE} AND NOT coalesce({_STATUS} BETWEEN 200 AND 299, true) THEN raw END AS raw, "
        f"CASE WHEN {_EXCHANGE} THEN TRY_CAST(json_extract(meta, '$.grpc_status') AS INTEGER) END AS grpc_status "
        f"FROM frames WHERE session_id = ? AND seq >= ? AND seq < ?{skip} ORDER BY seq"
    )


def walk_frames(src: Source, session_id: str, start: int, stop: int, spec: WalkSpec) -> pa.Table:
    """Frames ``start <= seq < stop`` the walk reads, in seq order, with the payloads it parses and
    the exchange facts of client frames (HTTP status, content type, gRPC status, raw refused body)."""
    return run(src, _walk_sql(spec), [session_id, start, stop])


# A server frame that shows the run moved (anything but a heartbeat, an empty poll or the end).
_PROGRESS = (f"direction = 'server' AND kind NOT IN {kinds.sql_list((kinds.SERVER_HEARTBEAT, kinds.EMPTY))} "
             f"AND NOT starts_with(kind, '{kinds.END_STREAM}')")


def frame_tallies(src: Source, session_id: str) -> pa.Table:
    """One row: frame count ``n``, ``first_seq``, ``last_seq``, ``last_ts``, ``last_server_seq`` (the
    end left out), and the last progress frame's kind ``lk``, seq ``lp`` and time ``lpt``."""
    return run(src,
               "SELECT count(*) AS n, min(seq) AS first_seq, max(seq) AS last_seq, arg_max(epoch_us(ts), seq) AS last_ts, "
               f"max(seq) FILTER (WHERE direction = 'server' AND NOT starts_with(kind, '{kinds.END_STREAM}')) "
               f"AS last_server_seq, arg_max(kind, seq) FILTER (WHERE {_PROGRESS}) AS lk, "
               f"max(seq) FILTER (WHERE {_PROGRESS}) AS lp, "
               f"arg_max(epoch_us(ts), seq) FILTER (WHERE {_PROGRESS}) AS lpt "
               "FROM frames WHERE session_id = ?", [session_id])


def server_marks(src: Source, session_id: str, heartbeat: str, text: str) -> pa.Table:
    """(seq, ts_us, hb) of the server's ``heartbeat`` and ``text`` frames in seq order (``hb``: a heartbeat)."""
    return run(src, "SELECT seq, epoch_us(ts) AS ts_us, kind = ? AS hb FROM frames WHERE session_id = ? "
                    "AND direction = 'server' AND kind IN (?, ?) ORDER BY seq",
               [heartbeat, session_id, heartbeat, text])


def kinds_at(src: Source, session_id: str, seqs: Sequence[int]) -> dict[int, str]:
    """seq → kind for the given seqs."""
    t = run(src, "SELECT seq, kind FROM frames WHERE session_id = ? AND seq IN (SELECT unnest(?))",
            [session_id, list(seqs)])
    return dict(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


def call_spans(src: Source, session_id: str, kind: str) -> pa.Table:
    """Per call_id of the ``kind`` frames: count ``n``, first/last seq and first/last time (µs)."""
    return run(src, "SELECT call_id, count(*) AS n, max(seq) AS last_seq, min(seq) AS first_seq, "
                    "max(epoch_us(ts)) AS last_ts, min(epoch_us(ts)) AS first_ts FROM frames "
                    "WHERE session_id = ? AND kind = ? AND call_id IS NOT NULL GROUP BY call_id",
               [session_id, kind])


def server_seqs_of(src: Source, session_id: str, marks: Sequence[str], gen: Sequence[str]) -> pa.Table:
    """(seq, gen) of the server's frames of kind ``marks`` in scan order; ``gen`` (TINYINT) 1 for a
    kind in ``gen``. Fixed-width columns: a million of them read as numpy without copies."""
    return run(src, f"SELECT seq, CAST(kind IN {kinds.sql_list(gen)} AS TINYINT) AS gen FROM frames "
                    f"WHERE session_id = ? AND direction = 'server' AND kind IN {kinds.sql_list(marks)}",
               [session_id])


def first_payload(src: Source, session_id: str, kind: str) -> bytes | None:
    """The payload of the session's first frame of ``kind``."""
    value = _first(run(src, "SELECT payload FROM frames WHERE session_id = ? AND kind = ? ORDER BY seq LIMIT 1",
                       [session_id, kind]))
    return None if value is None else bytes(value)


# other sessions of the conversation --------------------------------------------------------------

def session_payloads(src: Source, session_ids: Sequence[str], kind: str) -> list[tuple[str, bytes | None]]:
    """(session_id, payload) of every ``kind`` frame of these sessions."""
    t = run(src, "SELECT session_id, payload FROM frames WHERE session_id IN (SELECT unnest(?)) AND kind = ?",
            [list(session_ids), kind])
    return list(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


def last_seq_of_kind(src: Source, session_ids: Sequence[str], kind: str) -> list[tuple[str, int]]:
    """(session_id, highest seq of a ``kind`` frame) for those of the sessions that have one."""
    t = run(src, "SELECT session_id, max(seq) AS seq FROM frames WHERE session_id IN (SELECT unnest(?)) "
                 "AND kind = ? GROUP BY session_id", [list(session_ids), kind])
    return [(str(s), int(q)) for s, q in zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True)]


def later_client_inputs(src: Source, session_id: str, limit: int) -> list[tuple[str, int, bytes]]:
    """(session_id, seq, payload) of the run requests and conversation actions of the sessions
    that started after this one, in start order, at most ``limit``."""
    t = run(src,
            "SELECT f.session_id, f.seq, f.payload FROM frames f JOIN sessions s USING (session_id) "
            "WHERE s.started_at > (SELECT started_at FROM sessions WHERE session_id = ?) "
            f"AND f.direction = 'client' AND (f.kind = '{kinds.RUN_REQUEST}' "
            f"OR starts_with(f.kind, '{kinds.CONVERSATION_ACTION}')) "
            f"AND f.payload IS NOT NULL ORDER BY s.started_at, f.session_id, f.seq LIMIT {int(limit)}",
            [session_id])
    return [(str(s), int(q), bytes(p)) for s, q, p in
            zip(t.column(0).to_pylist(), t.column(1).to_pylist(), t.column(2).to_pylist(), strict=True)]


# stored findings and their stamps ------------------------------------------------------------------

FINDING_ROW = ("session_id, code, severity, coalesce(message, '') AS message, first_seq, last_seq, "
               "evidence, coalesce(suggested_fix, '') AS suggested_fix")


def finding_rows(src: Source, session_id: str) -> pa.Table:
    """A session's stored ``findings`` rows as written (no ``cause``: ordering rebuilds it)."""
    return run(src, f"SELECT {FINDING_ROW} FROM findings WHERE session_id = ?", [session_id])


def stamp_values(src: Source, prefix: str, session_ids: Sequence[str] | None = None) -> dict[str, str]:
    """session_id → the ``meta`` value stored under ``prefix || session_id``."""
    sql = (f"SELECT substr(key, {len(prefix) + 1}) AS sid, value FROM meta "
           f"WHERE starts_with(key, '{prefix}')")
    rows = run_rows(src, sql) if session_ids is None else run_rows(
        src, sql + f" AND substr(key, {len(prefix) + 1}) IN (SELECT unnest(?))", [list(session_ids)])
    return {r["sid"]: r["value"] for r in rows}


def replace_rows(store: Store, table: str, session_ids: Sequence[str], columns: Mapping[str, list[Any]]) -> None:
    """Replace the sessions' rows of a derived table (``blobs``, ``tool_calls``, ``findings``) with
    ``columns`` (name → one Python value per row), in the caller's transaction if there is one. The
    lists go to DuckDB as list parameters: converting Python values to Arrow made pyarrow import
    pandas (a fifth of a second of a ``workbench diagnose``)."""
    if table not in _DERIVED:
        raise ValueError(f"not a derived table: {table}")
    with store.transaction():
        store.con.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT unnest(?))", [list(session_ids)])
        names = list(columns)
        if names and columns[names[0]]:
            store.con.execute(f"INSERT INTO {table} ({', '.join(names)}) SELECT "
                              + ", ".join(f"unnest(?) AS {n}" for n in names), [columns[n] for n in names])


_DERIVED = frozenset({"blobs", "tool_calls", "findings"})


def write_stamp_values(store: Store, prefix: str, values: Sequence[tuple[str, str]]) -> None:
    """Set ``meta[prefix || session_id] = value`` (a ``Store``; one transaction). The one write here:
    the stamp goes with the reads of it."""
    latest = {prefix + sid: value for sid, value in values}  # one row per key, the last value given
    if not latest:
        return
    # one statement for all the rows: one INSERT per stamp took a third of a second for an import's 176
    with store.transaction():
        store.con.execute("INSERT OR REPLACE INTO meta SELECT unnest(?), unnest(?)", [list(latest), list(latest.values())])


# schema drift (``analysis.schema_drift``) ----------------------------------------------------------

# Frames whose payload is a message of their msg_type (not kept compressed, unparsable or a wrapper).
_WALKABLE = ("msg_type IS NOT NULL AND payload IS NOT NULL AND octet_length(payload) > 0 "
             f"AND kind NOT IN {kinds.sql_list((kinds.MALFORMED, 'compressed', kinds.EMPTY))} "
             f"AND NOT starts_with(kind, '{kinds.END_STREAM}')")
_PAGE_COLS = "f.session_id, f.seq, f.ts, f.msg_type, f.payload"
# A kind with a field number in it (``exec_server_message.42``): a field the schema did not name.
_NUMBERED = r"(^|\.)[0-9]+(\.|$)"


def client_versions(src: Source) -> dict[str, str | None]:
    """session_id → the client version its recording names."""
    t = run(src, "SELECT session_id, client_version FROM sessions ORDER BY session_id")
    return dict(zip(t.column(0).to_pylist(), t.column(1).to_pylist(), strict=True))


def walkable_count(src: Source) -> int:
    """How many frames carry a payload that parses as their msg_type."""
    return int(_first(run(src, f"SELECT count(*) FROM frames WHERE {_WALKABLE}")))


def walkable_page(src: Source, session_id: str, after: int, limit: int) -> pa.Table:
    """(session_id, seq, ts, msg_type, payload) of the next ``limit`` walkable frames after ``after``."""
    return run(src, f"SELECT {_PAGE_COLS} FROM frames f WHERE f.session_id = ? AND f.seq > ? AND "
                    f"{_WALKABLE} ORDER BY f.seq LIMIT {int(limit)}", [session_id, after])


def walkable_sample(src: Source, per_kind: int) -> pa.Table:
    """(session_id, seq) of at most ``per_kind`` walkable frames of each kind (a stable pseudo-random pick)."""
    return run(src, f"SELECT session_id, seq FROM frames WHERE {_WALKABLE} "
                    "QUALIFY row_number() OVER (PARTITION BY kind ORDER BY hash(session_id, seq)) <= ? "
                    "ORDER BY session_id, seq", [per_kind])


def frames_at(src: Source, session_id: str, seqs: Sequence[int]) -> pa.Table:
    """(session_id, seq, ts, msg_type, payload) of these seqs, in seq order."""
    return run(src, f"SELECT {_PAGE_COLS} FROM frames f WHERE f.session_id = ? AND "
                    "list_contains(?::BIGINT[], f.seq) ORDER BY f.seq", [session_id, list(seqs)])


def numbered_kinds(src: Source) -> pa.Table:
    """Per numbered kind and msg_type: frames ``n``, ``sessions``, ``first``/``last`` time, client ``versions``."""
    return run(src, "SELECT f.kind, f.msg_type, count(*) AS n, list(DISTINCT f.session_id) AS sessions, "
                    "min(f.ts) AS first, max(f.ts) AS last, list(DISTINCT s.client_version) FILTER "
                    "(WHERE s.client_version IS NOT NULL) AS versions FROM frames f LEFT JOIN sessions s "
                    f"USING (session_id) WHERE regexp_matches(f.kind, '{_NUMBERED}') "
                    "AND f.msg_type IS NOT NULL GROUP BY f.kind, f.msg_type")


def recording_schemas(src: Source) -> pa.Table:
    """The schemas the sessions were recorded with: hash, source, messages, sessions (most used first)."""
    return run(src, "SELECT json_extract_string(meta, '$.schema.hash') AS hash, "
                    "json_extract_string(meta, '$.schema.source') AS source, "
                    "CAST(json_extract(meta, '$.schema.messages') AS BIGINT) AS messages, count(*) AS sessions "
                    "FROM sessions GROUP BY ALL ORDER BY sessions DESC")


def session_signatures(src: Source, session_ids: Sequence[str]) -> dict[str, tuple[Any, ...]]:
    """session_id → (a hash of its ``sessions`` row, its frame count, a sum of its frames' row hashes):
    equal signatures when nothing of the session was written again (a session without a row is absent)."""
    if not session_ids:
        return {}
    t = run(src, "SELECT s.session_id, hash(s) AS row, f.n, f.h FROM sessions s LEFT JOIN "
                 "(SELECT session_id, count(*) AS n, sum(hash(f)) AS h FROM frames f "
                 " WHERE session_id IN (SELECT unnest(?)) GROUP BY session_id) f USING (session_id) "
                 "WHERE s.session_id IN (SELECT unnest(?))", [list(session_ids), list(session_ids)])
    return {str(r[0]): tuple(r[1:]) for r in zip(*(t.column(i).to_pylist() for i in range(4)), strict=True)}
