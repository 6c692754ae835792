"""``workbench web [--db PATH] [--port N] [--follow]``: the TUI in a browser."""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from pathlib import Path

from workbench.commands.common import add_db_arg, add_proto_arg
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.store.reader import sidecar_path

DEFAULT_PORT = 8765


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "web")
    add_db_arg(p)
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"listen port (default {DEFAULT_PORT}; 0 = a free port)")
    p.add_argument("--host", default="127.0.0.1",
                   help="listen address (default 127.0.0.1; anything else exposes your captures)")
    p.add_argument("--follow", action="store_true",
                   help="show new sessions, frames and findings of a capture in progress as they arrive")
    p.add_argument("--poll", type=float, default=0.5, metavar="SECONDS",
                   help="how often --follow looks for new data (default 0.5)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept requests whose Host is NAME (repeatable); by default only loopback "
                        "names and addresses are accepted (DNS rebinding)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="also accept requests from pages of this origin (repeatable); by default only the "
                        "server's own page")
    p.add_argument("--max-sessions", type=int, default=8, metavar="N",
                   help="at most N pages open at once, each runs a TUI process (default 8)")
    add_proto_arg(p)
    p.set_defaults(func=cmd_web)


def child_command(db: Path, follow: bool, poll: float, proto: list[str]) -> str:
    """The shell command textual-serve runs for each page (it uses a shell, so everything is quoted)."""
    cmd = [sys.executable, "-m", "workbench.web.child", "--db", str(db.resolve()), "--poll", str(poll)]
    if follow:
        cmd.append("--follow")
    for p in proto:
        cmd += ["--proto", str(Path(p).resolve())]
    return shlex.join(cmd)


def cmd_web(args: argparse.Namespace) -> int:
    db = Path(args.db)
    if not db.exists() and not sidecar_path(db).exists() and not args.follow:
        raise CliError(f"{db}: no such capture database (give one with --db; --follow waits for a capture)")
    if args.poll <= 0:
        raise CliError(f"--poll must be positive, not {args.poll}")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port must be 0…65535, not {args.port}")
    if args.max_sessions < 1:
        raise CliError(f"--max-sessions must be at least 1, not {args.max_sessions}")
    if db.exists():
        # A damaged file is a plain error naming it now, not a broken page later.
        from workbench.tui.data import TuiData

        data = TuiData(db)
        try:
            data.sessions()
        finally:
            data.close()

    # the web server (textual-serve) loads only when serving
    from workbench.web.server import WebConfig, serve

    config = WebConfig(child_command(db, args.follow, args.poll, args.proto), host=args.host, port=args.port,
                       title=f"workbench — {db.name}", allow_hosts=tuple(args.allow_host),
                       allow_origins=tuple(args.allow_origin), max_sessions=args.max_sessions)

    def ready(url: str) -> None:
        print(url, flush=True)
        print(f"serving {db} (open the URL in a browser; Ctrl-C stops)", file=sys.stderr, flush=True)

    try:
        asyncio.run(serve(config, ready))
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc
    return 0
