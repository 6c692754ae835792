"""A tiny test-only HTTP/2 server for ``Run`` whose turn never finishes: after the run request it
sends a heartbeat every ``interval`` seconds until the client leaves, and logs how the client left
— a ``cancel_action`` (answered with the end-stream ``{}``, as the service does), an RST_STREAM and
its error code, or the connection closed (with or without a GOAWAY) — and when, counted from the
request. For checking a client's stream watchdog on the wire.

Written with the ``h2`` library directly (no code of ours on the server side) over TLS on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from held_end_server import LoopbackH2Server

from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, EnvelopeParser, encode

HEARTBEAT = bytes(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    heartbeat=pb.Heartbeat())).SerializeToString())


@dataclass
class StallLog:
    """How the client left one stream (times in seconds after its request headers)."""

    started: float = field(default_factory=time.monotonic)
    client_kinds: list[str] = field(default_factory=list)
    cancel_at: float | None = None
    reset_code: int | None = None
    reset_at: float | None = None
    closed_at: float | None = None  # the TCP connection ended
    goaway_from_client: bool = False
    left: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class StallServer(LoopbackH2Server):
    interval: float = 0.1
    streams: list[StallLog] = field(default_factory=list)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        logs: dict[int, StallLog] = {}
        parsers: dict[int, EnvelopeParser] = {}
        live: set[int] = set()
        beats = asyncio.get_running_loop().create_task(self._beat(conn, writer, live))
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                for ev in conn.receive_data(data):
                    self._on_event(conn, ev, logs, parsers, live)
                writer.write(conn.data_to_send())
                await writer.drain()
        except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass
        finally:
            beats.cancel()
            for log in logs.values():
                if log.closed_at is None:
                    log.closed_at = time.monotonic() - log.started
                log.left.set()
            writer.close()

    async def _beat(self, conn: h2.connection.H2Connection, writer: asyncio.StreamWriter, live: set[int]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            for sid in list(live):
                with contextlib.suppress(h2.exceptions.H2Error, KeyError):
                    conn.send_data(sid, encode(HEARTBEAT))
            with contextlib.suppress(ConnectionError):
                writer.write(conn.data_to_send())
                await writer.drain()

    def _on_event(self, conn: h2.connection.H2Connection, ev: h2.events.Event, logs: dict[int, StallLog],
                  parsers: dict[int, EnvelopeParser], live: set[int]) -> None:
        sid = getattr(ev, "stream_id", 0)
        if isinstance(ev, h2.events.RequestReceived):
            logs[sid] = StallLog()
            self.streams.append(logs[sid])
            parsers[sid] = EnvelopeParser()
            conn.send_headers(sid, [(":status", "200"), ("content-type", "application/connect+proto")])
            live.add(sid)
        elif isinstance(ev, h2.events.DataReceived):
            conn.acknowledge_received_data(ev.flow_controlled_length, sid)
            log = logs[sid]
            for env in parsers[sid].feed(ev.data):
                msg = pb.AgentClientMessage.FromString(env.payload)
                kind = msg.WhichOneof("message") or "empty"
                if kind == "conversation_action":
                    kind += "." + (msg.conversation_action.WhichOneof("action") or "")
                log.client_kinds.append(kind)
                if kind == "conversation_action.cancel_action" and sid in live:
                    log.cancel_at = time.monotonic() - log.started
                    live.discard(sid)
                    conn.send_data(sid, encode(b"{}", flags=FLAG_END_STREAM), end_stream=True)
                    log.left.set()
        elif isinstance(ev, h2.events.StreamReset):
            live.discard(sid)
            if sid in logs:
                logs[sid].reset_code = int(ev.error_code)
                logs[sid].reset_at = time.monotonic() - logs[sid].started
                logs[sid].left.set()
        elif isinstance(ev, h2.events.ConnectionTerminated):
            for log in logs.values():
                log.goaway_from_client = True
