"""Imports: files recorded elsewhere become sessions and frames in the capture database.

Formats are plug-ins in ``IMPORTERS``: each has a ``detect(path, head) -> bool`` (``head`` = the
first 64 KiB of a file, ``b""`` for a directory) and a ``run(ctx) -> ImportResult``. Built-ins:
``flow`` (mitmproxy ``-w`` files), ``har``, ``ndjson`` (``cursor-agent --output-format
stream-json``) and ``pcap`` (pcap/pcapng packet captures, decrypted with a TLS key log by tshark).
Another part of the workbench adds a format without touching the CLI::

    from workbench.ingest import register_importer
    register_importer("parquet", detect=is_parquet_export, run=import_parquet_export)

Built-ins are imported lazily so that ``import workbench.ingest`` does not pull in mitmproxy.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.errors import WorkbenchError
from workbench.ingest.progress import Progress
from workbench.store.queries import sessions_of_file_hash
from workbench.wire.inflate import InflateBudget, use_budget

if TYPE_CHECKING:
    from workbench.decode.classify import Decoder
    from workbench.store.db import Store

HEAD_BYTES = 64 * 1024


class IngestError(WorkbenchError):
    """A file cannot be imported; the message names the file (and line or entry)."""


@dataclass
class ImportResult:
    file: str
    format: str
    sessions: int = 0
    frames: int = 0
    session_ids: list[str] = field(default_factory=list)
    # "2 flows without bodies: streamed" style notes for the summary line
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None
    # sessions (and their frames) of this file that an earlier import already stored
    skipped_sessions: int = 0
    skipped_frames: int = 0
    # connections whose traffic could not be decrypted (packet captures without their keys):
    # reported, nothing stored for them; ``workbench import`` exits 1 when there are any
    undecryptable: int = 0

    def summary_line(self) -> str:
        if self.skipped:
            return f"skipped {self.file}: {self.skipped}"
        if not self.sessions and not self.frames and self.skipped_sessions:
            ss = "" if self.skipped_sessions == 1 else "s"
            fs = "" if self.skipped_frames == 1 else "s"
            frames = f", {self.skipped_frames} frame{fs}" if self.skipped_frames else ""
            return f"skipped {self.file}: already imported ({self.skipped_sessions} session{ss}{frames})"
        s = "" if self.sessions == 1 else "s"
        f = "" if self.frames == 1 else "s"
        line = f"imported {self.file}: {self.sessions} session{s}, {self.frames} frame{f}"
        if self.notes:
            line += " (" + "; ".join(self.notes) + ")"
        return line


@dataclass
class ImportContext:
    """What an importer gets: the file, the writer, a decoder, progress and a warning sink."""

    path: Path
    store: Store
    progress: Progress
    warn: Callable[[str], None]
    decoder_factory: Callable[[], Decoder]
    file_sha256: str = ""
    # format-specific inputs from the command line, e.g. {"keylog": Path} for packet captures
    options: dict[str, Any] = field(default_factory=dict)
    # ``analysis.ahead.FindingsAhead``: the sessions an importer writes while it still reads (a
    # packet capture) are handed to it, analysed when the importer has time to spare
    findings: Any = None
    _decoder: Decoder | None = None

    @property
    def decoder(self) -> Decoder:
        if self._decoder is None:
            self._decoder = self.decoder_factory()
        return self._decoder


Detect = Callable[[Path, bytes], bool]
Run = Callable[[ImportContext], ImportResult]


@dataclass
class Importer:
    name: str
    detect: Detect
    run: Run


IMPORTERS: dict[str, Importer] = {}


def register_importer(name: str, detect: Detect, run: Run) -> None:
    """Add (or replace) a format; ``workbench import --format NAME`` and auto-detection see it."""
    IMPORTERS[name] = Importer(name, detect, run)


def _lazy(module: str, attr: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        return getattr(importlib.import_module(module), attr)(*args)

    call.__name__ = f"{module}.{attr}"
    return call


register_importer("flow", _lazy("workbench.ingest.flowfile", "detect"),
                  _lazy("workbench.ingest.flowfile", "run_import"))
register_importer("har", _lazy("workbench.ingest.har", "detect"), _lazy("workbench.ingest.har", "run_import"))
register_importer("ndjson", _lazy("workbench.ingest.ndjson", "detect"),
                  _lazy("workbench.ingest.ndjson", "run_import"))
register_importer("pcap", _lazy("workbench.ingest.pcap", "detect"), _lazy("workbench.ingest.pcap", "run_import"))


def open_store(db: str | Path) -> Store:
    """The writer for an import or a run.

    The checkpoint settles the connection before the first Arrow insert: stores of the first
    skeleton left the migration's version query half-fetched when reopening a database, and
    DuckDB then refused the insert.
    """
    # this package is light (the CLI lists importers from it): DuckDB loads to import
    from workbench.store.db import Store

    store = Store(db)
    store.checkpoint()
    return store


def read_head(path: Path) -> bytes:
    if path.is_dir():
        return b""
    try:
        with path.open("rb") as fh:
            return fh.read(HEAD_BYTES)
    except OSError as exc:
        raise IngestError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def detect_format(path: Path) -> str:
    if not path.exists():
        raise IngestError(f"{path}: no such file")
    head = read_head(path)
    for imp in IMPORTERS.values():
        if imp.detect(path, head):
            return imp.name
    what = "an empty file" if not head and not path.is_dir() else "not a recognised format"
    raise IngestError(f"{path}: {what} (expected a mitmproxy flow file, a HAR file, cursor-agent "
                      f"stream-json NDJSON or a pcap/pcapng packet capture; formats: {', '.join(IMPORTERS)}; or pass --format)")


def file_sha256(path: Path) -> str:
    if path.is_dir():
        return ""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def already_imported(store: Store, sha: str) -> list[str]:
    """Sessions an import by a workbench older than schema 3 made from the same file content.

    Those frames carry no ``source_key`` (HAR imports could not be given one afterwards), so the
    file's hash is all that recognises them. Newer imports are recognised unit by unit.
    """
    if not sha:
        return []
    return sessions_of_file_hash(store, sha)


def import_file(path: str | Path, store: Store, fmt: str = "auto", *,
                decoder_factory: Callable[[], Decoder] | None = None,
                progress: Progress | None = None,
                warn: Callable[[str], None] | None = None,
                inflate: InflateBudget | None = None,
                options: dict[str, Any] | None = None, findings: Any = None) -> ImportResult:
    """Import one file (or directory, for plug-in formats) into ``store``.

    Gzip frames are inflated within ``inflate`` (default: ``InflateBudget.for_import()``).
    ``options`` are format-specific (``{"keylog": PATH}`` for packet captures). ``findings``: a
    ``workbench.analysis.ahead.FindingsAhead`` for the sessions written before the import ends.
    """
    p = Path(path)
    if fmt == "auto":
        fmt = detect_format(p)
    elif fmt not in IMPORTERS:
        raise IngestError(f"unknown format {fmt!r} (known: {', '.join(IMPORTERS)})")
    elif not p.exists():
        raise IngestError(f"{p}: no such file")
    if decoder_factory is None:
        # this package is light (the CLI lists importers from it): the schema loads to import
        from workbench.decode.classify import default_decoder

        decoder_factory = default_decoder
    sha = file_sha256(p)
    earlier = already_imported(store, sha)
    if earlier:
        return ImportResult(str(p), fmt, skipped=f"already imported (same content, by an earlier workbench) as "
                            f"session {', '.join(earlier[:3])}{'…' if len(earlier) > 3 else ''}")
    ctx = ImportContext(path=p, store=store, progress=progress or Progress(str(p), enabled=False),
                        warn=warn or (lambda _msg: None), decoder_factory=decoder_factory, file_sha256=sha,
                        options=dict(options or {}), findings=findings)
    with use_budget(inflate or InflateBudget.for_import()):
        return IMPORTERS[fmt].run(ctx)


__all__ = ["IMPORTERS", "ImportContext", "ImportResult", "IngestError", "Progress", "already_imported",
           "detect_format", "import_file", "open_store", "register_importer"]
