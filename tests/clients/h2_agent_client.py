"""A bidi ``Run`` client on plain ``h2`` + ``ssl`` that behaves like the real agent clients.

It keeps its request stream open for the whole turn (it never half-closes first) and waits for
the server's END_STREAM, as clients built on Node's ``http2`` do. It answers KV requests, execs
(a result alone for ordinary execs; ShellStream stdout, exit, a final shell_result and
stream_close for a streamed shell; throw + stream_close for an exec it cannot run) and
interaction queries, sends client heartbeats, and logs every frame it sent and received in the
same NDJSON format as ``node_agent_client.mjs``:
``{"t", "dir", "direction", "transport", "kind", "flags", "hex", "wire_hex"}``.

It does not use ``workbench.client`` (whose behaviour it checks), only the generated message
classes. Knobs for tests: ``half_close`` (end the request stream right after ``run_request``),
``cancel_after`` (RST_STREAM(CANCEL) after N server frames), ``linger_frames`` (heartbeats still
sent after the response ended), ``after_end`` (what to do with the request stream once the
response ended: ``reset`` = RST_STREAM(NO_ERROR), the default, ``end`` = END_STREAM, ``close`` =
drop the connection), ``extra_headers``.

Usable from tests (``H2AgentClient(...).run_turn(prompt)``) or as a script
(``python tests/clients/h2_agent_client.py --help``).
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import ssl
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from workbench.schema import pb

RUN_PATH = "/agent.v1.AgentService/Run"
CLIENT_VERSION = "cli-2026.01.01-h2test"


@dataclass
class TurnResult:
    status: int | None = None
    turn_ended: bool = False
    end_stream: bool = False          # the HTTP/2 END_STREAM of the response arrived
    end_frame: str | None = None      # "ok" or the Connect error code of the end-stream frame
    reset_code: int | None = None     # an RST_STREAM the client received
    cancelled: bool = False           # this client reset the stream itself (cancel_after)
    frames_sent: int = 0
    frames_received: int = 0
    error: str | None = None
    elapsed: float = 0.0
    request_id: str = ""
    log: list[dict[str, Any]] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        return self.turn_ended and self.end_stream and self.error is None


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return bytes((flags,)) + len(payload).to_bytes(4, "big") + payload


class _Frames:
    """Connect envelopes out of arbitrary chunks."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.buf += data
        out = []
        while len(self.buf) >= 5:
            n = int.from_bytes(self.buf[1:5], "big")
            if len(self.buf) < 5 + n:
                break
            out.append((self.buf[0], bytes(self.buf[5:5 + n])))
            del self.buf[:5 + n]
        return out


def _kind(msg: Any) -> str:
    top = msg.WhichOneof("message") or "empty"
    sub = getattr(msg, top, None) if top != "empty" else None
    if sub is None:
        return top
    for oneof in sub.DESCRIPTOR.oneofs:
        member = sub.WhichOneof(oneof.name)
        if member and not oneof.name.startswith("_"):
            return f"{top}.{member}"
    return top


