"""Ordering findings root cause first: fresh findings (diagnose) and stored rows (the TUI) alike."""

from __future__ import annotations

from workbench.analysis import Finding
from workbench.analysis.bridge import BRIDGE_CODES
from workbench.analysis.causes import CAUSES, order_findings
from workbench.analysis.rules import RULES


def _f(code: str, severity: str, first: int, last: int | None = None) -> Finding:
    return Finding(code, severity, code, first, first if last is None else last, (first,))


def test_chain_comes_out_root_first_with_pointers() -> None:
    items = [_f("stream_ended_without_turn_end", "error", 0, 30), _f("heartbeat_loop", "error", 12, 29),
             _f("server_error", "error", 30), _f("missing_stream_close", "error", 10, 20),
             _f("append_seqno_anomaly", "warning", 40), _f("tool_loop", "warning", 2, 8)]
    out = order_findings(items)
    assert [f.code for f in out] == ["missing_stream_close", "heartbeat_loop", "stream_ended_without_turn_end",
                                     "server_error", "tool_loop", "append_seqno_anomaly"]
    by = {f.code: f for f in out}
    assert (by["heartbeat_loop"].cause, by["heartbeat_loop"].cause_seq) == ("missing_stream_close", 10)
    assert by["stream_ended_without_turn_end"].cause == "heartbeat_loop"
    assert by["server_error"].cause == "heartbeat_loop"
    assert by["missing_stream_close"].cause is None
    assert by["append_seqno_anomaly"].cause is None
    # append_seqno_anomaly starts after the tool loop ends and after the stall: it explains neither
    assert by["tool_loop"].cause is None


def test_a_warning_that_explains_an_error_comes_before_it() -> None:
    out = order_findings([_f("unanswered_exec", "error", 5, 9), _f("append_seqno_anomaly", "warning", 3, 4)])
    assert [f.code for f in out] == ["append_seqno_anomaly", "unanswered_exec"]
    assert out[1].cause == "append_seqno_anomaly"


def test_stored_rows_order_like_fresh_findings() -> None:
    # a findings row has no cause column: ordering rebuilds it from the rows
    rows = [{"code": "heartbeat_loop", "severity": "error", "first_seq": 7, "last_seq": 9},
            {"code": "append_rejected", "severity": "error", "first_seq": 1, "last_seq": 1},
            {"code": "unary_error", "severity": "error", "first_seq": 0, "last_seq": 0}]
    out = order_findings([Finding.from_json(r) for r in rows])
    assert [f.code for f in out] == ["unary_error", "append_rejected", "heartbeat_loop"]
    assert (out[2].cause, out[2].cause_seq) == ("append_rejected", 1)
    assert out[0].cause is None


def test_rows_as_scripts_pass_them_come_back_as_rows_with_causes() -> None:
    # README: order_findings(rows) over the findings table; rows keep their other columns
    rows = [{"session_id": "s", "code": "heartbeat_loop", "severity": "error", "message": "m", "first_seq": 7,
             "last_seq": 9, "evidence": [7, 9], "suggested_fix": None, "created_at": "t"},
            {"session_id": "s", "code": "append_rejected", "severity": "error", "message": "m", "first_seq": 1,
             "last_seq": 1, "evidence": [1], "suggested_fix": None, "created_at": "t"}]
    out = order_findings(rows)
    assert [r["code"] for r in out] == ["append_rejected", "heartbeat_loop"]
    assert (out[1]["cause"], out[1]["cause_seq"]) == ("append_rejected", 1)
    assert out[0]["cause"] is None and out[0]["created_at"] == "t" and out[1]["evidence"] == [7, 9]
    assert "cause" not in rows[0]


def test_ordering_copies_and_leaves_the_input_alone() -> None:
    loop, close = _f("heartbeat_loop", "error", 12, 29), _f("missing_stream_close", "error", 10, 20)
    out = order_findings([loop, close])
    assert loop.cause is None  # Finding is immutable: the follower comes back as a copy
    assert out == [close, Finding("heartbeat_loop", "error", "heartbeat_loop", 12, 29, (12,),
                                  cause="missing_stream_close", cause_seq=10)]


def test_a_note_neither_explains_nor_follows() -> None:
    note = Finding("completion_args_lossy", "note", "m", 3, 3, (3,), cause="stale", cause_seq=1)
    out = order_findings([_f("tool_loop", "warning", 4, 9), note])
    assert [f.code for f in out] == ["tool_loop", "completion_args_lossy"]
    assert (out[0].cause, out[1].cause, out[1].cause_seq) == (None, None, None)


def test_cause_graph_names_real_codes_and_has_no_cycle() -> None:
    assert set(CAUSES) <= set(RULES)
    assert {c for cs in CAUSES.values() for c in cs} <= set(RULES) | set(BRIDGE_CODES)  # (a bridge finding may be a cause)

    def reach(code: str, seen: frozenset[str]) -> None:
        assert code not in seen, f"cycle through {code}"
        for c in CAUSES.get(code, ()):
            reach(c, seen | {code})

    for code in RULES:
        reach(code, frozenset())
