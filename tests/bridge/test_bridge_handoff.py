"""A stateless bridge's hand-off, a tool call the client never offered, and the client's own retry
after a 5xx: each named by its bridge finding, with no agent-side error for what is the bridge's
normal flow (tests/bridge/fault_bridge.py, the official openai SDK, ``workbench capture --bridge``,
``workbench sim``)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import duckdb
import openai
import pytest
from bridge_rig import SDK_TIMEOUT_S, FaultRig, start_fault_rig
from support import run_workbench
from test_bridge_faults import _stream, follow_up

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}}
SCENARIOS = {
    # the run asks for its conversation's last turn (kv_get state): a retry that resumes the failed
    # attempt's checkpoint in a fresh client cannot serve it
    "resume_state": {"description": "asks for the state's blobs, then answers",
                     "steps": [{"kv_set": "system"}, {"kv_set": "user"}, {"kv_get": "state"},
                               {"text": "Answered.", "chunks": 2}, {"checkpoint": True},
                               {"step_completed": True}, {"turn_ended": True}, {"end": "ok"}]},
}


def weather_turn(c: openai.OpenAI) -> None:
    """The client offers only get_weather(city); the run never heard of it and calls its own shell
    tool, and the bridge hands that out as get_weather with the shell command's arguments."""
    got = _stream(c, [{"role": "user", "content": "[scenario:tool_flow] the weather in Paris?"}], tools=[WEATHER])
    assert got["call"]["name"] == "get_weather" and "command" in got["call"]["args"], got


def retried_turn(c: openai.OpenAI) -> None:
    """The SDK's default retries: the bridge answers the first attempt 503, the retry gets through."""
    sdk = c.with_options(max_retries=2)
    got = _stream(sdk, [{"role": "user", "content": "[scenario:resume_state] hello"}])
    assert got["text"] == "Answered.", got


CASES: dict[str, tuple[str, Callable[[openai.OpenAI], None]]] = {
    "left_run": ("leave_open", follow_up),
    "not_offered": ("first_tool", weather_turn),
    "client_retry": ("retry_5xx", retried_turn),
}


@pytest.fixture(scope="module")
def handoff(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, list[str]]]]:
    tmp = tmp_path_factory.mktemp("bridge-handoff")
    rig: FaultRig = start_fault_rig(tmp, sorted({b for b, _ in CASES.values()}), SCENARIOS)
    window: dict[str, tuple[float, float]] = {}
    try:
        for case, (bridge, drive) in CASES.items():
            t0 = time.time()
            drive(rig.sdk(bridge))
            window[case] = (t0, time.time() + 0.001)
            time.sleep(0.05)  # keeps each case's sessions apart in time
        time.sleep(0.1)
        deadline = time.time() + SDK_TIMEOUT_S
        # the left run is closed by the bridge a few seconds later: let that be recorded
        while not _left_run_closed(rig, window["left_run"]) and time.time() < deadline:
            time.sleep(0.2)
    finally:
        rig.stop()
    rows = _sessions(rig.db)
    yield rig.db, {case: [sid for sid, _t, t in rows if a <= t <= b] for case, (a, b) in window.items()}


def _sessions(db: Path) -> list[tuple[str, str, float]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT session_id, transport, epoch_us(started_at) / 1e6 FROM sessions "
                           "ORDER BY started_at").fetchall()
    finally:
        con.close()


def _left_run_closed(rig: FaultRig, span: tuple[float, float]) -> bool:
    r = run_workbench("sessions", "--json", "--db", str(rig.db))
    rows = [json.loads(line) for line in r.stdout.splitlines()] if r.returncode == 0 else []
    runs = [s for s in rows if s["transport"] in ("run", "runsse") and s["status"] != "open"]
    return len(runs) >= 2 and time.time() > span[1] + 3.5


def _diagnose(db: Path, sid: str) -> dict[str, Any]:
    r = run_workbench("diagnose", sid, "--json", "--no-write", "--db", str(db))
    assert r.returncode in (0, 1), r.stderr
    return dict(json.loads(r.stdout))


def _findings(db: Path, sessions: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {sid: _diagnose(db, sid)["findings"] for sid in sessions}


@pytest.mark.slow
def test_left_run_is_a_hand_off_not_an_error(handoff: tuple[Path, dict[str, list[str]]]) -> None:
    db, sessions = handoff
    found = _findings(db, sessions["left_run"])
    assert len(found) == 4, found  # request → run (left), follow-up → fresh run
    bad = [(sid[:8], f["code"], f["message"]) for sid, fs in found.items() for f in fs if f["severity"] == "error"]
    assert bad == []  # never unanswered_exec or stream_ended_without_turn_end for the left run
    left = [f for fs in found.values() for f in fs if f["code"] == "bridge_left_run"]
    assert len(left) == 2, found  # on the follow-up request and on the left run
    for f in left:
        assert f["severity"] == "warning"
        assert "went to the follow-up run" in f["message"] and "tool_call_id toolu_" in f["message"]
        assert "The left run was closed" in f["message"] and "heartbeats" in f["message"]
        assert "cancel the left run" in f["suggested_fix"]
    others = {f["code"] for fs in found.values() for f in fs if f["severity"] == "warning"} - {"bridge_left_run"}
    assert others == set(), found


@pytest.mark.slow
def test_tool_not_offered(handoff: tuple[Path, dict[str, list[str]]]) -> None:
    db, sessions = handoff
    found = _findings(db, sessions["not_offered"])
    hits = [f for fs in found.values() for f in fs if f["code"] == "bridge_tool_not_offered"]
    assert len(hits) == 2, found  # both sides
    msg = hits[0]["message"]
    assert hits[0]["severity"] == "error"
    assert "get_weather" in msg and "required city missing" in msg and "asked for shell" in msg, msg


@pytest.mark.slow
def test_client_retry_after_5xx(handoff: tuple[Path, dict[str, list[str]]]) -> None:
    db, sessions = handoff
    found = _findings(db, sessions["client_retry"])
    retry = [(sid, f) for sid, fs in found.items() for f in fs if f["code"] == "bridge_client_retry"]
    assert len(retry) == 2, found  # the retried request and its run
    for _sid, f in retry:
        assert f["severity"] == "warning"
        assert "automatic retry (attempt 2)" in f["message"] and "HTTP 503" in f["message"], f["message"]
        assert "missed 1 blob(s)" in f["message"], f["message"]
    # the retried run's blob_miss follows from the retry (root cause first)
    run_sid = next(sid for sid, f in retry if "OpenAI side" in f["message"])
    miss = [f for f in found[run_sid] if f["code"] == "blob_miss"]
    assert miss and miss[0]["cause"] == "bridge_client_retry", found[run_sid]
