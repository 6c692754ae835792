"""The "Cursor agent" contentview: mitmproxy's console, mitmweb and ``mitmdump --flow-detail 4``
show agent bodies decoded frame by frame with our decoder.

For each frame of a request or response body: its number, direction, kind, size and envelope flags
(gzip, end-stream, gRPC-Web trailer), the one-line summary, then the named field tree (the schema's
names, unknown fields by number). Both directions of every transport: Run / RunSSE / RunPoll
envelopes, BidiAppend requests and BidiPoll responses unwrapped to the agent message they carry,
end-stream JSON and gRPC-Web trailers, unary calls, HTTP errors. Secrets are redacted as in the
database (``workbench.redact``); a credential RPC's body is not shown.

The view is registered by the capture addon (``CursorCapture.load``) and picks the same flows the
addon records (its ``Matcher``, so ``cursor_hosts`` / ``cursor_paths`` apply). It decodes with the
schema the capture writer decodes with (the active schema), through a decoder of its own. On
mitmproxy 12 it is a ``Contentview`` (plain text, the description as its first line); on 11 a
``View`` (styled lines and a description), the API each line has without deprecation warnings.

Streamed bodies (Run, RunSSE, RunPoll) pass through mitmproxy chunk by chunk and are not kept by
it; ``keep_for_view`` keeps a copy (up to ``cursor_view_bytes`` per direction) and hands it to the
flow when the stream ends, so these flows have bodies to show (and ``-w`` flow files keep them).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from mitmproxy import contentviews, http

from workbench.decode import fields_of
from workbench.decode.classify import Decoder, Frame, default_decoder, http_error_frame
from workbench.protocol.routes import DEFAULT_PATHS, Matcher, Route
from workbench.redact import marker, redact_frame, secret_method
from workbench.wire.envelope import FLAG_COMPRESSED, FLAG_END_STREAM, FLAG_TRAILER

# mitmproxy 12 replaced the ``View`` API (deprecated there: subclassing it warns) by ``Contentview``;
# each line gets the class written for its API, and nothing of the other.
_Contentview: Any = getattr(contentviews, "Contentview", None)
MITM12 = _Contentview is not None
# one line of the view: (style, text) parts, as mitmproxy 11's views give them
ViewLine = list[tuple[str, str]]

NAME = "Cursor agent"
# Above mitmproxy's own gRPC/protobuf views (at most 1.5): agent flows open decoded by default.
PRIORITY = 2.0
VIEW_BYTES = 8 * 1024 * 1024       # default copy kept of each streamed body (cursor_view_bytes)
MAX_FRAMES = 5000                   # frames listed per body; the rest are counted
MAX_TREE_LINES = 400                # field-tree lines per frame
MAX_VALUE = 400                     # characters of one string value
# flow.metadata key (serializable: flow files keep metadata) naming the directions whose kept
# copy stopped at cursor_view_bytes
TRUNCATED = "workbench.view_truncated"


def describe_flags(flags: int) -> str:
    names = []
    if flags & FLAG_COMPRESSED:
        names.append("gzip")
    if flags & FLAG_TRAILER:
        names.append("grpc-web trailer")
    elif flags & FLAG_END_STREAM:
        names.append("end-stream")
    return ", ".join(names)


def decode_message(dec: Decoder, route: Route, direction: str, body: bytes, status: int | None,
                   path: str = "") -> list[Frame]:
    """The frames of one whole request (``client``) or response (``server``) body, as the capture
    writer and the importers read them: a refusal as an ``http_error`` frame, BidiAppend and
    BidiPoll unwrapped, unary bodies typed by their RPC; secrets redacted."""
    transport = route.transport
    if route.transport == "unary" and secret_method(path):
        return [Frame("unary", "credential RPC body (not shown)", marker(body).encode())] if body else []
    if direction == "server" and status is not None and status != 200:
        return [http_error_frame(status, body)]
    msg_type = route.request_type if direction == "client" else route.response_type
    frames = dec.decode_body(body, transport, direction, msg_type=msg_type if transport == "unary" else None)
    return [redact_frame(f, decoder=dec) for f in frames]


def _scalar_text(value: Any) -> str:
    if isinstance(value, str):
        text = json.dumps(value if len(value) <= MAX_VALUE else value[:MAX_VALUE], ensure_ascii=False)
        return text if len(value) <= MAX_VALUE else f"{text[:-1]}…\" ({len(value)} chars)"
    return json.dumps(value, ensure_ascii=False, default=str)


def tree_lines(value: Any, indent: int = 4, key: str | None = None) -> Iterator[ViewLine]:
    """The named tree as indented ``name: value`` lines (lists as ``- item``)."""
    pad = " " * indent
    label: ViewLine = [("key", f"{pad}{key}:")] if key is not None else []
    if isinstance(value, dict | list):
        if not value:
            empty = "{}" if isinstance(value, dict) else "[]"
            yield [*label, ("text", " " + empty)] if label else [("text", pad + empty)]
            return
        if label:
            yield label
        inner = indent + (2 if key is not None else 0)
        if isinstance(value, dict):
            for k, v in value.items():
                yield from tree_lines(v, inner, str(k))
            return
        for item in value:
            if isinstance(item, dict | list) and item:
                yield [("text", " " * inner + "-")]
                yield from tree_lines(item, inner + 2)
            else:
                yield [("text", " " * inner + "- "), ("Token_Literal_String", _scalar_text(item))]
    else:
        style = "Token_Literal_String" if isinstance(value, str) else "Token_Literal_Number"
        yield [*label, ("text", " " if label else pad), (style, _scalar_text(value))]


def frame_lines(dec: Decoder, n: int, direction: str, f: Frame) -> Iterator[ViewLine]:
    arrow = "→" if direction == "client" else "←"
    head: ViewLine = [("header", f"#{n} {arrow} {f.kind}"), ("text", f"  {len(f.payload)} B")]
    flags = describe_flags(f.flags)
    if flags:
        head.append(("highlight", f"  [{flags}]"))
    if f.append_seqno is not None:
        head.append(("text", f"  seqno {f.append_seqno}"))
    yield head
    yield [("text", f"  {f.summary}")]
    if f.error:
        yield [("error", f"  error: {f.error}")]
    try:
        tree = fields_of(dec, f.kind, f.payload, f.msg_type, f.flags)
    except Exception as exc:  # a frame that does not decode is shown as bytes, never hidden
        tree = {"$error": f"cannot decode: {exc}", "$hex": f.payload.hex()}
    for i, line in enumerate(tree_lines(tree)):
        if i == MAX_TREE_LINES:
            yield [("warn", f"    … field tree cut at {MAX_TREE_LINES} lines (workbench frames --json has it all)")]
            break
        yield line


class AgentView:
    """Agent bodies frame by frame (see the module docstring): what both mitmproxy APIs show."""

    # a class attribute, ahead of the API classes in the MRO (12's ``name`` property, 11's ClassVar)
    name: ClassVar[str] = NAME

    def __init__(self, decoder: Callable[[], Decoder] = default_decoder,
                 matcher: Callable[[], Matcher] | None = None) -> None:
        self.decoder = decoder
        self.matcher = matcher or (lambda: Matcher(paths=DEFAULT_PATHS))
        # mitmproxy 12's registry cannot remove a view: ``unregister`` turns it off instead
        self.active = True

    def route(self, flow: Any) -> Route | None:
        if not isinstance(flow, http.HTTPFlow):
            return None
        req = flow.request
        return self.matcher().route(req.pretty_host, req.path, req.headers.get("content-type", ""))

    def picks(self, data: bytes, flow: Any) -> bool:
        """Whether this view should open by default for these bytes of this flow."""
        return self.active and bool(data) and self.route(flow) is not None

    def render(self, data: bytes, flow: Any, http_message: http.Message | None) -> tuple[str, Iterator[ViewLine]]:
        """A one-line description and the lines of one body."""
        route = self.route(flow)
        if route is None:
            return "Cursor agent: not an agent flow (see the capture's cursor_hosts / cursor_paths)", iter(
                [[("text", "This view decodes the flows the workbench capture records.")]])
        assert isinstance(flow, http.HTTPFlow)
        direction = "server" if http_message is not None and http_message is flow.response else "client"
        status = flow.response.status_code if direction == "server" and flow.response is not None else None
        dec = self.decoder()
        frames = decode_message(dec, route, direction, data, status, flow.request.path)
        side = "client→server" if direction == "client" else "server→client"
        method = route.method or route.transport
        desc = f"{NAME}: {method} {side}, {len(frames)} frame{'s' if len(frames) != 1 else ''}"
        if direction in flow.metadata.get(TRUNCATED, ()):
            desc += f" (first {len(data):,} bytes kept for viewing; the capture database has every frame)"

        def lines() -> Iterator[ViewLine]:
            for n, f in enumerate(frames):
                if n == MAX_FRAMES:
                    yield [("warn", f"… {len(frames) - MAX_FRAMES} more frames (workbench frames has them all)")]
                    return
                yield from frame_lines(dec, n, direction, f)
        return desc, lines()

    def text(self, data: bytes, flow: Any, http_message: http.Message | None) -> str:
        """The rendering as plain text: the description, a blank line, the frame lines."""
        desc, lines = self.render(data, flow, http_message)
        return "\n".join([desc, "", *("".join(part for _, part in line) for line in lines)])


if MITM12:
    class CursorAgentView(AgentView, _Contentview):
        """The view for mitmproxy 12's ``Contentview`` API (text out; the lines' styles are ours only)."""

        syntax_highlight = "none"

        def render_priority(self, data: bytes, metadata: Any) -> float:
            # below zero: "does not support this data" in the 12 API
            return PRIORITY if self.picks(data, metadata.flow) else -1

        def prettify(self, data: bytes, metadata: Any) -> str:
            return self.text(data, metadata.flow, metadata.http_message)
else:
    class CursorAgentView(AgentView, contentviews.View):  # type: ignore[no-redef]
        """The view for mitmproxy 11's ``View`` API (deprecated in 12, where it is not defined)."""

        def render_priority(self, data: bytes, *, content_type: str | None = None, flow: Any = None,
                            http_message: http.Message | None = None, **unknown_metadata: Any) -> float:
            return PRIORITY if self.picks(data, flow) else 0

        def __call__(self, data: bytes, *, content_type: str | None = None, flow: Any = None,
                     http_message: http.Message | None = None, **unknown_metadata: Any) -> Any:
            return self.render(data, flow, http_message)


