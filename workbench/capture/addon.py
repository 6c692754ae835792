"""The mitmproxy addon: stream agent flows through unchanged and hand a copy to the writer.

Everything here runs on mitmproxy's event loop, so the hooks only decide whether a flow is ours,
turn on streaming (request side in ``requestheaders`` so a bidi ``Run`` does not deadlock, response
side in ``responseheaders``), stamp each chunk with the time it passed and put it on the writer's
queue. The chunk is returned as it came: the wire is never modified. Reassembly, decoding,
redaction and the database live in the writer (``writer.py``), which runs in a child process of
its own (``process.py``) so that it never competes with the event loop for the GIL.

Agent flows whose request body streams get a transparent end of stream (``stream_end.py``): the
response's END_STREAM reaches the client the moment the server sends it, client frames keep being
forwarded and recorded until the client ends or resets, and resets are forwarded with their own
code and recorded with the side that reset.

Options (``--set name=value``): ``cursor_db``, ``cursor_hosts``, ``cursor_paths``,
``cursor_redact`` (``secrets`` | ``content``), ``cursor_flush_ms``, ``cursor_live``,
``cursor_stats_file``, ``cursor_schema`` (empty: the active schema, see ``workbench schema use``;
``builtin``; or schema paths joined by the path separator, as ``--proto`` gives them),
``cursor_hold_frames``, ``cursor_view_bytes`` (the copy of each streamed body kept for the "Cursor
agent" contentview, which the addon registers: ``contentview.py``), ``cursor_writer`` (``process``:
the recording runs in a child process, ``process.py``; ``thread``: in a thread of mitmdump's own
process, as it did before). Values are checked here,
whichever way they were given (mitmproxy itself
does not enforce ``choices``): a bad one is an ``OptionsError`` naming it, logged as an error so
mitmdump stops at start-up.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from mitmproxy import ctx, exceptions, http

from workbench.capture import contentview, stream_end
from workbench.capture.backlog import BACKLOG_MB
from workbench.capture.process import RESTARTS, WriterProcess, WriterProcessError
from workbench.capture.sink import HOLD_FRAMES
from workbench.capture.writer import (
    Body,
    CaptureWriter,
    Chunk,
    Done,
    Eof,
    Event,
    FlowOpen,
    Late,
    Open,
    Response,
    WriterConfig,
)
from workbench.decode.classify import Decoder
from workbench.protocol.routes import DEFAULT_HOSTS, DEFAULT_PATHS, Matcher, Route, is_openai_transport
from workbench.protocol.status import describe_reset
from workbench.redact import LEVELS, bearer_hash, redact_headers
from workbench.schema.active import schema_for_option
from workbench.schema.loader import Schema, SchemaError
from workbench.store.paths import default_db
from workbench.wire.inflate import codings_of

log = logging.getLogger("workbench.capture")

WRITERS = ("process", "thread")  # the cursor_writer choices

EXIT_FRAMES_LOST = 3  # the process exit status when frames were lost (see ``done``)


def _alpn(conn: Any) -> str | None:
    value = getattr(conn, "alpn", None)
    if not value:
        return None
    return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)


def _stream_callable(put: Callable[[Event], None], key: str, direction: str) -> Callable[[bytes], bytes]:
    now = time.time_ns

    def stream(chunk: bytes) -> bytes:
        if chunk:
            put(Chunk(key, direction, now() // 1000, chunk))
        else:
            put(Eof(key, direction, now() // 1000))
        return chunk

    return stream


class CursorCapture:
    """Records Cursor agent traffic into a workbench DuckDB database."""

    def __init__(self) -> None:
        self.writer: CaptureWriter | WriterProcess | None = None
        self.matcher = Matcher()
        self._routes: dict[str, Route] = {}
        self._answered: set[str] = set()
        self._db: str | None = None
        self._schema: Schema | None = None
        self._option_schema: Schema | None = None  # the schema ``cursor_schema`` named (a child rebuilds it)
        self._view_dec: Decoder | None = None

    # options -----------------------------------------------------------------------------------

    def load(self, loader: Any) -> None:
        loader.add_option("cursor_db", str, default_db(),
                          "workbench capture database (DuckDB file; default: $WORKBENCH_DB, else "
                          "captures/workbench.duckdb in the nearest captures/ folder up from here)")
        loader.add_option("cursor_hosts", str, ",".join(DEFAULT_HOSTS),
                          "comma-separated host globs on which every Connect/gRPC RPC path is recorded")
        loader.add_option("cursor_paths", str, ",".join(DEFAULT_PATHS),
                          "comma-separated path globs recorded on any host (the agent RPCs)")
        loader.add_option("cursor_redact", str, "secrets",
                          "what to hide in stored payloads: secrets (always) or content "
                          "(also prompts, files, commands, output)", choices=list(LEVELS))
        loader.add_option("cursor_flush_ms", int, 250, "commit recorded frames at most this often (ms)")
        loader.add_option("cursor_live", bool, True,
                          "serve live readers (workbench frames --follow, the TUI) while capturing")
        loader.add_option("cursor_stats_file", str, "",
                          "write capture counters (JSON) to this file after every flush")
        loader.add_option("cursor_schema", str, "",
                          "decode with this schema: empty = the active one ('workbench schema use'), 'builtin', "
                          "or .proto files/folders/descriptor sets joined by the path separator")
        loader.add_option("cursor_hold_frames", int, HOLD_FRAMES,
                          "frames held in memory when neither the database nor any spool location "
                          "takes writes; beyond this they are counted as lost")
        loader.add_option("cursor_writer", str, "process",
                          "where the recording runs: process (a child process, off mitmproxy's GIL) or "
                          "thread (a thread of this process)", choices=list(WRITERS))
        loader.add_option("cursor_backlog_mb", int, BACKLOG_MB,
                          "MiB of batches handed to the writer process and not yet confirmed kept in memory; "
                          "beyond this they go to a scratch file on disk")
        loader.add_option("cursor_writer_restarts", int, RESTARTS,
                          "times a writer process that died is restarted (its unconfirmed batches replayed); "
                          "0: never")
        loader.add_option("cursor_view_bytes", int, contentview.VIEW_BYTES,
                          "bytes of each streamed agent body kept for mitmproxy's views (the Cursor agent "
                          "contentview, -w flow files); 0 keeps none")
        # mitmproxy's console, mitmweb and mitmdump show agent bodies decoded (contentview.py)
        contentview.register(self._view_decoder, lambda: self.matcher)
        try:
            stream_end.install(self._late_failure)
        except stream_end.InternalsChanged as exc:
            log.warning("cursor capture: %s; agent flows whose server ends first will be held open "
                        "by mitmproxy until the client ends its request", exc)

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        try:
            self._check_options(opts, updated)
        except exceptions.OptionsError as exc:
            # mitmproxy does not enforce ``choices``, and an OptionsError raised while a script
            # loads is easily lost: log it too, so mitmdump stops at start-up with the message.
            log.error("cursor capture: %s", exc)
            raise
        if "cursor_schema" in updated and self.writer is None:
            try:
                self._schema = self._option_schema = schema_for_option(opts.cursor_schema)
            except SchemaError as exc:
                log.error("cursor capture: cursor_schema: %s", exc)
                raise exceptions.OptionsError(f"cursor_schema: {exc}") from exc
        if "cursor_hosts" in updated or "cursor_paths" in updated:
            self.matcher = Matcher(opts.cursor_hosts, opts.cursor_paths)
        if self.writer is not None and "cursor_db" in updated and opts.cursor_db != self._db:
            log.warning("cursor_db cannot change while capturing; still writing %s", self._db)

    @staticmethod
    def _check_options(opts: Any, updated: set[str]) -> None:
        if "cursor_redact" in updated and opts.cursor_redact not in LEVELS:
            raise exceptions.OptionsError(
                f"cursor_redact={opts.cursor_redact!r} is not a redaction level; use one of: {', '.join(LEVELS)}")
        if "cursor_flush_ms" in updated and opts.cursor_flush_ms <= 0:
            raise exceptions.OptionsError(
                f"cursor_flush_ms={opts.cursor_flush_ms}: must be a positive number of milliseconds")
        if "cursor_hold_frames" in updated and opts.cursor_hold_frames < 0:
            raise exceptions.OptionsError(f"cursor_hold_frames={opts.cursor_hold_frames}: must be 0 or more")
        if "cursor_backlog_mb" in updated and opts.cursor_backlog_mb <= 0:
            raise exceptions.OptionsError(f"cursor_backlog_mb={opts.cursor_backlog_mb}: must be 1 or more")
        if "cursor_writer_restarts" in updated and opts.cursor_writer_restarts < 0:
            raise exceptions.OptionsError(
                f"cursor_writer_restarts={opts.cursor_writer_restarts}: must be 0 or more")
        if "cursor_view_bytes" in updated and opts.cursor_view_bytes < 0:
            raise exceptions.OptionsError(f"cursor_view_bytes={opts.cursor_view_bytes}: must be 0 or more")
        if "cursor_writer" in updated and opts.cursor_writer not in WRITERS:
            raise exceptions.OptionsError(
                f"cursor_writer={opts.cursor_writer!r} is not a writer; use one of: {', '.join(WRITERS)}")
        if "cursor_db" in updated and not opts.cursor_db.strip():
            raise exceptions.OptionsError("cursor_db is empty: give the capture database's path")

    def running(self) -> None:
        if self.writer is not None:
            return
        opts = ctx.options
        self._db = opts.cursor_db
        cfg = WriterConfig(db_path=opts.cursor_db, flush_interval=opts.cursor_flush_ms / 1000.0,
                           content=opts.cursor_redact == "content", live=opts.cursor_live,
                           stats_path=opts.cursor_stats_file or None, hold_frames=opts.cursor_hold_frames)
        if self._schema is None:
            self._schema = self._option_schema = schema_for_option(opts.cursor_schema)
        self.writer = self._start_writer(cfg, Decoder(self._schema), opts.cursor_writer == "process")
        ident = self.writer.decoder.schema.identity
        log.info("cursor capture: recording agent traffic into %s (redaction: %s), decoding with %s (hash %s)",
                 os.path.abspath(os.path.expanduser(opts.cursor_db)), opts.cursor_redact, ident.source, ident.hash)

    def _start_writer(self, cfg: WriterConfig, decoder: Decoder, process: bool) -> CaptureWriter | WriterProcess:
        if process and self._schema is not self._option_schema:
            # A Schema object handed in by code cannot cross the process boundary (the child
            # rebuilds its schema from the option): record in this process then.
            log.info("cursor capture: a schema set by code: recording in a thread of this process")
            process = False
        if process:
            writer = WriterProcess(cfg, ctx.options.cursor_schema, decoder,
                                   backlog_bytes=ctx.options.cursor_backlog_mb * 2**20,
                                   restarts=ctx.options.cursor_writer_restarts)
            try:
                writer.start()
                return writer
            except WriterProcessError as exc:
                log.warning("cursor capture: %s; recording in a thread of this process instead", exc)
        thread = CaptureWriter(cfg, decoder)
        thread.start()
        return thread

    def _view_decoder(self) -> Decoder:
        """The contentview's decoder: its own (the writer's runs on another thread or process), with the
        schema the writer decodes with."""
        if self.writer is not None:
            schema = self.writer.decoder.schema
        else:  # not capturing yet (or any more): the schema cursor_schema names
            if self._schema is None:
                self._schema = self._option_schema = schema_for_option(ctx.options.cursor_schema)
            schema = self._schema
        if self._view_dec is None or self._view_dec.schema is not schema:
            self._view_dec = Decoder(schema)
        return self._view_dec

    def done(self) -> None:
        contentview.unregister()
        if self.writer is None:
            return
        writer, self.writer = self.writer, None
        writer.stop()
        stream_end.remove_listener(self._late_failure)
        failed = getattr(writer, "failed", None)
        if writer.lost or failed:
            msg = (failed or f"{writer.lost:,} frames LOST: neither the database {self._db} nor any spool "
                   "location took them (see the errors above)")
            log.error("cursor capture: %s", msg)
            print(f"workbench capture: ERROR: {msg}", file=sys.stderr, flush=True)
            # mitmdump exits 0 whatever an addon's ``done`` does, and raising here would skip the
            # other addons' ``done``: change the exit status once everything else has finished.
            atexit.register(_exit_with, EXIT_FRAMES_LOST)

    # hooks -------------------------------------------------------------------------------------

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        writer = self.writer
        if writer is None:
            return
        req = flow.request
        headers = req.headers
        route = self.matcher.route(req.pretty_host, req.path, headers.get("content-type", ""))
        if route is None:
            return
        key = flow.id
        self._routes[key] = route
        meta: dict[str, Any] = {
            "method": req.method,
            "request_headers": redact_headers(headers.items(multi=True)),
            "http_version": req.http_version,
        }
        alpn = _alpn(flow.client_conn)
        if alpn:
            meta["client_alpn"] = alpn
        if flow.client_conn.proxy_mode is not None:
            meta["proxy_mode"] = str(flow.client_conn.proxy_mode.type_name)
        fo = FlowOpen(
            key=key, transport=route.transport, streaming=route.streaming, host=req.pretty_host,
            path=req.path.split("?", 1)[0], ts_us=time.time_ns() // 1000,
            request_id=headers.get("x-request-id"), client_version=headers.get("x-cursor-client-version"),
            auth_hash=bearer_hash(headers.get("authorization")), request_type=route.request_type,
            response_type=route.response_type, meta=meta, content_type=headers.get("content-type"),
        )
        put = writer.queue.put
        put(Open(fo))
        if route.streaming:
            req.stream = contentview.keep_for_view(flow, "client", _stream_callable(put, key, "client"),
                                                   ctx.options.cursor_view_bytes)
            # The response's end goes to the client at once, resets are forwarded and noted (agent
            # streams; an OpenAI request is a whole HTTP/1.1 or h2 body that mitmproxy ends itself).
            if not is_openai_transport(route.transport):
                flow.metadata[stream_end.MARK] = True

    def request(self, flow: http.HTTPFlow) -> None:
        route = self._routes.get(flow.id)
        if route is None or self.writer is None:
            return
        if route.streaming:
            if flow.id in self._answered:
                # A bidi Run whose response finished first: its request side is done now too.
                self._answered.discard(flow.id)
                self._routes.pop(flow.id, None)
                self.writer.queue.put(Done(flow.id, time.time_ns() // 1000, None, {}))
            return
        self.writer.queue.put(_body(flow.request, flow.id, "client"))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        route = self._routes.get(flow.id)
        if route is None or self.writer is None or flow.response is None:
            return
        resp = flow.response
        put = self.writer.queue.put
        put(Response(flow.id, time.time_ns() // 1000, resp.status_code,
             redact_headers(resp.headers.items(multi=True)), resp.http_version, _alpn(flow.server_conn)))
        if route.streaming:
            resp.stream = contentview.keep_for_view(flow, "server", _stream_callable(put, flow.id, "server"),
                                                    ctx.options.cursor_view_bytes)

    def response(self, flow: http.HTTPFlow) -> None:
        route = self._routes.get(flow.id)
        if route is None or self.writer is None or flow.response is None:
            return
        now = time.time_ns() // 1000
        put = self.writer.queue.put
        if not route.streaming:
            put(_body(flow.response, flow.id, "server", now))
        if route.streaming and flow.request.timestamp_end is None:
            self._answered.add(flow.id)  # the client may still be writing (bidi Run)
        else:
            self._routes.pop(flow.id, None)
            if route.streaming:  # idempotent; covers a request that ended with its headers
                put(Eof(flow.id, "client", now))
        trailers = dict(flow.response.trailers.items()) if flow.response.trailers else {}
        put(Done(flow.id, now, None, trailers))

    def error(self, flow: http.HTTPFlow) -> None:
        contentview.publish_kept(flow)
        route = self._routes.pop(flow.id, None)
        self._answered.discard(flow.id)
        if route is None or self.writer is None:
            return
        reset = flow.metadata.get(stream_end.RESET)
        if reset is not None:
            msg = describe_reset(reset)
        else:
            msg = flow.error.msg if flow.error else "flow failed"
        self.writer.queue.put(Done(flow.id, time.time_ns() // 1000, msg, {}, reset))

    def _late_failure(self, flow: http.HTTPFlow, reset: dict[str, Any]) -> None:
        """A side failed after the response ended (mitmproxy calls no hook for that)."""
        contentview.publish_kept(flow)
        route = self._routes.pop(flow.id, None)
        self._answered.discard(flow.id)
        if route is None or self.writer is None:
            return
        self.writer.queue.put(Late(flow.id, time.time_ns() // 1000, reset))


def _exit_with(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _body(message: http.Message, key: str, direction: str, ts_us: int | None = None) -> Body:
    """The whole body as it crossed the wire, with its content-coding: mitmproxy's ``get_content``
    would inflate it here, on the proxy's event loop and without a limit (a few KB of gzip can
    inflate to gigabytes); the writer thread undoes it within the inflate budgets instead."""
    return Body(key, direction, time.time_ns() // 1000 if ts_us is None else ts_us, message.raw_content or b"",
                tuple(codings_of(message.headers.get("content-encoding"))))
