"""openai SDK → ``workbench proxy`` → ``workbench sim``: the Responses API and errors in Cursor's words.

Real processes (the ``rig`` fixture: sim over TLS HTTP/2, proxy on loopback); the official SDK's
``client.responses.create`` whole and streamed, function tools, tool results as
``function_call_output`` items, ``previous_response_id``; the SDK's exceptions carrying the
title, detail and code the sim sends in ``details[]`` as the real service does.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from conftest import Rig

pytestmark = pytest.mark.slow

BASH = {"type": "function", "name": "bash", "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}


def sdk(rig: Rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.base_url, api_key="not-the-upstream-token", max_retries=0, timeout=60)


def test_responses_whole_text(rig: Rig) -> None:
    r = sdk(rig).responses.create(model="default", input="[scenario:text] say hello",
                                  instructions="Be brief.")
    assert r.status == "completed"
    assert r.output_text
    [msg] = [item for item in r.output if item.type == "message"]
    assert msg.role == "assistant"
    assert msg.content[0].type == "output_text"
    assert msg.content[0].text == r.output_text
    assert r.usage is not None
    assert r.usage.output_tokens >= 0
    assert r.id.startswith("resp_")


def test_responses_streamed_text_events(rig: Rig) -> None:
    events = list(sdk(rig).responses.create(model="default", input="[scenario:text] say hello", stream=True))
    types = [e.type for e in events]
    assert types[0] == "response.created"
    assert types[-1] == "response.completed"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1  # streamed, not one blob
    done = [e for e in events if e.type == "response.output_text.done"]
    assert done[0].text == "".join(deltas)
    assert events[-1].response.output_text == "".join(deltas)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types.index("response.output_item.added") < types.index("response.output_text.delta")


def test_responses_function_tool_round_trip(rig: Rig) -> None:
    client = sdk(rig)
    first = client.responses.create(model="default", input="[scenario:tool_flow] say hello with the shell",
                                    tools=[BASH])  # type: ignore[list-item]
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "bash"
    assert json.loads(call.arguments) == {"command": "echo hello from workbench"}
    # the tool result goes back as a function_call_output item, with the call in the input
    follow: list[Any] = [{"role": "user", "content": "[scenario:tool_flow] say hello with the shell"},
                         {"type": "function_call", "call_id": call.call_id, "name": call.name,
                          "arguments": call.arguments},
                         {"type": "function_call_output", "call_id": call.call_id, "output": "hello from workbench"}]
    second = client.responses.create(model="default", input=follow, tools=[BASH])  # type: ignore[list-item]
    assert not [item for item in second.output if item.type == "function_call"]
    assert "hello from workbench" in second.output_text


def test_responses_streamed_function_call_and_previous_response_id(rig: Rig) -> None:
    client = sdk(rig)
    events = list(client.responses.create(model="default", input="[scenario:tool_flow] say hello with the shell",
                                          tools=[BASH], stream=True))  # type: ignore[list-item]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    assert done[0].name == "bash"
    assert json.loads(done[0].arguments) == {"command": "echo hello from workbench"}
    added = [e.item for e in events if e.type == "response.output_item.added" and e.item.type == "function_call"]
    final = events[-1]
    assert final.type == "response.completed"
    [call] = [item for item in final.response.output if item.type == "function_call"]
    assert added[0].call_id == call.call_id
    # continue from the stored response: only the tool result is sent
    stream = client.responses.create(model="default", previous_response_id=final.response.id, tools=[BASH],  # type: ignore[list-item]
                                     input=[{"type": "function_call_output", "call_id": call.call_id,
                                             "output": "hello from workbench"}], stream=True)
    text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
    assert "hello from workbench" in text


def test_unknown_model_speaks_cursors_words(rig: Rig) -> None:
    client = sdk(rig)
    with pytest.raises(openai.NotFoundError) as chat:
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "[scenario:text] x"}])
    with pytest.raises(openai.NotFoundError) as resp:
        client.responses.create(model="nope", input="[scenario:text] x")
    with pytest.raises(openai.NotFoundError) as streamed:
        list(client.responses.create(model="nope", input="[scenario:text] x", stream=True))
    for info in (chat, resp, streamed):
        err = info.value
        assert err.code == "model_not_found"
        assert err.type == "invalid_request_error"
        assert isinstance(err.body, dict)
        assert err.body["message"] == "Model name 'nope' is not valid."
        assert err.body["title"] == "Invalid model"
        assert err.body["cursor_error"] == "ERROR_BAD_MODEL_NAME"
        assert err.body["connect_code"] == "not_found"
        assert "Model name 'nope' is not valid." in str(err)


def test_usage_limit_mid_stream_carries_title_and_detail(rig: Rig) -> None:
    client = sdk(rig)
    with pytest.raises(openai.APIError) as chat:
        for _ in client.chat.completions.create(model="default", stream=True,
                                                messages=[{"role": "user", "content": "[scenario:rate_limit] x"}]):
            pass
    assert chat.value.body["title"] == "You've hit your usage limit"  # type: ignore[index]
    assert str(chat.value) == "Upgrade your plan or switch to a different model to continue."
    # the Responses API reports a failure after the first event as response.failed
    events = list(client.responses.create(model="default", input="[scenario:rate_limit] x", stream=True))
    assert events[-1].type == "response.failed"
    error = events[-1].response.error
    assert error is not None
    assert error.code == "rate_limit_exceeded"
    assert error.message == "Upgrade your plan or switch to a different model to continue."
    assert any(e.type == "response.output_text.delta" for e in events)  # the text before the error arrived


def test_responses_bad_requests_name_the_field(rig: Rig) -> None:
    client = sdk(rig)
    with pytest.raises(openai.BadRequestError, match=r"tools\[0\]: only function tools"):
        client.responses.create(model="default", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError, match="previous_response_id 'resp_nope' is not known"):
        client.responses.create(model="default", input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]: item type 'item_reference' is not supported"):
        client.responses.create(model="default", input=[{"type": "item_reference", "id": "x"}])  # type: ignore[list-item]
