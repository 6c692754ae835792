"""Which DuckDB functions read-only SQL may call, decided from DuckDB's own function catalogue.

A ``READ ONLY`` transaction refuses writes to tables and sequences, but not every function that
changes something: ``checkpoint()`` rewrites the database file (and truncates its WAL) from inside
a read-only transaction, ``enable_profiling()`` makes the writer's instance print to its stdout,
``query('…')`` runs SQL given as a string (so no parse of the outer text can see what it does),
``arrow_scan(ptr, …)`` dereferences a raw address. ``readonly.read_statements`` therefore refuses
any call of such a function, whatever the query looks like around it.

How the functions are enumerated (not a list typed by hand alone):

* **Table functions and table macros** — the only functions that can do these things from a
  ``SELECT`` — are taken from ``duckdb_functions()`` of a fresh in-memory instance
  (``function_type IN ('table', 'table_macro')``: built-ins and statically linked extensions).
  Each is classified below by one rule: it *reads* when its rows come from its arguments, the
  catalogue, the settings or the data and calling it changes nothing (``READS``); it *reads files*
  when it opens paths, which ``enable_external_access = false`` decides (``FILES``, allowed here);
  everything else is refused: it changes the database file or the instance (``WRITES``), runs SQL
  text (``RUNS_SQL``), or takes raw memory or Python objects (``RAW_MEMORY``). A table function the
  catalogue lists that is in none of these sets is **refused** until someone classifies it, and
  ``tests/store/test_readonly_functions.py`` fails when a DuckDB upgrade adds one.
* **Scalar, aggregate, window functions and macros** compute a value from their arguments; the
  catalogue's names that suggest an effect (``EFFECT_WORDS``) are classified in
  ``SCALAR_REFUSED``/``SCALAR_PURE``, and the same test fails on an unclassified one.
* ``PRAGMA``/``CALL`` statements (and so the ``pragma`` function type) never reach this check: the
  statement classifier refuses them.

A call is found with DuckDB's tokenizer: a name (keyword, or identifier, unquoted or quoted with
``"`` or with backquotes, with or without a schema) followed by ``(``; comments and string literals are not calls.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re

import duckdb

# Rows from the arguments, the catalogue, the settings or the data; calling them changes nothing.
READS = frozenset({
    "duckdb_approx_database_count", "duckdb_available_metrics", "duckdb_columns", "duckdb_connection_count",
    "duckdb_constraints", "duckdb_coordinate_systems", "duckdb_databases", "duckdb_dependencies",
    "duckdb_dialects", "duckdb_eviction_queues", "duckdb_extension_repositories", "duckdb_extensions",
    "duckdb_external_file_cache", "duckdb_external_resource_types", "duckdb_external_resources",
    "duckdb_functions", "duckdb_grammar_extensions", "duckdb_indexes", "duckdb_keywords",
    "duckdb_live_query_metrics", "duckdb_log_contexts", "duckdb_logs", "duckdb_memory", "duckdb_optimizers",
    "duckdb_prepared_statements", "duckdb_schemas", "duckdb_secret_type_parameters", "duckdb_secret_types",
    "duckdb_secrets", "duckdb_sequences", "duckdb_settings", "duckdb_table_sample", "duckdb_tables",
    "duckdb_temporary_files", "duckdb_triggers", "duckdb_types", "duckdb_variables", "duckdb_views",
    "pragma_collations", "pragma_database_size", "pragma_metadata_info", "pragma_platform", "pragma_show",
    "pragma_storage_info", "pragma_table_info", "pragma_user_agent", "pragma_version",
    "generate_series", "range", "repeat", "repeat_row", "unnest", "summary", "seq_scan",
    "test_all_types", "test_vector_types", "icu_calendar_names", "pg_timezone_names",
    "json_each", "json_tree", "which_secret",
    # table macros
    "duckdb_logs_parsed", "duckdb_profiling_settings", "histogram", "histogram_values",
})

# Open paths: allowed by this check, decided by enable_external_access / allowed_directories.
FILES = frozenset({
    "glob", "sniff_csv", "read_blob", "read_text", "read_csv", "read_csv_auto", "read_single_csv_file",
    "read_json", "read_json_auto", "read_json_objects", "read_json_objects_auto", "read_ndjson",
    "read_ndjson_auto", "read_ndjson_objects", "read_single_json_file", "read_parquet", "parquet_scan",
    "read_single_parquet_file", "parquet_bloom_probe", "parquet_file_metadata", "parquet_full_metadata",
    "parquet_kv_metadata", "parquet_metadata", "parquet_page_index", "parquet_schema", "read_duckdb",
})

# Change the database file or the instance a capture's writer shares with its readers.
WRITES = frozenset({
    "checkpoint", "force_checkpoint",
    "enable_logging", "disable_logging", "truncate_duckdb_logs", "enable_profiling", "disable_profiling",
    "add_grammar_extension", "remove_grammar_extension",
    "create_external_resource", "register_external_resource", "register_external_resource_type",
    "deregister_external_resource", "destroy_external_resource",
})

# Run SQL given as a string: what they run is invisible to the statement check.
RUNS_SQL = frozenset({"query", "query_table", "json_execute_serialized_sql"})

# Take raw memory addresses or Python objects (a wrong address crashes the writer).
RAW_MEMORY = frozenset({"arrow_scan", "arrow_scan_dumb", "pandas_scan", "python_arrow_scan", "python_map_function"})

# Scalar/aggregate/window functions and macros whose names match EFFECT_WORDS, classified.
EFFECT_WORDS = re.compile(
    r"checkpoint|write|^set|log|enable|disable|regist|create|drop|attach|export|import|install|load|nextval"
    r"|seed|flush|vacuum|truncate|reset|exec|query|sql|file|alloc|pointer|python|cache|variable|secret"
    r"|resource|grammar|profil|sleep")
SCALAR_REFUSED = frozenset({
    "nextval", "setval",      # advance a sequence (a write; the READ ONLY transaction refuses it too)
    "setseed",                # reseeds random() for everyone on the writer's instance
    "write_log",              # writes into the instance's log
})
SCALAR_PURE = frozenset({
    "create_sort_key", "current_catalog", "current_query", "current_query_id", "error", "getvariable",
    "json_deserialize_sql", "json_serialize_sql", "log", "log10", "log2", "ln", "parse_duckdb_log_message",
    "parse_filename", "pg_conf_load_time", "set_bit", "pg_sleep", "sleep_ms",  # sleeps obey the time limit
})

TABLE_TYPES = ("table", "table_macro")
SCALAR_TYPES = ("scalar", "aggregate", "window", "macro")

_WHY = (
    (WRITES, "changes the database file or the writer's instance"),
    (SCALAR_REFUSED, "changes the database or the writer's instance"),
    (RUNS_SQL, "runs SQL given as a string, which this check cannot see"),
    (RAW_MEMORY, "reads raw memory or Python objects"),
)


def catalogue(types: tuple[str, ...]) -> frozenset[str]:
    """Names DuckDB's catalogue lists for functions of ``types`` (fresh in-memory instance)."""
    con = duckdb.connect()
    try:
        marks = ", ".join("?" for _ in types)
        rows = con.execute(f"SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_type IN ({marks})",
                           list(types)).fetchall()
    finally:
        con.close()
    return frozenset(str(r[0]).lower() for r in rows)


