"""Protobuf base-128 varints and top-level fields, for code that walks or builds wire bytes by hand.

Three readers for three callers: ``read_varint`` raises on a truncated or over-long varint (walkers
treat that as "not protobuf"); ``read_length_varint`` never raises and caps at 5 bytes (the
decoder's byte-level fast paths read length prefixes with it, where an exception would cost more
than the sentinel check); ``top_level_fields`` lists a message's (number, value) pairs without a
schema.
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


def read_length_varint(p: bytes, i: int) -> tuple[int, int]:
    """(value, next position) of the varint at ``p[i]``; (-1, len + 2) when truncated or > 5 bytes.

    The error position lies past the end even after adding the -1, so callers' ``pos + len == n``
    and ``pos + len > n`` checks reject it without a separate test.
    """
    n = len(p)
    if i < n:
        b = p[i]
        if b < 0x80:
            return b, i + 1
        value = b & 0x7F
        # two bytes (lengths 128 B … 16 KiB: KV blobs, long deltas) without the loop: the fast
        # paths read several such lengths per frame
        if i + 1 < n:
            b = p[i + 1]
            if b < 0x80:
                return value | b << 7, i + 2
        shift = 7
        for j in range(i + 1, min(i + 5, n)):
            b = p[j]
            value |= (b & 0x7F) << shift
            if b < 0x80:
                return value, j + 1
            shift += 7
    return -1, n + 2


def top_level_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (field number, value) pairs of a protobuf message: varints as ints, length-delimited
    fields as bytes (fixed-width fields are skipped); [] when the bytes are not a message."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    try:
        while pos < len(buf):
            key, pos = read_varint(buf, pos)
            num, wire = key >> 3, key & 7
            if wire == 0:
                v, pos = read_varint(buf, pos)
                out.append((num, v))
            elif wire == 2:
                n, pos = read_varint(buf, pos)
                if pos + n > len(buf):
                    return []
                out.append((num, buf[pos:pos + n]))
                pos += n
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                return []
    except IndexError:
        return []
    return out


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
