"""A dataset: the Parquet layout of ``export --parquet`` where it lies — a local folder, ``s3://bucket/prefix``
(AWS S3 and S3-compatible stores; endpoint and credentials from the standard AWS variables and files,
``AWS_ENDPOINT_URL`` included), ``gs://`` and ``abfs://``, all through pyarrow's filesystems.

A session is **committed** when its manifest ``_sessions/session_id=<id>.json`` exists: the manifest is
written after the session's table files, so a reader that counts only sessions with a manifest never
sees half a session, and a killed export leaves nothing such a reader counts. The dataset-level
``_workbench.json`` is written once, when absent, and never rewritten (several hosts may export into
one dataset at once; each writes only its own sessions' paths).
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from workbench.store.parquet import TABLES, ParquetError
from workbench.store.schema import SCHEMA_VERSION

MANIFEST = "_workbench.json"
SESSIONS_DIR = "_sessions"
FORMAT = "workbench-parquet"
VERSION = 1
LAYOUT = "<table>/date=YYYY-MM-DD/session_id=<id>/part-0.parquet"

# scheme://… is a URI for pyarrow; "s3:bucket" or "s3:/bucket" is a typo, not a folder named "s3:"
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCHEME_TYPO = re.compile(r"^(s3|gs|gcs|abfs|abfss|az|hdfs|file):", re.IGNORECASE)


@dataclass
class Dataset:
    """Where a dataset lies: ``fs`` and the ``root`` path inside it (``local``: the folder, if local)."""

    uri: str
    fs: pafs.FileSystem
    root: str
    local: Path | None

    def path(self, rel: str) -> str:
        return f"{self.root.rstrip('/')}/{rel}" if self.root else rel

    def read_json(self, rel: str) -> dict[str, Any] | None:
        """The JSON document at ``rel``, or None when there is none (``ParquetError`` when unreadable)."""
        where = self.path(rel)
        try:
            if self.fs.get_file_info(where).type == pafs.FileType.NotFound:
                return None
            with self.fs.open_input_stream(where) as f:
                data = f.read()
        except (OSError, pa.ArrowException) as exc:
            raise ParquetError(f"{self.uri}: cannot read {rel}: {exc}") from exc
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise ParquetError(f"{self.uri}: {rel} is not JSON ({exc})") from exc
        if not isinstance(doc, dict):
            raise ParquetError(f"{self.uri}: {rel} is not a JSON object")
        return doc

    def write_bytes(self, rel: str, data: bytes) -> None:
        """Write ``data`` at ``rel`` so that a reader sees all of it or nothing (an object store's PUT
        is whole; a local file is written aside and renamed)."""
        where = self.path(rel)
        parent = where.rsplit("/", 1)[0]
        if self.local is not None:
            self.fs.create_dir(parent, recursive=True)
            aside = f"{parent}/.tmp-{uuid.uuid4().hex}"
            with self.fs.open_output_stream(aside) as f:
                f.write(data)
            self.fs.move(aside, where)
        else:
            with self.fs.open_output_stream(where) as f:
                f.write(data)


def is_uri(target: str) -> bool:
    return bool(_URI.match(target)) and not target.lower().startswith("file://")


def open_dataset(target: str | Path) -> Dataset:
    """The dataset at ``target`` (a folder or a URI), checked reachable: ``ParquetError`` naming it
    when it cannot be reached, its bucket does not exist or is not ours to read, or it is a folder
    that cannot be created. Nothing is written here but a local folder."""
    text = str(target)
    if is_uri(text):
        try:
            fs, root = pafs.FileSystem.from_uri(text)
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise ParquetError(f"{text}: not a dataset URI pyarrow can open ({exc})") from exc
        ds = Dataset(text, fs, root.rstrip("/"), None)
        _check_reachable(ds)
        return ds
    if text.lower().startswith("file://"):
        text = text[len("file://"):]
    elif _SCHEME_TYPO.match(text):
        raise ParquetError(f"{text}: not a URI (expected scheme://bucket/prefix) nor a folder")
    out = Path(text).expanduser()
    if out.exists() and not out.is_dir():
        raise ParquetError(f"{out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ParquetError(f"{out}: cannot create directory: {exc.strerror or exc}") from exc
    return Dataset(str(out), pafs.LocalFileSystem(), str(out.resolve()), out.resolve())


def _check_reachable(ds: Dataset) -> None:
    bucket = ds.root.split("/", 1)[0]
    if not bucket:
        raise ParquetError(f"{ds.uri}: no bucket in the URI (expected scheme://bucket/prefix)")
    try:
        info = ds.fs.get_file_info(bucket)
        if info.type == pafs.FileType.NotFound:
            raise ParquetError(f"{ds.uri}: bucket {bucket!r} does not exist (or is not visible with these credentials)")
        # a listing proves the rights to read (a HEAD on the bucket may pass without them)
        ds.fs.get_file_info(pafs.FileSelector(ds.root, allow_not_found=True, recursive=False))
    except (OSError, pa.ArrowException) as exc:
        raise ParquetError(f"{ds.uri}: cannot reach it: {_first_line(exc)}") from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def check_format(ds: Dataset) -> dict[str, Any] | None:
    """The dataset's ``_workbench.json`` (None when it has none), refused when another format or newer."""
    doc = ds.read_json(MANIFEST)
    if doc is None:
        return None
    if doc.get("format") != FORMAT:
        raise ParquetError(f"{ds.uri}: {MANIFEST} is not a workbench Parquet export (format {doc.get('format')!r})")
    try:
        version, schema = int(doc.get("version") or 0), int(doc.get("schema_version") or 0)
    except (TypeError, ValueError) as exc:
        raise ParquetError(f"{ds.uri}: {MANIFEST}: unreadable version ({exc})") from exc
    if version > VERSION or schema > SCHEMA_VERSION:
        raise ParquetError(f"{ds.uri}: written by a newer workbench (format version {version}, schema {schema}; "
                           f"this one reads up to {VERSION}, schema {SCHEMA_VERSION})")
    return doc


