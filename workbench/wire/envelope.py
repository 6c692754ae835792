"""Connect envelope framing: ``flags(1) | length(4, big-endian) | payload``.

The parser is incremental because capture sees HTTP/2 DATA chunks whose boundaries have nothing
to do with envelope boundaries (a 5-byte header can be split, one chunk can carry many frames).
It never raises on bad input: a frame it cannot make sense of comes out with ``error`` set and the
raw bytes kept, and once the stream is out of sync every later byte is handed back the same way.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass

from workbench.wire.inflate import (
    LOOK_LIMIT,
    InflateBudget,
    InflateOverBudget,
    SessionInflate,
    current_budget,
    inflate_limited,
)

__all__ = ["DEFAULT_MAX_FRAME", "FLAG_COMPRESSED", "FLAG_END_STREAM", "FLAG_NAMES", "FLAG_TRAILER", "HEADER_LEN",
           "LOOK_LIMIT", "Envelope", "EnvelopeParser", "InflateBudget", "InflateOverBudget", "encode", "flag_names",
           "gzip_tail", "header", "inflate", "looks_enveloped", "split_frames", "split_unary"]

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
FLAG_TRAILER = 0x80
KNOWN_FLAGS = FLAG_COMPRESSED | FLAG_END_STREAM
FLAG_NAMES = {FLAG_COMPRESSED: "gzip", FLAG_END_STREAM: "end-stream", FLAG_TRAILER: "trailer"}

HEADER_LEN = 5
DEFAULT_MAX_FRAME = 64 * 1024 * 1024
_HEADER = struct.Struct(">BI")
_BAD_FLAGS = 0xFF & ~(KNOWN_FLAGS | FLAG_TRAILER)


@dataclass(slots=True)
class Envelope:
    """One frame as it crossed the wire.

    ``payload`` is the message after de-enveloping (gunzipped when flag 0x01 was set); ``raw`` is
    the payload exactly as sent (it is ``payload`` itself unless decompression happened or the
    frame is malformed, in which case ``raw`` holds every byte we could not frame).
    """

    flags: int
    payload: bytes
    offset: int
    error: str | None = None
    raw: bytes | None = None
    enveloped: bool = True
    # A gzip frame left compressed because inflating it would exceed an inflate budget
    # (``error`` names the budget); ``payload`` holds the compressed bytes.
    deferred: bool = False
    # Bytes of a gzip frame's payload after the end of its gzip data (a second member, junk): the
    # inflated ``payload`` does not hold them, so they are kept here to be reported.
    tail: bytes = b""

    @property
    def is_end_stream(self) -> bool:
        return bool(self.flags & FLAG_END_STREAM) and not self.flags & FLAG_TRAILER

    @property
    def is_trailer(self) -> bool:
        return bool(self.flags & FLAG_TRAILER)

    @property
    def wire_bytes(self) -> bytes:
        """The payload as it was on the wire (compressed if it was)."""
        return self.raw if self.raw is not None else self.payload


def flag_names(flags: int) -> list[str]:
    """The names of the flags set (``gzip``, ``end-stream``, ``trailer``); ``["data"]`` for none."""
    return [name for bit, name in FLAG_NAMES.items() if flags & bit] or ["data"]


def header(flags: int, length: int) -> bytes:
    """The 5-byte envelope header: ``flags``, then the length of the payload *as sent* (compressed
    when flag 0x01 is set)."""
    return bytes((flags & 0xFF,)) + length.to_bytes(4, "big")


def encode(payload: bytes, flags: int = 0, compress: bool = False) -> bytes:
    """Build one envelope. ``compress`` gzips the payload and sets flag 0x01."""
    if compress:
        payload = gzip.compress(payload)
        flags |= FLAG_COMPRESSED
    return header(flags, len(payload)) + payload


def gzip_tail(data: bytes, inflated: bytes) -> bytes:
    """What follows the first gzip member of ``data`` (which inflated to ``inflated``); b"" for none.

    A gzip member ends with the inflated size modulo 2**32, so a payload whose last four bytes say
    so has nothing after its member: that check is all a well-formed frame pays. Otherwise the
    member is inflated once more to find where it ends.
    """
    if len(data) >= 4 and int.from_bytes(data[-4:], "little") == len(inflated) & 0xFFFFFFFF:
        return b""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        d.decompress(data, len(inflated) + 1)
        if d.unconsumed_tail:
            d.decompress(d.unconsumed_tail, len(inflated) + 1)
    except zlib.error:
        return b""
    return d.unused_data if d.eof else b""


def inflate(data: bytes, limit: int = LOOK_LIMIT) -> bytes:
    """Gunzip one envelope's payload (at most ``limit`` bytes: decompression bombs are refused).

    For frames that were kept compressed, when somebody looks at them.
    """
    return inflate_limited(data, limit)


class EnvelopeParser:
    """Feed chunks, get complete envelopes.

    After a fatal desync (oversized length, reserved flags, bytes after end-stream) the parser stops
    framing and returns the remaining bytes as malformed envelopes so nothing is lost.
    """

    __slots__ = ("_buf", "_offset", "_max", "_desynced", "_ended", "_need", "_inflate")

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME, inflate: SessionInflate | None = None) -> None:
        # Inflation of gzip frames is charged to a session's budget (``workbench.wire.inflate``):
        # the one given, else a fresh one of the budget in scope (per stream).
        self._inflate = inflate if inflate is not None else current_budget().session()
        self._buf = bytearray()
        self._offset = 0
        self._max = max_frame
        self._desynced = False
        self._ended = False
        # Bytes the buffered partial frame needs before it can complete: a large frame arriving in
        # many small chunks is appended to without being re-scanned or copied each time.
        self._need = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def unconsumed(self) -> bytes:
        """The bytes of the partial frame it holds (a new parser fed them continues where this one
        is: the capture's writer process hands them to its successor)."""
        return bytes(self._buf)

    def feed(self, data: bytes) -> list[Envelope]:
        return self._feed(data, False)  # type: ignore[return-value]

    def feed_fast(self, data: bytes) -> list[Envelope | bytes]:
        """Like ``feed``, but a plain frame (flags 0) comes out as its payload ``bytes``.

        The capture hot path uses this to skip building an ``Envelope`` for the common case.
        """
        return self._feed(data, True)

    def _feed(self, data: bytes, plain: bool) -> list[Envelope | bytes]:
        if not data:
            return []
        if self._desynced:
            return [self._junk(bytes(data), "stream out of sync after an earlier framing error")]
        if self._ended:
            self._desynced = True
            return [self._junk(bytes(data), "bytes after end-stream")]
        buf = self._buf
        if buf:
            if len(buf) + len(data) < self._need:
                buf += data
                return []
            # one copy of both into the bytes the frames are sliced from (``buf += data`` and then
            # ``bytes(buf)`` copied each chunk twice)
            view = b"".join((buf, data))
            buf.clear()
        else:
            view = data if type(data) is bytes else bytes(data)
        base = self._offset
        out: list[Envelope | bytes] = []
        pos = 0
        n = len(view)
        unpack = _HEADER.unpack_from
        cap = self._max
        need = HEADER_LEN
        append = out.append
        while n - pos >= HEADER_LEN:
            flags, length = unpack(view, pos)
            end = pos + HEADER_LEN + length
            if not flags and plain and end <= n and length <= cap:
                # the common case first (a plain, complete frame on the hot path): what the checks
                # below would conclude for it, without reading the flag constants per frame
                append(view[pos + HEADER_LEN : end])
                pos = end
                continue
            if length > cap:
                self._offset = base + pos
                self._desynced = True
                out.append(self._junk(view[pos:],
                                      f"frame length {length} exceeds the {cap}-byte cap (stream out of sync)"))
                return out
            if flags & _BAD_FLAGS:
                self._offset = base + pos
                self._desynced = True
                out.append(self._junk(view[pos:], f"reserved envelope flags 0x{flags:02x}"))
                return out
            if end > n:
                need = HEADER_LEN + length
                break
            if plain and not flags:
                out.append(view[pos + HEADER_LEN : end])
            else:
                out.append(self._make(flags, view[pos + HEADER_LEN : end], base + pos, self._inflate))
            pos = end
            if flags & FLAG_END_STREAM and not flags & FLAG_TRAILER:
                self._ended = True
                if pos < n:
                    self._offset = base + n
                    self._desynced = True
                    out.append(self._junk_at(view[pos:], base + pos, "bytes after end-stream"))
                    return out
                break
        self._offset = base + pos
        if pos < n:
            buf += memoryview(view)[pos:]  # no intermediate slice of the partial frame
            self._need = need
        return out

    def close(self) -> list[Envelope]:
        """End of input: a partial frame still buffered is reported, not dropped."""
        if not self._buf:
            return []
        rest = bytes(self._buf)
        self._buf.clear()
        self._need = 0
        if len(rest) >= HEADER_LEN:
            want = int.from_bytes(rest[1:5], "big")
            msg = f"truncated frame: header announces {want} bytes, {len(rest) - HEADER_LEN} arrived"
        else:
            msg = f"truncated frame header ({len(rest)} of 5 bytes)"
        return [self._junk_at(rest, self._offset, msg)]

    # internals -------------------------------------------------------------------------------

    def _junk(self, data: bytes, error: str) -> Envelope:
        env = self._junk_at(data, self._offset, error)
        self._offset += len(data)
        return env

    @staticmethod
    def _junk_at(data: bytes, offset: int, error: str) -> Envelope:
        return Envelope(flags=-1, payload=data, offset=offset, error=error, raw=data)

    @staticmethod
    def _make(flags: int, payload: bytes, offset: int, budget: SessionInflate) -> Envelope:
        if flags & FLAG_COMPRESSED and not flags & FLAG_TRAILER:
            try:
                inflated = budget.inflate(payload)
                return Envelope(flags, inflated, offset, raw=payload, tail=gzip_tail(payload, inflated))
            except InflateOverBudget as exc:
                return Envelope(flags, payload, offset, error=str(exc), deferred=True)
            except (OSError, ValueError, zlib.error) as exc:
                return Envelope(flags, payload, offset, error=f"gzip: {exc}", raw=payload)
        return Envelope(flags, payload, offset)


def split_frames(data: bytes, max_frame: int = DEFAULT_MAX_FRAME,
                 inflate: SessionInflate | None = None) -> list[Envelope]:
    """Parse a complete enveloped body (all frames plus any truncated tail)."""
    p = EnvelopeParser(max_frame, inflate)
    return p.feed(data) + p.close()


def looks_enveloped(body: bytes, stray_tail: bool = False) -> bool:
    """True when a unary body is in fact a sequence of envelopes.

    Cursor sometimes envelopes unary responses, and gRPC-Web envelopes every unary body (a
    BidiAppend request, its response and the 0x80 trailer frame): a first byte of 0x00-0x03
    cannot start a protobuf message (no valid tag is lower than 0x08), so if the lengths also add
    up it is envelopes. With ``stray_tail``, complete envelopes followed by stray bytes are
    envelopes too (the decoder's view: the parser reports the stray bytes as a frame of their own,
    instead of the whole body being read as one message it is not); a Connect server's 415 test,
    which the simulator reproduces, wants the lengths to add up exactly. A body that starts with a trailer frame (a gRPC-Web
    "trailers-only" answer) must also hold header text, since 0x80 can start a protobuf tag.
    """
    if len(body) < HEADER_LEN:
        return False
    if body[0] == FLAG_TRAILER:
        text = body[HEADER_LEN:]
        if not (b":" in text and all(0x20 <= c < 0x7F or c in (0x09, 0x0A, 0x0D) for c in text)):
            return False
    elif body[0] > 0x03:
        return False
    pos = complete = 0
    n = len(body)
    while pos + HEADER_LEN <= n:
        flags = body[pos]
        if flags & ~KNOWN_FLAGS and flags != FLAG_TRAILER:
            if stray_tail and complete:
                break  # stray bytes that do not even start like an envelope: still after envelopes
            return False
        end = pos + HEADER_LEN + int.from_bytes(body[pos + 1 : pos + 5], "big")
        if end > n:
            break
        pos = end
        complete += 1
    return pos == n or (stray_tail and complete > 0 and body[0] <= KNOWN_FLAGS)


def split_unary(body: bytes, inflate: SessionInflate | None = None) -> list[Envelope]:
    """A unary body as envelopes: bare protobuf becomes one un-enveloped frame."""
    if looks_enveloped(body, stray_tail=True):
        return split_frames(body, inflate=inflate)
    return [Envelope(0, body, 0, enveloped=False)]
