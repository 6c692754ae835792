"""The DuckDB store: migrations, batched frame inserts, the recorder, readers (file and live)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from workbench.decode.classify import Frame, default_decoder
from workbench.schema import pb
from workbench.store import (
    SCHEMA_VERSION,
    FrameBatch,
    LiveService,
    SessionInfo,
    Store,
    StoreError,
    now_us,
    open_reader,
)
from workbench.store.reader import LocalReader, RemoteReader, check_read_only, sidecar_path
from workbench.store.recorder import Recorder
from workbench.store.schema import MIGRATIONS

DEC = default_decoder()
TEXT = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    text_delta=pb.TextDelta(text="hi"))).SerializeToString()


def frame(i: int) -> Frame:
    return DEC.classify_agent(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=f"t{i}"))).SerializeToString(), "agent.v1.AgentServerMessage")


# ---- migrations -----------------------------------------------------------------------------

def _version(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


def test_fresh_db_gets_current_version(tmp_path: Path) -> None:
    db = tmp_path / "nested" / "cap.duckdb"
    Store(db).close()
    assert _version(db) == SCHEMA_VERSION
    con = duckdb.connect(str(db), read_only=True)
    tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    con.close()
    assert {"meta", "sessions", "frames", "blobs", "tool_calls", "findings"} <= tables


def test_reopen_is_idempotent_and_keeps_data(tmp_path: Path) -> None:
    db = tmp_path / "cap.duckdb"
    with Store(db) as s:
        b = FrameBatch()
        b.add("s1", 0, now_us(), "server", "run", "1", frame(0))
        s.insert_frames(b)
    for _ in range(2):
        with Store(db) as s:
            assert s.query("SELECT count(*) AS n FROM frames").column("n").to_pylist() == [1]
            assert s.query("SELECT count(*) AS n FROM meta").column("n").to_pylist() == [1]
    assert _version(db) == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "future.duckdb"
    Store(db).close()
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(StoreError, match=rf"future\.duckdb.*schema version {SCHEMA_VERSION + 1} is newer"):
        Store(db)
    with pytest.raises(StoreError, match="newer"):
        open_reader(db)


def test_version_1_file_is_migrated_and_keeps_its_frames(tmp_path: Path) -> None:
    db = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(db))
    for stmt in MIGRATIONS[0]:
        con.execute(stmt)
    con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    con.execute("INSERT INTO frames (session_id, seq, ts, direction, transport, kind, payload) "
                "VALUES ('old', 0, now(), 'server', 'run', 'empty', ''::BLOB)")
    con.close()
    with Store(db) as s:
        rows = s.query("SELECT session_id, meta FROM frames").to_pylist()
        b = FrameBatch()
        f = frame(1)
        f.meta = {"http_status": 415}
        b.add("new", 0, now_us(), "client", "bidi_append", "1", f)
        s.insert_frames(b)
        metas = s.query("SELECT meta FROM frames WHERE session_id = 'new'").column("meta").to_pylist()
    assert rows == [{"session_id": "old", "meta": None}]
    assert [json.loads(m) for m in metas] == [{"http_status": 415}]
    assert _version(db) == SCHEMA_VERSION


def test_not_a_database(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, not duckdb")
    with pytest.raises(StoreError, match="notes.txt"):
        Store(bad)
    with pytest.raises(StoreError, match="no such capture database"):
        open_reader(tmp_path / "missing.duckdb")


# ---- frames round-trip ----------------------------------------------------------------------

def test_frame_batch_round_trip_keeps_bytes(tmp_path: Path) -> None:
    odd = bytes(range(256))
    frames = [
        DEC.decode_body(b"\x00\x00\x00\x00\x04" + bytes.fromhex("0a026a00"), "run", "server")[0],
        Frame("malformed", "junk", odd, flags=-1, error="reserved envelope flags 0x40"),
        DEC.unwrap_append(pb.BidiAppendRequest(data="3a00", request_id=pb.BidiRequestId(request_id="r"),
                                               append_seqno=2).SerializeToString()),
        Frame("empty", "empty message", b""),
    ]
    ts = now_us()
    with Store(tmp_path / "rt.duckdb") as s:
        b = FrameBatch()
        for i, f in enumerate(frames):
            b.add("sess", i, ts + i, "client" if i == 2 else "server", "run", "h2:1", f, decoded=None)
        assert len(b) == 4
        assert s.insert_frames(b) == 4
        rows = s.query("SELECT * FROM frames ORDER BY seq").to_pylist()
    assert [r["payload"] for r in rows] == [f.payload for f in frames]
    assert rows[1]["payload"] == odd
    assert rows[1]["error"] == "reserved envelope flags 0x40"
    assert rows[1]["flags"] == 0  # a framing failure has no real flags byte
    assert rows[2]["raw"] == frames[2].raw
    assert rows[2]["request_id"] == "r"
    assert rows[2]["append_seqno"] == 2
    assert [r["kind"] for r in rows] == ["interaction_update.heartbeat", "malformed", "client_heartbeat", "empty"]
    assert [r["size"] for r in rows] == [4, 256, 2, 0]
    assert rows[0]["ts"].timestamp() * 1e6 == pytest.approx(ts, abs=1)  # naive UTC
    # a pyarrow table works as well (imports build them directly)
    with Store(tmp_path / "rt.duckdb") as s:
        b = FrameBatch()
        b.add("sess2", 0, ts, "server", "run", None, frames[0])
        assert s.insert_frames(b.to_arrow()) == 1
        assert s.insert_frames(FrameBatch()) == 0


def test_frames_after_a_flush_update_their_session_row_at_the_next(tmp_path: Path) -> None:
    """A session is written again by the flush after new frames (its count and end move on),
    whether or not anything else about it changed, and left alone by a flush without any."""
    t0 = now_us()
    with Store(tmp_path / "again.duckdb") as s:
        rec = Recorder(s)
        for i in range(2):
            rec.add("A", t0 + i * 1000, "server", "run", "1", frame(i))
        rec.add("B", t0, "server", "run", "1", frame(9))
        rec.flush()
        s.con.execute("UPDATE sessions SET label = 'kept' WHERE session_id = 'B'")
        rec.add("A", t0 + 9000, "server", "run", "1", frame(2))
        rec.add("A", t0 - 1000, "server", "run", "1", frame(3))
        rec.flush()
        got, other = s.session("A"), s.session("B")
    assert got is not None and other is not None
    assert got.frame_count == 4
    assert got.started_at is not None and got.ended_at is not None
    assert (got.ended_at - got.started_at).total_seconds() == pytest.approx(0.010, abs=1e-6)
    assert other.label == "kept"  # not rewritten: no frame of B since the first flush


def test_recorder_seq_continues_across_reopen(tmp_path: Path) -> None:
    db = tmp_path / "rec.duckdb"
    t0 = now_us()
    with Store(db) as s:
        rec = Recorder(s)
        rec.open_session(SessionInfo("A", source="capture", transport="run", model="m1"))
        seqs = [rec.add("A", t0 + i * 1000, "server", "run", "1", frame(i)) for i in range(3)]
        seqs.append(rec.add("B", t0, "client", "run", "3", frame(9)))  # opened implicitly
        assert seqs == [0, 1, 2, 0]
        assert rec.flush() == 4
        assert rec.flush() == 0
    with Store(db) as s:
        rec = Recorder(s)
        info = rec.open_session(SessionInfo("A"))
        assert info.model == "m1"
        assert info.frame_count == 3  # the stored row, not the blank one
        assert rec.add("A", t0 + 5000, "server", "run", "1", frame(3)) == 3
        rec.sessions["A"].status = "complete"
        rec.touch("A")
        rec.flush()
        rows = s.query("SELECT seq, summary FROM frames WHERE session_id = 'A' ORDER BY seq").to_pylist()
        assert [r["seq"] for r in rows] == [0, 1, 2, 3]
        assert rows[3]["summary"] == 'text "t3"'
        got = s.session("A")
        assert got is not None
        assert got.status == "complete"
        assert got.frame_count == 4
        assert got.started_at is not None
        assert got.ended_at is not None
        assert (got.ended_at - got.started_at).total_seconds() == pytest.approx(0.005, abs=1e-6)
        assert s.session("nope") is None


def test_insert_rows_replaces_per_session(tmp_path: Path) -> None:
    with Store(tmp_path / "d.duckdb") as s:
        def findings(sid: str, codes: list[str]) -> pa.Table:
            return pa.table({"session_id": [sid] * len(codes), "code": codes, "severity": ["error"] * len(codes),
                             "evidence": [[1, 2]] * len(codes)})
        s.insert_rows("findings", findings("a", ["X", "Y"]))
        s.insert_rows("findings", findings("b", ["Z"]))
        s.insert_rows("findings", findings("a", ["W"]), replace_sessions=["a"])
        rows = s.query("SELECT session_id, code, evidence FROM findings ORDER BY code").to_pylist()
    assert rows == [{"session_id": "a", "code": "W", "evidence": [1, 2]},
                    {"session_id": "b", "code": "Z", "evidence": [1, 2]}]


def test_session_meta_round_trip(tmp_path: Path) -> None:
    with Store(tmp_path / "m.duckdb") as s:
        s.upsert_sessions([SessionInfo("x", meta={"headers": {"te": "trailers"}}, http_status=200)])
        s.upsert_sessions([SessionInfo("x", meta={"v": 2}, http_status=500)])
        got = s.session("x")
    assert got is not None
    assert got.meta == {"v": 2}
    assert got.http_status == 500


# ---- readers ---------------------------------------------------------------------------------

def test_open_reader_local_read_only(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    with Store(db) as s:
        rec = Recorder(s)
        for i in range(5):
            rec.add("S", now_us(), "server", "run", "1", frame(i))
        rec.flush()
    r = open_reader(db)
    try:
        assert isinstance(r, LocalReader)
        assert not r.live
        assert r.query("SELECT count(*) AS n FROM frames WHERE seq > ?", [1]).column("n").to_pylist() == [3]
        with pytest.raises(ValueError, match="read-only"):
            r.query("DELETE FROM frames")
    finally:
        r.close()
    # a stale sidecar from a dead process is ignored
    sidecar_path(db).write_text(json.dumps({"url": "http://127.0.0.1:1", "token": "t", "pid": 2**22 + 12345}))
    r = open_reader(db)
    assert isinstance(r, LocalReader)
    r.close()


def test_read_only_sql_check() -> None:
    for ok in ("SELECT 1", "select * from frames; select 2", "EXPLAIN SELECT 1"):
        check_read_only(ok)
    for bad in ("DELETE FROM frames", "INSERT INTO meta VALUES ('a','b')", "DROP TABLE frames",
                "CREATE TABLE x (a INT)", "SELECT 1; DROP TABLE frames", "UPDATE sessions SET status = 'x'",
                "COPY frames TO '/tmp/x.csv'", "ATTACH '/tmp/other.duckdb'", "PRAGMA threads=1"):
        with pytest.raises(ValueError, match="read-only"):
            check_read_only(bad)
    with pytest.raises(ValueError, match="does not parse"):
        check_read_only("SELEC nonsense")


class _Writer(threading.Thread):
    """Inserts frames in small batches, like a capture does."""

    def __init__(self, store: Store, total: int, batch: int) -> None:
        super().__init__(daemon=True)
        self.rec = Recorder(store)
        self.total, self.batch = total, batch
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for i in range(self.total):
                self.rec.add("live", now_us(), "server", "run", "1", frame(i))
                if (i + 1) % self.batch == 0:
                    self.rec.flush()
            self.rec.flush()
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc


def _poll_all(reader: RemoteReader | LocalReader, total: int, deadline: float) -> list[int]:
    seen: list[int] = []
    last = -1
    while len(seen) < total and time.monotonic() < deadline:
        rows = reader.query("SELECT seq FROM frames WHERE session_id = ? AND seq > ? ORDER BY seq",
                            ["live", last]).column("seq").to_pylist()
        seen += rows
        if rows:
            last = rows[-1]
    return seen


@pytest.mark.slow
def test_live_service_thread_reader_while_writing(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        assert json.loads(sidecar_path(db).read_text())["url"] == svc.url
        assert (os.stat(sidecar_path(db)).st_mode & 0o777) == 0o600
        reader = open_reader(db)
        assert isinstance(reader, RemoteReader)
        assert reader.live
        w = _Writer(store, total=3000, batch=50)
        w.start()
        seen = _poll_all(reader, 3000, time.monotonic() + 120)
        w.join(60)
        assert w.error is None
        assert seen == list(range(3000))  # no duplicates, no gaps, in order
        # arrow types survive the trip
        t = reader.query("SELECT payload, ts, flags FROM frames WHERE seq = 0")
        assert t.schema.field("payload").type == pa.binary()
        # read-only enforcement and authentication
        with pytest.raises(StoreError, match="read-only"):
            reader.query("DELETE FROM frames")
        with pytest.raises(StoreError, match="read-only"):
            reader.query("SELECT 1; DROP TABLE frames")
        with pytest.raises(StoreError, match="bad token"):
            RemoteReader(db, svc.url, "wrong").query("SELECT 1")
        with pytest.raises(StoreError, match="Catalog Error|does not exist"):
            reader.query("SELECT * FROM no_such_table")
        assert store.query("SELECT count(*) AS n FROM frames").column("n").to_pylist() == [3000]
    finally:
        svc.stop()
        store.close()
    assert not sidecar_path(db).exists()
    r = open_reader(db)
    assert isinstance(r, LocalReader)
    r.close()


READER_SCRIPT = """
import sys, time
from workbench.store import open_reader
reader = open_reader(sys.argv[1])
print("live" if reader.live else "local", flush=True)
last, seen, deadline = -1, [], time.monotonic() + 120
while len(seen) < int(sys.argv[2]) and time.monotonic() < deadline:
    rows = reader.query("SELECT seq FROM frames WHERE seq > ? ORDER BY seq", [last]).column("seq").to_pylist()
    seen += rows
    if rows:
        last = rows[-1]
