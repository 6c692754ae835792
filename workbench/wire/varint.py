"""Protobuf base-128 varints for code that walks or builds wire bytes by hand.

The decoder's hot path keeps its own non-raising reader (``workbench.decode.classify._uvarint``):
it signals truncation with a sentinel and caps at 5 bytes, which suits length prefixes only.
"""

from __future__ import annotations


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it) of the varint starting at ``buf[pos]``.

    Raises IndexError when the bytes end mid-varint or it runs past 64 bits, so a walker can
    treat both as "not protobuf" with one ``except``.
    """
    shift = result = 0
    while True:
        byte = buf[pos]
        result |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def encode_varint(value: int) -> bytes:
    """``value`` (non-negative) as a varint."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
