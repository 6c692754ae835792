"""Findings computed before an import ends (``analysis.ahead``): taken as they are only when the
session and everything it read of its siblings is unchanged at the end; otherwise analysed again,
so the rows stored are those a refresh after the whole import stores."""

from __future__ import annotations

import hashlib
from typing import Any

from analysis_helpers import SessionBuilder

from workbench.analysis.ahead import FindingsAhead
from workbench.analysis.conversations import Conversations
from workbench.analysis.model import AnalysisResult
from workbench.analysis.stamp import analysis_stamp
from workbench.analysis.stored import refresh_findings
from workbench.schema import pb
from workbench.store.db import Store

TABLES = ("findings", "blobs", "tool_calls")


def _rows(store: Store) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for table in TABLES:
        cols = [r[0] for r in store.con.execute(
            f"SELECT column_name FROM duckdb_columns() WHERE table_name = '{table}' AND column_name != 'created_at'"
        ).fetchall()]
        t = store.query(f"SELECT {', '.join(cols)} FROM {table} ORDER BY ALL")
        out[table] = t.to_pylist()
    out["stamps"] = store.query("SELECT key, value FROM meta WHERE starts_with(key, 'analysis:') ORDER BY ALL").to_pylist()
    return out


def _names_blob(store: Store, sid: str, bid: bytes, *, later_ms: int = 0) -> str:
    """A session of conv-x whose checkpoint names a blob it did not set."""
    b = SessionBuilder(store, sid, conversation_id="conv-x")
    b.ts += later_ms * 1000
    b.run_request(conversation_id="conv-x")
    b.text("ok")
    b.checkpoint(pb.ConversationStateStructure(turns=[bid]))
    b.turn_ended()
    b.end_stream()
    return b.done()


def _never_set(result: AnalysisResult) -> list[str]:
    return [r["blob_id"] for r in result.blobs if r["status"] == "never_set"]


def _sets_blob(store: Store, sid: str, *, conversation: str = "conv-x", blob_id: bytes | None = None) -> str:
    """A session that sets a blob and receives a checkpoint."""
    b = SessionBuilder(store, sid, conversation_id=conversation)
    b.run_request(conversation_id=conversation)
    b.set_blob(1, b"the system prompt", blob_id)
    b.set_blob_result(1)
    b.checkpoint()
    b.turn_ended()
    b.end_stream()
    return b.done()


def test_a_session_whose_conversation_gains_a_later_session_is_analysed_again(analysis_store: Store) -> None:
    # s1 is written and analysed ahead: the blob its checkpoint names is set nowhere yet
    bid = hashlib.sha256(b"the system prompt").digest()
    s1 = _names_blob(analysis_store, "s1", bid, later_ms=10_000)
    lone = _sets_blob(analysis_store, "lone", conversation="conv-lone")
    ahead = FindingsAhead(analysis_store)
    ahead.add([s1, lone])
    assert ahead.work(60) == [s1, lone]
    assert _never_set(ahead.done[s1].result) == [bid.hex()]
    # then the rest of the import writes s0, which set that blob earlier in the conversation
    s0 = _sets_blob(analysis_store, "s0", blob_id=bid)
    ids = [s1, lone, s0]
    valid = ahead.still_valid(ids, Conversations(analysis_store))
    assert s1 not in valid and lone in valid  # s1 read a blob id that s0 now sets; lone read nothing that changed
    done = refresh_findings(analysis_store, ids, ahead=ahead)
    assert set(done) == set(ids)
    stored = _rows(analysis_store)
    assert _never_set(done[s1]) == []  # s0 set it
    # what a refresh after the whole import stores, row for row
    refresh_findings(analysis_store, ids)
    assert _rows(analysis_store) == stored


def test_an_earlier_checkpoint_written_later_changes_the_result(analysis_store: Store) -> None:
    # s2 (a follow-up with an empty state) is analysed when it is alone in its conversation
    s2 = SessionBuilder(analysis_store, "s2", conversation_id="conv-y")
    s2.ts += 10_000_000
    s2.run_request(conversation_id="conv-y")
    s2.text("ok")
    s2.turn_ended()
    s2.end_stream()
    s2.done()
    ahead = FindingsAhead(analysis_store)
    ahead.add(["s2"])
    ahead.work(60)
    assert "missing_conversation_state" not in [f.code for f in ahead.done["s2"].result.findings]
    # s1, which started earlier and received a checkpoint, is written after
    _sets_blob(analysis_store, "s1", conversation="conv-y")
    done = refresh_findings(analysis_store, ["s2", "s1"], ahead=ahead)
    assert "missing_conversation_state" in [f.code for f in done["s2"].findings]
    stored = _rows(analysis_store)
    refresh_findings(analysis_store, ["s2", "s1"])
    assert _rows(analysis_store) == stored


def test_a_session_written_again_is_analysed_again(analysis_store: Store) -> None:
    _names_blob(analysis_store, "s1", b"\x02" * 32)
    ahead = FindingsAhead(analysis_store)
    ahead.add(["s1"])
    ahead.work(60)
    # the session is rebuilt (a fuller copy of it): its own frames changed, nothing else did
    analysis_store.delete_sessions(["s1"])
    b = SessionBuilder(analysis_store, "s1", conversation_id="conv-x")
    b.run_request(conversation_id="conv-x")
    b.text("ok")
    b.end_stream()
    b.done()
    done = refresh_findings(analysis_store, ["s1"], ahead=ahead)
    assert _never_set(done["s1"]) == [] and _never_set(ahead.done["s1"].result) == [(b"\x02" * 32).hex()]
    stored = _rows(analysis_store)
    refresh_findings(analysis_store, ["s1"])
    assert _rows(analysis_store) == stored


def test_time_spent_ahead_counts_against_the_budget(analysis_store: Store) -> None:
    ids = [_sets_blob(analysis_store, f"c{i}", conversation=f"conv-{i}") for i in range(3)]
    ahead = FindingsAhead(analysis_store)
    ahead.add(ids[:1])
    ahead.work(60)
    ahead.spent = 100.0  # as if the analysis ahead had used the whole budget
    done = refresh_findings(analysis_store, ids, budget_s=30, ahead=ahead)
    # the result computed ahead is stored; nothing more is started past the budget
    assert list(done) == ids[:1]
    assert _rows(analysis_store)["stamps"] == [{"key": f"analysis:{ids[0]}", "value": analysis_stamp()}]


def test_work_waits_for_a_batch(analysis_store: Store) -> None:
    """Sessions are analysed ahead in batches: each call reads the conversations and signatures once."""
    ids = [_sets_blob(analysis_store, f"b{i}", conversation=f"conv-b{i}") for i in range(3)]
    ahead = FindingsAhead(analysis_store, batch=3)
    ahead.add(ids[:2])
    assert not ahead.due()
    ahead.add(ids[2:])
    assert ahead.due()
    assert ahead.work(60) == ids
    assert not ahead.due()
