"""A tiny scripted HTTP/2 agent server for the capture's end-of-stream and reset tests.

``workbench sim`` plays scenarios; some wire behaviours it has no step for, and the tests must see
what reaches the server (which reset code, whether client DATA still arrives after the response
ended). This server answers a bidi ``Run`` according to its ``x-test-mode`` header and records
what it received in ``events``:

- ``end_then_rst``: a text frame, turn_ended, a clean end-stream with END_STREAM, then
  RST_STREAM(NO_ERROR) to stop the request body (allowed by HTTP/2 after a complete response);
- ``rst:<code>``: a text frame, then RST_STREAM with that error code (a server reset mid-turn);
- ``end_at_first``: turn_ended and a clean end-stream with END_STREAM right away, then it keeps
  reading (and counting) what the client still sends until the client ends or resets;
- ``echo``: one heartbeat frame per client message, until the client ends or resets;
- ``bad_utf8``: a text frame, turn_ended and a clean end-stream, with a response header and a
  ``grpc-message`` trailer that are not UTF-8 (``caf\xe9 down``).

It runs in a thread of the test process (TLS from ``workbench.transport.certs``).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from workbench.schema import pb
from workbench.transport.certs import ensure_cert


def _env(payload: bytes, flags: int = 0) -> bytes:
    return bytes((flags,)) + len(payload).to_bytes(4, "big") + payload


TEXT = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    text_delta=pb.TextDelta(text="scripted answer"))).SerializeToString()
TURN_ENDED = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    turn_ended=pb.TurnEnded())).SerializeToString()
HEARTBEAT = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    heartbeat=pb.Heartbeat())).SerializeToString()


@dataclass
class Seen:
    """What one request stream brought the server."""

    mode: str
    client_frames: int = 0
    frames_after_response_end: int = 0
    end_stream: bool = False
    reset_code: int | None = None
    done: threading.Event = field(default_factory=threading.Event)
    parser: _Count = field(default_factory=lambda: _Count())
    headers: dict[str, str] = field(default_factory=dict)  # as received (bytes not UTF-8 replaced)


class _Count:
    """Counts whole Connect envelopes in a chunked body."""

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> int:
        self.buf += data
        n = 0
        while len(self.buf) >= 5 and len(self.buf) >= 5 + int.from_bytes(self.buf[1:5], "big"):
            self.buf = self.buf[5 + int.from_bytes(self.buf[1:5], "big"):]
            n += 1
        return n


class ScriptServer:
    def __init__(self, cert_dir: Path) -> None:
        pair = ensure_cert(cert_dir)
        self.cert = Path(pair.cert_path)
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.ctx.load_cert_chain(pair.cert_path, pair.key_path)
        self.ctx.set_alpn_protocols(["h2"])
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"https://127.0.0.1:{self.port}"
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.close()

    def wait(self, index: int, timeout: float = 30) -> Seen:
        """The record of the ``index``-th request once its stream is over on the server side."""
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.seen) > index:
                    s = self.seen[index]
                    break
            time.sleep(0.01)
        else:
            raise TimeoutError(f"request {index} never reached the scripted server")
        if not s.done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"request {index} ({s.mode}) never ended on the server side")
        return s

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
        # headers stay bytes: clients may send values that are not UTF-8
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
        conn.initiate_connection()
        streams: dict[int, Seen] = {}
        ended: set[int] = set()  # our response is over on these streams
        try:
            tls.sendall(conn.data_to_send())
            while True:
                data = tls.recv(65536)
                if not data:
                    break
                for ev in conn.receive_data(data):
                    self._event(conn, ev, streams, ended)
                out = conn.data_to_send()
                if out:
                    tls.sendall(out)
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            for s in streams.values():
                s.done.set()
            with contextlib.suppress(OSError):
                tls.close()

    def _event(self, conn: h2.connection.H2Connection, ev: h2.events.Event, streams: dict[int, Seen],
               ended: set[int]) -> None:
        if isinstance(ev, h2.events.RequestReceived):
            headers = {bytes(k).decode(): bytes(v).decode("utf-8", "replace") for k, v in ev.headers}
            s = Seen(headers.get("x-test-mode", "echo"), headers=headers)
            with self._lock:
                self.seen.append(s)
            streams[ev.stream_id] = s
            conn.send_headers(ev.stream_id, [(b":status", b"200"), (b"content-type", b"application/connect+proto"),
                                             *([(b"x-server-note", b"caf\xe9")] if s.mode == "bad_utf8" else [])])
            if s.mode == "end_at_first":
                conn.send_data(ev.stream_id, _env(TURN_ENDED) + _env(b"{}", 0x02), end_stream=True)
                ended.add(ev.stream_id)
            elif s.mode == "end_then_rst":
                conn.send_data(ev.stream_id, _env(TEXT) + _env(TURN_ENDED) + _env(b"{}", 0x02), end_stream=True)
                ended.add(ev.stream_id)
                conn.reset_stream(ev.stream_id, 0)  # NO_ERROR: "stop sending, the answer is complete"
                s.done.set()
            elif s.mode == "bad_utf8":
                conn.send_data(ev.stream_id, _env(TEXT) + _env(TURN_ENDED) + _env(b"{}", 0x02))
                conn.send_headers(ev.stream_id, [(b"grpc-status", b"14"), (b"grpc-message", b"caf\xe9 down")],
                                  end_stream=True)
                ended.add(ev.stream_id)
            elif s.mode.startswith("rst:"):
                conn.send_data(ev.stream_id, _env(TEXT))
                conn.reset_stream(ev.stream_id, int(s.mode[4:]))
                ended.add(ev.stream_id)
                s.done.set()
        elif isinstance(ev, h2.events.DataReceived):
            conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            s = streams.get(ev.stream_id)
            if s is None:
                return
            frames = s.parser.feed(ev.data)
            if ev.stream_id in ended:
                s.frames_after_response_end += frames
                return
            s.client_frames += frames
            if s.mode == "echo":
                with contextlib.suppress(h2.exceptions.StreamClosedError):
                    conn.send_data(ev.stream_id, _env(HEARTBEAT))
        elif isinstance(ev, h2.events.StreamEnded):
            s = streams.get(ev.stream_id)
            if s is not None:
                s.end_stream = True
                if s.mode == "echo":
                    conn.send_data(ev.stream_id, _env(TURN_ENDED) + _env(b"{}", 0x02), end_stream=True)
                s.done.set()
        elif isinstance(ev, h2.events.StreamReset):
            s = streams.get(ev.stream_id)
            if s is not None:
                s.reset_code = int(ev.error_code)
                s.done.set()
