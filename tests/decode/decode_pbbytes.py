"""Hand-rolled protobuf bytes for tests: unknown fields, odd shapes and malformed input the
generated classes cannot produce."""

from __future__ import annotations

from workbench.wire.varint import encode_varint as varint


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def ld(number: int, data: bytes | str) -> bytes:
    """A length-delimited field."""
    raw = data.encode() if isinstance(data, str) else data
    return tag(number, 2) + varint(len(raw)) + raw


def vi(number: int, value: int) -> bytes:
    """A varint field."""
    return tag(number, 0) + varint(value)
