"""The live rig: a scripted HTTP/2 upstream and an HTTP/2 client, both sending hostile bytes, with a
real mitmdump (the capture addon) between them.

The upstream answers each request with the exchange registered under its ``x-hostile-id``:
response headers as given (arbitrary bytes, a ``grpc-message``), the server envelopes once the
client has finished sending, then the trailers, or a reset (RST_STREAM PROTOCOL_ERROR) instead of
the end. Neither side validates or normalizes header bytes: the point is what mitmdump and the
addon do with what a broken or malicious peer can put on the wire.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
from strategies import RUN_PATH, Exchange

from workbench.transport.certs import ensure_cert

_LOOSE = {"validate_outbound_headers": False, "normalize_outbound_headers": False,
          "validate_inbound_headers": False, "normalize_inbound_headers": False, "header_encoding": None}


class HostileUpstream:
    def __init__(self, cert_dir: Path) -> None:
        pair = ensure_cert(cert_dir)
        self.cert = Path(pair.cert_path)
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(pair.cert_path, pair.key_path)
        self.ctx.set_alpn_protocols(["h2"])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.script: dict[bytes, Exchange] = {}
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def _accept(self) -> None:
        while not self._stop:
            try:
                raw, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            tls = self.ctx.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, **_LOOSE))
        conn.initiate_connection()
        streams: dict[int, Exchange] = {}
        try:
            tls.sendall(conn.data_to_send())
            while True:
                data = tls.recv(65536)
                if not data:
                    break
                for ev in conn.receive_data(data):
                    self._event(conn, ev, streams)
                out = conn.data_to_send()
                if out:
                    tls.sendall(out)
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    def _event(self, conn: h2.connection.H2Connection, ev: h2.events.Event, streams: dict[int, Exchange]) -> None:
        if isinstance(ev, h2.events.RequestReceived):
            key = dict(ev.headers).get(b"x-hostile-id", b"")
            ex = self.script.get(key)
            if ex is None:
                conn.send_headers(ev.stream_id, [(b":status", b"404")], end_stream=True)
                return
            streams[ev.stream_id] = ex
            conn.send_headers(ev.stream_id, [(b":status", b"200"), *ex.response_headers()])
        elif isinstance(ev, h2.events.DataReceived):
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            ex = streams.get(ev.stream_id)
            if ex is None:
                return
            body = b"".join(ex.server_envelopes())
            if ex.reset:
                conn.send_data(ev.stream_id, body)
                conn.reset_stream(ev.stream_id, 1)  # PROTOCOL_ERROR mid-answer
            elif ex.trailers:
                conn.send_data(ev.stream_id, body)
                conn.send_headers(ev.stream_id, list(ex.trailers), end_stream=True)
            else:
                conn.send_data(ev.stream_id, body, end_stream=True)


def send(proxy_port: int | None, upstream_port: int, ca: Path, key: bytes, ex: Exchange, request_id: str,
         timeout: float = 30.0, keylog: Path | None = None, received: list[bytes] | None = None) -> str:
    """Send ``ex`` through the proxy (CONNECT, TLS trusting mitmproxy's CA ``ca``, h2), or straight
    to the upstream when ``proxy_port`` is None (``ca``: its certificate), and read the answer to
    its end. ``keylog``: log the TLS keys there (for a packet capture). Returns how it ended:
    ``ended``, ``reset``, ``refused`` (the proxy answered before the upstream could: no response
    headers from it), ``broken`` (the client's HTTP/2 stack rejected the answer) or ``closed``.
    ``received``: the answer's DATA is appended there as it arrives."""
    raw = socket.create_connection(("127.0.0.1", proxy_port or upstream_port), timeout=timeout)
    try:
        if proxy_port is not None:
            raw.sendall(f"CONNECT 127.0.0.1:{upstream_port} HTTP/1.1\r\nHost: 127.0.0.1:{upstream_port}\r\n\r\n"
                        .encode())
            reply = b""
            while b"\r\n\r\n" not in reply:
                chunk = raw.recv(4096)
                if not chunk:
                    return "closed"
                reply += chunk
            if b" 200" not in reply.split(b"\r\n", 1)[0]:
                return "refused"
        ctx = ssl.create_default_context(cafile=str(ca))
        ctx.check_hostname = False
        ctx.set_alpn_protocols(["h2"])
        if keylog is not None:
            ctx.keylog_filename = str(keylog)
        tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, **_LOOSE))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        headers = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"),
                   (b":path", RUN_PATH.encode() + ex.path_suffix), (b"x-hostile-id", key),
                   (b"x-request-id", request_id.encode()), *ex.request_headers()]
        conn.send_headers(sid, headers)
        conn.send_data(sid, b"".join(ex.client_envelopes()), end_stream=True)
        tls.sendall(conn.data_to_send())
        got_response = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = tls.recv(65536)
            if not data:
                return "closed" if got_response else "refused"
            try:
                events = conn.receive_data(data)
            except h2.exceptions.ProtocolError:
                # the client's own HTTP/2 stack refuses what the server sent (a trailer
                # ``content-length: ok\xfe``): the bytes are on the wire all the same
                return "broken" if got_response else "refused"
            for ev in events:
                if isinstance(ev, h2.events.ResponseReceived) and ev.stream_id == sid:
                    got_response = dict(ev.headers).get(b":status") == b"200"
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if received is not None and ev.stream_id == sid:
                        received.append(ev.data)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    return "ended" if got_response else "refused"
                elif isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                    return "reset" if got_response else "refused"
            out = conn.data_to_send()
            if out:
                tls.sendall(out)
        raise AssertionError(f"no end of the answer to {request_id} within {timeout:g} s")
    finally:
        with contextlib.suppress(OSError):
            raw.close()
