"""Imports land whole or resume: kill -9 mid-import then re-run = one clean import; re-imports of the
same or a grown file add no duplicate frame. Real ``workbench import`` processes on real files."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from import_files import write_flow_copies, write_ndjson_sessions

from workbench.store.db import Store

WORKBENCH = Path(sys.executable).parent / "workbench"


def _import(path: Path, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WORKBENCH), "import", str(path), "--db", str(db)], capture_output=True, text=True,
                          timeout=900)


def _table(db: Path, sql: str) -> pa.Table:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(sql).to_arrow_table()
    finally:
        con.close()


def _full(db: Path) -> tuple[pa.Table, pa.Table]:
    return (_table(db, "SELECT * FROM frames ORDER BY session_id, seq"),
            _table(db, "SELECT * FROM sessions ORDER BY session_id"))


def _kill_mid_import(path: Path, db: Path, wal_bytes: int) -> None:
    """Start an import and kill -9 it once its WAL holds ``wal_bytes`` (more than two commits of
    this file, so at least one is complete whatever is being written at the kill) while it runs."""
    Store(db).close()  # schema created and checkpointed first: from now on the WAL holds import commits only
    wal = db.with_name(db.name + ".wal")
    assert not wal.exists()
    proc = subprocess.Popen([str(WORKBENCH), "import", str(path), "--db", str(db)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while proc.poll() is None and not (wal.exists() and wal.stat().st_size > wal_bytes):
            time.sleep(0.01)
        assert proc.poll() is None, "the import finished before it could be killed"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def _assert_whole_sessions(db: Path) -> int:
    """Only whole sessions survive a kill: each stored session has all of its frames."""
    rows = _table(db, """SELECT s.session_id, s.frame_count, count(f.seq) AS n FROM sessions s
                         LEFT JOIN frames f USING (session_id) GROUP BY ALL""").to_pylist()
    orphans = _table(db, "SELECT count(*) AS n FROM frames WHERE session_id NOT IN (SELECT session_id FROM sessions)")
    assert orphans.column("n")[0].as_py() == 0
    assert all(r["frame_count"] == r["n"] for r in rows)
    return len(rows)


@pytest.mark.slow
def test_kill_9_mid_flow_import_then_rerun_is_one_clean_import(tmp_path: Path) -> None:
    flows = tmp_path / "big.flows"
    write_flow_copies(flows, 1000)  # 13,000 flows: 6,000 agent sessions
    db, clean = tmp_path / "killed.duckdb", tmp_path / "clean.duckdb"
    _kill_mid_import(flows, db, 5_000_000)  # a commit of 500 sessions writes ~2.4 MB of WAL
    survived = _assert_whole_sessions(db)
    assert 0 < survived < 6000
    rerun = _import(flows, db)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed: {survived} sessions already imported, skipped" in rerun.stdout
    assert rerun.stdout.startswith(f"imported {flows}: {6000 - survived} sessions")
    assert _import(flows, clean).returncode == 0
    got, want = _full(db), _full(clean)
    assert got[0].num_rows == 24000 and got[1].num_rows == 6000
    assert got[0].equals(want[0]) and got[1].equals(want[1])


@pytest.mark.slow
def test_kill_9_mid_ndjson_import_then_rerun_is_one_clean_import(tmp_path: Path) -> None:
    ndjson = tmp_path / "big.ndjson"
    lines = write_ndjson_sessions(ndjson, 4000)  # 80,000 lines in 4,000 sessions
    db, clean = tmp_path / "killed.duckdb", tmp_path / "clean.duckdb"
    _kill_mid_import(ndjson, db, 10_000_000)  # a commit of 5,000 lines writes ~4.8 MB of WAL
    survived = _table(db, "SELECT count(*) AS n FROM frames").column("n")[0].as_py()
    assert 0 < survived < lines
    rerun = _import(ndjson, db)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resumed: {survived} lines already imported, skipped" in rerun.stdout
    assert _import(ndjson, clean).returncode == 0
    got, want = _full(db), _full(clean)
    assert got[0].num_rows == lines
    assert got[0].equals(want[0]) and got[1].equals(want[1])


@pytest.mark.slow
def test_same_file_twice_and_grown_files_add_no_duplicates(tmp_path: Path) -> None:
    flows, ndjson = tmp_path / "a.flows", tmp_path / "a.ndjson"
    write_flow_copies(flows, 30)
    write_ndjson_sessions(ndjson, 3)
    db = tmp_path / "db.duckdb"
    for path in (flows, ndjson):
        assert _import(path, db).returncode == 0
    before = _full(db)
    for path in (flows, ndjson):
        again = _import(path, db)
        assert again.returncode == 0 and again.stdout.startswith(f"skipped {path}: already imported")
    assert _full(db)[0].equals(before[0])
    write_flow_copies(flows, 10, append=True)
    write_ndjson_sessions(ndjson, 2, append=True)
    for path in (flows, ndjson):
        assert _import(path, db).returncode == 0
    clean = tmp_path / "clean.duckdb"
    for path in (flows, ndjson):
        assert _import(path, clean).returncode == 0
    got, want = _full(db), _full(clean)
    assert got[0].num_rows == 40 * 24 + 5 * 20
    keys = got[0].column("source_key").to_pylist()
    assert len(set(keys)) == len(keys) and None not in keys
    assert got[0].equals(want[0])
