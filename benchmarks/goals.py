"""The goals every benchmark is judged by, in one place.

Each benchmark prints its figure next to the goal read from here and says ``met`` or ``MISSED``,
so that raising a goal (issue 24 raised several) cannot leave a script printing an old one.
``python benchmarks/goals.py`` lists them all.

A benchmark imports this file as ``goals`` (``python benchmarks/x.py`` puts ``benchmarks/`` on
``sys.path``); one loaded another way (a test importing it by path) calls :func:`load`.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


@dataclass(frozen=True)
class Goal:
    what: str          # what is measured, as a user would say it
    limit: float
    unit: str          # "s", "ms", "x" (a ratio to the baseline named in ``what``), "MiB", "MB", "frames/s"
    at_most: bool      # True: the figure must not exceed ``limit``; False: it must reach it
    source: str        # where the goal was set

    def text(self) -> str:
        unit = {"x": "×", "s": " s", "ms": " ms", "MiB": " MiB", "MB": " MB", "frames/s": " frames/s"}[self.unit]
        limit = f"{self.limit:,.0f}" if self.limit >= 1000 else f"{self.limit:g}"
        return f"{'≤' if self.at_most else '≥'} {limit}{unit}"

    def met(self, figure: float) -> bool:
        return figure <= self.limit if self.at_most else figure >= self.limit

    def verdict(self, figure: float) -> str:
        return "met" if self.met(figure) else "MISSED"

    def line(self, figure: float, shown: str | None = None) -> str:
        """``goal <what> <limit>: <figure> → met|MISSED``, the line a benchmark prints."""
        unit = {"x": "×", "s": " s", "ms": " ms", "MiB": " MiB", "MB": " MB", "frames/s": " frames/s"}[self.unit]
        value = shown if shown is not None else (f"{figure:.2f}×" if self.unit == "x" else f"{figure:,.3g}{unit}")
        return f"goal: {self.what} {self.text()}: {value} → {self.verdict(figure)}"


GOALS: dict[str, Goal] = {
    # start-up (benchmarks/startup.py), wall time of the whole process
    "help": Goal("`workbench --help`", 0.15, "s", True, "issue 24"),
    "sessions": Goal("`workbench sessions` on a small database", 0.30, "s", True, "issue 24"),
    "decode_cli": Goal("`workbench decode 00000000040a026a00`", 0.20, "s", True, "issue 24"),
    # reading (benchmarks/tui_open.py, diagnose.py, memory.py)
    "tui_first_paint": Goal("TUI first paint of a 1M-frame session", 0.5, "s", True, "issue 24"),
    "diagnose": Goal("diagnose of a 1M-frame session", 1.0, "s", True, "issue 24"),
    "frames_json_rss": Goal("`frames --json` peak RSS on a large compressed session", 300, "MiB", True, "issue 24"),
    "read_back_rss": Goal("peak RSS of import and read-back of a gzip bomb", 1024, "MiB", True, "issue 12"),
    # writing (benchmarks/ingest.py, pcap_import.py)
    "ingest": Goal("ingest (Recorder add + flush) vs a plain Arrow insert", 0.6, "x", False, "issue 24"),
    "ingest_rate": Goal("ingest (Recorder add + flush)", 200_000, "frames/s", False, "foundation"),
    "pcap_import": Goal("pcap import time vs tshark's decrypt+dump", 1.5, "x", True, "issue 24"),
    # decoding (benchmarks/decode.py, decode_fuzz.py)
    "decode": Goal("decode + classify + summary vs raw upb FromString", 0.2, "x", False, "issue 24"),
    "decode_worst": Goal("worst decode time of a hostile input up to 64 KB", 50, "ms", True, "fuzz test"),
    # forwarding (benchmarks/capture.py, proxy.py)
    "forwarding": Goal("frames forwarded under a flood through capture vs plain mitmdump", 0.9, "x", False,
                       "issue 24"),
    "end_stream": Goal("END_STREAM delay added by the capture (median)", 5, "ms", True, "capture benchmark"),
    "recorded": Goal("frames committed by the capture under a flood", 20_000, "frames/s", False,
                     "capture benchmark"),
    "first_frame": Goal("first server frame through a proxy, sent → received (median)", 50, "ms", True,
                        "capture benchmark"),
    "turn": Goal("agent turn through capture vs direct (median)", 1.1, "x", True, "capture benchmark"),
    "ping_pong": Goal("ping-pong round trip through capture vs plain mitmdump (median)", 1.1, "x", True,
                      "capture benchmark"),
    # The proxy's own ≤ 5 ms TTFT goal was superseded: forwarding through workbench must keep ≥ 0.9× of
    # the direct speed, the forwarding goal of issue 24 applied to `workbench proxy`.
    "proxy": Goal("speed through `workbench proxy` vs the client library direct (TTFT, per chunk)", 0.9, "x",
                  False, "issue 24 (forwarding)"),
    # the HTML report (benchmarks/report.py)
    "report": Goal("`workbench report` of a 1M-frame session", 10, "s", True, "issue 35"),
    "report_size": Goal("size of the report of a 1M-frame session", 5, "MB", True, "issue 35"),
    # output (benchmarks/textsafe.py): the one printer every table cell goes through
    "textsafe": Goal("a 1M-row table through the printer vs the same table before it", 1.5, "x", True, "issue 35"),
    # schema (benchmarks/schema_extract.py)
    "schema_extract": Goal("`schema extract` of a 50 MB bundle", 10, "s", True, "schema extraction issue"),
}


def goal(key: str) -> Goal:
    return GOALS[key]


def load() -> ModuleType:
    """This module, for a benchmark loaded by path (not run as a script)."""
    if "goals" not in sys.modules:
        spec = importlib.util.spec_from_file_location("goals", Path(__file__))
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["goals"] = module
        spec.loader.exec_module(module)
    return sys.modules["goals"]


if __name__ == "__main__":
    width = max(len(k) for k in GOALS)
    for key, g in GOALS.items():
        print(f"{key:<{width}}  {g.text():<18} {g.what}  [{g.source}]")
