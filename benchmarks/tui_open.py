"""Time to first paint of the TUI session screen for 10k, 100k and 1M-frame sessions.

For each size: build a capture database (real Recorder writes, heartbeat stretches included),
then start ``WorkbenchApp(db, session)`` headless and measure from app start until the timeline
has drawn real rows (min/median/max of 3, after one warm-up open that pays the process's one-time
imports), then until the whole screen is there (the detail and panels column, built after the
timeline's first rows, with the frame under the cursor decoded). CPU seconds of the process (all
threads) are printed beside the wall time: on a shared machine they move less. The baseline,
measured in the same run on the same file, is the least any viewer must do: ``SELECT count(*)``
plus the first page of rows by SQL. Goal: ``benchmarks/goals.py`` (tui_first_paint).

    python benchmarks/tui_open.py [--sizes 10000,100000,1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from goals import goal

from workbench.store.reader import open_reader
from workbench.tui.app import WorkbenchApp
from workbench.tui.detail import FrameDetailView
from workbench.tui.sample_db import build_big_db
from workbench.tui.session_screen import SessionScreen
from workbench.tui.timeline import Timeline

SESSION = "big"


def baseline(db: Path) -> float:
    t = time.perf_counter()
    reader = open_reader(db)
    reader.query("SELECT count(*) FROM frames WHERE session_id = ?", [SESSION])
    reader.query("SELECT seq, ts, direction, kind, summary FROM frames WHERE session_id = ? "
                 "ORDER BY seq LIMIT 60", [SESSION])
    reader.close()
    return time.perf_counter() - t


async def first_paint(db: Path, whole: bool = False) -> tuple[float, int]:
    """Seconds until the timeline shows rows (``whole``: until the whole screen is there) and rows."""
    t = time.perf_counter()
    app = WorkbenchApp(db, SESSION)
    async with app.run_test(size=(160, 50)) as pilot:
        while True:
            screen = app.screen
            tl = screen.query(Timeline).first() if screen.query(Timeline) else None
            if tl is not None and tl.first_paint is not None and (not whole or _whole(screen)):
                elapsed = time.perf_counter() - t
                rows = len(tl.index) if tl.index is not None else 0
                break
            await pilot.pause(0.005)
            if time.perf_counter() - t > 120:
                raise RuntimeError(f"{db}: no first paint after 120 s")
        return elapsed, rows


def _whole(screen: object) -> bool:
    if not isinstance(screen, SessionScreen) or not screen.side_ready:
        return False
    return screen.query_one(FrameDetailView).detail is not None


def timed(db: Path, whole: bool = False) -> tuple[float, float, int]:
    """(wall s, CPU s of the process, rows) of one open."""
    cpu = time.process_time()
    wall, rows = asyncio.run(first_paint(db, whole))
    return wall, time.process_time() - cpu, rows


def spread(xs: list[float]) -> str:
    return f"{min(xs):.3f}/{statistics.median(xs):.3f}/{max(xs):.3f}"


async def scroll_latency(db: Path) -> float:
    """Jump to the middle, the end and a third of the way: median time until that row is drawn."""
    app = WorkbenchApp(db, SESSION)
    async with app.run_test(size=(160, 50)) as pilot:
        while not (isinstance(app.screen, SessionScreen) and app.screen.index_complete
                   and app.screen.query_one(Timeline).first_paint):
            await pilot.pause(0.005)
        tl = app.screen.query_one(Timeline)
        assert tl.index is not None
        times = []
        for target in (len(tl.index) // 2, len(tl.index) - 1, len(tl.index) // 3):
            t = time.perf_counter()
            tl.jump_to_row(target)
            while tl.current is None or tl.current.seq not in tl.rows_cache:
                await pilot.pause(0.005)
            times.append(time.perf_counter() - t)
        return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--keep", help="keep the databases in this folder (reused when present)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="wb-tui-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    if not args.keep:
        atexit.register(shutil.rmtree, folder, True)
    print("first paint, whole screen and baseline: min/median/max of 3 runs, wall seconds (CPU seconds)")
    print(f"{'frames':>9}  {'first paint':>19} {'(cpu)':>19}  {'whole screen':>19}  {'baseline':>19}  {'ratio':>6}  "
          f"{'jump+draw':>9}  rows   (baseline: SELECT count(*) + first 60 rows by SQL on the same file)")
    for n in sizes:
        db = folder / f"tui-{n}.duckdb"
        if not db.exists():
            t = time.perf_counter()
            build_big_db(db, n, SESSION)
            print(f"  (built {db.name} in {time.perf_counter() - t:.1f} s)")
        if n == sizes[0]:
            asyncio.run(first_paint(db))   # warm-up: first-time imports and CSS parsing, not per open
        base = [baseline(db) for _ in range(3)]
        runs = [timed(db) for _ in range(3)]
        wholes = [timed(db, whole=True)[0] for _ in range(3)]
        paint, rows = statistics.median(r[0] for r in runs), runs[0][2]
        jump = asyncio.run(scroll_latency(db))
        verdict = goal("tui_first_paint").verdict(paint) if n >= 1_000_000 else ""
        print(f"{n:>9}  {spread([r[0] for r in runs]):>19} {spread([r[1] for r in runs]):>19}  {spread(wholes):>19}  "
              f"{spread(base):>19}  {paint / statistics.median(base):>5.1f}×  {jump * 1000:>6.0f} ms  {rows}  {verdict}")
        if n >= 1_000_000:
            print(goal("tui_first_paint").line(paint, f"{paint:.3f} s at {n:,} frames"))
    print(f"load average {os.getloadavg()[0]:.2f} (2-core machine: above 2, wall times stretch)")
    print(yardstick_line())


def yardstick_line() -> str:
    from yardstick import measure  # the machine's yardstick (benchmarks/yardstick.py), run after the figures

    return measure().line()


if __name__ == "__main__":
    main()
