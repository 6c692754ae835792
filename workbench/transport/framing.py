"""Per-request framing of agent backends: Connect, gRPC-Web (binary and base64 text) and gRPC.

Agent backends (the simulator, the replay server) answer every method in the caller's framing,
chosen from the request's ``content-type`` (docs/protocol.md §2, docs/sim.md "Framing"):

============================  =========================================================  ==========================
content type                  request body                                               how a response ends
============================  =========================================================  ==========================
``application/connect+proto``  envelopes (streams only; on a unary call: HTTP 415)         end-stream envelope 0x02 (JSON)
``application/proto``          bare message (unary only; an envelope here: HTTP 415)      non-200 + JSON error
``application/json``           bare JSON message (unary only)                             non-200 + JSON error
``application/grpc-web+proto`` envelopes, unary and streams                              trailer frame 0x80 (``grpc-status``…)
``application/grpc-web-text``  the same bytes, base64 (each response write padded)        trailer frame 0x80, base64
``application/grpc(+proto)``   envelopes, unary and streams                              HTTP trailers (h2; HTTP/1.1: chunked)
============================  =========================================================  ==========================

Everything here is bytes in, bytes out; the HTTP exchanges live in
``workbench.transport.exchange`` and the methods in ``workbench.transport.agent_service``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workbench.schema import pb
from workbench.wire.endstream import (
    GRPC_STATUS,
    b64decode_loose,
    end_stream_payload,
    grpc_trailers,
    grpc_web_trailer_payload,
)
from workbench.wire.envelope import (
    FLAG_END_STREAM,
    FLAG_TRAILER,
    Envelope,
    encode,
    looks_enveloped,
    split_frames,
)

CONNECT = "connect"  # application/connect+proto: streaming Connect
CONNECT_UNARY = "connect_unary"  # application/proto: unary Connect, bare body
CONNECT_JSON = "connect_json"  # application/json: unary Connect, JSON body
GRPC_WEB = "grpc_web"  # application/grpc-web(+proto)
GRPC_WEB_TEXT = "grpc_web_text"  # application/grpc-web-text(+proto): base64 of the grpc-web bytes
GRPC = "grpc"  # application/grpc(+proto): status in HTTP trailers

_CONTENT_TYPES = {CONNECT: "application/connect+proto", CONNECT_UNARY: "application/proto",
                  CONNECT_JSON: "application/json", GRPC_WEB: "application/grpc-web+proto",
                  GRPC_WEB_TEXT: "application/grpc-web-text+proto", GRPC: "application/grpc+proto"}
_BY_MEDIA_TYPE = {"application/connect+proto": CONNECT, "application/proto": CONNECT_UNARY,
                  "application/json": CONNECT_JSON,
                  "application/grpc-web": GRPC_WEB, "application/grpc-web+proto": GRPC_WEB,
                  "application/grpc-web-text": GRPC_WEB_TEXT, "application/grpc-web-text+proto": GRPC_WEB_TEXT,
                  "application/grpc": GRPC, "application/grpc+proto": GRPC}
GRPC_FAMILY = frozenset({GRPC_WEB, GRPC_WEB_TEXT, GRPC})


class FramingRefused(Exception):
    """The request's content type does not fit the method: answer ``status`` (415), nothing else."""

    def __init__(self, reason: str, status: int = 415) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


class FramingError(Exception):
    """A request body that does not follow its own framing (answered in that framing)."""


@dataclass(frozen=True, slots=True)
class Framing:
    name: str

    @property
    def content_type(self) -> str:
        return _CONTENT_TYPES[self.name]

    @property
    def grpc_family(self) -> bool:
        return self.name in GRPC_FAMILY

    @property
    def text(self) -> bool:
        return self.name == GRPC_WEB_TEXT

    @property
    def http_trailers(self) -> bool:
        return self.name == GRPC

    @property
    def json(self) -> bool:
        return self.name == CONNECT_JSON


def media_type(headers: Mapping[str, str]) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def for_stream(headers: Mapping[str, str]) -> Framing:
    """Framing of a streaming call (Run, RunSSE, RunPoll). Unary content types are refused (415)."""
    mt = media_type(headers)
    name = _BY_MEDIA_TYPE.get(mt, CONNECT if not mt else None)
    if name is None or name in (CONNECT_UNARY, CONNECT_JSON):
        raise FramingRefused(f"content type {mt!r} is not a streaming framing")
    return Framing(name)


def for_unary(headers: Mapping[str, str], body: bytes) -> Framing:
    """Framing of a unary call; 415 exactly where Connect refuses it.

    An envelope sent as Connect unary (``application/proto``, or no content type) and a
    ``connect+proto`` content type on a unary method are the two 415s the service answers; a
    gRPC-Web or gRPC body is enveloped by design and accepted.
    """
    mt = media_type(headers)
    name = _BY_MEDIA_TYPE.get(mt, CONNECT_UNARY if not mt else None)
    if name is None:
        raise FramingRefused(f"unsupported content type {mt!r}")
    if name == CONNECT:
        raise FramingRefused("application/connect+proto is a streaming content type; unary Connect is "
                             "application/proto with a bare body")
    if name == CONNECT_UNARY and looks_enveloped(body):
        raise FramingRefused("an enveloped body sent as Connect unary (application/proto takes a bare message)")
    return Framing(name)


def guess(headers: Mapping[str, str]) -> Framing:
    """Best framing for answering an unknown path (so the caller can read the ``unimplemented``)."""
    name = _BY_MEDIA_TYPE.get(media_type(headers), CONNECT_UNARY)
    return Framing(CONNECT_UNARY if name == CONNECT else name)


