"""The connections one or several ``AgentClient`` use to reach one upstream."""

from __future__ import annotations

import asyncio

import httpx

from workbench.client.net import H2Connection, Verify
from workbench.client.transport import make_http_client


class Connections:
    """The HTTP/2 connection (Run) and httpx client (RunSSE/RunPoll/unary) to one upstream.

    One ``AgentClient`` owns its own; the proxy shares one between per-request clients so every
    OpenAI request reuses the warm TLS connection instead of paying a handshake in its TTFT.
    """

    def __init__(self, base_url: str, verify: Verify = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.verify = verify
        self._h2: H2Connection | None = None
        self._http: httpx.AsyncClient | None = None
        self._lock = asyncio.Lock()
        self._retired: list[H2Connection] = []

    async def h2(self) -> H2Connection:
        async with self._lock:
            if self._h2 is None or not self._h2.usable:
                if self._h2 is not None:
                    # After a GOAWAY, streams already running may finish: retire, don't cut.
                    if self._h2.active_streams and not self._h2.closed:
                        self._retired.append(self._h2)
                    else:
                        await self._h2.close()
                self._h2 = H2Connection(self.base_url, self.verify)
                try:
                    await self._h2.connect()
                except BaseException:
                    self._h2 = None
                    raise
            return self._h2

    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = make_http_client(self.verify)
        return self._http

    async def aclose(self) -> None:
        for old in self._retired:
            await old.close()
        self._retired.clear()
        if self._h2 is not None:
            await self._h2.close()
            self._h2 = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


