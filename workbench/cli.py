# PYTHON_ARGCOMPLETE_OK  (argcomplete looks for this marker in the entry point's module)
"""The ``workbench`` command line.

Each subsystem registers its own subcommands (``register(subparsers)``) so this file stays a
table of contents. Errors meant for the user derive from ``workbench.errors.WorkbenchError``:
printed as ``workbench <cmd>: <message>`` with exit 2, the message naming the input, frame or
option at fault. Nothing else imports this module.

Start-up is what a user waits for on every call, so the parser is built lazily: ``COMMANDS``
(in ``workbench.commands.table``, re-exported here) names each command, its one-line help and the
module that registers it. ``workbench --help`` lists the table without importing any command
module; ``workbench <cmd> …`` imports only the module of ``<cmd>``; shell completion (argcomplete,
``_ARGCOMPLETE`` set) builds everything.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Collection, Sequence
from typing import NoReturn, cast

from workbench import __version__
from workbench.commands.table import COMMAND_MODULES, COMMANDS, add_command
from workbench.errors import CliError, WorkbenchError
from workbench.store.files import private_files
from workbench.textsafe import escape_display

__all__ = ["COMMANDS", "COMMAND_MODULES", "CliError", "WorkbenchError", "build_parser", "main"]

# Modules whose register() also adds formats to `workbench import` (ingest.register_importer):
# a command that imports files loads them with its own module.
IMPORT_FORMAT_MODULES = ("workbench.export.cli", "workbench.fixtures.cli")
ALSO_LOADS = {"workbench.ingest.cli": IMPORT_FORMAT_MODULES}


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors quote the command line through the printer (an
    unrecognized argument is printed as given, and it may be pasted from a capture)."""

    def error(self, message: str) -> NoReturn:
        super().error(escape_display(message, layout=True))


def build_parser(load: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser, with the commands of the modules in ``load`` complete (all modules when None).

    A command whose module is not loaded gets a stub that only carries its name and help: enough
    for ``workbench --help`` and for argparse to reject an unknown command.
    """
    parser = Parser(
        prog="workbench",
        description="Capture, decode, diagnose and replay Cursor agent traffic.",
    )
    parser.add_argument("--version", action="version", version=f"workbench {__version__}")
    # the commands' parsers are Parsers too (argparse makes them of the parent's class)
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", metavar="COMMAND"))
    for name, _, module in COMMANDS:
        if load is not None and module not in load:
            add_command(sub, name)
        elif name not in sub.choices:  # a module registers all its commands at once
            importlib.import_module(module).register(sub)
    return parser


def modules_for(argv: Sequence[str]) -> set[str]:
    """The command modules a command line needs: the one of its command, if it names one."""
    # The top-level options take no value, so the first word that is not an option is the command.
    command = next((a for a in argv if not a.startswith("-")), None)
    modules = {module for name, _, module in COMMANDS if name == command}
    return modules.union(*(ALSO_LOADS.get(m, ()) for m in modules))


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None and "_ARGCOMPLETE" in os.environ:
        # Shell completion (see README, "Shell completion"): the shell's hook set _ARGCOMPLETE, so
        # candidates for any command, option or choice are wanted; argcomplete prints them and exits.
        import argcomplete  # only completion uses it

        argcomplete.autocomplete(build_parser())
    parser = build_parser(modules_for(sys.argv[1:] if argv is None else argv))
    args = parser.parse_args(argv)
    private_files()  # databases, WALs, spools, exports, fixtures: 0600 (WORKBENCH_SHARED_FILES=1: umask)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = _run(args)
    except WorkbenchError as exc:
        # messages quote what they refuse (a file name, a session id, a value from the capture):
        # control characters as visible escapes (workbench.textsafe); a message's own lines stay
        print(f"workbench {args.command}: {escape_display(str(exc), layout=True)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return int(rc or 0)


def _run(args: argparse.Namespace) -> int | None:
    try:
        return args.func(args)  # type: ignore[no-any-return]
    except Exception as exc:
        duckdb = sys.modules.get("duckdb")
        if duckdb is None or not isinstance(exc, duckdb.Error):
            raise
        # A DuckDB error no command anticipated becomes a StoreError naming the database. The store
        # is imported only now: a command that never loaded DuckDB cannot raise its errors, and
        # importing it up front would cost every command duckdb and pyarrow.
        from workbench.store.db import database_errors_named

        with database_errors_named(getattr(args, "db", None) or getattr(args, "record", None)):
            raise


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
