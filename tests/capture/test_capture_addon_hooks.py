"""The capture addon's hooks, driven by mitmproxy's own test helpers (``taddons.context`` runs the
addon as mitmdump would, ``tflow`` builds the flows, ``cycle`` sends a flow through the hooks in
mitmproxy's event order), without a proxy process.

The addon hands everything to its writer's queue; a real ``CaptureWriter`` that is not started
keeps those events for the test to read. ``running``/``done`` start and stop a real one.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mitmproxy import exceptions, http
from mitmproxy.test import taddons, tflow

from workbench.capture import stream_end
from workbench.capture.addon import CursorCapture
from workbench.capture.writer import (
    Body,
    CaptureWriter,
    Chunk,
    Done,
    Eof,
    FlowOpen,
    Open,
    Response,
    WriterConfig,
)
from workbench.protocol.routes import DEFAULT_HOSTS, DEFAULT_PATHS
from workbench.protocol.status import describe_reset
from workbench.redact import bearer_hash
from workbench.store.db import DEFAULT_DB

HOST = "https://api2.cursor.sh"
RUN = f"{HOST}/agent.v1.AgentService/Run"
RUNSSE = f"{HOST}/agent.v1.AgentService/RunSSE"
APPEND = f"{HOST}/aiserver.v1.BidiService/BidiAppend"
MODELS = f"{HOST}/agent.v1.AgentService/GetUsableModels"
TOKEN = "eyJ-a-session-token-that-must-not-be-stored"


@pytest.fixture
def hooked(tmp_path: Path) -> Iterator[tuple[CursorCapture, CaptureWriter, taddons.context]]:
    """The addon under ``taddons`` with a writer that collects events instead of writing them."""
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        addon.writer = CaptureWriter(WriterConfig(db_path=str(tmp_path / "unused.duckdb"), live=False))
        yield addon, addon.writer, tctx


def events(writer: CaptureWriter) -> list[tuple[Any, ...]]:
    """The events the addon queued, each as (its type, *its fields)."""
    out = []
    while True:
        try:
            ev = writer.queue.get_nowait()
            out.append((type(ev), *ev))
        except queue.Empty:
            return out


def flow(url: str, ctype: str = "application/connect+proto", body: bytes = b"",
         response: http.Response | None = None) -> http.HTTPFlow:
    f = tflow.tflow()
    f.request = http.Request.make("POST", url, body, {
        "content-type": ctype, "x-request-id": "rid-1", "x-cursor-client-version": "cli-2026.01.01-abc1234",
        "authorization": f"Bearer {TOKEN}"})
    f.request.timestamp_start, f.request.timestamp_end = 1.0, 2.0
    f.response = response
    return f


def answer(status: int = 200, body: bytes = b"", ctype: str = "application/connect+proto",
           trailers: dict[str, str] | None = None) -> http.Response:
    r = http.Response.make(status, body, {"content-type": ctype, "set-cookie": "session=secret-cookie"})
    if trailers:
        r.trailers = http.Headers(**trailers)
    return r


# requestheaders --------------------------------------------------------------------------------

def test_a_run_is_opened_with_redacted_headers_and_streams_both_ways(hooked: Any) -> None:
    addon, writer, _ = hooked
    f = flow(RUN)
    addon.requestheaders(f)
    [(kind, fo)] = events(writer)
    assert kind == Open
    assert isinstance(fo, FlowOpen)
    assert (fo.key, fo.transport, fo.streaming) == (f.id, "run", True)
    assert (fo.host, fo.path, fo.request_id) == ("api2.cursor.sh", "/agent.v1.AgentService/Run", "rid-1")
    assert fo.client_version == "cli-2026.01.01-abc1234"
    assert fo.auth_hash == bearer_hash(f"Bearer {TOKEN}")
    assert fo.request_type == "agent.v1.RunRequest"
    assert fo.meta["method"] == "POST"
    headers = dict(fo.meta["request_headers"])
    assert TOKEN not in str(fo.meta)
    assert headers["authorization"].startswith("Bearer [redacted sha256:")
    assert f.metadata[stream_end.MARK] is True
    # the request body streams: each chunk is recorded and passed on unchanged, an empty one is its end
    assert f.request.stream(b"\x00\x00\x00\x00\x02\x3a\x00") == b"\x00\x00\x00\x00\x02\x3a\x00"
    assert f.request.stream(b"") == b""
    chunk, eof = events(writer)
    assert chunk[0] == Chunk
    assert chunk[1:3] == (f.id, "client")
    assert chunk[4] == b"\x00\x00\x00\x00\x02\x3a\x00"
    assert eof[0] == Eof
    assert eof[1:3] == (f.id, "client")


@pytest.mark.parametrize(("url", "ctype", "transport", "streaming"), [
    (RUNSSE, "application/connect+proto", "runsse", True),
    (APPEND, "application/proto", "bidi_append", False),
    (MODELS, "application/proto", "unary", False),
    (f"{HOST}/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE", "application/connect+proto", "unary", True),
])
def test_routes_by_path(hooked: Any, url: str, ctype: str, transport: str, streaming: bool) -> None:
    addon, writer, _ = hooked
    f = flow(url, ctype)
    addon.requestheaders(f)
    [(kind, fo)] = events(writer)
    assert kind == Open
    assert (fo.transport, fo.streaming) == (transport, streaming)
    assert callable(f.request.stream) is streaming
    assert (stream_end.MARK in f.metadata) is streaming


def test_other_traffic_is_left_alone(hooked: Any) -> None:
    addon, writer, _ = hooked
    for url in ("https://example.com/upload", f"{HOST}/auth/poll", "https://example.com/agent.v1.Other/Run"):
        f = flow(url)
        addon.requestheaders(f)
        assert not f.request.stream
        assert not f.metadata
    assert events(writer) == []


def test_agent_paths_are_recorded_on_any_host(hooked: Any) -> None:
    addon, writer, _ = hooked
    f = flow("https://127.0.0.1:8443/agent.v1.AgentService/Run")
    addon.requestheaders(f)
    [(kind, fo)] = events(writer)
    assert kind == Open
    assert fo.transport == "run"


def test_nothing_is_recorded_before_the_writer_runs() -> None:
    addon = CursorCapture()
    with taddons.context(addon):
        f = flow(RUN)
        addon.requestheaders(f)
        addon.responseheaders(f)
        assert not f.request.stream
        assert stream_end.MARK not in f.metadata


# the whole exchange, in mitmproxy's event order --------------------------------------------------

async def test_a_unary_exchange_records_both_bodies_and_its_trailers(tmp_path: Path) -> None:
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        writer = addon.writer = CaptureWriter(WriterConfig(db_path=str(tmp_path / "u.duckdb"), live=False))
        f = flow(MODELS, "application/proto", body=b"\x0a\x00",
                 response=answer(200, b"\x0a\x05\x0a\x03gpt", "application/proto", {"grpc-status": "0"}))
        await tctx.cycle(addon, f)
    evs = events(writer)
    assert [e[0] for e in evs] == [Open, Body, Response, Body, Done]
    _, client_body, resp, server_body, done = evs
    assert client_body[1:3] == (f.id, "client")
    assert client_body[4] == b"\x0a\x00"
    assert resp[1] == f.id
    assert resp[3] == 200
    assert dict(resp[4])["set-cookie"].startswith("[redacted")
    assert resp[5] == "HTTP/1.1"
    assert server_body[1:3] == (f.id, "server")
    assert server_body[4] == b"\x0a\x05\x0a\x03gpt"
    assert done[1] == f.id
    assert done[3] is None
    assert done[4] == {"grpc-status": "0"}
    assert f.id not in addon._routes


async def test_a_streamed_run_passes_through_and_ends_once(tmp_path: Path) -> None:
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        writer = addon.writer = CaptureWriter(WriterConfig(db_path=str(tmp_path / "r.duckdb"), live=False))
        f = flow(RUN, response=answer())
        await tctx.cycle(addon, f)
    evs = events(writer)
    # bodies stream: no whole-body events; the request had ended, so its end and the flow's end follow
    assert [e[0] for e in evs] == [Open, Response, Eof, Done]
    assert evs[2][1:3] == (f.id, "client")
    assert callable(f.response.stream)
    chunk = b"\x00\x00\x00\x00\x04\x0a\x02\x6a\x00"
    assert f.response.stream(chunk) == chunk
    [(kind, key, direction, _ts, data)] = events(writer)
    assert (kind, key, direction, data) == (Chunk, f.id, "server", chunk)


def test_a_run_whose_response_ends_first_is_done_when_its_request_ends(hooked: Any) -> None:
    addon, writer, _ = hooked
    f = flow(RUN, response=answer())
    addon.requestheaders(f)
    addon.responseheaders(f)
    f.request.timestamp_end = None  # the client is still writing (bidi Run)
    addon.response(f)
    assert [e[0] for e in events(writer)] == [Open, Response, Done]
    assert f.id in addon._answered
    f.request.timestamp_end = 3.0
    addon.request(f)  # mitmproxy calls it when the request side ends
    [(kind, key, _ts, error, trailers, _reset)] = events(writer)
    assert (kind, key, error, trailers) == (Done, f.id, None, {})
    assert f.id not in addon._answered
    assert f.id not in addon._routes


# error -----------------------------------------------------------------------------------------

def test_error_names_the_failure(hooked: Any) -> None:
    addon, writer, _ = hooked
    f = flow(RUNSSE)
    addon.requestheaders(f)
    events(writer)
    f.error = tflow.terr("connection closed by server")
    addon.error(f)
    [(kind, key, _ts, msg, trailers, reset)] = events(writer)
    assert (kind, key, msg, trailers, reset) == (Done, f.id, "connection closed by server", {}, None)
    assert f.id not in addon._routes
    addon.error(f)  # a second report of the same flow is not recorded twice
    assert events(writer) == []


def test_error_after_a_reset_carries_its_side_and_code(hooked: Any) -> None:
    addon, writer, _ = hooked
    f = flow(RUN)
    addon.requestheaders(f)
    events(writer)
    reset = {"side": "server", "code": "INTERNAL_ERROR", "h2_error_code": 2, "after_response_end": False,
             "message": "stream reset by server (INTERNAL_ERROR)"}
    f.metadata[stream_end.RESET] = reset
    f.error = tflow.terr("stream reset by server (INTERNAL_ERROR)")
    addon.error(f)
    [(kind, key, _ts, msg, _trailers, got)] = events(writer)
    assert (kind, key) == (Done, f.id)
    assert msg == describe_reset(reset)
    assert got == reset


def test_error_of_an_unrecorded_flow_is_ignored(hooked: Any) -> None:
    addon, writer, _ = hooked
    f = flow("https://example.com/x")
    f.error = tflow.terr("boom")
    addon.error(f)
    assert events(writer) == []


# options: load / configure / running / done ------------------------------------------------------

def test_load_declares_the_options_with_their_defaults() -> None:
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        o = tctx.options
        assert o.cursor_db == DEFAULT_DB
        assert o.cursor_hosts == ",".join(DEFAULT_HOSTS)
        assert o.cursor_paths == ",".join(DEFAULT_PATHS)
        assert o.cursor_redact == "secrets"
        assert o.cursor_flush_ms == 250
        assert o.cursor_live is True
        assert o.cursor_stats_file == ""


@pytest.mark.parametrize(("option", "value", "message"), [
    ("cursor_db", "  ", "cursor_db is empty"),
    ("cursor_hold_frames", -1, "cursor_hold_frames=-1"),
    ("cursor_flush_ms", -5, "cursor_flush_ms=-5"),
    ("cursor_redact", "everything", "cursor_redact='everything'"),
])
def test_configure_refuses_bad_values_and_keeps_the_old_one(option: str, value: object, message: str) -> None:
    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        before = getattr(tctx.options, option)
        with pytest.raises(exceptions.OptionsError, match=message):
            tctx.configure(addon, **{option: value})
        assert getattr(tctx.options, option) == before


def test_configure_hosts_and_paths_change_what_is_recorded(hooked: Any) -> None:
    addon, writer, tctx = hooked
    tctx.configure(addon, cursor_paths="/custom.v1.Service/*", cursor_hosts="internal.example")
    on_path = flow("https://anywhere.example/custom.v1.Service/Call", "application/proto")
    on_host = flow("https://internal.example/pkg.v1.Other/Call", "application/proto")
    agent = flow(RUN)  # no longer in the paths, and api2.cursor.sh no longer in the hosts
    for f in (on_path, on_host, agent):
        addon.requestheaders(f)
    opened = [fo.key for kind, fo in events(writer) if kind == Open]
    assert opened == [on_path.id, on_host.id]


def test_running_starts_a_writer_from_the_options_and_done_stops_it(tmp_path: Path) -> None:
    addon = CursorCapture()
    db = tmp_path / "opts.duckdb"
    stats = tmp_path / "stats.json"
    with taddons.context(addon) as tctx:
        tctx.configure(addon, cursor_db=str(db), cursor_flush_ms=40, cursor_redact="content", cursor_live=False,
                       cursor_stats_file=str(stats), cursor_writer="thread")
        addon.running()
        writer = addon.writer
        assert writer is not None
        try:
            assert writer.config == WriterConfig(db_path=str(db), flush_interval=0.04, content=True, live=False,
                                                 stats_path=str(stats), hold_frames=tctx.options.cursor_hold_frames)
            addon.running()  # a second ``running`` keeps the writer
            assert addon.writer is writer
            tctx.configure(addon, cursor_db=str(tmp_path / "other.duckdb"))  # cannot move mid-capture
            assert addon._db == str(db)
        finally:
            addon.done()
        assert addon.writer is None
        assert db.exists()


async def test_whole_bodies_are_handed_over_as_they_crossed_the_wire(tmp_path: Path) -> None:
    """``content-encoding`` is not undone on the proxy's event loop (``get_content`` inflates without
    a limit): the writer gets the raw body and its codings."""
    import gzip

    addon = CursorCapture()
    with taddons.context(addon) as tctx:
        writer = addon.writer = CaptureWriter(WriterConfig(db_path=str(tmp_path / "u.duckdb"), live=False))
        resp = answer(200, b"", "application/proto")
        resp.headers["content-encoding"] = "gzip"
        resp.raw_content = gzip.compress(b"\x0a\x05\x0a\x03gpt")
        f = flow(MODELS, "application/proto", body=b"\x0a\x00", response=resp)
        await tctx.cycle(addon, f)
    bodies = [e for e in events(writer) if e[0] is Body]
    assert [(b[2], b[4], b[5]) for b in bodies] == [
        ("client", b"\x0a\x00", ()), ("server", resp.raw_content, ("gzip",))]

