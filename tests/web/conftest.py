"""A capture database for the browser UI tests, recorded from real traffic.

The simulated backend (TLS on loopback) and the built-in client record four of the demo's
scenarios (healthy, a tool flow, the heartbeat loop, a rate limit) and the analysis runs on them:
the same recording path the demo takes, minus mitmproxy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from web_rig import require_chromium

WEB_SCENARIOS = ("healthy_text", "tool_flow", "heartbeat_loop", "rate_limit")


@pytest.fixture(scope="session")
def web_demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from workbench.fixtures.scenarios import BY_NAME, run_demo_suite
    from workbench.sim.runner import running_sim

    db = tmp_path_factory.mktemp("web") / "captures" / "demo.duckdb"

    async def record() -> list[str]:
        async with running_sim(heartbeat_interval=0.05, park_timeout=30) as sim:
            return await run_demo_suite(db, sim.url, sim.cert_path, turn_timeout=60,
                                        scenarios=[BY_NAME[n] for n in WEB_SCENARIOS])

    assert len(asyncio.run(record())) == len(WEB_SCENARIOS)
    return db


@pytest.fixture
def need_chromium() -> str:
    return require_chromium()
