"""A scripted HTTP/2 agent server that ends each bidi ``Run`` the way its ``x-test-ending`` header says.

The session-status equivalence test sends the same requests through a real mitmdump (capture addon
plus a whole-body flow writer) to this server, so the live capture and the flow file hold the same
bytes for every way a response can end. It answers once the request body is complete:

- ``clean``: a text frame, a Connect end-stream ``{}``, END_STREAM;
- ``end_error``: a text frame, an end-stream with ``resource_exhausted``;
- ``truncated``: a text frame, END_STREAM without any end-stream frame;
- ``connect_trailer_ok``: Connect framing, a text frame, then HTTP/2 trailers ``grpc-status: 0``
  and no end-stream frame (Connect has no trailers: the stream did not end properly);
- ``grpc_trailer_ok`` / ``grpc_trailer_error``: gRPC framing (``application/grpc+proto``), a text
  frame, then trailers with ``grpc-status`` 0 / 8;
- ``grpc_trailers_only``: gRPC framing, headers with ``grpc-status: 13`` and END_STREAM, no body;
- ``grpc_web_trailer_ok`` / ``grpc_web_trailer_error``: gRPC-Web framing, a text frame, then a
  trailer frame (flag 0x80) with ``grpc-status`` 0 / 8;
- ``http_429`` / ``http_503`` / ``http_302``: that status with a Connect JSON error (none for 302);
- ``reset``: a text frame, then RST_STREAM(INTERNAL_ERROR).

It runs in a thread of the test process.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from workbench.schema import pb
from workbench.wire.endstream import grpc_web_trailer_payload
from workbench.wire.envelope import FLAG_END_STREAM, FLAG_TRAILER, encode

try:  # the certificate helper moved with the transport package
    from workbench.transport.certs import ensure_cert  # type: ignore[import-not-found,unused-ignore]
except ImportError:
    from workbench.sim.certs import ensure_cert  # type: ignore[no-redef,unused-ignore]

TEXT = encode(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    text_delta=pb.TextDelta(text="scripted answer"))).SerializeToString())
CONNECT_CT = "application/connect+proto"
GRPC_CT = "application/grpc+proto"
GRPC_WEB_CT = "application/grpc-web+proto"
LIMIT = {"code": "resource_exhausted", "message": "Usage limit reached"}

# ending → (content type of the request and answer, the status the session must get)
ENDINGS: dict[str, tuple[str, str]] = {
    "clean": (CONNECT_CT, "complete"),
    "end_error": (CONNECT_CT, "error"),
    "truncated": (CONNECT_CT, "incomplete"),
    "connect_trailer_ok": (CONNECT_CT, "incomplete"),
    "grpc_trailer_ok": (GRPC_CT, "complete"),
    "grpc_trailer_error": (GRPC_CT, "error"),
    "grpc_trailers_only": (GRPC_CT, "error"),
    "grpc_web_trailer_ok": (GRPC_WEB_CT, "complete"),
    "grpc_web_trailer_error": (GRPC_WEB_CT, "error"),
    "http_429": (CONNECT_CT, "error"),
    "http_503": (CONNECT_CT, "error"),
    "http_302": (CONNECT_CT, "error"),
    "reset": (CONNECT_CT, "aborted"),
}


class EndingServer:
    def __init__(self, cert_dir: Path) -> None:
        pair = ensure_cert(cert_dir)
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(pair.cert_path, pair.key_path)
        self.ctx.set_alpn_protocols(["h2"])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.answered: list[str] = []
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
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        endings: dict[int, str] = {}
        try:
            tls.sendall(conn.data_to_send())
            while True:
                data = tls.recv(65536)
                if not data:
                    break
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.RequestReceived):
                        endings[ev.stream_id] = dict(ev.headers).get("x-test-ending", "clean")
                    elif isinstance(ev, h2.events.DataReceived):
                        conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id in endings:
                        self._answer(conn, ev.stream_id, endings.pop(ev.stream_id))
                out = conn.data_to_send()
                if out:
                    tls.sendall(out)
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            with contextlib.suppress(OSError):
                tls.close()

    def _answer(self, conn: h2.connection.H2Connection, sid: int, ending: str) -> None:
        ctype = ENDINGS[ending][0]
        self.answered.append(ending)
        if ending.startswith("http_"):
            status = ending[5:]
            body = b"" if status == "302" else json.dumps(LIMIT if status == "429" else
                                                          {"code": "unavailable", "message": "try later"}).encode()
            headers = [(":status", status), ("content-type", "application/json")]
            if status == "302":
                headers.append(("location", "/elsewhere"))
            conn.send_headers(sid, headers, end_stream=not body)
            if body:
                conn.send_data(sid, body, end_stream=True)
            return
        if ending == "grpc_trailers_only":
            conn.send_headers(sid, [(":status", "200"), ("content-type", ctype), ("grpc-status", "13"),
                                    ("grpc-message", "no run")], end_stream=True)
            return
        conn.send_headers(sid, [(":status", "200"), ("content-type", ctype)])
        if ending == "clean":
            conn.send_data(sid, TEXT + encode(b"{}", FLAG_END_STREAM), end_stream=True)
        elif ending == "end_error":
            conn.send_data(sid, TEXT + encode(json.dumps({"error": LIMIT}).encode(), FLAG_END_STREAM), end_stream=True)
        elif ending == "truncated":
            conn.send_data(sid, TEXT, end_stream=True)
        elif ending in ("connect_trailer_ok", "grpc_trailer_ok", "grpc_trailer_error"):
            conn.send_data(sid, TEXT)
            code = "8" if ending.endswith("error") else "0"
            trailers = [("grpc-status", code)] + ([("grpc-message", "limit")] if code != "0" else [])
            conn.send_headers(sid, trailers, end_stream=True)
        elif ending.startswith("grpc_web_trailer"):
            code = "8" if ending.endswith("error") else "0"
            fields = [("grpc-status", code)] + ([("grpc-message", "limit")] if code != "0" else [])
            conn.send_data(sid, TEXT + encode(grpc_web_trailer_payload(fields), FLAG_TRAILER), end_stream=True)
        elif ending == "reset":
            conn.send_data(sid, TEXT)
            conn.reset_stream(sid, h2.errors.ErrorCodes.INTERNAL_ERROR)
