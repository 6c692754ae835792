"""The machine's yardstick: two figures every benchmark prints beside its own, so that figures taken on
two machines (the one a goal was tuned on, a fresh clone on another of the same kind) can be compared.

- ``python -c pass``: a fresh interpreter's start, median of 7 (start-up goals scale with it);
- the GROUP BY scan: ``SELECT k, count(*) … GROUP BY k`` over 1,000,000 generated rows in an
  in-memory DuckDB, median of 5 (reading goals scale with it: it is the diagnose benchmark's
  baseline, on data that is the same everywhere).

A figure that misses its goal on a machine whose yardstick is slower by the same factor says the
machine is slower, not the code. ``python benchmarks/yardstick.py`` prints it alone.

A benchmark imports this file as ``yardstick`` (``python benchmarks/x.py`` puts ``benchmarks/`` on
``sys.path``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Yardstick:
    python_start_s: float
    group_by_s: float
    load: float

    def line(self) -> str:
        return (f"yardstick: python -c pass {self.python_start_s * 1000:.0f} ms, GROUP BY scan of 1M rows "
                f"{self.group_by_s * 1000:.0f} ms (load average {self.load:.2f}, {os.cpu_count()} cores)")


def python_start(runs: int = 7) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def group_by_scan(runs: int = 5, rows: int = 1_000_000) -> float:
    import duckdb  # only a benchmark that reads pays for it

    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT (i % 37)::VARCHAR AS k, i AS v FROM range({rows}) r(i)")
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        con.execute("SELECT k, count(*) FROM t GROUP BY k").fetchall()
        times.append(time.perf_counter() - t)
    con.close()
    return statistics.median(times)


def measure() -> Yardstick:
    return Yardstick(python_start(), group_by_scan(), os.getloadavg()[0])


if __name__ == "__main__":
    print(measure().line())
