"""Real processes for the proxy's end-to-end tests: ``workbench sim`` and ``workbench proxy``.

Both are started as subprocesses on free ports (``--port 0``); their URL is read from the first
line they print, and they are stopped with SIGTERM by the fixture.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import Process, start_server


@dataclass
class Rig:
    sim: Process
    proxy: Process

    @property
    def base_url(self) -> str:
        return self.proxy.url + "/v1"


def start_rig(tmp: Path, transport: str = "run", proxy_args: list[str] | None = None,
              sim_args: list[str] | None = None) -> Rig:
    sim = start_server("sim", "--port", "0", "--heartbeat-interval", "0.05", "--cert-dir", str(tmp / "certs"),
                       *(sim_args or []), want_cert=True)
    try:
        proxy = start_server("proxy", "--port", "0", "--upstream", sim.url, "--transport", transport,
                             "--ca-file", str(sim.cert), *(proxy_args or []),
                             env={"CURSOR_ACCESS_TOKEN": "sk-test-proxy-token"})
    except BaseException:
        sim.stop()
        raise
    return Rig(sim, proxy)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """sim + proxy (Run over HTTP/2), shared by a module's tests."""
    r = start_rig(tmp_path_factory.mktemp("rig"))
    yield r
    r.proxy.stop()
    r.sim.stop()
