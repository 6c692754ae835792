"""Imports are idempotent: the same file twice, a file holding units twice, a grown file, an
interrupted import run again — each ends with exactly the frames of one clean import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest
from import_rig import Recording
from mitmproxy import io
from support import query_rows

from workbench.cli import main
from workbench.decode.classify import Frame
from workbench.export.parquet import export_parquet, import_parquet
from workbench.ingest import identity
from workbench.store.db import FrameBatch, Store, now_us
from workbench.store.recorder import Recorder
from workbench.store.schema import MIGRATIONS

SESSION_COLS = "session_id, source, transport, request_id, status, error, frame_count, started_at, ended_at, http_status"


def tables(db: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every column of every frame, and the sessions (without the file-specific meta)."""
    return (query_rows(db, "SELECT * FROM frames ORDER BY session_id, seq"),
            query_rows(db, f"SELECT {SESSION_COLS} FROM sessions ORDER BY session_id"))


def _import(db: Path, path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["import", str(path), "--db", str(db)]) == 0
    return capsys.readouterr().out.strip()


def _flows(path: Path) -> list[Any]:
    with path.open("rb") as fh:
        return list(io.FlowReader(fh).stream())


def _write_flows(path: Path, flows: list[Any]) -> Path:
    with path.open("wb") as fh:
        w = io.FlowWriter(fh)
        for f in flows:
            w.add(f)
    return path


