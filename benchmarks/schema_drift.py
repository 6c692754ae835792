"""Benchmark: ``workbench schema drift`` over a capture database (bounded windows, all frames walked).

The database holds sessions of the "next build" of tests/schema/next_build.py (a new exec type, a
new field, a renumbered field, binary file bytes), recorded with the overlay's decoder so its
frames carry the drift, plus long stretches of text deltas and heartbeats like real turns. Prints
the time to walk every protobuf frame, the time with ``--sample 200``, and the ratio to the
baseline measured in the same run: paging the same payloads out of DuckDB without looking at them
(what any per-frame walk has to read). Also prints the process's peak RSS growth during the walk.

Run: .venv/bin/python benchmarks/schema_drift.py [--sessions 200] [--turns 40]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "schema"))

from next_build import server_messages, write_next_build  # noqa: E402

from workbench.analysis.schema_drift import drift, payload_pages  # noqa: E402
from workbench.decode.classify import Decoder  # noqa: E402
from workbench.schema.loader import load_schema  # noqa: E402
from workbench.store.db import SessionInfo, Store  # noqa: E402
from workbench.store.reader import open_reader  # noqa: E402
from workbench.store.recorder import Recorder  # noqa: E402
from workbench.wire.envelope import encode  # noqa: E402

BASE_US = 1_790_000_000_000_000


def build(db: Path, sessions: int, turns: int, next_root: Path) -> int:
    """``sessions`` sessions of ``turns`` next-build turns each; returns the number of frames."""
    dec = Decoder(load_schema())
    body = b"".join(encode(m) for m in server_messages(next_root))
    frames = [f for f in dec.stream("run", "server").feed(body)]
    n = 0
    with Store(db) as store:
        rec = Recorder(store)
        for s in range(sessions):
            sid = f"bench-{s:05d}"
            rec.open_session(SessionInfo(sid, source="capture", transport="run", client_version="cli-bench",
                                         status="complete"))
            for t in range(turns):
                for i, f in enumerate(frames):
                    rec.add(sid, BASE_US + (s * turns + t) * 1_000_000 + i * 1000, "server", "run", "1", f)
                    n += 1
            if len(rec.batch) >= 50_000:
                rec.flush()
        rec.flush()
    return n


def baseline(db: Path) -> tuple[float, int]:
    """Page every walkable payload out of the database exactly as drift does, without decoding it."""
    r = open_reader(db)
    t0 = time.perf_counter()
    n = sum(len(rows) for rows in payload_pages(r, None))
    elapsed = time.perf_counter() - t0
    r.close()
    return elapsed, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sessions", type=int, default=200)
    ap.add_argument("--turns", type=int, default=40)
    args = ap.parse_args()
    schema = load_schema()
    with tempfile.TemporaryDirectory(prefix="wb-drift-bench-") as tmp:
        work = Path(tmp)
        root = write_next_build(work / "next")
        db = work / "drift.duckdb"
        n = build(db, args.sessions, args.turns, root)
        baseline(db)  # warm DuckDB's cache: both timed runs read a warm file
        base_s, base_n = baseline(db)
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = open_reader(db)
        t0 = time.perf_counter()
        rep = drift(r, schema)
        full_s = time.perf_counter() - t0
        rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        sampled = drift(r, schema, sample=200)
        sample_s = time.perf_counter() - t0
        r.close()
    print(f"database: {args.sessions} sessions, {n:,} frames; {len(rep.paths)} drift paths "
          f"({', '.join(p.path.rsplit('.', 2)[-2] + '.' + p.path.rsplit('.', 1)[-1] for p in rep.paths)})")
    print(f"baseline, paging the payloads only: {base_s:.2f} s ({base_n / base_s:,.0f} frames/s)")
    print(f"drift, every frame walked: {full_s:.2f} s ({rep.frames_walked / full_s:,.0f} frames/s); "
          f"ratio to the baseline: {full_s / base_s:.1f}x")
    print(f"drift --sample 200: {sample_s:.2f} s ({sampled.frames_walked:,} frames walked, "
          f"{len(sampled.paths)} paths); ratio to the baseline: {sample_s / base_s:.2f}x")
    print(f"peak RSS growth during the full walk: {(rss1 - rss0) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
