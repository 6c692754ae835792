"""Decoder time on hostile input: random and mutated bodies (≤ 64 KB) against valid ones.

``tests/decode/test_fuzz.py`` checks that such input never raises; this script measures how long
it takes. The inputs are the fuzz test's own (``tests/decode/decode_corpus.py``: seeded random
bytes, half behind an envelope header, and valid bodies with 1–4 random edits), each decoded once
whole and once streamed in random chunks, best of three runs per input (a run preempted on a shared
machine is re-measured). Baseline in the same run: the valid bodies the mutations start from
(including the 64 KB KV blob).

Goal (was an assertion in the fuzz test; ``benchmarks/goals.py``, decode_worst): no input ≤ 64 KB takes 50 ms.

    python benchmarks/decode_fuzz.py [--random N] [--mutated N] [--seed S]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

from goals import goal

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "decode"))

import decode_corpus as corpus  # noqa: E402

from workbench.decode.classify import Decoder, default_decoder  # noqa: E402


def _stream(dec: Decoder, body: bytes, key: tuple[str, str], cuts: list[int]) -> int:
    sd = dec.stream(*key)
    bounds = [0, *sorted(c % (len(body) + 1) for c in cuts), len(body)]
    n = 0
    for a, b in zip(bounds, bounds[1:], strict=False):
        n += len(sd.feed(body[a:b]))
    return n + len(sd.close())


def _time(dec: Decoder, body: bytes, key: tuple[str, str], cuts: list[int]) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        dec.decode_body(body, *key)
        _stream(dec, body, key, cuts)
        best = min(best, time.perf_counter() - t0)
    return best


def _report(name: str, timings: list[tuple[float, int, tuple[str, str]]]) -> tuple[float, float]:
    secs = [t for t, _, _ in timings]
    size = sum(n for _, n, _ in timings)
    worst, worst_n, worst_key = max(timings)
    rate = size / sum(secs) / 1e6 if sum(secs) else 0.0
    p99 = statistics.quantiles(secs, n=100)[98] if len(secs) >= 100 else worst
    print(f"{name:8} {len(timings):6} inputs  {size / 1e6:8.1f} MB  {rate:7.2f} MB/s  "
          f"median {statistics.median(secs) * 1e3:6.2f} ms  p99 {p99 * 1e3:6.2f} ms  "
          f"worst {worst * 1e3:6.2f} ms ({worst_n} B, {worst_key[0]}/{worst_key[1]})")
    return rate, worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=1500, help="random inputs (default 1500)")
    ap.add_argument("--mutated", type=int, default=1500, help="mutated inputs (default 1500)")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    dec = default_decoder()
    rng = random.Random(args.seed)
    keys = corpus.ALL_KEYS

    valid = []
    for key in keys:
        for body in (*corpus.bodies()[key], *((corpus.BIG,) if key == ("run", "server") else ())):
            valid.append((_time(dec, body, key, [len(body) // 2]), len(body), key))
    rnd = []
    for _ in range(args.random):
        key = rng.choice(keys)
        body, cuts = corpus.random_input(rng.randrange(2**32) // 3 * 3)  # every seed a 0–64 KB random body
        rnd.append((_time(dec, body, key, cuts), len(body), key))
    mut = []
    for _ in range(args.mutated):
        key = rng.choice(keys)
        body, cuts = corpus.mutated_input(rng.randrange(2**32), key)
        mut.append((_time(dec, body, key, cuts), len(body), key))

    base_rate, _ = _report("valid", valid)
    worst = 0.0
    for name, timings in (("random", rnd), ("mutated", mut)):
        rate, w = _report(name, timings)
        worst = max(worst, w)
        print(f"         {name} vs valid throughput: {rate / base_rate:.2f}×")
    print(goal("decode_worst").line(worst * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
