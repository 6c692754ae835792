"""Running the simulator in-process: ``async with running_sim(...)`` or the threaded ``SimThread``.

``running_sim`` is for asyncio tests; ``SimThread`` runs the server on its own event loop in a
background thread (``workbench.transport.runner``), for synchronous callers (the ``openai`` SDK,
a notebook, a sync test).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from workbench.sim.backend import SimBackend
from workbench.sim.state import SimConfig, SimState
from workbench.sim.status_gate import StatusGate
from workbench.transport import AgentService, BackgroundServer, Endpoint, HttpServer, listen
from workbench.transport.bidi_append import APPEND_GRACE


class SimServer(Endpoint):
    """A listening simulated backend: ``url``, ``port``, ``cert_path``, ``state`` (runs, blobs)."""

    def __init__(self, backend: SimBackend, server: HttpServer) -> None:
        self.backend = backend
        self.server = server

    def http_server(self) -> HttpServer:
        return self.server

    @property
    def state(self) -> SimState:
        return self.backend.state

    async def close(self) -> None:
        await self.server.close()


def make_config(config: SimConfig | None = None, **overrides: Any) -> SimConfig:
    cfg = config or SimConfig()
    if "scenario_dirs" in overrides:
        overrides["scenario_dirs"] = [str(d) for d in overrides["scenario_dirs"]]
    if "models" in overrides:
        overrides["models"] = tuple(overrides["models"])
    if "exec_stream_close" in overrides:
        overrides["exec_stream_close"] = tuple(overrides["exec_stream_close"])
    return replace(cfg, **overrides)


async def start_sim(config: SimConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
                    tls: bool = True, cert_dir: str | Path | None = None, certfile: str | Path | None = None,
                    keyfile: str | Path | None = None, append_grace: float = APPEND_GRACE,
                    gzip_min: int | None = None, **overrides: Any) -> SimServer:
    """Start a simulator; ``overrides`` are SimConfig fields (scenario, heartbeat_interval, token, …)."""
    backend = SimBackend(make_config(config, **overrides))
    router = AgentService(backend.handle, backend.unary, backend.auth, append_grace, gzip_min).router()
    # a scenario that answers with an HTTP status decides before the transport's 200 (status_gate)
    StatusGate(backend.scenarios, backend.config.scenario, backend.state, backend.run_finished).install(router)
    server = await listen(router, host=host, port=port, tls=tls, certfile=certfile, keyfile=keyfile,
                          cert_dir=cert_dir)
    return SimServer(backend, server)


@contextlib.asynccontextmanager
async def running_sim(config: SimConfig | None = None, **kwargs: Any) -> AsyncIterator[SimServer]:
    """``async with running_sim(scenario="tool_flow", heartbeat_interval=0.05) as sim: …``"""
    sim = await start_sim(config, **kwargs)
    try:
        yield sim
    finally:
        await sim.close()


class SimThread(Endpoint):
    """The simulator on a background thread: ``with SimThread(scenario="text") as sim: sim.url``."""

    def __init__(self, config: SimConfig | None = None, **kwargs: Any) -> None:
        self._background: BackgroundServer[SimServer] = BackgroundServer(
            lambda: start_sim(config, **kwargs), name="workbench-sim")

    def start(self) -> SimThread:
        self._background.start()
        return self

    def stop(self) -> None:
        self._background.stop()

    @property
    def sim(self) -> SimServer | None:
        return self._background.server

    def _need(self) -> SimServer:
        if self.sim is None:
            raise RuntimeError("SimThread is not running (call start() or use it as a context manager)")
        return self.sim

    def http_server(self) -> HttpServer:
        return self._need().server

    @property
    def state(self) -> SimState:
        return self._need().state

    def __enter__(self) -> SimThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
