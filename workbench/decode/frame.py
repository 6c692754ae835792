"""What a classified frame is, and which message each transport carries.

The ``Frame`` record and the transport/message-type constants are shared by the classifier
(``classify``), its byte-level fast paths (``fastpath``) and everything downstream (store, capture,
ingest, TUI). They live here, apart from the ``Decoder``, so the fast paths can build frames without
importing the classifier; ``workbench.decode.classify`` re-exports every name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SERVER_MSG = "agent.v1.AgentServerMessage"
CLIENT_MSG = "agent.v1.AgentClientMessage"
BIDI_REQUEST_ID = "aiserver.v1.BidiRequestId"
BIDI_APPEND = "aiserver.v1.BidiAppendRequest"
BIDI_POLL_REQ = "aiserver.v1.BidiPollRequest"
BIDI_POLL_RESP = "aiserver.v1.BidiPollResponse"
ERROR_DETAILS = "aiserver.v1.ErrorDetails"

TRANSPORTS = ("run", "runsse", "bidi_append", "runpoll", "unary")
# ``frames.meta`` key: the payload length on the wire of a gzip frame stored inflated.
WIRE_LENGTH = "wire_length"
# Kind of a gzip frame kept compressed because it would inflate past a budget (workbench.wire.inflate);
# its msg_type is the type the transport carries, so it can be inflated and classified when viewed.
COMPRESSED = "compressed"
# ``frames.meta`` key: the fields of a frame whose bytes did not fit the schema's type, each
# {path, field, expected, found}; the frame was decoded past them (``workbench.decode.lenient``).
SCHEMA_MISMATCH = "schema_mismatch"
# ``frames.meta`` key: bytes a gzip frame carried after its gzip data ({count, hex, where}).
TRAILING_BYTES = "trailing_bytes"
DIRECTIONS = ("client", "server")

# Top-level message type carried by each (transport, direction), before any unwrapping.
CARRIED: dict[tuple[str, str], str | None] = {
    ("run", "client"): CLIENT_MSG,
    ("run", "server"): SERVER_MSG,
    ("runsse", "client"): BIDI_REQUEST_ID,
    ("runsse", "server"): SERVER_MSG,
    ("runpoll", "client"): BIDI_POLL_REQ,
    ("runpoll", "server"): BIDI_POLL_RESP,
    ("bidi_append", "client"): BIDI_APPEND,
    ("bidi_append", "server"): None,
    ("unary", "client"): None,
    ("unary", "server"): None,
}

# Which transports put envelopes on the wire in a given direction (the rest are unary bodies).
ENVELOPED = {("run", "client"), ("run", "server"), ("runsse", "client"), ("runsse", "server"),
             ("runpoll", "client"), ("runpoll", "server")}

@dataclass(slots=True)
class Frame:
    """One classified frame, ready for the store.

    ``payload`` is the agent message (unwrapped from BidiAppend/BidiPoll), ``raw`` the
    de-enveloped wrapper bytes when they differ from ``payload`` (so nothing is ever lost); for a
    gRPC-Web enveloped BidiAppend, ``raw`` is the whole body with its 5-byte envelope and
    ``flags`` the envelope's flags.
    """

    kind: str
    summary: str
    payload: bytes
    flags: int = 0
    msg_type: str | None = None
    error: str | None = None
    raw: bytes | None = None
    ref_id: int | None = None
    call_id: str | None = None
    append_seqno: int | None = None
    request_id: str | None = None
    # Facts of the exchange that carried the frame, e.g. a BidiAppend's HTTP status and redacted
    # request headers, and of how it was decoded (``schema_mismatch``). Stored as JSON in ``frames.meta``.
    meta: dict[str, Any] | None = None


def new_frame(kind: str, summary: str, payload: bytes, flags: int, msg_type: str | None,
              error: str | None = None, raw: bytes | None = None, ref_id: int | None = None,
              call_id: str | None = None) -> Frame:
    """``Frame(kind, summary, payload, flags, msg_type, error, raw, ref_id, call_id)``, built for
    the classifier's hot paths.

    Calling the class goes through ``type.__call__`` and the generated ``__init__`` (a slot wrapper
    round trip), which cost a fifth of a short text delta's time; allocating and setting the slots
    here is twice as fast and gives the same object (``tests/decode/test_hot_path.py`` checks every
    field, so a field added to ``Frame`` and not here fails there).
    """
    f = _new(Frame)
    f.kind = kind
    f.summary = summary
    f.payload = payload
    f.flags = flags
    f.msg_type = msg_type
    f.error = error
    f.raw = raw
    f.ref_id = ref_id
    f.call_id = call_id
    f.append_seqno = None
    f.request_id = None
    f.meta = None
    return f


_new = object.__new__


@dataclass
class StoredFrame:
    """A frame as a view reads it back from ``frames``: when and which way it travelled, and its
    classified payload. The HTML report (``report.session.LoadedFrame``) and the TUI's detail pane
    (``tui.data.FrameDetail``) add what each of them shows."""

    seq: int
    ts_us: int
    direction: str
    transport: str
    kind: str
    summary: str
    msg_type: str | None
    flags: int
    size: int
    payload: bytes


def stored_meta(value: Any) -> dict[str, Any] | None:
    """A ``frames.meta`` value (JSON text) as a dict; None when absent or not an object."""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, dict) else None


def http_error_frame(status: int | None, body: bytes) -> Frame:
    """The frame for a non-200 HTTP response: Connect/JSON ``code``/``message`` when the body has them."""
    code = message = None
    try:
        doc = json.loads(body) if body.strip() else {}
        if isinstance(doc, dict):
            code, message = doc.get("code"), doc.get("message")
    except (UnicodeDecodeError, ValueError):
        pass
    text = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    return Frame("http_error", text, body, error=text)
