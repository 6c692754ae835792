"""Start-up time of the commands a user types most, against ``python -c pass`` in the same run.

    python benchmarks/startup.py [--runs 7] [--against CHECKOUT]

Each command is a fresh process (``python -m workbench …``, the source of this checkout, or of
``--against`` too): ``--help``, ``sessions`` on a small database (the three sessions of the TUI's
sample database) and ``decode 00000000040a026a00`` (one heartbeat). Runs are interleaved — one
of each command, then the next round — so that load from other processes hits them alike. Prints
min/median/max wall time, the ratio of the medians to ``python -c pass``, and each goal (from
``benchmarks/goals.py``) with ``met`` or ``MISSED``. ``--against`` times another checkout's
source beside this one (e.g. the commit before a change), for a before/after in one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from goals import goal

ROOT = Path(__file__).resolve().parents[1]
HEARTBEAT = "00000000040a026a00"


def _env(source: Path, pycache: Path) -> dict[str, str]:
    # Without PYTHONDONTWRITEBYTECODE: an installed workbench runs from compiled bytecode (the untimed
    # warm-up run writes it, into the temporary folder, not the checkouts), not by compiling every
    # module on each start.
    drop = ("_ARGCOMPLETE", "PYTHONPATH", "WORKBENCH_DB", "PYTHONDONTWRITEBYTECODE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = str(source)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _timed(argv: list[str], env: dict[str, str], cwd: str) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode()[-400:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=7, help="runs of each command (at least 3; default 7)")
    ap.add_argument("--against", metavar="CHECKOUT", type=Path,
                    help="another checkout whose workbench is timed beside this one's")
    args = ap.parse_args()
    runs = max(3, args.runs)
    sources = {"": ROOT} | ({f" [{args.against.name}]": args.against.resolve()} if args.against else {})
    with tempfile.TemporaryDirectory(prefix="wb-startup-") as tmp:
        from workbench.tui.sample_db import build_sample_db

        db = Path(tmp) / "small.duckdb"
        build_sample_db(db)
        py = sys.executable
        cache = Path(tmp) / "pycache"
        cases: dict[str, tuple[list[str], dict[str, str], str | None]] = {
            "python -c pass (baseline)": ([py, "-c", "pass"], _env(ROOT, cache), None)}
        for tag, src in sources.items():
            wb = [py, "-m", "workbench"]
            cases[f"workbench --help{tag}"] = ([*wb, "--help"], _env(src, cache), "help")
            cases[f"workbench sessions{tag}"] = ([*wb, "sessions", "--db", str(db)], _env(src, cache), "sessions")
            cases[f"workbench decode {HEARTBEAT}{tag}"] = ([*wb, "decode", HEARTBEAT], _env(src, cache), "decode_cli")
        times: dict[str, list[float]] = {name: [] for name in cases}
        for argv, env, _ in cases.values():  # bytecode and the OS file cache, not timed
            _timed(argv, env, tmp)
        for _ in range(runs):
            for name, (argv, env, _) in cases.items():
                times[name].append(_timed(argv, env, tmp))
    base = statistics.median(times["python -c pass (baseline)"])
    load = os.getloadavg()
    print(f"{runs} interleaved runs each, python {sys.version.split()[0]}, load {load[0]:.2f} {load[1]:.2f}")
    print(f"{'command':<52}{'min':>8}{'median':>8}{'max':>8}{'× pass':>8}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<52}{min(ts):>8.3f}{med:>8.3f}{max(ts):>8.3f}{med / base:>7.1f}×")
    print()
    for name, (_, _, key) in cases.items():
        if key and not name.endswith("]"):
            med = statistics.median(times[name])
            print(goal(key).line(med, f"{med:.3f} s median ({med / base:.1f}× python -c pass)"))
    print(yardstick_line())
    return 0


def yardstick_line() -> str:
    from yardstick import measure  # the machine's yardstick (benchmarks/yardstick.py), run after the figures

    return measure().line()


if __name__ == "__main__":
    sys.exit(main())
