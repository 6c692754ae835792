"""Command: ``workbench export --parquet URI`` and ``--otlp URL``; registers the ``parquet`` import format."""

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
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--parquet", metavar="URI",
                       help="the dataset to ship the sessions to: a folder, s3://bucket/prefix (AWS_* variables and "
                            "files, AWS_ENDPOINT_URL included), gs://, abfs:// (docs/notebooks.md)")
    where.add_argument("--otlp", metavar="URL", nargs="?", const="",
                       help="send the sessions as OpenTelemetry GenAI traces to this OTLP/HTTP endpoint "
                            "(http://HOST:4318 or its /v1/traces URL; without URL: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT "
                            "or OTEL_EXPORTER_OTLP_ENDPOINT; docs/otel.md)")
    p.add_argument("--session", action="append", default=[], metavar="ID",
                   help="only this session (unique prefix; repeatable); default: all")
    p.add_argument("--all", action="store_true", help="every session (the default when no --session is given)")
    p.add_argument("--since", metavar="WHEN",
                   help="--otlp: only sessions started since WHEN (an ISO date or time, or an age: 30m, 24h, 7d)")
    p.add_argument("--header", action="append", default=[], metavar="K=V",
                   help="--otlp: an HTTP header for the backend (repeatable; e.g. authorization=Bearer …); "
                        "default: OTEL_EXPORTER_OTLP_HEADERS")
    p.add_argument("--content", action="store_true",
                   help="--otlp: include prompts and tool arguments/results (opt-in, as the GenAI conventions say; "
                        "what the database holds, already redacted)")
    add_json_arg(p, "print what was written as one JSON object (directory, sessions, unchanged, skipped_open, "
                    "rows per table)")
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


def parse_headers(items: list[str], option: str = "--header") -> dict[str, str]:
    """``K=V`` options as a header mapping (``CliError`` naming the option for anything else)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"{option} {item!r}: expected KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def cmd_export(args: argparse.Namespace) -> int:
    if args.otlp is not None:
        return _export_otlp(args)
    if args.since or args.header or args.content:
        raise CliError("--since, --header and --content go with --otlp")
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
        print(json.dumps({"directory": str(res.directory), "sessions": list(res.sessions),
                          "unchanged": list(res.unchanged_sessions), "skipped_open": list(res.skipped_open),
                          "rows": dict(res.rows)}))
        return 0
    rows = ", ".join(f"{t} {n}" for t, n in res.rows.items())
    notes = "".join([f"; {len(res.unchanged_sessions)} already there, unchanged" if res.unchanged_sessions else "",
                     f"; {len(res.skipped_open)} still open, not shipped" if res.skipped_open else ""])
    print(f"wrote {res.directory}: {len(res.sessions)} session(s){notes}; rows: {rows}")
    return 0


def _export_otlp(args: argparse.Namespace) -> int:
    # deferred: the OpenTelemetry SDK loads only for an OTLP export
    from workbench.otel.export import export_sessions, parse_since
    from workbench.otel.sender import OtlpError, Sender
    from workbench.store import otel_reads

    headers = parse_headers(args.header)
    since = parse_since(args.since) if args.since else None
    if not args.session and not Path(args.db).exists():
        raise CliError(f"--db {args.db}: no such capture database")
    try:
        sender = Sender(args.otlp or None, headers)
    except OtlpError as exc:
        raise CliError(str(exc)) from exc
    reader = reader_from(args)
    try:
        if args.session:
            chosen = [resolve_session(reader, s) for s in args.session]
        else:
            chosen = otel_reads.sessions_since(reader, since)
        try:
            done = export_sessions(reader, chosen, sender, content=args.content)
        except OtlpError as exc:
            raise CliError(str(exc)) from exc
    finally:
        reader.close()
        sender.close()
    if args.json:
        print(json.dumps({"endpoint": sender.endpoint, "sessions": done.sessions, "spans": done.spans,
                          "skipped_open": done.skipped_open}))
        return 0
    print(f"sent {len(done.sessions)} session(s) as {done.spans} span(s) to {sender.endpoint or 'the OTEL_EXPORTER_OTLP_* endpoint'}"
          + (f"; {len(done.skipped_open)} still open, not sent" if done.skipped_open else ""))
    return 0
