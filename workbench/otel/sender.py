"""Sending sessions' spans to an OTLP/HTTP endpoint with the OpenTelemetry SDK's own exporter.

``SpanSpec`` (``workbench.otel.spans``) becomes the SDK's ``ReadableSpan`` with the ids and times
it carries; ``OTLPSpanExporter`` encodes and sends them (its own retries and backoff on 429/5xx
within ``timeout``). No protocol code of ours. The endpoint and headers come from the command line
or, when it names none, from the standard ``OTEL_EXPORTER_OTLP_TRACES_*`` / ``OTEL_EXPORTER_OTLP_*``
variables, which the exporter reads itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from workbench.errors import WorkbenchError
from workbench.otel.spans import SCHEMA_URL, SpanSpec

_KINDS = {"client": "CLIENT", "internal": "INTERNAL", "server": "SERVER"}


class OtlpError(WorkbenchError):
    """The backend refused the spans or could not be reached; the message says which and why."""


class _Said(logging.Handler):
    """The exporter says why an export failed only in its log: keep what it said."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.last.append(record.getMessage())


def traces_endpoint(url: str) -> str:
    """The traces endpoint of an OTLP/HTTP base URL (``http://host:4318`` → ``…/v1/traces``); a URL
    that already names a path is used as it is."""
    from urllib.parse import urlsplit  # only when a URL is given

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OtlpError(f"--otlp {url!r}: not an http:// or https:// URL")
    return url if parts.path not in ("", "/") else url.rstrip("/") + "/v1/traces"


class Sender:
    """One exporter for a run of the command (or a capture's whole life)."""

    def __init__(self, url: str | None, headers: Mapping[str, str] | None = None, timeout_s: float = 10.0) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # only to export
        from opentelemetry.sdk.resources import Resource

        import workbench

        self.endpoint = traces_endpoint(url) if url else None
        self._exporter = OTLPSpanExporter(endpoint=self.endpoint, headers=dict(headers) if headers else None,
                                          timeout=timeout_s)
        self._resource = Resource.create({"service.name": "workbench",
                                          "service.version": getattr(workbench, "__version__", "0")})

    def send(self, spans: Iterable[SpanSpec]) -> int:
        """Send ``spans``; how many went. ``OtlpError`` saying why when the backend refused them or
        could not be reached (after the exporter's own retries)."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        batch = [self._readable(s) for s in spans]
        if not batch:
            return 0
        said = _Said()
        logger = logging.getLogger("opentelemetry.exporter.otlp.proto.http")
        logger.addHandler(said)
        propagate, logger.propagate = logger.propagate, False  # its words go into our message, not stderr twice
        try:
            result = self._exporter.export(batch)
        finally:
            logger.removeHandler(said)
            logger.propagate = propagate
        if result is not SpanExportResult.SUCCESS:
            where = self.endpoint or "the endpoint of OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT"
            why = said.last[-1] if said.last else "no reason given"
            cause = said.last[0].split(" encountered while")[0] if len(said.last) > 1 else ""
            if cause and cause != why:
                why = f"{why} ({cause[:400]})"
            raise OtlpError(f"OTLP export to {where} failed: {why}")
        return len(batch)

    def close(self) -> None:
        self._exporter.shutdown()

    def _readable(self, s: SpanSpec):  # type: ignore[no-untyped-def]  # the SDK's ReadableSpan
        from opentelemetry import trace
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        import workbench

        flags = trace.TraceFlags(trace.TraceFlags.SAMPLED)

        def ctx(trace_id: int, span_id: int) -> trace.SpanContext:
            return trace.SpanContext(trace_id, span_id, is_remote=False, trace_flags=flags)

        status = trace.Status(trace.StatusCode.ERROR, s.error) if s.error else trace.Status(trace.StatusCode.UNSET)
        return ReadableSpan(
            name=s.name, context=ctx(s.trace_id, s.span_id),
            parent=ctx(s.trace_id, s.parent_id) if s.parent_id is not None else None,
            resource=self._resource, attributes=s.attributes,
            events=[Event(e.name, e.attributes, e.time_us * 1000) for e in s.events],
            links=[trace.Link(ctx(t, sp), attrs) for t, sp, attrs in s.links],
            kind=getattr(trace.SpanKind, _KINDS[s.kind]), status=status,
            start_time=s.start_us * 1000, end_time=s.end_us * 1000,
            instrumentation_scope=InstrumentationScope("workbench", getattr(workbench, "__version__", None),
                                                       SCHEMA_URL))
