"""Fixtures for the simulator tests: a private certificate folder and a server factory."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workbench.sim.runner import SimServer, start_sim  # noqa: E402


@pytest.fixture(scope="session")
def sim_cert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sim-cert")


@pytest.fixture
async def sim_factory(sim_cert_dir: Path) -> AsyncIterator[Callable[..., Awaitable[SimServer]]]:
    servers: list[SimServer] = []

    async def make(**kwargs: Any) -> SimServer:
        kwargs.setdefault("heartbeat_interval", 0.05)
        kwargs.setdefault("cert_dir", sim_cert_dir)
        server = await start_sim(**kwargs)
        servers.append(server)
        return server

    yield make
    for s in servers:
        await s.close()
