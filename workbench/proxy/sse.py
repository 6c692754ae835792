"""How a proxy answer goes out: one JSON body, or a server-sent-events stream started lazily.

Both endpoints (chat completions in ``workbench.proxy.server``, Responses in
``workbench.proxy.responses``) write through ``SseStream``. The status line is not sent until the
first event is ready, so an upstream error before the first token can still be a plain HTTP error
(``send_json``) the SDK raises, instead of a 200 stream; after that, errors must travel as events.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.transport import Exchange

SSE_HEADERS = [("content-type", "text/event-stream; charset=utf-8"), ("cache-control", "no-cache")]


async def send_json(ex: Exchange, status: int, doc: Any) -> None:
    """The whole answer as one JSON body."""
    await ex.respond(status, json.dumps(doc, ensure_ascii=False).encode(), "application/json")


class SseStream:
    """The SSE body of one answer on ``ex``; ``preamble`` goes out ahead of the first event.

    The first bytes go out with the status line (one write, one packet): time-to-first-token is
    what the proxy is judged on."""

    def __init__(self, ex: Exchange, preamble: bytes = b"") -> None:
        self.ex = ex
        self.preamble = preamble
        self.started = False

    async def send(self, data: bytes, last: bool = False) -> None:
        """Write ``data``; ``last`` ends the body with it."""
        if not self.started:
            self.started = True
            await self.ex.start(200, SSE_HEADERS, self.preamble + data)
            if last:
                await self.ex.finish()
            return
        if last:
            await self.ex.finish(data)
        else:
            await self.ex.write(data)