@functools.lru_cache(maxsize=1)
def refused_names() -> dict[str, str]:
    """Every function name a read-only query may not call → why."""
    out: dict[str, str] = {}
    for names, why in _WHY:
        out.update(dict.fromkeys(names, why))
    for name in catalogue(TABLE_TYPES) - READS - FILES:
        out.setdefault(name, "is a table function nobody has classified as read-only (workbench/store/functions.py)")
    return out


_BARE = re.compile(r"[^\s\"`().,;/*+<>=!~|&%^:\[\]{}'-]+")
# DuckDB quotes identifiers with "…" and, as MySQL does, with `…` (a doubled quote inside escapes it).
_QUOTES = ('"', "`")


def _name(sql: str, start: int) -> str:
    """The name a keyword or identifier token starting at ``start`` spells (lower case, unquoted)."""
    quote = sql[start] if sql[start:start + 1] in _QUOTES else ""
    if quote:
        out, i = [], start + 1
        while i < len(sql):
            if sql[i] == quote:
                if sql.startswith(quote * 2, i):
                    out.append(quote)
                    i += 2
                    continue
                break
            out.append(sql[i])
            i += 1
        return "".join(out).lower()
    bare = _BARE.match(sql, start)
    return bare.group(0).lower() if bare else ""


def tokens(sql: str) -> list[tuple[int, str]]:
    """DuckDB's tokens of ``sql`` but its comments, as (offset in characters, kind name).

    ``duckdb.tokenize`` gives offsets in UTF-8 bytes: used as string indexes they pointed past the
    token after any non-ASCII text (``SELECT 'é', * FROM checkpoint()`` hid the call).
    """
    raw = duckdb.tokenize(sql)
    starts: list[int] | None = None  # the byte offset each character starts at
    if not sql.isascii():
        starts = list(itertools.accumulate((len(ch.encode("utf-8", "surrogatepass")) for ch in sql), initial=0))
    out = []
    for pos, kind in raw:
        name = str(kind).rsplit(".", 1)[-1]
        if name != "comment":
            out.append((pos if starts is None else bisect.bisect_right(starts, pos) - 1, name))
    return out


def refused_call(sql: str) -> str | None:
    """Why ``sql`` may not run (it calls a refused function), or None."""
    try:
        toks = tokens(sql)
    except duckdb.Error:
        return None  # the parser has the last word on SQL that does not tokenize
    refused = refused_names()
    for i, (pos, kind) in enumerate(toks[:-1]):
        if kind not in ("identifier", "keyword"):
            continue
        end = toks[i + 1][0]
        if not sql[end:].startswith("("):
            continue
        name = _name(sql, pos)
        why = refused.get(name)
        if why is not None:
            return f"{name}() {why}"
    return None
