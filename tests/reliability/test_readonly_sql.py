"""Read-only means read-only, on every read path (issue 12, item 1).

Every probe is run on: the live read service of a real writer process (through ``workbench sql``,
``RemoteReader`` and the TUI's data layer), ``workbench sql`` on a closed database, the TUI's data
layer on a closed database, and ``workbench.notebook.connect()`` (file and live snapshot). Each
probe must fail, write no file, read no file, and leave the frames and tables as they were.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import duckdb
import pytest
from security_rig import live_writer
from support import run_workbench

from workbench.decode.classify import Frame
from workbench.notebook import connect
from workbench.store.db import SessionInfo, Store, StoreError, now_us
from workbench.store.reader import LocalReader, RemoteReader, open_reader
from workbench.store.readonly import QueryRefused, check_read_only
from workbench.store.recorder import Recorder
from workbench.tui.data import TuiData

SECRET = "top-secret-content-4f9a2c"
# hash() of every row: no optimizer can answer this without scanning (duckdb 2 folds `i % 7 = 99`).
SLOW = "SELECT count(*) FROM range(1000000000000) t(i) WHERE hash(i) % 7 = 3"


def probes(tmp: Path) -> dict[str, str]:
    """Name → SQL. ``tmp`` holds the secret file and is where a write would land."""
    return {
        "explain analyze delete": "EXPLAIN ANALYZE DELETE FROM frames",
        "explain analyze create": "EXPLAIN ANALYZE CREATE TABLE pwned AS SELECT 1",
        "explain analyze insert": "EXPLAIN ANALYZE INSERT INTO sessions (session_id) VALUES ('pwned')",
        "explain (analyze) update": "EXPLAIN (ANALYZE, FORMAT JSON) UPDATE frames SET kind = 'pwned'",
        "data-modifying cte": "WITH d AS (DELETE FROM frames RETURNING *) SELECT count(*) FROM d",
        "select then delete": "SELECT 1; DELETE FROM frames",
        "delete": "DELETE FROM frames",
        "drop": "DROP TABLE frames",
        "copy to": f"COPY (SELECT * FROM frames) TO '{tmp}/copy.csv'",
        "explain analyze copy": f"EXPLAIN ANALYZE COPY (SELECT 1) TO '{tmp}/copy2.csv'",
        "read_csv passwd": "SELECT * FROM read_csv('/etc/passwd')",
        "read_text": f"SELECT * FROM read_text('{tmp}/secret.txt')",
        "read_blob": f"SELECT * FROM read_blob('{tmp}/secret.txt')",
        "replacement scan": f"SELECT * FROM '{tmp}/secret.txt'",
        "glob": f"SELECT * FROM glob('{tmp}/*')",
        "glob root": "SELECT * FROM glob('/root/*')",
        "attach": f"ATTACH '{tmp}/other.duckdb' AS other",
        "install": "INSTALL httpfs",
        "load": "LOAD httpfs",
        "pragma set": "PRAGMA threads=1",
        "set external access": "SET enable_external_access = true",
        "set threads": "SET threads = 1",
        "reset lock": "RESET lock_configuration",
        "checkpoint": "CHECKPOINT",
        # functions that write from inside a SELECT (issue 20, finding 9): refused by the gate
        "checkpoint()": "SELECT * FROM checkpoint()",
        "force_checkpoint()": "SELECT * FROM main.force_checkpoint()",
        "quoted checkpoint()": 'FROM "CHECKPOINT"()',
        "backquoted checkpoint()": "FROM `checkpoint`()",
        "checkpoint() after non-ascii": "SELECT 'é' AS e, * FROM checkpoint()",
        "explain analyze checkpoint()": "EXPLAIN ANALYZE SELECT * FROM checkpoint()",
        "query() runs sql": "SELECT * FROM query('SELECT * FROM checkpoint()')",
        "enable_profiling()": "SELECT * FROM enable_profiling()",
        "truncate_duckdb_logs()": "SELECT * FROM truncate_duckdb_logs()",
    }


# What a notebook's own read-only DuckDB connection may run (it is not the gate: checkpoints are
# no-ops on its read-only file or in-memory snapshot, profiling is the notebook's own business).
NOTEBOOK_ALLOWED = {"checkpoint", "checkpoint()", "force_checkpoint()", "quoted checkpoint()",
                    "backquoted checkpoint()", "checkpoint() after non-ascii",
                    "explain analyze checkpoint()", "query() runs sql", "enable_profiling()",
                    "truncate_duckdb_logs()"}


def _intact(tmp: Path, output: str = "") -> None:
    written = sorted(p.name for p in tmp.iterdir() if p.name not in ("secret.txt",)
                     and not p.name.endswith((".duckdb", ".wal", ".live.json", ".tmp")))
    assert written == [], f"a probe wrote {written}"
    assert not (tmp / "other.duckdb").exists()
    assert SECRET not in output
    assert "root:x:0:0" not in output


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    return tmp_path


def _closed_db(path: Path) -> Path:
    with Store(path) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo("closed-session", transport="run", status="complete"))
        for i in range(50):
            rec.add("closed-session", now_us(), "server", "run", "1",
                    Frame("interaction_update.text_delta", f"text {i}", b"\x0a\x02\x0a\x00"))
        rec.flush()
    return path


def _file_state(db: Path) -> tuple[int, str]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        n = con.execute("SELECT count(*) FROM frames").fetchone()
        tables = con.execute("SELECT string_agg(table_name, ',' ORDER BY table_name) FROM duckdb_tables()").fetchone()
        return (int(n[0]) if n else -1), str(tables[0] if tables else "")
    finally:
        con.close()


def _refused_by_api(query: Callable[[str], object], sql: str) -> str:
    with pytest.raises((QueryRefused, StoreError, duckdb.Error)) as info:
        query(sql)
    return str(info.value)


def test_parser_classification() -> None:
    for ok in ("SELECT 1", "FROM frames", "DESCRIBE frames", "SHOW TABLES", "SUMMARIZE frames", "VALUES (1)",
               "EXPLAIN SELECT 1", "EXPLAIN ANALYZE SELECT 1", "explain /* c */ analyse select 1",
               "EXPLAIN (FORMAT JSON) SELECT 1", "WITH x AS (SELECT 1) SELECT * FROM x"):
        check_read_only(ok)
    for bad, word in (("EXPLAIN ANALYZE DELETE FROM frames", "EXPLAIN of DELETE"),
                      ("EXPLAIN ANALYZE CREATE TABLE x AS SELECT 1", "EXPLAIN of CREATE"),
                      ("EXPLAIN (ANALYZE) INSERT INTO t VALUES (1)", "EXPLAIN of INSERT"),
                      ("PRAGMA table_info('frames')", "pragma_table_info"), ("CALL checkpoint()", "got CALL"),
                      ("PIVOT frames ON kind", "got MULTI"), ("BEGIN", "got TRANSACTION")):
        with pytest.raises(ValueError, match="read-only") as info:
            check_read_only(bad)
        assert word in str(info.value)


@pytest.mark.slow
def test_closed_database_workbench_sql(work: Path) -> None:
    db = _closed_db(work / "closed.duckdb")
    before = _file_state(db)
    for name, sql in probes(work).items():
        r = run_workbench("sql", sql, "--db", str(db))
        assert r.returncode == 2, f"{name}: {r.stdout}{r.stderr}"
        assert "Traceback" not in r.stderr, name
        _intact(work, r.stdout + r.stderr)
    assert _file_state(db) == before
    # still usable, and the limits: a slow query is interrupted, a huge result refused
    assert run_workbench("sql", "SELECT count(*) AS n FROM frames", "--json", "--db", str(db)).stdout.strip() == '{"n": 50}'
    r = run_workbench("sql", SLOW, "--timeout", "1", "--db", str(db))
    assert r.returncode == 2, r.stderr
    assert "interrupted" in r.stderr, r.stderr
    assert "1 s time limit" in r.stderr, r.stderr
    r = run_workbench("sql", "SELECT repeat('x', 100000) AS s FROM range(1000)", "--max-result-mb", "5", "--db", str(db))
    assert r.returncode == 2, r.stderr
    assert "larger than the 5 MiB cap" in r.stderr, r.stderr


def test_closed_database_tui_data_layer_and_reader(work: Path) -> None:
    db = _closed_db(work / "closed.duckdb")
    before = _file_state(db)
    data = TuiData(db)
    reader = open_reader(db)
    assert isinstance(reader, LocalReader)
    try:
        for sql in probes(work).values():
            _intact(work, _refused_by_api(data.query, sql))
            _intact(work, _refused_by_api(reader.query, sql))
        assert [s.session_id for s in data.sessions()] == ["closed-session"]
    finally:
        data.close()
        reader.close()
    assert _file_state(db) == before


@pytest.mark.slow
def test_notebook_connect_file_and_live(work: Path) -> None:
    db = _closed_db(work / "closed.duckdb")
    before = _file_state(db)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    con = connect(db)
    try:
        con.execute("CHECKPOINT")  # allowed in a notebook: a no-op on the read-only capture
        for name, sql in probes(work).items():
            if name in NOTEBOOK_ALLOWED:
                continue
            with pytest.raises(duckdb.Error) as info:
                con.execute(sql).fetchall()
            _intact(work, str(info.value))
            assert name
            assert con.sql("SELECT count(*) FROM frames").fetchall() == [(50,)]
        con.sql("CREATE TEMP TABLE mine AS SELECT 1 AS x")  # the documented scratch space still works
        assert con.sql("SELECT count(*) FROM v_frames").fetchall() == [(50,)]
    finally:
        con.close()
    assert _file_state(db) == before
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest

    live = work / "live.duckdb"
    with live_writer(live) as writer:
        con = connect(live)
        try:
            assert con.sql("SELECT count(*) FROM frames").fetchall() == [(100,)]
            for name, sql in probes(work).items():
                if name in NOTEBOOK_ALLOWED:
                    continue
                with pytest.raises(duckdb.Error) as info:
                    con.execute(sql).fetchall()
                _intact(work, str(info.value))
        finally:
            con.close()
        total, frames, _tables = writer.ask("count").split()
        assert total == frames == "100"


@pytest.mark.slow
def test_live_service_of_a_writer_process(work: Path) -> None:
    db = work / "live.duckdb"
    with live_writer(db) as writer:
        total, frames, tables = writer.ask("count").split()
        assert total == frames == "100"
        reader = open_reader(db)
        assert isinstance(reader, RemoteReader)
        data = TuiData(db)
        assert data.live
        for name, sql in probes(work).items():
            r = run_workbench("sql", sql, "--db", str(db))
            assert r.returncode == 2, f"{name}: {r.stdout}{r.stderr}"
            assert "(live)" in r.stderr, name
            assert "Traceback" not in r.stderr, name
            _intact(work, r.stdout + r.stderr)
            _intact(work, _refused_by_api(reader.query, sql))
            _intact(work, _refused_by_api(data.query, sql))
        data.close()
        # the writer is unharmed: its frames and tables are all there and it keeps writing
        assert writer.ask("count").split() == [total, frames, tables]
        assert writer.ask("add") == "110"
        r = run_workbench("sql", "SELECT count(*) AS n FROM frames", "--json", "--db", str(db))
        assert json.loads(r.stdout) == {"n": 110}
        # a slow query on the writer's instance is interrupted at the limit (and only that query)
        r = run_workbench("sql", SLOW, "--timeout", "1", "--db", str(db))
        assert r.returncode == 2, r.stderr
        assert "interrupted" in r.stderr, r.stderr
        assert "1 s time limit" in r.stderr, r.stderr
        r = run_workbench("sql", "SELECT repeat('x', 100000) AS s FROM range(1000)", "--max-result-mb", "5", "--db", str(db))
        assert r.returncode == 2, r.stderr
        assert "larger than the 5 MiB cap" in r.stderr, r.stderr
        assert writer.ask("add") == "120"
        assert writer.ask("count").split()[:2] == ["120", "120"]
    assert _file_state(db)[0] == 120
