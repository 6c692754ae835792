"""The OpenAI side's limits end to end: a real mitmdump (``workbench capture --bridge``) in front of a
bridge that answers with what the issue found (an answer of ``[`` × 200,000, one SSE line of tens of
MB), a client that sends a request of ``[`` × 100,000, and then an ordinary request (the official
``openai`` SDK) that readers must see while the capture goes on.

What must hold: the client gets every answer whole and unchanged (the capture never changes the
session); the capture logs no traceback and loses no frame; the too-deep bodies are frames kept
with their error, the over-long event a marker with its size and hash; the capture stops on Ctrl-C.
The SSE limit is lowered through its option (``WORKBENCH_SSE_EVENT_MB``) so the line stays at
tens of MB and the test fast.
"""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import Process, query_rows, start_workbench

from workbench.nesting import NESTING_LIMIT
from workbench.protocol import kinds

pytestmark = pytest.mark.slow

SSE_LIMIT_MB = 1
LONG_CONTENT = 20 << 20          # one data: line of 20 MiB, twenty times the limit
DEEP_REQUEST = b"[" * 100_000
DEEP_ANSWER = b"[" * 200_000
_ORDINARY = {"id": "c1", "object": "chat.completion", "model": "m",
             "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}


def long_stream() -> tuple[bytes, bytes]:
    """(the over-long event's data, the whole SSE body it is the first event of)."""
    data = b'{"choices":[{"index":0,"delta":{"content":"' + b"x" * LONG_CONTENT + b'"}}]}'
    tail = b'data: {"choices":[{"index":0,"delta":{"content":"after"}}]}\n\ndata: [DONE]\n\n'
    return data, b"data: " + data + b"\n\n" + tail


class HostileBridge(BaseHTTPRequestHandler):
    """Answers by what the request asks for; writes its answers in 64 KiB pieces, as a server does."""

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        ask = "" if body.startswith(b"[") else json.loads(body)["messages"][-1]["content"]
        if ask == "long line":
            self._send("text/event-stream", long_stream()[1])
        elif ask == "deep answer":
            self._send("application/json", DEEP_ANSWER)
        else:
            self._send("application/json", json.dumps(_ORDINARY).encode())

    def _send(self, ctype: str, data: bytes) -> None:
        self.send_response(200)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        for i in range(0, len(data), 1 << 16):
            self.wfile.write(data[i:i + (1 << 16)])

    def log_message(self, *_: Any) -> None:
        pass


@dataclass
class LimitsRig:
    capture: Process
    db: Path
    client_url: str


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[LimitsRig]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostileBridge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    db = tmp_path / "limits.duckdb"
    cap = start_workbench("capture", "--port", "0", "--db", str(db), "--confdir", str(tmp_path / "mitm"),
                          "--flush-ms", "50", "--bridge", f"http://127.0.0.1:{server.server_address[1]}",
                          env={"WORKBENCH_SSE_EVENT_MB": str(SSE_LIMIT_MB)})
    try:
        line = ""
        while not line.startswith("bridge: "):
            line = cap.next_line(90)
        yield LimitsRig(cap, db, line.split(": ", 1)[1].strip())
    finally:
        cap.stop(signal.SIGINT, timeout=60)
        server.shutdown()
        server.server_close()


def _frames(db: Path, session_id: str) -> list[dict[str, Any]]:
    return query_rows(db, "SELECT seq, kind, error, payload FROM frames WHERE session_id = ? ORDER BY seq",
                      [session_id])


def _session_asking(db: Path, what: str) -> str | None:
    rows = query_rows(db, "SELECT session_id FROM sessions WHERE transport = 'openai_chat' AND label = ?", [what])
    return str(rows[0]["session_id"]) if rows else None


def test_deep_bodies_and_an_over_long_sse_line_through_mitmdump(rig: LimitsRig) -> None:
    http = httpx.Client(base_url=rig.client_url, timeout=300, trust_env=False)
    chat = "/v1/chat/completions"

    def ask(what: str) -> dict[str, Any]:
        return {"model": "m", "stream": what == "long line", "messages": [{"role": "user", "content": what}]}

    r = http.post(chat, content=DEEP_REQUEST, headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json() == _ORDINARY
    r = http.post(chat, json=ask("deep answer"))
    assert r.status_code == 200 and r.content == DEEP_ANSWER  # forwarded whole and unchanged
    data, body = long_stream()
    got = hashlib.sha256()
    size = 0
    with http.stream("POST", chat, json=ask("long line")) as resp:
        for piece in resp.iter_raw():
            got.update(piece)
            size += len(piece)
    assert (size, got.hexdigest()) == (len(body), hashlib.sha256(body).hexdigest())  # whole and unchanged

    # an ordinary request after them, through the official SDK: readers see it while the capture runs
    sdk = openai.OpenAI(base_url=rig.client_url + "/v1", api_key="sk-client-key-never-stored", max_retries=0,
                        timeout=300, http_client=httpx.Client(trust_env=False))
    assert sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "later"}]) \
        .choices[0].message.content == "hello"
    later = rig.capture.wait_for(lambda: _session_asking(rig.db, "later"), timeout=120,
                                 what="the request after the over-long line, seen by a reader")
    rig.capture.wait_for(lambda: len(_frames(rig.db, later)) == 2, timeout=120, what="its two frames")

    assert rig.capture.stop(signal.SIGINT, timeout=120) == 0
    log = "\n".join(rig.capture.out + rig.capture.err)
    assert "Traceback" not in log and "RecursionError" not in log, log[-3000:]

    sessions = query_rows(rig.db, "SELECT session_id, label FROM sessions WHERE transport = 'openai_chat' "
                                  "ORDER BY started_at")
    assert len(sessions) == 4, sessions
    deep_req, deep_ans, long_line, _later = (_frames(rig.db, str(s["session_id"])) for s in sessions)
    too_deep = f"deeper than {NESTING_LIMIT}"
    assert [f["kind"] for f in deep_req] == [kinds.OPENAI_REQUEST, kinds.OPENAI_RESPONSE]
    assert too_deep in deep_req[0]["error"] and deep_req[1]["error"] is None
    assert [f["kind"] for f in deep_ans] == [kinds.OPENAI_REQUEST, kinds.OPENAI_RESPONSE]
    assert too_deep in deep_ans[1]["error"] and bytes(deep_ans[1]["payload"]) == DEEP_ANSWER  # kept raw
    assert [f["kind"] for f in long_line] == [kinds.OPENAI_REQUEST, kinds.OPENAI_EVENT, kinds.OPENAI_CONTENT,
                                              kinds.OPENAI_DONE]
    marker = long_line[1]
    assert hashlib.sha256(data).hexdigest() in marker["error"] and f"{len(data):,} bytes" in marker["error"]
    assert json.loads(bytes(marker["payload"]))["sse_over_limit"]["bytes"] == len(data)
    assert max(len(bytes(f["payload"])) for f in long_line) < SSE_LIMIT_MB << 20  # nothing of the line stored
