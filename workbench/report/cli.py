"""``workbench report SESSION… -o FILE.html``: a self-contained HTML report to share."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from workbench.commands.common import add_db_arg, add_json_arg
from workbench.commands.table import add_command
from workbench.errors import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "report")
    p.add_argument("sessions", nargs="+", metavar="SESSION",
                   help="session ids (unique prefixes are enough) in --db, or replay fixture files")
    p.add_argument("-o", "--output", required=True, metavar="FILE.html", help="the HTML file to write")
    add_db_arg(p)
    p.add_argument("--redact", choices=["secrets", "content"], default="secrets",
                   help="'content' also hides prompts, file contents, commands, tool arguments and results, KV "
                        "blobs and model text (default: secrets only)")
    p.add_argument("--max-frames", type=int, default=5000, metavar="N",
                   help="frames in the frame table, each with its tree (default 5000, plus every frame the page links "
                        "to; the pictures show all; the rest are listed by 'workbench frames SESSION --from SEQ')")
    add_json_arg(p, "print what was written as one JSON object")
    p.set_defaults(func=cmd_report)


def cmd_report(args: argparse.Namespace) -> int:
    out = Path(args.output)
    if args.max_frames < 1:
        raise CliError(f"--max-frames {args.max_frames}: must be at least 1")
    if out.is_dir():
        raise CliError(f"-o {out}: is a directory; name the HTML file to write")
    size = write_report(args.sessions, out, db=args.db, redact=args.redact, max_frames=args.max_frames)
    if args.json:
        print(json.dumps({"path": str(out), "bytes": size, "sessions": args.sessions, "redact": args.redact}))
    else:
        print(f"wrote {out} ({size:,} bytes, {len(args.sessions)} session{'s' if len(args.sessions) != 1 else ''})")
    return 0


def report_path(db: str | Path, session_id: str) -> Path:
    """Where the TUI writes a session's report: ``reports/<session>.html`` beside the database."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in session_id)[:120]
    return Path(db).resolve().parent / "reports" / f"{safe}.html"


def write_report(specs: list[str], out: Path, *, db: str | None, redact: str = "secrets",
                 max_frames: int = 5000) -> int:
    """Read each session, render the report and write it; returns its size in bytes."""
    # deferred: the command registry imports this module for `--help`; Jinja2, DuckDB and the decoder load on use
    from workbench.report.build import read_for_report
    from workbench.report.render import render_report
    from workbench.report.session import open_source

    sessions = []
    for spec in specs:
        with open_source(spec, db) as (src, sid):
            sessions.append(read_for_report(src, sid, redact=redact, max_frames=max_frames))
    html = render_report(sessions)
    data = html.encode("utf-8")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    except OSError as exc:
        raise CliError(f"-o {out}: cannot write: {exc.strerror or exc}") from exc
    return len(data)
