"""Every inflation goes through one budget (issue 20, item 1): HTTP content-codings included.

``decode_limited`` undoes gzip, deflate (zlib and raw), br and zstd to at most a limit; past it
``InflateOverBudget``, broken input ``ValueError``, nothing else. ``SessionInflate.decode``
charges the result to the session and import totals like an envelope's gzip.
"""

from __future__ import annotations

import gzip
import zlib

import brotli
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.wire.inflate import (
    CODINGS,
    MIB,
    InflateBudget,
    InflateOverBudget,
    codings_of,
    decode_limited,
    inflate_document,
    use_budget,
)

TEXT = b"agent says hello " * 500


def _raw_deflate(data: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return c.compress(data) + c.flush()


ENCODERS = {
    "gzip": gzip.compress,
    "x-gzip": gzip.compress,
    "deflate": zlib.compress,
    "zlib": zlib.compress,
    "br": brotli.compress,
    "zstd": lambda d: zstandard.ZstdCompressor().compress(d),
}


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_each_coding_inflates_within_its_limit_and_is_refused_past_it(coding: str) -> None:
    packed = ENCODERS[coding](TEXT)
    assert decode_limited(packed, coding, len(TEXT)) == TEXT
    assert decode_limited(packed, coding.upper(), len(TEXT) + 1) == TEXT  # codings are case-insensitive
    with pytest.raises(InflateOverBudget):
        decode_limited(packed, coding, len(TEXT) - 1)


def test_raw_deflate_and_gzip_members_are_understood() -> None:
    assert decode_limited(_raw_deflate(TEXT), "deflate", MIB) == TEXT
    assert decode_limited(gzip.compress(b"one ") + gzip.compress(b"two"), "gzip", MIB) == b"one two"


@pytest.mark.parametrize("coding", sorted(ENCODERS))
def test_broken_data_is_a_value_error(coding: str) -> None:
    packed = ENCODERS[coding](TEXT)
    with pytest.raises(ValueError) as info:
        decode_limited(packed[: len(packed) // 2], coding, MIB)
    assert not isinstance(info.value, InflateOverBudget)


def test_unknown_coding_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown content coding 'compress'.*gzip"):
        decode_limited(b"x", "compress", MIB)
    assert set(CODINGS) >= {"gzip", "deflate", "br", "zstd"}


@pytest.mark.parametrize("coding", ["gzip", "br", "zstd"])
def test_a_bomb_stops_at_the_limit(coding: str) -> None:
    bomb = ENCODERS[coding](bytes(64 * MIB))  # a few KB that inflate to 64 MiB of zeros
    assert len(bomb) < 200_000
    with pytest.raises(InflateOverBudget, match="past 1 MiB"):
        decode_limited(bomb, coding, MIB)


def test_codings_of_lists_them_in_the_order_applied() -> None:
    assert codings_of("gzip") == ["gzip"]
    assert codings_of(" GZIP , br ") == ["gzip", "br"]
    assert codings_of("identity") == []
    assert codings_of(None) == []


def test_layered_codings_are_undone_last_first_and_charged_once() -> None:
    budget = InflateBudget.for_import(frame=MIB, session=4 * MIB, total=8 * MIB)
    packed = brotli.compress(gzip.compress(TEXT))  # content-encoding: gzip, br
    s = budget.session("s")
    assert s.decode(packed, ["gzip", "br"]) == TEXT
    assert s.used == len(TEXT)
    assert budget.used == len(TEXT)


def test_decode_names_the_budget_that_stopped_it() -> None:
    budget = InflateBudget.for_import(frame=MIB, session=3 * MIB, total=5 * MIB)
    two = gzip.compress(bytes(2 * MIB))
    with pytest.raises(InflateOverBudget, match="1 MiB per-frame inflate budget.*--inflate-frame-mb"):
        budget.session("a").decode(two, ["gzip"])
    # a whole document (.zhar) is not held to the per-frame limit; the session limit still holds
    a = budget.session("a")
    assert len(a.decode(two, ["gzip"], per_frame=False)) == 2 * MIB
    with pytest.raises(InflateOverBudget, match="3 MiB per-session inflate budget"):
        a.decode(two, ["gzip"], per_frame=False)
    b = budget.session("b")
    assert len(b.decode(two, ["gzip"], per_frame=False)) == 2 * MIB
    with pytest.raises(InflateOverBudget, match="5 MiB per-import inflate budget.*--inflate-import-mb"):
        budget.session("c").decode(two, ["gzip"], per_frame=False)


def test_a_whole_document_inflates_past_the_frame_limit_and_says_why_not_as_a_document() -> None:
    """``inflate_document`` (a gzipped fixture, a .zhar): the session limit holds, the per-frame one
    does not; refused, it names the budget without the frame's remedy, and broken input says
    what the caller calls it."""
    two = gzip.compress(bytes(2 * MIB))
    with use_budget(InflateBudget.for_import(frame=MIB, session=3 * MIB)):
        assert inflate_document(two, "gzip", what="the fixture", corrupt="corrupt gzip") == bytes(2 * MIB)
    with use_budget(InflateBudget.for_import(frame=MIB, session=MIB)), pytest.raises(InflateOverBudget) as over:
        inflate_document(two, "gzip", what="the fixture", corrupt="corrupt gzip")
    assert "the fixture" in str(over.value) and "1 MiB per-session inflate budget" in str(over.value)
    assert "kept compressed" not in str(over.value)
    with pytest.raises(ValueError, match="^does not inflate: ") as bad:
        inflate_document(b"\x1f\x8b not gzip", "gzip", what="the fixture", corrupt="does not inflate")
    assert not isinstance(bad.value, InflateOverBudget)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2048), coding=st.sampled_from(sorted(ENCODERS)), limit=st.integers(0, 4096),
       packed=st.booleans())
def test_any_input_inflates_within_the_limit_or_raises_value_error(data: bytes, coding: str, limit: int,
                                                                   packed: bool) -> None:
    """Hostile bytes (valid streams and garbage) never raise anything but ValueError (of which
    InflateOverBudget is one), and never return more than the limit."""
    src = ENCODERS[coding](data) if packed else data
    try:
        out = decode_limited(src, coding, limit)
    except ValueError:
        assert not packed or len(data) > limit
        return
    assert len(out) <= limit
    if packed:
        assert out == data
