"""Source: ``workbench import FILE.flows`` (mitmproxy flow files), with hostile flows.

Invariants (invariants.py): (a) no traceback / exit 2 naming the file; (b) every envelope of every
flow stored (or the import exits 2 saying why: only a timestamp past year 9999 is bad input here);
(c) the canary in every credential header and field, plain and gzip'd, inflated or kept
``compressed`` (tiny per-frame budget), is on no file nor in any view; (d) a content-encoding
bomb stays within the RSS budget.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from formats import nested_tnetstring, to_flow, write_flows
from hypothesis import given
from hypothesis import strategies as st
from invariants import canary_nowhere, clean_exit, query, view_outputs
from strategies import (
    RSS_BUDGET_KIB,
    Exchange,
    bomb_sizes,
    depths,
    exchanges,
    gzip_zeros,
    hostile,
    out_of_range,
    tried,
)
from support import WORKBENCH, env_without_proxy, run_measured, run_workbench

pytestmark = pytest.mark.slow
BOMB_SECONDS = 120  # a bounded import of a ~1.5 MB file takes seconds; an unbounded one, minutes

# A per-frame budget below every generated message: each gzip'd frame stays kind ``compressed``.
TINY_BUDGET = "0.00005"


def _import(path: Path, db: Path, tiny_budget: bool) -> tuple[dict[str, object], object]:
    env = env_without_proxy({"WORKBENCH_INFLATE_FRAME_MB": TINY_BUDGET} if tiny_budget else None)
    r = run_workbench("import", str(path), "--db", str(db), "--json", env=env)
    return {"rc": r.returncode, "err": r.stderr, "out": r.stdout}, env


def _frames_of_flow(db: Path, flow_id: str) -> int:
    rows = query(db, "SELECT count(f.seq) FROM sessions s LEFT JOIN frames f USING (session_id) "
                     "WHERE s.meta->>'flow_id' = ?", flow_id)
    return int(rows[0][0]) if rows else 0


@hostile(12)
@given(batch=st.lists(exchanges(), min_size=1, max_size=3), tiny_budget=st.booleans())
def test_flow_import_hostile_exchanges(batch: list[Exchange], tiny_budget: bool,
                                       scratch: Callable[[], Path]) -> None:
    tried("test_flow_import_hostile_exchanges")
    d = scratch()
    flows = [to_flow(ex) for ex in batch]
    path, db = d / "in" / "hostile.flows", d / "run" / "capture.duckdb"
    write_flows(path, flows)
    r, _ = _import(path, db, tiny_budget)
    clean_exit(r, [path], "workbench import (flow)")  # (a)
    if r["rc"] == 2:
        assert any(out_of_range(ex.timestamp) for ex in batch), \
            f"a valid flow file was refused: {r['err'][-1500:]}"
    else:  # (b)
        for f, ex in zip(flows, batch, strict=True):
            got = _frames_of_flow(db, f.id)
            assert got >= ex.frames_in, f"flow {f.id}: {ex.frames_in} envelopes went in, {got} frames stored"
    outputs = view_outputs(db, d / "run" / "out") if db.exists() else {}
    for ex in batch:  # (c)
        canary_nowhere(d / "run", ex.canary, {**outputs, "import --json": str(r["out"]) + str(r["err"])})


@hostile(2)
@given(depth=depths)
def test_flow_import_deep_tnetstring(depth: int, scratch: Callable[[], Path]) -> None:
    tried("test_flow_import_deep_tnetstring")
    d = scratch()
    path = d / "in" / "deep.flows"
    path.write_bytes(nested_tnetstring(depth))
    r = run_workbench("import", str(path), "--db", str(d / "run" / "c.duckdb"), "--format", "flow")
    clean_exit(r, [path], f"workbench import of a tnetstring nested {depth} deep")


@hostile(2)
@given(ex=exchanges(timestamps_too=False), inflated_mib=bomb_sizes)
def test_flow_import_content_encoding_bomb(ex: Exchange, inflated_mib: int, scratch: Callable[[], Path]) -> None:
    tried("test_flow_import_content_encoding_bomb")
    d = scratch()
    path, db = d / "in" / "bomb.flows", d / "run" / "c.duckdb"
    write_flows(path, [to_flow(ex, content_encoding_body=gzip_zeros(inflated_mib))])
    r = run_measured([*WORKBENCH, "import", str(path), "--db", str(db)], env=env_without_proxy(),
                     timeout=BOMB_SECONDS, address_space=4 * RSS_BUDGET_KIB * 1024)
    assert r["rc"] != "timeout", f"import of a {path.stat().st_size}-byte flow file ran past {BOMB_SECONDS} s"
    clean_exit(r, [path], "workbench import (content-encoding bomb)")  # (a)
    assert r["rss_kib"] < RSS_BUDGET_KIB, \
        f"import of a {path.stat().st_size}-byte file peaked at {r['rss_kib'] // 1024} MiB"  # (d)
