"""README command 1: the demo runs end to end (real sim, real mitmdump capture, real DuckDB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from support import ProcessGroup, run_workbench, wait_until

from workbench.demo import DEMO_MARK, check_replaceable
from workbench.errors import CliError
from workbench.store.db import SessionInfo, Store

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def _users_capture(db: Path) -> None:
    with Store(db) as store:
        store.upsert_sessions([SessionInfo("users-own-session", source="capture", status="complete")])


def test_demo_runs_and_diagnoses_every_scenario(tmp_path: Path) -> None:
    db = tmp_path / "captures" / "demo.duckdb"
    _users_capture(db)  # --force: replaced even though the demo did not make it
    Path(str(db) + ".spool").write_text("old spool")
    proc = subprocess.run([sys.executable, "-m", "workbench", "demo", "--no-tui", "--force", "--db", str(db)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not Path(str(db) + ".spool").exists()
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
        marked = con.execute("SELECT count(*) FROM meta WHERE key = ?", [DEMO_MARK]).fetchone()
        users = con.execute("SELECT count(*) FROM sessions WHERE session_id = 'users-own-session'").fetchone()
    finally:
        con.close()
    assert marked == (1,) and users == (0,)
    check_replaceable(db)  # the demo's own database: the next demo may replace it without --force
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
    # the demo never leaves the capture's live-reader sidecar behind, nor its mitmproxy
    # configuration (a hidden .mitmproxy-demo/ folder once): only the database
    assert not Path(str(db) + ".live.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captures"]
    assert {p.name for p in db.parent.iterdir()} <= {"demo.duckdb", "demo.duckdb.wal"}


def _files(db: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(db.parent.iterdir()) if p.name.startswith(db.name)}


def test_demo_refuses_a_database_it_did_not_make(tmp_path: Path) -> None:
    """A user's capture (and its spool) at --db: exit 2 naming the file, nothing deleted or started."""
    db = tmp_path / "mine.duckdb"
    _users_capture(db)
    Path(str(db) + ".spool").write_text("unmerged frames")
    before = _files(db)
    done = run_workbench("demo", "--no-tui", "--db", str(db), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (f"workbench demo: --db {db}: not a demo database (it holds 1 sessions and "
                                   "frames); the demo replaces only a database it made; --force replaces it anyway")
    assert done.stdout == "" and _files(db) == before
    # --keep would append the demo to it: refused the same way
    assert run_workbench("demo", "--no-tui", "--keep", "--db", str(db), timeout=120).returncode == 2
    other = tmp_path / "notes.txt"
    other.write_text("not a database")
    done = run_workbench("demo", "--no-tui", "--db", str(other), timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"workbench demo: --db {other}: not a workbench capture "
                                                           "database"), done.stderr
    assert other.read_text() == "not a database"
    # a spool waiting for a database that is not there (yet) is a capture's, too
    lone = tmp_path / "gone.duckdb"
    Path(str(lone) + ".spool").write_text("frames")
    with pytest.raises(CliError, match="wait in .*gone.duckdb.spool"):
        check_replaceable(lone)


def test_demo_refuses_a_database_a_capture_is_writing(tmp_path: Path, processes: ProcessGroup) -> None:
    """A running capture that has recorded nothing yet: only its live sidecar says the file is in use."""
    db = tmp_path / "live.duckdb"
    capture = processes.server("capture", "--port", "0", "--db", str(db), "--confdir", str(tmp_path / "conf"))
    sidecar = Path(str(db) + ".live.json")
    wait_until(sidecar.exists, timeout=120, what="the capture's live sidecar")
    pid = json.loads(sidecar.read_text())["pid"]
    before = _files(db)
    done = run_workbench("demo", "--no-tui", "--db", str(db), timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (f"workbench demo: --db {db}: a capture (pid {pid}) is writing it; stop that "
                                   "capture or pick another --db; --force replaces it anyway")
    assert _files(db) == before and capture.returncode is None


def test_demo_refuses_a_database_another_process_holds(tmp_path: Path) -> None:
    """No sidecar (a writer that serves no live reads), but DuckDB's lock is held: refused too."""
    db = tmp_path / "held.duckdb"
    Store(db).close()
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); "
                               "print('holding', flush=True); sys.stdin.read()", str(db)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        done = run_workbench("demo", "--no-tui", "--db", str(db), timeout=120)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(30)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (f"workbench demo: --db {db}: another process holds it open (a capture writing "
                                   "it?); --force replaces it anyway")
    assert db.exists()
