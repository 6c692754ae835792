"""Progress for long imports: one self-overwriting stderr line on a terminal, silence otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``update(done, items)`` at will; it redraws at most five times a second."""

    def __init__(self, label: str, total: int | None = None, unit: str = "entries",
                 stream: TextIO | None = None, enabled: bool | None = None, interval: float = 0.2) -> None:
        self.label = label
        self.total = total
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.interval = interval
        self.note = ""  # e.g. "120 already imported" while writing
        self._last = 0.0
        self._drawn = False

    def update(self, done: int, items: int | None = None, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        self.stream.write("\r" + self.text(done, items) + "\x1b[K")
        self.stream.flush()
        self._drawn = True

    def text(self, done: int, items: int | None = None) -> str:
        parts = [f"importing {self.label}:"]
        if self.total:
            parts.append(f"{min(100.0, 100.0 * done / self.total):5.1f}%")
        count = items if items is not None else done
        parts.append(f"({count:,} {self.unit}{'; ' + self.note if self.note else ''})")
        return " ".join(parts)

    def finish(self) -> None:
        """Erase the progress line so the summary that follows stands alone."""
        if self.enabled and self._drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._drawn = False
