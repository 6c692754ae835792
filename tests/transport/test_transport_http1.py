"""The HTTP/1.1 side of ``workbench.transport`` (h11) with plain HTTP handlers on the router.

A real server on loopback (on a background thread, ``BackgroundServer``), talked to with Python's
``http.client`` and with raw sockets for what a well-behaved client would never send.
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Iterator

import pytest

from workbench.transport import BackgroundServer, Exchange, HttpServer, Router, listen

pytestmark = pytest.mark.slow  # every test talks to a real server on loopback


def _json_error(status: int, message: str) -> tuple[str, bytes]:
    return "application/json", json.dumps({"error": message, "status": status}).encode()


class App:
    """Echo handlers; ``seen`` records (method, path, body) of every request a handler read."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    async def admit(self, ex: Exchange) -> bool:
        if ex.headers.get("x-refuse"):
            await ex.goaway()
            await ex.respond(403, b"refused", "text/plain")
            return False
        return True

    async def echo(self, ex: Exchange) -> None:
        body = await ex.read_body()
        self.seen.append((ex.method, ex.path, body))
        await ex.respond(200, body, "application/octet-stream", {"x-length": str(len(body))})

    async def small(self, ex: Exchange) -> None:
        body = await ex.read_body(limit=8)
        await ex.respond(200, body, "text/plain")

    async def stream(self, ex: Exchange) -> None:
        await ex.read_body()
        await ex.start(200, [("content-type", "text/event-stream")], b"data: 1\n\n")
        await ex.write(b"data: 2\n\n")
        await ex.finish(b"data: 3\n\n")

    async def silent(self, ex: Exchange) -> None:
        await ex.read_body()

    async def under(self, ex: Exchange) -> None:
        await ex.respond(200, ex.path.encode(), "text/plain")

    async def missing(self, ex: Exchange) -> None:
        await ex.respond(404, b"no such path", "text/plain")

    def router(self) -> Router:
        r = Router(self.missing, guard=self.admit, normalize=lambda p: p.rstrip("/") or "/", error_body=_json_error)
        r.route("/echo", self.echo)
        r.route("/small", self.small)
        r.route("/stream", self.stream)
        r.route("/silent", self.silent)
        r.route_prefix("/under/", self.under)
        return r


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[App, HttpServer]]:
    app = App()
    bg: BackgroundServer[HttpServer] = BackgroundServer(
        lambda: listen(app.router(), tls=False, http2=False), name="test-h1")
    server = bg.start()
    try:
        yield app, server
    finally:
        bg.stop()


def _raw(server: HttpServer, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection, half-close, read everything the server answers."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_keep_alive_across_chunked_body_with_trailers(served: tuple[App, HttpServer]) -> None:
    app, server = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.putrequest("POST", "/echo")
        conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders()
        conn.send(b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-Checksum: abc\r\nX-Other: 1\r\n\r\n")
        first = conn.getresponse()
        assert first.status == 200
        assert first.read() == b"hello world"
        sock = conn.sock
        # The trailer fields were consumed: the next request on the same socket is parsed cleanly.
        conn.request("POST", "/echo", body=b"second")
        second = conn.getresponse()
        assert second.read() == b"second"
        assert conn.sock is sock
    finally:
        conn.close()
    assert app.seen[-2:] == [("POST", "/echo", b"hello world"), ("POST", "/echo", b"second")]


def test_get_without_body_keeps_the_connection(served: tuple[App, HttpServer]) -> None:
    _, server = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        for path in ("/under/a", "/under/b/", "/nowhere"):
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
            assert resp.getheader("connection") is None, path
            if path == "/nowhere":
                assert (resp.status, body) == (404, b"no such path")
            else:
                assert (resp.status, body) == (200, path.encode())
            assert resp.reason == ("OK" if resp.status == 200 else "Not Found")
    finally:
        conn.close()


def test_streamed_response_is_chunked(served: tuple[App, HttpServer]) -> None:
    _, server = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/stream", body=b"{}")
        resp = conn.getresponse()
        assert resp.getheader("transfer-encoding") == "chunked"
        assert resp.read() == b"data: 1\n\ndata: 2\n\ndata: 3\n\n"
    finally:
        conn.close()


def test_bad_chunk_size_is_a_400_naming_it(served: tuple[App, HttpServer]) -> None:
    _, server = served
    out = _raw(server, b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"zz\r\nabc\r\n0\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in head.lower()
    doc = json.loads(body.split(b"\r\n")[1] if b"chunked" in head.lower() else body)
    assert doc["status"] == 400
    assert "chunk size" in doc["error"]


def test_unparseable_request_gets_the_apps_400(served: tuple[App, HttpServer]) -> None:
    _, server = served
    out = _raw(server, b"NONSENSE\r\n\r\n")
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ")
    assert "malformed HTTP request" in json.loads(body)["error"]


def test_body_over_the_limit_is_413(served: tuple[App, HttpServer]) -> None:
    _, server = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/small", body=b"x" * 100)
        resp = conn.getresponse()
        assert resp.status == 413
        assert "larger than 8 bytes" in json.loads(resp.read())["error"]
        # The body had arrived whole (and was drained), so the connection stays usable.
        conn.request("POST", "/small", body=b"ok")
        assert conn.getresponse().read() == b"ok"
    finally:
        conn.close()


def test_refused_before_the_body_closes_the_connection(served: tuple[App, HttpServer]) -> None:
    app, server = served
    before = len(app.seen)
    # The refused request's body looks like a second request: it must not be served as one.
    smuggled = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n"
    out = _raw(server, b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Refuse: 1\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(smuggled), smuggled))
    assert out.startswith(b"HTTP/1.1 403 ")
    assert out.count(b"HTTP/1.1 ") == 1
    assert b"connection: close" in out.lower()
    assert len(app.seen) == before


def test_expect_100_continue(served: tuple[App, HttpServer]) -> None:
    _, server = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n")
        interim = s.recv(65536)
        assert interim.startswith(b"HTTP/1.1 100 ")
        s.sendall(b"ping")
        final = b""
        while b"ping" not in final:
            chunk = s.recv(65536)
            assert chunk
            final += chunk
        assert final.startswith(b"HTTP/1.1 200 ")


def test_handler_that_answers_nothing_gets_500(served: tuple[App, HttpServer]) -> None:
    _, server = served
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/silent", body=b"")
        assert conn.getresponse().status == 500
    finally:
        conn.close()


def test_background_server_reraises_a_failed_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        bg: BackgroundServer[HttpServer] = BackgroundServer(
            lambda: listen(App().router(), port=port, tls=False), name="test-taken")
        with pytest.raises(OSError):
            bg.start()
        assert bg.server is None
        assert not bg.loop.is_running()
        bg.stop()  # nothing to stop: no error either
