"""Helpers for capture tests: process handles, ports, the long scenarios."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


