"""A capture database for the diff and report tests, recorded from real traffic.

The simulated backend (TLS on loopback) and the built-in client record the demo's healthy tool flow
its heartbeat loop, the answer that went only to KV (and a plain text turn), then the analysis runs: the demo's recording path,
minus mitmproxy.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support import demo_sessions

SCENARIOS = ("healthy_text", "tool_flow", "heartbeat_loop", "kv_only_answer")


def record_demo(db: Path, scenarios: tuple[str, ...] = SCENARIOS) -> dict[str, str]:
    """Record ``scenarios`` into ``db``; scenario name → session id."""
    from workbench.fixtures.scenarios import BY_NAME, run_demo_suite
    from workbench.sim.runner import running_sim

    async def record() -> list[str]:
        async with running_sim(heartbeat_interval=0.05, park_timeout=30) as sim:
            return await run_demo_suite(db, sim.url, sim.cert_path, turn_timeout=60,
                                        scenarios=[BY_NAME[n] for n in scenarios])

    assert len(asyncio.run(record())) == len(scenarios)
    return demo_sessions(db)


@pytest.fixture(scope="session")
def diff_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    db = tmp_path_factory.mktemp("diff") / "demo.duckdb"
    return db, record_demo(db)
