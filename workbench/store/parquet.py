"""The SQL of the Parquet export and import (``workbench.export.parquet`` has the files' layout,
the manifest and the checks): tables copied out to a Hive-partitioned directory, and what is new
of such a directory copied in, in one transaction.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from workbench.errors import WorkbenchError
from workbench.store.db import Store
from workbench.store.queries import Reader, session_ids
from workbench.store.recorder import gate_stored

TABLES = ("sessions", "frames", "blobs", "tool_calls", "findings")


class ParquetError(WorkbenchError):
    """Export or import failed; the message names the directory/file."""


@dataclass
class ParquetResult:
    directory: str
    rows: dict[str, int] = field(default_factory=dict)
    sessions: list[str] = field(default_factory=list)
    skipped_sessions: list[str] = field(default_factory=list)  # stored already, nothing new
    updated_sessions: list[str] = field(default_factory=list)  # stored already, new frames added
    skipped_open: list[str] = field(default_factory=list)  # export: still open (status 'open'), not shipped
    unchanged_sessions: list[str] = field(default_factory=list)  # export: in the dataset already, same content


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _session_dates(sessions: Sequence[str] | None, skip_open: bool) -> str:
    # a session a capture is still recording is never exported: it would ship half a session
    conds = ["coalesce(s.status, '') <> 'open'"] if skip_open else []
    if sessions is not None:
        conds.append("s.session_id IN (SELECT unnest($sids))")
    where = ("WHERE " + " AND ".join(conds)) if conds else ""
    return f"""SELECT s.session_id,
                      CAST(coalesce(s.started_at,
                                    (SELECT min(ts) FROM frames f WHERE f.session_id = s.session_id),
                                    current_timestamp) AS DATE) AS date
               FROM sessions s {where}"""


def copy_out(con: duckdb.DuckDBPyConnection, lock: Any, out: Path, sessions: Sequence[str] | None,
             db_name: str, *, skip_open: bool = False) -> ParquetResult:
    """The tables' rows (all sessions, or ``sessions``) of the database ``con`` reads, as Parquet
    files under ``out`` partitioned by date and session; ``lock`` serialises use of ``con``.
    ``skip_open``: the database is being recorded, so its sessions with status ``open`` are still
    open and left out (listed in ``skipped_open``); in a database nobody records, a session left
    ``open`` lost its writer and is as whole as it will get (``analysis.engine.session_final``)."""
    res = ParquetResult(str(out))
    params: dict[str, Any] = {"sids": list(sessions)} if sessions is not None else {}
    with lock:
        cur = con.cursor()
        try:
            dates = _session_dates(sessions, skip_open)
            res.sessions = [str(r[0]) for r in cur.execute(f"SELECT session_id FROM ({dates}) ORDER BY 1",
                                                           params or None).fetchall()]
            if skip_open:
                chosen = " AND session_id IN (SELECT unnest($sids))" if sessions is not None else ""
                res.skipped_open = [str(r[0]) for r in cur.execute(
                    f"SELECT session_id FROM sessions WHERE status = 'open'{chosen} ORDER BY 1",
                    params or None).fetchall()]
            for table in TABLES:
                # in a stable order, so that the same rows give the same file bytes (the dataset's
                # content hash, workbench.export.dataset): frames by their key, the small tables wholly
                order = "t.session_id, t.seq" if table == "frames" else "ALL"
                src = f"""SELECT t.*, d.date FROM {table} t JOIN ({dates}) d USING (session_id) ORDER BY {order}"""
                n = cur.execute(f"SELECT count(*) FROM ({src})", params or None).fetchone()
                count = int(n[0]) if n else 0
                res.rows[table] = count
                if not count:
                    continue
                target = (out / table).resolve()
                cur.execute(f"COPY ({src}) TO {_sql_str(str(target))} (FORMAT PARQUET, "
                            f"PARTITION_BY (date, session_id), OVERWRITE_OR_IGNORE, "
                            f"FILENAME_PATTERN 'part-{{i}}')", params or None)
        except duckdb.Error as exc:
            raise ParquetError(f"{db_name} → {out}: {exc}") from exc
        finally:
            cur.close()
    return res


def copy_out_live(reader: Reader, out: Path, sessions: Sequence[str] | None) -> ParquetResult:
    """A capture in progress: fetch through the read service, write from an in-memory DuckDB."""
    sids = list(sessions) if sessions is not None else session_ids(reader)
    con = duckdb.connect(":memory:")
    try:
        for table in TABLES:
            arrow = reader.query(f"SELECT * FROM {table} WHERE session_id IN (SELECT unnest(?))", [sids])
            con.register(f"_in_{table}", arrow)
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM _in_{table}")
            con.unregister(f"_in_{table}")
        return copy_out(con, threading.RLock(), out, sids, reader.path + " (live)", skip_open=True)
    finally:
        con.close()


# import ------------------------------------------------------------------------------------------

def _source(table_dir: Path) -> str:
    glob = _sql_str(str(table_dir / "**" / "*.parquet"))
    return (f"read_parquet({glob}, hive_partitioning = true, union_by_name = true, "
            f"hive_types = {{'date': DATE, 'session_id': VARCHAR}})")


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [str(r[0]) for r in con.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = ? AND table_schema = 'main' "
        "ORDER BY ordinal_position", [table]).fetchall()]


def _export_columns(con: duckdb.DuckDBPyConnection, source: str) -> set[str]:
    return {str(r[0]) for r in con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()}


def copy_in(src: Path, store: Store, present: set[str], only: set[str] | None = None) -> ParquetResult:
    """What is new of the export directory ``src`` (holding the tables ``present``) into ``store``,
    in one transaction (``workbench.export.parquet.import_parquet`` says what counts as new);
    ``only``: the sessions to consider (a dataset's committed ones), default all."""
    res = ParquetResult(str(src))
    with store.lock:
        con = store.con
        try:
            table_sessions = "sessions" if "sessions" in present else "frames"
            found = [str(r[0]) for r in con.execute(
                f"SELECT DISTINCT session_id FROM {_source(src / table_sessions)} ORDER BY 1").fetchall()]
            if only is not None:
                found = [s for s in found if s in only]
            existing = {str(r[0]) for r in con.execute(
                "SELECT session_id FROM sessions WHERE session_id IN (SELECT unnest(?))", [found]).fetchall()}
            new_rows = ""
            grown: dict[str, int] = {}
            if "frames" in present:
                frames_src = _source(src / "frames")
                has_key = "source_key" in _export_columns(con, frames_src)
                # frames not stored yet, by row key (and by source identity where the export has one)
                new_rows = (f"FROM {frames_src} p ANTI JOIN frames f ON f.session_id = p.session_id AND f.seq = p.seq "
                            + ("ANTI JOIN (SELECT source_key FROM frames WHERE source_key IS NOT NULL) k "
                               "ON k.source_key = p.source_key " if has_key else "")
                            + "WHERE p.session_id IN (SELECT unnest($sids))")
                grown = {str(r[0]): int(r[1]) for r in con.execute(
                    f"SELECT p.session_id, count(*) {new_rows} GROUP BY 1", {"sids": found}).fetchall()}
            res.sessions = [s for s in found if s not in existing]
            res.updated_sessions = [s for s in found if s in existing and s in grown]
            res.skipped_sessions = [s for s in found if s in existing and s not in grown]
            if not res.sessions and not res.updated_sessions:
                return res
            replace = res.sessions + res.updated_sessions
            # One transaction: an export is imported wholly or not at all.
            con.execute("BEGIN")
            for table in TABLES:
                if table not in present:
                    res.rows[table] = 0
                    continue
                source = _source(src / table)
                cols = [c for c in _columns(con, table) if c in _export_columns(con, source)]
                collist = ", ".join(cols)
                if table == "frames":
                    row = con.execute(f"INSERT INTO frames ({collist}) SELECT {', '.join('p.' + c for c in cols)} "
                                      f"{new_rows}", {"sids": replace}).fetchone()
                else:
                    if table == "sessions":
                        # keep a label given in this database when the export has none
                        labels = dict(con.execute("SELECT session_id, label FROM sessions WHERE session_id IN "
                                                  "(SELECT unnest(?)) AND label IS NOT NULL",
                                                  [res.updated_sessions]).fetchall())
                    con.execute(f"DELETE FROM {table} WHERE session_id IN (SELECT unnest(?))", [res.updated_sessions])
                    row = con.execute(
                        f"INSERT INTO {table} ({collist}) SELECT {collist} FROM {source} "
                        f"WHERE session_id IN (SELECT unnest(?))", [replace]).fetchone()
                    if table == "sessions" and labels:
                        for sid, label in labels.items():
                            con.execute("UPDATE sessions SET label = coalesce(label, ?) WHERE session_id = ?",
                                        [label, sid])
                res.rows[table] = int(row[0]) if row else 0
            if "sessions" not in present:
                # Frames written by another engine without a sessions table: derive the rows.
                con.execute("DELETE FROM sessions WHERE session_id IN (SELECT unnest(?))", [res.updated_sessions])
                con.execute(
                    "INSERT INTO sessions (session_id, source, transport, started_at, ended_at, frame_count, "
                    "status) SELECT session_id, 'parquet', any_value(transport), min(ts), max(ts), count(*), "
                    "'complete' FROM frames WHERE session_id IN (SELECT unnest(?)) GROUP BY session_id", [replace])
            # copied by SQL for speed: the write gate passes over what may hold a credential
            gate_stored(store, replace)
            con.execute("COMMIT")
        except duckdb.Error as exc:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise ParquetError(f"{src}: {exc}") from exc
    return res
