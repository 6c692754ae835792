"""The DuckDB side of ``workbench.notebook``: a read-only in-memory connection holding a capture's
tables and the convenience views the notebooks use (docs/notebooks.md describes every column).

``workbench.notebook.connect`` picks the source (a database file, a capture's live service, a
Parquet export) and turns failures into errors naming the path; the SQL it runs lives here.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import pyarrow as pa

from workbench.protocol import kinds
from workbench.store.queries import Reader
from workbench.store.schema import MIGRATIONS

if TYPE_CHECKING:
    import pandas as pd

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



def create_views(con: duckdb.DuckDBPyConnection) -> None:
    """The convenience views (``VIEWS``) as TEMP views over the tables ``con`` holds."""
    for name, sql in VIEWS.items():
        con.execute(f"CREATE TEMP VIEW {name} AS {sql}")


def attach_read_only(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Make the database file ``path`` the default database of ``con``, read-only (duckdb.Error if not)."""
    literal = "'" + str(path).replace("'", "''") + "'"
    con.execute(f"ATTACH {literal} AS capture (READ_ONLY)")
    con.execute("USE capture")


def read_only_default(con: duckdb.DuckDBPyConnection) -> None:
    """Make an empty read-only database the default one (Parquet and live snapshots live in TEMP)."""
    with tempfile.TemporaryDirectory(prefix="workbench-notebook-") as tmp:
        empty = Path(tmp) / "empty.duckdb"
        duckdb.connect(str(empty)).close()
        attach_read_only(con, empty)  # the open file survives its directory's removal


def snapshot_tables(con: duckdb.DuckDBPyConnection, reader: Reader, tables: Sequence[str], page_rows: int) -> None:
    """Copy ``tables`` through ``reader`` (a capture's live service) into ``con``, a page of
    ``page_rows`` rows at a time (each answer stays under the service's result cap)."""
    for table in tables:
        top = reader.query(f"SELECT coalesce(max(rowid), -1) FROM {table}").column(0)[0].as_py()
        pages = [reader.query(f"SELECT * FROM {table} WHERE rowid >= ? AND rowid < ?", [start, start + page_rows])
                 for start in range(0, int(top) + 1, page_rows)]
        if not pages:
            pages = [reader.query(f"SELECT * FROM {table} LIMIT 0")]
        con.register(table, pa.concat_tables(pages))


def parquet_tables(con: duckdb.DuckDBPyConnection, path: Path, tables: Sequence[str]) -> bool:
    """``tables`` as TEMP views over a ``workbench export --parquet`` directory, queried in place
    (an empty table of the right shape for a table the export lacks). False when it has no frames."""
    found = False
    for table in tables:
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
    return found


def session_counts(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """One row per session (oldest first): id, label, source, transport, status, frames, start and
    how many findings (errors and warnings) and notes are stored for it."""
    return con.sql("""
        SELECT s.session_id, s.label, s.source, s.transport, s.status, s.frame_count, s.started_at,
               (SELECT count(*) FROM findings f WHERE f.session_id = s.session_id
                AND f.severity IN ('error', 'warning')) AS findings,
               (SELECT count(*) FROM findings f WHERE f.session_id = s.session_id
                AND f.severity = 'note') AS notes
        FROM sessions s ORDER BY s.started_at, s.session_id""").df()
