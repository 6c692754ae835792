"""Command: ``workbench export --parquet DIR``; registers the ``parquet`` import format."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from workbench.commands.common import add_db_arg, add_json_arg, reader_from, resolve_session
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.ingest import ImportResult, IngestError, register_importer


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "export")
    p.add_argument("--parquet", required=True, metavar="DIR", help="output directory")
    p.add_argument("--session", action="append", default=[], metavar="ID",
                   help="only this session (unique prefix; repeatable); default: all")
    add_json_arg(p, "print what was written as one JSON object (directory, sessions, rows per table)")
    add_db_arg(p)
    p.set_defaults(func=cmd_export)
    _register_import_format()


def _register_import_format() -> None:
    register_importer("parquet", _detect, _run_import)


def _detect(path: Path, head: bytes) -> bool:
    from workbench.export.parquet import is_parquet_export  # deferred: pyarrow loads only when tried

    return is_parquet_export(path, head)


def _run_import(ctx: Any) -> Any:
    from workbench.export.parquet import ParquetError, import_parquet  # deferred: pyarrow, when importing one

    try:
        res = import_parquet(ctx.path, ctx.store)
    except ParquetError as exc:
        raise IngestError(str(exc)) from exc
    written = res.sessions + res.updated_sessions
    out = ImportResult(str(ctx.path), "parquet", sessions=len(written), frames=res.rows.get("frames", 0),
                       session_ids=written, skipped_sessions=len(res.skipped_sessions))
    if res.skipped_sessions and written:
        out.notes.append(f"{len(res.skipped_sessions)} session(s) already in the database, skipped")
    if res.updated_sessions:
        out.notes.append(f"{len(res.updated_sessions)} stored session(s) completed with new frames")
    return out


def cmd_export(args: argparse.Namespace) -> int:
    # deferred: duckdb and pyarrow load when exporting, not for `export --help` or `import` of other formats
    from workbench.export.parquet import ParquetError, export_parquet

    sessions = None
    if args.session:
        reader = reader_from(args)
        try:
            sessions = [resolve_session(reader, s) for s in args.session]
        finally:
            reader.close()
    elif not Path(args.db).exists():
        raise CliError(f"--db {args.db}: no such capture database")
    try:
        res = export_parquet(args.db, args.parquet, sessions)
    except ParquetError as exc:
        raise CliError(str(exc)) from exc
    if args.json:
        print(json.dumps({"directory": str(res.directory), "sessions": list(res.sessions), "rows": dict(res.rows)}))
        return 0
    rows = ", ".join(f"{t} {n}" for t, n in res.rows.items())
    print(f"wrote {res.directory}: {len(res.sessions)} session(s); rows: {rows}")
    return 0
