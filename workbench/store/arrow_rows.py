"""Arrow tables as Python rows, for every read that hands rows to Python.

``Table.to_pylist`` raises on a value Python cannot hold: DuckDB keeps timestamps past year 9999,
before year 1 and ``±infinity``, which ``datetime`` cannot. A hostile file can store such a time (a
Parquet import, a flow file's timestamps), and a read must then show it, not end in a traceback.
:func:`table_rows` converts as ``to_pylist`` does and gives such a value as the text DuckDB prints.

It imports nothing heavy: a caller already holds a table, so pyarrow and numpy are loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["table_rows"]


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
