"""Reading ``GetUsableModels`` answers (the overlay does not model the response message)."""

from __future__ import annotations

from workbench.wire.varint import read_varint


def model_ids(body: bytes) -> list[str]:
    """Model ids from a GetUsableModels answer, read schemalessly: each top-level length-delimited
    field 1 is a model whose own field 1 is its id."""
    ids: list[str] = []
    for num, value in _fields(body):
        if num == 1 and isinstance(value, bytes):
            inner = [v for n, v in _fields(value) if n == 1 and isinstance(v, bytes)]
            if inner:
                ids.append(inner[0].decode("utf-8", "replace"))
    return ids


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (number, value) pairs; [] when the bytes are not a protobuf message."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    try:
        while pos < len(buf):
            tag, pos = read_varint(buf, pos)
            num, wt = tag >> 3, tag & 7
            if wt == 0:
                v, pos = read_varint(buf, pos)
                out.append((num, v))
            elif wt == 2:
                n, pos = read_varint(buf, pos)
                if pos + n > len(buf):
                    return []
                out.append((num, buf[pos:pos + n]))
                pos += n
            elif wt == 1:
                pos += 8
            elif wt == 5:
                pos += 4
            else:
                return []
    except IndexError:
        return []
    return out
