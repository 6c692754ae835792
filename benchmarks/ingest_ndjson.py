"""Throughput of ``workbench import`` on stream-json NDJSON.

Prints frames/s for the import (parse + classify + Arrow insert into a fresh DuckDB file) and the
ratio to a baseline measured in the same run: ``json.loads`` of every line, the least any
importer must do. Usage: ``python benchmarks/ingest_ndjson.py [--repeat 200] [--sessions 1]``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from workbench.ingest import import_file, open_store

SAMPLE = Path(__file__).parents[1] / "captures" / "samples" / "cli-stream-json.ndjson"


def build(path: Path, repeat: int, sessions: int) -> int:
    lines = SAMPLE.read_text().splitlines()
    n = 0
    with path.open("w") as fh:
        for i in range(repeat):
            sid = f"{i % sessions:08x}"
            for line in lines:
                fh.write(line.replace("5b0e9d1c", sid) + "\n")
                n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=200, help="copies of the sample transcript")
    ap.add_argument("--sessions", type=int, default=1, help="spread the copies over this many sessions")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "bench.ndjson"
        n = build(src, args.repeat, args.sessions)
        t0 = time.perf_counter()
        with src.open("rb") as fh:
            for line in fh:
                json.loads(line)
        base = time.perf_counter() - t0
        store = open_store(Path(tmp) / "bench.duckdb")
        t0 = time.perf_counter()
        res = import_file(src, store)
        took = time.perf_counter() - t0
        store.close()
    assert res.frames == n
    print(f"lines: {n:,} in {args.sessions} session(s)")
    print(f"baseline json.loads: {n / base:,.0f} lines/s")
    print(f"workbench import:    {n / took:,.0f} frames/s ({took:.2f} s)")
    print(f"ratio import/baseline: {base / took:.3f} (import is {took / base:.1f}x slower than parsing alone)")


if __name__ == "__main__":
    main()
