"""``workbench.commands.common``: what every reading subcommand shares — a session named by a
prefix of its id, and query results shown as rows and as an aligned table, including values
Python cannot hold (DuckDB's infinite timestamps, dates past year 9999)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from workbench.commands.common import print_table, resolve_session, table_rows
from workbench.errors import WorkbenchError
from workbench.store import open_reader
from workbench.store.db import SessionInfo, Store


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    db = tmp_path / "c.duckdb"
    with Store(db) as store:
        store.upsert_sessions([SessionInfo(sid, transport="run", status="complete")
                               for sid in ("abc123", "abd999", "abd000", "zz")])
    return db


@pytest.mark.parametrize(("wanted", "found"), [("abc", "abc123"), ("abc123", "abc123"), ("z", "zz"),
                                               ("zz", "zz")])
def test_a_session_is_found_by_its_id_or_a_unique_prefix(capture: Path, wanted: str, found: str) -> None:
    reader = open_reader(capture)
    try:
        assert resolve_session(reader, wanted) == found
    finally:
        reader.close()


def test_an_unknown_or_ambiguous_prefix_is_a_clear_error(capture: Path) -> None:
    reader = open_reader(capture)
    try:
        with pytest.raises(WorkbenchError, match=r"no session 'q' in .*c\.duckdb \(see 'workbench sessions --db "):
            resolve_session(reader, "q")
        with pytest.raises(WorkbenchError, match=r"session prefix 'abd' in .*c\.duckdb is ambiguous: abd000, abd999"):
            resolve_session(reader, "abd")
        with pytest.raises(WorkbenchError, match="no session"):  # '%' and '_' are not patterns here
            resolve_session(reader, "a%")
        with pytest.raises(WorkbenchError, match="no session"):
            resolve_session(reader, "ab_")
    finally:
        reader.close()


_EXTREMES = """SELECT 1 AS n, 'infinity'::TIMESTAMP AS ts, '-infinity'::DATE AS d,
                      DATE '12000-01-02' AS far, [TIMESTAMP 'infinity'] AS xs, {'t': 'infinity'::TIMESTAMPTZ} AS s
               UNION ALL
               SELECT 2, TIMESTAMP '2026-11-27 10:00:00', DATE '2026-11-27', DATE '2026-11-27', [], {'t': NULL}"""


def _table(db: Path, sql: str) -> pa.Table:
    reader = open_reader(db)  # the way a subcommand gets its table
    try:
        return reader.query(sql)
    finally:
        reader.close()


def test_rows_keep_values_python_cannot_hold_as_duckdb_text(capture: Path) -> None:
    table = _table(capture, _EXTREMES)
    with pytest.raises((OverflowError, ValueError)):
        table.to_pylist()  # what table_rows spares its callers
    first, second = table_rows(table)
    assert first == {"n": 1, "ts": "infinity", "d": "-infinity", "far": "12000-01-02", "xs": ["infinity"],
                     "s": {"t": "infinity"}}
    assert second["n"] == 2 and str(second["ts"]) == "2026-11-27 10:00:00" and second["xs"] == []


def test_print_table_aligns_columns_and_shortens_bytes_and_lines(capture: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    table = _table(capture, "SELECT * FROM (VALUES (1, 'two' || chr(10) || 'lines', "
                            "from_hex('00112233445566778899aabbccddeeff00')), (22, NULL, NULL)) t(id, text, raw)")
    print_table(table, extra={"note": ["x", "y"]})
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["id  text        raw                                note",
                     "1   two\\nlines  00112233445566778899aabbccddeeff…  x",
                     "22                                                 y",
                     "(2 rows)"]


@pytest.mark.slow  # a workbench process
def test_sessions_json_prints_a_start_past_year_9999_as_text(capture: Path) -> None:
    """A session stamped past what Python's datetime holds (a hostile import's timestamp, kept as
    DuckDB keeps it) is listed, not a traceback."""
    import json
    import subprocess
    import sys

    import duckdb

    con = duckdb.connect(str(capture))
    try:
        con.execute("UPDATE sessions SET started_at = TIMESTAMPTZ '10000-01-01 00:00:00+00' WHERE session_id = 'zz'")
    finally:
        con.close()
    r = subprocess.run([sys.executable, "-m", "workbench", "sessions", "--json", "--db", str(capture)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    rows = {d["session_id"]: d for d in map(json.loads, r.stdout.splitlines())}
    assert str(rows["zz"]["started_at"]).startswith("10000-01-01")
    assert set(rows) == {"abc123", "abd999", "abd000", "zz"}
