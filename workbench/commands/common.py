"""Argument helpers shared by subcommands."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from workbench.store.paths import default_db, describe_rule
from workbench.store.queries import resolve_session

__all__ = ["add_db_arg", "add_json_arg", "add_proto_arg", "decoder_from", "print_table", "reader_from", "resolve_session",
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
        s = str(v)
    s = s.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 1] + "…"


# DuckDB's infinite timestamps and dates: the extremes of their Arrow integers
_INFINITE = {2**63 - 1: "infinity", -(2**63 - 1): "-infinity", 2**31 - 1: "infinity", -(2**31 - 1): "-infinity"}


def _temporal_text(s: pa.Scalar) -> str:
    """A date or time Python cannot hold (past year 9999, before year 1, ±infinity) as DuckDB prints it."""
    import numpy as np  # loaded already, by pyarrow (this module stays light for `decode`)
    import pyarrow as pa  # a table to print was read with pyarrow: loaded already

    t = s.type
    raw = s.cast(pa.int64() if not pa.types.is_date32(t) else pa.int32()).as_py()
    if raw in _INFINITE:
        return _INFINITE[raw]
    if pa.types.is_date32(t):
        return str(np.datetime64(raw, "D"))
    if pa.types.is_date64(t):
        return str(np.datetime64(raw, "ms").astype("datetime64[D]"))
    if pa.types.is_timestamp(t):
        text = str(np.datetime64(raw, t.unit)).replace("T", " ")
        return text + ("+00" if t.tz else "")
    return f"{raw} {getattr(t, 'unit', '')}".strip()  # a duration or time of day that overflowed


def _scalar(s: pa.Scalar) -> Any:
    """One Arrow value as Python, falling back to text for what ``as_py`` cannot represent."""
    import pyarrow as pa  # loaded already, by the query that made the value

    try:
        return s.as_py()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    t = s.type
    if not s.is_valid:
        return None
    if pa.types.is_temporal(t):
        return _temporal_text(s)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return [_scalar(v) for v in s.values]
    if pa.types.is_map(t):
        return [(_scalar(k), _scalar(v)) for k, v in zip(s.values.field("key"), s.values.field("value"), strict=True)]
    if pa.types.is_struct(t):
        return {t.field(i).name: _scalar(s[i]) for i in range(t.num_fields)}
    return str(s)


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, except that a value Python's datetime cannot hold (``'infinity'::timestamp``,
    a date past year 9999, also inside lists and structs) becomes its text instead of an exception."""
    import pyarrow as pa  # loaded already, by the query that made the table

    try:
        return table.to_pylist()
    except (OverflowError, ValueError, pa.ArrowException):
        pass
    columns: dict[str, list[Any]] = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        try:
            columns[name] = col.to_pylist()
        except (OverflowError, ValueError, pa.ArrowException):
            columns[name] = [_scalar(v) for v in col]
    return [{name: columns[name][i] for name in table.column_names} for i in range(table.num_rows)]


def print_table(table: pa.Table, max_width: int = 60, extra: dict[str, Sequence[Any]] | None = None) -> None:
    """Print ``table`` as aligned text, with the ``extra`` columns (name → one value per row) appended.

    ``extra`` spares the caller ``pa.array(values)``: on a Python list pyarrow probes for pandas, which
    costs ``workbench sessions`` 0.2 s of import."""
    cols = table.column_names + list(extra or {})
    rows = table_rows(table)
    for name, values in (extra or {}).items():
        for row, value in zip(rows, values, strict=True):
            row[name] = value
    widths = [min(max_width, max([len(c)] + [len(_cell(r[c], max_width)) for r in rows])) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for r in rows:
        print("  ".join(_cell(r[c], w).ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
