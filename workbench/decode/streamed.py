"""The JSON of one stored frame, written without holding a big inflated frame in memory.

A frame kept compressed over an inflate budget (kind ``compressed``) is inflated when somebody
looks at it, up to 256 MiB. Building its named tree the ordinary way holds that message several
times over (the inflated bytes, the parsed message, the tree's string, the JSON text, its UTF-8):
``frames --json`` of eight 200 MiB text deltas peaked at 782 MiB. Here such a frame is inflated
as a stream, twice:

1. the first pass walks the message along the schema and rebuilds it with every long string
   field (at least ``BIG`` bytes of valid UTF-8) replaced by a short unique marker, and once more
   with each such string cut to its first ``KEEP`` bytes, to classify it (kind and summary);
2. the tree of the marker message goes through the same ``fields_of`` and JSON encoder as any
   frame, and where a marker comes out the string is inflated again and written in pieces.

The text written is the same as ``json.dump({..., "fields": fields_of(...)})`` (tests compare
them). Whatever the walk cannot vouch for takes the ordinary path: a frame that is not a schema
message, a string that is not valid UTF-8, a long field of another type, bytes after the gzip
data, a summary that reads more than a string's head (only text and thinking deltas qualify).
"""

from __future__ import annotations

import codecs
import json
import os
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TextIO

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from workbench.decode.frame import COMPRESSED
from workbench.decode.render import fields_of
from workbench.decode.tree import _WELL_KNOWN, VALUE_BYTES
from workbench.jsontypes import JsonObject
from workbench.protocol.kinds import TEXT_DELTA, THINKING_DELTA
from workbench.wire.envelope import FLAG_COMPRESSED, LOOK_LIMIT

if TYPE_CHECKING:
    from workbench.decode.classify import Decoder

__all__ = ["BIG", "dump_frame"]

MIB = 1024 * 1024
# A compressed frame whose gzip trailer says it inflates to at least this takes the streamed path.
STREAM_FROM = 8 * MIB
# String fields at least this long are written from the stream.
BIG = 1 * MIB
# What the classifier sees of a long string: its summaries quote at most the first 60 characters.
KEEP = 4096
# The rebuilt message (everything but the long strings) must stay under this, else the ordinary path.
SMALL_CAP = 16 * MIB
PIECE = 1 * MIB
# Kinds whose summary reads only the head of their strings (``summary.TEXT_LABELS``).
_HEAD_ONLY = frozenset({TEXT_DELTA, THINKING_DELTA})
_TYPE_MESSAGE = FieldDescriptor.TYPE_MESSAGE
_TYPE_STRING = FieldDescriptor.TYPE_STRING
_ENCODE = json.encoder.encode_basestring  # what the encoder uses for strings with ensure_ascii=False


class _Fallback(Exception):
    """The walk cannot vouch for this frame: the ordinary path writes it."""


class _Inflating:
    """The inflated bytes of one gzip payload, read forward in pieces of at most ``PIECE``."""

    def __init__(self, data: bytes, limit: int) -> None:
        self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = data
        self._buf = b""
        self._at = 0
        self._limit = limit
        self.pos = 0       # bytes handed out
        self.produced = 0  # bytes inflated so far

    def _more(self) -> bool:
        while not self._d.eof:
            try:
                piece = self._d.decompress(self._pending, PIECE)
            except zlib.error:
                raise _Fallback from None
            self._pending = self._d.unconsumed_tail
            if piece:
                self.produced += len(piece)
                if self.produced > self._limit:
                    raise _Fallback  # the ordinary path says it is over the viewing cap
                self._buf = self._buf[self._at:] + piece
                self._at = 0
                return True
            if not self._pending:
                raise _Fallback  # truncated
        return False

    def take(self, n: int) -> bytes:
        while len(self._buf) - self._at < n:
            if not self._more():
                raise _Fallback
        out = self._buf[self._at:self._at + n]
        self._at += n
        self.pos += n
        return out

    def pieces(self, n: int) -> Iterator[bytes]:
        """The next ``n`` bytes, a piece at a time."""
        while n:
            if self._at == len(self._buf) and not self._more():
                raise _Fallback
            piece = self._buf[self._at:self._at + n]
            self._at += len(piece)
            self.pos += len(piece)
            n -= len(piece)
            yield piece

    def varint(self) -> tuple[int, bytes]:
        raw = bytearray()
        value = shift = 0
        while True:
            b = self.take(1)[0]
            raw.append(b)
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value, bytes(raw)
            shift += 7
            if shift > 63:
                raise _Fallback

    def exhausted(self) -> bool:
        """Everything was inflated and read (raises _Fallback when bytes follow the gzip data)."""
        if self._at < len(self._buf) or self._more():
            return False
        if self._d.unused_data:
            raise _Fallback  # bytes after the gzip data: the ordinary path flags them
        return True


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Walk:
    """First pass: the message rebuilt with markers (for the tree) and with heads (to classify)."""

    def __init__(self, src: _Inflating, token: str) -> None:
        self.src = src
        self.token = token
        self.spans: dict[str, tuple[int, int]] = {}  # marker → (offset, length) in the inflated bytes
        self.size = 0

    def message(self, end: int | None, desc: Descriptor) -> tuple[bytes, bytes]:
        """One message up to offset ``end`` (None: the top level, up to the end of the stream)."""
        marked, headed = bytearray(), bytearray()
        src = self.src
        while src.pos < end if end is not None else not src.exhausted():
            tag, tag_raw = src.varint()
            wire = tag & 7
            if wire == 0:
                raw = tag_raw + src.varint()[1]
            elif wire == 1:
                raw = tag_raw + src.take(8)
            elif wire == 5:
                raw = tag_raw + src.take(4)
            elif wire == 2:
                n, n_raw = src.varint()
                fd = desc.fields_by_number.get(tag >> 3)
                if n >= BIG and fd is not None and self._descend(desc, fd):
                    inner_marked, inner_headed = self.message(src.pos + n, fd.message_type)
                    marked += tag_raw + _varint(len(inner_marked)) + inner_marked
                    headed += tag_raw + _varint(len(inner_headed)) + inner_headed
                    continue
                if n >= BIG and fd is not None and fd.type == _TYPE_STRING:
                    marker, head = self._string(n)
                    marked += tag_raw + _varint(len(marker)) + marker
                    headed += tag_raw + _varint(len(head)) + head
                    continue
                if n > SMALL_CAP:
                    raise _Fallback
                raw = tag_raw + n_raw + src.take(n)
            else:
                raise _Fallback  # groups: the ordinary path
            marked += raw
            headed += raw
            if len(marked) > SMALL_CAP:
                raise _Fallback
        if end is not None and src.pos != end:
            raise _Fallback
        return bytes(marked), bytes(headed)

    @staticmethod
    def _descend(owner: Descriptor, fd: FieldDescriptor) -> bool:
        """A sub-message the tree shows field by field (not a map, a Value or a well-known type)."""
        mt = fd.message_type
        return (fd.type == _TYPE_MESSAGE and mt is not None and not mt.GetOptions().map_entry
                and mt.full_name not in _WELL_KNOWN and (owner.full_name, fd.name) not in VALUE_BYTES)

    def _string(self, n: int) -> tuple[bytes, bytes]:
        """Check a long string is UTF-8 (as the protobuf runtime would) and keep its head."""
        start = self.src.pos
        check = codecs.getincrementaldecoder("utf-8")()
        head = b""
        try:
            for piece in self.src.pieces(n):
                check.decode(piece)
                if len(head) < KEEP:
                    head += piece[:KEEP - len(head)]
            check.decode(b"", final=True)
        except UnicodeDecodeError:
            raise _Fallback from None
        while head and (head[-1] & 0xC0) == 0x80:  # a character cut at the edge is left out whole
            head = head[:-1]
        if head and head[-1] >= 0xC0:
            head = head[:-1]
        marker = f"\ue000{self.token}:{len(self.spans)}\ue000"
        self.spans[marker] = (start, n)
        return marker.encode(), head


