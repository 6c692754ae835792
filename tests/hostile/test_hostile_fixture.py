"""Source: ``workbench import FIXTURE.json[.gz]``, fixtures holding what a scrubbed export never
would: credentials in clear in every credential header and field (plain and gzip'd frames),
header bytes that are not UTF-8, timestamps past year 9999, resets.

Invariants: (a) no traceback / exit 2 naming the file (only a time past year 9999 may be refused);
(b) every frame of the fixture stored; (c) the canary on no file nor in any view or re-export.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from formats import fixture_document
from hypothesis import given
from hypothesis import strategies as st
from invariants import canary_nowhere, clean_exit, query, view_outputs
from strategies import Exchange, exchanges, hostile, out_of_range, tried
from support import run_workbench

pytestmark = pytest.mark.slow


@hostile(8)
@given(ex=exchanges(), gzipped=st.booleans())
def test_fixture_import_hostile(ex: Exchange, gzipped: bool, scratch: Callable[[], Path]) -> None:
    tried("test_fixture_import_hostile")
    d = scratch()
    sid = str(uuid.uuid4())
    doc = fixture_document(ex, sid)
    data = json.dumps(doc).encode()
    path = d / "in" / ("hostile.json.gz" if gzipped else "hostile.json")
    path.write_bytes(gzip.compress(data) if gzipped else data)
    db = d / "run" / "capture.duckdb"
    r = run_workbench("import", str(path), "--db", str(db), "--json")
    clean_exit(r, [path], "workbench import (fixture)")  # (a)
    if r.returncode == 2:
        assert out_of_range(ex.timestamp), f"a fixture was refused: {r.stderr[-1500:]}"
    else:
        got = query(db, "SELECT count(*) FROM frames WHERE session_id LIKE ?", sid + "%")[0][0]
        assert got == len(doc["frames"]), f"{len(doc['frames'])} frames in the fixture, {got} stored"  # (b)
    outputs = view_outputs(db, d / "run" / "out") if db.exists() else {}
    canary_nowhere(d / "run", ex.canary, {**outputs, "import --json": r.stdout + r.stderr})  # (c)
