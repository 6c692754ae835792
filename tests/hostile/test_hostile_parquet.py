"""Source: ``workbench import DIR`` of a Parquet export (``export --parquet`` layout) holding what our
export never would: credentials in clear in every credential header (session ``meta``) and field
(plain and gzip'd payloads), header text from non-UTF-8 bytes, times past year 9999, resets.

Invariants: (a) no traceback / exit 2 naming the folder (only a time past year 9999 may be
refused); (b) every frame row stored; (c) the canary on no file nor in any view or re-export.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from formats import fixture_document, write_parquet_export
from hypothesis import assume, given
from hypothesis import strategies as st
from invariants import canary_nowhere, clean_exit, query, view_outputs
from strategies import Exchange, exchanges, hostile, out_of_range, tried
from support import run_workbench

DUCKDB_MAX_SECONDS = 9.2e12

pytestmark = pytest.mark.slow


@hostile(6)
@given(batch=st.lists(exchanges(), min_size=1, max_size=3))
def test_parquet_import_hostile(batch: list[Exchange], scratch: Callable[[], Path]) -> None:
    # A Parquet export holds DuckDB timestamps (microseconds in 64 bits, up to year 294,246): a time
    # past that cannot be in one, so the rig does not try to write it.
    assume(all(abs(ex.timestamp) < DUCKDB_MAX_SECONDS for ex in batch))
    tried("test_parquet_import_hostile")
    d = scratch()
    src = d / "in" / "export"
    src.mkdir()
    docs = [fixture_document(ex, str(uuid.uuid4())) for ex in batch]
    rows = write_parquet_export(src, docs, [ex.timestamp for ex in batch])
    db = d / "run" / "capture.duckdb"
    r = run_workbench("import", str(src), "--db", str(db), "--json")
    clean_exit(r, [src], "workbench import (Parquet export)")  # (a)
    if r.returncode == 2:
        assert any(out_of_range(ex.timestamp) for ex in batch), f"an export was refused: {r.stderr[-1500:]}"
    else:
        got = query(db, "SELECT count(*) FROM frames")[0][0]
        assert got == rows, f"{rows} frame rows in the export, {got} stored"  # (b)
    outputs = view_outputs(db, d / "run" / "out") if db.exists() else {}
    for ex in batch:  # (c)
        canary_nowhere(d / "run", ex.canary, {**outputs, "import --json": r.stdout + r.stderr})
