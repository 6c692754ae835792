"""The incremental analyzer, a capture in progress read live, and the CLI commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_helpers import SessionBuilder, analysis_codes
from support import run_workbench

from workbench.analysis import IncrementalAnalyzer, analyze_session
from workbench.cli import main
from workbench.store.db import Store
from workbench.store.reader import LiveService, open_reader


def _stalled(store: Store, sid: str = "live", status: str = "open") -> tuple[int, int]:
    b = SessionBuilder(store, sid, status=status)
    b.run_request()
    e = b.exec_shell(2, "sleep 9", "c1")
    r = b.shell_result(2)
    for _ in range(8):
        b.heartbeat()
    b.done()
    return e, r


def test_incremental_matches_batch_and_waits_for_answers(analysis_store: Store) -> None:
    e, r = _stalled(analysis_store)
    rows = analysis_store.query("SELECT * FROM frames WHERE session_id = 'live' ORDER BY seq")
    inc = IncrementalAnalyzer("live")
    assert inc.feed(rows.slice(0, r + 1)) == r + 1
    assert inc.findings() == []  # the stream_close may still be on its way
    inc.feed(rows.slice(0, r + 4))  # overlapping page: old rows are ignored
    assert inc.last_seq == r + 3
    inc.feed(rows.to_pylist()[r + 4:])  # dicts work as well
    live = analysis_codes(inc.findings())
    assert live == ["heartbeat_loop", "missing_stream_close"]  # not "ended": the capture goes on
    final = analysis_codes(inc.findings(final=True))
    assert final == ["heartbeat_loop", "missing_stream_close", "stream_ended_without_turn_end"]
    batch = analyze_session(analysis_store, "live")
    assert analysis_codes(batch.findings) == final
    assert [f.evidence for f in inc.findings(final=True)] == [f.evidence for f in batch.findings]


@pytest.mark.slow
def test_analysis_through_a_live_capture_reader(tmp_path: Path, capsys) -> None:
    db = tmp_path / "live.duckdb"
    store = Store(db)
    _stalled(store)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        reader = open_reader(db)
        assert reader.live
        res = analyze_session(reader, "live")
        assert analysis_codes(res.findings) == ["heartbeat_loop", "missing_stream_close"]
        rc = main(["diagnose", "live", "--db", str(db)])
        out = capsys.readouterr().out
        assert rc == 1
        assert "findings not written" in out
        assert "heartbeat_loop" in out
    finally:
        svc.stop()
        store.close()


def test_cli_diagnose_exit_codes_json_and_written_findings(tmp_path: Path, capsys) -> None:
    db = tmp_path / "c.duckdb"
    store = Store(db)
    ok = SessionBuilder(store, "ok-1")
    ok.run_request()
    ok.healthy_shell_turn()
    ok.text("fine")
    ok.turn_ended()
    ok.done()
    _stalled(store, "bad-1", status="incomplete")
    store.close()

    assert main(["diagnose", "ok", "--db", str(db)]) == 0
    assert "clean" in capsys.readouterr().out
    assert main(["diagnose", "--all", "--db", str(db)]) == 1
    out = capsys.readouterr().out
    assert "ERROR   heartbeat_loop" in out
    assert "evidence:" in out
    assert "fix:" in out
    assert main(["diagnose", "bad", "--json", "--db", str(db)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["session_id"] == "bad-1"
    assert doc["failed"]
    assert {f["code"] for f in doc["findings"]} == {"heartbeat_loop", "missing_stream_close",
                                                     "stream_ended_without_turn_end"}
    assert main(["diagnose", "bad", "--heartbeats", "50", "--no-write", "--db", str(db)]) == 1
    out = capsys.readouterr().out
    assert "missing_stream_close" in out
    assert "heartbeat_loop" not in out
    assert main(["diagnose", "bad", "--heartbeats", "0", "--db", str(db)]) == 2
    assert main(["diagnose", "--db", str(db)]) == 2
    assert main(["diagnose", "nope", "--db", str(db)]) == 2
    assert main(["diagnose", "--all", "--db", str(tmp_path / "missing.duckdb")]) == 2
    capsys.readouterr()

    reader = open_reader(db)
    codes = reader.query("SELECT code FROM findings WHERE session_id = 'bad-1' ORDER BY code").column(0).to_pylist()
    reader.close()
    assert codes == ["heartbeat_loop", "missing_stream_close", "stream_ended_without_turn_end"]

    assert main(["tools", "ok", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "call-1  shell  completed" in out
    assert "naive:" in out
    assert main(["blobs", "bad", "--json", "--db", str(db)]) == 0
    assert capsys.readouterr().out == ""  # no KV traffic in that session


@pytest.mark.slow
def test_cli_as_a_process(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    store = Store(db)
    _stalled(store, "bad-2", status="incomplete")
    store.close()
    proc = run_workbench("diagnose", "--all", "--db", str(db), timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "missing_stream_close" in proc.stdout


def test_live_exec_heartbeats_mean_still_running(analysis_store: Store) -> None:
    from workbench.schema import pb

    b = SessionBuilder(analysis_store, "busy", status="open")
    b.run_request()
    b.exec_shell(3, "make", "c3")
    for _ in range(8):
        b.heartbeat()
        b.client(exec_client_control_message=pb.ExecClientControlMessage(heartbeat=pb.ExecClientHeartbeat(id=3)))
    b.done()
    rows = analysis_store.query("SELECT * FROM frames WHERE session_id = 'busy' ORDER BY seq")
    inc = IncrementalAnalyzer("busy")
    inc.feed(rows)
    assert inc.findings() == []
    final = {f.code: f for f in inc.findings(final=True)}
    assert "unanswered_exec" in final
    assert "still running" in final["unanswered_exec"].message


def test_diagnose_stores_findings_past_a_stale_sidecar(tmp_path: Path, capsys) -> None:
    """A sidecar left by a killed capture (its pid now some other running process) made diagnose
    treat the database as held and never store findings; only a proved capture holds it now."""
    import os

    from support import free_port

    from workbench.store.reader import sidecar_path

    db = tmp_path / "s.duckdb"
    store = Store(db)
    _stalled(store, "bad-1", status="incomplete")
    store.close()
    side = sidecar_path(db)
    side.write_text(json.dumps({"url": f"http://127.0.0.1:{free_port()}", "token": "t", "pid": os.getpid()}))
    os.chmod(side, 0o600)
    assert main(["diagnose", "--all", "--db", str(db)]) == 1
    out = capsys.readouterr().out
    assert "heartbeat_loop" in out
    assert "findings not written" not in out
    reader = open_reader(db)
    codes = reader.query("SELECT code FROM findings WHERE session_id = 'bad-1' ORDER BY code").column(0).to_pylist()
    reader.close()
    assert codes == ["heartbeat_loop", "missing_stream_close", "stream_ended_without_turn_end"]


def test_diagnose_keeps_tool_call_times_past_year_9999(analysis_store: Store, capsys) -> None:
    """A hostile import can stamp frames past what Python's datetime holds (CI's hostile Parquet
    property found `diagnose --all` ending in a traceback in the tool-call rows): the tool calls are
    stored with DuckDB's time, for a call the model announced and for an exec alone."""
    b = SessionBuilder(analysis_store, "far-model")
    b.run_request()
    b.healthy_shell_turn()
    b.turn_ended()
    b.end_stream()
    b.done()
    alone = SessionBuilder(analysis_store, "far-exec")
    alone.run_request()
    alone.exec_shell(4, "ls")
    alone.shell_result(4)
    alone.stream_close(4)
    alone.turn_ended()
    alone.end_stream()
    alone.done()
    analysis_store.con.execute("UPDATE frames SET ts = TIMESTAMPTZ '10000-01-01 00:00:00+00' + to_microseconds(seq)")
    analysis_store.con.execute("UPDATE sessions SET started_at = TIMESTAMP '10000-01-01 00:00:00', "
                               "ended_at = TIMESTAMP '10000-01-01 00:00:01'")
    db = analysis_store.path
    analysis_store.close()
    assert main(["diagnose", "--all", "--json", "--db", str(db)]) in (0, 1)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    reader = open_reader(db)
    rows = reader.query("SELECT session_id, CAST(started_at AS VARCHAR), CAST(ended_at AS VARCHAR) FROM tool_calls "
                        "ORDER BY session_id").to_pylist()
    reader.close()
    assert [r["session_id"] for r in rows] == ["far-exec", "far-model"], rows
    for r in rows:
        assert all(str(v).startswith("10000-01-01 00:00:00") for k, v in r.items() if k != "session_id"), r
