"""``bridge_tool_not_offered``'s checks, on request bodies as OpenAI clients send them: a tool call
under a name the client never offered, and arguments its schema rejects (the live case, the shell
call handed out as ``get_weather``, is in test_bridge_handoff.py)."""

from __future__ import annotations

import json

from workbench.analysis.bridge import Pair, pair_findings
from workbench.analysis.bridge_tools import offered_tools, schema_misfit
from workbench.protocol.openai import AnswerFacts, ClientCall, RequestFacts

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                           "units": {"type": ["string", "null"]}},
          "required": ["city"], "additionalProperties": False}
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]}).encode()
RESPONSES = json.dumps({"model": "m", "input": "hi",
                        "tools": [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]}).encode()


def test_offered_tools_of_both_request_shapes() -> None:
    assert offered_tools(CHAT) == {"get_weather": SCHEMA}
    assert offered_tools(RESPONSES) == {"get_weather": SCHEMA}
    assert offered_tools(b'{"model": "m", "messages": []}') == {}
    assert offered_tools(b"not json") is None
    assert offered_tools(b"[" * 100_000) is None  # hostile nesting: no traceback


def test_schema_misfit_names_each_way_arguments_fail() -> None:
    assert schema_misfit(SCHEMA, '{"city": "Paris", "days": 3, "units": null}') is None
    assert schema_misfit(SCHEMA, '{"command": "ls"}') == "required city missing; not in the schema: command"
    assert schema_misfit(SCHEMA, '{"city": "Paris", "days": "3"}') == "days is str, the schema wants integer"
    assert schema_misfit(SCHEMA, '{"city": "Paris", "days": true}') == "days is bool, the schema wants integer"
    assert schema_misfit(SCHEMA, "[1]") == "the arguments are a JSON list, not an object"
    assert schema_misfit(SCHEMA, "{not json") is None  # bridge_args_mismatch speaks for that
    assert schema_misfit(SCHEMA, "[" * 100_000) is None
    assert schema_misfit({"type": "object", "properties": {}}, '{"anything": 1}') is None  # extra keys allowed


def _pair(payload: bytes, name: str, arguments: str) -> Pair:
    answer = AnswerFacts(calls=[ClientCall("call_1", name, arguments, [3, 4])])
    return Pair("s-openai", "complete", 200, 0, 1, RequestFacts(), 0, 0, answer, [], [], [],
                offered=offered_tools(payload))


def test_a_call_under_a_name_never_offered() -> None:
    [f] = pair_findings(_pair(CHAT, "bash", '{"command": "ls"}'))
    assert f.code == "bridge_tool_not_offered" and f.severity == "error"
    assert "no tool named 'bash' (it offered: get_weather)" in f.message
    assert f.openai == [3, 4]


def test_a_call_that_fits_gives_nothing() -> None:
    assert pair_findings(_pair(CHAT, "get_weather", '{"city": "Paris"}')) == []
