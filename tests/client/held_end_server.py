"""A tiny test-only HTTP/2 server for ``Run`` that ends its responses the way a proxy in between
may: it answers one turn (text, ``turn_ended``, the end-stream frame ``{}``) and then, in ``held``
mode, holds the HTTP/2 END_STREAM back until the client ends its own side — what mitmproxy 11 does
to a bidi stream whose server finishes first. In ``prompt`` mode it ends the stream with the
end-stream frame, as a healthy path does; in ``silent`` mode it sends no end-stream frame either
(the response just stays open until the client ends its side).

Written with the ``h2`` library directly (no code of ours on the server side) over TLS on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from workbench.schema import pb
from workbench.transport.certs import ensure_cert
from workbench.wire.envelope import FLAG_END_STREAM, encode


def _update(**kw: object) -> bytes:
    return bytes(pb.message("AgentServerMessage")(interaction_update=pb.message("InteractionUpdate")(**kw))
                 .SerializeToString())


TURN = [
    _update(text_delta=pb.message("TextDelta")(text="held-end answer")),
    _update(turn_ended=pb.message("TurnEnded")()),
]


@dataclass
class LoopbackH2Server:
    """An HTTP/2-over-TLS test server on 127.0.0.1 (a free port) with a self-signed certificate:
    the bootstrapping the test servers here share; a subclass serves each connection (``_serve``)."""

    cert_dir: Path
    port: int = 0
    _server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def cert_path(self) -> str:
        return str(ensure_cert(self.cert_dir).cert_path)

    async def start(self) -> Self:
        pair = ensure_cert(self.cert_dir)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pair.cert_path, pair.key_path)
        ctx.set_alpn_protocols(["h2"])
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=ctx)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError


@dataclass
class StreamLog:
    """What the server saw on one stream."""

    client_frames_after_turn: int = 0  # client envelopes (heartbeats) that came after turn_ended was sent
    client_ended: bool = False  # the client half-closed its request side
    client_reset: bool = False
    released: bool = False  # the server sent END_STREAM


@dataclass
class HeldEndServer(LoopbackH2Server):
    mode: str = "held"  # held | prompt | silent
    streams: list[StreamLog] = field(default_factory=list)  # every stream, connections in turn

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        answered: set[int] = set()
        pending: dict[int, bytes] = {}
        logs: dict[int, StreamLog] = {}  # this connection's streams
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    return
                for ev in conn.receive_data(data):
                    sid = getattr(ev, "stream_id", 0)
                    try:
                        self._on_event(conn, ev, sid, logs, pending, answered)
                    except (h2.exceptions.StreamClosedError, KeyError):
                        # The peer reset this stream while we answered it (a client leaving at
                        # turn_ended does): only that stream is gone, the connection serves on.
                        # h2 4.1's end_stream looks the stream up with a plain dict index, so a
                        # reset that arrived in the same read as the END_STREAM raises KeyError.
                        if sid in logs:
                            logs[sid].client_reset = True
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
            return
        finally:
            writer.close()

    def _on_event(self, conn: h2.connection.H2Connection, ev: h2.events.Event, sid: int,
                  logs: dict[int, StreamLog], pending: dict[int, bytes], answered: set[int]) -> None:
        if isinstance(ev, h2.events.RequestReceived):
            logs[sid] = StreamLog()
            self.streams.append(logs[sid])
            pending[sid] = b""
            conn.send_headers(sid, [(":status", "200"), ("content-type", "application/connect+proto")])
        elif isinstance(ev, h2.events.DataReceived):
            conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            if sid in answered:
                logs[sid].client_frames_after_turn += 1
                return
            pending[sid] += ev.data
            if len(pending[sid]) >= 5 and len(pending[sid]) >= 5 + int.from_bytes(pending[sid][1:5], "big"):
                answered.add(sid)  # the run_request is in: answer the turn
                body = b"".join(encode(m) for m in TURN)
                if self.mode != "silent":
                    body += encode(b"{}", flags=FLAG_END_STREAM)
                conn.send_data(sid, body, end_stream=self.mode == "prompt")
                logs[sid].released = self.mode == "prompt"
        elif isinstance(ev, h2.events.StreamEnded):
            log = logs[sid]
            log.client_ended = True
            if not log.released:  # the proxy lets the end through once the request is done
                log.released = True
                conn.end_stream(sid)
        elif isinstance(ev, h2.events.StreamReset):
            logs[sid].client_reset = True
