"""mitmproxy addon (test data): save streamed agent flows *with* their whole bodies.

A live ``mitmdump -w`` cannot keep the bodies of an agent stream: a bidi ``Run`` or a ``RunSSE``
that waits for the client's answers must be streamed, and mitmproxy keeps no body for a streamed
message. This addon taps the stream of every flow (wrapping whatever ``stream`` callable an
earlier addon such as the capture addon set, so both see the same bytes), and when a flow has
finished both ways it writes a copy with the collected request and response bodies through
mitmproxy's own ``io.FlowWriter``. The file is what mitmproxy would have saved had it buffered
the exchange: whole bodies and the four timestamps, nothing per frame.

``whole_body_har=OUT.har`` also exports the same copies at shutdown through mitmproxy's own HAR
exporter (its ``save.har`` command), as ``mitmdump -nr OUT.flows --set hardump=OUT.har`` would.

    mitmdump -s addons/cursor_capture.py -s whole_body_flows.py --set whole_body_flows=OUT.flows \
        [--set whole_body_har=OUT.har]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, BinaryIO

from mitmproxy import ctx, http, io

Stream = Callable[[bytes], bytes | Iterable[bytes]]


def _tap(inner: Any, sink: bytearray) -> Stream:
    def stream(chunk: bytes) -> bytes | Iterable[bytes]:
        sink.extend(chunk)
        if callable(inner):
            return inner(chunk)
        return chunk

    return stream


class WholeBodyFlows:
    def __init__(self) -> None:
        self._fh: BinaryIO | None = None
        self._writer: io.FlowWriter | None = None
        self._bodies: dict[str, tuple[bytearray, bytearray]] = {}
        self._done: dict[str, set[str]] = {}
        self._saved: list[http.HTTPFlow] = []  # the copies written, for the HAR export
        self._open: dict[str, tuple[http.HTTPFlow, str]] = {}  # flows not yet written, their client

    def load(self, loader: Any) -> None:
        loader.add_option("whole_body_flows", str, "", "write finished flows with whole bodies to this file")
        loader.add_option("whole_body_har", str, "", "at shutdown, export the same flows as HAR to this file")

    def running(self) -> None:
        path = ctx.options.whole_body_flows
        if path and self._fh is None:
            self._fh = open(path, "wb")  # noqa: SIM115 - kept open for the life of the proxy
            self._writer = io.FlowWriter(self._fh)

    def done(self) -> None:
        if ctx.options.whole_body_har:
            ctx.master.commands.call("save.har", self._saved, ctx.options.whole_body_har)
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    # Only messages an earlier addon chose to stream are tapped; mitmproxy keeps the others whole.
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        bodies = self._bodies.setdefault(flow.id, (bytearray(), bytearray()))
        self._open[flow.id] = (flow, flow.client_conn.id)
        if flow.request.stream:
            flow.request.stream = _tap(flow.request.stream, bodies[0])

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None and flow.response.stream and flow.id in self._bodies:
            flow.response.stream = _tap(flow.response.stream, self._bodies[flow.id][1])

    def request(self, flow: http.HTTPFlow) -> None:
        self._finished(flow, "request")

    def response(self, flow: http.HTTPFlow) -> None:
        self._finished(flow, "response")

    def error(self, flow: http.HTTPFlow) -> None:
        self._finished(flow, "request")
        self._finished(flow, "response")

    def client_disconnected(self, client: Any) -> None:
        # A client may leave once it has the whole answer without ever ending its request (Node's
        # http2 client does, when the server's GOAWAY closes the session after the turn): no
        # request-end or error hook follows, so the request side ends here, as the file of a
        # buffered exchange would show it.
        for flow_id, (flow, client_id) in list(self._open.items()):
            if client_id == client.id and "response" in self._done.get(flow_id, set()):
                self._finished(flow, "request")

    def _finished(self, flow: http.HTTPFlow, side: str) -> None:
        done = self._done.setdefault(flow.id, set())
        done.add(side)
        if len(done) < 2 or flow.id not in self._bodies or self._writer is None:
            return
        req_body, resp_body = self._bodies.pop(flow.id)
        self._done.pop(flow.id, None)
        self._open.pop(flow.id, None)
        saved = flow.copy()
        saved.id = flow.id
        if flow.request.stream:
            saved.request.stream = False
            saved.request.raw_content = bytes(req_body)
        if saved.response is not None and flow.response is not None and flow.response.stream:
            saved.response.stream = False
            saved.response.raw_content = bytes(resp_body)
        self._writer.add(saved)
        if ctx.options.whole_body_har:
            self._saved.append(saved)
        assert self._fh is not None
        self._fh.flush()


addons = [WholeBodyFlows()]
