"""``workbench import`` and ``workbench run``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from workbench.commands.common import add_db_arg, add_json_arg, add_proto_arg, decoder_from
from workbench.commands.table import add_command
from workbench.decode.sse import use_sse_event_limit
from workbench.errors import CliError
from workbench.ingest import IMPORTERS, IngestError, Progress, import_file, open_store
from workbench.textsafe import escape_display
from workbench.wire.inflate import MIB, InflateBudget


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "import")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="file or folder to import (format detected from its content; repeatable)")
    add_db_arg(p)
    p.add_argument("--format", default="auto",
                   help=f"auto (default) or one of: {', '.join(IMPORTERS)}")
    add_json_arg(p, "one JSON object per file on stdout: format, sessions, frames, session_ids, notes, "
                        "what was already stored, or the error")
    add_proto_arg(p)
    p.add_argument("--keylog", metavar="KEYS", default=None,
                   help="TLS key log (NSS format: SSLKEYLOGFILE, node --tls-keylog) to decrypt packet captures "
                        "with; read by tshark, never stored")
    for what, default in (("frame", "32"), ("session", "256"), ("import", "512")):
        p.add_argument(f"--inflate-{what}-mb", type=float, default=None, metavar="MB",
                       help=f"inflate gzip frames up to this many MiB per {what} (default {default}); a frame "
                            "past it is stored compressed and inflated when viewed")
    p.add_argument("--sse-event-mb", type=float, default=None, metavar="MB",
                   help="hold up to this many MiB of one server-sent event of a bridge's OpenAI side (default "
                        "16, or $WORKBENCH_SSE_EVENT_MB); an event past it is stored as its size and hash "
                        "(docs/bridge.md)")
    p.set_defaults(func=cmd_import)

    p = add_command(sub, "run")
    add_db_arg(p)
    p.add_argument("--flush-ms", type=int, default=250, help="commit recorded frames at most this far apart")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ARGS",
                   help="the command to run, after --; its stream-json output is recorded")
    p.set_defaults(func=cmd_run)


# sessions written early that wait to be analysed together (``FindingsAhead.due``)
AHEAD_BATCH = 8


def cmd_import(args: argparse.Namespace) -> int:
    # DuckDB loads only when importing
    import duckdb

    # the analysis engine loads only when importing
    from workbench.analysis.ahead import FindingsAhead
    from workbench.analysis.stored import IMPORT_BUDGET_S, refresh_findings

    sizes = {}
    for what in ("frame", "session", "import"):
        value = getattr(args, f"inflate_{what}_mb")
        if value is not None and value <= 0:
            raise CliError(f"--inflate-{what}-mb {value:g}: must be positive")
        sizes[what] = int(value * MIB) if value is not None else None
    if args.sse_event_mb is not None and args.sse_event_mb <= 0:
        raise CliError(f"--sse-event-mb {args.sse_event_mb:g}: must be positive")
    sse_limit = int(args.sse_event_mb * MIB) if args.sse_event_mb is not None else None
    options = {"keylog": args.keylog} if args.keylog else {}
    store = open_store(args.db)
    failed = 0
    undecryptable = 0
    imported: list[str] = []
    # sessions written while an import still reads (a packet capture) are analysed meanwhile
    ahead = FindingsAhead(store, budget_s=IMPORT_BUDGET_S, batch=AHEAD_BATCH)
    try:
        for name in args.files:
            progress = Progress(name, stream=sys.stderr)
            try:
                def warn(msg: str, progress: Progress = progress) -> None:
                    progress.finish()  # a warning gets a line of its own; the progress line comes back
                    # warnings quote the file (header values, ids): through the printer (workbench.textsafe)
                    print(f"workbench import: {escape_display(msg, layout=True)}", file=sys.stderr)

                with use_sse_event_limit(sse_limit):
                    result = import_file(name, store, args.format, decoder_factory=lambda: decoder_from(args),
                                         progress=progress, warn=warn,
                                         inflate=InflateBudget.for_import(sizes["frame"], sizes["session"],
                                                                          sizes["import"]),
                                         options=options, findings=ahead)
            except IngestError as exc:
                failed += 1
                print(f"workbench import: {escape_display(str(exc), layout=True)}", file=sys.stderr)
                if args.json:
                    print(json.dumps({"file": name, "error": str(exc)}), flush=True)
                continue
            except (duckdb.Error, OSError) as exc:
                # Sessions are committed whole, batch by batch: what was written stays, and the same
                # command completes it (already imported units are skipped).
                failed += 1
                progress.finish()
                print(escape_display(f"workbench import: {name}: writing {args.db} failed: {exc}; the sessions "
                                     "written so far are complete, run the same import again to resume"),
                      file=sys.stderr)
                if args.json:
                    print(json.dumps({"file": name, "error": f"writing {args.db} failed: {exc}"}), flush=True)
                continue
            print(json.dumps(dataclasses.asdict(result)) if args.json else escape_display(result.summary_line()),
                  flush=True)
            undecryptable += result.undecryptable
            if result.format != "parquet":  # a Parquet export brings its own findings rows, kept as exported
                imported.extend(result.session_ids)
        # Findings stored with the sessions, so `workbench sessions` shows them without a diagnose run.
        done = refresh_findings(store, imported, budget_s=IMPORT_BUDGET_S, ahead=ahead)
        if len(done) < len(set(imported)) and not args.json:
            print(f"findings stored for {len(done)} of {len(set(imported))} sessions within {IMPORT_BUDGET_S:.0f} s; "
                  f"`workbench diagnose --all --db {args.db}` stores the others", file=sys.stderr)
    finally:
        store.close()
    if failed and len(args.files) == 1:
        return 2
    if failed:
        print(f"workbench import: {failed} of {len(args.files)} files not imported", file=sys.stderr)
        return 2
    if undecryptable:
        print(f"workbench import: {undecryptable} TLS connection{'s' if undecryptable != 1 else ''} undecryptable "
              f"(see above); exit status 1", file=sys.stderr)
        return 1
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    # the recorder (DuckDB) loads only for `workbench run`
    from workbench.ingest.run import run_and_record

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise CliError("no command given (usage: workbench run [--db PATH] -- CMD ARGS…)")
    if args.flush_ms <= 0:
        raise CliError(f"--flush-ms must be positive (got {args.flush_ms})")
    return run_and_record(cmd, args.db, flush_ms=args.flush_ms)
