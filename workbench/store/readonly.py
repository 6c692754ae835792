"""Read-only SQL for real: the one implementation behind every read path.

The live read service (``live.LiveService``), ``workbench sql``, ``workbench.notebook.connect()``
and the TUI all run SQL a user (or a page the user opened) may have written. "Read-only" there
means five things, each decided by DuckDB itself (its parser, tokenizer, function catalogue,
transactions and settings) rather than by matching text:

1. **Statements are classified with DuckDB's own parser** (``duckdb.extract_statements``): only
   ``SELECT`` (which includes ``FROM``-first queries, ``DESCRIBE``, ``SHOW``, ``SUMMARIZE``,
   ``VALUES``) and ``EXPLAIN [ANALYZE]`` *of a SELECT* pass. ``EXPLAIN ANALYZE`` executes its
   statement, so the explained statement is parsed again and must be a SELECT too.
2. **Every query runs in a ``READ ONLY`` transaction** on its own cursor. A parse can say
   ``SELECT`` and still write (DuckDB runs data-modifying CTEs:
   ``WITH d AS (DELETE FROM frames RETURNING *) SELECT …``); the transaction refuses any write.
3. **No file or network access from SQL**: the database instance runs with
   ``enable_external_access = false`` and then ``lock_configuration = true``, so ``read_csv``,
   ``read_text``, ``read_blob``, ``glob``, ``COPY … TO``, ``ATTACH``, ``INSTALL``/``LOAD`` and any
   ``SET``/``PRAGMA`` that changes a setting fail inside DuckDB whatever the function is called.
   These are instance-wide settings. A capture's writer serves live reads from its own instance
   (DuckDB refuses a second instance on a file a process holds, even read-only, and refuses a
   differently configured connection to the same file within the process: measured on DuckDB 2.0),
   so the writer's instance is confined when its read service starts. The writer needs neither: it
   inserts registered Arrow tables, which stay allowed.
4. **No function that writes, runs SQL text, or reads raw memory**, however it is spelled
   (``functions.refused_call``): a ``READ ONLY`` transaction does not stop ``checkpoint()``, which
   rewrites the file, nor ``enable_profiling()`` and friends, which change the instance the writer
   shares. The refused names come from DuckDB's own function catalogue, classified by the rule in
   ``workbench/store/functions.py``; a table function the catalogue lists and nobody classified is
   refused (deny by default).
5. **Limits**: a per-query time limit (default 30 s) that interrupts the query
   (``cursor.interrupt()`` from a timer), and a cap on the result's size (default 256 MiB of Arrow
   data), checked batch by batch while the result streams, so a huge result is refused before it
   is in memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

import duckdb

from workbench.errors import WorkbenchError
from workbench.store import functions
from workbench.store.functions import refused_call
from workbench.store.limits import DEFAULT_MAX_RESULT_BYTES as DEFAULT_MAX_RESULT_BYTES
from workbench.store.limits import DEFAULT_TIMEOUT_S as DEFAULT_TIMEOUT_S

if TYPE_CHECKING:  # Arrow results only: a listing reads tuples and loads no pyarrow (``run_rows``)
    import pyarrow as pa

# A client may ask for a longer limit, never for more than a day (a timer past that overflows).
MAX_TIMEOUT_S = 24 * 3600.0
_BATCH_ROWS = 256  # the cap is checked at least this often (DuckDB still computes a vector of 2048)

# StatementType names that read. EXPLAIN is allowed only around a SELECT (checked separately).
_READ_TYPES = frozenset({"SELECT"})


class QueryRefused(WorkbenchError):
    """A read-only path refused or stopped a query; the message says why and what to change."""


class ReadOnlyError(QueryRefused, ValueError):
    """The SQL is not read-only (or does not parse)."""


class QueryTimeout(QueryRefused):
    """The query ran past its time limit and was interrupted."""


class ResultTooLarge(QueryRefused):
    """The result is larger than the cap."""


@dataclass(frozen=True)
class ReadLimits:
    """How long one query may run and how large its result may be (None = no limit)."""

    timeout_s: float | None = DEFAULT_TIMEOUT_S
    max_result_bytes: int | None = DEFAULT_MAX_RESULT_BYTES

    def as_json(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s, "max_result_bytes": self.max_result_bytes}

    @classmethod
    def from_json(cls, doc: Any, max_result_ceiling: int | None = None) -> ReadLimits:
        """Limits a client asked for (defaults for what it left out), the result cap at most
        ``max_result_ceiling``."""
        doc = doc if isinstance(doc, dict) else {}

        def positive(key: str) -> float | None:
            value = doc.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
                return float(value)
            return None

        timeout = min(positive("timeout_s") or DEFAULT_TIMEOUT_S, MAX_TIMEOUT_S)
        size = int(positive("max_result_bytes") or DEFAULT_MAX_RESULT_BYTES)
        if max_result_ceiling is not None:
            size = min(size, max_result_ceiling)
        return cls(timeout, size)


def _type_name(statement: Any) -> str:
    return str(statement.type).rsplit(".", 1)[-1]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _explained(query: str) -> str:
    """The statement text an ``EXPLAIN [ANALYZE] [(options)]`` wraps ('' when there is none)."""
    tokens = functions.tokens(query)
    i = 0
    if i < len(tokens) and query[tokens[i][0]:].upper().startswith("EXPLAIN"):
        i += 1
    if i < len(tokens) and query[tokens[i][0]:tokens[i][0] + 7].upper() in ("ANALYZE", "ANALYSE"):
        i += 1
    if i < len(tokens) and query[tokens[i][0]] == "(":
        depth = 0
        while i < len(tokens):
            ch = query[tokens[i][0]]
            depth += ch == "("
            depth -= ch == ")"
            i += 1
            if depth == 0:
                break
    return query[tokens[i][0]:] if i < len(tokens) else ""


def read_statements(sql: str) -> list[Any]:
    """The statements of ``sql``, parsed by DuckDB; ReadOnlyError unless every one only reads."""
    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise ReadOnlyError(f"SQL does not parse: {_first_line(exc)}") from exc
    if not statements:
        raise ReadOnlyError("no SQL statement given")
    for st in statements:
        name = _type_name(st)
        if name in ("SELECT", "EXPLAIN"):
            _check_calls(st.query)
        if name in _READ_TYPES:
            continue
        if name == "EXPLAIN":
            inner_sql = _explained(st.query)
            try:
                inner = duckdb.extract_statements(inner_sql) if inner_sql.strip() else []
            except duckdb.Error:
                inner = []
            kinds = [_type_name(s) for s in inner]
            if kinds == ["SELECT"]:
                continue
            what = kinds[0] if len(kinds) == 1 else "a statement that is not one SELECT"
            raise ReadOnlyError(f"only read-only SQL is allowed here: EXPLAIN ANALYZE runs the statement it "
                                f"explains, so EXPLAIN [ANALYZE] is allowed only of a SELECT (got EXPLAIN of {what})")
        hint = ""
        if name in ("PRAGMA", "CALL"):
            hint = " (table functions work in a SELECT: SELECT * FROM pragma_table_info('frames'))"
        raise ReadOnlyError(f"only read-only SQL is allowed here: SELECT, or EXPLAIN [ANALYZE] of a SELECT "
                            f"(got {name}){hint}")
    return statements


def _check_calls(query: str) -> None:
    refusal = refused_call(query)
    if refusal is not None:
        raise ReadOnlyError(f"only read-only SQL is allowed here: {refusal}")


def check_read_only(sql: str) -> None:
    """Raise ReadOnlyError unless every statement of ``sql`` only reads."""
    read_statements(sql)


def confine(con: duckdb.DuckDBPyConnection, allowed_dirs: Iterable[str] = ()) -> None:
    """No file or network access from SQL on ``con``'s database instance, and no setting changes.

    ``allowed_dirs`` stay readable and writable (``workbench export`` writes its Parquet under its
    output directory). Idempotent: an instance that is already confined is left as it is.
    """
    external, locked = con.execute(
        "SELECT current_setting('enable_external_access'), current_setting('lock_configuration')").fetchone() or (True, False)
    if locked:
        if external:
            raise duckdb.InvalidInputException("the database's configuration is locked with external access on")
        return
    dirs = [_sql_str(str(d).rstrip("/") + "/") for d in allowed_dirs]
    if dirs:
        con.execute(f"SET allowed_directories = [{', '.join(dirs)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def run_read(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None,
             limits: ReadLimits | None = None) -> pa.Table:
    """Run read-only ``sql`` on ``con`` within ``limits``; the last statement's rows, as Arrow.

    ``con`` is a connection (or cursor) nobody else uses meanwhile, with no transaction open. Its
    instance must already be confined (``confine``): this function checks the statements, runs
    them in a read-only transaction and enforces the limits.
    """
    import pyarrow as pa  # an Arrow result: the caller works in Arrow, so pyarrow is its cost

    table = _run(con, sql, params, limits, _fetch_arrow)
    return table if table is not None else pa.table({})


def run_rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None,
             limits: ReadLimits | None = None) -> list[dict[str, Any]]:
    """``run_read`` for a caller that wants Python rows (column name → value), fetched as tuples:
    no Arrow on the way, so a command that lists (``workbench sessions``) loads neither pyarrow nor
    numpy. A value DuckDB's tuple conversion cannot give (a time past year 9999 comes as its text
    already) is read again through Arrow (``arrow_rows.table_rows``), as every other read shows it.
    """
    try:
        return _run(con, sql, params, limits, _fetch_rows) or []
    except (OverflowError, ValueError):
        from workbench.store.arrow_rows import (
            table_rows,  # the fallback reads through Arrow, as every other read
        )

        return table_rows(run_read(con, sql, params, limits))


def _run(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None, limits: ReadLimits | None,
         fetch: Any) -> Any:
    limits = limits or ReadLimits()
    statements = read_statements(sql)
    if params and len(statements) > 1:
        raise ReadOnlyError("parameters need a single statement")
    cur = con
    fired = threading.Event()

    def stop() -> None:
        fired.set()
        cur.interrupt()

    timer = threading.Timer(limits.timeout_s, stop) if limits.timeout_s is not None else None
    try:
        cur.execute("BEGIN TRANSACTION READ ONLY")
        if timer is not None:
            timer.daemon = True
            timer.start()
        result = None
        for st in statements:
            result = fetch(cur, st, list(params) if params else None, limits.max_result_bytes)
        return result
    except duckdb.InterruptException as exc:
        if fired.is_set():
            raise QueryTimeout(f"query interrupted: it ran past the {limits.timeout_s:g} s time limit "
                               f"(workbench sql --timeout SECONDS raises it)") from exc
        raise
    finally:
        if timer is not None:
            timer.cancel()
            # Joined, so no thread outlives the query holding the connection (``stop`` refers to
            # it): a daemon thread that drops the last reference while the interpreter exits runs
            # the connection's destructor, which takes the GIL back and is unwound through C++ by
            # the exiting interpreter: SIGABRT, "FATAL: exception not rethrown".
            timer.join()
        try:
            cur.execute("ROLLBACK")
        except duckdb.Error:
            pass


def _too_large(cap: int, rows: int) -> ResultTooLarge:
    return ResultTooLarge(f"result larger than the {_mib(cap)} cap (stopped after {rows} "
                          f"rows): select fewer rows or columns (LIMIT, no payload/raw), or raise the cap "
                          f"(workbench sql --max-result-mb N)")


def _fetch_arrow(cur: duckdb.DuckDBPyConnection, statement: Any, params: list[Any] | None,
                 cap: int | None) -> pa.Table | None:
    import pyarrow as pa  # an Arrow result was asked for

    rel = cur.sql(statement, params=params)
    if rel is None:
        return None
    reader = rel.to_arrow_reader(_BATCH_ROWS)
    batches: list[pa.RecordBatch] = []
    total = 0
    for batch in reader:
        total += batch.nbytes
        if cap is not None and total > cap:
            raise _too_large(cap, sum(b.num_rows for b in batches))
        batches.append(batch)
    return pa.Table.from_batches(batches, schema=reader.schema)


# A datetime or date at Python's extreme is how DuckDB's tuple conversion gives ±infinity; the
# Arrow reads show those as DuckDB's text, and so do these rows.
_INFINITE_TEXT = {datetime.max: "infinity", datetime.min: "-infinity", date.max: "infinity", date.min: "-infinity"}


def _fetch_rows(cur: duckdb.DuckDBPyConnection, statement: Any, params: list[Any] | None,
                cap: int | None) -> list[dict[str, Any]]:
    return fetch_rows(cur.execute(statement, params), cap)


def fetch_rows(cur: duckdb.DuckDBPyConnection, cap: int | None = None) -> list[dict[str, Any]]:
    """The rows of the query just executed on ``cur`` as dicts (column name → value), fetched as
    tuples: no Arrow. ``cap``: the most bytes the values may hold (text and bytes by length, others
    8 bytes — close to the Arrow buffers the same rows would need), ``ResultTooLarge`` past it."""
    if cur.description is None:
        return []
    names = [d[0] for d in cur.description]
    rows: list[dict[str, Any]] = []
    total = 0
    while chunk := cur.fetchmany(_BATCH_ROWS * 8):
        for values in chunk:
            if cap is not None:
                total += sum(len(v) if isinstance(v, str | bytes) else 8 for v in values)
            rows.append({n: (_INFINITE_TEXT.get(v, v) if isinstance(v, date) else v)
                         for n, v in zip(names, values, strict=True)})
        if cap is not None and total > cap:
            raise _too_large(cap, len(rows))
    return rows


def _sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):g} MiB"
