"""Sources: ``workbench decode`` (bytes from anyone) and ``workbench sql`` output (any value DuckDB
can return).

Invariants: (a) no traceback: exit 0/1, or 2 naming the input; (b) ``decode --batch``: one result
per input line, none dropped; (d) peak RSS within the budget with gzip bombs in the batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import clean_exit
from strategies import (
    RSS_BUDGET_KIB,
    depths,
    gzip_zeros,
    hostile,
    nested_protobuf,
    sql_literals,
    tried,
)
from support import WORKBENCH, env_without_proxy, run_measured, run_workbench

from workbench.wire.envelope import FLAG_COMPRESSED, header

pytestmark = pytest.mark.slow
# What decoding a few inputs of at most ~1.5 MB may take, with room for a loaded machine.
DECODE_SECONDS = 120


def _gzip_envelope_bomb(mib: int) -> bytes:
    body = gzip_zeros(mib)
    return header(FLAG_COMPRESSED, len(body)) + body


decode_inputs = st.one_of(
    st.binary(max_size=200),                                              # anything
    st.binary(max_size=60).map(lambda b: header(0, len(b)) + b),          # well framed, arbitrary payload
    st.binary(max_size=60).map(lambda b: header(FLAG_COMPRESSED, len(b)) + b),  # "gzip" that is not
    st.tuples(st.integers(0, 255), st.integers(0, 2**32 - 1)).map(lambda t: header(*t)),  # lying lengths
    depths.map(lambda d: header(0, len(nested_protobuf(d))) + nested_protobuf(d)),
    # past the per-frame budget (32 MiB), and past what a look at a kept frame inflates (256 MiB)
    st.sampled_from([64, 512]).map(_gzip_envelope_bomb),
)


@hostile(4)
@given(inputs=st.lists(st.tuples(decode_inputs, st.sampled_from(["client", "server"]),
                                 st.sampled_from(["run", "runsse", "bidi_append", "runpoll", "unary"])),
                       min_size=1, max_size=5))
def test_decode_hostile_bytes(inputs: list[tuple[bytes, str, str]], scratch: Callable[[], Path]) -> None:
    tried("test_decode_hostile_bytes")
    d = scratch()
    path = d / "in" / "batch.ndjson"
    path.write_text("".join(json.dumps({"hex": b.hex(), "direction": di, "transport": tr}) + "\n"
                            for b, di, tr in inputs))
    r = run_measured([*WORKBENCH, "decode", "--batch", "--file", str(path)], env=env_without_proxy(),
                     timeout=DECODE_SECONDS, address_space=4 * RSS_BUDGET_KIB * 1024)
    assert r["rc"] != "timeout", \
        f"decode --batch of {len(inputs)} inputs ({path.stat().st_size} bytes of hex) ran past {DECODE_SECONDS} s"
    clean_exit(r, [path], "workbench decode --batch")  # (a)
    assert r["rss_kib"] < RSS_BUDGET_KIB, f"decode peaked at {r['rss_kib'] // 1024} MiB"  # (d)
    if r["rc"] == 0:
        assert r["out_lines"] == len(inputs), f"{len(inputs)} inputs, {r['out_lines']} results"  # (b)


@hostile(2)
@given(data=decode_inputs.filter(lambda b: len(b) < 1_000_000), as_json=st.booleans())
def test_decode_hostile_file(data: bytes, as_json: bool, scratch: Callable[[], Path]) -> None:
    tried("test_decode_hostile_file")
    d = scratch()
    path = d / "in" / "frame.bin"
    path.write_bytes(data)
    r = run_workbench("decode", "--file", str(path), *(["--json"] if as_json else []))
    clean_exit(r, [path], "workbench decode --file")


@pytest.fixture(scope="module")
def empty_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    from workbench.ingest import open_store

    db = tmp_path_factory.mktemp("sql") / "c.duckdb"
    store = open_store(db)
    store.close()
    yield db


@hostile(8)
@given(literals=sql_literals, as_json=st.booleans())
def test_sql_prints_any_value(literals: list[str], as_json: bool, empty_db: Path) -> None:
    tried("test_sql_prints_any_value")
    query = "SELECT " + ", ".join(f"{lit} AS c{i}" for i, lit in enumerate(literals))
    r = run_workbench("sql", "--db", str(empty_db), *(["--json"] if as_json else []), query)
    clean_exit(r, [query], f"workbench sql {query!r}")
    assert r.returncode == 0, f"sql refused or failed on {query!r}: {r.stderr[-1000:]}"
