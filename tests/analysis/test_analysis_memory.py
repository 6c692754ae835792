"""What an analysis leaves behind: nothing of its walk once it returns.

The facts of a 1M-frame session are some 70,000 objects. Held in a reference cycle, they outlived
the analysis until Python's cyclic collector went over every one of them (a tenth of a
``diagnose``); free of cycles they go the moment the analysis drops them.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from analysis_helpers import SessionBuilder

from workbench.analysis import analyze_session
from workbench.analysis.engine import collector_paused
from workbench.analysis.facts import FactsBuilder
from workbench.store.db import Store


@pytest.fixture
def collector_off() -> Iterator[None]:
    """The cyclic collector off, as during an analysis: what is freed here is freed by refcounts."""
    gc.collect()
    with collector_paused():
        yield


def _session(store: Store) -> str:
    b = SessionBuilder(store)
    b.run_request()
    b.text("hello")
    b.healthy_shell_turn()
    blob_id = b.set_blob(7, b'{"role": "user", "content": "hi"}')[1]
    b.set_blob_result(7)
    b.get_blob(8, blob_id)
    b.get_blob_result(8, b'{"role": "user", "content": "hi"}')
    b.heartbeat()
    b.turn_ended()
    b.end_stream()
    return b.done()


def _builders() -> int:
    return sum(isinstance(o, FactsBuilder) for o in gc.get_objects())


def test_a_walk_is_freed_when_its_builder_is_dropped(analysis_store: Store, collector_off: None) -> None:
    _session(analysis_store)
    rows = analysis_store.query("SELECT * FROM frames ORDER BY seq").to_pylist()
    kinds = {r["kind"] for r in rows}
    assert {"interaction_update.text_delta", "kv_server_message.set_blob_args", "end_stream"} <= kinds
    assert any(k.startswith("exec_server_message.") for k in kinds)
    builder = FactsBuilder("s1")
    builder.feed_rows(rows)
    assert builder.facts.execs and builder.facts.kv  # the handlers ran
    gone = weakref.ref(builder)
    del builder
    assert gone() is None, "the builder is held in a reference cycle"


def test_analyze_session_leaves_no_builder_behind(analysis_store: Store, collector_off: None) -> None:
    sid = _session(analysis_store)
    before = _builders()
    result = analyze_session(analysis_store, sid)
    assert result.blobs and result.tool_calls
    assert _builders() == before
