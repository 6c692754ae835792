"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
from typing import Any

import pyarrow as pa

from workbench.decode.classify import Decoder
from workbench.errors import CliError
from workbench.schema.active import active_schema
from workbench.store.db import DEFAULT_DB
from workbench.store.reader import LocalReader, RemoteReader, open_reader


def add_db_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=DEFAULT_DB, help=f"capture database (default {DEFAULT_DB})")


def add_proto_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--proto", action="append", default=[], metavar="PATH",
                   help=".proto file, folder or descriptor set (repeatable); its types replace the built-in "
                        "ones. Overrides the default set with 'workbench schema use' ('--proto builtin': the "
                        "built-in overlay)")


def decoder_from(args: argparse.Namespace) -> Decoder:
    """The decoder of a command: the active schema (``--proto``, else ``schema use``, else the overlay)."""
    return Decoder(active_schema(getattr(args, "proto", []) or []))


def reader_from(args: argparse.Namespace) -> LocalReader | RemoteReader:
    return open_reader(args.db)


def resolve_session(reader: LocalReader | RemoteReader, wanted: str) -> str:
    rows = reader.query(
        "SELECT session_id FROM sessions WHERE starts_with(session_id, ?) ORDER BY session_id LIMIT 5",
        [wanted],
    ).column(0).to_pylist()
    if wanted in rows:
        return wanted
    if not rows:
        raise CliError(f"no session {wanted!r} in {reader.path} (see 'workbench sessions --db {reader.path}')")
    if len(rows) > 1:
        raise CliError(f"session prefix {wanted!r} is ambiguous: {', '.join(rows)}")
    return str(rows[0])


def _cell(v: Any, width: int) -> str:
    if v is None:
        s = ""
    elif isinstance(v, bytes):
        s = v[:16].hex() + ("…" if len(v) > 16 else "")
    else:
        s = str(v)
    s = s.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 1] + "…"


def print_table(table: pa.Table, max_width: int = 60) -> None:
    cols = table.column_names
    rows = table.to_pylist()
    widths = [min(max_width, max([len(c)] + [len(_cell(r[c], max_width)) for r in rows])) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(_cell(r[c], w).ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
