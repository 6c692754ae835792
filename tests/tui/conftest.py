"""Fixtures for the TUI tests: capture databases written through the real store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from workbench.tui.demo import build_demo_db


@pytest.fixture(scope="session")
def tui_demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sessions (a §13 #1 hang with findings/blobs/tool call, a clean turn, an error); read-only use."""
    return build_demo_db(tmp_path_factory.mktemp("tui") / "capture.duckdb")


async def tui_wait(pilot: Pilot[object], cond: Callable[[], object], timeout: float = 20.0, what: str = "") -> None:
    """Let the app run until ``cond()`` holds (thread workers finish on their own time)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or cond}")
        await pilot.pause(0.02)
        await asyncio.sleep(0)


@pytest.fixture
def wait_for() -> Callable[..., object]:
    return tui_wait
