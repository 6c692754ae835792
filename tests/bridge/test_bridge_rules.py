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
