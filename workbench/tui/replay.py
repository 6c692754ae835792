"""The replay clock: which frame a session had reached after so much wall time at some speed.

Pure arithmetic over the recorded timestamps, so it is tested without a terminal. Wire times
are made monotonic (a frame never appears before the one preceding it in seq order), and
"skip idle gaps" caps any silence at ``IDLE_CAP_US`` of session time.
"""

from __future__ import annotations

import numpy as np

SPEEDS = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0)
IDLE_CAP_US = 1_000_000


class ReplayClock:
    def __init__(self, seqs: np.ndarray, ts_us: np.ndarray) -> None:
        self.seqs = np.asarray(seqs, dtype=np.int64)
        ts = np.asarray(ts_us, dtype=np.int64)
        self.t0 = int(ts[0]) if len(ts) else 0
        self.offsets = np.maximum.accumulate(ts - self.t0) if len(ts) else ts
        self.pos = -1              # index of the last frame shown; -1 = nothing yet
        self.vt = 0                # session time reached (µs after the first frame)
        self.speed = 1.0
        self.skip_idle = False
        self.playing = False

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def at_end(self) -> bool:
        return self.pos >= len(self.seqs) - 1

    @property
    def seq(self) -> int:
        """Seq of the last frame shown (-1 before the first)."""
        return int(self.seqs[self.pos]) if self.pos >= 0 else -1

    @property
    def elapsed_s(self) -> float:
        return self.vt / 1e6

    def advance(self, wall_s: float) -> bool:
        """Let ``wall_s`` seconds pass at the current speed; True when new frames appeared."""
        if not len(self.seqs) or self.at_end:
            self.playing = False
            return False
        before = self.pos
        step = int(wall_s * self.speed * 1_000_000)
        nxt = int(self.offsets[self.pos + 1])
        if self.skip_idle and nxt - self.vt > IDLE_CAP_US:
            self.vt = nxt - IDLE_CAP_US
        self.vt += step
        self.pos = int(np.searchsorted(self.offsets, self.vt, side="right")) - 1
        if self.at_end:
            self.playing = False
        return self.pos != before

    def step(self, delta: int) -> None:
        self.pos = max(-1, min(len(self.seqs) - 1, self.pos + delta))
        self.vt = int(self.offsets[self.pos]) if self.pos >= 0 else 0

    def seek_end(self) -> None:
        self.step(len(self.seqs))

    def faster(self, delta: int) -> float:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 1
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + delta))]
        return self.speed

    def describe(self) -> str:
        state = "▶" if self.playing else "⏸"
        idle = "  skip idle" if self.skip_idle else ""
        return (f"{state} replay  frame {self.pos + 1}/{len(self.seqs)}  +{self.elapsed_s:.1f} s  "
                f"×{self.speed:g}{idle}")
