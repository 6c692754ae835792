"""The simulator as a real model would be: tool arguments filled from the offered tool's JSON schema
(plausible values per type and property name, required properties always present, never one
string echoed into every field), and blobs kept per conversation, not server-wide."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sim_h2 import RunSession, open_run, run_request, server_msg

from workbench.client.agent import AgentClient
from workbench.client.events import ExecRequest
from workbench.schema import pb
from workbench.sim.schema_args import MAX_DEPTH, fill_args, value_for

pytestmark = pytest.mark.slow  # most tests here start servers

EDIT_SCHEMA = {
    "type": "object",
    "properties": {
        "file_path": {"type": "string", "description": "where"},
        "content": {"type": "string"},
        "command": {"type": "string"},
        "max_results": {"type": "integer", "minimum": 1, "maximum": 5},
        "temperature": {"type": "number"},
        "dry_run": {"type": "boolean"},
        "mode": {"type": "string", "enum": ["overwrite", "append"]},
        "url": {"type": "string", "format": "uri"},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "edits": {"type": "array", "items": {"type": "object", "required": ["oldText", "newText"],
                                               "properties": {"oldText": {"type": "string"},
                                                              "newText": {"type": "string"},
                                                              "note": {"type": "string"}}}},
        "options": {"type": "object", "required": ["encoding"], "properties": {"encoding": {"type": "string",
                                                                                           "default": "utf-8"}}},
        "comment": {"type": ["string", "null"]},
        "optional_path": {"type": "string"},
    },
    "required": ["file_path", "content", "command", "max_results", "temperature", "dry_run", "mode", "url",
                 "tags", "edits", "options", "comment"],
}


def test_every_required_property_gets_a_plausible_value_of_its_type() -> None:
    args = fill_args(EDIT_SCHEMA, {})
    assert set(args) == set(EDIT_SCHEMA["required"])  # optional ones left out, required all there
    assert args["file_path"] == "src/main.py"
    assert args["command"] == "ls -la"
    assert "\n" in args["content"] and args["content"] != args["file_path"]
    assert args["max_results"] == 5 and isinstance(args["max_results"], int)  # clamped to maximum
    assert isinstance(args["temperature"], float)
    assert args["dry_run"] is True
    assert args["mode"] == "overwrite"
    assert args["url"].startswith("https://")
    assert len(args["tags"]) == 2 and all(isinstance(t, str) for t in args["tags"])
    assert set(args["edits"][0]) == {"oldText", "newText"}
    assert args["options"] == {"encoding": "utf-8"}
    assert isinstance(args["comment"], str)
    strings = [v for v in args.values() if isinstance(v, str)]
    assert len(set(strings)) == len(strings)  # never one string echoed into every field


def test_the_scenarios_arguments_are_kept_where_they_fit() -> None:
    shell = {"command": "ls -la"}
    assert fill_args({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                     shell) == {"city": "Berlin"}  # get_weather(city) gets a city, not a shell command
    read = {"path": "README.md"}
    assert fill_args({"properties": {"filePath": {"type": "string"}}, "required": ["filePath"]}, read) == \
        {"filePath": "README.md"}
    assert fill_args({"properties": {"path": {"type": "integer"}}, "required": ["path"]}, read) == {"path": 1}
    assert fill_args({"properties": {"mode": {"enum": ["a", "b"]}}, "required": ["mode"]}, {"mode": "z"}) == \
        {"mode": "a"}
    assert fill_args({"type": "object"}, shell) == shell  # no properties to fit: as the scenario says
    echo = {"properties": {"text": {"type": "string"}}, "required": ["text"]}
    # what the call is about goes into free text, so different calls are different calls
    assert [fill_args(echo, a)["text"] for a in ({"path": "."}, {"pattern": "TODO", "path": "."})] == [".", "TODO"]


def test_recursion_is_bounded() -> None:
    node: dict[str, Any] = {"type": "object", "required": ["child"], "properties": {}}
    node["properties"]["child"] = node  # a schema that refers to itself
    depth = 0
    value = value_for(node)
    while value:
        value = value["child"]
        depth += 1
    assert depth == MAX_DEPTH


WEATHER = {"name": "get_weather", "description": "Weather for a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                             "unit": {"type": "string", "enum": ["c", "f"]},
                                                             "days": {"type": "integer"}},
                            "required": ["city", "days"]},
           "provider_identifier": "weather", "tool_name": "get_weather"}


async def test_a_client_tool_gets_schema_arguments_through_the_sim(sim_factory: Any) -> None:
    sim = await sim_factory()
    seen: list[ExecRequest] = []

    async def on_exec(req: ExecRequest) -> str:
        seen.append(req)
        return "sunny"

    async with AgentClient(sim.url, "t", verify=sim.cert_path, heartbeat_interval=0.1) as c:
        res = await c.run_turn("[scenario:tool_flow] weather?", tools=[WEATHER], on_exec=on_exec)
    assert res.ended
    [req] = seen
    assert req.kind == "mcp"
    assert req.args["args"] == {"city": "Berlin", "days": 1}
    assert json.loads(json.dumps(res.tool_calls[0].args)) == {"city": "Berlin", "days": 1}


async def test_blobs_are_kept_per_conversation(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    store: dict[bytes, bytes] = {}
    await s.send(run_request("[scenario:text] first", conversation_id="conv-A"))
    user_blob = None
    while (f := await s.next()) is not None:
        if f.kind == "kv_server_message.set_blob_args" and b'"role":"user"' in \
                server_msg(f).kv_server_message.set_blob_args.blob_data:
            user_blob = bytes(server_msg(f).kv_server_message.set_blob_args.blob_id)
        if f.kind.startswith("kv_server_message"):
            await s.answer_kv(f, store)
    assert user_blob is not None
    state = pb.ConversationStateStructure(root_prompt_messages_json=[user_blob])

    async def asked_for(conversation: str) -> list[bytes]:
        run = await RunSession.open(client)
        # a scenario without kv_get: any get_blob is the server reading the state's history
        await run.send(run_request("[scenario:held_open_after_turn] again", conversation_id=conversation,
                                   state=state))
        asked = []
        while (f := await run.next()) is not None:
            if f.kind == "kv_server_message.get_blob_args":
                asked.append(bytes(server_msg(f).kv_server_message.get_blob_args.blob_id))
            if f.kind.startswith("kv_server_message"):
                await run.answer_kv(f, store)
        return asked

    # conversation A's own state: the server holds that blob for A and reads it itself
    assert user_blob not in await asked_for("conv-A")
    # another conversation naming the same id: not visible there, so it is asked of that client
    assert user_blob in await asked_for("conv-B")
    await client.close()
