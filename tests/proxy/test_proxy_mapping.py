"""OpenAI ⇄ agent mapping (workbench.proxy.mapping): pure functions."""

from __future__ import annotations

import json

import pytest

from workbench.client.events import CallState, ExecRequest
from workbench.protocol import args as tool_args
from workbench.proxy import mapping


def req(kind: str, **args) -> ExecRequest:
    return ExecRequest(1, "e1", kind, args)


@pytest.mark.parametrize(("kind", "args", "name", "expected"), [
    ("shell", {"command": "ls -la"}, "bash", {"command": "ls -la"}),
    ("shell_stream", {"command": "pwd", "working_directory": "/w"}, "bash", {"command": "pwd", "workdir": "/w"}),
    ("read", {"path": "README.md"}, "read", {"filePath": "README.md"}),
    ("write", {"path": "a.txt", "file_text": "hi"}, "write", {"filePath": "a.txt", "content": "hi"}),
    ("ls", {"path": "src"}, "list", {"path": "src"}),
    ("grep", {"pattern": "TODO", "path": "."}, "grep", {"pattern": "TODO", "path": "."}),
    ("grep", {"glob": "**/*.py", "path": "src"}, "glob", {"pattern": "**/*.py", "path": "src"}),
    ("delete", {"path": "tmp.txt"}, "delete", {"filePath": "tmp.txt"}),
])
def test_builtin_execs_map_to_the_seed_tool_names(kind, args, name, expected) -> None:
    got_name, arguments = mapping.exec_to_tool_call(req(kind, **args))
    assert got_name == name
    assert json.loads(arguments) == expected


def test_argument_names_follow_the_offered_schema() -> None:
    offered = mapping.offered_schemas([{"type": "function", "function": {
        "name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
    assert json.loads(mapping.exec_to_tool_call(req("read", path="x"), offered)[1]) == {"path": "x"}


def test_mcp_keeps_its_own_name_and_rebuilt_args() -> None:
    full = {"description": "d", "tasks": [{"id": "t1"}], "options": {"parallel": True}}
    text = json.dumps(full)
    call = CallState("toolu_1", kind="mcp", args_text=tool_args.accumulate_all([text[:5], text[:30], text]))
    r = ExecRequest(3, "e3", "mcp", {"name": "openai-proxy___task", "tool_name": "task",
                                     "args": {"description": "d", "options": '{"parallel": true}'}}, call)
    name, arguments = mapping.exec_to_tool_call(r, {"task": {}})
    assert name == "task"
    assert json.loads(arguments) == full
    # what a client with the naive_args_concat bug forwards: the garbled text, verbatim
    call.args_text = tool_args.naive_concat([text[:5], text[:30], text])
    assert mapping.exec_to_tool_call(r, {"task": {}})[1] == call.args_text
    with pytest.raises(ValueError):
        json.loads(call.args_text)


def test_call_ids_are_openai_safe() -> None:
    r = req("shell", command="x")
    r.call = CallState("toolu_abc")
    assert mapping.openai_call_id(r) == "toolu_abc"
    r.call = CallState("call\nwith newline")
    cid = mapping.openai_call_id(r)
    assert cid.startswith("call_")
    assert "\n" not in cid


def test_tools_become_mcp_definitions() -> None:
    defs = mapping.tools_to_mcp([{"type": "function", "function": {"name": "bash", "description": "run",
                                                            "parameters": {"type": "object"}}}])
    assert defs == [{"name": "bash", "description": "run", "input_schema": {"type": "object"},
                     "provider_identifier": mapping.PROVIDER, "tool_name": "bash"}]
    with pytest.raises(mapping.MappingError, match=r"tools\[0\]"):
        mapping.tools_to_mcp([{"type": "function"}])


def test_history_is_flattened_with_tool_results() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "[scenario:tool_flow] run it"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "README.md"},
    ]
    text = mapping.flatten_messages(msgs)
    assert text.startswith("<rules>\nBe brief.\n</rules>")
    assert "[scenario:tool_flow] run it" in text
    assert 'ASSISTANT TOOL_CALL (call_id: call_0): bash {"command":"ls"}' in text
    assert "TOOL_RESULT (call_id: call_0, name: bash):\nREADME.md" in text
    assert mapping.has_tool_results(msgs)
    assert mapping.flatten_messages([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == "hi"
    with pytest.raises(mapping.MappingError):
        mapping.flatten_messages([])


@pytest.mark.parametrize(("code", "status"), [("resource_exhausted", 429), ("unauthenticated", 401),
                                              ("not_found", 404), ("heartbeat_budget", 504), ("internal", 502)])
def test_error_statuses(code: str, status: int) -> None:
    assert mapping.error_status(code) == status
    assert mapping.error_body(code, "m")["error"]["code"] == code
