"""The ``workbench`` command line.

Each subsystem registers its own subcommands (``register(subparsers)``) so this file stays a
table of contents. Errors are ``CliError``: printed as ``workbench <cmd>: <message>`` with exit 2,
the message naming the input, frame or option at fault.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from workbench import __version__

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
    "workbench.schema.cli",
]


class CliError(Exception):
    """A user-facing error: the message names what is at fault."""


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
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        rc = args.func(args)
    except CliError as exc:
        print(f"workbench {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        import duckdb

        from workbench.schema.loader import SchemaError
        from workbench.store.db import StoreError, damage_message, is_damage
        from workbench.store.readonly import QueryRefused

        if isinstance(exc, SchemaError | StoreError | QueryRefused):
            print(f"workbench {args.command}: {exc}", file=sys.stderr)
            return 2
        db = getattr(args, "db", None) or getattr(args, "record", None)
        if isinstance(exc, duckdb.Error) and db:
            # A database error no command anticipated: most often a damaged file that opened
            # fine and failed on a later read. Name the file rather than print a traceback.
            text = damage_message(str(db), exc) if is_damage(exc) else f"{db}: {str(exc).strip().splitlines()[0]}"
            print(f"workbench {args.command}: {text}", file=sys.stderr)
            return 2
        raise
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    # Run as ``python -m workbench.cli``: use the importable module, so that CliError raised by
    # subcommands (which import ``workbench.cli``) is the class caught here.
    from workbench.cli import main as _main

    sys.exit(_main())