def ensure_manifest(ds: Dataset, workbench_version: str) -> None:
    """Write ``_workbench.json`` when the dataset has none; never rewrite one (hosts share it)."""
    if check_format(ds) is not None:
        return
    doc = {"format": FORMAT, "version": VERSION, "schema_version": SCHEMA_VERSION,
           "workbench_version": workbench_version, "layout": LAYOUT, "tables": list(TABLES),
           "sessions": f"{SESSIONS_DIR}/session_id=<id>.json",
           "rule": "a session counts only when its manifest under _sessions/ exists (written after its files)"}
    try:
        ds.write_bytes(MANIFEST, (json.dumps(doc, indent=1) + "\n").encode())
    except (OSError, pa.ArrowException) as exc:
        raise ParquetError(f"{ds.uri}: cannot write {MANIFEST}: {_first_line(exc)}") from exc


def session_manifest_path(session_id: str) -> str:
    return f"{SESSIONS_DIR}/session_id={session_id}.json"


def committed_names(ds: Dataset) -> list[str]:
    """The file names of the session manifests under ``_sessions/`` (one listing)."""
    try:
        infos = ds.fs.get_file_info(pafs.FileSelector(ds.path(SESSIONS_DIR), allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        raise ParquetError(f"{ds.uri}: cannot list {SESSIONS_DIR}/: {_first_line(exc)}") from exc
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.File
                  and i.base_name.startswith("session_id=") and i.base_name.endswith(".json"))


def committed_sessions(ds: Dataset) -> dict[str, dict[str, Any]]:
    """The sessions a reader counts (those with a manifest), each with its manifest."""
    out: dict[str, dict[str, Any]] = {}
    for name in committed_names(ds):
        doc = ds.read_json(f"{SESSIONS_DIR}/{name}")
        if doc is not None and doc.get("session_id"):
            out[str(doc["session_id"])] = doc
    return out


def content_hash(files: list[dict[str, Any]]) -> str:
    """One hash of a session's files (their paths and bytes' SHA-256): equal hashes, equal session."""
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: str(f["path"])):
        h.update(f"{f['path']}\0{f['sha256']}\n".encode())
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
