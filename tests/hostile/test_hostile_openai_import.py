"""Source: ``workbench import`` of HAR (``.zhar``) and flow files holding the OpenAI side of a bridge,
with hostile exchanges among ordinary ones.

Invariants: (a) no traceback, exit 0 (error frames are not a failed import); (b) every exchange
imported, the hostile one as its session with a frame that says what is wrong (a body nested past
the nesting limit kept with its error, an SSE event past the SSE limit as a marker with its size
and hash); (c) a credential in a too-deep answer on no file nor in any view; the views (``sessions``,
``frames``, ``diagnose``, exports, ``report``, ``diff``) run clean.
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from formats import _iso, har_document, write_flows, zhar
from hypothesis import given
from hypothesis import strategies as st
from invariants import canary_nowhere, clean_exit, query, run_in_process, view_outputs
from strategies import CANARY_PREFIX, hostile, tried
from support import env_without_proxy, run_workbench
from test_hostile_openai import openai_docs

from workbench.nesting import NESTING_LIMIT

pytestmark = pytest.mark.slow
SSE_LIMIT_MB = "0.01"  # 10,485 bytes: the over-long line below stays small, the suite fast
LONG_LINE = 40_000
URL = "http://127.0.0.1:4141/v1/chat/completions"
JSON, SSE = "application/json", "text/event-stream"


def _request(text: str) -> bytes:
    return json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": text}]}).encode()


def _answer(text: str) -> bytes:
    return json.dumps({"object": "chat.completion", "choices": [{"message": {"content": text},
                                                                 "finish_reason": "stop"}]}).encode()


def exchanges(depth: int, canary: str, long_value: bytes, events: list[str]) -> list[tuple[str, bytes, bytes, str]]:
    """(what, request, answer, answer content type): one ordinary exchange, then the three the issue
    names (a too-deep request, a too-deep answer with a credential in it, an over-long SSE line
    followed by ``events``: documents of any shape the bridge analysis reads)."""
    deep = b"[" * depth + b"]" * (depth if depth < 10_000 else 0)
    chunk = b"".join(b"data: " + e.encode("utf-8", "surrogatepass") + b"\n\n" for e in events)
    chunk += b'data: {"choices":[{"index":0,"delta":{"content":"after"}}]}\n\n'
    return [
        ("ordinary", _request("hi"), _answer("hello"), JSON),
        ("deep request", deep, _answer("ok"), JSON),
        ("deep answer", _request("deep"),
         b'{"api_key": "' + canary.encode() + b'", "x": ' + deep + (b"}" if depth < 10_000 else b""), JSON),
        ("long line", _request("long"), b"data: " + long_value + b"\n\n" + chunk + b"data: [DONE]\n\n", SSE),
    ]


def har_entry(n: int, req: bytes, resp: bytes, ctype: str, b64: bool) -> dict[str, Any]:
    def body(data: bytes) -> dict[str, Any]:
        if b64:
            return {"text": base64.b64encode(data).decode(), "encoding": "base64"}
        return {"text": data.decode("utf-8", "surrogateescape")}

    return {"startedDateTime": _iso(1_767_225_600 + n), "time": 30,
            "request": {"method": "POST", "url": URL, "httpVersion": "HTTP/1.1",
                        "headers": [{"name": "content-type", "value": JSON}], "bodySize": len(req),
                        "postData": {"mimeType": JSON, **body(req)}},
            "response": {"status": 200, "httpVersion": "HTTP/1.1", "headers": [{"name": "content-type", "value": ctype}],
                         "content": {"mimeType": ctype, "size": len(resp), **body(resp)}},
            "timings": {"send": 1, "wait": 10, "receive": 19}}


def openai_flow(n: int, req: bytes, resp: bytes, ctype: str) -> Any:
    from mitmproxy import http
    from mitmproxy.test import tflow

    f = tflow.tflow(resp=True)
    f.id = str(uuid.uuid4())
    t = 1_767_225_600.0 + n
    f.request = http.Request.make("POST", URL, req, {"content-type": JSON})
    f.request.timestamp_start, f.request.timestamp_end = t, t + 0.001
    f.response = http.Response.make(200, resp, {"content-type": ctype})
    f.response.timestamp_start, f.response.timestamp_end = t + 0.01, t + 0.03
    return f


@hostile(4)
@given(depth=st.sampled_from([NESTING_LIMIT + 1, 5_000, 100_000, 200_000]),
       fmt=st.sampled_from(["har", "zhar", "flows"]), b64=st.booleans(), order=st.permutations(range(4)),
       events=st.lists(openai_docs(), max_size=3), via_flag=st.booleans())
def test_openai_import_hostile_exchanges(depth: int, fmt: str, b64: bool, order: list[int], events: list[str],
                                         via_flag: bool, scratch: Callable[[], Path]) -> None:
    tried("test_openai_import_hostile_exchanges")
    d = scratch()
    canary = f"{CANARY_PREFIX}{uuid.uuid4().hex[:16]}"
    long_value = b'{"choices":[{"index":0,"delta":{"content":"' + b"x" * LONG_LINE + b'"}}]}'
    batch = [exchanges(depth, canary, long_value, events)[i] for i in order]
    path = d / "in" / f"bridge.{fmt}"
    if fmt == "flows":
        write_flows(path, [openai_flow(n, req, resp, ct) for n, (_, req, resp, ct) in enumerate(batch)])
    else:
        data = har_document([har_entry(n, req, resp, ct, b64) for n, (_, req, resp, ct) in enumerate(batch)])
        path.write_bytes(zhar(data) if fmt == "zhar" else data)
    db = d / "run" / "bridge.duckdb"
    # the SSE limit lowered by the import's option, or by the variable every process reads
    limit = ("--sse-event-mb", SSE_LIMIT_MB) if via_flag else ()
    r = run_workbench("import", str(path), "--db", str(db), *limit,
                      env=env_without_proxy(None if via_flag else {"WORKBENCH_SSE_EVENT_MB": SSE_LIMIT_MB}))
    clean_exit(r, [path], f"workbench import ({fmt}, JSON nested {depth} deep)")  # (a)
    assert r.returncode == 0, r.stderr[-2000:]
    sessions = query(db, "SELECT session_id, started_at FROM sessions ORDER BY started_at")
    assert len(sessions) == 4, f"{len(sessions)} of 4 exchanges imported: {r.stdout}{r.stderr}"  # (b)
    by_what = {batch[i][0]: sid for i, (sid, _) in enumerate(sessions)}
    rows = {what: query(db, "SELECT kind, error, payload FROM frames WHERE session_id = ? ORDER BY seq", sid)
            for what, sid in by_what.items()}
    assert [k for k, e, _ in rows["ordinary"]] == ["openai.request", "openai.response"]
    assert all(e is None for _, e, _ in rows["ordinary"])
    deep_error = f"deeper than {NESTING_LIMIT}"
    assert rows["deep request"][0][0] == "openai.request" and deep_error in rows["deep request"][0][1]
    assert rows["deep answer"][1][0] == "openai.response" and deep_error in rows["deep answer"][1][1]
    assert b"[" * depth in rows["deep answer"][1][2] and b"api_key" in rows["deep answer"][1][2]  # its bytes, kept
    kinds_long = [k for k, _, _ in rows["long line"]]
    assert kinds_long[:2] == ["openai.request", "openai.event"], kinds_long
    assert kinds_long[2 + len(events):] == ["openai.delta.content", "openai.done"], kinds_long
    marker = rows["long line"][1]
    assert hashlib.sha256(long_value).hexdigest() in marker[1] and f"{len(long_value):,} bytes" in marker[1]
    assert json.loads(marker[2])["sse_over_limit"]["bytes"] == len(long_value)
    outputs = view_outputs(db, d / "run" / "out", max_sessions=4)
    ids = [str(sid) for sid, _ in sessions]
    for label, args in (("report", ("report", *ids, "-o", str(d / "run" / "out" / "report.html"))),
                        ("diff", ("diff", ids[0], ids[-1])), ("diff --json", ("diff", ids[1], ids[2], "--json"))):
        v = run_in_process(*args, "--db", str(db))
        clean_exit(v, [db], label)
        outputs[label] = v["out"] + v["err"]
    canary_nowhere(d / "run", canary, {**outputs, "import": r.stdout + r.stderr})  # (c)
