"""Joining the two sides of ``workbench proxy`` (a healthy bridge): each OpenAI request linked to the
run it caused, the follow-up carrying a tool result to the run that asked for it and to the run that
continues; ``workbench sessions`` and ``workbench diagnose`` show the links, and a healthy bridge
gives zero findings on either side."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bridge_rig import BridgeRig, start_bridge_rig
from support import run_workbench

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {
                                             "command": {"type": "string"}}, "required": ["command"]}}}


def tool_turns(rig: BridgeRig) -> tuple[dict[str, Any], str]:
    """A streamed tool call, then the follow-up with its result; the call and the final text."""
    c = rig.sdk()
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "[scenario:tool_flow] list things"}]
    call: dict[str, Any] = {"id": None, "name": "", "args": ""}
    finish = None
    for ch in c.chat.completions.create(model="default", messages=msgs, tools=[BASH], stream=True):  # type: ignore[arg-type]
        if not ch.choices:
            continue
        for tc in ch.choices[0].delta.tool_calls or []:
            call["id"] = tc.id or call["id"]
            if tc.function:
                call["name"] += tc.function.name or ""
                call["args"] += tc.function.arguments or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls" and call["name"] == "bash"
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": "bash", "arguments": call["args"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "hello from workbench"}]
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model="default", messages=msgs, tools=[BASH], stream=True) if ch.choices)  # type: ignore[arg-type]
    return call, text


@pytest.fixture(scope="module", params=["run", "runsse"])
def joined(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BridgeRig, str]]:
    rig = start_bridge_rig(tmp_path_factory.mktemp(f"join-{request.param}"), transport=request.param)
    try:
        _call, text = tool_turns(rig)
        assert text == "The bash call returned: hello from workbench"
    finally:
        rig.stop()
    yield rig, request.param


def _sessions(db: Path) -> list[dict[str, Any]]:
    r = run_workbench("sessions", "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    return sorted((json.loads(line) for line in r.stdout.splitlines()), key=lambda s: s["started_at"])


@pytest.mark.slow
def test_each_request_linked_to_its_runs(joined: tuple[BridgeRig, str]) -> None:
    rig, transport = joined
    rows = _sessions(rig.db)
    assert [s["transport"] for s in rows] == ["openai_chat", transport, "openai_chat", transport]
    first, asking, follow_up, continuing = rows
    assert first["links"] == [asking["session_id"]]
    by = first["link_details"][0]
    assert by["role"] == "caused" and {"time", "prompt", "tool_call_id"} <= set(by["by"])
    # the follow-up: caused the fresh run (its prompt carries the tool result), answers the first run's call
    details = {d["session_id"]: d for d in follow_up["link_details"]}
    assert set(details) == {asking["session_id"], continuing["session_id"]}
    assert details[continuing["session_id"]]["role"] == "caused"
    assert "tool_result" in details[continuing["session_id"]]["by"]
    assert details[asking["session_id"]] == {"session_id": asking["session_id"], "role": "asked", "by": ["tool_call_id"]}
    assert set(asking["links"]) == {first["session_id"], follow_up["session_id"]}
    assert continuing["links"] == [follow_up["session_id"]]


@pytest.mark.slow
def test_healthy_bridge_gives_no_finding_on_either_side(joined: tuple[BridgeRig, str]) -> None:
    rig, _ = joined
    r = run_workbench("diagnose", "--all", "--json", "--db", str(rig.db))
    assert r.returncode in (0, 1), r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    # the run the proxy leaves after handing out its tool call (closed at once, on Run and RunSSE) is a
    # hand-off, said as a note on both sides; never unanswered_exec, heartbeat_loop or an ending error
    problems = [(d["session_id"][:8], f["code"]) for d in docs for f in d["findings"] if f["severity"] in ("error", "warning")]
    assert problems == []
    assert [f for d in docs for f in d["findings"] if f["code"].startswith("bridge_")] == []
    left = [f for d in docs for f in d["notes"] if f["code"].startswith("bridge_")]
    assert [f["code"] for f in left] == ["bridge_left_run"] * 2, left
    assert all(f["severity"] == "note" and "The left run was closed" in f["message"] for f in left)
    rows = _sessions(rig.db)
    follow_up = rows[2]["session_id"]  # the request that carried the tool result names the hand-off
    assert all(d["findings"] == [] and (d["notes"] == [] or d["session_id"] == follow_up)
               for d in docs if d["session_id"] in {s["session_id"] for s in rows if s["transport"] == "openai_chat"})
    assert all(d["links"] for d in docs)
    ttft = [d["ttft"] for d in docs if d.get("ttft")]
    assert len(ttft) == 2
    for t in ttft:
        parts = t["client_to_bridge_us"] + t["bridge_to_service_us"] + t["service_us"] + t["bridge_to_client_us"]
        assert parts == t["total_us"] and t["bridge_to_service_us"] > 0 and t["service_us"] > 0


@pytest.mark.slow
def test_links_are_stored_by_the_capture(joined: tuple[BridgeRig, str]) -> None:
    import duckdb

    rig, _ = joined
    con = duckdb.connect(str(rig.db), read_only=True)
    try:
        stored = dict(con.execute("SELECT key, value FROM meta WHERE key LIKE 'links:%'").fetchall())
    finally:
        con.close()
    assert len(stored) == 4
    assert all(json.loads(v) for v in stored.values())
