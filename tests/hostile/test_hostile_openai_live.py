"""Source: ``workbench capture --bridge`` live, a real mitmdump between an HTTP client and a bridge that
answers with generated SSE bodies written in generated pieces (flushed one by one).

Invariants: (a) the client receives every body byte for byte (the listener forwards whole and
unchanged, whatever the lines); (b) every event recorded or marked: the answer's frames are what the
SSE rules give for the whole body (``test_hostile_openai.reference_events``), an event past the
SSE limit (lowered here through ``WORKBENCH_SSE_EVENT_MB``) a marker naming its size and SHA-256;
(c) no traceback in the capture's log, and it stops cleanly.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import hostile, tried
from support import Process, query_rows, start_workbench
from test_hostile_openai import reference_events, sse_bodies

from workbench.decode.sse import MIB, SseComment, SseEvent, SseOversize

pytestmark = pytest.mark.slow
LIMIT = 600
PREAMBLE = b"data: start\n\n"  # an answer is read as SSE when it starts with an SSE field
BODIES: dict[str, tuple[bytes, list[int]]] = {}  # example id → (body, piece sizes)


class ScriptedBridge(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        req = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
        body, pieces = BODIES[req["messages"][-1]["content"]]
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        pos = 0
        for size in itertools.cycle(pieces or [len(body) or 1]):
            if pos >= len(body):
                break
            self.wfile.write(body[pos:pos + size])
            self.wfile.flush()
            pos += size

    def log_message(self, *_: Any) -> None:
        pass


@dataclass
class LiveRig:
    capture: Process
    db: Path
    client: httpx.Client
    ids: Iterator[int]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRig]:
    tmp = tmp_path_factory.mktemp("openai-live")
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScriptedBridge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    db = tmp / "live.duckdb"
    cap = start_workbench("capture", "--port", "0", "--db", str(db), "--confdir", str(tmp / "mitm"),
                          "--flush-ms", "50", "--bridge", f"http://127.0.0.1:{server.server_address[1]}",
                          env={"WORKBENCH_SSE_EVENT_MB": repr(LIMIT / MIB)})
    client: httpx.Client | None = None
    try:
        line = ""
        while not line.startswith("bridge: "):
            line = cap.next_line(90)
        client = httpx.Client(base_url=line.split(": ", 1)[1].strip(), timeout=120, trust_env=False)
        yield LiveRig(cap, db, client, itertools.count())
        assert cap.stop(signal.SIGINT, timeout=60) == 0, cap.stderr_tail()
        log = "\n".join(cap.out + cap.err)
        assert "Traceback" not in log, log[-3000:]  # (c)
    finally:
        if client is not None:
            client.close()
        cap.stop(signal.SIGINT, timeout=60)
        server.shutdown()
        server.server_close()


def _frames(rig: LiveRig, label: str) -> list[dict[str, Any]] | None:
    rows = query_rows(rig.db, "SELECT session_id, status FROM sessions WHERE label = ?", [label])
    if not rows or rows[0]["status"] == "open":
        return None
    return query_rows(rig.db, "SELECT kind, error, payload FROM frames WHERE session_id = ? AND direction = 'server' "
                              "ORDER BY seq", [rows[0]["session_id"]])


@hostile(20)
@given(body=sse_bodies, pieces=st.lists(st.integers(1, 5000), max_size=8))
def test_bridge_listener_forwards_and_records_any_sse(live: LiveRig, body: bytes, pieces: list[int]) -> None:
    tried("test_bridge_listener_forwards_and_records_any_sse")
    label = f"example-{next(live.ids)}"
    body = PREAMBLE + body
    BODIES[label] = (body, pieces)
    got = bytearray()
    with live.client.stream("POST", "/v1/chat/completions",
                            json={"model": "m", "stream": True, "messages": [{"role": "user", "content": label}]}) as r:
        for piece in r.iter_raw():
            got += piece
    assert bytes(got) == body  # (a)
    frames = live.capture.wait_for(lambda: _frames(live, label), timeout=120, what=f"the frames of {label}")
    want = reference_events(body, LIMIT)
    assert len(frames) == len(want), ([f["kind"] for f in frames], want)  # (b)
    for f, item in zip(frames, want, strict=True):
        if type(item) is SseOversize:
            assert f["error"] and item.sha256 in f["error"] and f"{item.size:,} bytes" in f["error"]
        elif type(item) is SseComment:
            assert f["kind"] == "openai.comment" and bytes(f["payload"]) == item.line
        else:
            assert type(item) is SseEvent
            payload = bytes(f["payload"])
            assert payload == item.data or payload.startswith(b"[redacted") or item.data[:1] in b"{[", \
                (payload, item)
