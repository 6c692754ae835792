"""Pins on the mitmproxy internals the transparent end of stream relies on, and hook-level tests.

If a mitmproxy upgrade renames, reshapes or fixes what ``workbench.capture.stream_end`` wraps,
these fail first (and say which piece), instead of the hang quietly coming back. The layer-level
tests drive a real ``HttpStream`` with mitmproxy's own events; the addon tests use mitmproxy's
``taddons`` and ``tflow`` helpers.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import h2.errors
import pytest
from mitmproxy import exceptions, http, version
from mitmproxy.addons import proxyserver
from mitmproxy.connection import Server
from mitmproxy.proxy import commands, context, events
from mitmproxy.proxy.layers import http as hl
from mitmproxy.proxy.layers.http import _http2
from mitmproxy.proxy.layers.http._events import (
    RequestData,
    RequestEndOfMessage,
    RequestHeaders,
    RequestProtocolError,
    ResponseData,
    ResponseEndOfMessage,
    ResponseHeaders,
    ResponseProtocolError,
)
from mitmproxy.proxy.layers.http._hooks import (
    HttpErrorHook,
    HttpRequestHeadersHook,
    HttpResponseHeadersHook,
)
from mitmproxy.test import taddons, tflow
from support import wait_until

from workbench.capture import stream_end
from workbench.capture.addon import CursorCapture
from workbench.protocol.status import describe_reset

RUN = "https://api2.cursor.sh/agent.v1.AgentService/Run"


MITM12 = stream_end.MITMPROXY_MAJOR >= 12


def test_this_mitmproxy_is_a_line_the_override_was_checked_on() -> None:
    """A mitmproxy outside the checked lines fails here first: read its stream layer, then widen."""
    assert stream_end.mitmproxy_line_checked(), (version.VERSION, stream_end.CHECKED_LINES)
    assert stream_end.mitmproxy_line_checked("11.0.2") and stream_end.mitmproxy_line_checked("12.3.1")
    assert stream_end.mitmproxy_line_checked("12.3.0.dev0")
    assert not stream_end.mitmproxy_line_checked("11.1.0")
    assert not stream_end.mitmproxy_line_checked("12.1.2")
    assert not stream_end.mitmproxy_line_checked("13.0.0")
    # the line pyproject.toml installs for this Python
    assert stream_end.MITMPROXY_MAJOR == (12 if sys.version_info >= (3, 12) else 11)


def test_the_wrapped_internals_have_the_shape_we_rely_on() -> None:
    assert stream_end.check_internals() == []
    # Used inside the wrappers, beyond the method signatures:
    assert _http2.Http2Server.ReceiveProtocolError is RequestProtocolError
    assert _http2.Http2Client.ReceiveProtocolError is ResponseProtocolError
    assert "streams" in _http2.Http2Connection.__annotations__
    assert hasattr(hl, "SendHttp")
    assert hasattr(hl, "DropStream")
    # A protocol-error event's code: the override builds one for a reset mitmproxy drops, with
    # CANCEL_CODE or the class's default code (mitmproxy's own choice for other resets).
    if MITM12:
        from mitmproxy.proxy.layers.http._events import ErrorCode

        assert stream_end.CANCEL_CODE is ErrorCode.CANCEL
        assert ResponseProtocolError.code is ErrorCode.GENERIC_SERVER_ERROR
        assert RequestProtocolError.code is ErrorCode.GENERIC_CLIENT_ERROR
        with pytest.raises(AssertionError):  # 12 takes ErrorCode members only: 11's 499 would crash
            RequestProtocolError(1, "x", 499)  # type: ignore[arg-type]
    else:
        assert stream_end.CANCEL_CODE == 499
        assert ResponseProtocolError.code == 502
        assert RequestProtocolError.code == 400
    event = RequestProtocolError(1, "x", stream_end.CANCEL_CODE)
    assert event.code == stream_end.CANCEL_CODE
    event.workbench_probe = 1  # type: ignore[attr-defined]  # the events take extra attributes
    # mitmproxy itself still maps every reset code but CANCEL to INTERNAL_ERROR on forwarding:
    # the reason the override forwards codes itself.
    assert h2.errors.ErrorCodes.CANCEL
    assert h2.errors.ErrorCodes(0).name == "NO_ERROR"


def test_install_is_idempotent_and_replaces_the_methods() -> None:
    stream_end.install()
    stream_end.install()
    assert stream_end.installed()
    assert hl.HttpStream.send_response is stream_end._send_response
    assert hl.HttpStream.flow_done is stream_end._flow_done
    assert _http2.Http2Connection.handle_h2_event is stream_end._handle_h2_event


class _Driver:
    """One real HttpStream fed mitmproxy events; hooks and connections answered at once."""

    def __init__(self, mark: bool) -> None:
        stream_end.install()
        self.tctx = taddons.context(proxyserver.Proxyserver())
        client = tflow.tclient_conn()
        self.server = Server(address=("api2.cursor.sh", 443))
        ctx = context.Context(client, self.tctx.options)
        ctx.server = self.server
        parent = hl.HttpLayer(ctx, hl.HTTPMode.regular)
        self.stream = hl.HttpStream(ctx.fork(), 1)
        self.stream.context.layers = [parent, self.stream]
        self.mark = mark
        self.commands: list[Any] = []

    def feed(self, event: events.Event) -> list[Any]:
        start = len(self.commands)
        pending = [event]
        while pending:
            for cmd in self.stream.handle_event(pending.pop(0)):
                self.commands.append(cmd)
                if isinstance(cmd, HttpRequestHeadersHook):
                    cmd.flow.request.stream = True
                    if self.mark:
                        cmd.flow.metadata[stream_end.MARK] = True
                elif isinstance(cmd, HttpResponseHeadersHook):
                    cmd.flow.response.stream = True  # type: ignore[union-attr]
                if isinstance(cmd, commands.StartHook):
                    pending.append(events.HookCompleted(cmd))
                elif isinstance(cmd, hl.GetHttpConnection):
                    pending.append(hl.GetHttpConnectionCompleted(cmd, (self.server, None)))
        return self.commands[start:]

    def start_bidi(self) -> None:
        req = http.Request.make("POST", RUN)
        req.http_version = "HTTP/2.0"
        self.feed(events.Start())
        self.feed(RequestHeaders(1, req, end_stream=False))
        self.feed(RequestData(1, b"client frame"))
        resp = http.Response.make(200)
        resp.http_version = "HTTP/2.0"
        self.feed(ResponseHeaders(1, resp, end_stream=False))
        self.feed(ResponseData(1, b"server frame"))


def _sent(cmds: list[Any]) -> list[tuple[str, str]]:
    out = []
    for c in cmds:
        if isinstance(c, hl.SendHttp):
            out.append((type(c.event).__name__, "client" if c.connection is not None and
                        c.connection.__class__.__name__ == "Client" else "server"))
        elif isinstance(c, hl.DropStream):
            out.append(("DropStream", ""))
    return out


def test_mitmproxy_alone_holds_the_end_of_a_bidi_stream() -> None:
    """The upstream behaviour the override exists for; if this fails, mitmproxy changed it."""
    d = _Driver(mark=False)
    d.start_bidi()
    assert ("ResponseEndOfMessage", "client") not in _sent(d.feed(ResponseEndOfMessage(1)))
    later = _sent(d.feed(RequestEndOfMessage(1)))
    assert later[-1] == ("ResponseEndOfMessage", "client")


def test_a_marked_flow_gets_its_end_at_once_and_keeps_its_request_side() -> None:
    d = _Driver(mark=True)
    d.start_bidi()
    assert _sent(d.feed(ResponseEndOfMessage(1))) == [("ResponseEndOfMessage", "client")]
    assert d.stream.flow.metadata[stream_end.ENDED] is True
    # client frames after the end still go to the server ...
    assert _sent(d.feed(RequestData(1, b"late"))) == [("RequestData", "server")]
    # ... and the client's own end finishes the stream without a second end of message
    assert _sent(d.feed(RequestEndOfMessage(1))) == [("RequestEndOfMessage", "server"), ("DropStream", "")]


def test_a_client_reset_after_the_end_reaches_the_server_and_the_listener() -> None:
    heard: list[dict[str, Any]] = []

    def listener(flow: http.HTTPFlow, info: dict[str, Any]) -> None:
        heard.append(info)

    stream_end.install(listener)
    try:
        d = _Driver(mark=True)
        d.start_bidi()
        d.feed(ResponseEndOfMessage(1))
        reset = RequestProtocolError(1, "stream reset by client (CANCEL)", stream_end.CANCEL_CODE)
        setattr(reset, stream_end._PEER_CODE, 8)
        cmds = d.feed(reset)
    finally:
        stream_end.remove_listener(listener)
    assert ("RequestProtocolError", "server") in _sent(cmds)  # mitmproxy alone would not send it
    assert getattr(reset, stream_end._FORWARD_CODE) == 8
    assert not any(isinstance(c, HttpErrorHook) for c in cmds)
    assert heard == [{"side": "client", "code": "CANCEL", "h2_error_code": 8, "after_response_end": True,
                      "message": "stream reset by client (CANCEL)"}]


def test_a_server_reset_mid_turn_is_an_error_with_its_side() -> None:
    d = _Driver(mark=True)
    d.start_bidi()
    reset = ResponseProtocolError(1, "stream reset by client (REFUSED_STREAM)", ResponseProtocolError.code)
    setattr(reset, stream_end._PEER_CODE, 7)
    cmds = d.feed(reset)
    assert any(isinstance(c, HttpErrorHook) for c in cmds)
    assert ("ResponseProtocolError", "client") in _sent(cmds)
    info = d.stream.flow.metadata[stream_end.RESET]
    assert info["side"] == "server"
    assert info["code"] == "REFUSED_STREAM"
    assert info["after_response_end"] is False
    assert info["message"] == describe_reset(info) == "stream reset by server (REFUSED_STREAM)"


def test_unmarked_flows_ignore_a_recovered_reset() -> None:
    d = _Driver(mark=False)
    d.start_bidi()
    reset = RequestProtocolError(1, "stream reset by client (CANCEL)", stream_end.CANCEL_CODE)
    setattr(reset, stream_end._RECOVERED, True)
    assert d.feed(reset) == []


# the addon's hooks ---------------------------------------------------------------------------------

@pytest.fixture
def addon(tmp_path: Path) -> Any:
    a = CursorCapture()
    with taddons.context(a) as tctx:
        # the hooks and the writer's state in this process (the process writer: test_capture_process.py)
        tctx.configure(a, cursor_db=str(tmp_path / "hooks.duckdb"), cursor_live=False, cursor_flush_ms=20,
                       cursor_writer="thread")
        a.running()
        yield a
        a.done()


def _flow(url: str, ctype: str = "application/connect+proto") -> http.HTTPFlow:
    f = tflow.tflow()
    f.request = http.Request.make("POST", url, b"", {"content-type": ctype, "x-request-id": "rid-hooks"})
    return f


def test_options_are_checked_whatever_sets_them(tmp_path: Path) -> None:
    a = CursorCapture()
    with taddons.context(a) as tctx:
        with pytest.raises(exceptions.OptionsError, match="cursor_redact='contents'.*secrets, content"):
            tctx.configure(a, cursor_redact="contents")
        with pytest.raises(exceptions.OptionsError, match="cursor_flush_ms=0"):
            tctx.configure(a, cursor_flush_ms=0)
        with pytest.raises(exceptions.OptionsError, match="cursor_writer='fork'.*process, thread"):
            tctx.configure(a, cursor_writer="fork")
        tctx.configure(a, cursor_redact="content")
        assert tctx.options.cursor_redact == "content"


def test_streaming_agent_flows_are_marked_others_left_alone(addon: CursorCapture) -> None:
    run = _flow(RUN)
    addon.requestheaders(run)
    assert run.metadata.get(stream_end.MARK) is True
    assert callable(run.request.stream)
    unary = _flow("https://api2.cursor.sh/agent.v1.AgentService/GetUsableModels", "application/proto")
    addon.requestheaders(unary)
    assert stream_end.MARK not in unary.metadata
    assert not unary.request.stream
    other = _flow("https://example.com/upload")
    addon.requestheaders(other)
    assert not other.metadata
    assert not other.request.stream


def test_error_hook_records_the_side_and_code(addon: CursorCapture, tmp_path: Path) -> None:
    f = _flow(RUN)
    addon.requestheaders(f)
    f.metadata[stream_end.RESET] = {"side": "client", "code": "CANCEL", "h2_error_code": 8,
                                    "after_response_end": False, "message": "stream reset by client (CANCEL)"}
    f.error = tflow.terr("stream reset by client (CANCEL)")
    addon.error(f)
    writer = addon.writer
    assert writer is not None

    def aborted() -> bool:
        info = writer.sink.get_session("rid-hooks")
        return info is not None and info.status == "aborted"

    wait_until(aborted, timeout=30, interval=0.02, what="the session to be marked aborted")
    info = writer.sink.get_session("rid-hooks")
    assert info is not None
    assert info.status == "aborted"
    assert info.error == "stream reset by client (CANCEL)"
    assert info.meta["reset"]["code"] == "CANCEL"