# requests ------------------------------------------------------------------------------------


class RequestDecoder:
    """Incoming body bytes → enveloped bytes (gRPC-Web text is base64, possibly split anywhere)."""

    def __init__(self, framing: Framing) -> None:
        self.framing = framing
        self._tail = b""

    def feed(self, chunk: bytes) -> bytes:
        if not self.framing.text:
            return chunk
        data = self._tail + b"".join(chunk.split())
        out = bytearray()
        # Padded segments may be concatenated ("AAA=BBBB"): decode each quantum run separately.
        while data:
            pad = data.find(b"=")
            if pad < 0:
                cut = len(data) - len(data) % 4
                out += _b64(data[:cut])
                data = data[cut:]
                break
            end = pad
            while end < len(data) and data[end:end + 1] == b"=":
                end += 1
            if end % 4:
                break  # the padding run continues in the next chunk
            out += _b64(data[:end])
            data = data[end:]
        self._tail = data
        return bytes(out)

    def close(self) -> bytes:
        rest, self._tail = self._tail, b""
        if rest:
            raise FramingError(f"gRPC-Web text body ends with {len(rest)} bytes that are not whole base64")
        return b""


def _b64(data: bytes) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise FramingError(f"gRPC-Web text body is not base64: {exc}") from exc


def stream_request_envelopes(framing: Framing, body: bytes) -> list[Envelope]:
    """A whole streaming request body (RunSSE/RunPoll) as envelopes."""
    dec = RequestDecoder(framing)
    data = dec.feed(body) + dec.close()
    return split_frames(data)


def unary_payload(framing: Framing, body: bytes) -> bytes:
    """The request message of a unary call: the bare body, or the one enveloped message."""
    if not framing.grpc_family:
        return body
    dec = RequestDecoder(framing)
    envs = split_frames(dec.feed(body) + dec.close())
    data = [e for e in envs if not e.is_trailer]
    if not envs and not body:
        return b""  # some clients send an empty body for an empty request message
    if len(data) != 1 or data[0].error is not None:
        problem = data[0].error if data and data[0].error else f"{len(data)} messages"
        raise FramingError(f"{framing.content_type} unary request must be one enveloped message ({problem})")
    return data[0].payload


# responses -----------------------------------------------------------------------------------


def connect_error_of(body: bytes, status: int) -> dict[str, Any]:
    """The Connect error object of a non-200 unary answer (its JSON body), for re-framing."""
    try:
        doc = json.loads(body.decode("utf-8")) if body.strip() else {}
    except (UnicodeDecodeError, ValueError):
        doc = {}
    if isinstance(doc, dict) and doc.get("code"):
        return doc
    return {"code": "unknown", "message": f"HTTP {status}"}


class ResponseEncoder:
    """Writes one response in the caller's framing: messages, then the end."""

    def __init__(self, framing: Framing, gzip_min: int | None = None) -> None:
        self.framing = framing
        # Connect only: gzip envelopes of at least this size (the client asked for it).
        self.gzip_min = gzip_min if framing.name == CONNECT else None

    def message(self, payload: bytes) -> bytes:
        big = self.gzip_min is not None and len(payload) >= self.gzip_min
        return self._out(encode(payload, compress=big))

    def misframed(self, payload: bytes, off_by: int) -> bytes:
        """``payload`` in an envelope whose length prefix is ``off_by`` bytes wrong: a broken frame
        boundary on purpose (the simulator's ``bad_length_prefix``); the reader is out of sync after it."""
        env = bytearray(encode(payload))
        env[1:5] = max(0, len(payload) + off_by).to_bytes(4, "big")
        return self._out(bytes(env))

    def end(self, error: Mapping[str, Any] | None) -> tuple[bytes, list[tuple[str, str]] | None]:
        """(body bytes, HTTP trailers or None) that end the response; ``error`` a Connect error object."""
        if not self.framing.grpc_family:
            return encode(end_stream_payload(error), FLAG_END_STREAM), None
        err = (error.get("error") if error and "error" in error else error) or None
        trailers = self.trailers(err)
        if self.framing.http_trailers:
            return b"", trailers
        return self._out(encode(grpc_web_trailer_payload(trailers), FLAG_TRAILER)), None

    def trailers(self, err: Mapping[str, Any] | None) -> list[tuple[str, str]]:
        if not err:
            return grpc_trailers(None)
        code = str(err.get("code") or "unknown")
        message = str(err.get("message") or "")
        details = status_details(code, message, err.get("details") or [])
        return grpc_trailers(code, message, details)

    def _out(self, data: bytes) -> bytes:
        return base64.b64encode(data) if self.framing.text else data


def status_details(code: str, message: str, details: list[Any]) -> bytes | None:
    """google.rpc.Status bytes for ``grpc-status-details-bin`` from Connect ``details[]`` entries.

    Each entry's ``value`` (unpadded base64) becomes an Any with ``type.googleapis.com/<type>``;
    entries without a value (debug only) have nothing to carry and are left out.
    """
    anys = []
    for d in details:
        if not isinstance(d, Mapping) or not isinstance(d.get("value"), str):
            continue
        try:
            value = b64decode_loose(d["value"])
        except (binascii.Error, ValueError):
            continue
        anys.append(pb.RpcAny(type_url=f"type.googleapis.com/{d.get('type', '')}", value=value))
    if not anys:
        return None
    return bytes(pb.RpcStatus(code=GRPC_STATUS.get(code, 2), message=message, details=anys).SerializeToString())
