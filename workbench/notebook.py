"""Notebook helper: ``connect(db)`` → a DuckDB connection with the capture's tables and handy views.

::

    from workbench.notebook import connect, demo_db
    con = connect()                   # the CLI's database: $WORKBENCH_DB, else captures/workbench.duckdb
                                      # in the nearest captures/ folder from here up (workbench.store.paths)
    con = connect(demo_db())          # what the shipped notebooks read: captures/demo.duckdb, same rule
    con.sql("FROM v_heartbeat_gaps").df()   # pandas DataFrame (DuckDB's FROM-first SQL: all columns)
    session_overview(con)             # sessions with their label and top finding (root cause first)
    printable(session_overview(con))  # the same table to look at: control characters shown escaped

The connection is a private in-memory DuckDB. It is read-only for real (``workbench.store.readonly``):
its default database is read-only, so creating a table, ``INSERT`` and ``DELETE`` are refused, SQL has no
file or network access (except the Parquet directory being read) and settings are locked. Notebooks
create their own scratch objects with ``CREATE TEMP TABLE`` / ``CREATE TEMP VIEW``:

The SQL of the views and of each source is in ``workbench.store.notebook_db``:

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

from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

if TYPE_CHECKING:
    import pandas as pd

from workbench.errors import WorkbenchError
from workbench.overview import top_findings
from workbench.store import notebook_db, paths
from workbench.store.notebook_db import FAMILY_SQL, VIEWS
from workbench.store.queries import finding_rows
from workbench.store.reader import ConnectionReader, RemoteReader, open_reader
from workbench.store.readonly import ReadLimits, confine
from workbench.textsafe import escape

__all__ = ["DEFAULT_NOTEBOOK_DB", "FAMILY_SQL", "TABLES", "VIEWS", "NotebookError", "connect", "default_db", "demo_db",
           "printable", "session_overview"]

DEFAULT_NOTEBOOK_DB = "captures/demo.duckdb"  # what `workbench demo` writes; demo_db() finds it from any folder
TABLES = ("sessions", "frames", "blobs", "tool_calls", "findings")
# A live snapshot is fetched this many rows (and at most this many bytes) per request.
SNAPSHOT_PAGE_ROWS = 20_000
SNAPSHOT_PAGE_BYTES = 1024 * 1024 * 1024

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
        notebook_db.create_views(con)
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
    df = notebook_db.session_counts(con)
    top = top_findings(finding_rows(ConnectionReader(con)))
    df["top_finding"] = [f.code if (f := top.get(sid)) is not None else None for sid in df.session_id]
    df["top_finding_message"] = [f.message if (f := top.get(sid)) is not None else None for sid in df.session_id]
    return df


def printable(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` to look at: a copy whose text cells (and column names) show control characters as
    visible escapes, the way ``workbench`` commands print them (``workbench.textsafe``). A label,
    tool name or text delta holding ESC, a bare CR or U+202E would otherwise retitle the terminal
    of a notebook run in one, or read as another name in the notebook's HTML table. ``df`` itself
    keeps the exact values (compare, filter and export those)."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object or str(out[col].dtype) in ("string", "str"):
            out[col] = out[col].map(lambda v: escape(v) if isinstance(v, str) else v)
    out.columns = [escape(c) if isinstance(c, str) else c for c in out.columns]
    return out


def _attach_read_only(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    try:
        notebook_db.attach_read_only(con, path)
    except duckdb.Error as exc:
        raise NotebookError(f"{path}: cannot open the capture database: {exc}") from exc


def _read_only_default(con: duckdb.DuckDBPyConnection) -> None:
    try:
        notebook_db.read_only_default(con)
    except duckdb.Error as exc:
        raise NotebookError(f"cannot create the notebook's empty default database: {exc}") from exc


def _database_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    reader = open_reader(path, ReadLimits(max_result_bytes=SNAPSHOT_PAGE_BYTES))
    if isinstance(reader, RemoteReader):
        # The writer holds the file: snapshot through its read service (call connect again to refresh).
        _read_only_default(con)
        notebook_db.snapshot_tables(con, reader, TABLES, SNAPSHOT_PAGE_ROWS)
        return
    reader.close()
    _attach_read_only(con, path)


def _parquet_tables(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    _read_only_default(con)
    if not notebook_db.parquet_tables(con, path, TABLES):
        raise NotebookError(f"{path}: not a 'workbench export --parquet' directory (no frames/*.parquet)")
