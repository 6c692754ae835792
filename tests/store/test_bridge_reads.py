"""The bridge's named reads (``workbench.store.bridge_reads``) on a real DuckDB file, through the
writer and through a read-only file reader: an OpenAI request, the run it caused, a later run
still open and a follow-up request that answers the run's tool call."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from workbench.decode.frame import Frame
from workbench.protocol import kinds
from workbench.store import bridge_reads as reads
from workbench.store.analysis_reads import stamp_values
from workbench.store.db import FrameBatch, SessionInfo, Store
from workbench.store.queries import Reader
from workbench.store.reader import LocalReader

START = datetime(2024, 1, 1, 10)
T0 = int(START.replace(tzinfo=UTC).timestamp() * 1_000_000)  # µs
S = 1_000_000


def _at(us: int) -> datetime:
    return datetime.fromtimestamp((T0 + us) / 1e6, UTC).replace(tzinfo=None)


def _fill(store: Store) -> None:
    store.upsert_sessions([
        SessionInfo("o1", transport="openai_chat", model="m", started_at=_at(0), ended_at=_at(10 * S),
                    status="complete", http_status=200, meta={"order": "time"}),
        SessionInfo("r1", transport="run", model="m", started_at=_at(1 * S), ended_at=_at(9 * S), status="complete"),
        SessionInfo("r2", transport="run", started_at=_at(20 * S), status="open"),
        SessionInfo("o2", transport="openai_chat", started_at=_at(30 * S), ended_at=_at(31 * S), status="complete"),
    ])
    b = FrameBatch()
    b.add("o1", 0, T0 + 100, "client", "openai_chat", None, Frame(kinds.OPENAI_REQUEST, "request", b'{"model":"m"}'))
    b.add("o1", 1, T0 + 5 * S, "server", "openai_chat", None,
          Frame(kinds.OPENAI_TOOL_CALLS, "tool call", b"{}", call_id="call_1"))
    b.add("r1", 0, T0 + 1 * S, "client", "run", None, Frame(kinds.RUN_REQUEST, "run", b"prompt"))
    b.add("r1", 1, T0 + 2 * S, "server", "run", None, Frame(kinds.TEXT_DELTA, "text", b"hello"))
    b.add("r1", 2, T0 + 3 * S, "server", "run", None, Frame(kinds.TOOL_CALL_STARTED, "call", b"tc", call_id="call_1"))
    b.add("r1", 3, T0 + 4 * S, "server", "run", None, Frame(kinds.SERVER_HEARTBEAT, "hb", b"hb"))
    b.add("r1", 4, T0 + 5 * S, "client", "run", None, Frame(kinds.RUN_REQUEST, "again", b"up", call_id="call_9"))
    b.add("o2", 0, T0 + 30 * S, "client", "openai_chat", None,
          Frame(kinds.OPENAI_REQUEST, "follow-up", b'{"messages":[{"tool_call_id":"call_1"}]}', call_id="call_1"))
    store.insert_frames(b)


@pytest.fixture(params=["writer", "file reader"])
def reader(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Reader]:
    db = tmp_path / "bridge.duckdb"
    store = Store(db)
    _fill(store)
    if request.param == "writer":
        yield store
        store.close()
        return
    store.close()
    r = LocalReader(db)
    yield r
    r.close()


def test_sessions(reader: Reader) -> None:
    assert reads.has_sessions_of(reader, ["openai_chat"]) and not reads.has_sessions_of(reader, ["openai_responses"])
    w = reads.session_window(reader, "o1")
    assert w is not None and (w["transport"], w["model"], w["start_us"], w["end_us"], w["last_us"]) == (
        "openai_chat", "m", T0, T0 + 10 * S, T0 + 5 * S)
    assert reads.session_window(reader, "nope") is None
    span = reads.session_span(reader, "o1")
    assert span is not None and (span["status"], span["http_status"], span["start_us"]) == ("complete", 200, T0)
    assert '"order"' in (span["meta"] or "") and reads.session_metas(reader, ["o1"]) == [span["meta"]]
    assert list(reads.transports_by_start(reader, ["o2", "r1", "o1", "nope"]).items()) == [
        ("o1", "openai_chat"), ("r1", "run"), ("o2", "openai_chat")]


def test_which_runs_fall_in_a_window(reader: Reader) -> None:
    assert [r["session_id"] for r in reads.sessions_started_between(reader, ["run"], T0, T0 + 10 * S)] == ["r1"]
    assert [r["session_id"] for r in reads.sessions_started_between(reader, ["run"], T0 + S, T0 + S)] == ["r1"]
    assert reads.sessions_started_between(reader, ["run"], T0 + 2 * S, T0 + 19 * S) == []
    # a session without an end is open from its start on; an ended one no longer
    assert reads.sessions_open_at(reader, ["run"], T0 + 5 * S) == ["r1"]
    assert reads.sessions_open_at(reader, ["run"], T0 + 25 * S) == ["r2"]
    assert reads.sessions_open_at(reader, ["openai_chat"], T0 + 5 * S) == ["o1"]


def test_call_ids(reader: Reader) -> None:
    assert sorted(reads.call_ids_of(reader, ["o1", "r1"], ["server"])) == [("o1", "call_1"), ("r1", "call_1")]
    assert reads.call_ids_of(reader, ["o1", "r1"], ["client"]) == [("r1", "call_9")]
    assert reads.call_ids_of(reader, [], ["server"]) == []
    assert reads.sessions_with_call_ids(reader, ["call_1"], ["openai_chat"]) == ["o1", "o2"]
    assert reads.sessions_with_call_ids(reader, ["call_1"], ["openai_chat"], exclude="o1") == ["o2"]
    assert reads.sessions_with_call_ids(reader, ["call_1", "call_9"], ["run"]) == ["r1"]
    assert reads.sessions_whose_frame_mentions(reader, kinds.OPENAI_REQUEST, "call_1", ["openai_chat"], T0) == ["o2"]
    assert reads.sessions_whose_frame_mentions(reader, kinds.OPENAI_REQUEST, "call_1", ["openai_chat"],
                                               T0 + 31 * S) == []


def test_frames(reader: Reader) -> None:
    side = reads.side_frames(reader, "r1", [kinds.TEXT_DELTA])
    assert [f["seq"] for f in side] == [0, 1, 2, 3, 4] and side[1]["ts"] == T0 + 2 * S
    # payloads of client frames and the kinds asked for only
    assert [f["payload"] for f in side] == [b"prompt", b"hello", None, None, b"up"]
    assert [f["call_id"] for f in side] == [None, None, "call_1", None, "call_9"]
    whole = reads.frames_with_payloads(reader, "o1")
    assert [(f["seq"], f["direction"], f["payload"]) for f in whole] == [
        (0, "client", b'{"model":"m"}'), (1, "server", b"{}")]
    lines = reads.frame_lines(reader, "r1")
    assert [(f["seq"], f["summary"]) for f in lines][:2] == [(0, "run"), (1, "text")]
    assert "payload" not in lines[0]


def test_links_written_and_removed_in_meta(tmp_path: Path) -> None:
    store = Store(tmp_path / "links.duckdb")
    try:
        reads.write_meta_values(store, "links:", {"o1": '["r1"]', "r1": '["o1"]'})
        reads.write_meta_values(store, "other:", {"o1": "kept"})
        assert stamp_values(store, "links:") == {"o1": '["r1"]', "r1": '["o1"]'}
        reads.write_meta_values(store, "links:", {"o1": None, "r1": '["o2"]'})  # None: the key goes
        assert stamp_values(store, "links:") == {"r1": '["o2"]'}
        assert stamp_values(store, "other:") == {"o1": "kept"}
    finally:
        store.close()