@pytest.mark.slow
def test_same_flow_file_twice_adds_nothing(ingest_live: Recording, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "twice.duckdb"
    first = _import(db, ingest_live.flows, capsys)
    before = tables(db)
    second = _import(db, ingest_live.flows, capsys)
    n_sessions, n_frames = len(before[1]), len(before[0])
    assert first.startswith(f"imported {ingest_live.flows}: {n_sessions} sessions, {n_frames} frames")
    assert second == f"skipped {ingest_live.flows}: already imported ({n_sessions} sessions, {n_frames} frames)"
    assert tables(db) == before
    keys = [r["source_key"] for r in before[0]]
    assert all(k and k.startswith("flow:") for k in keys) and len(set(keys)) == len(keys)


@pytest.mark.slow  # needs the live recording (a sim and mitmdump)
def test_flows_held_twice_in_one_file_are_imported_once(ingest_live: Recording, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    flows = _flows(ingest_live.flows)
    doubled = _write_flows(tmp_path / "doubled.flows", flows + flows)
    clean, db = tmp_path / "clean.duckdb", tmp_path / "doubled.duckdb"
    _import(clean, ingest_live.flows, capsys)
    out = _import(db, doubled, capsys)
    assert f"{len(flows)} repeated copies of flows imported once" in out
    assert tables(db) == tables(clean)


@pytest.mark.slow
def test_grown_flow_file_adds_only_what_is_new(ingest_live: Recording, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """mitmdump -w saves a flow when it completes: a snapshot taken mid-run holds the appends of a
    RunSSE whose stream is not saved yet. The grown file brings the stream, and the appends join it."""
    flows = _flows(ingest_live.flows)
    streams = [i for i, f in enumerate(flows) if f.request.path.endswith("/RunSSE")]
    cut = streams[1] - 1  # the second RunSSE's appends so far, without the stream
    assert flows[cut - 1].request.path.endswith("/BidiAppend")
    part = _write_flows(tmp_path / "grown.flows", flows[:cut])
    snapshot = _write_flows(tmp_path / "snapshot.flows", flows[:cut])
    db, clean = tmp_path / "grown.duckdb", tmp_path / "clean.duckdb"
    first = _import(db, part, capsys)
    assert "BidiAppend group without a stream" in first
    _write_flows(part, flows)  # the same file, grown
    second = _import(db, part, capsys)
    assert "already imported, skipped" in second and "joined to its stream" in second
    _import(clean, ingest_live.flows, capsys)
    assert tables(db) == tables(clean)
    (absorbed,) = [json.loads(r["meta"]) for r in query_rows(db, "SELECT meta FROM sessions")
                   if "absorbed_sessions" in json.loads(r["meta"])]
    assert len(absorbed["absorbed_sessions"]) == 1
    # the old snapshot again: everything in it is stored (its appends now inside their stream)
    assert _import(db, snapshot, capsys).startswith(f"skipped {snapshot}: already imported")
    assert tables(db) == tables(clean)


@pytest.mark.slow
def test_interrupted_import_resumes(ingest_live: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A write failing mid-import leaves whole sessions only; running the import again completes it."""
    db, clean = tmp_path / "resumed.duckdb", tmp_path / "clean.duckdb"
    monkeypatch.setattr(identity, "BATCH_SESSIONS", 2)
    calls = {"n": 0}
    original = Store.insert_frames

    def failing(self: Store, batch: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 3:
            raise duckdb.IOException("disk on fire (injected)")
        return original(self, batch)

    monkeypatch.setattr(Store, "insert_frames", failing)
    capsys.readouterr()
    assert main(["import", str(ingest_live.flows), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"{ingest_live.flows}: writing {db} failed: disk on fire (injected)" in err
    assert "run the same import again to resume" in err
    monkeypatch.setattr(Store, "insert_frames", original)
    partial = tables(db)
    assert len(partial[1]) == 4  # two batches of two whole sessions
    assert {r["session_id"] for r in partial[0]} == {r["session_id"] for r in partial[1]}
    out = _import(db, ingest_live.flows, capsys)
    assert "resumed: 4 sessions already imported, skipped" in out
    _import(clean, ingest_live.flows, capsys)
    assert tables(db) == tables(clean)


@pytest.mark.slow
def test_har_twice_grown_and_repeated_entries(ingest_live: Recording, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(ingest_live.har.read_text())
    entries = doc["log"]["entries"]
    clean = tmp_path / "clean.duckdb"
    _import(clean, ingest_live.har, capsys)
    har, db = tmp_path / "grown.har", tmp_path / "grown.duckdb"
    har.write_text(json.dumps({"log": {**doc["log"], "entries": entries[: len(entries) // 2]}}))
    _import(db, har, capsys)
    har.write_text(json.dumps({"log": {**doc["log"], "entries": entries + entries[:5]}}))
    out = _import(db, har, capsys)
    assert "5 repeated entries imported once" in out
    assert tables(db) == tables(clean)
    assert _import(db, har, capsys).startswith(f"skipped {har}: already imported")
    assert tables(db) == tables(clean)


def test_ndjson_grown_file_and_resumed_lines(ingest_sample: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    lines = ingest_sample.read_bytes().splitlines(keepends=True)
    assert len(lines) == 20
    grown, db, clean = tmp_path / "cli.ndjson", tmp_path / "grown.duckdb", tmp_path / "clean.duckdb"
    grown.write_bytes(b"".join(lines[:10]))
    assert _import(db, grown, capsys) == f"imported {grown}: 1 session, 10 frames"
    assert query_rows(db, "SELECT status FROM sessions")[0]["status"] == "incomplete"  # no result line yet
    grown.write_bytes(b"".join(lines))
    second = _import(db, grown, capsys)
    assert second == f"imported {grown}: 1 session, 10 frames (resumed: 10 lines already imported, skipped)"
    assert _import(db, grown, capsys) == f"skipped {grown}: already imported (1 session, 20 frames)"
    copy = tmp_path / "copy.ndjson"
    copy.write_bytes(b"".join(lines))
    _import(clean, copy, capsys)
    frames, sessions = tables(db)
    assert (frames, sessions) == tables(clean)
    assert sessions[0]["status"] == "complete" and len(frames) == 20


def _frame(i: int) -> Frame:
    return Frame("interaction_update.text_delta", f"t{i}", b"\x0a\x03\x0a\x01" + bytes([65 + i % 26]))


def test_parquet_reimport_and_grown_export(tmp_path: Path) -> None:
    src, dst, out = tmp_path / "src.duckdb", tmp_path / "dst.duckdb", tmp_path / "pq"
    with Store(src) as s:
        rec = Recorder(s)
        for i in range(5):
            rec.add("pq-1", now_us() + i, "server", "run", "1", _frame(i))
        rec.flush()
        export_parquet(s, out)
    with Store(dst) as d:
        a = import_parquet(out, d)
        b = import_parquet(out, d)
        assert (a.sessions, b.sessions, b.skipped_sessions) == (["pq-1"], [], ["pq-1"])
        assert d.query("SELECT count(*) FROM frames").column(0)[0].as_py() == 5
    with Store(src) as s:
        rec = Recorder(s)
        for i in range(5, 8):
            rec.add("pq-1", now_us() + i, "server", "run", "1", _frame(i))
        rec.flush()
        export_parquet(s, out)  # re-export replaces the session's files
    with Store(dst) as d:
        c = import_parquet(out, d)
        assert (c.sessions, c.updated_sessions, c.rows["frames"]) == ([], ["pq-1"], 3)
        got = d.query("SELECT seq, payload FROM frames ORDER BY seq").to_pylist()
        assert d.query("SELECT frame_count FROM sessions").column(0)[0].as_py() == 8
    with Store(src) as s:
        assert got == s.query("SELECT seq, payload FROM frames ORDER BY seq").to_pylist()


def test_schema_refuses_duplicates_from_any_path(tmp_path: Path) -> None:
    with Store(tmp_path / "u.duckdb") as s:
        b = FrameBatch()
        b.add("s", 0, now_us(), "server", "run", None, _frame(0), source_key="flow:x#0")
        s.insert_frames(b)
        for seq, key in ((0, None), (1, "flow:x#0")):  # the same (session_id, seq); the same unit frame
            again = FrameBatch()
            again.add("s", seq, now_us(), "server", "run", None, _frame(1), source_key=key)
            with pytest.raises(duckdb.ConstraintException):
                s.insert_frames(again)
        live = FrameBatch()  # live recordings have no source key: any number of NULLs
        for seq in (1, 2):
            live.add("s", seq, now_us(), "server", "run", None, _frame(seq))
        assert s.insert_frames(live) == 2


def test_version_2_file_with_duplicates_migrates(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "v2.duckdb"
    con = duckdb.connect(str(db))
    for version in (0, 1):
        for stmt in MIGRATIONS[version]:
            con.execute(stmt)
    con.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    con.execute("INSERT INTO sessions (session_id, source, frame_count) VALUES ('d', 'capture', 4)")
    ts = "2026-01-01 00:00:00"
    rows = [("d", 0, "a"), ("d", 1, "b"), ("d", 1, "b"), ("d", 2, "c"), ("d", 2, "other")]
    for sid, seq, kind in rows:  # seq 1 twice (exact copies), seq 2 twice (different frames)
        con.execute("INSERT INTO frames (session_id, seq, ts, direction, transport, kind, payload) "
                    "VALUES (?, ?, ?, 'server', 'run', ?, 'x'::BLOB)", [sid, seq, ts, kind])
    con.close()
    with Store(db) as s:
        frames = s.query("SELECT seq, kind FROM frames ORDER BY seq").to_pylist()
        report = json.loads(s.query("SELECT value FROM meta WHERE key = 'migration_3'").column(0)[0].as_py())
        count = s.query("SELECT frame_count FROM sessions").column(0)[0].as_py()
    assert [f["seq"] for f in frames] == [0, 1, 2, 3] and sorted(f["kind"] for f in frames) == ["a", "b", "c", "other"]
    assert report["exact_copies_removed"] == 1 and report["frames_moved_to_a_new_seq"] == 1 and count == 4
    assert "upgraded to schema 3" in caplog.text and "exact copies removed 1" in caplog.text