# keeping streamed bodies for the view ------------------------------------------------------------

class _Kept:
    """A copy of one streamed body, handed to the message once the stream ends."""

    # The chunks themselves, joined once at the end: appending to one growing buffer would copy
    # every chunk on the event loop (and the buffer again as it grows).
    __slots__ = ("chunks", "limit", "room", "truncated")

    def __init__(self, limit: int) -> None:
        self.chunks: list[bytes] = []
        self.limit = limit
        self.room = limit
        self.truncated = False


# flow id → direction → the copy being kept (not in flow.metadata, which flow files serialize)
_kept: dict[str, dict[str, _Kept]] = {}


def keep_for_view(flow: http.HTTPFlow, direction: str, stream: Callable[[bytes], bytes],
                  limit: int) -> Callable[[bytes], bytes]:
    """Wrap a message's stream callable so that the body it passes on is also kept (its first
    ``limit`` bytes) and set as the message's content at the end of the stream. ``limit`` 0: as is."""
    if limit <= 0:
        return stream
    kept = _Kept(limit)
    _kept.setdefault(flow.id, {})[direction] = kept

    def wrapped(chunk: bytes) -> bytes:
        out = stream(chunk)
        if chunk:
            room = kept.room
            if room > 0:
                kept.chunks.append(chunk[:room])  # the chunk itself when it fits (no copy)
                kept.room = room - len(chunk)
            if len(chunk) > room:
                kept.truncated = True
        else:
            _publish(flow, direction, kept)
        return out

    return wrapped


