"""Helpers for capture tests: process handles, ports, the long scenarios."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "addons" / "cursor_capture.py"
BIN = Path(sys.executable).parent
CLIENTS = ROOT / "tests" / "clients"
NODE_CLIENT = CLIENTS / "node_agent_client.mjs"
if str(CLIENTS) not in sys.path:
    sys.path.insert(0, str(CLIENTS))  # the shared test clients (h2_agent_client)

# A long paced turn (~3 s at --pace 0.02) for the kill and follow tests.
LONG_SCENARIO = {
    "description": "many streamed text deltas",
    "steps": [
        {"kv_set": "system"},
        {"kv_set": "user"},
        {"text": "word " * 150, "chunks": 150},
        {"turn_ended": True},
        {"end": "ok"},
    ],
}


# Every exec kind the test clients answer with a result alone, a streamed shell (closed with
# stream_close), KV both ways. The waits ask only for what the clients send.
NODE_TOOLS_SCENARIO = {
    "description": "every exec kind the test clients answer",
    "steps": [
        {"kv_set": "system"}, {"kv_set": "user"}, {"kv_get": "state"},
        {"tool": {"exec": "shell", "args": {"command": "echo one"}, "require_stream_close": False}},
        {"tool": {"exec": "shell_stream", "args": {"command": "ls -la"}}},
        {"tool": {"exec": "read", "args": {"path": "README.md"}, "require_stream_close": False}},
        {"tool": {"exec": "write", "args": {"path": "NOTES.md", "contents": "x"}, "require_stream_close": False}},
        {"tool": {"exec": "ls", "args": {"path": "."}, "require_stream_close": False}},
        {"tool": {"exec": "grep", "args": {"pattern": "x", "path": "."}, "require_stream_close": False}},
        {"tool": {"exec": "delete", "args": {"path": "NOTES.md"}, "require_stream_close": False}},
        {"text": "All tools answered.", "chunks": 3},
        {"checkpoint": True}, {"step_completed": True}, {"turn_ended": True}, {"end": "ok"},
    ],
}

# A turn that asks the client nothing: for a client that half-closes its request at once.
STREAM_ONLY_SCENARIO = {
    "description": "server-only stream (no KV, no exec)",
    "steps": [{"thinking": "thinking out loud", "chunks": 5}, {"text": "word " * 60, "chunks": 60},
              {"step_completed": True}, {"turn_ended": True}, {"end": "ok"}],
}


@dataclass
class Sim:
    url: str
    cert: Path
    proc: subprocess.Popen[str]


@dataclass
class Mitm:
    port: int
    db: Path
    ca: Path
    proc: subprocess.Popen[bytes]
    flush_ms: int

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise




async def turn_with_mitmdump_killed(client: Any, m: Mitm, after_deltas: int = 60) -> tuple[int, list[Any], str]:
    """Stream the long scenario's turn through ``m`` with ``client`` (an ``AgentClient`` using the
    proxy) and ``kill -9`` mitmdump once ``after_deltas`` text deltas arrived: (the kill's time in
    epoch µs, the client's frame log, the session id). The turn ends however the client sees it."""
    killed_at = 0
    seen = 0
    async for ev in client.stream_turn("[scenario:long] go"):
        seen += type(ev).__name__ == "TextDelta"
        if seen == after_deltas and not killed_at:
            killed_at = time.time_ns() // 1000
            m.proc.send_signal(signal.SIGKILL)
            m.proc.wait()
    assert killed_at, f"the turn ended before {after_deltas} text deltas"
    return killed_at, list(client.frame_log), client.last_request_id
