"""Parquet export and import: a Hive-partitioned directory any Parquet engine can query.

Layout (docs/notebooks.md "Parquet export")::

    DIR/_workbench.json                                      manifest (format, versions, row counts)
    DIR/<table>/date=YYYY-MM-DD/session_id=<id>/part-0.parquet

for ``sessions``, ``frames``, ``blobs``, ``tool_calls`` and ``findings``. ``date`` is the day the
session started (UTC), so one session's rows stay together under one date even when it runs past
midnight. The partition columns live in the directory names only (as Hive/Spark expect), and
every other column keeps the database's type. Re-exporting a session replaces its files.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workbench.store.db import Store
from workbench.store.parquet import TABLES, ParquetError, ParquetResult, copy_in, copy_out, copy_out_live
from workbench.store.reader import LocalReader, open_reader
from workbench.store.schema import SCHEMA_VERSION

MANIFEST = "_workbench.json"
FORMAT = "workbench-parquet"
VERSION = 1

__all__ = ["FORMAT", "MANIFEST", "TABLES", "VERSION", "ParquetError", "ParquetResult", "export_parquet",
           "import_parquet", "is_parquet_export"]


def export_parquet(db: str | Path | Any, out_dir: str | Path, sessions: Sequence[str] | None = None) -> ParquetResult:
    """Write the tables (all sessions, or ``sessions``) under ``out_dir``.

    ``db`` is a database path (opened read-only, or through the live read service when a capture
    holds it) or an open ``Store``.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ParquetError(f"{out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ParquetError(f"{out}: cannot create directory: {exc.strerror or exc}") from exc
    if isinstance(db, Store):
        res = copy_out(db.con, db.lock, out, sessions, db.path)
    else:
        # A file reader's SQL may write only under the output directory (workbench.store.readonly).
        reader = open_reader(db, allow_dir=out.resolve())
        try:
            if isinstance(reader, LocalReader):
                res = copy_out(reader.con, threading.RLock(), out, sessions, str(db))
            else:
                res = copy_out_live(reader, out, sessions)
        finally:
            reader.close()
    _write_manifest(out, res)
    return res


def _write_manifest(out: Path, res: ParquetResult) -> None:
    path = out / MANIFEST
    previous: dict[str, Any] = {}
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except (OSError, ValueError):
            previous = {}
    exports = list(previous.get("exports") or [])
    exports.append({"at": datetime.now(UTC).isoformat(timespec="seconds"), "sessions": len(res.sessions),
                    "rows": res.rows})
    doc = {"format": FORMAT, "version": VERSION, "schema_version": SCHEMA_VERSION,
           "layout": "<table>/date=YYYY-MM-DD/session_id=<id>/part-0.parquet", "tables": list(TABLES),
           "exports": exports[-50:]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


# import ------------------------------------------------------------------------------------------

def is_parquet_export(path: Path, head: bytes = b"") -> bool:
    if not path.is_dir():
        return False
    if (path / MANIFEST).exists():
        return True
    return (path / "frames").is_dir() and any((path / "frames").glob("**/*.parquet"))


def import_parquet(src_dir: str | Path, store: Store) -> ParquetResult:
    """Load what is new of an export directory into ``store``, in one transaction.

    Identity is the row key: a frame is new when its ``(session_id, seq)`` (and its ``source_key``,
    when it has one) is not stored yet. A session with new frames is written (or, when stored
    already, its row and its blobs/tool_calls/findings are replaced by the export's, which describe
    the longer session); a session with nothing new is skipped. So importing the same export twice,
    or a later export of a session that grew, never duplicates a frame.
    """
    src = Path(src_dir)
    if not src.is_dir():
        raise ParquetError(f"{src}: not a directory")
    manifest = src / MANIFEST
    if manifest.exists():
        try:
            doc = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            raise ParquetError(f"{manifest}: unreadable manifest ({exc})") from exc
        if doc.get("format") != FORMAT:
            raise ParquetError(f"{manifest}: not a workbench Parquet export")
        if int(doc.get("schema_version") or 0) > SCHEMA_VERSION:
            raise ParquetError(f"{manifest}: written by a newer workbench (schema {doc.get('schema_version')} "
                               f"> {SCHEMA_VERSION})")
    if not (src / "sessions").is_dir() and not (src / "frames").is_dir():
        raise ParquetError(f"{src}: no sessions/ or frames/ directory (expected a 'workbench export --parquet' layout)")
    present = {t for t in TABLES if (src / t).is_dir() and any((src / t).glob("**/*.parquet"))}
    return copy_in(src, store, present)
