"""The named reads of ``workbench.store.queries`` on real DuckDB files, through each kind of reader:
the writer reading its own file, and a read-only file reader once the writer is gone."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from workbench.decode.frame import Frame
from workbench.store import queries
from workbench.store.db import SESSION_FIELDS, FrameBatch, SessionInfo, Store
from workbench.store.queries import Reader
from workbench.store.reader import ConnectionReader, LocalReader

T0 = 1_700_000_000_000_000  # µs


def _fill(store: Store) -> None:
    """Three sessions: A (5 frames, keyed by an import unit, two findings and a blob), B (2 frames,
    one finding, a note), C (no frames)."""
    store.upsert_sessions([
        SessionInfo("sess-a", source="import:ndjson", transport="run", started_at=datetime(2024, 1, 1, 10),
                    ended_at=datetime(2024, 1, 1, 10, 0, 3), status="complete", label="first",
                    meta={"file_sha256": "abc", "appends_without_stream": True}),
        SessionInfo("sess-b", source="capture", transport="runsse", started_at=datetime(2024, 1, 1, 11),
                    status="open"),
        SessionInfo("other-c", source="capture", transport="run", started_at=datetime(2024, 1, 1, 9),
                    status="complete"),
    ])
    batch = FrameBatch()
    a_kinds = ["run_request", "interaction_update.heartbeat", "interaction_update.heartbeat",
               "interaction_update.text_delta", "end_stream"]
    for seq, kind in enumerate(a_kinds):
        direction = "client" if seq == 0 else "server"
        batch.add("sess-a", seq, T0 + seq * 1000, direction, "run", "1", Frame(kind, kind, b"x" * (seq + 1)),
                  source_key=f"ndjson:lin1:{seq}:h{seq}#0")
    batch.add("sess-b", 0, T0, "client", "runsse", "1", Frame("run_request", "", b"q"))
    batch.add("sess-b", 1, T0 + 5, "server", "runsse", "1", Frame("interaction_update.text_delta", "", b"hello"))
    store.insert_frames(batch)
    store.insert_rows("findings", pa.table({
        "session_id": ["sess-a", "sess-a", "sess-b", "sess-b"],
        "code": ["stall", "missing_stream_close", "slow", "a_note"],
        "severity": ["warning", "error", "warning", "note"],
        "message": ["stalled", None, "slow start", "fyi"],
        "first_seq": [3, 1, None, 0],
        "last_seq": [4, 2, None, 0],
        "evidence": pa.array([[3, 4], None, [], [0]], type=pa.list_(pa.int64())),
    }))
    store.insert_rows("blobs", pa.table({"session_id": ["sess-a"], "blob_id": ["00ff"], "op": ["set"]}))


@pytest.fixture(params=["writer", "file reader", "connection"])
def reader(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Reader]:
    db = tmp_path / "q.duckdb"
    store = Store(db)
    _fill(store)
    if request.param == "writer":
        yield store
        store.close()
        return
    store.close()
    if request.param == "file reader":
        r = LocalReader(db)
        yield r
        r.close()
        return
    con = duckdb.connect(str(db), read_only=True)
    yield ConnectionReader(con, str(db))
    con.close()


def test_session_reads(reader: Reader) -> None:
    assert queries.session_ids(reader) == ["other-c", "sess-a", "sess-b"]  # oldest first
    assert queries.sessions_with_prefix(reader, "sess", 5) == ["sess-a", "sess-b"]
    assert queries.sessions_with_prefix(reader, "sess", 1) == ["sess-a"]
    assert queries.sessions_with_prefix(reader, "nope", 5) == []
    row = queries.session_row(reader, "sess-a", SESSION_FIELDS)
    assert row is not None and list(row) == SESSION_FIELDS and row["label"] == "first"
    assert queries.session_row(reader, "missing", SESSION_FIELDS) is None
    assert queries.session_status(reader, "sess-b") == "open"
    assert queries.session_status(reader, "missing") is None
    listing = queries.session_list(reader)
    assert [r["session_id"] for r in listing] == ["other-c", "sess-a", "sess-b"]
    assert listing[1]["duration_s"] == 3.0
    assert listing[2]["duration_s"] is None


def test_resolve_session_by_id_or_unique_prefix(reader: Reader) -> None:
    assert queries.resolve_session(reader, "sess-a") == "sess-a"
    assert queries.resolve_session(reader, "oth") == "other-c"
    # the CLI and the report/diff name the database the same way for both failures
    with pytest.raises(queries.SessionNotFound, match=r"session prefix 'sess' in .*q\.duckdb is ambiguous: "
                       r"sess-a, sess-b"):
        queries.resolve_session(reader, "sess")
    with pytest.raises(queries.SessionNotFound, match=r"no session 'nope' in .*q\.duckdb \(see 'workbench sessions"):
        queries.resolve_session(reader, "nope")


def test_meta_keys_and_rows(reader: Reader) -> None:
    keys, held = queries.meta_keys_and_rows(reader)
    assert "schema_version" in keys
    assert held == 3 + 7  # sessions and frames rows together


def test_meta_keys_and_rows_of_a_foreign_database(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "foreign.duckdb"))
    con.execute("CREATE TABLE frames (x INTEGER)")
    con.execute("INSERT INTO frames VALUES (1), (2)")
    assert queries.meta_keys_and_rows(ConnectionReader(con)) == (set(), 2)
    con.close()


def test_frame_reads(reader: Reader) -> None:
    assert queries.last_seq(reader, "sess-a") == 4
    assert queries.last_seq(reader, "other-c") == -1
    assert queries.last_seqs(reader, ["sess-a", "sess-b", "other-c"]) == {"sess-a": 4, "sess-b": 1}
    counts = queries.kind_counts(reader, "sess-a")
    assert list(counts.items())[0] == ("interaction_update.heartbeat", 2)  # most frequent first
    assert sum(counts.values()) == 5
    assert queries.frame_kinds(reader, "sess-b") == {0: "run_request", 1: "interaction_update.text_delta"}
    ids = queries.frame_identities(reader, ["sess-b"])
    assert sorted((r["seq"], r["ts_us"], r["direction"]) for r in ids) == [(0, T0, "client"), (1, T0 + 5, "server")]
    assert queries.frame_identities(reader, []) == []
    frames = queries.session_frames(reader, "sess-a")
    assert [f["seq"] for f in frames] == [0, 1, 2, 3, 4] and frames[2]["payload"] == b"xxx"


def test_frames_after_filters_and_pages(reader: Reader) -> None:
    rows = queries.frames_after(reader, "sess-a", -1, 10)
    assert [r["seq"] for r in rows] == [0, 1, 2, 3, 4] and "payload" not in rows[0]
    assert [r["seq"] for r in queries.frames_after(reader, "sess-a", 1, 2)] == [2, 3]
    assert [r["seq"] for r in queries.frames_after(reader, "sess-a", -1, 10, direction="client")] == [0]
    hb = queries.frames_after(reader, "sess-a", -1, 10, kind_prefixes=["interaction_update.heart", "end_"])
    assert [r["seq"] for r in hb] == [1, 2, 4]
    # payloads of 1..5 bytes: a page of at most 6 bytes holds seqs 0..2 (1+2+3), then 3 alone
    page = queries.frames_after(reader, "sess-a", -1, 10, payload_bytes=6)
    assert [r["seq"] for r in page] == [0, 1, 2] and page[0]["payload"] == b"x"
    assert [r["seq"] for r in queries.frames_after(reader, "sess-a", 2, 10, payload_bytes=1)] == [3]
    assert queries.frames_after(reader, "sess-a", 4, 10, payload_bytes=6) == []


def test_source_key_reads(reader: Reader) -> None:
    assert sorted(queries.source_keys_with_prefix(reader, "ndjson:lin1:"))[:2] == ["ndjson:lin1:0:h0#0",
                                                                                 "ndjson:lin1:1:h1#0"]
    assert queries.source_keys_with_prefix(reader, "ndjson:other:") == []
    assert queries.sessions_of_source_keys(reader, ["ndjson:lin1:3:h3#0", "nope#0"]) == {"ndjson:lin1:3:h3#0": "sess-a"}
    assert queries.sessions_of_source_keys(reader, []) == {}
    assert len(queries.source_keys_of(reader, "sess-a")) == 5
    assert queries.source_keys_of(reader, "sess-b") == set()
    assert queries.sessions_of_file_hash(reader, "abc") == []  # its frames carry keys: a newer import
    units = {r["session_id"]: r for r in queries.stored_units_of_sessions(reader, ["sess-a", "sess-b", "none"])}
    assert set(units) == {"sess-a", "sess-b"}
    assert sorted(units["sess-a"]["units"]) == [f"ndjson:lin1:{n}:h{n}" for n in range(5)]
    assert units["sess-a"]["absorbable"] is True and units["sess-a"]["unkeyed"] == 0
    assert units["sess-b"]["units"] is None and units["sess-b"]["unkeyed"] == 2
    assert queries.stored_units_of_sessions(reader, []) == []


def test_sessions_of_file_hash_finds_an_unkeyed_import(tmp_path: Path) -> None:
    with Store(tmp_path / "old.duckdb") as store:
        store.upsert_sessions([SessionInfo("old", meta={"file_sha256": "f00"}), SessionInfo("empty", meta={"file_sha256": "f00"})])
        batch = FrameBatch()
        batch.add("old", 0, T0, "client", "run", None, Frame("run_request", "", b""))
        store.insert_frames(batch)
        assert queries.sessions_of_file_hash(store, "f00") == ["old"]  # "empty" has no frames
        assert queries.sessions_of_file_hash(store, "other") == []


def test_finding_reads(reader: Reader) -> None:
    rows = queries.finding_rows(reader)
    assert len(rows) == 4 and {r["message"] for r in rows} >= {""}  # a missing message reads as ''
    assert [r["code"] for r in queries.finding_rows(reader, ["sess-b"])] in (["slow", "a_note"], ["a_note", "slow"])
    assert queries.finding_rows(reader, []) == []
    counts = {(r["session_id"], r["severity"]): r["n"] for r in queries.finding_counts(reader)}
    assert counts == {("sess-a", "warning"): 1, ("sess-a", "error"): 1, ("sess-b", "warning"): 1,
                      ("sess-b", "note"): 1}
    full = queries.session_findings(reader, "sess-a")
    assert [f["code"] for f in full] == ["missing_stream_close", "stall"]  # by first_seq
    assert full[1]["evidence"] == [3, 4]
    assert [f["code"] for f in queries.session_findings(reader, "sess-b")] == ["a_note", "slow"]  # NULLS LAST
    assert queries.has_derived_rows(reader, "sess-a") is True
    assert queries.has_derived_rows(reader, "sess-b") is False


def test_the_writer_reads_through_the_same_reads(tmp_path: Path) -> None:
    """``Store.next_seq`` and ``Store.session`` are the named reads, not SQL of their own."""
    with Store(tmp_path / "w.duckdb") as store:
        _fill(store)
        assert store.next_seq("sess-a") == queries.last_seq(store, "sess-a") + 1 == 5
        assert store.next_seq("other-c") == 0
        info = store.session("sess-a")
        assert info is not None and info.meta["file_sha256"] == "abc"
        store.set_meta("mark", "1")
        assert "mark" in queries.meta_keys_and_rows(store)[0]


def test_a_time_past_year_9999_is_read_as_its_text(tmp_path: Path) -> None:
    """DuckDB keeps a frame or session stamped past what Python's datetime holds (a hostile import's
    timestamp); the named reads give it as DuckDB's text instead of raising (CI's hostile Parquet
    property found `frames --json` ending in a traceback on one)."""
    db = tmp_path / "far.duckdb"
    with Store(db) as store:
        _fill(store)
        store.con.execute("UPDATE frames SET ts = TIMESTAMPTZ '10000-01-01 00:00:00+00' "
                          "WHERE session_id = 'sess-b' AND seq = 1")
        store.con.execute("UPDATE sessions SET started_at = TIMESTAMPTZ '10000-01-01 00:00:00+00' "
                          "WHERE session_id = 'sess-b'")
    r = LocalReader(db)
    try:
        rows = queries.frames_after(r, "sess-b", -1, 10)
        assert [row["seq"] for row in rows] == [0, 1]
        assert isinstance(rows[0]["ts"], datetime)
        assert str(rows[1]["ts"]).startswith("10000-01-01")
        assert str(queries.session_frames(r, "sess-b")[1]["ts"]).startswith("10000-01-01")
        paged = queries.frames_after(r, "sess-b", -1, 10, payload_bytes=100)  # the page read with payloads
        assert [p["seq"] for p in paged] == [0, 1] and str(paged[1]["ts"]).startswith("10000-01-01")
        assert str(queries.session_row(r, "sess-b", ["started_at"])["started_at"]).startswith("10000-01-01")
    finally:
        r.close()


_EXTREME_TIMES = ("SELECT 'infinity'::TIMESTAMP AS t, '-infinity'::DATE AS d, '10000-01-02'::DATE AS far, "
                  "TIMESTAMP '2024-01-01 10:00:00' AS plain, 'x'::BLOB AS b, [1, 2] AS l, NULL AS n")


def test_rows_are_what_the_arrow_read_gives_as_python(reader: Reader) -> None:
    """``Reader.rows`` (tuples, no pyarrow, what the listing reads use) and the Arrow read hand the same
    Python values, including the times Python cannot hold (DuckDB's text)."""
    from workbench.store.arrow_rows import table_rows

    assert reader.rows(_EXTREME_TIMES) == table_rows(reader.query(_EXTREME_TIMES))
    assert reader.rows(_EXTREME_TIMES)[0]["t"] == "infinity"
    got = reader.rows("SELECT session_id, status FROM sessions WHERE session_id = ?", ["sess-b"])
    assert got == [{"session_id": "sess-b", "status": "open"}]
