"""The typed ``Finding``: immutable, one JSON form (``diagnose --json``), stored rows read back alike."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workbench.analysis.model import MAX_EVIDENCE, SEVERITY_RANK, Finding

_seq = st.integers(min_value=0, max_value=2**53)
_text = st.text(max_size=40)

findings = st.builds(
    Finding, code=st.sampled_from(["heartbeat_loop", "blob_miss", "x"]), severity=st.sampled_from(sorted(SEVERITY_RANK)),
    message=_text, first_seq=st.none() | _seq, last_seq=st.none() | _seq,
    evidence=st.lists(_seq, max_size=60).map(tuple), suggested_fix=_text, session_id=_text,
    cause=st.none() | _text, cause_seq=st.none() | _seq)


@given(findings)
def test_json_round_trip(f: Finding) -> None:
    assert Finding.from_json(f.to_json()) == f
    # through the text a script reads, too
    assert Finding.from_json(json.loads(json.dumps(f.to_json()))) == f


def test_json_keys_and_order_are_those_diagnose_printed() -> None:
    f = Finding("heartbeat_loop", "error", "m", 3, 9, (9, 3, 5), "fix", "s1", "missing_stream_close", 2)
    assert json.dumps(f.to_json()) == (
        '{"code": "heartbeat_loop", "severity": "error", "message": "m", "first_seq": 3, "last_seq": 9, '
        '"evidence": [3, 5, 9], "suggested_fix": "fix", "session_id": "s1", "cause": "missing_stream_close", '
        '"cause_seq": 2}')


def test_immutable_and_checked() -> None:
    f = Finding("tool_loop", "warning", "m", 1, 2, (1, 2))
    with pytest.raises(AttributeError):
        f.severity = "error"  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown severity"):
        Finding("tool_loop", "fatal", "m", 1, 2)  # type: ignore[arg-type]


def test_long_evidence_keeps_head_and_tail() -> None:
    f = Finding("heartbeat_loop", "error", "m", 0, 999, tuple(range(1000)))
    assert len(f.evidence) == MAX_EVIDENCE
    assert f.evidence[0] == 0 and f.evidence[-1] == 999


def test_a_row_without_evidence_gets_its_seq_range() -> None:
    # rows an older workbench or an import stored: NULL evidence, message and fix
    row = {"session_id": "s", "code": "server_error", "severity": "error", "message": None, "first_seq": 4,
           "last_seq": 7, "evidence": None, "suggested_fix": None}
    f = Finding.from_json(row)
    assert (f.evidence, f.message, f.suggested_fix, f.cause) == ((4, 7), "", "", None)
    assert Finding.from_json({**row, "last_seq": None}).evidence == (4,)
    assert Finding.from_json({**row, "first_seq": None, "last_seq": None}).evidence == ()
