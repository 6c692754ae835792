"""The proxy's HTTP/1.1 with a plain client (``http.client``): chunked bodies, trailers, keep-alive.

Real processes (``workbench sim`` → ``workbench proxy``, the module's ``rig``).
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest
from conftest import Rig

pytestmark = pytest.mark.slow  # real processes: workbench sim and workbench proxy

CHAT = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hello"}]}).encode()


def _connection(rig: Rig) -> http.client.HTTPConnection:
    u = urlsplit(rig.proxy.url)
    return http.client.HTTPConnection(u.hostname or "", u.port, timeout=60)


@pytest.mark.slow
def test_chunked_chat_with_trailers_then_more_requests_on_one_connection(rig: Rig) -> None:
    conn = _connection(rig)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("content-type", "application/json")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        half = len(CHAT) // 2
        for part in (CHAT[:half], CHAT[half:]):
            conn.send(b"%x\r\n%s\r\n" % (len(part), part))
        conn.send(b"0\r\nX-Client-Trailer: yes\r\n\r\n")
        resp = conn.getresponse()
        doc = json.loads(resp.read())
        assert resp.status == 200, doc
        assert doc["choices"][0]["message"]["content"]
        sock = conn.sock
        # The trailer was consumed with the body: the next requests reuse the connection.
        conn.request("GET", "/v1/models")
        models = conn.getresponse()
        assert models.status == 200
        assert "default" in [m["id"] for m in json.loads(models.read())["data"]]
        conn.request("GET", "/health/")
        health = conn.getresponse()
        assert json.loads(health.read())["status"] == "ok"
        assert conn.sock is sock
    finally:
        conn.close()


def test_unparseable_requests_get_openai_style_400s(rig: Rig) -> None:
    conn = _connection(rig)
    try:
        conn.putrequest("POST", "/v1/chat/completions")
        conn.putheader("Content-Length", "12x")
        conn.endheaders()
        resp = conn.getresponse()
        err = json.loads(resp.read())["error"]
        assert resp.status == 400
        assert "Content-Length" in err["message"]
        assert resp.getheader("connection") == "close"
    finally:
        conn.close()
    conn = _connection(rig)
    try:
        conn.request("PUT", "/v1/chat/completions", body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 405
        assert json.loads(resp.read())["error"]["message"] == "use POST"
        conn.request("POST", "/v1/nothing", body=b"{}")
        resp = conn.getresponse()
        assert resp.status == 404
        assert "POST /v1/nothing is not an endpoint" in json.loads(resp.read())["error"]["message"]
    finally:
        conn.close()
