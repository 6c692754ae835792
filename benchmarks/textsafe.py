"""The printer (``workbench.textsafe``) on the hot path: a table of 1,000,000 rows.

Formats 1M rows of four text cells (a session id, a kind, a tool name, a summary; none with a
character to escape, as in nearly every table) into aligned lines the way ``print_table`` does,
with each cell through ``escape``, against the baseline measured in the same run: the same lines
with what the cells went through before the printer (``str(v).replace("\\n", "\\\\n")``). Rounds
are paired (baseline, printer, …) and the median ratio is judged against the goal in
``benchmarks/goals.py``. Also printed: the same table when every cell holds an escape sequence.

    python benchmarks/textsafe.py [--rows 1000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from goals import goal

from workbench.textsafe import escape

WIDTHS = (20, 44, 16, 60)


def _old_cell(v: object) -> str:
    return str(v).replace("\n", "\\n")


def _format(rows: list[tuple[str, ...]], cell: Callable[[object], str]) -> float:
    t = time.perf_counter()
    out = []
    for row in rows:
        out.append("  ".join(cell(v).ljust(w) for v, w in zip(row, WIDTHS, strict=True)).rstrip())
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    clean = [(f"har-{i:016x}", "interaction_update.tool_call_delta", f"read_file_{i % 50}",
              f'text "the answer, part {i}"') for i in range(args.rows)]
    hostile = [(f"har-{i:016x}\x1b[2J", "interaction_update.text_delta", f"read\u202efile_{i % 50}",
                f'text "\x1b]0;title\x07 part {i}"') for i in range(args.rows)]
    escape("\x1b")  # compile the pattern outside the timing
    ratios, base_s, new_s = [], [], []
    for _ in range(args.rounds):
        b = _format(clean, _old_cell)
        n = _format(clean, escape)
        base_s.append(b)
        new_s.append(n)
        ratios.append(n / b)
    hostile_s = _format(hostile, escape)
    med = statistics.median
    print(f"{args.rows:,} rows × 4 cells, medians of {args.rounds} paired rounds")
    print(f"baseline (cells as before the printer): {med(base_s):.3f} s")
    print(f"through the printer:                    {med(new_s):.3f} s  (min/median/max ratio "
          f"{min(ratios):.2f} / {med(ratios):.2f} / {max(ratios):.2f})")
    print(f"every cell holding an escape sequence:  {hostile_s:.3f} s (one round)")
    print(goal("textsafe").line(med(ratios)))


if __name__ == "__main__":
    main()
