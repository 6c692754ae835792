"""``workbench.proxy.sse``, the writer both proxy endpoints answer through, on a real HTTP/1.1
server on loopback (``workbench.transport``), read with ``http.client``."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

from workbench.proxy.sse import SseStream, send_json
from workbench.transport import BackgroundServer, Exchange, HttpServer, Router, listen

pytestmark = pytest.mark.slow  # a real server on loopback

PREAMBLE = b"data: {\"role\":\"assistant\"}\n\n"


class Handlers:
    """Each records whether its stream had started before its first event (it must not have)."""

    def __init__(self) -> None:
        self.started_before_first: list[bool] = []

    async def events(self, ex: Exchange) -> None:
        await ex.read_body()
        sse = SseStream(ex, preamble=PREAMBLE)
        self.started_before_first.append(sse.started)
        await sse.send(b"data: 1\n\n")
        await sse.send(b"data: 2\n\n")
        await sse.send(b"data: [DONE]\n\n", last=True)

    async def only_last(self, ex: Exchange) -> None:
        await ex.read_body()
        await SseStream(ex).send(b"data: [DONE]\n\n", last=True)

    async def refused(self, ex: Exchange) -> None:
        await ex.read_body()
        sse = SseStream(ex, preamble=PREAMBLE)
        if not sse.started:  # an error before the first event is a plain HTTP error
            await send_json(ex, 404, {"error": {"message": "modèle inconnu"}})

    async def missing(self, ex: Exchange) -> None:
        await ex.respond(404, b"", "text/plain")

    def router(self) -> Router:
        r = Router(self.missing)
        r.route("/events", self.events)
        r.route("/only-last", self.only_last)
        r.route("/refused", self.refused)
        return r


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Handlers, HttpServer]]:
    handlers = Handlers()
    bg: BackgroundServer[HttpServer] = BackgroundServer(
        lambda: listen(handlers.router(), tls=False, http2=False), name="test-sse")
    server = bg.start()
    try:
        yield handlers, server
    finally:
        bg.stop()


def _post(server: HttpServer, path: str) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", path, body=b"{}")
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_events_follow_the_preamble_as_one_sse_body(served: tuple[Handlers, HttpServer]) -> None:
    handlers, server = served
    status, headers, body = _post(server, "/events")
    assert status == 200
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["cache-control"] == "no-cache"
    assert body == PREAMBLE + b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    assert handlers.started_before_first == [False]


def test_a_first_event_that_is_also_the_last_ends_the_body(served: tuple[Handlers, HttpServer]) -> None:
    _, server = served
    status, headers, body = _post(server, "/only-last")
    assert (status, headers["content-type"], body) == (200, "text/event-stream; charset=utf-8", b"data: [DONE]\n\n")


def test_before_the_first_event_the_answer_is_plain_json(served: tuple[Handlers, HttpServer]) -> None:
    _, server = served
    status, headers, body = _post(server, "/refused")
    assert (status, headers["content-type"]) == (404, "application/json")
    assert "modèle".encode() in body  # written as UTF-8, not \u-escaped
    assert json.loads(body) == {"error": {"message": "modèle inconnu"}}
