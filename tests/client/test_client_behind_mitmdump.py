"""The real case behind the END_STREAM wait: a real mitmdump (mitmproxy 11, bodies streamed by a
two-line addon, no workbench code in it) between the client and the sim. mitmproxy passes the
server's end-stream frame on but holds a bidi stream's HTTP/2 END_STREAM until the client has ended
its request side — which a real client never does first. The client says so after its end timeout;
with the old behaviour (close ~1 s after turn_ended) the problem stays hidden."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support import env_without_proxy, free_port, port_open, wait_until

from workbench.client.agent import AgentClient
from workbench.sim.runner import SimServer, running_sim

pytestmark = pytest.mark.slow  # starts subprocesses or servers

MITMDUMP = Path(sys.executable).parent / "mitmdump"
ADDON = Path(__file__).resolve().parent / "stream_bodies_addon.py"


@pytest.fixture(scope="module")
def mitm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    conf = tmp_path_factory.mktemp("mitm")
    port = free_port()
    proc = subprocess.Popen([str(MITMDUMP), "-q", "-s", str(ADDON), "--listen-host", "127.0.0.1", "--listen-port",
                             str(port), "--set", f"confdir={conf}", "--set", "ssl_insecure=true"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env_without_proxy())
    try:  # wait until it listens and has written its CA
        wait_until(lambda: port_open(port) and (conf / "mitmproxy-ca-cert.pem").exists(), timeout=90,
                   what=f"mitmdump listening on {port} with its CA written", proc=proc)
    except AssertionError:
        proc.kill()
        raise
    yield f"http://127.0.0.1:{port}", conf / "mitmproxy-ca-cert.pem"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with running_sim(heartbeat_interval=0.2) as s:
        yield s


@pytest.fixture
def via_mitm(mitm: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    proxy, ca = mitm
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    return ca


async def test_run_behind_mitmdump_reports_the_held_end(sim: SimServer, via_mitm: Path) -> None:
    async with AgentClient(sim.url, "t", verify=str(via_mitm), heartbeat_interval=0.2, end_timeout=3.0) as c:
        res = await c.run_turn("[scenario:text] through mitmdump")
    assert res.ended
    assert res.error is None
    assert "through mitmdump" in res.text
    assert res.end_missing is not None
    assert "its end-stream frame came, the HTTP/2 END_STREAM flag did not" in res.end_missing.message


async def test_the_old_behaviour_hides_it(sim: SimServer, via_mitm: Path) -> None:
    async with AgentClient(sim.url, "t", verify=str(via_mitm), heartbeat_interval=0.2, wait_for_end=False) as c:
        res = await c.run_turn("[scenario:text] through mitmdump")
    assert res.ended
    assert res.error is None
    assert res.end_missing is None


@pytest.mark.parametrize("transport", ["runsse", "runpoll"])
async def test_http1_transports_end_normally_behind_mitmdump(sim: SimServer, via_mitm: Path, transport: str) -> None:
    async with AgentClient(sim.url, "t", transport=transport, verify=str(via_mitm), heartbeat_interval=0.2,
                           end_timeout=30.0) as c:
        res = await c.run_turn("[scenario:text] through mitmdump")
    assert res.ended
    assert res.error is None
    assert res.end_missing is None
