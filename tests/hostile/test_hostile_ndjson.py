"""Sources: ``workbench import FILE.ndjson`` and ``workbench run -- CMD`` (cursor-agent stream-json).

Invariants: (a) no traceback; import exits 0/1 or 2 naming the file, and only for a line nested
past any parser's depth or a ``timestamp_ms`` no time type holds; ``run`` exits with CMD's code
and passes CMD's output through unchanged; (b) every line is a stored frame (lines in = frames
stored), and ``run`` leaves no session ``open``. Stream-json carries no credential field (the
schema's credentials are in the protobuf agent messages), so (c) is not asserted here.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from invariants import clean_exit, query
from strategies import NdjsonLine, hostile, ndjson_lines, tried
from support import WORKBENCH, env_without_proxy, run_workbench

pytestmark = pytest.mark.slow
SESSION = str(uuid.UUID(int=0x40E5))
lines_strategy = st.lists(ndjson_lines(SESSION), min_size=1, max_size=12)


@hostile(10)
@given(lines=lines_strategy)
def test_ndjson_import_hostile_lines(lines: list[NdjsonLine], scratch: Callable[[], Path]) -> None:
    tried("test_ndjson_import_hostile_lines")
    d = scratch()
    # the first line a valid event, so that the file is detected as stream-json whatever follows
    first = NdjsonLine(b'{"type":"system","subtype":"init","session_id":"%s"}' % SESSION.encode(), False)
    path, db = d / "in" / "hostile.ndjson", d / "run" / "c.duckdb"
    path.write_bytes(b"\n".join(ln.data for ln in [first, *lines]) + b"\n")
    r = run_workbench("import", str(path), "--db", str(db), "--format", "ndjson", "--json")
    clean_exit(r, [path], "workbench import (ndjson)")  # (a)
    if r.returncode == 2:
        assert any(ln.refusable for ln in lines), f"a stream-json file was refused: {r.stderr[-1500:]}"
        return
    stored = query(db, "SELECT count(*) FROM frames")[0][0]
    assert stored == len(lines) + 1, f"{len(lines) + 1} lines went in, {stored} frames stored"  # (b)


PRINTER = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read()); sys.stdout.flush(); sys.exit(int(sys.argv[2]))"


@hostile(8)
@given(lines=lines_strategy, code=st.sampled_from([0, 1, 3]))
def test_run_hostile_output(lines: list[NdjsonLine], code: int, scratch: Callable[[], Path]) -> None:
    tried("test_run_hostile_output")
    d = scratch()
    out_file, db = d / "in" / "out.ndjson", d / "run" / "c.duckdb"
    data = b"\n".join(ln.data for ln in lines) + b"\n"
    out_file.write_bytes(data)
    r = subprocess.run([*WORKBENCH, "run", "--db", str(db), "--", sys.executable, "-c", PRINTER, str(out_file),
                        str(code)], capture_output=True, env=env_without_proxy(), timeout=300,
                       stdin=subprocess.DEVNULL)
    err = r.stderr.decode(errors="replace")
    assert "Traceback" not in err, f"workbench run printed a traceback:\n{err[-3000:]}"  # (a)
    assert r.returncode == code, f"workbench run exited {r.returncode}, the command {code}:\n{err[-1500:]}"
    assert r.stdout == data, "workbench run did not pass the command's output through unchanged"
    stored = query(db, "SELECT count(*) FROM frames")[0][0]
    assert stored == len(lines), f"{len(lines)} lines printed, {stored} frames recorded"  # (b)
    open_ = query(db, "SELECT session_id FROM sessions WHERE status = 'open'")
    assert not open_, f"sessions left open after the command ended: {open_}"
