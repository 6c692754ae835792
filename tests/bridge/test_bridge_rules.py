"""The pieces of the bridge rules that need no process: how arguments differ, what an OpenAI
request and answer carry (``workbench.protocol.openai``)."""

from __future__ import annotations

import json

import pytest

from workbench.analysis.bridge import args_difference
from workbench.protocol import kinds
from workbench.protocol.openai import answer_facts, request_facts

AGENT = {"description": "audit", "tasks": [{"id": "t1", "prompt": "look at every file"}], "options": {"depth": 2}}


@pytest.mark.parametrize(("client", "same_tool", "expected"), [
    (json.dumps(AGENT), True, None),
    (json.dumps(AGENT, indent=2), True, None),
    (json.dumps(AGENT) + json.dumps(AGENT), True, "concatenated"),
    (json.dumps(AGENT)[:40], True, "truncated"),
    (json.dumps({k: v for k, v in AGENT.items() if k != "tasks"}), True, "keys missing: tasks"),
    (json.dumps({**AGENT, "options": json.dumps(AGENT["options"])}), True, "types changed: options dict→str"),
    (json.dumps({**AGENT, "options": {"depth": 2.0}}), True, None),  # a number is a number
    (json.dumps({"path": "t1", "text": "audit look at every file"}), False, None),  # a mapped tool: values kept
    (json.dumps({"text": "audit t1"}), False, "a value is missing: 'look at every file'"),
    (json.dumps({"text": "audit t1", "p": "look at"}), False, "truncated: a value of 18 characters arrived as 7"),
])
def test_args_difference(client: str, same_tool: bool, expected: str | None) -> None:
    got = args_difference(AGENT, client, same_tool)
    assert (got is None) if expected is None else (got is not None and got.startswith(expected)), got