class H2AgentClient:
    def __init__(self, base_url: str, *, token: str, ca_file: str | None = None, proxy: str | None = None,
                 model: str = "default", conversation_id: str | None = None, request_id: str | None = None,
                 heartbeat_interval: float = 5.0, timeout: float = 60.0, half_close: bool = False,
                 cancel_after: int | None = None, after_end: str = "reset", linger_frames: int = 0,
                 extra_headers: list[tuple[str, str]] | None = None, log_path: str | Path | None = None):
        u = urlsplit(base_url)
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or 443
        self.token = token
        self.ca_file = ca_file
        self.proxy = urlsplit(proxy) if proxy else None
        self.model = model
        self.conversation_id = conversation_id or str(uuid.uuid4())
        self.request_id = request_id or str(uuid.uuid4())
        self.heartbeat_interval = heartbeat_interval
        self.timeout = timeout
        self.half_close = half_close
        self.cancel_after = cancel_after
        self.after_end = after_end
        self.linger_frames = linger_frames
        self.extra_headers = list(extra_headers or [])
        self.log_path = Path(log_path) if log_path else None

    # connection ------------------------------------------------------------------------------

    def _connect(self) -> ssl.SSLSocket:
        if self.proxy is not None:
            raw = socket.create_connection((self.proxy.hostname, self.proxy.port or 80), timeout=30)
            raw.sendall(f"CONNECT {self.host}:{self.port} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n".encode())
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = raw.recv(4096)
                if not chunk:
                    raise ConnectionError("proxy closed the CONNECT")
                head += chunk
            status_line = head.split(b"\r\n", 1)[0]
            if b" 200" not in status_line:
                raise ConnectionError(f"proxy refused CONNECT: {status_line!r}")
        else:
            raw = socket.create_connection((self.host, self.port), timeout=30)
        ctx = ssl.create_default_context(cafile=self.ca_file)
        ctx.set_alpn_protocols(["h2"])
        tls = ctx.wrap_socket(raw, server_hostname=self.host)
        if tls.selected_alpn_protocol() != "h2":
            raise ConnectionError(f"server did not agree to h2 (ALPN {tls.selected_alpn_protocol()!r})")
        tls.setblocking(False)
        return tls

    # messages --------------------------------------------------------------------------------

    def _run_request(self, prompt: str) -> bytes:
        return pb.AgentClientMessage(run_request=pb.AgentRunRequest(
            conversation_state=pb.ConversationStateStructure(),
            action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
                user_message=pb.UserMessage(text=prompt, message_id=str(uuid.uuid4())))),
            requested_model=pb.RequestedModel(model_id=self.model),
            conversation_id=self.conversation_id)).SerializeToString()

    @staticmethod
    def _answers(msg: Any) -> list[bytes]:
        """What a real client sends back for one server message."""
        top = msg.WhichOneof("message")
        out: list[Any] = []
        if top == "kv_server_message":
            kv = msg.kv_server_message
            if kv.WhichOneof("args") == "set_blob_args":
                out.append(pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
                    id=kv.id, set_blob_result=pb.SetBlobResult())))
            else:
                out.append(pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(
                    id=kv.id, get_blob_result=pb.GetBlobResult())))
        elif top == "exec_server_message":
            ex = msg.exec_server_message
            which = ex.WhichOneof("args")

            def result(**kw: Any) -> Any:
                return pb.AgentClientMessage(exec_client_message=pb.ExecClientMessage(id=ex.id, exec_id=ex.exec_id, **kw))

            def close() -> Any:
                return pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
                    stream_close=pb.ExecClientStreamClose(id=ex.id)))

            if which == "shell_stream_args":
                cmd = ex.shell_stream_args.command
                out += [result(shell_stream_result=pb.ShellStream(stdout=pb.ShellStreamStdout(data="ok\n"))),
                        result(shell_stream_result=pb.ShellStream(exit=pb.ShellStreamExit(code=0))),
                        result(shell_result=pb.ShellResult(success=pb.ShellSuccess(command=cmd, stdout="ok\n"))),
                        close()]
            elif which == "shell_args":
                out.append(result(shell_result=pb.ShellResult(success=pb.ShellSuccess(
                    command=ex.shell_args.command, stdout="ok\n"))))
            elif which == "read_args":
                out.append(result(read_result=pb.ReadResult(success=pb.ReadSuccess(path=ex.read_args.path, content=""))))
            elif which == "write_args":
                out.append(result(write_result=pb.WriteResult(success=pb.WriteSuccess(path=ex.write_args.path))))
            elif which == "request_context_args":
                out.append(result(request_context_result=pb.RequestContextResult(
                    success=pb.RequestContextSuccess(request_context=pb.RequestContext()))))
            else:
                out += [pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
                    throw=pb.ExecClientThrow(id=ex.id, error=f"no handler for {which}"))), close()]
        elif top == "interaction_query":
            q = msg.interaction_query
            member = q.WhichOneof("query")
            if member == "web_search_request_query":
                out.append(pb.AgentClientMessage(interaction_response=pb.InteractionResponse(
                    id=q.id, web_search_request_response=pb.WebSearchRequestResponse(approved=pb.InteractionApproved()))))
        return [m.SerializeToString() for m in out]

    # the turn --------------------------------------------------------------------------------

    def run_turn(self, prompt: str) -> TurnResult:
        res = TurnResult(request_id=self.request_id)
        start = time.monotonic()
        try:
            self._turn(prompt, res)
        except Exception as exc:  # reported in the result, like the Node client's summary
            res.error = f"{type(exc).__name__}: {exc}"
        res.elapsed = time.monotonic() - start
        if self.log_path is not None:
            self.log_path.write_text("".join(json.dumps(e) + "\n" for e in res.log))
        return res

    def _log(self, res: TurnResult, direction: str, flags: int, payload: bytes, kind: str) -> None:
        res.log.append({"t": time.time_ns() // 1000, "dir": "send" if direction == "client" else "recv",
                        "direction": direction, "transport": "run", "kind": kind, "flags": flags,
                        "hex": payload.hex(), "wire_hex": envelope(payload, flags).hex()})

    def _turn(self, prompt: str, res: TurnResult) -> None:
        sock = self._connect()
        # headers stay bytes: a server may send values that are not UTF-8
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        conn.initiate_connection()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [
            (":method", "POST"), (":scheme", "https"), (":authority", f"{self.host}:{self.port}"), (":path", RUN_PATH),
            ("content-type", "application/connect+proto"), ("connect-protocol-version", "1"), ("te", "trailers"),
            ("authorization", f"Bearer {self.token}"), ("x-request-id", self.request_id),
            ("x-cursor-client-version", CLIENT_VERSION), ("user-agent", "h2-agent-client/1"), *self.extra_headers])
        stream_open = True  # our request side

        def send(payload: bytes) -> None:
            if not stream_open:
                return
            conn.send_data(sid, envelope(payload))
            res.frames_sent += 1
            msg = pb.AgentClientMessage.FromString(payload)
            self._log(res, "client", 0, payload, _kind(msg))

        send(self._run_request(prompt))
        if self.half_close:
            conn.end_stream(sid)
            stream_open = False
        frames = _Frames()
        deadline = time.monotonic() + self.timeout
        next_beat = time.monotonic() + self.heartbeat_interval
        done = False
        while not done:
            out = conn.data_to_send()
            if out:
                sock.setblocking(True)
                sock.sendall(out)
                sock.setblocking(False)
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"no END_STREAM within {self.timeout:g} s "
                                   f"(turn_ended {'seen' if res.turn_ended else 'not seen'})")
            if stream_open and now >= next_beat:
                send(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())
                next_beat = now + self.heartbeat_interval
                continue
            wait = max(0.0, min(deadline, next_beat if stream_open else deadline) - now)
            if not sock.pending():
                readable, _, _ = select.select([sock], [], [], wait)
                if not readable:
                    continue
            try:
                data = sock.recv(65536)
            except ssl.SSLWantReadError:
                continue
            if not data:
                raise ConnectionError("server closed the connection")
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.ResponseReceived):
                    res.status = int(dict(ev.headers).get(b":status", b"0"))
                elif isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    for flags, payload in frames.feed(ev.data):
                        res.frames_received += 1
                        if flags & 0x02:
                            doc = json.loads(payload or b"{}")
                            res.end_frame = doc.get("error", {}).get("code") if "error" in doc else "ok"
                            self._log(res, "server", flags, payload, "end_stream")
                            continue
                        msg = pb.AgentServerMessage.FromString(payload)
                        kind = _kind(msg)
                        self._log(res, "server", flags, payload, kind)
                        if kind == "interaction_update.turn_ended":
                            res.turn_ended = True
                        for answer in self._answers(msg):
                            send(answer)
                        if self.cancel_after is not None and res.frames_received >= self.cancel_after and stream_open:
                            conn.reset_stream(sid, h2.errors.ErrorCodes.CANCEL)
                            res.cancelled = True
                            stream_open = False
                            done = True
                            break
                elif isinstance(ev, h2.events.StreamEnded):
                    res.end_stream = True
                    done = True
                elif isinstance(ev, h2.events.StreamReset):
                    res.reset_code = int(ev.error_code)
                    stream_open = False
                    done = True
                elif isinstance(ev, h2.events.ConnectionTerminated):
                    raise ConnectionError(f"GOAWAY {ev.error_code!r}")
        if stream_open and res.end_stream:
            for _ in range(self.linger_frames):  # a client still talking after the answer ended
                send(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())
        self._finish(sock, conn, sid, res, stream_open)

    def _finish(self, sock: ssl.SSLSocket, conn: Any, sid: int, res: TurnResult, stream_open: bool) -> None:
        """The response is over: let go of the request side the way ``after_end`` says.

        First a short wait for a reset that follows END_STREAM (a server stopping the request body
        with RST_STREAM(NO_ERROR)): a real client sees it before it gets round to closing.
        """
        sock.setblocking(True)
        try:
            if stream_open and res.end_stream:
                sock.settimeout(0.3)
                try:
                    while res.reset_code is None:
                        data = sock.recv(65536)
                        if not data:
                            break
                        for ev in conn.receive_data(data):
                            if isinstance(ev, h2.events.StreamReset) and ev.stream_id == sid:
                                res.reset_code = int(ev.error_code)
                                stream_open = False
                except (TimeoutError, ssl.SSLError, OSError):
                    pass
            if stream_open and res.end_stream:
                if self.after_end == "reset":
                    conn.reset_stream(sid, h2.errors.ErrorCodes.NO_ERROR)
                elif self.after_end == "end":
                    conn.end_stream(sid)
            if self.after_end != "close":
                conn.close_connection()  # GOAWAY
            out = conn.data_to_send()
            if out:
                sock.sendall(out)
        except (OSError, h2.exceptions.ProtocolError):
            pass
        finally:
            sock.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--ca", default=None, help="CA file to trust")
    ap.add_argument("--proxy", default=None, help="HTTP proxy for CONNECT (e.g. http://127.0.0.1:8080)")
    ap.add_argument("--token", default="h2-agent-client-token")
    ap.add_argument("--prompt", default="hello")
    ap.add_argument("--model", default="default")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--heartbeat", type=float, default=5.0)
    ap.add_argument("--half-close", action="store_true")
    ap.add_argument("--after-end", choices=["reset", "end", "close"], default="reset")
    ap.add_argument("--log", default=None)
    a = ap.parse_args(argv)
    res = H2AgentClient(a.base_url, token=a.token, ca_file=a.ca, proxy=a.proxy, model=a.model,
                        heartbeat_interval=a.heartbeat, timeout=a.timeout, half_close=a.half_close,
                        after_end=a.after_end, log_path=a.log).run_turn(a.prompt)
    print(json.dumps({"turn_ended": res.turn_ended, "end_stream": res.end_stream, "end_frame": res.end_frame,
                      "reset_code": res.reset_code, "frames_sent": res.frames_sent,
                      "frames_received": res.frames_received, "error": res.error,
                      "elapsed": round(res.elapsed, 3), "request_id": res.request_id}))
    return 0 if res.completed else 1


if __name__ == "__main__":
    sys.exit(main())
