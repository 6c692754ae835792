"""``readonly.run_read`` on a real DuckDB file: what each query leaves behind."""

from __future__ import annotations

import threading
from pathlib import Path

import duckdb

from workbench.store.readonly import ReadLimits, confine, run_read


def test_no_timer_thread_outlives_a_read(tmp_path: Path) -> None:
    """Each read's time-limit timer is gone when the read returns. A timer thread still alive holds
    the connection; if it drops the last reference while the interpreter exits, the process aborts
    ("FATAL: exception not rethrown": CI saw `workbench frames` die of SIGABRT after printing
    every frame)."""
    path = tmp_path / "t.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE t AS SELECT range AS i FROM range(1000)")
    con = duckdb.connect(str(path), read_only=True)
    try:
        confine(con, [])
        for _ in range(50):
            table = run_read(con, "SELECT count(*) AS n FROM t", limits=ReadLimits(timeout_s=60))
            assert table.column("n").to_pylist() == [1000]
            timers = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
            assert timers == []
    finally:
        con.close()