print(",".join(map(str, seen)), flush=True)
"""


@pytest.mark.slow
def test_live_service_reader_in_another_process(tmp_path: Path) -> None:
    db = tmp_path / "proc.duckdb"
    store = Store(db)
    svc = LiveService(store.con, db)
    svc.start()
    try:
        proc = subprocess.Popen([sys.executable, "-c", READER_SCRIPT, str(db), "1500"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "live"
        w = _Writer(store, total=1500, batch=25)
        w.start()
        out, err = proc.communicate(timeout=150)
        w.join(60)
        assert proc.returncode == 0, err
        assert [int(x) for x in out.strip().split(",")] == list(range(1500))
    finally:
        svc.stop()
        store.close()


# ---- background writer ---------------------------------------------------------------------

def test_recorder_background_mode_round_trip(tmp_path: Path) -> None:
    db = tmp_path / "bg.duckdb"
    t0 = now_us()
    with Store(db) as s:
        rec = Recorder(s, background=True)
        rec.open_session(SessionInfo("bg", model="m", meta={"k": [1]}))
        for i in range(2500):
            rec.add("bg", t0 + i, "server", "run", "1", frame(i))
            if (i + 1) % 400 == 0:
                assert rec.flush() == 400
        rec.sessions["bg"].meta["k"].append(2)  # the flushed snapshot is not affected
        rec.close()
        rows = s.query("SELECT seq, summary FROM frames ORDER BY seq").to_pylist()
        assert [r["seq"] for r in rows] == list(range(2500))
        assert rows[2499]["summary"] == 'text "t2499"'
        got = s.session("bg")
        assert got is not None
        assert got.frame_count == 2500
        assert got.model == "m"
        assert got.meta == {"k": [1, 2]}  # close() flushed the last change
        assert rec.frames_written == 2500
        assert rec.unwritten == []


def test_recorder_background_write_error_is_raised_and_frames_kept(tmp_path: Path) -> None:
    with Store(tmp_path / "err.duckdb") as s:
        rec = Recorder(s, background=True)
        rec.add("e", now_us(), "server", "run", "1", frame(0))
        rec.flush()
        rec.wait()
        # another writer took seq 1: the unique key (session_id, seq) refuses the recorder's insert
        s.con.execute("INSERT INTO frames (session_id, seq, ts, direction, transport, kind) "
                      "VALUES ('e', 1, now(), 'server', 'run', 'intruder')")
        rec.add("e", now_us(), "server", "run", "1", frame(1))
        rec.flush()
        with pytest.raises(duckdb.Error):
            rec.wait()
        assert [t.num_rows for t in rec.unwritten] == [1]
        assert rec.unwritten[0].column("seq").to_pylist() == [1]
        s.con.execute("DELETE FROM frames WHERE kind = 'intruder'")
        rec.add("e", now_us(), "server", "run", "1", frame(2))
        rec.close()  # a fresh writer thread carries on
        assert s.query("SELECT seq FROM frames ORDER BY seq").column("seq").to_pylist() == [0, 2]
