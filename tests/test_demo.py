"""README command 1: the demo runs end to end (real sim, real mitmdump capture, real DuckDB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def test_demo_runs_and_diagnoses_every_scenario(tmp_path: Path) -> None:
    db = tmp_path / "captures" / "demo.duckdb"
    proc = subprocess.run([sys.executable, "-m", "workbench", "demo", "--no-tui", "--db", str(db)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[5/5] done" in proc.stdout
    con = duckdb.connect(str(db), read_only=True)
    try:
        sessions = con.execute("SELECT count(*), count(DISTINCT transport) FROM sessions").fetchone()
        codes = {r[0] for r in con.execute("SELECT DISTINCT code FROM findings WHERE severity <> 'note'").fetchall()}
        notes = {r[0] for r in con.execute("SELECT DISTINCT code FROM findings WHERE severity = 'note'").fetchall()}
        # clean: no warning or error (notes say what did no harm and never count)
        clean = con.execute(
            "SELECT count(*) FROM sessions s WHERE status = 'complete' AND NOT EXISTS "
            "(SELECT 1 FROM findings f WHERE f.session_id = s.session_id AND f.severity <> 'note')").fetchone()
        both = con.execute("SELECT count(DISTINCT direction) FROM frames").fetchone()
        completions = con.execute("SELECT args_completion, args_merged FROM tool_calls "
                                  "WHERE args_completion IS NOT NULL").fetchall()
    finally:
        con.close()
    assert sessions is not None
    assert sessions[0] >= 7
    assert sessions[1] >= 2
    assert {"heartbeat_loop", "missing_stream_close", "args_cumulative_snapshots",
            "kv_only_response", "server_error"} <= codes
    # the lossy completion is a server habit: visible in tool_calls, a finding only when a client replays it,
    # a note otherwise
    assert any(set(json.loads(m)) - set(json.loads(c)) for c, m in completions if c.startswith("{"))
    assert "completion_args_lossy" in notes
    assert clean is not None
    assert clean[0] >= 3  # text, tool flow over Run and over RunSSE
    assert both == (2,)
    # the demo never leaves the capture's live-reader sidecar behind
    assert not Path(str(db) + ".live.json").exists()
