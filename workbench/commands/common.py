"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from workbench.store.arrow_rows import table_rows
from workbench.store.paths import default_db, describe_rule
from workbench.store.queries import resolve_session
from workbench.textsafe import escape

__all__ = ["add_db_arg", "add_json_arg", "add_proto_arg", "decoder_from", "print_rows", "print_table", "reader_from", "resolve_session",
           "table_rows"]

if TYPE_CHECKING:
    import pyarrow as pa

    from workbench.decode.classify import Decoder
    from workbench.store.reader import LocalReader, RemoteReader


def add_db_arg(p: argparse.ArgumentParser) -> None:
    # Resolved when the parser is built (once per command, in the directory it runs in), so that
    # --help shows the file a command would open.
    p.add_argument("--db", default=default_db(), metavar="PATH",
                   help=f"capture database (default: {describe_rule()}; here: %(default)s)")


def add_json_arg(p: argparse.ArgumentParser, what: str) -> None:
    """``--json``: the same flag on every command (machine-readable output instead of text); ``what``
    says what the command prints then."""
    p.add_argument("--json", action="store_true", help=what)


def add_proto_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proto", action="append", default=[], metavar="PATH",
                   help=".proto file, folder or descriptor set (repeatable); its types replace the built-in "
                        "ones. Overrides the default set with 'workbench schema use' ('--proto builtin': the "
                        "built-in overlay)")


def decoder_from(args: argparse.Namespace) -> Decoder:
    """The decoder of a command: the active schema (``--proto``, else ``schema use``, else the overlay)."""
    # Imported here: only commands that decode pay for protobuf and the schema.
    from workbench.decode.classify import Decoder
    from workbench.schema.active import active_schema

    return Decoder(active_schema(getattr(args, "proto", []) or []))


def reader_from(args: argparse.Namespace) -> LocalReader | RemoteReader:
    from workbench.store.reader import open_reader  # duckdb and pyarrow: only for commands that read

    return open_reader(args.db)


def _cell(v: Any, width: int) -> str:
    if v is None:
        s = ""
    elif isinstance(v, bytes):
        s = v[:16].hex() + ("…" if len(v) > 16 else "")
    else:
        s = escape(v)  # captured text: control characters as visible escapes (workbench.textsafe)
    return s if len(s) <= width else s[: width - 1] + "…"


def print_table(table: pa.Table, max_width: int = 60, extra: dict[str, Sequence[Any]] | None = None) -> None:
    """Print ``table`` as aligned text, with the ``extra`` columns (name → one value per row) appended.

    ``extra`` spares the caller ``pa.array(values)``: on a Python list pyarrow probes for pandas, which
    costs ``workbench sessions`` 0.2 s of import."""
    print_rows(table_rows(table), table.column_names, max_width, extra)


def print_rows(rows: list[dict[str, Any]], columns: Sequence[str], max_width: int = 60,
               extra: dict[str, Sequence[Any]] | None = None) -> None:
    """``print_table`` for rows already read as Python values (``Reader.rows``: no pyarrow)."""
    cols = list(columns) + list(extra or {})
    heads = [escape(c) for c in cols]  # SQL aliases are the query's: shown the same way
    for name, values in (extra or {}).items():
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    widths = [min(max_width, max([len(h)] + [len(_cell(r[c], max_width)) for r in rows]))
              for c, h in zip(cols, heads, strict=True)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(_cell(r[c], w).ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
