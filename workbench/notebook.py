"""Notebook helper: ``connect(db)`` → a DuckDB connection with the capture's tables and handy views.

::

    from workbench.notebook import connect, demo_db
    con = connect()                   # the CLI's database: $WORKBENCH_DB, else captures/workbench.duckdb
                                      # in the nearest captures/ folder from here up (workbench.store.paths)
    con = connect(demo_db())          # what the shipped notebooks read: captures/demo.duckdb, same rule
    con.sql("SELECT * FROM v_heartbeat_gaps").df()   # pandas DataFrame
    session_overview(con)             # sessions with their label and top finding (root cause first)

The connection is a private in-memory DuckDB. It is read-only for real (``workbench.store.readonly``):
its default database is read-only, so ``CREATE TABLE``/``INSERT``/``DELETE`` are refused, SQL has no
file or network access (except the Parquet directory being read) and settings are locked. Notebooks
create their own scratch objects with ``CREATE TEMP TABLE`` / ``CREATE TEMP VIEW``:

- a database file nobody is writing is ATTACHed read-only (queries run on the file directly);
- a capture in progress (its writer holds the file; see ``workbench.store.reader``) is read through
  the capture's live read service and *snapshotted* into memory — call ``connect`` again to refresh;
- a directory written by ``workbench export --parquet`` is queried in place with ``read_parquet``.

Either way the same names exist: the tables ``sessions``, ``frames``, ``blobs``, ``tool_calls``,
``findings`` and the views below (docs/notebooks.md describes every column).

``v_frames``         frames + ``t_offset`` (seconds since the session's first frame), ``family``
                     (heartbeat, text, tool, exec, kv, checkpoint, query, lifecycle, error, transport,
                     other) and ``short_kind`` (``text_delta`` for ``interaction_update.text_delta``).
``v_heartbeat_gaps`` per session, every stretch of server heartbeats between two other server frames:
                     the frame before it, how many heartbeats, how long, what came next, and whether
                     the stream ended inside it (``ended_in_loop``).
``v_stalls``         the gaps that look like a stall: ended in the loop, or ≥ 5 heartbeats.
``v_tool_calls``     tool_calls + ``naive_valid`` / ``streamed_valid`` (is that args text JSON?) and
                     ``args_lost_keys`` (keys the completion dropped compared to the streamed args).
``v_blobs``          blobs without the data bytes (``data_size`` instead).
``v_findings``       findings + the session's source and transport.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

from workbench.errors import WorkbenchError
from workbench.protocol import kinds
from workbench.store import paths
from workbench.store.readonly import confine

DEFAULT_NOTEBOOK_DB = "captures/demo.duckdb"  # what `workbench demo` writes; demo_db() finds it from any folder
TABLES = ("sessions", "frames", "blobs", "tool_calls", "findings")
# A live snapshot is fetched this many rows (and at most this many bytes) per request.
SNAPSHOT_PAGE_ROWS = 20_000
SNAPSHOT_PAGE_BYTES = 1024 * 1024 * 1024

LIFECYCLE_KINDS = (kinds.RUN_REQUEST, kinds.END_STREAM, kinds.TURN_ENDED, kinds.STEP_STARTED, kinds.STEP_COMPLETED,
                   kinds.USER_MESSAGE_APPENDED, kinds.PREWARM_REQUEST)
FAMILY_SQL = f"""
CASE
  WHEN kind IN {kinds.sql_list(kinds.HEARTBEATS)} THEN 'heartbeat'
  WHEN kind IN {kinds.sql_list((kinds.END_STREAM_ERROR, kinds.MALFORMED))} OR kind LIKE '{kinds.EXEC_THROW}' THEN 'error'
  WHEN kind IN {kinds.sql_list((kinds.TEXT_DELTA, kinds.THINKING_DELTA, kinds.THINKING_COMPLETED, kinds.TOKEN_DELTA))}
       OR kind LIKE '{kinds.SUMMARY}%' THEN 'text'
  WHEN kind LIKE 'interaction_update.%tool_call%' OR kind = '{kinds.SHELL_OUTPUT_DELTA}' THEN 'tool'
  WHEN kind LIKE 'exec\\_%' ESCAPE '\\' THEN 'exec'
  WHEN kind LIKE 'kv\\_%' ESCAPE '\\' THEN 'kv'
  WHEN kind = '{kinds.CHECKPOINT}' THEN 'checkpoint'
  WHEN kind LIKE 'interaction\\_query%' ESCAPE '\\' OR kind LIKE 'interaction\\_response%' ESCAPE '\\' THEN 'query'
  WHEN kind IN {kinds.sql_list(LIFECYCLE_KINDS)} OR kind LIKE '{kinds.CONVERSATION_ACTION}%' THEN 'lifecycle'
  WHEN kind IN ('bidi_request_id', 'bidi_poll_request', 'empty', 'unary') THEN 'transport'
  ELSE 'other'
