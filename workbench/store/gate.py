"""The write gate: what every frame and session row passes through on its way into DuckDB.

Every source (live capture and its spool, every importer, ``client --record``, fixtures, the demo,
replay recordings) writes through ``Recorder`` → ``FrameBatch`` / ``Store.upsert_sessions``, and
those call the functions here, so a guarantee holds whatever the source, kind or size of a frame:

- **No credential in clear.** ``gate_frame`` redacts the credentials the schema can carry (model
  API keys in ``credentials`` oneofs, whole payloads of secret message types) at the secrets level,
  also inside a frame kept gzip-compressed past the inflate budget (kind ``compressed``): it is
  inflated up to ``SCRUB_LIMIT`` to be scrubbed and re-compressed; one that cannot be inspected
  (too large, not gzip) that may carry a credential is stored as a marker plus an error, never
  as is. ``gate_meta`` redacts credential headers in header lists and maps (request/response
  headers, trailers). Redaction is idempotent: a source that redacted already (capture with
  ``--content``) gets the same markers.
- **Valid UTF-8 text.** Text from the wire may hold bytes that are not UTF-8 (mitmproxy hands them
  as lone surrogates, ``surrogateescape``). ``wire_text`` stores them escaped, and
  ``wire_bytes`` gives the original bytes back. The rule: a string that is valid UTF-8 and holds no
  ``\\\\`` and no ``\\x`` is stored unchanged; any other has each backslash doubled and each byte
  that was not UTF-8 written ``\\xNN`` (two lowercase hex digits). Read back: ``\\\\`` is one
  backslash, ``\\xNN`` the byte NN, and any other backslash stands for itself.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

from workbench.decode.frame import BIDI_APPEND, BIDI_POLL_RESP, CLIENT_MSG, COMPRESSED, SERVER_MSG, Frame
from workbench.protocol.kinds import is_end_stream, is_openai
from workbench.redact import (
    SECRET_MESSAGE_TYPES,
    marker,
    may_carry_credentials,
    redact_frame,
    redact_headers,
    redact_openai,
    redact_untyped,
)

# How far the gate inflates a ``compressed`` frame to scrub it (what viewing it allows, too).
SCRUB_LIMIT = 256 * 1024 * 1024
_CHUNK = 1024 * 1024
_HEADER_KEYS = ("request_headers", "response_headers", "trailers", "headers")
_NEEDS_ESCAPE = re.compile(r"[\udc80-\udcff]|\\[\\x]|[\ud800-\udfff]")
_UNESCAPE = re.compile(rb"\\(\\|x[0-9a-f]{2})")
_AGENT_TYPES = frozenset({CLIENT_MSG, SERVER_MSG})  # gate_frame's fast path (see there)


# text ----------------------------------------------------------------------------------------

def wire_text(s: str) -> str:
    """``s`` as valid UTF-8 text, with bytes that were not UTF-8 escaped (rule in the module doc)."""
    if not _NEEDS_ESCAPE.search(s):
        return s
    out: list[str] = []
    for ch in s:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= o <= 0xDCFF:  # surrogateescape: the original byte
            out.append(f"\\x{o - 0xDC00:02x}")
        elif 0xD800 <= o <= 0xDFFF:  # any other lone surrogate: its UTF-8 (surrogatepass) bytes
            out.append("".join(f"\\x{b:02x}" for b in ch.encode("utf-8", "surrogatepass")))
        else:
            out.append(ch)
    return "".join(out)


def wire_bytes(stored: str) -> bytes:
    """The original bytes of a string ``wire_text`` stored."""
    raw = stored.encode("utf-8")
    return _UNESCAPE.sub(lambda m: b"\\" if m.group(1) == b"\\" else bytes((int(m.group(1)[1:], 16),)), raw)


def wire_str(stored: str) -> str:
    """The text a string ``wire_text`` stored stood for (a byte that was not UTF-8 as a lone
    surrogate, ``surrogateescape``): what a view shows, e.g. a frame's summary, whose own escapes
    (``decode.summary.quote`` doubles a backslash) would otherwise show doubled once more."""
    if "\\" not in stored:  # stored unchanged (the rule escapes only text holding a backslash)
        return stored
    return wire_bytes(stored).decode("utf-8", "surrogateescape")


def text_value(v: Any) -> Any:
    """``wire_text`` applied to every string in a JSON-like value (keys too)."""
    if isinstance(v, str):
        return wire_text(v)
    if isinstance(v, dict):
        return {wire_text(str(k)): text_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [text_value(x) for x in v]
    return v


# session and frame meta ------------------------------------------------------------------------

def _redact_pairs(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(redact_headers((str(k), v if isinstance(v, str) else str(v)) for k, v in value.items()))
    if isinstance(value, list):
        pairs = [p for p in value if isinstance(p, list | tuple) and len(p) == 2]
        if len(pairs) == len(value):
            return [list(p) for p in redact_headers((str(a), b if isinstance(b, str) else str(b)) for a, b in pairs)]
    return value


def gate_meta(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """A row's meta with credential headers redacted in every header list or map it holds."""
    if not meta:
        return meta
    out = dict(meta)
    for key in _HEADER_KEYS:
        if key in out:
            out[key] = _redact_pairs(out[key])
    return out


# frames ----------------------------------------------------------------------------------------

def _inflate_for_scrub(data: bytes, limit: int) -> bytes | None:
    """Gunzip up to ``limit`` bytes, or None when it is not whole gzip within the limit."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error:
        return None
    if len(out) > limit or d.unconsumed_tail or not d.eof:
        return None
    return out


def _peek(data: bytes, n: int = 2) -> bytes | None:
    """The first ``n`` inflated bytes (None when it does not inflate)."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, n)
    except zlib.error:
        return None


