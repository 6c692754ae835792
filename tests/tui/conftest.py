"""Fixtures for the TUI tests: capture databases written through the real store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from support import wait_until_async
from textual.pilot import Pilot

from workbench.tui.sample_db import build_sample_db


@pytest.fixture(scope="session")
def tui_sample_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three sessions (a missing_stream_close hang with findings/blobs/tool call, a clean turn, an error); read-only use."""
    return build_sample_db(tmp_path_factory.mktemp("tui") / "capture.duckdb")


async def tui_wait(pilot: Pilot[object], cond: Callable[[], object], timeout: float = 20.0, what: object = "") -> None:
    """Let the app run until ``cond()`` holds (thread workers finish on their own time)."""
    await wait_until_async(cond, timeout=timeout, interval=0, what=what,
                           pause=lambda: pilot.pause(0.02))


@pytest.fixture
def wait_for() -> Callable[..., object]:
    return tui_wait


@pytest.fixture(scope="session")
def tui_rig_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """Sessions recorded by the built-in client against the simulated backend, then analysed.

    Returns the database and {scenario: session_id}.
    """
    from workbench.analysis import analyze
    from workbench.client.agent import AgentClient
    from workbench.sim.runner import SimThread
    from workbench.store import Store

    db = tmp_path_factory.mktemp("tui-rig") / "rig.duckdb"
    ids: dict[str, str] = {}
    with SimThread(heartbeat_interval=0.2, token="tui-test-token") as sim:
        async def record() -> None:
            store = Store(db)
            try:
                async with AgentClient(sim.url, token="tui-test-token", verify=str(sim.cert_path),
                                       record_to=store) as client:
                    for scenario in ("blob_miss", "text"):
                        result = await client.run_turn(f"[scenario:{scenario}] hello", raise_on_error=False)
                        ids[scenario] = str(result.request_id)
                analyze(store)
            finally:
                store.close()

        asyncio.run(record())
    return db, ids
