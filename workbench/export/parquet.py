"""Parquet export and import: a Hive-partitioned dataset any Parquet engine can query, where it lies
(a local folder or a URI: ``workbench.export.dataset``).

Layout (docs/notebooks.md "Parquet export")::

    DATASET/_workbench.json                                      format, versions (written once, when absent)
    DATASET/<table>/date=YYYY-MM-DD/session_id=<id>/part-0.parquet
    DATASET/_sessions/session_id=<id>.json                       per-session manifest, written last

for ``sessions``, ``frames``, ``blobs``, ``tool_calls`` and ``findings``. ``date`` is the day the
session started (UTC), so one session's rows stay together under one date even when it runs past
midnight. The partition columns live in the directory names only (as Hive/Spark expect), and
every other column keeps the database's type.

An export writes the tables with DuckDB into a staging folder, then ships each session: its files
first, its manifest (files, row counts, content hash, versions, origin) last. A session whose
manifest already has the same content hash is not shipped again; a changed one is replaced.
"""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from workbench import __version__
from workbench.export.dataset import (
    FORMAT,
    MANIFEST,
    VERSION,
    Dataset,
    check_format,
    committed_names,
    committed_sessions,
    content_hash,
    ensure_manifest,
    file_sha256,
    open_dataset,
    session_manifest_path,
)
from workbench.store.db import Store
from workbench.store.parquet import TABLES, ParquetError, ParquetResult, copy_in, copy_out, copy_out_live
from workbench.store.reader import LocalReader, open_reader
from workbench.store.schema import SCHEMA_VERSION

__all__ = ["FORMAT", "MANIFEST", "TABLES", "VERSION", "ParquetError", "ParquetResult", "export_parquet",
           "import_parquet", "is_parquet_export"]


def export_parquet(db: str | Path | Any, target: str | Path, sessions: Sequence[str] | None = None) -> ParquetResult:
    """Ship the sessions (all, or ``sessions``) that are not open into the dataset at ``target``.

    ``db`` is a database path (opened read-only, or through the live read service when a capture
    holds it) or an open ``Store``. ``ParquetError`` naming the target when it cannot be reached,
    has no bucket we may use, or holds a newer format; nothing is written then.
    """
    ds = open_dataset(target)
    check_format(ds)
    staging = _staging(ds)
    try:
        res = _copy_out(db, staging, sessions)
        res.directory = ds.uri
        db_name = db.path if isinstance(db, Store) else str(db)
        ensure_manifest(ds, __version__)
        _ship(ds, staging, res, str(db_name))
    except (OSError, pa.ArrowException) as exc:
        raise ParquetError(f"{ds.uri}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return res


def _staging(ds: Dataset) -> Path:
    # local: beside the tables, so that shipping a file is a rename; its name is no table's, so a
    # reader globbing <table>/** never sees it, even when a killed export leaves it behind
    if ds.local is not None:
        path = ds.local / f".workbench-staging-{uuid.uuid4().hex}"
        path.mkdir(mode=0o700)
        return path
    return Path(tempfile.mkdtemp(prefix="workbench-export-"))


def _copy_out(db: Any, out: Path, sessions: Sequence[str] | None) -> ParquetResult:
    if isinstance(db, Store):
        return copy_out(db.con, db.lock, out, sessions, db.path)
    # A file reader's SQL may write only under the staging directory (workbench.store.readonly).
    reader = open_reader(db, allow_dir=out.resolve())
    try:
        if isinstance(reader, LocalReader):
            return copy_out(reader.con, threading.RLock(), out, sessions, str(db))
        return copy_out_live(reader, out, sessions)
    finally:
        reader.close()


def _staged_files(staging: Path) -> dict[str, list[Path]]:
    """The staged Parquet files by session (``<table>/date=…/session_id=<id>/part-N.parquet``)."""
    out: dict[str, list[Path]] = {}
    for table in TABLES:
        for p in sorted((staging / table).glob("date=*/session_id=*/*.parquet")):
            out.setdefault(p.parent.name[len("session_id="):], []).append(p)
    return out


def _ship(ds: Dataset, staging: Path, res: ParquetResult, db_name: str) -> None:
    staged = _staged_files(staging)
    # one listing of the manifests there (not a request per session): only those are read
    there = set(committed_names(ds))
    shipped: list[str] = []
    rows = dict.fromkeys(TABLES, 0)
    host = socket.gethostname()
    for sid in res.sessions:
        paths = staged.get(sid, [])
        files = [{"path": p.relative_to(staging).as_posix(), "table": p.relative_to(staging).parts[0],
                  "rows": pq.read_metadata(p).num_rows, "bytes": p.stat().st_size, "sha256": file_sha256(p)}
                 for p in paths]
        digest = content_hash(files)
        manifest_rel = session_manifest_path(sid)
        previous = ds.read_json(manifest_rel) if manifest_rel.rsplit("/", 1)[-1] in there else None
        if previous is not None and previous.get("content_hash") == digest:
            res.unchanged_sessions.append(sid)
            continue
        if previous is not None:
            # uncounted while its files are replaced: a reader sees the old session or the new one
            ds.fs.delete_file(ds.path(manifest_rel))
        origin = _session_origin(staging, paths)  # read before the files move away
        for p, f in zip(paths, files, strict=True):
            _put(ds, p, str(f["path"]))
        doc = {"format": FORMAT, "version": VERSION, "session_id": sid, "content_hash": digest,
               "files": files, "rows": {t: sum(int(f["rows"]) for f in files if f["table"] == t) for t in TABLES},
               "workbench_version": __version__, "schema_version": SCHEMA_VERSION,
               "exported_at": datetime.now(UTC).isoformat(timespec="seconds"),
               "origin": {"hostname": host, "database": db_name, **origin}}
        ds.write_bytes(manifest_rel, (json.dumps(doc, indent=1) + "\n").encode())
        if previous is not None:
            # files the older copy had and this one has not (e.g. no findings any more)
            keep = {str(f["path"]) for f in files}
            for old in previous.get("files") or []:
                rel = str(old.get("path") or "") if isinstance(old, dict) else ""
                if rel and rel not in keep and f"session_id={sid}/" in rel:
                    ds.fs.delete_file(ds.path(rel))
        for f in files:
            rows[str(f["table"])] += int(f["rows"])
        shipped.append(sid)
    res.sessions = shipped
    res.rows = rows


def _put(ds: Dataset, local: Path, rel: str) -> None:
    dest = ds.path(rel)
    if ds.local is not None:
        ds.fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
        ds.fs.move(str(local), dest)  # a rename: the file appears whole
    else:
        pafs.copy_files(str(local), dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=ds.fs)


def _session_origin(staging: Path, paths: list[Path]) -> dict[str, Any]:
    """What the session's own row says of where it came from (client version, model, source)."""
    for p in paths:
        if p.relative_to(staging).parts[0] == "sessions":
            row = pq.read_table(p, columns=["client_version", "model", "source"]).to_pylist()
            if row:
                return {k: row[0].get(k) for k in ("client_version", "model", "source")}
    return {"client_version": None, "model": None, "source": None}


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
    # a dataset with session manifests: only the sessions a reader counts (a killed export's are not)
    only = set(committed_sessions(open_dataset(src))) if (src / "_sessions").is_dir() else None
    return copy_in(src, store, present, only)