def _scan_server(data: bytes, limit: int) -> bool | None:
    """Does an inflated AgentServerMessage hold a subagent_args tag? Streamed in bounded chunks
    (None when the stream breaks before ``limit``)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    tail = b""
    seen = 0
    buf = data
    try:
        while True:
            out = d.decompress(buf, _CHUNK)
            buf = d.unconsumed_tail
            if seen == 0 and out[:1] != b"\x12":
                return False
            if b"\xe2\x01" in tail + out:
                return True
            tail = out[-1:]
            seen += len(out)
            if d.eof or (not buf and not out):
                return False if d.eof else None
            if seen > limit:
                return None
    except zlib.error:
        return None


def _compressed_may_carry(f: Frame, limit: int) -> bool:
    """Whether a frame kept compressed may hold a credential (True when it cannot be told).

    Agent messages are pre-checked like plain ones, streaming (bounded memory, so a gzip bomb
    costs no more than a chunk); wrappers (BidiAppend, BidiPoll) are always inflated to be looked in.
    """
    if f.msg_type == CLIENT_MSG:
        head = _peek(f.payload)
        return head is None or may_carry_credentials(head, CLIENT_MSG)
    if f.msg_type == SERVER_MSG:
        found = _scan_server(f.payload, limit)
        return found is None or found
    if f.msg_type is None:
        return True  # no type: what it holds cannot be told without looking
    return (f.msg_type in SECRET_MESSAGE_TYPES or f.msg_type in (BIDI_APPEND, BIDI_POLL_RESP)
            or may_carry_credentials(b"", f.msg_type))


def _gate_compressed(f: Frame, limit: int) -> Frame:
    if not f.payload or not _compressed_may_carry(f, limit):
        return f
    inner = _inflate_for_scrub(f.payload, limit)
    if inner is None:
        note = (f"payload not stored: a compressed {f.msg_type or 'message'} of {len(f.payload):,} bytes "
                f"that may carry a credential could not be inflated within {limit // (1024 * 1024)} MiB to "
                "be scrubbed")
        f.payload = marker(f.payload).encode()
        f.raw = None
        f.error = f"{f.error}; {note}" if f.error else note
        return f

    # deferred: the decoder brings the schema (≈ 20 ms); only a compressed frame that may carry a
    # credential needs it, and every reader that imports the store would pay it at start-up
    from workbench.decode.classify import default_decoder

    plain = default_decoder().classify_carried(inner, f.msg_type)
    wrapped = plain.raw is not None  # a wrapper: its agent message in ``payload``, itself in ``raw``
    before = plain.payload
    if f.msg_type is None:
        plain.payload = redact_untyped(plain.payload)
    else:
        redact_frame(plain)
    if plain.payload is not before:
        stored = plain.raw if wrapped and plain.raw is not None else plain.payload
        # gzip again at a fast level: the stored frame stays ``compressed``, inflated when viewed
        co = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        f.payload = co.compress(stored) + co.flush()
        f.raw = None
    return f


def gate_frame(f: Frame, *, carried: str | None = None, limit: int = SCRUB_LIMIT) -> Frame:
    """The frame as it may be stored (secrets level); changed in place, returned for chaining.

    ``carried``: the message type its transport carries in its direction, for a gzip payload that
    failed to inflate (kind ``malformed``, no ``msg_type``): what inflates of it is looked in too.
    """
    kind = f.kind
    payload = f.payload
    # Nearly every frame of a capture is an agent message whose first bytes rule out a credential
    # (``may_carry_credentials``, the same pre-check ``redact_payload`` makes first): the branches
    # below would hand it back unchanged after a chain of calls that cost more than storing it.
    # Kinds with a branch of their own (compressed, malformed, OpenAI JSON) never take this path.
    if (payload and f.msg_type in _AGENT_TYPES and kind != COMPRESSED and kind != "malformed"
            and not is_openai(kind) and not may_carry_credentials(payload, f.msg_type)):
        if f.meta:
            f.meta = gate_meta(f.meta)
        return f
    return _gate_frame_fully(f, carried, limit)


def _gate_frame_fully(f: Frame, carried: str | None, limit: int) -> Frame:
    """``gate_frame`` without its fast path (what the fast path is tested against)."""
    if f.kind == COMPRESSED:
        f = _gate_compressed(f, limit)
    elif f.kind == "malformed" and f.payload[:2] == b"\x1f\x8b" and (f.msg_type or carried):
        typed = Frame(f.kind, f.summary, f.payload, f.flags, f.msg_type or carried, f.error)
        if _compressed_may_carry(typed, limit):
            note = "payload not stored: a gzip payload that does not inflate may carry a credential"
            f.payload = marker(f.payload).encode()
            f.raw = None
            f.error = f"{f.error}; {note}" if f.error else note
    elif f.payload and is_openai(f.kind):
        f = redact_openai(f)  # the OpenAI side of a bridge: JSON, credential keys
    elif f.payload and f.msg_type is None and not is_end_stream(f.kind):
        f.payload = redact_untyped(f.payload)  # an RPC the schema does not name: read as agent messages
        if f.raw and f.payload is not f.raw and redact_untyped(f.raw) is not f.raw:
            f.raw = marker(f.raw).encode()
    elif f.payload:
        f = redact_frame(f)
    if f.meta:
        f.meta = gate_meta(f.meta)
    return f
