"""A session's findings for a view (``analysis.findings``): stored when analysed, else computed, and
both come out the same: root-cause order, causes set, evidence filled in."""

from __future__ import annotations

from analysis_helpers import SessionBuilder

from workbench.analysis import analyze_session, session_findings, stored_findings, write_results
from workbench.analysis.stamp import mark_analysed
from workbench.store.db import Store
from workbench.store.reader import LocalReader
from workbench.tui.data import TuiData


def _stalled(store: Store, sid: str = "s1") -> str:
    """An exec answered without stream_close, then heartbeats only: a chain of findings."""
    b = SessionBuilder(store, sid, status="incomplete")
    b.run_request()
    b.exec_shell(1, "ls", "c1")
    b.shell_result(1)
    for _ in range(7):
        b.heartbeat()
    return b.done()


def test_stored_and_computed_findings_are_the_same(analysis_store: Store) -> None:
    sid = _stalled(analysis_store)
    computed = analyze_session(analysis_store, sid).findings
    assert len(computed) >= 2 and any(f.cause for f in computed)  # a chain: something to order
    assert stored_findings(analysis_store, sid) is None            # never analysed …
    assert session_findings(analysis_store, sid) == computed       # … so computed
    write_results(analysis_store, [analyze_session(analysis_store, sid)])
    assert stored_findings(analysis_store, sid) == computed        # stored: identical, causes and all
    path = analysis_store.path
    analysis_store.close()
    reader = LocalReader(path)
    try:
        assert session_findings(reader, sid) == computed
    finally:
        reader.close()
    data = TuiData(path)
    try:
        assert data.findings(sid) == computed                      # what the TUI shows
    finally:
        data.close()


def test_clean_and_analysed_is_not_computed_again(analysis_store: Store) -> None:
    sid = _stalled(analysis_store)
    mark_analysed(analysis_store, [sid])   # stamped with no rows: analysed and clean
    assert stored_findings(analysis_store, sid) == []
    assert session_findings(analysis_store, sid) == []


def test_stored_rows_without_evidence_get_the_seq_range(analysis_store: Store) -> None:
    sid = _stalled(analysis_store)
    res = analyze_session(analysis_store, sid)
    write_results(analysis_store, [res])
    analysis_store.query("UPDATE findings SET evidence = NULL WHERE session_id = ?", [sid])
    stored = stored_findings(analysis_store, sid)
    assert stored is not None
    for f in stored:
        ends = {f.first_seq, f.last_seq} - {None}
        assert f.evidence == tuple(sorted(ends))