END"""

VIEWS = {
    "v_frames": f"""
SELECT session_id, seq, ts,
       (epoch_us(ts) - min(epoch_us(ts)) OVER (PARTITION BY session_id)) / 1e6 AS t_offset,
       direction, transport, stream, kind,
       CASE WHEN kind LIKE 'interaction_update.%' THEN substr(kind, 20) ELSE kind END AS short_kind,
       {FAMILY_SQL} AS family,
       summary, size, flags, msg_type, ref_id, call_id, append_seqno, request_id, error
FROM frames""",
    "v_heartbeat_gaps": f"""
WITH s AS (
  SELECT session_id, seq, ts, kind, kind = '{kinds.SERVER_HEARTBEAT}' AS hb
  FROM frames WHERE direction = 'server'),
g AS (
  SELECT *, sum(CASE WHEN hb THEN 0 ELSE 1 END) OVER (PARTITION BY session_id ORDER BY seq
                                                        ROWS UNBOUNDED PRECEDING) AS grp
  FROM s),
runs AS (
  SELECT session_id, grp,
         min(seq) FILTER (WHERE NOT hb) AS after_seq,
         any_value(kind) FILTER (WHERE NOT hb) AS after_kind,
         min(ts) FILTER (WHERE NOT hb) AS after_ts,
         count(*) FILTER (WHERE hb) AS heartbeats,
         min(seq) FILTER (WHERE hb) AS first_seq, max(seq) FILTER (WHERE hb) AS last_seq,
         min(ts) FILTER (WHERE hb) AS first_ts, max(ts) FILTER (WHERE hb) AS last_ts
  FROM g GROUP BY session_id, grp),
nxt AS (
  SELECT *, lead(after_seq) OVER w AS next_seq, lead(after_kind) OVER w AS next_kind,
         lead(after_ts) OVER w AS next_ts
  FROM runs WINDOW w AS (PARTITION BY session_id ORDER BY grp))
SELECT session_id, after_seq, after_kind, heartbeats, first_seq, last_seq, first_ts, last_ts,
       (epoch_us(coalesce(next_ts, last_ts)) - epoch_us(coalesce(after_ts, first_ts))) / 1e6 AS gap_s,
       next_seq, next_kind,
       (next_kind IS NULL OR next_kind LIKE 'end_stream%') AS ended_in_loop
FROM nxt WHERE heartbeats > 0""",
    "v_stalls": """
SELECT * FROM v_heartbeat_gaps WHERE ended_in_loop OR heartbeats >= 5""",
    "v_tool_calls": """
SELECT *,
       json_valid(args_naive) AS naive_valid,
       json_valid(CAST(args_streamed AS VARCHAR)) AS streamed_valid,
       CASE WHEN args_streamed IS NOT NULL AND args_completion IS NOT NULL
                 AND json_type(CAST(args_streamed AS JSON)) = 'OBJECT'
                 AND json_type(CAST(args_completion AS JSON)) = 'OBJECT'
            THEN list_filter(json_keys(CAST(args_streamed AS JSON)),
                             lambda k: NOT list_contains(json_keys(CAST(args_completion AS JSON)), k))
       END AS args_lost_keys
FROM tool_calls""",
    "v_blobs": """
SELECT * EXCLUDE (data), octet_length(data) AS data_size FROM blobs""",
    "v_findings": """