def test_request_facts_follow_up_results() -> None:
    body = json.dumps({"model": "m", "stream": True, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list"}]},
        {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "old"},
        {"role": "assistant", "tool_calls": [{"id": "c2", "function": {"name": "bash", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c2", "content": "new"}]}).encode()
    f = request_facts(body)
    assert f is not None and f.model == "m" and f.stream and f.last_user == "list"
    assert f.tool_results == {"c1": "old", "c2": "new"} and f.new_results == {"c2": "new"}
    assert f.tool_results_last and f.tool_calls_sent == {"c1", "c2"}
    r = request_facts(json.dumps({"input": [{"type": "function_call", "call_id": "c3"},
                                            {"type": "function_call_output", "call_id": "c3", "output": "x"}]}).encode())
    assert r is not None and r.new_results == {"c3": "x"}
    assert request_facts(b"not json") is None


def test_answer_facts_from_chat_chunks() -> None:
    chunks = [
        (1, 10, kinds.OPENAI_ROLE, b'{"choices":[{"index":0,"delta":{"role":"assistant"}}]}'),
        (2, 20, kinds.OPENAI_CONTENT, b'{"choices":[{"index":0,"delta":{"content":"Hi "}}]}'),
        (3, 30, kinds.OPENAI_TOOL_CALLS, b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1",'
                                         b'"function":{"name":"bash","arguments":"{\\"a\\""}}]}}]}'),
        (4, 40, kinds.OPENAI_TOOL_CALLS, b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
                                         b'"function":{"arguments":":1}"}}]}}]}'),
        (5, 50, kinds.OPENAI_FINISH, b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}'),
        (6, 60, kinds.OPENAI_DONE, b"[DONE]"),
    ]
    a = answer_facts(chunks)
    assert a.text == "Hi " and a.text_seqs == [2] and a.first_answer_ts == 20
    assert [(c.call_id, c.name, c.arguments, c.seqs) for c in a.calls] == [("c1", "bash", '{"a":1}', [3, 4])]
    assert (a.finish_reason, a.finish_seq, a.done, a.error) == ("tool_calls", 5, True, None)
    e = answer_facts([(1, 1, kinds.OPENAI_ERROR, b'{"error":{"message":"usage limit"}}')])
    assert e.error and "usage limit" in e.error and e.error_seq == 1


# --- the rules on a pair built by hand (the slow tests drive them over real captures) -----------------

def _pair(**kw: object) -> object:
    from workbench.analysis.bridge import Pair
    from workbench.protocol.openai import AnswerFacts, RequestFacts

    base: dict[str, object] = dict(session_id="o1", status="complete", http_status=200, start_us=0, end_us=500_000,
                                   request=RequestFacts(), request_seq=0, request_ts=1_000, answer=AnswerFacts(),
                                   frames=[{"seq": 0, "ts": 1_000, "direction": "client", "kind": kinds.OPENAI_REQUEST},
                                           {"seq": 1, "ts": 400_000, "direction": "server", "kind": kinds.OPENAI_FINISH}],
                                   caused=[], asked=[])
    base.update(kw)
    return Pair(**base)  # type: ignore[arg-type]


def _side(**kw: object) -> object:
    from workbench.analysis.bridge import Side

    base: dict[str, object] = dict(session_id="r1", role="caused", status="complete", error=None, start_us=10_000,
                                   end_us=450_000)
    base.update(kw)
    return Side(**base)  # type: ignore[arg-type]


def _codes(p: object) -> list[str]:
    from workbench.analysis.bridge import pair_findings

    return [f.code for f in pair_findings(p)]  # type: ignore[arg-type]


def test_heartbeats_while_the_client_hears_nothing_and_how_long() -> None:
    hb = [{"seq": 10 + i, "ts": 100_000 + i * 100_000, "direction": "server", "kind": kinds.SERVER_HEARTBEAT}
          for i in range(20)]
    side = _side(frames=[{"seq": 1, "ts": 50_000, "direction": "server", "kind": kinds.TOOL_CALL_STARTED}, *hb])
    p = _pair(end_us=2_600_000, caused=[side],
              frames=[{"seq": 0, "ts": 1_000, "direction": "client", "kind": kinds.OPENAI_REQUEST},
                      {"seq": 1, "ts": 2_500_000, "direction": "server", "kind": kinds.OPENAI_FINISH}])
    from workbench.analysis.bridge import pair_findings

    found = [f for f in pair_findings(p) if f.code == "bridge_client_stream_silent"]  # type: ignore[arg-type]
    assert found and "silent for 2." in found[0].message and "20 heartbeats" in found[0].message and found[0].agent == {"r1": [10, 11, 12, 28, 29]}
    # the same stretch with the client fed in between is no finding
    fed = [{"seq": 2 + i, "ts": 200_000 + i * 400_000, "direction": "server", "kind": kinds.OPENAI_CONTENT} for i in range(6)]
    p2 = _pair(end_us=2_600_000, caused=[side], frames=[*p.frames[:1], *fed, p.frames[1]])  # type: ignore[attr-defined]
    assert "bridge_client_stream_silent" not in _codes(p2)


def test_error_masked_and_not_when_passed_on() -> None:
    from workbench.protocol.openai import AnswerFacts

    side = _side(status="error", error="resource_exhausted: usage limit", error_seq=5,
                 frames=[{"seq": 5, "ts": 300_000, "direction": "server", "kind": kinds.END_STREAM_ERROR}])
    assert _codes(_pair(caused=[side], answer=AnswerFacts(finish_reason="stop", finish_seq=1))) == ["bridge_error_masked"]
    assert _codes(_pair(caused=[side], answer=AnswerFacts(error="usage limit", error_seq=1))) == []
    assert _codes(_pair(caused=[side], http_status=429)) == []


def test_finish_reason_tool_calls_with_none() -> None:
    from workbench.protocol.openai import AnswerFacts

    side = _side(frames=[{"seq": 3, "ts": 300_000, "direction": "server", "kind": kinds.TURN_ENDED}])
    assert _codes(_pair(caused=[side], answer=AnswerFacts(finish_reason="tool_calls", finish_seq=1))) == [
        "bridge_finish_reason_mismatch"]
    assert _codes(_pair(caused=[side], answer=AnswerFacts(finish_reason="stop", finish_seq=1))) == []


def test_timing_rules_skip_pairs_without_per_frame_times() -> None:
    side = _side(frames=[{"seq": 3, "ts": 100_000, "direction": "server", "kind": kinds.TURN_ENDED}])
    late = _pair(caused=[side], end_us=5_000_000,
                 frames=[{"seq": 0, "ts": 1_000, "direction": "client", "kind": kinds.OPENAI_REQUEST},
                         {"seq": 1, "ts": 4_900_000, "direction": "server", "kind": kinds.OPENAI_FINISH}])
    assert _codes(late) == ["bridge_side_ended_early"]
    late.timed = False  # type: ignore[attr-defined]
    assert _codes(late) == []
