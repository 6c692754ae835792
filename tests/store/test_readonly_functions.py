"""The read-only gate's function rule (workbench/store/functions.py) against DuckDB's own catalogue:
every table function is classified, and every one that writes, runs SQL or reads raw memory is
refused however it is spelled (issue 20, finding 9)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from workbench.store import functions as fn
from workbench.store.db import Store
from workbench.store.reader import LocalReader
from workbench.store.readonly import ReadOnlyError, check_read_only

REFUSED = fn.WRITES | fn.RUNS_SQL | fn.RAW_MEMORY | fn.SCALAR_REFUSED


def test_every_table_function_in_the_catalogue_is_classified() -> None:
    """Fails when a DuckDB upgrade adds a table function (or macro) nobody classified: classify it
    in workbench/store/functions.py (until then the gate refuses it)."""
    listed = fn.catalogue(fn.TABLE_TYPES)
    assert "checkpoint" in listed and "force_checkpoint" in listed
    classes = [fn.READS, fn.FILES, fn.WRITES, fn.RUNS_SQL, fn.RAW_MEMORY]
    unclassified = sorted(listed - set().union(*classes))
    assert unclassified == [], f"classify these table functions in workbench/store/functions.py: {unclassified}"
    for i, a in enumerate(classes):
        for b in classes[i + 1:]:
            assert not a & b, a & b


def test_every_scalar_whose_name_suggests_an_effect_is_classified() -> None:
    listed = fn.catalogue(fn.SCALAR_TYPES)
    suspicious = {name for name in listed if fn.EFFECT_WORDS.search(name)}
    unclassified = sorted(suspicious - fn.SCALAR_REFUSED - fn.SCALAR_PURE)
    assert unclassified == [], f"classify these functions in workbench/store/functions.py: {unclassified}"
    assert {"nextval", "write_log"} <= listed


def test_an_unclassified_table_function_is_refused() -> None:
    """Deny by default: a name the catalogue lists and nobody classified is refused."""
    check_read_only("SELECT * FROM duckdb_tables()")
    fn.refused_names.cache_clear()
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(fn, "READS", fn.READS - {"duckdb_tables"})
            with pytest.raises(ReadOnlyError, match=r"duckdb_tables\(\) is a table function nobody has classified"):
                check_read_only("SELECT * FROM duckdb_tables()")
    finally:
        fn.refused_names.cache_clear()
    check_read_only("SELECT * FROM duckdb_tables()")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_refused_function_is_refused_however_spelled(name: str) -> None:
    spellings = [f"SELECT * FROM {name}()", f'SELECT * FROM "{name.upper()}" ()', f"SELECT {name}('x')",
                 f"FROM main.{name} /* c */ ()", f"EXPLAIN ANALYZE SELECT * FROM system.main.{name}()",
                 f"WITH x AS (SELECT * FROM {name}(1)) SELECT 1", f"SELECT 1; SELECT * FROM {name}()",
                 # DuckDB also reads `name` as a quoted identifier (MySQL style): it called checkpoint()
                 f"SELECT * FROM `{name}`()", f"SELECT * FROM main.`{name.upper()}` ()", f"SELECT `{name}`('x')",
                 # DuckDB's tokenizer counts bytes: non-ASCII text before the call hid it
                 f"SELECT 'é😀' AS e, * FROM {name}()", f"SELECT 1 /* ééé */, * FROM {name}()"]
    for sql in spellings:
        with pytest.raises(ReadOnlyError, match=rf"{name}\(\)"):
            check_read_only(sql)


def test_explain_of_a_write_after_non_ascii_text_is_refused() -> None:
    """``_explained`` sliced the statement at byte offsets: after ``ééééééé`` it read ``FROM t …``
    (a FROM-first SELECT) where the statement said ``DELETE FROM t …``."""
    with pytest.raises(ReadOnlyError, match="got EXPLAIN of DELETE"):
        check_read_only("EXPLAIN ANALYZE /*ééééééé*/ DELETE FROM t WHERE a IN (SELECT 1)")
    check_read_only("EXPLAIN ANALYZE /*ééééééé*/ SELECT 'ü' AS u")


def test_names_that_are_not_calls_pass() -> None:
    for sql in ("SELECT 'checkpoint()' AS s", "SELECT 1 -- checkpoint()", "SELECT 1 AS checkpoint",
                'SELECT "query" FROM (SELECT 1 AS "query")', "SELECT * FROM range(3)",
                "SELECT * FROM duckdb_tables()", "SELECT * FROM pragma_table_info('frames')",
                "SELECT 'é😀(' AS checkpoint, query FROM (SELECT 1 AS query)"):
        check_read_only(sql)


def test_checkpoint_refused_on_a_closed_database_and_the_file_unchanged(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    with Store(db) as store:
        store.con.execute("CREATE TABLE filler AS SELECT range AS i FROM range(100000)")
        store.con.execute("INSERT INTO filler SELECT * FROM range(10)")
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    reader = LocalReader(db)
    try:
        for sql in ("SELECT * FROM checkpoint()", "SELECT * FROM force_checkpoint()", "SELECT * FROM `checkpoint`()",
                    "SELECT 'é' AS e, * FROM checkpoint()",
                    "SELECT * FROM query('SELECT * FROM checkpoint()')", "SELECT * FROM enable_profiling()"):
            with pytest.raises(ReadOnlyError, match="only read-only SQL"):
                reader.query(sql)
        assert reader.query("SELECT count(*) AS n FROM filler").column("n").to_pylist() == [100010]
    finally:
        reader.close()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
