"""Transparent end of stream for agent flows: a small override of mitmproxy's HTTP stream layer.

Why. mitmproxy (11.0.2 and 12.x, checked up to 12.3) forwards a response's end of
message to the client only from ``HttpStream.flow_done()``, and ``send_response()`` calls that only
once the request side is done. A bidi ``Run`` whose server finishes first is therefore held open by
the proxy: a client that keeps its request stream open until the response ends (Node's
``http2`` clients, and the real agent clients built on them) never sees END_STREAM. mitmproxy also
leaves the server's stream half open when the client resets after the response ended, and maps
every RST_STREAM error code except CANCEL to INTERNAL_ERROR when it forwards a reset.

What. ``install()`` wraps five methods, and changes behaviour only for flows the capture addon
marked with ``flow.metadata[MARK] = True`` (agent flows whose request body streams):

1. ``HttpStream.send_response``: after mitmproxy's own steps (the ``response`` hook, trailers),
   if the request side is still streaming, send ``ResponseEndOfMessage`` to the client at once.
   The stream stays registered, so client DATA keeps flowing to the server (and to the recorder)
   until the client ends or resets its side.
2. ``HttpStream.flow_done``: when the request side finishes later, do mitmproxy's bookkeeping
   (``DropStream``) without a second end of message.
3. ``HttpStream.handle_protocol_error``: note which side failed and the HTTP/2 error code in
   ``flow.metadata[RESET]``; forward a client reset to the server when the response had already
   ended (mitmproxy would not); forward resets with the peer's own error code; and tell the
   listeners about failures for which mitmproxy calls no hook (those after the response ended).
4. ``Http2Connection.handle_h2_event``: remember the error code of a peer's RST_STREAM on the
   protocol-error event it becomes (pure annotation, every flow); and deliver a reset that
   arrives right behind the peer's END_STREAM, which mitmproxy drops (it forgets the stream once
   it is closed), as a protocol-error event that only marked flows act on.
5. ``Http2Connection._handle_event``: a protocol-error event that the stream layer marked for
   transparent forwarding is sent as RST_STREAM with that code.

The mitmproxy internals this depends on are listed in ``DEPENDS_ON`` and pinned by
``tests/capture/test_capture_mitm_internals.py``: an upgrade that renames or reshapes any of them
fails those tests instead of silently bringing the hang back. Both supported lines are covered
(11.0.2 on Python 3.11, 12.x on 3.12+): the wrapped methods kept their names and parameters in 12;
what changed is the type of a protocol-error event's ``code`` (an ``ErrorCode`` member in 12, an
HTTP status number in 11), which ``CANCEL_CODE`` hides.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Generator
from typing import Any

import h2.errors
import h2.events
from mitmproxy import http, version
from mitmproxy.proxy import commands
from mitmproxy.proxy.layers import http as http_layers
from mitmproxy.proxy.layers.http import _events, _http2
from mitmproxy.proxy.layers.http._base import ReceiveHttp
from mitmproxy.proxy.layers.http._events import (
    RequestProtocolError,
    ResponseEndOfMessage,
    ResponseProtocolError,
)
from mitmproxy.proxy.layers.http._hooks import HttpErrorHook

from workbench.protocol.status import RESET_METADATA_KEY, h2_error_name, reset_facts

log = logging.getLogger("workbench.capture")

MARK = "workbench_end_at_once"       # set by the addon: this flow gets the transparent end
ENDED = "workbench_end_forwarded"    # set here: the response end went to the client early
RESET = RESET_METADATA_KEY           # set here: {side, code, h2_error_code, message, after_response_end}

# Attributes carried on mitmproxy's protocol-error events (plain dataclasses without slots).
_PEER_CODE = "workbench_peer_rst_code"   # the error code of the RST_STREAM this event came from
_FORWARD_CODE = "workbench_forward_rst"  # send this event on as RST_STREAM with this code
_RECOVERED = "workbench_recovered_reset"  # a reset mitmproxy would have dropped (END_STREAM + RST)
_ENDED_CLOSED = "_workbench_ended_closed"  # per h2 connection: streams forgotten at END_STREAM

HttpStream = http_layers.HttpStream
Http2Connection = _http2.Http2Connection

MITMPROXY_MAJOR = int(version.VERSION.split(".")[0])
# The code a protocol-error event carries for a stream the peer cancelled: mitmproxy 12 takes only
# members of its ``ErrorCode`` enum (asserted in the event's constructor); 11 used HTTP status 499.
_ErrorCode: Any = getattr(_events, "ErrorCode", None)
CANCEL_CODE: Any = _ErrorCode.CANCEL if _ErrorCode is not None else 499
# The mitmproxy lines this override was checked against (pyproject.toml allows exactly these): the
# internals test fails on any other, so a new line is read and tested before users run it.
CHECKED_LINES = {11: ((11, 0, 2), (11, 0, 2)), 12: ((12, 2, 0), (12, 99, 99))}


def mitmproxy_line_checked(ver: str = version.VERSION) -> bool:
    """Whether ``ver`` (mitmproxy's version string) is within a line in ``CHECKED_LINES``."""
    # a development build ("12.3.0.dev0") is judged by its release numbers
    parts = tuple(int(n) for n in re.findall(r"\d+", ver)[:3])
    bounds = CHECKED_LINES.get(parts[0])
    return bounds is not None and bounds[0] <= parts <= bounds[1]


# name → the parameters mitmproxy 11.0.2 and 12.x give it; checked by install() and by the pin tests.
DEPENDS_ON: dict[str, tuple[Any, str, tuple[str, ...]]] = {
    "HttpStream.send_response": (HttpStream, "send_response", ("self", "already_streamed")),
    "HttpStream.flow_done": (HttpStream, "flow_done", ("self",)),
    "HttpStream.handle_protocol_error": (HttpStream, "handle_protocol_error", ("self", "event")),
    "HttpStream.state_stream_request_body": (HttpStream, "state_stream_request_body", ("self", "event")),
    "HttpStream.state_done": (HttpStream, "state_done", ("self", "_")),
    "HttpStream.state_errored": (HttpStream, "state_errored", ("self", "_")),
    "Http2Connection.handle_h2_event": (Http2Connection, "handle_h2_event", ("self", "event")),
    "Http2Connection._handle_event": (Http2Connection, "_handle_event", ("self", "event")),
    "Http2Connection.is_closed": (Http2Connection, "is_closed", ("self", "stream_id")),
}

ResetListener = Callable[[http.HTTPFlow, dict[str, Any]], None]
_listeners: list[ResetListener] = []
_originals: dict[str, Callable[..., Any]] = {}


class InternalsChanged(RuntimeError):
    """mitmproxy no longer has the methods the override wraps (an upgrade changed them)."""


def check_internals() -> list[str]:
    """Problems with the mitmproxy internals we wrap; empty when all is as expected."""
    problems = []
    for name, (owner, attr, params) in DEPENDS_ON.items():
        fn = _originals.get(name) or getattr(owner, attr, None)
        if fn is None:
            problems.append(f"{name} is missing")
            continue
        fn = inspect.unwrap(fn)
        got = tuple(inspect.signature(fn).parameters)
        if got != params:
            problems.append(f"{name}{got} (expected parameters {params})")
    return problems


def installed() -> bool:
    return bool(_originals)


def install(listener: ResetListener | None = None) -> None:
    """Install the wrappers once per process; ``listener`` hears of resets that no hook reports."""
    if listener is not None and listener not in _listeners:
        _listeners.append(listener)
    if _originals:
        return
    problems = check_internals()
    if problems:
        raise InternalsChanged("mitmproxy internals changed; the transparent end of stream is not installed: "
                               + "; ".join(problems))
    for name, (owner, attr, _) in DEPENDS_ON.items():
        _originals[name] = getattr(owner, attr)
    HttpStream.send_response = _send_response  # type: ignore[method-assign]
    HttpStream.flow_done = _flow_done  # type: ignore[method-assign]
    HttpStream.handle_protocol_error = _handle_protocol_error  # type: ignore[method-assign]
    Http2Connection.handle_h2_event = _handle_h2_event  # type: ignore[method-assign]
    Http2Connection._handle_event = _h2_handle_event  # type: ignore[method-assign]


def remove_listener(listener: ResetListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def _marked(stream: Any) -> bool:
    flow = getattr(stream, "flow", None)
    return flow is not None and bool(flow.metadata.get(MARK))


def _relay(gen: Generator[Any, Any, Any], keep: Callable[[Any], bool]) -> Generator[Any, Any, Any]:
    """Run a command generator, passing on what ``keep`` accepts (replies go back in).

    Dropped commands must be non-blocking (they get no reply).
    """
    reply = None
    while True:
        try:
            cmd = gen.send(reply)
        except StopIteration as stop:
            return stop.value
        reply = (yield cmd) if keep(cmd) else None


# HttpStream ---------------------------------------------------------------------------------------

def _send_response(self: Any, already_streamed: bool = False) -> Generator[Any, Any, None]:
    yield from _originals["HttpStream.send_response"](self, already_streamed)
    if (_marked(self) and self.server_state == self.state_done
            and self.client_state == self.state_stream_request_body
            and self.flow.response is not None and self.flow.response.status_code != 101):
        # The request side is still open (a bidi Run): end the response for the client now.
        self.flow.metadata[ENDED] = True
        yield http_layers.SendHttp(ResponseEndOfMessage(self.stream_id), self.context.client)


def _is_end_of_message(cmd: Any) -> bool:
    return isinstance(cmd, http_layers.SendHttp) and isinstance(cmd.event, ResponseEndOfMessage)


def _flow_done(self: Any) -> Generator[Any, Any, None]:
    original = _originals["HttpStream.flow_done"](self)
    if _marked(self) and self.flow.metadata.get(ENDED):
        yield from _relay(original, lambda cmd: not _is_end_of_message(cmd))
    else:
        yield from original


def reset_info(event: Any, after_response_end: bool) -> dict[str, Any]:
    """What a protocol-error event says: which side, the HTTP/2 code (if a reset), the message."""
    side = "client" if isinstance(event, RequestProtocolError) else "server"
    # for a reset the message is ours: mitmproxy's text says "by client" for both sides
    return reset_facts(side, after_response_end, getattr(event, _PEER_CODE, None), event.message)


def _handle_protocol_error(self: Any, event: Any) -> Generator[Any, Any, None]:
    original = _originals["HttpStream.handle_protocol_error"]
    if not _marked(self):
        if getattr(event, _RECOVERED, False):
            return  # mitmproxy alone never delivers this reset: leave other flows as they were
        return (yield from original(self, event))
    flow = self.flow
    response_ended = self.server_state == self.state_done
    info = reset_info(event, response_ended)
    flow.metadata[RESET] = info
    peer_code = info.get("h2_error_code")
    if peer_code is not None:
        setattr(event, _FORWARD_CODE, peer_code)
    elif isinstance(event, RequestProtocolError):
        setattr(event, _FORWARD_CODE, int(h2.errors.ErrorCodes.CANCEL))  # the client is gone
    if (isinstance(event, RequestProtocolError) and response_ended
            and self.client_state == self.state_stream_request_body):
        # mitmproxy forwards a client failure only while the response is running; after an early
        # end the server's stream would stay half open.
        yield http_layers.SendHttp(event, self.context.server)
    hooked = False

    def note(cmd: Any) -> bool:
        nonlocal hooked
        hooked = hooked or isinstance(cmd, HttpErrorHook)
        return True

    yield from _relay(original(self, event), note)
    if not hooked:
        for listener in list(_listeners):
            try:
                listener(flow, info)
            except Exception:  # a listener must not break the proxy
                log.exception("stream reset listener failed")


# Http2Connection ----------------------------------------------------------------------------------

def _handle_h2_event(self: Any, event: Any) -> Generator[Any, Any, bool]:
    original = _originals["Http2Connection.handle_h2_event"](self, event)
    if isinstance(event, h2.events.StreamEnded):
        tracked = event.stream_id in self.streams
        result: bool = yield from original
        if tracked and event.stream_id not in self.streams:
            # mitmproxy forgets a stream that is closed once its END_STREAM is handled. When the peer
            # sent END_STREAM and RST_STREAM back to back (Node's ``stream.close(code)`` does), h2
            # has already applied the reset, so the StreamReset that follows would be dropped.
            recent = self.__dict__.setdefault(_ENDED_CLOSED, set())
            if len(recent) > 256:
                recent.clear()
            recent.add(event.stream_id)
        return result
    if not isinstance(event, h2.events.StreamReset):
        return (yield from original)
    code = int(event.error_code)
    recent = self.__dict__.get(_ENDED_CLOSED)
    if recent and event.stream_id in recent and event.stream_id not in self.streams:
        recent.discard(event.stream_id)
        yield from original  # mitmproxy's own handling (it ignores the reset)
        err = self.ReceiveProtocolError(
            event.stream_id, f"stream reset by client ({h2_error_name(code)})",
            CANCEL_CODE if code == h2.errors.ErrorCodes.CANCEL else self.ReceiveProtocolError.code)
        setattr(err, _PEER_CODE, code)
        setattr(err, _RECOVERED, True)  # only marked flows act on it (see _handle_protocol_error)
        yield ReceiveHttp(err)
        return False

    def annotate(cmd: Any) -> bool:
        if isinstance(cmd, ReceiveHttp) and isinstance(cmd.event, (RequestProtocolError, ResponseProtocolError)):
            setattr(cmd.event, _PEER_CODE, code)
        return True

    result = yield from _relay(original, annotate)
    return result


def _h2_handle_event(self: Any, event: Any) -> Generator[Any, Any, None]:
    code = getattr(event, _FORWARD_CODE, None)
    if code is not None and isinstance(event, (RequestProtocolError, ResponseProtocolError)):
        if not self.is_closed(event.stream_id):
            self.h2_conn.reset_stream(event.stream_id, code)
            data = self.h2_conn.data_to_send()
            if data:
                yield commands.SendData(self.conn, data)
        return
    yield from _originals["Http2Connection._handle_event"](self, event)