def _gzip_size(payload: bytes) -> int:
    return int.from_bytes(payload[-4:], "little") if len(payload) >= 4 else 0


def _streamed_fields(decoder: Decoder, kind: str, payload: bytes, msg_type: str | None,
                     flags: int) -> tuple[JsonObject, dict[str, tuple[int, int]]] | None:
    """The tree (long strings as markers) and where each marker's string is, or None."""
    if kind != COMPRESSED or not flags & FLAG_COMPRESSED or not msg_type or _gzip_size(payload) < STREAM_FROM:
        return None
    if not decoder.schema.has(msg_type):
        return None
    walk = _Walk(_Inflating(payload, LOOK_LIMIT), os.urandom(8).hex())
    try:
        marked, headed = walk.message(None, decoder.schema.descriptor(msg_type))
    except _Fallback:
        return None
    walk.size = walk.src.pos
    return _finish(decoder, walk, marked, headed, msg_type) if walk.spans else None


def _finish(decoder: Decoder, walk: _Walk, marked: bytes, headed: bytes,
            msg_type: str) -> tuple[JsonObject, dict[str, tuple[int, int]]] | None:
    try:
        decoder.info(msg_type).cls.FromString(marked)
    except DecodeError:
        return None  # the lenient tree (which depends on the full size): the ordinary path
    inner = decoder.classify_carried(headed, msg_type)
    if inner.kind not in _HEAD_ONLY or inner.meta:
        return None
    tree = fields_of(decoder, inner.kind, marked, msg_type, 0)
    head = {"$inflated": {"kind": inner.kind, "summary": inner.summary, "size": walk.size}}
    return ({**head, **tree} if isinstance(tree, dict) else {**head, "$value": tree}), walk.spans


def dump_frame(decoder: Decoder, row: JsonObject, kind: str, payload: bytes, msg_type: str | None,
               flags: int, out: TextIO) -> None:
    """Write ``{**row, "fields": <named tree>}`` as ``json.dump(..., ensure_ascii=False, default=str)``
    would, streaming the long strings of a big compressed frame."""
    streamed = _streamed_fields(decoder, kind, payload, msg_type, flags)
    if streamed is None:
        # json.dump writes in pieces: a frame inflated on view is not copied again into one
        # string before it reaches ``out``.
        json.dump({**row, "fields": fields_of(decoder, kind, payload, msg_type, flags)}, out,
                  ensure_ascii=False, default=str)
        return
    tree, spans = streamed
    quoted = {_ENCODE(marker): span for marker, span in spans.items()}
    for chunk in json.JSONEncoder(ensure_ascii=False, default=str).iterencode({**row, "fields": tree}):
        for marker, span in quoted.items():
            at = chunk.find(marker)
            if at >= 0:
                out.write(chunk[:at])
                _write_string(payload, span, out)
                chunk = chunk[at + len(marker):]
        out.write(chunk)


def _write_string(payload: bytes, span: tuple[int, int], out: TextIO) -> None:
    """Inflate again up to the string at ``span`` and write it JSON-quoted, a piece at a time
    (pieces end on character boundaries, so the escapes are the encoder's own)."""
    start, n = span
    src = _Inflating(payload, LOOK_LIMIT)
    for _ in src.pieces(start):
        pass
    text = codecs.getincrementaldecoder("utf-8")()
    out.write('"')
    for piece in src.pieces(n):
        out.write(_ENCODE(text.decode(piece))[1:-1])
    out.write('"')
