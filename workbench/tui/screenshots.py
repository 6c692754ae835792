"""Export SVG screenshots of every TUI screen to docs/screenshots/ (linked from the README).

    python -m workbench.tui.screenshots [OUT_DIR]

Runs the real app headless over the demo capture database (fixed timestamps), drives it with
keystrokes and saves what Textual renders.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.pilot import Pilot

from workbench.tui.app import WorkbenchApp
from workbench.tui.detail import FrameDetailView
from workbench.tui.sample_db import HANG_SESSION, build_sample_db
from workbench.tui.session_screen import SessionScreen
from workbench.tui.sessions_screen import SessionsScreen
from workbench.tui.timeline import Timeline

SIZE = (160, 46)


async def _until(pilot: Pilot[Any], cond: Callable[[], object], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError("screen did not get ready")
        await pilot.pause(0.02)


async def _idle(pilot: Pilot[Any]) -> None:
    await _until(pilot, lambda: not any(w.is_running for w in pilot.app.workers))
    await pilot.pause(0.2)


async def _session(pilot: Pilot[Any]) -> SessionScreen:
    app = pilot.app
    await _until(pilot, lambda: isinstance(app.screen, SessionScreen)
                 and app.screen.query_one(Timeline).first_paint is not None and app.screen.side_ready)
    screen = app.screen
    assert isinstance(screen, SessionScreen)
    await _until(pilot, lambda: bool(screen.findings_table.findings))
    return screen


async def _detail(pilot: Pilot[Any], seq: int) -> None:
    detail = pilot.app.screen.query_one(FrameDetailView)
    await _until(pilot, lambda: detail.detail is not None and detail.detail.seq == seq)


async def shoot(db: Path, out: Path) -> list[Path]:
    written: list[Path] = []

    async def run(name: str, session: str | None, steps: Callable[[Pilot[Any]], Any]) -> None:
        app = WorkbenchApp(db, session)
        async with app.run_test(size=SIZE) as pilot:
            await steps(pilot)
            await _idle(pilot)
            path = out / f"{name}.svg"
            app.save_screenshot(filename=path.name, path=str(out))
            written.append(path)

    async def sessions(pilot: Pilot[Any]) -> None:
        await _until(pilot, lambda: isinstance(pilot.app.screen, SessionsScreen)
                     and pilot.app.screen.query_one("#sessions").row_count > 0)  # type: ignore[attr-defined]

    def tab(key: str) -> Callable[[Pilot[Any]], Any]:
        async def steps(pilot: Pilot[Any]) -> None:
            await _session(pilot)
            await pilot.press(*["down"] * 14, key)
            await _detail(pilot, 14)
        return steps

    async def evidence(pilot: Pilot[Any]) -> None:
        await _session(pilot)
        await pilot.press("f", "enter")
        await _detail(pilot, 14)

    async def tool_call(pilot: Pilot[Any]) -> None:
        await _session(pilot)
        await pilot.press("c", "enter")
        await _until(pilot, lambda: type(pilot.app.screen).__name__ == "ToolCallScreen")

    async def blob(pilot: Pilot[Any]) -> None:
        await _session(pilot)
        await pilot.press("b", "enter")
        await _until(pilot, lambda: type(pilot.app.screen).__name__ == "BlobScreen")

    async def replay(pilot: Pilot[Any]) -> None:
        screen = await _session(pilot)
        await pilot.press("p")
        await _until(pilot, lambda: screen.replay is not None)
        await pilot.press("space")
        r = screen.replay
        assert r is not None
        await pilot.press(*["comma"] * (r.pos + 1), *["full_stop"] * 16, "plus", "plus", "plus", "i")

    async def help_screen(pilot: Pilot[Any]) -> None:
        await _session(pilot)
        await pilot.press("question_mark")

    await run("sessions", None, sessions)
    await run("session-tree", HANG_SESSION, tab("t"))
    await run("session-json", HANG_SESSION, tab("o"))
    await run("session-hex", HANG_SESSION, tab("x"))
    await run("finding-evidence", HANG_SESSION, evidence)
    await run("tool-call", HANG_SESSION, tool_call)
    await run("blob", HANG_SESSION, blob)
    await run("replay", HANG_SESSION, replay)
    await run("help", HANG_SESSION, help_screen)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path("docs/screenshots")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = build_sample_db(Path(tmp) / "capture.duckdb")
        for path in asyncio.run(shoot(db, out)):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