SELECT f.*, s.source, s.transport, s.status AS session_status
FROM findings f LEFT JOIN sessions s USING (session_id)""",
}


class NotebookError(WorkbenchError):
    """The capture could not be opened; the message names the path."""


def default_db() -> str:
    """The database the CLI and the TUI use when given none (``workbench.store.paths``)."""
    return paths.default_db()


def demo_db() -> str:
    """The database the shipped notebooks analyse: ``$WORKBENCH_DB``, else ``demo.duckdb`` in the
    nearest ``captures/`` folder from the current directory up (so a kernel started in
    ``notebooks/`` finds the repository's ``captures/demo.duckdb``)."""
    return paths.default_db(paths.DEMO_DB_NAME)


def connect(db: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the capture's tables and the convenience views (see module doc).

    ``db`` None: the CLI's default database (``default_db``)."""
    path = Path(db) if db is not None else Path(default_db())
    con = duckdb.connect(":memory:")
    try:
        allowed: list[str] = []
        if path.is_dir():
            _parquet_tables(con, path)
            allowed.append(str(path.resolve()))
        elif not path.exists():
            raise NotebookError(f"{path}: no such capture database (set WORKBENCH_DB or pass a path; "
                                f"'workbench demo' writes {DEFAULT_NOTEBOOK_DB}; without a path: "
                                f"{paths.describe_rule()})")
        else:
            _database_tables(con, path)
        for name, sql in VIEWS.items():
            con.execute(f"CREATE TEMP VIEW {name} AS {sql}")
        # Read-only for real (workbench.store.readonly): no file or network access from SQL except
        # the Parquet directory being read, settings locked. The default database is read-only, so
        # CREATE/INSERT/DELETE are refused; scratch objects go to TEMP (CREATE TEMP TABLE …).
        confine(con, allowed)
    except BaseException:
        con.close()
        raise
    return con


def session_overview(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per session: id, label, source, transport, status, frames, start, the number of
    findings (errors and warnings) and of notes, and the top finding with its message (root cause
    first, ``workbench.overview``)."""
    from workbench.overview import FINDING_COLUMNS, top_findings

    df = con.sql("""
        SELECT s.session_id, s.label, s.source, s.transport, s.status, s.frame_count, s.started_at,
               (SELECT count(*) FROM findings f WHERE f.session_id = s.session_id
                AND f.severity IN ('error', 'warning')) AS findings,
               (SELECT count(*) FROM findings f WHERE f.session_id = s.session_id
                AND f.severity = 'note') AS notes
        FROM sessions s ORDER BY s.started_at, s.session_id""").df()
    top = top_findings(con.sql(f"SELECT {FINDING_COLUMNS} FROM findings").fetch_arrow_table().to_pylist())
    df["top_finding"] = [f.code if (f := top.get(sid)) is not None else None for sid in df.session_id]
    df["top_finding_message"] = [f.message if (f := top.get(sid)) is not None else None for sid in df.session_id]
    return df


def _attach_read_only(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    literal = "'" + str(path).replace("'", "''") + "'"
    try:
        con.execute(f"ATTACH {literal} AS capture (READ_ONLY)")
    except duckdb.Error as exc:
        raise NotebookError(f"{path}: cannot open the capture database: {exc}") from exc
    con.execute("USE capture")


def _read_only_default(con: duckdb.DuckDBPyConnection) -> None:
    """Make an empty read-only database the default one (Parquet and live snapshots live in TEMP)."""
    with tempfile.TemporaryDirectory(prefix="workbench-notebook-") as tmp:
        empty = Path(tmp) / "empty.duckdb"
        duckdb.connect(str(empty)).close()
        _attach_read_only(con, empty)  # the open file survives its directory's removal


def _database_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    from workbench.store.reader import RemoteReader, open_reader
    from workbench.store.readonly import ReadLimits

    reader = open_reader(path, ReadLimits(max_result_bytes=SNAPSHOT_PAGE_BYTES))
    if isinstance(reader, RemoteReader):
        # The writer holds the file: snapshot through its read service, a page of rows at a time
        # (each answer stays under the service's result cap).
        _read_only_default(con)
        for table in TABLES:
            top = reader.query(f"SELECT coalesce(max(rowid), -1) FROM {table}").column(0)[0].as_py()
            pages = [reader.query(f"SELECT * FROM {table} WHERE rowid >= ? AND rowid < ?",
                                  [start, start + SNAPSHOT_PAGE_ROWS])
                     for start in range(0, int(top) + 1, SNAPSHOT_PAGE_ROWS)]
            if not pages:
                pages = [reader.query(f"SELECT * FROM {table} LIMIT 0")]
            con.register(table, pa.concat_tables(pages))
        return
    reader.close()
    _attach_read_only(con, path)


def _parquet_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    from workbench.store.schema import MIGRATIONS

    _read_only_default(con)
    found = False
    for table in TABLES:
        tdir = path / table
        if tdir.is_dir() and any(tdir.glob("**/*.parquet")):
            glob = "'" + str((tdir / "**" / "*.parquet").resolve()).replace("'", "''") + "'"
            con.execute(f"CREATE TEMP VIEW {table} AS SELECT * EXCLUDE (date) FROM read_parquet({glob}, "
                        "hive_partitioning = true, union_by_name = true, "
                        "hive_types = {'date': DATE, 'session_id': VARCHAR})")
            found = found or table == "frames"
        else:
            # An empty table of the right shape keeps every view valid.
            for stmt in MIGRATIONS[0]:
                if f"EXISTS {table} (" in stmt:
                    con.execute(stmt.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
    if not found:
        raise NotebookError(f"{path}: not a 'workbench export --parquet' directory (no frames/*.parquet)")
