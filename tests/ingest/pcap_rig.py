"""Real packets for pcap import tests: tcpdump on loopback while real clients talk TLS to ``workbench sim``.

``Tcpdump`` records ``tcp port P`` on ``lo`` (run as root, here and in CI). It stops only once a
sentinel connection to a closed port has shown up in the file, so every packet before it is
there too. Clients log their TLS keys: the built-in client through ``SSLContext.keylog_filename``
(or ``SSLKEYLOGFILE`` for the CLI), the Node.js test client through ``--tls-keylog`` /
``NODE_OPTIONS``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import query_rows

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
NODE_CLIENT = ROOT / "tests" / "clients" / "node_agent_client.mjs"
TOKEN = "wb-pcap-token-7c1e5b"
# Frames that carry no agent message of their own: the client's log does not list them.
WRAPPERS = ("bidi_request_id", "bidi_poll_request")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def packets_matching(pcap: Path, display_filter: str) -> int:
    out = subprocess.run(["tshark", "-r", str(pcap), "-Y", display_filter, "-T", "fields", "-e", "frame.number"],
                         capture_output=True, text=True, timeout=120)
    return len([line for line in out.stdout.splitlines() if line.strip()])


class Tcpdump:
    """``tcpdump -i lo`` writing ``out`` for ``tcp port <port>``."""

    def __init__(self, out: Path, port: int) -> None:
        self.out = out
        self.port = port
        self.sentinel = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Tcpdump:
        return self.start()

    def start(self) -> Tcpdump:
        cmd = ["tcpdump", "-i", "lo", "-B", "32768", "-U", "-n", "-s", "0", "-Z", "root", "-w", str(self.out),
               f"tcp port {self.port} or tcp port {self.sentinel}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline().decode()
        assert "listening on" in line, line
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        with socket.socket() as s:  # refused: its SYN and RST land after every earlier packet
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", self.sentinel))
            except OSError:
                pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not packets_matching(self.out, f"tcp.port == {self.sentinel}"):
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def replayed_later(src: Path, dst: Path, server_port: int, client_port: int, after_s: int) -> Path:
    """``src`` (a classic pcap of loopback, Ethernet framing) as a second capture of the same
    traffic would show it on another client port, ``after_s`` seconds later: what a capture
    merged from two overlapping ones holds (the same TLS connection twice). Checksums are left
    as they are (tshark does not check them)."""
    data = bytearray(src.read_bytes())
    assert data[:4] == b"\xd4\xc3\xb2\xa1" and struct.unpack_from("<I", data, 20)[0] == 1, "pcap of Ethernet"
    off = 24
    while off < len(data):
        secs, _usecs, incl = struct.unpack_from("<III", data, off)
        struct.pack_into("<I", data, off, secs + after_s)
        ip = off + 16 + 14
        if struct.unpack_from(">H", data, ip - 2)[0] == 0x0800 and data[ip + 9] == 6:  # IPv4, TCP
            tcp = ip + (data[ip] & 0x0F) * 4
            sport, dport = struct.unpack_from(">HH", data, tcp)
            if dport == server_port:
                struct.pack_into(">H", data, tcp, client_port)
            elif sport == server_port:
                struct.pack_into(">H", data, tcp + 2, client_port)
        off += 16 + incl
    dst.write_bytes(bytes(data))
    return dst


def keylog_context(cert: Path | str, keylog: Path, alpn: tuple[str, ...]) -> ssl.SSLContext:
    """The built-in client's TLS context, logging its session keys (``SSLContext.keylog_filename``)."""
    from workbench.client.net import ssl_context

    ctx = ssl_context(str(cert), alpn=alpn)
    assert isinstance(ctx, ssl.SSLContext)
    ctx.keylog_filename = str(keylog)
    return ctx


@dataclass
class PythonTurns:
    request_ids: list[str] = field(default_factory=list)
    errors: list[str | None] = field(default_factory=list)
    frame_log: list[Any] = field(default_factory=list)


