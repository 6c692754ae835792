"""A flood of server frames on one agent Run, through a real mitmdump (as ``benchmarks/capture.py``
floods for its forwarding figures): the upstream and the client run on the test's event loop.

``Flood.frames`` are the payloads the client got, in order; the server writes ``n`` text deltas
``"<i> xxx…"`` (``size`` bytes each) as fast as HTTP/2 flow control lets it, then ends the run.
``on_frame(i)`` runs in the client after frame ``i`` arrived (where a test kills or stops the
writer process mid-flood).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUN_PATH = "/agent.v1.AgentService/Run"


def text_frame(i: int, size: int) -> bytes:
    from workbench.schema import pb

    body = f"{i} ".ljust(size, "x")
    return bytes(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=body))).SerializeToString())


async def flood_upstream(n: int, size: int, cert_dir: Path) -> Any:
    """A TLS upstream on loopback that answers every Run with the flood; ``.url``, ``.close()``."""
    from workbench.transport import serve

    async def handler(conn: Any) -> None:
        if await conn.receive() is None:
            return
        for i in range(n):
            await conn.send(text_frame(i, size))
        await conn.end()

    return await serve(handler, port=0, tls=True, cert_dir=cert_dir)


@dataclass
class Flood:
    request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    frames: list[bytes] = field(default_factory=list)
    run_request: bytes = b""


async def run_flood(url: str, ca: Path, on_frame: Callable[[int], None] = lambda i: None) -> Flood:
    """One Run through the proxy of ``HTTPS_PROXY``; returns what the client sent and got."""
    from workbench.client.net import H2Connection
    from workbench.schema import pb
    from workbench.wire.envelope import EnvelopeParser, encode

    flood = Flood()
    conn = H2Connection(url, verify=str(ca))
    await conn.connect()
    try:
        stream = await conn.request(RUN_PATH, [
            ("content-type", "application/connect+proto"), ("connect-protocol-version", "1"),
            ("authorization", "Bearer flood-token"), ("x-request-id", flood.request_id)])
        flood.run_request = pb.AgentClientMessage(run_request=pb.AgentRunRequest(
            conversation_id="flood", action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                user_message=pb.UserMessage(text="flood"))))).SerializeToString()
        await stream.send(encode(flood.run_request), end=True)
        parser = EnvelopeParser()
        async for chunk in stream.chunks():
            for env in parser.feed(chunk):
                if not env.flags:
                    flood.frames.append(env.payload)
                    on_frame(len(flood.frames) - 1)
    finally:
        await conn.close()
    return flood
