"""``workbench tui [--db PATH] [SESSION] [--follow] [--proto PATH]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workbench.commands.common import add_db_arg, add_proto_arg, decoder_from
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.store.reader import sidecar_path


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "tui")
    p.add_argument("session", nargs="?", help="open this session directly (a unique prefix is enough)")
    add_db_arg(p)
    p.add_argument("--follow", action="store_true",
                   help="show new sessions, frames and findings of a capture in progress as they arrive")
    p.add_argument("--poll", type=float, default=0.5, metavar="SECONDS",
                   help="how often --follow looks for new data (default 0.5)")
    add_proto_arg(p)
    p.set_defaults(func=cmd_tui)


def cmd_tui(args: argparse.Namespace) -> int:
    db = Path(args.db)
    if not db.exists() and not sidecar_path(db).exists():
        raise CliError(f"{db}: no such capture database (give one with --db)")
    if args.poll <= 0:
        raise CliError(f"--poll must be positive, not {args.poll}")
    # Imported here so that other subcommands do not pay for loading Textual.
    from workbench.tui.data import TuiData

    data = TuiData(db, decoder_from(args), transient=args.follow)
    if db.exists():
        # Read the session list before the screen takes over: a damaged file (one that opens but
        # fails on its first real read) is then a plain error naming it, exit 2.
        data.sessions()
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        data.close()
        raise CliError("needs an interactive terminal (stdin and stdout must be a TTY); "
                       "for scripts use 'workbench sessions' / 'workbench frames' / 'workbench sql'")
    from workbench.tui.app import WorkbenchApp  # deferred: Textual loads only once a terminal is there

    session = None
    if args.session:
        session = data.resolve(args.session)
        if session is None:
            raise CliError(f"no single session matches {args.session!r} in {db} "
                           f"(see 'workbench sessions --db {db}')")
    app = WorkbenchApp(db, session, follow=args.follow, poll_interval=args.poll, data=data)
    app.run()
    return 0
