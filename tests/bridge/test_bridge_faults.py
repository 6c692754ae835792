"""Each bridge finding, caught on a bridge that has that one fault (tests/bridge/fault_bridge.py).

One capture records every bridge (``--bridge`` once per fault): the openai SDK drives each through
its ``bridge:`` URL against ``workbench sim``; once the capture has stopped, ``workbench diagnose``
on the OpenAI request and on the agent run of the same turn both report the finding, and the bridge
without a fault gives none."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import openai
import pytest
from bridge_rig import FaultRig, start_fault_rig
from support import run_workbench

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {
                                             "command": {"type": "string"}}, "required": ["command"]}}}
SCENARIOS = {
    "long_text": {"description": "a paced answer (3 s at --pace 0.02)",
                  "steps": [{"kv_set": "system"}, {"kv_set": "user"}, {"text": "word " * 150, "chunks": 150},
                            {"turn_ended": True}, {"end": "ok"}]},
    "kv_answer": {"description": "the answer only in an assistant KV blob, no text_delta",
                  "steps": [{"kv_set": "system"}, {"kv_set": "user"},
                            {"kv_set": "assistant_text", "text": "The answer, only in a KV blob, for: {user}"},
                            {"checkpoint": True}, {"step_completed": True}, {"turn_ended": True}, {"end": "ok"}]},
}


def _stream(c: openai.OpenAI, messages: list[dict[str, Any]], tools: bool | list[dict[str, Any]] = False
            ) -> dict[str, Any]:
    """One streamed request; ``tools``: True offers bash, a list offers those tools."""
    out: dict[str, Any] = {"text": "", "finish": None, "call": {"id": None, "name": "", "args": ""}}
    try:
        for ch in c.chat.completions.create(model="default", messages=messages, stream=True,  # type: ignore[call-overload]
                                            **({"tools": [BASH] if tools is True else tools} if tools else {})):
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            out["text"] += d.content or ""
            for tc in d.tool_calls or []:
                out["call"]["id"] = tc.id or out["call"]["id"]
                if tc.function:
                    out["call"]["name"] += tc.function.name or ""
                    out["call"]["args"] += tc.function.arguments or ""
            out["finish"] = ch.choices[0].finish_reason or out["finish"]
    except openai.APIError as exc:
        out["error"] = str(exc)
    return out


def tool_turn(c: openai.OpenAI) -> None:
    _stream(c, [{"role": "user", "content": "[scenario:tool_flow] list things"}], tools=True)


def follow_up(c: openai.OpenAI) -> None:
    msgs: list[dict[str, Any]] = [{"role": "user", "content": "[scenario:tool_flow] list things"}]
    first = _stream(c, msgs, tools=True)
    call = first["call"]
    assert call["id"], first
    msgs += [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["args"]}}]},
        {"role": "tool", "tool_call_id": call["id"], "content": "hello from workbench"}]
    _stream(c, msgs, tools=True)


def text_turn(scenario: str) -> Callable[[openai.OpenAI], None]:
    return lambda c: (_stream(c, [{"role": "user", "content": f"[scenario:{scenario}] please"}]), None)[1]


def healthy(c: openai.OpenAI) -> None:
    follow_up(c)
    text_turn("text")(c)
    text_turn("rate_limit")(c)


# fault → (what the client does, the finding expected on both sides, a word its message says)
CASES: dict[str, tuple[Callable[[openai.OpenAI], None], str | None, str]] = {
    "none": (healthy, None, ""),
    "concat_args": (tool_turn, "bridge_args_mismatch", "concatenated"),
    "drop_key": (tool_turn, "bridge_args_mismatch", "keys missing: command"),
    "drop_text": (text_turn("text"), "bridge_answer_not_delivered", "answer text"),
    "kv_blob": (text_turn("kv_answer"), "bridge_answer_not_delivered", "assistant KV blob"),
    "lose_tool_result": (follow_up, "bridge_tool_result_lost", "reached no agent run"),
    "hang_after_tool": (tool_turn, "bridge_client_stream_silent", "silent for"),
    "stop_on_tool": (tool_turn, "bridge_finish_reason_mismatch", "tool call pending"),
    "close_early": (text_turn("long_text"), "bridge_side_ended_early", "agent run went on"),
    "end_late": (text_turn("text"), "bridge_side_ended_early", "went on for"),
    "mask_error": (text_turn("rate_limit"), "bridge_error_masked", "resource_exhausted"),
}
# the fault each case runs on its bridge ("kv_blob": a faithful text-only bridge meets a KV-only answer)
BRIDGE_OF = {case: ("none" if case == "kv_blob" else case) for case in CASES}


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, list[str]]]]:
    tmp = tmp_path_factory.mktemp("bridge-faults")
    rig: FaultRig = start_fault_rig(tmp, sorted(set(BRIDGE_OF.values())), SCENARIOS)
    window: dict[str, tuple[float, float]] = {}
    try:
        for case, (drive, _code, _word) in CASES.items():
            t0 = time.time()
            drive(rig.sdk(BRIDGE_OF[case]))
            window[case] = (t0, time.time() + 0.001)
            time.sleep(0.05)  # keeps each case's sessions apart in time
    finally:
        rig.stop()
    con = duckdb.connect(str(rig.db), read_only=True)
    try:
        rows = con.execute("SELECT session_id, epoch_us(started_at) / 1e6 FROM sessions ORDER BY started_at").fetchall()
    finally:
        con.close()
    yield rig.db, {case: [sid for sid, t in rows if a <= t <= b] for case, (a, b) in window.items()}


def _diagnose(db: Path, sid: str) -> dict[str, Any]:
    r = run_workbench("diagnose", sid, "--json", "--no-write", "--db", str(db))
    assert r.returncode in (0, 1), r.stderr
    return dict(json.loads(r.stdout))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_fault_gives_its_finding_on_both_sides(faults: tuple[Path, dict[str, list[str]]], case: str) -> None:
    db, sessions = faults
    _drive, code, word = CASES[case]
    docs = [_diagnose(db, sid) for sid in sessions[case]]
    assert docs, f"no session recorded for {case}"
    bridge = {d["session_id"]: [f for f in d["findings"] if f["code"].startswith("bridge_")] for d in docs}
    if code is None:
        assert all(not fs for fs in bridge.values()), bridge
        assert all(d["links"] for d in docs)
        return
    con = duckdb.connect(str(db), read_only=True)
    try:
        transports = dict(con.execute("SELECT session_id, transport FROM sessions").fetchall())
    finally:
        con.close()
    hits = {sid: [f for f in fs if f["code"] == code] for sid, fs in bridge.items()}
    openai_side = [sid for sid, fs in hits.items() if fs and transports[sid] == "openai_chat"]
    agent_side = [sid for sid, fs in hits.items() if fs and transports[sid] in ("run", "runsse", "runpoll")]
    assert openai_side and agent_side, (code, bridge)
    f = hits[openai_side[0]][0]
    assert word in f["message"], f["message"]
    assert f["evidence"] and "agent side: run" in f["message"]
    g = hits[agent_side[0]][0]
    assert g["evidence"] and "OpenAI side: request" in g["message"]
    others = {x["code"] for fs in bridge.values() for x in fs} - {code}
    print(f"{case}: {code}; also {sorted(others)}" if others else f"{case}: {code}")
