"""Stateless follow-ups: histories a fresh run carries, flattened or structured, and where they resume."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import pytest
import sim_h2
from sim_h2 import open_run, run_request, server_msg

from workbench.proxy.mapping import flatten_messages
from workbench.schema import pb
from workbench.sim.history import from_messages, from_prompt, resume_steps
from workbench.sim.scenario import load_scenarios

CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}
OPENAI = [{"role": "system", "content": "be brief"},
          {"role": "user", "content": "[scenario:tool_flow] list files"},
          {"role": "assistant", "content": None, "tool_calls": [CALL]},
          {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\n\nb.txt"}]


def test_our_proxys_flattening_is_read_back() -> None:
    h = from_prompt(flatten_messages(OPENAI))
    assert h is not None
    assert h.source == "prompt"
    assert [(t.call_id, t.name, t.result) for t in h.answered] == [("call_1", "bash", "a.txt\n\nb.txt")]
    assert h.last_user == "[scenario:tool_flow] list files"


def test_the_seed_proxys_flattening_is_read_back() -> None:
    text = ("be brief\n\nUser: [scenario:tool_flow] list files\n\nAssistant: [Called tool: bash({\"command\":\"ls\"})]"
            "\n\n[Tool result for call_0f3a]: a.txt b.txt\n\n\nBased on the tool results above, please continue "
            "your response:")
    h = from_prompt(text)
    assert h is not None
    assert [(t.call_id, t.name, t.result) for t in h.answered] == [("call_0f3a", "bash", "a.txt b.txt")]


def test_a_new_user_message_after_the_results_is_a_new_turn() -> None:
    later = OPENAI + [{"role": "assistant", "content": "Two files."}, {"role": "user", "content": "and now?"}]
    h = from_prompt(flatten_messages(later))
    assert h is not None
    assert h.answered == []
    assert h.last_user == "and now?"
    assert h.result_for("call_1") == "a.txt\n\nb.txt"
    assert from_prompt("User: what does TOOL_RESULT mean?") is None
    assert from_prompt("[scenario:text] hello") is None


def test_structured_histories_ai_sdk_and_openai_shapes() -> None:
    v4 = [{"role": "user", "content": [{"type": "text", "text": "go"}]},
          {"role": "assistant", "content": [{"type": "tool-call", "toolCallId": "t1", "toolName": "Shell", "args": {}}]},
          {"role": "tool", "content": [{"type": "tool-result", "toolCallId": "t1", "toolName": "Shell", "result": "ok"}]}]
    v5 = [{"role": "tool", "content": [{"type": "tool-result", "toolCallId": "t2", "toolName": "read",
                                         "output": {"type": "text", "value": "file body"}}]}]
    h = from_messages(v4 + v5)
    assert h is not None
    assert [(t.call_id, t.name, t.result) for t in h.answered] == [
        ("t1", "Shell", "ok"), ("t2", "read", "file body")]
    h = from_messages(OPENAI)
    assert h is not None
    assert [(t.call_id, t.name, t.result) for t in h.answered] == [("call_1", "bash", "a.txt\n\nb.txt")]
    assert from_messages([{"role": "system", "content": "x"}]) is None


def test_resume_points_come_from_the_scenario() -> None:
    sc = load_scenarios()
    steps = sc["read_write"].steps
    one = resume_steps(steps, 1, None)
    assert one is not None
    assert one[:3] == steps[:3]
    assert one[3:] == steps[5:]  # prelude, then resume_at 5
    assert resume_steps(steps, 2, None) == steps[:3] + steps[7:]
    assert resume_steps(steps, 9, None) == steps[:3] + steps[7:]  # more answers than tools: after the last
    assert resume_steps(steps, 1, 0) == steps[5:]
    assert resume_steps(steps, 0, None) is None
    assert resume_steps(sc["text"].steps, 1, None) is None


@pytest.mark.slow
async def test_structured_history_in_root_prompt_blobs_is_fetched_and_resumed(sim_factory: Any) -> None:
    """A client holding its history as AI-SDK JSON blobs: the server asks for them (get_blob) and continues."""
    sim = await sim_factory()
    messages = [{"role": "user", "content": [{"type": "text", "text": "[scenario:tool_flow] list"}]},
                {"role": "assistant", "content": [{"type": "tool-call", "toolCallId": "toolu_1", "toolName": "Shell",
                                                   "args": {"command": "ls"}}]},
                {"role": "tool", "content": [{"type": "tool-result", "toolCallId": "toolu_1", "toolName": "Shell",
                                              "result": "a.txt b.txt"}]}]
    ids = []
    for m in messages:
        data = json.dumps(m).encode()
        ids.append(hashlib.sha256(data).digest())
        sim_h2._BLOBS[ids[-1]] = data  # the client's own blob store (answer_kv reads it)
    state = pb.ConversationStateStructure(root_prompt_messages_json=ids)
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] list", conversation_id=str(uuid.uuid4()), state=state))
    frames = await s.until("interaction_update.turn_ended")
    asked = [bytes(server_msg(f).kv_server_message.get_blob_args.blob_id) for f in frames
             if f.kind == "kv_server_message.get_blob_args"]
    assert asked[:3] == ids
    text = "".join(server_msg(f).interaction_update.text_delta.text for f in frames
                   if f.kind == "interaction_update.text_delta")
    assert text == "The Shell call returned: a.txt b.txt"
    assert not any(f.kind.startswith("exec_server_message") for f in frames)
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert (rec.path, rec.outcome, rec.faults, rec.blob_misses) == ("history", "turn_ended", [], [])
    await client.close()


@pytest.mark.slow
async def test_a_prompt_without_history_still_plays_the_scenario(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request("[scenario:tool_flow] mention TOOL_RESULT in passing"))
    await s.until("exec_server_message.request_context_args")
    assert sim.state.runs[0].path == "steps"
    await client.close()


@pytest.mark.slow
async def test_a_history_for_a_scenario_with_continuation_plays_it(sim_factory: Any) -> None:
    sim = await sim_factory()
    client, s = await open_run(sim)
    await s.send(run_request(flatten_messages([
        {"role": "user", "content": "[scenario:kv_only_on_reuse] run echo"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Hello from KV blob investigation"}]),
        conversation_id=str(uuid.uuid4())))
    frames = await s.until("interaction_update.turn_ended")
    assert "Picked up the tool result in a new run" in "".join(
        server_msg(f).interaction_update.text_delta.text for f in frames if f.kind == "interaction_update.text_delta")
    await s.stream.end()
    rec = (await sim.state.finished_runs(1))[0]
    assert (rec.path, rec.outcome) == ("history", "turn_ended")
    await client.close()
