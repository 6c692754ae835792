"""What the screens need from the application, handed to each screen when it is made.

Screens read the database through ``data`` and follow a capture in progress when ``follow``;
they ask the application for navigation with messages (``SessionsScreen.OpenSession``,
``SessionScreen.Closed``). So no screen imports the application and no screen imports another.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from workbench.store.db import us_to_time
from workbench.tui.data import TuiData

# session status → style, in the sessions list and the session screen's status line
STATUS_STYLE = {"complete": "green", "open": "cyan", "incomplete": "yellow", "error": "bold red", "aborted": "red"}


@dataclass(frozen=True)
class TuiContext:
    data: TuiData
    follow: bool = False           # show new frames, sessions and findings as a capture writes them
    poll_interval: float = 0.5     # seconds between two looks when following


def fmt_start(us: int | None) -> str:
    if us is None:
        return ""
    when = us_to_time(us)  # text past year 9999 (a hostile import), to the second like a datetime
    return when.strftime("%Y-%m-%d %H:%M:%S") if isinstance(when, datetime) else when.split(".")[0]


def fmt_duration(s: float | None) -> str:
    if s is None:
        return ""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    return f"{m}m{sec:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"
