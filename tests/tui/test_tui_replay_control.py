"""ReplayController on its own: a real Textual app whose screen implements ReplayView and records
what the controller asked it to show (the session screen's own replay is covered in test_tui_app)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from textual.app import App, ComposeResult
from textual.screen import Screen
from textual.widgets import Static

from workbench.tui.loading import Loader
from workbench.tui.replay_control import ReplayController

Wait = Callable[..., Any]
SEQS = np.array([0, 1, 2, 3, 4], dtype=np.int64)
TS_US = np.array([0, 10, 20, 30, 40], dtype=np.int64) * 1_000_000  # 10 s apart: no tick moves on its own


class ReplayHostScreen(Loader, Screen[None]):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []
        self.has_index = True
        self.controller = ReplayController(self, self)

    def compose(self) -> ComposeResult:
        yield Static("", id="replay-bar", classes="hidden")

    def replay_started(self) -> None:
        self.calls.append(("started",))

    def show_replay(self, seq: int, follow_cursor: bool) -> bool:
        self.calls.append(("show", seq, follow_cursor))
        return self.has_index

    def replay_stopped(self) -> None:
        self.calls.append(("stopped",))


class HostApp(App[None]):
    def __init__(self) -> None:
        super().__init__()
        self.host = ReplayHostScreen()
        self.notes: list[str] = []

    def on_mount(self) -> None:
        self.push_screen(self.host)

    def notify(self, message: str, **kwargs: Any) -> None:  # type: ignore[override]
        self.notes.append(message)


def _bar(host: ReplayHostScreen) -> Static:
    return host.query_one("#replay-bar", Static)


async def test_controller_drives_the_view_and_the_bar(wait_for: Wait) -> None:
    app = HostApp()
    async with app.run_test() as pilot:
        host, ctl = app.host, app.host.controller
        ctl.start(lambda: (SEQS, TS_US), what="timestamps")
        await wait_for(pilot, lambda: ctl.active, what="replay started")
        assert host.calls[:2] == [("show", -1, True), ("started",)]
        assert not _bar(host).has_class("hidden")
        ctl.step(-10)                       # paused before the first frame, whatever a tick did
        ctl.step(2)
        assert host.calls[-1] == ("show", 1, True)
        assert "frame 2/5" in str(_bar(host).content)
        ctl.reach(3)                        # evidence ahead: the replay moves there, cursor left alone
        assert host.calls[-1] == ("show", 3, False)
        assert ctl.clock is not None and ctl.clock.seq == 3
        n = len(host.calls)
        ctl.reach(1)                        # evidence already shown: nothing moves
        assert len(host.calls) == n and ctl.clock.seq == 3
        ctl.speed(1)
        ctl.skip_idle()
        assert "×2" in str(_bar(host).content) and "skip idle" in str(_bar(host).content)
        ctl.stop()
        assert host.calls[-1] == ("stopped",)
        assert ctl.clock is None and not ctl.active
        assert _bar(host).has_class("hidden")


async def test_keys_without_a_replay_only_say_how_to_start(wait_for: Wait) -> None:
    app = HostApp()
    async with app.run_test() as pilot:
        await wait_for(pilot, lambda: app.screen is app.host)
        ctl = app.host.controller
        for act in (ctl.play_pause, lambda: ctl.step(1), lambda: ctl.speed(1), ctl.skip_idle):
            act()
        assert app.notes == ["press p to start a replay"] * 4
        assert app.host.calls == []


async def test_no_bar_update_while_the_view_has_nothing_to_show(wait_for: Wait) -> None:
    app = HostApp()
    async with app.run_test() as pilot:
        host, ctl = app.host, app.host.controller
        host.has_index = False
        ctl.start(lambda: (SEQS, TS_US), what="timestamps")
        await wait_for(pilot, lambda: ctl.active, what="replay started")
        ctl.step(-10)
        ctl.step(3)
        assert host.calls[-1] == ("show", 2, True)
        assert "frame" not in str(_bar(host).content)
        host.has_index = True
        ctl.step(1)
        assert "frame 4/5" in str(_bar(host).content)
