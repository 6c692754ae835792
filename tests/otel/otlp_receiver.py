"""A loopback OTLP/HTTP endpoint for tests: what the exporter sent, decoded with the OpenTelemetry
project's own protobuf classes (``opentelemetry-proto``), not ours."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass
class Received:
    spans: list[Any] = field(default_factory=list)        # opentelemetry.proto.trace.v1.Span
    scopes: list[Any] = field(default_factory=list)       # (scope, schema_url) per span
    headers: list[dict[str, str]] = field(default_factory=list)
    status: int = 200                                      # what to answer
    got: threading.Event = field(default_factory=threading.Event)

    def named(self, prefix: str) -> list[Any]:
        return [s for s in self.spans if s.name.startswith(prefix)]


def attrs(span_or_event: Any) -> dict[str, Any]:
    """An OTLP attribute list as a dict of Python values."""
    out: dict[str, Any] = {}
    for kv in span_or_event.attributes:
        v = kv.value
        which = v.WhichOneof("value")
        if which == "array_value":
            out[kv.key] = [getattr(x, x.WhichOneof("value")) for x in v.array_value.values]
        else:
            out[kv.key] = getattr(v, which) if which else None
    return out


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Received]]:
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            received.headers.append({k.lower(): v for k, v in self.headers.items()})
            if received.status == 200:
                req = ExportTraceServiceRequest.FromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            received.spans.append(span)
                            received.scopes.append((ss.scope, ss.schema_url))
                received.got.set()
            data = ExportTraceServiceResponse().SerializeToString() if received.status == 200 else b"refused"
            self.send_response(received.status)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()
