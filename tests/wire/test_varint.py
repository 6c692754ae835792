from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st

from workbench.wire.varint import encode_varint, read_length_varint, read_varint, top_level_fields


@given(st.integers(min_value=0, max_value=(1 << 64) - 1), st.binary(max_size=4))
def test_varint_round_trip_matches_protobuf(value: int, tail: bytes) -> None:
    # UninterpretedOption.positive_int_value is a uint64 (field 4): the real encoder is the reference
    ref = descriptor_pb2.UninterpretedOption(positive_int_value=value).SerializeToString()
    enc = encode_varint(value)
    assert ref == b"\x20" + enc  # field 4, wire type 0
    assert read_varint(b"\x00" + enc + tail, 1) == (value, 1 + len(enc))


def test_read_varint_truncated_and_overlong_raise_index_error() -> None:
    with pytest.raises(IndexError):
        read_varint(b"\x96", 0)
    with pytest.raises(IndexError, match="too long"):
        read_varint(b"\xff" * 11, 0)


def test_encode_small_values() -> None:
    assert encode_varint(0) == b"\x00"
    assert encode_varint(150) == b"\x96\x01"


@given(st.binary(max_size=12), st.integers(0, 12))
def test_the_length_reader_agrees_with_read_varint_up_to_five_bytes(data: bytes, at: int) -> None:
    value, pos = read_length_varint(data, at)
    try:
        expected, end = read_varint(data, at)
    except IndexError:
        expected, end = -1, -1
    if 0 <= end - at <= 5:
        assert (value, pos) == (expected, end)
    else:  # truncated, or longer than a length prefix may be: a position past the end
        assert value == -1 and pos > len(data)


@given(st.lists(st.tuples(st.integers(1, 2000), st.one_of(st.integers(0, 2**63), st.binary(max_size=40))),
                max_size=8))
def test_top_level_fields_read_back_what_was_written(fields: list[tuple[int, int | bytes]]) -> None:
    buf = b""
    for num, value in fields:
        if isinstance(value, int):
            buf += encode_varint(num << 3) + encode_varint(value)
        else:
            buf += encode_varint(num << 3 | 2) + encode_varint(len(value)) + value
    assert top_level_fields(buf) == fields
    assert top_level_fields(b"\x0a\x05ab") == []  # a length past the end: not a message
