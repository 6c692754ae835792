"""The client honours HTTPS_PROXY (HTTP CONNECT, TLS inside the tunnel) and SSL_CERT_FILE."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from workbench.client.agent import AgentClient
from workbench.sim.runner import running_sim

pytestmark = pytest.mark.slow  # starts subprocesses or servers


class ConnectProxy:
    """A minimal HTTP CONNECT proxy on a free loopback port that records the tunnels it opened."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.server: asyncio.Server | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            writer.close()
            return
        host, port = target.rsplit(":", 1)
        self.tunnels.append(target)
        up_r, up_w = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            with contextlib.suppress(Exception):
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_https_proxy_and_ssl_cert_file(transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async with running_sim(heartbeat_interval=0.05) as sim:
        proxy = ConnectProxy()
        url = await proxy.start()
        monkeypatch.setenv("HTTPS_PROXY", url)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        monkeypatch.setenv("SSL_CERT_FILE", str(sim.cert_path))  # verify=None: trust comes from the env
        try:
            async with AgentClient(sim.url, "t", transport=transport) as c:
                res = await c.run_turn("[scenario:text] through a proxy")
        finally:
            await proxy.close()
    assert res.ended
    assert "through a proxy" in res.text
    assert proxy.tunnels
    assert all(t == f"127.0.0.1:{sim.port}" for t in proxy.tunnels)


async def test_without_the_certificate_tls_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("HTTPS_PROXY", raising=False)
    async with running_sim() as sim, AgentClient(sim.url, "t") as c:
        res = await c.run_turn("[scenario:text] x", raise_on_error=False)
    assert res.error is not None
    assert res.error.code == "transport"
    assert "CERTIFICATE_VERIFY_FAILED" in res.error.message or "certificate" in res.error.message.lower()
