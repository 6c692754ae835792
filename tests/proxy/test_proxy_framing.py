"""``workbench proxy`` against ``workbench sim`` in gRPC-Web framing (mode D) and in Connect framing.

Real processes: the official ``openai`` SDK → proxy (``--framing``) → simulator over TLS. The
simulator's run log (stderr) names the framing each run arrived in.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from conftest import Rig, start_rig
from support import WORKBENCH, wait_until

from workbench.store.reader import open_reader

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {
                                             "command": {"type": "string"}}, "required": ["command"]}}}
MODES = [("runsse", "grpc-web"), ("runsse", "connect"), ("run", "grpc-web")]


@pytest.fixture(scope="module", params=MODES, ids=[f"{t}-{f}" for t, f in MODES])
def framed_rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    transport, framing = request.param
    r = start_rig(tmp_path_factory.mktemp(f"{transport}-{framing}"), transport=transport,
                  proxy_args=["--framing", framing])
    r.framing = framing  # type: ignore[attr-defined]
    yield r
    r.proxy.stop()
    r.sim.stop()


def sdk(rig: Rig) -> openai.OpenAI:
    return openai.OpenAI(base_url=rig.base_url, api_key="unused", max_retries=0, timeout=60)


def sim_log(rig: Rig, at_least: int = 0, timeout: float = 30.0) -> list[str]:
    """The sim's run lines; a run logs its line when it finishes, which may trail the SDK's answer."""
    def lines() -> list[str]:
        return [line for line in rig.sim.err if line.startswith("run ")]

    wait_until(lambda: len(lines()) >= at_least, timeout=timeout, what=f"{at_least} run lines from the sim")
    return lines()


@pytest.mark.slow
def test_text_tool_call_and_followup(framed_rig: Rig) -> None:
    client = sdk(framed_rig)
    messages = [{"role": "user", "content": "[scenario:tool_flow] say hello with the shell"}]
    first = client.chat.completions.create(model="default", messages=messages, tools=[BASH])
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = first.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"command": "echo hello from workbench"}
    messages += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function", "function": {"name": "bash", "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "hello from workbench"}]
    text = ""
    for chunk in client.chat.completions.create(model="default", messages=messages, tools=[BASH], stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    assert text == "The bash call returned: hello from workbench"
    framing = "grpc_web" if framed_rig.framing == "grpc-web" else None  # type: ignore[attr-defined]
    logged = sim_log(framed_rig, at_least=2)
    assert len(logged) >= 2
    assert all((framing in line) if framing else ("grpc" not in line) for line in logged)


@pytest.mark.slow
def test_errors_become_openai_errors(framed_rig: Rig) -> None:
    with pytest.raises(openai.RateLimitError) as info:
        sdk(framed_rig).chat.completions.create(model="default", messages=[
            {"role": "user", "content": "[scenario:rate_limit] go"}])
    assert info.value.status_code == 429
    with pytest.raises(openai.NotFoundError):
        sdk(framed_rig).chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])


@pytest.mark.slow
def test_models_listed_in_the_chosen_framing(framed_rig: Rig) -> None:
    ids = [m.id for m in sdk(framed_rig).models.list()]
    assert "gpt-5" in ids
    assert "composer-1" in ids


@pytest.mark.slow
@pytest.mark.parametrize("listing", ["agent", "aiserver"])
def test_proxy_works_with_either_model_listing(tmp_path: Path, listing: str) -> None:
    r = start_rig(tmp_path, transport="runsse", proxy_args=["--framing", "grpc-web"],
                  sim_args=["--model-listing", listing, "--models", "default,only-here"])
    try:
        assert [m.id for m in sdk(r).models.list()] == ["default", "only-here"]
    finally:
        r.proxy.stop()
        r.sim.stop()


@pytest.mark.slow
def test_client_command_in_grpc_web_framing(tmp_path: Path) -> None:
    r = start_rig(tmp_path, transport="runsse")
    try:
        db = tmp_path / "client.duckdb"
        out = subprocess.run([*WORKBENCH, "client", "--upstream", r.sim.url, "--ca-file", str(r.sim.cert),
                              "--transport", "runsse", "--framing", "grpc-web", "--record", str(db),
                              "[scenario:text] mode d"],
                             capture_output=True, text=True, timeout=120,
                             env={**os.environ, "CURSOR_ACCESS_TOKEN": "t"})
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "Hello from the workbench simulator (default). You said: mode d"
        reader = open_reader(db)
        try:
            rows = reader.query("SELECT transport, kind, raw, flags FROM frames ORDER BY seq").to_pylist()
        finally:
            reader.close()
        appends = [row for row in rows if row["transport"] == "bidi_append"]
        assert appends
        assert all(row["raw"][:1] == b"\x00" and len(row["raw"]) == 5 + int.from_bytes(
            row["raw"][1:5], "big") for row in appends)  # the whole gRPC-Web body, envelope included
        assert rows[-1]["kind"] == "end_stream"
        assert rows[-1]["flags"] == 0x80  # the trailer frame ended it
        bad = subprocess.run([*WORKBENCH, "client", "--upstream", r.sim.url, "--framing", "grpc", "x"],
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2
        assert "--framing" in bad.stderr
    finally:
        r.proxy.stop()
        r.sim.stop()
