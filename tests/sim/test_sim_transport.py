"""The reusable transport with a handler of its own (as the fixture replay server uses it)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from sim_h2 import H2Client
from support import wait_until_async

from workbench.transport import AgentConnection, UnaryRequest, UnaryResponse, serve
from workbench.wire.envelope import EnvelopeParser, encode

pytestmark = pytest.mark.slow  # starts subprocesses or servers

HEARTBEAT = bytes.fromhex("0a026a00")
RUN = "/agent.v1.AgentService/Run"


async def echo(conn: AgentConnection) -> None:
    """Speaks first (before reading anything), then echoes every client message."""
    await conn.send(HEARTBEAT)
    while (msg := await conn.receive()) is not None:
        await conn.send(msg)
    await conn.end()


async def read_envelopes(stream: Any, want: int, parser: EnvelopeParser) -> list[Any]:
    out: list[Any] = []
    while len(out) < want:
        chunk = await stream.read()
        assert chunk is not None, f"stream ended after {len(out)} envelopes"
        out += parser.feed(chunk)
    return out


async def test_h2_full_duplex_and_large_frames(sim_cert_dir: Path) -> None:
    seen: list[AgentConnection] = []

    async def handler(conn: AgentConnection) -> None:
        seen.append(conn)
        await echo(conn)

    server = await serve(handler, cert_dir=sim_cert_dir)
    try:
        client = await H2Client.connect(server.url, server.cert_path)
        rid = str(uuid.uuid4())
        stream = await client.request(RUN, {"content-type": "application/connect+proto", "x-request-id": rid})
        parser = EnvelopeParser()
        # The server's first frame arrives although the client has not sent a single body byte.
        (first,) = await read_envelopes(stream, 1, parser)
        assert first.payload == HEARTBEAT
        assert seen[0].transport == "run"
        assert seen[0].request_id == rid
        assert seen[0].headers["content-type"] == "application/connect+proto"
        big = os.urandom(3 * 1024 * 1024)  # far beyond the 64 KiB default window and 16 KiB frames
        await stream.send(encode(b"small"))
        await stream.send(encode(big))
        small, echoed = await read_envelopes(stream, 2, parser)
        assert small.payload == b"small"
        assert echoed.payload == big
        await stream.end()
        (end,) = await read_envelopes(stream, 1, parser)
        assert end.is_end_stream
        assert end.payload == b"{}"
        await client.close()
    finally:
        await server.close()


async def test_plain_h2c_and_unary(tmp_path: Path) -> None:
    async def models(req: UnaryRequest) -> UnaryResponse:
        return UnaryResponse(body=b"\x0a\x03abc" + req.body)

    server = await serve(echo, tls=False, unary={"/x.Y/Z": models})
    try:
        assert server.url.startswith("http://127.0.0.1:")
        assert server.cert_path is None
        client = await H2Client.connect(server.url, None)
        stream = await client.request("/x.Y/Z", {"content-type": "application/proto"}, body=b"!")
        assert await stream.read_all() == b"\x0a\x03abc!"
        stream = await client.request(RUN, {"content-type": "application/connect+proto"})
        (hb,) = await read_envelopes(stream, 1, EnvelopeParser())
        assert hb.payload == HEARTBEAT
        await client.close()
    finally:
        await server.close()


async def test_close_stops_running_handlers(sim_cert_dir: Path) -> None:
    cancelled = asyncio.Event()

    async def forever(conn: AgentConnection) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    server = await serve(forever, cert_dir=sim_cert_dir)
    client = await H2Client.connect(server.url, server.cert_path)
    await client.request(RUN, {"content-type": "application/connect+proto"})
    await wait_until_async(lambda: server._handler_tasks, timeout=10, what="the handler to start")
    await server.close()
    assert cancelled.is_set()
    await client.close()
