"""After a server's GOAWAY the h2 library refuses to send anything more on the connection (its
state machine is CLOSED). Ending a stream then (closing a run after ``goaway_after_turn``) must be
a ``NetError`` the run's close handles, not an ``h2`` ``ProtocolError`` escaping as a traceback
(seen with ``workbench sim``'s ``goaway_after_turn`` over Run when the GOAWAY beat the close).
Driven frame by frame with a server-side h2 state machine: no network."""

from __future__ import annotations

import h2.config
import h2.connection
import pytest

from workbench.client.net import H2Connection, NetError


def _after_goaway() -> H2Connection:
    conn = H2Connection("https://127.0.0.1:9")
    client = conn._h2
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":scheme", "https"), (":authority", "127.0.0.1:9"),
                            (":path", "/agent.v1.AgentService/Run")])
    server = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    server.receive_data(client.data_to_send())
    server.send_headers(1, [(":status", "200"), ("content-type", "application/connect+proto")])
    server.close_connection(last_stream_id=1)  # GOAWAY, NO_ERROR: stream 1 was processed
    client.receive_data(server.data_to_send())
    return conn


async def test_ending_a_stream_after_goaway_is_a_net_error() -> None:
    conn = _after_goaway()
    with pytest.raises(NetError, match="closed by the server"):
        await conn.send_data(1, b"", True)


async def test_sending_data_after_goaway_is_a_net_error() -> None:
    conn = _after_goaway()
    with pytest.raises(NetError, match="closed by the server"):
        await conn.send_data(1, b"\x00\x00\x00\x00\x02\x1a\x00", False)
