"""Source: ``workbench import FILE.har`` and ``FILE.zhar`` (mitmproxy's zlib'd HAR), hostile entries.

Invariants: (a) no traceback / exit 2 naming the file (also for JSON nested 100k deep, in the
file and in format detection); (b) every envelope of every entry stored, unless the import exits 2
on a timestamp past year 9999; (c) the canary in every credential header and field, plain and
gzip'd, inflated or kept ``compressed``, on no file nor in any view; (d) a ``.zhar`` bomb within
the RSS budget.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from formats import deep_json, har_document, har_entry, zhar
from hypothesis import given
from hypothesis import strategies as st
from invariants import canary_nowhere, clean_exit, query, view_outputs
from strategies import (
    RSS_BUDGET_KIB,
    Exchange,
    bomb_sizes,
    depths,
    exchanges,
    hostile,
    out_of_range,
    tried,
    zlib_json_bomb,
)
from support import WORKBENCH, env_without_proxy, run_measured, run_workbench

from workbench.ingest.har import entry_hash

pytestmark = pytest.mark.slow
BOMB_SECONDS = 120  # a bounded import of a ~1.5 MB file takes seconds; an unbounded one, minutes
TINY_BUDGET = "0.00005"


@hostile(12)
@given(batch=st.lists(exchanges(), min_size=1, max_size=3), compressed_file=st.booleans(),
       tiny_budget=st.booleans())
def test_har_import_hostile_entries(batch: list[Exchange], compressed_file: bool, tiny_budget: bool,
                                    scratch: Callable[[], Path]) -> None:
    tried("test_har_import_hostile_entries")
    d = scratch()
    entries = [har_entry(ex) for ex in batch]
    data = har_document(entries)
    path = d / "in" / ("hostile.zhar" if compressed_file else "hostile.har")
    path.write_bytes(zhar(data) if compressed_file else data)
    db = d / "run" / "capture.duckdb"
    env = env_without_proxy({"WORKBENCH_INFLATE_FRAME_MB": TINY_BUDGET} if tiny_budget else None)
    r = run_workbench("import", str(path), "--db", str(db), "--json", env=env)
    clean_exit(r, [path], "workbench import (HAR)")  # (a)
    if r.returncode == 2:
        assert any(out_of_range(ex.timestamp) for ex in batch), f"a valid HAR was refused: {r.stderr[-1500:]}"
    else:  # (b)
        for entry, ex in zip(entries, batch, strict=True):
            sid = f"har-{entry_hash(entry)}"
            got = query(db, "SELECT count(*) FROM frames WHERE session_id = ?", sid)[0][0]
            assert got >= ex.frames_in, f"entry {sid}: {ex.frames_in} envelopes went in, {got} frames stored"
    outputs = view_outputs(db, d / "run" / "out") if db.exists() else {}
    for ex in batch:  # (c)
        canary_nowhere(d / "run", ex.canary, {**outputs, "import --json": r.stdout + r.stderr})


@hostile(4)
@given(depth=depths, where=st.sampled_from(["bare", "entries", "entry"]), compressed_file=st.booleans())
def test_har_import_deep_nesting(depth: int, where: str, compressed_file: bool, scratch: Callable[[], Path]) -> None:
    tried("test_har_import_deep_nesting")
    d = scratch()
    if where == "bare":  # format detection reads the first 64 KiB of `[[[…`
        data = deep_json(depth)
    elif where == "entries":
        data = b'{"log": {"version": "1.2", "entries": ' + deep_json(depth) + b"}}"
    else:
        data = b'{"log": {"version": "1.2", "entries": [{"request": ' + deep_json(depth, opener=b"{") + b"}]}}"
    path = d / "in" / ("deep.zhar" if compressed_file else "deep.har")
    path.write_bytes(zhar(data) if compressed_file else data)
    r = run_workbench("import", str(path), "--db", str(d / "run" / "c.duckdb"))
    clean_exit(r, [path], f"workbench import of JSON nested {depth} deep ({where})")


@hostile(2)
@given(inflated_mib=bomb_sizes)
def test_zhar_import_bomb(inflated_mib: int, scratch: Callable[[], Path]) -> None:
    tried("test_zhar_import_bomb")
    d = scratch()
    path = d / "in" / "bomb.zhar"
    path.write_bytes(zlib_json_bomb(inflated_mib))
    r = run_measured([*WORKBENCH, "import", str(path), "--db", str(d / "run" / "c.duckdb")],
                     env=env_without_proxy(), timeout=BOMB_SECONDS, address_space=4 * RSS_BUDGET_KIB * 1024)
    assert r["rc"] != "timeout", f"import of a {path.stat().st_size}-byte .zhar ran past {BOMB_SECONDS} s"
    clean_exit(r, [path], "workbench import (.zhar bomb)")  # (a)
    assert r["rss_kib"] < RSS_BUDGET_KIB, \
        f"import of a {path.stat().st_size}-byte .zhar peaked at {r['rss_kib'] // 1024} MiB"  # (d)
