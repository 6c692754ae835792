"""Store ingest throughput: frames/s written into a DuckDB file.

Three ways of writing the same rows (200-byte payloads by default), each into a fresh file:

* ``arrow baseline`` — a prebuilt ``pyarrow.Table`` inserted with one ``INSERT … SELECT`` (the
  fastest DuckDB path; building the table is not timed);
* ``Store.insert_frames`` — ``FrameBatch.add`` per classified frame, then one insert per batch;
* ``Recorder`` — what capture/import do: ``Recorder.add`` per frame (seq numbers, session time
  bounds) and ``flush()`` every ``--batch`` frames; synchronous, and with ``background=True``
  (inserts on a writer thread, overlapping with building the next batch);
* the synchronous ``Recorder`` once more on a file without the schema-3 unique indexes
  (``frames_session_seq``, ``frames_source_key``): what the no-duplicates guarantee costs.

Then what storing the findings at the end of an import costs (``workbench.analysis.stored
.refresh_findings``, the call ``workbench import`` makes once its sessions are written): a
session of ``--rows`` frames in agent-traffic proportions (``benchmarks/diagnose.py``'s generator,
tool calls, blobs, a final heartbeat loop) is analysed and its rows stored, timed against writing
the same number of frames through the ``Recorder``.

Every path is timed until its file is closed (the checkpoint that compresses what batched
inserts left in the WAL is part of storing them; the baseline's one large insert compressed its
rows as it wrote them); the ratio until the last insert returned is printed beside it.
Each figure is a ratio to the arrow baseline of the same round (every path runs once per round,
back to back, in alternating order): min / median / max over ``--repeat`` rounds (default 5), so
a load spike on a shared machine moves one round, not the median.

    python benchmarks/ingest.py [--rows N] [--batch B] [--payload BYTES] [--repeat R]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import duckdb
import pyarrow as pa
from goals import goal

from workbench.decode.classify import SERVER_MSG, Frame
from workbench.store.db import FRAME_SCHEMA, FrameBatch, Store, now_us
from workbench.store.recorder import Recorder

KINDS = ["interaction_update.text_delta", "interaction_update.heartbeat", "kv_server_message.set_blob_args",
         "exec_server_message.shell_args", "interaction_update.partial_tool_call"]


def make_frames(n: int, size: int, seed: int = 3) -> list[Frame]:
    """Frames whose payloads look like agent traffic: a protobuf header and varied text."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randint(2, 9)).hex()[:rng.randint(2, 9)].encode() for _ in range(5000)]
    out = []
    for i in range(n):
        kind = KINDS[i % len(KINDS)]
        text = b" ".join(rng.choices(words, k=size // 4))[: size - 6]
        payload = b"\x0a" + bytes((len(text) + 4,)) + b"\x0a\x02\x0a" + bytes((len(text),)) + text
        out.append(Frame(kind, f"{kind.rsplit('.', 1)[-1]} #{i}", payload.ljust(size, b"\x00"), 0, SERVER_MSG,
                         None, None, i if "exec" in kind or "kv" in kind else None,
                         f"toolu_{i // 50}" if "tool" in kind else None))
    return out


def _closed(s: Store, t0: float, written: float) -> tuple[float, float]:
    """(seconds until the last write returned, seconds until the file was closed)."""
    s.close()
    return written - t0, time.perf_counter() - t0


def run_arrow(path: Path, table: pa.Table) -> tuple[float, float]:
    s = Store(path)  # same schema (created by the migrations), same file layout
    con = s.con
    t0 = time.perf_counter()
    con.register("_bench_in", table)
    con.execute("INSERT INTO frames SELECT * FROM _bench_in")
    con.unregister("_bench_in")
    return _closed(s, t0, time.perf_counter())


def run_batches(path: Path, frames: list[Frame], batch: int, ts0: int) -> tuple[float, float]:
    s = Store(path)
    t0 = time.perf_counter()
    b = FrameBatch()
    for i, f in enumerate(frames):
        b.add("bench", i, ts0 + i, "server", "run", "1", f)
        if len(b) >= batch:
            s.insert_frames(b)
            b.clear()
    s.insert_frames(b)
    return _closed(s, t0, time.perf_counter())


def run_recorder(path: Path, frames: list[Frame], batch: int, ts0: int, background: bool = False,
                 unique_keys: bool = True) -> tuple[float, float]:
    s = Store(path)
    if not unique_keys:
        s.con.execute("DROP INDEX frames_session_seq")
        s.con.execute("DROP INDEX frames_source_key")
    rec = Recorder(s, background=background)
    t0 = time.perf_counter()
    add = rec.add
    for i, f in enumerate(frames):
        add("bench", ts0 + i, "server", "run", "1", f)
        if (i + 1) % batch == 0:
            rec.flush()
    rec.close()  # includes waiting for the background writer
    return _closed(s, t0, time.perf_counter())


def run_python(frames: list[Frame], batch: int, ts0: int) -> tuple[float, float]:
    """(seconds in ``Recorder.add``, seconds in ``FrameBatch.to_arrow``) for the frames, nothing stored:
    the Python part of ``Recorder.add + flush``."""
    with Store(":memory:") as s:
        rec = Recorder(s)
        add = rec.add
        adding = converting = 0.0
        for start in range(0, len(frames), batch):
            t0 = time.perf_counter()
            for i in range(start, min(start + batch, len(frames))):
                add("bench", ts0 + i, "server", "run", "1", frames[i])
            t1 = time.perf_counter()
            rec.batch.to_arrow()
            converting += time.perf_counter() - t1
            adding += t1 - t0
            rec.batch.clear()
    return adding, converting


def count(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute("SELECT count(*), count(DISTINCT seq) FROM frames").fetchall()[0]
    finally:
        con.close()
    assert row[0] == row[1]
    return int(row[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--batch", type=int, default=20_000, help="frames per flush / insert")
    ap.add_argument("--payload", type=int, default=200, help="payload bytes per frame")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (every path once each); medians are reported")
    args = ap.parse_args(argv)

    frames = make_frames(args.rows, args.payload)
    ts0 = now_us()
    prebuilt = FrameBatch()
    for i, f in enumerate(frames):
        prebuilt.add("bench", i, ts0 + i, "server", "run", "1", f)
    table = prebuilt.to_arrow()
    assert table.schema == FRAME_SCHEMA
    n = args.rows
    # each run: (seconds until the last write returned, seconds until the file was closed)
    results: dict[str, list[tuple[float, float]]] = {
        "arrow baseline (prebuilt table)": [], "Store.insert_frames(FrameBatch)": [], "Recorder.add + flush": [],
        "Recorder(background=True)": [], "Recorder, no unique keys": []}
    names = list(results)
    runners = [lambda p: run_arrow(p, table), lambda p: run_batches(p, frames, args.batch, ts0),
               lambda p: run_recorder(p, frames, args.batch, ts0),
               lambda p: run_recorder(p, frames, args.batch, ts0, background=True),
               lambda p: run_recorder(p, frames, args.batch, ts0, unique_keys=False)]
    python_only: list[tuple[float, float]] = []
    with tempfile.TemporaryDirectory(prefix="wb-ingest-") as tmp:
        for r in range(args.repeat):
            # One round runs every path once, back to back, so each is paired with the baseline
            # measured next to it (a shared machine's load drifts over seconds, not within a round);
            # every other round runs them in reverse, so no path always goes first.
            paths = {name: Path(tmp) / f"{k}-{r}.duckdb" for k, name in enumerate(names)}
            order = list(range(len(names)))
            for k in order if r % 2 == 0 else order[::-1]:
                results[names[k]].append(runners[k](paths[names[k]]))
            python_only.append(run_python(frames, args.batch, ts0))
            for p in paths.values():
                assert count(p) == n
        size_mb = sum(p.stat().st_size for p in Path(tmp).glob("*-0.duckdb")) / len(results) / 1e6

    # The figures that count run until the file is closed. The baseline's one large insert is
    # compressed and written to the file as it goes (DuckDB writes an insert of a row group or more
    # straight to the file), while batches of 20,000 go to the WAL and are compressed at the
    # checkpoint that closing the file makes: stopping the clock when the last insert returns
    # left that work (≈ 1.6 µs a frame) out of the batched paths only.
    closed = {k: [t for _, t in v] for k, v in results.items()}
    written = {k: [t for t, _ in v] for k, v in results.items()}
    med = {k: median(v) for k, v in closed.items()}
    # the ratio of each round (baseline time / path time), then min/median/max over the rounds
    paired = {k: sorted(b / t for b, t in zip(closed[names[0]], v, strict=True)) for k, v in closed.items()}
    paired_written = {k: median(b / t for b, t in zip(written[names[0]], v, strict=True))
                      for k, v in written.items()}
    print(f"{n:,} frames, {args.payload}-byte payloads, batches of {args.batch:,}, {args.repeat} paired rounds; "
          f"~{size_mb:.0f} MB per file; duckdb {duckdb.__version__}, pyarrow {pa.__version__}")
    print()
    print(f"{'path (timed until the file is closed)':40} {'frames/s':>10} {'vs arrow per round: min / median / max':>40}"
          f" {'until written':>14}")
    for name, t in med.items():
        ratios = paired[name]
        print(f"{name:40} {n / t:10,.0f}   {ratios[0]:6.2f}x / {median(ratios):6.2f}x / {ratios[-1]:6.2f}x"
              f" {paired_written[name]:12.2f}x")
    us = 1e6 / n
    adding, converting = median(a for a, _ in python_only) * us, median(c for _, c in python_only) * us
    rec_written, base_written = median(written["Recorder.add + flush"]) * us, median(written[names[0]]) * us
    print(f"where the time goes, µs a frame (medians): arrow baseline {base_written:.2f} insert + "
          f"{med[names[0]] * us - base_written:.2f} close; Recorder.add + flush {adding:.2f} Recorder.add + "
          f"{converting:.2f} to_arrow + {rec_written - adding - converting:.2f} DuckDB inserts and session rows + "
          f"{med['Recorder.add + flush'] * us - rec_written:.2f} close (the checkpoint)")
    keyed, free = med["Recorder.add + flush"], med["Recorder, no unique keys"]
    print(f"unique keys (schema 3): Recorder.add + flush {n / keyed:,.0f} frames/s with them, {n / free:,.0f} "
          f"without: {keyed / free:.2f}x the time")
    print()
    for name in ("Recorder(background=True)", "Recorder.add + flush"):
        t = med[name]
        ratio = median(paired[name])
        print(f"{name}:")
        print("  " + goal("ingest_rate").line(n / t, f"{n / t:,.0f} frames/s"))
        print("  " + goal("ingest").line(ratio, f"{ratio:.2f}× (median of {args.repeat} paired rounds, until closed; "
                                                 f"{paired_written[name]:.2f}× until the last insert returned)"))
    print(yardstick_line())
    print()
    stored = run_findings(n)
    write = med["Recorder.add + flush"]
    print(f"findings stored at the end of an import: {stored:.2f} s for one {n:,}-frame session "
          f"({n / stored:,.0f} frames/s), {stored / write:.2f}x the time of writing its frames with the Recorder "
          f"(the import then takes {(write + stored) / write:.2f}x as long)")
    return 0


def run_findings(n: int) -> float:
    """Seconds ``refresh_findings`` takes on one realistic ``n``-frame session (rows written, stamped)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from diagnose import SID, generate

    from workbench.analysis.stored import refresh_findings

    with tempfile.TemporaryDirectory(prefix="wb-findings-") as tmp, Store(Path(tmp) / "f.duckdb") as store:
        generate(store, n)
        t0 = time.perf_counter()
        results = refresh_findings(store, [SID])
        took = time.perf_counter() - t0
        assert results and results[SID].findings, "the generated session has a heartbeat loop to find"
    return took


def yardstick_line() -> str:
    from yardstick import measure  # the machine's yardstick (benchmarks/yardstick.py), run after the figures

    return measure().line()


if __name__ == "__main__":
    sys.exit(main())
