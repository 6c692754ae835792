"""One HTTP request/response pair as a handler sees it, whether it came as an h2 stream or an
HTTP/1.1 message (``h2_server``, ``h1_server``).

Handlers read the body as it arrives (``read_chunk``) or whole (``read_body``), and write the
response in pieces: ``start`` (status and headers, optionally with the first body bytes, so a
latency-sensitive answer leaves in one write), ``write`` (flushed at once: nothing is buffered),
``finish`` (the last bytes and HTTP trailers). ``respond`` is all three for a whole answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

MAX_BODY = 64 * 1024 * 1024


class ConnectionClosed(Exception):
    """The client went away (reset, GOAWAY, TCP close) or the stream was already ended."""


class RequestError(Exception):
    """The request itself is unusable (a malformed or too large body): answer ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Exchange:
    """Base of ``H2Exchange`` and ``H1Exchange``; ``headers`` has lower-case names (repeated
    fields joined with ", "), ``http_version`` is "2", "1.1" or "1.0"."""

    method: str
    path: str  # the request target, query included
    headers: dict[str, str]
    http_version: str

    def __init__(self) -> None:
        self.gone = asyncio.Event()  # the client is gone: writes raise ConnectionClosed
        self.started = False
        self.finished = False
        self._body: bytes | None = None

    async def read_chunk(self) -> bytes | None:
        """The next piece of the request body; None at its end (or when the client left).

        Raises ``RequestError`` when the body breaks its own framing (HTTP/1.1 chunked)."""
        raise NotImplementedError

    async def read_body(self, limit: int = MAX_BODY) -> bytes:
        """The whole request body (read once; later calls return it again); ``RequestError``
        (413) beyond ``limit`` bytes."""
        if self._body is not None:
            return self._body
        buf = bytearray()
        while (chunk := await self.read_chunk()) is not None:
            buf += chunk
            if len(buf) > limit:
                raise RequestError(413, f"request body larger than {limit} bytes")
        self._body = bytes(buf)
        return self._body

    async def start(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        """Send the status and headers (and ``body``, the first bytes of the response, with them)."""
        raise NotImplementedError

    async def write(self, data: bytes) -> None:
        """Send response bytes now. Raises ConnectionClosed once the client is gone."""
        raise NotImplementedError

    async def finish(self, data: bytes = b"", trailers: list[tuple[str, str]] | None = None) -> None:
        """End the response after ``data``; ``trailers`` are sent as HTTP trailers (gRPC's status)."""
        raise NotImplementedError

    async def goaway(self) -> None:
        """No more requests on this connection (h2 GOAWAY; HTTP/1.1 closes after this response)."""
        raise NotImplementedError

    async def reset(self) -> None:
        """Abort this exchange abruptly (h2 RST_STREAM; HTTP/1.1 drops the connection)."""
        raise NotImplementedError

    async def respond(self, status: int, body: bytes, content_type: str,
                      headers: Mapping[str, str] | None = None) -> None:
        """A whole response with a ``content-length``."""
        hdrs = [("content-type", content_type), ("content-length", str(len(body)))]
        hdrs += list((headers or {}).items())
        await self.start(status, hdrs, body)
        await self.finish()


def header_dict(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """Request header fields as one dict: names lower-cased, repeated fields joined with ", "."""
    out: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        out[key] = out[key] + ", " + value if key in out else value
    return out
