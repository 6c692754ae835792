"""openai SDK → ``workbench proxy`` → ``workbench sim``: real processes, TLS HTTP/2 upstream.

Acceptance (a)–(f) of the reproduction rig; every process listens on a free loopback port.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from conftest import Rig, start_rig

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {
                                             "command": {"type": "string"}}, "required": ["command"]}}}
READ = {"type": "function", "function": {"name": "read", "description": "Read a file",
                                         "parameters": {"type": "object", "properties": {
                                             "filePath": {"type": "string"}}, "required": ["filePath"]}}}
WRITE = {"type": "function", "function": {"name": "write", "description": "Write a file",
                                          "parameters": {"type": "object", "properties": {
                                              "filePath": {"type": "string"}, "content": {"type": "string"}},
                                              "required": ["filePath", "content"]}}}
TASK = {"type": "function", "function": {"name": "task", "description": "Dispatch subagents",
                                         "parameters": {"type": "object", "properties": {
                                             "description": {"type": "string"}, "tasks": {"type": "array"},
                                             "options": {"type": "object"}}}}}


@pytest.fixture(scope="module", params=["run", "runsse", "runpoll"])
def any_rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = start_rig(tmp_path_factory.mktemp(request.param), transport=request.param)
    yield r
    r.proxy.stop()
    r.sim.stop()


def sdk(rig: Rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.base_url, api_key="not-the-upstream-token", max_retries=0, timeout=60)


def stream_text(client: openai.OpenAI, messages: list[dict[str, Any]], **kw: Any) -> tuple[str, str | None, list]:
    text, finish, calls = "", None, []
    for chunk in client.chat.completions.create(model="default", messages=messages, stream=True, **kw):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        calls += choice.delta.tool_calls or []
        finish = choice.finish_reason or finish
    return text, finish, calls


def tool_round(messages: list[dict[str, Any]], call: Any, result: str) -> list[dict[str, Any]]:
    return messages + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]


# (a) and (f) ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_streamed_text(any_rig: Rig) -> None:
    text, finish, calls = stream_text(sdk(any_rig), [{"role": "user", "content": "[scenario:text] hello proxy"}])
    assert text == "Hello from the workbench simulator (default). You said: hello proxy"
    assert finish == "stop"
    assert calls == []


@pytest.mark.slow
def test_non_streamed_text_with_usage(rig: Rig) -> None:
    r = sdk(rig).chat.completions.create(model="default", messages=[
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "[scenario:text] hi"}])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content.startswith("Hello from the workbench simulator")
    assert r.usage is not None
    assert r.usage.completion_tokens > 0
    assert r.usage.prompt_tokens > 0


@pytest.mark.slow
def test_streamed_usage_chunk(rig: Rig) -> None:
    chunks = list(sdk(rig).chat.completions.create(
        model="default", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "[scenario:text] count"}]))
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason == "stop"


# (b) and (f) ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_tool_flow(any_rig: Rig) -> None:
    client = sdk(any_rig)
    messages = [{"role": "user", "content": "[scenario:tool_flow] say hello with the shell"}]
    text, finish, calls = stream_text(client, messages, tools=[BASH])
    assert finish == "tool_calls"
    assert len(calls) == 1
    assert calls[0].function.name == "bash"
    assert json.loads(calls[0].function.arguments) == {"command": "echo hello from workbench"}
    followup = tool_round(messages, calls[0], "hello from workbench")
    r = client.chat.completions.create(model="default", messages=followup, tools=[BASH])
    assert r.choices[0].finish_reason == "stop", r.choices[0].message
    assert "hello from workbench" in (r.choices[0].message.content or "")


# (c) ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_multi_step_read_then_write(rig: Rig) -> None:
    client = sdk(rig)
    tools = [READ, WRITE]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "[scenario:read_write] take notes"}]
    r = client.chat.completions.create(model="default", messages=messages, tools=tools)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "read"
    assert json.loads(call.function.arguments) == {"filePath": "README.md"}
    messages = tool_round(messages, call, "# Readme\n")
    r = client.chat.completions.create(model="default", messages=messages, tools=tools)
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    assert call.function.name == "write"
    assert json.loads(call.function.arguments)["filePath"] == "NOTES.md"
    messages = tool_round(messages, call, "wrote NOTES.md")
    r = client.chat.completions.create(model="default", messages=messages, tools=tools)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content


# (d) ----------------------------------------------------------------------------------------

EXPECTED_TASKS = 40


def large_args_call(rig: Rig) -> Any:
    messages = [{"role": "user", "content": "[scenario:mcp_large_args] audit everything"}]
    _, finish, calls = stream_text(sdk(rig), messages, tools=[TASK])
    assert finish == "tool_calls"
    assert len(calls) == 1
    assert calls[0].function.name == "task"
    return calls[0]


@pytest.mark.slow
def test_large_mcp_args_arrive_intact(rig: Rig) -> None:
    args = json.loads(large_args_call(rig).function.arguments)
    assert set(args) == {"description", "tasks", "options"}
    assert len(args["tasks"]) == EXPECTED_TASKS
    assert args["tasks"][39]["id"] == "task-39"
    assert args["options"] == {"parallel": True, "max_concurrency": 4, "timeout_s": 600}


@pytest.mark.slow
def test_naive_args_concat_reproduces_garbled_json(tmp_path: Path) -> None:
    r = start_rig(tmp_path, proxy_args=["--fault", "naive_args_concat"])
    try:
        raw = large_args_call(r).function.arguments
    finally:
        r.proxy.stop()
        r.sim.stop()
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)
    assert raw.startswith('{"description": "Audit all modules in parallel", "tasks": [')
    assert raw.count('{"description": "Audit all modules') >= 2  # each snapshot repeats the prefix


# (e) ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_no_stream_close_stalls_and_the_budget_gives_up(tmp_path: Path) -> None:
    """Against a strict simulator (the December 2025 service) a client without stream_close stalls."""
    ws = tmp_path / "ws"
    ws.mkdir()
    r = start_rig(tmp_path, proxy_args=["--fault", "no_stream_close", "--heartbeat-budget", "20",
                                        "--execute-locally", "--workspace", str(ws)],
                  sim_args=["--strict-stream-close"])
    try:
        with pytest.raises(openai.APIStatusError) as info:
            sdk(r).chat.completions.create(model="default", messages=[
                {"role": "user", "content": "[scenario:tool_flow] run it here"}])
    finally:
        r.proxy.stop()
        r.sim.stop()
    assert info.value.status_code == 504
    err = info.value.body
    assert isinstance(err, dict)
    assert err["code"] == "heartbeat_budget"
    assert "20 consecutive server heartbeats" in err["message"]
    assert "no stream_close" in err["message"]


# errors, models ------------------------------------------------------------------------------

@pytest.mark.slow
def test_upstream_errors_become_openai_errors(rig: Rig) -> None:
    client = sdk(rig)
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "[scenario:rate_limit] x"}])
    assert info.value.body["code"] == "rate_limit_exceeded"  # OpenAI's word for ERROR_RATE_LIMITED_CHANGEABLE
    assert info.value.body["connect_code"] == "resource_exhausted"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "[scenario:text] x"}])
    with pytest.raises(openai.APIError, match="Upgrade your plan"):  # the detail, not "Error"
        stream_text(client, [{"role": "user", "content": "[scenario:rate_limit] streamed"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=[])


@pytest.mark.slow
def test_models_come_from_get_usable_models(rig: Rig) -> None:
    ids = [m.id for m in sdk(rig).models.list().data]
    assert "default" in ids
    assert "gpt-5" in ids


@pytest.mark.slow
def test_proxy_never_logs_the_token(tmp_path: Path) -> None:
    r = start_rig(tmp_path)
    try:
        stream_text(sdk(r), [{"role": "user", "content": "[scenario:text] hi"}])
        with pytest.raises(openai.RateLimitError):
            sdk(r).chat.completions.create(model="default", messages=[
                {"role": "user", "content": "[scenario:rate_limit] x"}])
    finally:
        r.proxy.stop()
        r.sim.stop()
    out = "\n".join(r.proxy.out + r.proxy.err)
    assert "chat default stream -> stop" in out
    assert "error resource_exhausted" in out  # it does log requests
    assert "sk-test-proxy-token" not in out
    assert r.proxy.proc.returncode == 0


# same-session continuation (the seeds' policy vs the bug) -------------------------------------

def reuse_flow(rig: Rig) -> tuple[Any, list[dict[str, Any]]]:
    client = sdk(rig)
    messages = [{"role": "user", "content": "[scenario:kv_only_on_reuse] investigate"}]
    r = client.chat.completions.create(model="default", messages=messages, tools=[BASH])
    assert r.choices[0].finish_reason == "tool_calls"
    call = r.choices[0].message.tool_calls[0]
    return client, tool_round(messages, call, "Hello from KV blob investigation")


@pytest.mark.slow
def test_tool_result_follow_up_is_a_new_run_on_the_same_conversation(rig: Rig) -> None:
    client, followup = reuse_flow(rig)
    text, finish, _ = stream_text(client, followup, tools=[BASH])
    assert finish == "stop"
    assert text == "Picked up the tool result in a new run: the command ran fine."


@pytest.mark.slow
def test_reuse_session_fault_hides_the_answer_in_kv(tmp_path: Path) -> None:
    r = start_rig(tmp_path, proxy_args=["--fault", "reuse_session", "--heartbeat-budget", "20"])
    try:
        client, followup = reuse_flow(r)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="default", messages=followup, tools=[BASH])
    finally:
        r.proxy.stop()
        r.sim.stop()
    assert info.value.status_code == 504
    assert info.value.body["code"] == "heartbeat_budget"


@pytest.mark.slow
def test_concurrent_requests(rig: Rig) -> None:
    from concurrent.futures import ThreadPoolExecutor

    client = sdk(rig)
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda i: stream_text(client, [
            {"role": "user", "content": f"[scenario:text] request {i}"}])[0], range(6)))
    assert [t.rsplit(": ", 1)[1] for t in texts] == [f"request {i}" for i in range(6)]
