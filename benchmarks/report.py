"""`workbench report` of a 200k- and a 1M-frame session: wall time, output size and peak RSS.

The sessions are the diagnose benchmark's (``diagnose.generate``: a realistic mix of deltas, tool
calls with execs, KV blobs and heartbeats, ending in a heartbeat stall), written once per size to a
temporary DuckDB file. Each round runs, back to back, the in-process baseline — the session's
``GROUP BY kind`` scan (the yardstick the closing note prints beside every figure) and a read of
every frame's light columns (seq, time, direction, kind, ref_id) into Arrow, the floor of walking
the session — and then ``workbench report`` as a user runs it (a fresh process; its peak RSS from
``wait4``). Figures are medians over the rounds, printed with the machine's yardstick
(``yardstick.py``: ``python -c pass`` and a GROUP BY scan of 1M rows).

    python benchmarks/report.py [--sizes 200000,1000000] [--rounds 3] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diagnose import SID, generate
from goals import goal
from yardstick import measure

from workbench.store.db import Store
from workbench.store.reader import open_reader


def _run(argv: list[str]) -> tuple[float, int, float]:
    """Wall time, peak RSS (KiB) and CPU time (user + system, every thread) of one command, run to
    completion: on a busy machine the CPU time is the figure that holds."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err[-400:]}")
    return took, usage.ru_maxrss, usage.ru_utime + usage.ru_stime


def _baselines(db: Path) -> tuple[float, float]:
    reader = open_reader(db)
    try:
        t0 = time.perf_counter()
        reader.query("SELECT kind, count(*) FROM frames WHERE session_id = ? GROUP BY kind", [SID])
        scan = time.perf_counter() - t0
        t0 = time.perf_counter()
        reader.query("SELECT seq, epoch_us(ts), direction, kind, ref_id FROM frames WHERE session_id = ? ORDER BY seq",
                     [SID])
        light = time.perf_counter() - t0
    finally:
        reader.close()
    return scan, light


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="200000,1000000", help="session sizes in frames (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds per size (default 3)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="wb-report-bench-"))
    py = sys.executable
    try:
        print(measure().line())
        for n in (int(s) for s in args.sizes.split(",")):
            db = tmp / f"report-{n}.duckdb"
            with Store(db) as store:
                t0 = time.perf_counter()
                frames = generate(store, n)
                store.checkpoint()
            print(f"\n{frames:,} frames generated in {time.perf_counter() - t0:.1f} s")
            out = tmp / f"report-{n}.html"
            rows: list[tuple[float, float, float, int, float]] = []
            for _ in range(max(1, args.rounds)):
                scan, light = _baselines(db)
                took, rss, cpu = _run([py, "-m", "workbench", "report", SID, "--db", str(db), "-o", str(out)])
                rows.append((scan, light, took, rss, cpu))
            scan = statistics.median(r[0] for r in rows)
            light = statistics.median(r[1] for r in rows)
            took = statistics.median(r[2] for r in rows)
            rss = statistics.median(r[3] for r in rows) / 1024
            cpu = statistics.median(r[4] for r in rows)
            size = out.stat().st_size
            html = out.read_text()
            print(f"  baseline GROUP BY kind scan   {scan:8.3f} s   (this session's)")
            print(f"  baseline light columns read   {light:8.3f} s")
            print(f"  workbench report              {took:8.3f} s   {took / light:5.1f}× the light read, "
                  f"{took / scan:6.0f}× the scan; min {min(r[2] for r in rows):.3f} / max {max(r[2] for r in rows):.3f}; "
                  f"CPU {cpu:.2f} s")
            print(f"  output {size / 1e6:.2f} MB ({html.count('<text'):,} SVG texts, "
                  f"{html.count('<details'):,} frames in the table), peak RSS {rss:,.0f} MiB")
            if n >= 1_000_000:
                print("  " + goal("report").line(took, f"{took:.2f} s at {frames:,} frames (median of {len(rows)}; "
                                                        f"CPU {cpu:.2f} s)"))
                print("  " + goal("report_size").line(size / 1e6, f"{size / 1e6:.2f} MB at {frames:,} frames"))
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