def _publish(flow: http.HTTPFlow, direction: str, kept: _Kept) -> None:
    sides = _kept.get(flow.id, {})
    if sides.get(direction) is not kept:
        return  # handed over already
    del sides[direction]
    if not sides:
        _kept.pop(flow.id, None)
    message = flow.request if direction == "client" else flow.response
    if message is not None and not message.raw_content:
        message.raw_content = b"".join(kept.chunks)
    if kept.truncated:
        flow.metadata[TRUNCATED] = sorted({*flow.metadata.get(TRUNCATED, ()), direction})


def publish_kept(flow: http.HTTPFlow) -> None:
    """Hand over what was kept of bodies whose stream never ended (a reset, a failed flow)."""
    for direction, kept in list(_kept.get(flow.id, {}).items()):
        _publish(flow, direction, kept)


# registration ------------------------------------------------------------------------------------

_registered: AgentView | None = None


def register(decoder: Callable[[], Decoder] = default_decoder,
             matcher: Callable[[], Matcher] | None = None) -> AgentView:
    """Add the view to mitmproxy (once; a later call re-points it at the new decoder and matcher)."""
    global _registered
    if _registered is None:
        _registered = CursorAgentView(decoder, matcher)
        contentviews.add(_registered)  # type: ignore[arg-type]  # the class of this line's API
    else:
        _registered.decoder = decoder
        _registered.matcher = matcher or (lambda: Matcher(paths=DEFAULT_PATHS))
    _registered.active = True
    return _registered


def unregister() -> None:
    """Take the view out of mitmproxy's automatic choice (11: out of its list; 12's registry has no
    removal and its ``remove`` is a deprecated no-op, so the view stays listed but never picks a
    flow and is re-used by the next ``register``)."""
    if _registered is None:
        return
    _registered.active = False
    if not MITM12:
        _unregister_legacy()


def _unregister_legacy() -> None:
    global _registered
    if _registered is not None:
        contentviews.remove(_registered)  # type: ignore[arg-type]
        _registered = None
