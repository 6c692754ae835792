"""A "next Cursor build" for schema tests: our overlay with realistic drift, and traffic spoken with it.

Changes against the overlay (each one a kind of drift the tools must see):

* ``ExecServerMessage`` gets a new oneof member ``plan_review_args = 56`` (a new message type): under
  the overlay the frame kind is ``exec_server_message.56``;
* ``ShellArgs`` gets a new field ``sandbox_profile = 22`` and ``working_directory`` is renamed ``cwd``;
* ``TextDelta.text`` moves from 1 to 7 (renumbered);
* ``WriteArgs.file_bytes`` carries binary file content (opaque bytes in both schemas).

The turn parks on the plan review: a client of the previous build cannot answer it.

``RunSseServer`` answers ``RunSSE`` over HTTP/1.1 with server messages serialized by the next
build's own classes; ``record`` sends a turn through a proxy (a real mitmdump) to it.
"""

from __future__ import annotations

import http.client
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT, compile_protos
from workbench.wire.envelope import FLAG_END_STREAM, encode

REQUEST_ID = "5d0c3b1a-7e2f-4a6b-9c8d-0e1f2a3b4c5d"
CLIENT_VERSION = "cli-2026.10.02-next"
HEARTBEATS = 6
PNG_HEAD = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x10"
EDITS = [
    ("message TextDelta {\n  string text = 1;", "message TextDelta {\n  string text = 7;"),
    ("message ShellArgs {\n  string command = 1;\n  string working_directory = 2;",
     "message ShellArgs {\n  string command = 1;\n  string cwd = 2;"),
    ("  string conversation_id = 21;\n}\n\nmessage ShellResult {",
     "  string conversation_id = 21;\n  string sandbox_profile = 22;\n}\n\nmessage ShellResult {"),
    ("    AgentStoreConflictArgs agent_store_conflict_args = 54;\n  }",
     "    AgentStoreConflictArgs agent_store_conflict_args = 54;\n    PlanReviewArgs plan_review_args = 56;\n  }"),
    ("message WriteArgs {",
     "message PlanReviewArgs {\n  string plan_uri = 1;\n  repeated string reviewers = 2;\n}\n\nmessage WriteArgs {"),
]


def write_next_build(root: Path) -> Path:
    """The next build's .proto files under ``root`` (same file names as the overlay)."""
    for name in BUILTIN_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((PROTO_ROOT / name).read_text())
    agent = root / "agent/v1/agent.proto"
    text = agent.read_text()
    for old, new in EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    agent.write_text(text)
    return root


def server_class(root: Path) -> Any:
    from google.protobuf import descriptor_pool, message_factory

    pool = descriptor_pool.DescriptorPool()
    for fd in compile_protos([root / f for f in BUILTIN_FILES], [root]).file:
        pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("agent.v1.AgentServerMessage"))


def server_messages(root: Path) -> list[bytes]:
    """One turn as the next build's server sends it: the client (which knows no plan review) never
    answers exec 3, so the server heartbeats until it gives up."""
    server = server_class(root)
    return [m.SerializeToString() for m in (
        server(interaction_update={"text_delta": {"text": "Linting, then the logo."}}),
        server(exec_server_message={"id": 1, "shell_args": {"command": "make lint", "cwd": "/repo",
                                                           "sandbox_profile": "workspace-write"}}),
        server(exec_server_message={"id": 2, "write_args": {"path": "logo.png", "file_bytes": PNG_HEAD}}),
        server(interaction_update={"text_delta": {"text": "Now the plan needs a review."}}),
        server(exec_server_message={"id": 3, "plan_review_args": {"plan_uri": "plan://7", "reviewers": ["ana"]}}),
        *(server(interaction_update={"heartbeat": {}}) for _ in range(HEARTBEATS)),
    )]


class RunSseServer:
    """HTTP/1.1 agent backend answering RunSSE with the next build's messages, BidiAppend with 200."""

    def __init__(self, root: Path) -> None:
        body = b"".join(encode(m) for m in server_messages(root)) + encode(b"{}", flags=FLAG_END_STREAM)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 - http.server naming
                self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.path.split("?")[0].endswith("/agent.v1.AgentService/RunSSE"):
                    self._send(body, "application/connect+proto")
                else:
                    self._send(b"", "application/proto")

            def _send(self, data: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def record(proxy_port: int, server_port: int) -> None:
    """One RunSSE turn through the proxy: the BidiRequestId opens it, the server streams the turn."""
    from workbench.schema import pb

    rid = encode(pb.BidiRequestId(request_id=REQUEST_ID).SerializeToString())
    conn = http.client.HTTPConnection("127.0.0.1", proxy_port, timeout=60)
    conn.request("POST", f"http://127.0.0.1:{server_port}/agent.v1.AgentService/RunSSE", body=rid, headers={
        "content-type": "application/connect+proto", "connect-protocol-version": "1",
        "x-request-id": REQUEST_ID, "x-cursor-client-version": CLIENT_VERSION})
    resp = conn.getresponse()
    resp.read()
    conn.close()
    assert resp.status == 200, resp.status


def extract_next_build(generators: Any, work: Path) -> Path:
    """The next build → protobuf-es v1 (TypeScript target) → esbuild bundle → ``schema extract``."""
    root = write_next_build(work / "next-proto")
    sources = generators.generate("v1", root, list(BUILTIN_FILES), work / "next-gen", "ts")
    bundle = generators.bundle("v1", sources, work / "next-gen", work / "next-app.js")[0]
    out = work / "next-extracted"
    proc = subprocess.run([sys.executable, "-m", "workbench.cli", "schema", "extract", str(bundle), "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


MITMDUMP = Path(sys.executable).with_name("mitmdump")
ADDON = Path(__file__).resolve().parents[2] / "addons" / "cursor_capture.py"


class Mitmdump:
    """A real mitmdump on a free loopback port (``args``: the addon and its options, or ``-w FILE``)."""

    def __init__(self, args: list[str], confdir: Path, env: dict[str, str] | None = None) -> None:
        import os
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.log = confdir / f"mitmdump-{self.port}.log"
        confdir.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(MITMDUMP), "-q", "--listen-host", "127.0.0.1", "--listen-port", str(self.port),
                 "--set", f"confdir={confdir}", *args],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        import time

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mitmdump exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("mitmdump did not listen within 120 s")

    def stop(self) -> int:
        import signal

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=120)


def make_example(out: Path) -> None:
    """The docs' example (docs/schema.md): the next build's bundle ``app.js``, and its turn recorded
    by the capture addon (``capture.duckdb``, read with the overlay) and as a flow file (``turn.flows``)."""
    import os
    import shutil
    import tempfile

    from js_generators import Generators, install

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wb-next-") as tmp:
        work = Path(tmp)
        root = write_next_build(work / "proto")
        gen = Generators(install("v1"), install("v2"))
        sources = gen.generate("v1", root, list(BUILTIN_FILES), work / "gen", "ts")
        shutil.copyfile(gen.bundle("v1", sources, work / "gen", work / "app.js")[0], out / "app.js")
        server = RunSseServer(root)
        isolated = {"XDG_CONFIG_HOME": str(work / "config")}
        try:
            for args in (["-s", str(ADDON), "--set", f"cursor_db={out / 'capture.duckdb'}"],
                         ["-w", str(out / "turn.flows")]):
                m = Mitmdump(args, work / "mitm", {**os.environ, **isolated})
                try:
                    record(m.port, server.port)
                finally:
                    m.stop()
        finally:
            server.close()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    make_example(Path(sys.argv[1]))
    print(f"wrote {sys.argv[1]}/app.js, capture.duckdb, turn.flows")
