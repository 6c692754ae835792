"""A real bridge's real defect: ``workbench proxy --fault reuse_session`` writes the tool result into
the run that asked for it (the seeds' same-session continuation). Against ``kv_only_on_reuse`` the
run then only heartbeats and hides its answer in a KV blob while the OpenAI client hears nothing
until the proxy's heartbeat budget gives up: ``bridge_client_stream_silent`` on both sides."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from bridge_rig import start_bridge_rig
from support import run_workbench

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command",
                                         "parameters": {"type": "object", "properties": {
                                             "command": {"type": "string"}}, "required": ["command"]}}}


@pytest.mark.slow
def test_reuse_session_defect_found_on_both_sides(tmp_path: Any) -> None:
    rig = start_bridge_rig(tmp_path, proxy_args=("--fault", "reuse_session", "--heartbeat-budget", "40"))
    try:
        c = rig.sdk()
        msgs: list[dict[str, Any]] = [{"role": "user", "content": "[scenario:kv_only_on_reuse] run it"}]
        call = {"id": "", "name": "", "args": ""}
        for ch in c.chat.completions.create(model="default", messages=msgs, tools=[BASH], stream=True):  # type: ignore[call-overload]
            for tc in (ch.choices[0].delta.tool_calls or []) if ch.choices else []:
                call["id"] = tc.id or call["id"]
                call["name"] += tc.function.name or "" if tc.function else ""
                call["args"] += tc.function.arguments or "" if tc.function else ""
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["args"]}}]},
            {"role": "tool", "tool_call_id": call["id"], "content": "Hello from KV blob investigation"}]
        with pytest.raises(openai.APIStatusError) as err:
            for _ in c.chat.completions.create(model="default", messages=msgs, tools=[BASH], stream=True):  # type: ignore[call-overload]
                pass
        assert err.value.status_code == 504
    finally:
        rig.stop()
    r = run_workbench("diagnose", "--all", "--json", "--db", str(rig.db))
    docs = {d["session_id"]: d for d in map(json.loads, r.stdout.splitlines())}
    silent = {sid: [f for f in d["findings"] if f["code"] == "bridge_client_stream_silent"] for sid, d in docs.items()}
    hit = [sid for sid, fs in silent.items() if fs]
    assert len(hit) == 2, {sid: [f["code"] for f in d["findings"]] for sid, d in docs.items()}
    follow_up = next(sid for sid in hit if docs[sid]["frames"] == 2)  # the request and its openai.error
    run = next(sid for sid in hit if sid != follow_up)
    assert {lk["session_id"]: lk["role"] for lk in docs[follow_up]["links"]} == {run: "asked"}
    assert "kv_only_response" in {f["code"] for f in docs[run]["findings"]}
