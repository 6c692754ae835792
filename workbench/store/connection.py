"""Opening a capture database file: the connection, the version check, and what to tell the user
when the file is locked, damaged or not a database.

Every path that opens a file (the writer ``Store``, the readers, ``workbench capture``'s check)
goes through here. It loads DuckDB and nothing else heavy, so a command that only lists
(``workbench sessions``) pays for no pyarrow or numpy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import duckdb

from workbench.errors import WorkbenchError
from workbench.store.schema import SCHEMA_VERSION, SchemaVersionError, current_version


class StoreError(WorkbenchError):
    """The database could not be opened or written; the message names the file."""


def settle(con: duckdb.DuckDBPyConnection) -> None:
    """Finish a half-fetched result (``execute(...).fetchone()``).

    DuckDB 2 refuses ``register`` and other work on a connection whose last result was not fetched
    to the end, so a writer reopening an existing file could not insert.
    """
    complete = getattr(con, "complete", None)
    if complete is not None:
        complete()


def check_version(con: duckdb.DuckDBPyConnection, path: str) -> None:
    """Refuse (SchemaVersionError) a database written by a newer workbench, without changing it."""
    try:
        found = current_version(con)
    except duckdb.Error:
        return  # not a workbench database: queries will say what is missing
    finally:
        settle(con)
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(f"{path}: schema version {found} is newer than this workbench "
                                 f"({SCHEMA_VERSION}); upgrade workbench to read it")


def open_message(path: str, exc: BaseException) -> str:
    """What to tell the user when DuckDB cannot open or read ``path`` (a damaged or foreign file)."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"{path}: cannot open as a capture database (damaged, truncated or not a DuckDB file?): "
            f"{text}")


def is_damage(exc: BaseException) -> bool:
    """Does this DuckDB error say the file itself is bad (rather than the SQL)?

    A truncated file opens fine and fails on the first read of a missing block (IOException); a
    block with a wrong checksum fails when it is read (a plain ``duckdb.Error`` "Corrupt database
    file"); after such an error DuckDB may invalidate the whole database (FatalException).
    """
    if isinstance(exc, duckdb.IOException | duckdb.FatalException | duckdb.InternalException):
        return True
    text = str(exc)
    return isinstance(exc, duckdb.Error) and ("Corrupt database file" in text or "invalidated" in text)


def check_readable(path: str | Path) -> None:
    """StoreError when ``path`` exists but is not a readable capture database (damaged or foreign).

    For commands that hand the file to another process (``workbench capture``): they check before
    starting, so a damaged file is an error naming it, exit 2. A file another process holds is
    not an error here (the capture spools then). Reads the small tables only.
    """
    p = str(path)
    if p == ":memory:" or not Path(p).exists():
        return
    try:
        con = duckdb.connect(p, read_only=True)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            return
        raise StoreError(open_message(p, exc)) from exc
    except duckdb.Error as exc:
        raise StoreError(open_message(p, exc)) from exc
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        for table in ("meta", "sessions"):
            if table in tables:
                con.execute(f"SELECT * FROM {table}").fetchall()
    except duckdb.Error as exc:
        raise StoreError(damage_message(p, exc) if is_damage(exc) else open_message(p, exc)) from exc
    finally:
        con.close()


@contextlib.contextmanager
def database_errors_named(path: str | Path | None) -> Iterator[None]:
    """Turn a DuckDB error nobody anticipated into a :class:`StoreError` naming ``path``.

    Most often a damaged file that opened fine and failed on a later read: the user gets the
    file's name and what DuckDB said, not a traceback. Without a path the error passes unchanged.
    """
    try:
        yield
    except duckdb.Error as exc:
        if not path:
            raise
        p = str(path)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        text = damage_message(p, exc) if is_damage(exc) else f"{p}: {first}"
        raise StoreError(text) from exc


def damage_message(path: str, exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{path}: the capture database is damaged (truncated or corrupt?): {text}"


def connect(path: str, *, read_only: bool) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection to ``path``; a file that is locked, damaged or not a database is a
    ``StoreError`` naming it (the writer and the readers open files the same way)."""
    try:
        return duckdb.connect(path, read_only=read_only)
    except duckdb.IOException as exc:
        raise StoreError(_lock_message(path, exc)) from exc
    except duckdb.Error as exc:
        raise StoreError(open_message(path, exc)) from exc


def _lock_message(path: str, exc: Exception) -> str:
    text = str(exc)
    if "lock" in text.lower():
        return (f"{path}: the database is held by another process (a capture in progress?). "
                f"Live readers go through the capture's read service; see README 'Following a capture'. "
                f"DuckDB said: {text.splitlines()[0]}")
    return open_message(path, exc)