async def python_turns(url: str, verify: Any, prompts: list[str], *, transport: str = "run",
                       record_to: Any = None, workspace: Path | None = None, **client_kw: Any) -> PythonTurns:
    """Consecutive turns of one built-in client; its own frame log and recording are the reference."""
    from workbench.client.agent import AgentClient

    out = PythonTurns()
    on_exec = client_kw.pop("on_exec", None)
    async with AgentClient(url, TOKEN, transport=transport, verify=verify, record_to=record_to,
                           workspace=workspace, heartbeat_interval=client_kw.pop("heartbeat_interval", 0.2),
                           **client_kw) as client:
        for prompt in prompts:
            res = await client.run_turn(prompt, raise_on_error=False, on_exec=on_exec)
            out.errors.append(res.error.code if res.error else None)
            if client.last_request_id and client.last_request_id not in out.request_ids:
                out.request_ids.append(client.last_request_id)
        out.frame_log = list(client.frame_log)
    return out


def node_turn(base_url: str, cert: Path, log: Path, keylog: Path, *, transport: str, prompt: str,
              via: str = "flag", extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One turn of the Node.js client; its keys go to ``keylog`` by ``--tls-keylog`` (``via="flag"``)
    or by ``NODE_OPTIONS`` (``via="env"``). Returns its summary line."""
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
    node = ["node"]
    if via == "flag":
        node.append(f"--tls-keylog={keylog}")
    else:
        env["NODE_OPTIONS"] = f"--tls-keylog={keylog}"
    cmd = [*node, str(NODE_CLIENT), "--base-url", base_url, "--ca", str(cert), "--no-proxy", "--transport", transport,
           "--prompt", prompt, "--token", TOKEN, "--heartbeat-ms", "200", "--log", str(log), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.strip(), done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def node_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def import_pcap(pcap: Path, db: Path, keylog: Path | None, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(BIN / "workbench"), "import", str(pcap), "--db", str(db), *extra]
    if keylog is not None:
        cmd += ["--keylog", str(keylog)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def frames_of(db: Path, session_id: str) -> list[dict[str, Any]]:
    return query_rows(db, "SELECT * FROM frames WHERE session_id = ? ORDER BY seq", [session_id])


def unanswered_append(r: dict[str, Any]) -> bool:
    """A BidiAppend the client posted but got no HTTP answer to in the capture (it closed first, or
    the connection failed): on the wire, yet the built-in client logs an append only once answered."""
    return r["transport"] == "bidi_append" and r["direction"] == "client" and \
        json.loads(r["meta"] or "{}").get("http_status") is None


def is_agent_message(r: dict[str, Any]) -> bool:
    """A frame the client logs as an agent message (not a wrapper, an end-stream, an HTTP refusal of an
    append, an append left unanswered or RunPoll's eof record)."""
    if r["kind"] in WRAPPERS or r["kind"].startswith("end_stream") or r["kind"] == "http_error" or \
            unanswered_append(r):
        return False
    return not (r["transport"] == "runpoll" and r["kind"] == "empty" and not r["payload"])


def agent_messages(rows: list[dict[str, Any]]) -> dict[str, list[bytes]]:
    """Per direction, the agent messages of a session as the client logs them."""
    out: dict[str, list[bytes]] = {"client": [], "server": []}
    for r in rows:
        if is_agent_message(r):
            out[r["direction"]].append(bytes(r["payload"]))
    return out


def answers_follow_questions(rows: list[dict[str, Any]]) -> bool:
    """Every client answer comes after the server message it answers (paired by id, in wire order)."""
    from workbench.protocol.matching import START, pair_messages

    class F:
        def __init__(self, r: dict[str, Any]) -> None:
            self.kind, self.ref_id, self.payload = r["kind"], r["ref_id"], bytes(r["payload"])

    server = [(i, r) for i, r in enumerate(rows) if r["direction"] == "server" and r["kind"] not in WRAPPERS]
    client = [(i, r) for i, r in enumerate(rows) if r["direction"] == "client" and r["kind"] not in WRAPPERS]
    pairing = pair_messages([F(r) for _, r in server], [F(r) for _, r in client])  # type: ignore[arg-type]
    assert not pairing.problem, pairing.problem
    for (pos, _), target in zip(client, pairing.answers, strict=True):
        if target is not None and target != START and pos < server[target][0]:
            return False
    return True
