from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from hypothesis import given
from hypothesis import strategies as st

from workbench.wire.varint import encode_varint, read_varint


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
