# PYTHON_ARGCOMPLETE_OK  (argcomplete looks for this marker in the entry point's module)
"""The ``workbench`` command line.

Each subsystem registers its own subcommands (``register(subparsers)``) so this file stays a
table of contents. Errors meant for the user derive from ``workbench.errors.WorkbenchError``:
printed as ``workbench <cmd>: <message>`` with exit 2, the message naming the input, frame or
option at fault. Nothing else imports this module.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

import argcomplete

from workbench import __version__
from workbench.errors import CliError, WorkbenchError
from workbench.store.db import database_errors_named
from workbench.store.files import private_files

__all__ = ["CliError", "WorkbenchError", "build_parser", "main"]

# Modules that add subcommands, in the order `workbench --help` lists them.
COMMAND_MODULES = [
    "workbench.demo",
    "workbench.commands.core",
    "workbench.tui.cli",
    "workbench.web.cli",
    "workbench.capture.cli",
    "workbench.sim.cli",
    "workbench.proxy.cli",
    "workbench.ingest.cli",
    "workbench.fixtures.cli",
    "workbench.export.cli",
    "workbench.analysis.cli",
    "workbench.commands.schema",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="workbench",
        description="Capture, decode, diagnose and replay Cursor agent traffic.",
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if argv is None:
        # Shell completion: a no-op unless the shell's completion hook set _ARGCOMPLETE (see README,
        # "Shell completion"); then it prints the candidates and exits before anything runs.
        argcomplete.autocomplete(parser)
    args = parser.parse_args(argv)
    private_files()  # databases, WALs, spools, exports, fixtures: 0600 (WORKBENCH_SHARED_FILES=1: umask)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        # A DuckDB error no command anticipated becomes a StoreError naming the database.
        with database_errors_named(getattr(args, "db", None) or getattr(args, "record", None)):
            rc = args.func(args)
    except WorkbenchError as exc:
        print(f"workbench {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
