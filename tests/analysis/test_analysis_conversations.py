"""The siblings of a session (``analysis.conversations``): read once for a batch, not once per session."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from analysis_helpers import SessionBuilder

from workbench.analysis import analyze_session
from workbench.analysis.conversations import Conversations
from workbench.store.db import Store


class RowCounter:
    """A reader that counts the rows its queries return (what a batch reads, not how long it takes)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.rows_read = 0

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        t = self.store.query(sql, params)
        self.rows_read += t.num_rows
        return t

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        found = self.store.rows(sql, params)
        self.rows_read += len(found)
        return found


def _conversation(store: Store, n: int, prefix: str) -> list[str]:
    """``n`` sessions of one conversation, each setting its own blob and getting one earlier set."""
    ids = []
    for i in range(n):
        b = SessionBuilder(store, f"{prefix}{i:03}", conversation_id=f"{prefix}conv")
        b.run_request(conversation_id=f"{prefix}conv")
        b.set_blob(1, f"blob {prefix}{i}".encode())
        b.set_blob_result(1)
        b.text("ok")
        b.checkpoint()
        b.turn_ended()
        b.end_stream()
        ids.append(b.done())
    return ids


def _rows_per_session(store: Store, ids: list[str]) -> float:
    counter = RowCounter(store)
    convs = Conversations(counter)
    for sid in ids:
        analyze_session(counter, sid, conversations=convs)
    return counter.rows_read / len(ids)


def test_a_batch_reads_each_sibling_once(analysis_store: Store) -> None:
    small = _rows_per_session(analysis_store, _conversation(analysis_store, 5, "a"))
    large = _rows_per_session(analysis_store, _conversation(analysis_store, 60, "b"))
    # per session, a 60-session conversation costs about what a 5-session one does (asked per
    # session, each read all its siblings' blobs, run requests and checkpoints again: 12x)
    assert large < small * 1.5, (small, large)


def test_siblings_still_count(analysis_store: Store) -> None:
    # a blob set in an earlier session of the conversation and asked for later is no miss, and its
    # checkpoint makes a follow-up with an empty state a lost context
    first = SessionBuilder(analysis_store, "s1", conversation_id="conv-x")
    first.run_request(conversation_id="conv-x")
    _, bid = first.set_blob(1, b"the system prompt")
    first.set_blob_result(1)
    first.checkpoint()
    first.turn_ended()
    first.end_stream()
    first.done()
    second = SessionBuilder(analysis_store, "s2", conversation_id="conv-x")
    second.ts += 10_000_000
    second.run_request(conversation_id="conv-x")
    second.get_blob(1, bid)
    second.get_blob_result(1, b"the system prompt")
    second.text("ok")
    second.turn_ended()
    second.end_stream()
    second.done()
    convs = Conversations(analysis_store)
    assert [s for s, _ in convs.members("conv-x")] == ["s1", "s2"]
    assert bid in convs.known_blob_ids("conv-x", "s2")      # s1 set it
    assert bid not in convs.known_blob_ids("conv-x", "s1")  # only s1 itself did
    assert convs.prior_checkpoint("s2", "conv-x", convs.members("conv-x")[1][1]) == ("s1", 3)
    assert convs.prior_checkpoint("s1", "conv-x", convs.members("conv-x")[0][1]) is None
    res = analyze_session(analysis_store, "s2", conversations=convs)
    # the blob came from s1: no blob_miss; s1's checkpoint is not in s2's empty state: the context was lost
    assert [f.code for f in res.problems] == ["missing_conversation_state"]
    assert "seq 3" in res.problems[0].message or "s1" in res.problems[0].message


class QueryCounter(RowCounter):
    """A reader that counts its queries."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.queries = 0

    def query(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        self.queries += 1
        return super().query(sql, params)

    def rows(self, sql: str, params: Sequence[Any] | None = None) -> list[dict[str, Any]]:
        self.queries += 1
        return super().rows(sql, params)


def _queries(store: Store, ids: list[str]) -> int:
    counter = QueryCounter(store)
    convs = Conversations(counter)
    for sid in ids:
        analyze_session(counter, sid, conversations=convs)
    return counter.queries


def test_a_session_alone_in_its_conversation_reads_only_itself(analysis_store: Store) -> None:
    """An import of many one-session conversations (a packet capture of Runs): per session, the walk
    and its aggregates and the session row; no look for an earlier checkpoint (there is no earlier
    session), no second read of the seq bounds, and whether OpenAI sessions exist once per batch."""
    ids = [i for n in range(20) for i in _conversation(analysis_store, 1, f"lone{n:02}-")]
    per_session = (_queries(analysis_store, ids) - _queries(analysis_store, ids[:10])) / 10
    # the walk's one slice, the tallies, heartbeat/text marks, tool call spans, kind counts, bulk
    # seqs, the session row
    assert per_session <= 7, per_session
