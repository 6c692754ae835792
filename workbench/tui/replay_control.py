"""Replay on the session screen: the clock, its timer and the replay bar, as one object the screen owns.

The controller reads timestamps, lets the ``ReplayClock`` advance on a timer and draws the bar;
which frames that makes visible is the screen's business, told through ``ReplayView``. The
screen maps its keys to the controller's methods and reads ``clock`` where the replay limits what
it shows (a reload, a poll, lit findings).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import numpy as np
from rich.text import Text
from textual.timer import Timer
from textual.widgets import Static

from workbench.tui.loading import Loader
from workbench.tui.replay import ReplayClock

REPLAY_TICK_S = 0.05
BAR_WIDTH = 30


class ReplayView(Protocol):
    """What a screen does when the replay moves."""

    def replay_started(self) -> None:
        """The replay has begun (its first frame shown)."""

    def show_replay(self, seq: int, follow_cursor: bool) -> bool:
        """Show frames up to ``seq``; False while there is nothing to show yet (no index)."""

    def replay_stopped(self) -> None:
        """The replay is over: show every frame again."""


class ReplayController:
    """Start, stop, play, step and pace one replay; ``owner`` runs its reads and its timer."""

    def __init__(self, owner: Loader, view: ReplayView, bar_selector: str = "#replay-bar") -> None:
        self.owner = owner
        self.view = view
        self.bar_selector = bar_selector
        self.clock: ReplayClock | None = None
        self._timer: Timer | None = None
        self._last_tick = 0.0

    @property
    def active(self) -> bool:
        return self.clock is not None

    def _bar(self) -> Static:
        return self.owner.query_one(self.bar_selector, Static)

    def start(self, read_timestamps: Callable[[], tuple[np.ndarray, np.ndarray]], what: str) -> None:
        """Read the session's timestamps off the UI thread, then play from the first frame."""

        def got(arrays: tuple[np.ndarray, np.ndarray]) -> None:
            self.clock = ReplayClock(*arrays)
            self.clock.playing = True
            self._last_tick = time.monotonic()
            self._bar().remove_class("hidden")
            self._timer = self.owner.set_interval(REPLAY_TICK_S, self._tick, name="replay")
            self.apply()
            self.view.replay_started()

        self.owner.load(read_timestamps, got, group="replay", what=what)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        self.clock = None
        self._bar().add_class("hidden")
        self.view.replay_stopped()

    def _tick(self) -> None:
        now = time.monotonic()
        dt, self._last_tick = now - self._last_tick, now
        r = self.clock
        if r is None or not r.playing:
            return
        if r.advance(dt):
            self.apply()
        elif not r.playing:
            self.update_bar()

    def apply(self, follow_cursor: bool = True) -> None:
        """Show what the clock has reached and redraw the bar."""
        r = self.clock
        if r is None or not self.view.show_replay(r.seq, follow_cursor):
            return
        self.update_bar()

    def reach(self, seq: int) -> None:
        """Move a replay that has not yet reached ``seq`` up to it (a jump to evidence ahead)."""
        r = self.clock
        if r is not None and seq > r.seq:
            r.step(int(np.searchsorted(r.seqs, seq)) - r.pos)
            self.apply(follow_cursor=False)

    def update_bar(self) -> None:
        r = self.clock
        if r is None:
            return
        bar = Text(r.describe(), "bold")
        n = len(r)
        done = int(BAR_WIDTH * (r.pos + 1) / n) if n else 0
        bar.append("  [" + "█" * done + "·" * (BAR_WIDTH - done) + "]", "cyan")
        if r.at_end:
            bar.append("  end", "green")
        self._bar().update(bar)

    def _need(self) -> ReplayClock | None:
        if self.clock is None:
            self.owner.app.notify("press p to start a replay")
        return self.clock

    def play_pause(self) -> None:
        r = self._need()
        if r is not None:
            if r.at_end and not r.playing:
                r.step(-len(r))   # play again from the start
            r.playing = not r.playing
            self._last_tick = time.monotonic()
            self.apply()

    def step(self, delta: int) -> None:
        r = self._need()
        if r is not None:
            r.playing = False
            r.step(delta)
            self.apply()

    def speed(self, delta: int) -> None:
        r = self._need()
        if r is not None:
            r.faster(delta)
            self.update_bar()

    def skip_idle(self) -> None:
        r = self._need()
        if r is not None:
            r.skip_idle = not r.skip_idle
            self.update_bar()
