"""``workbench diff A B`` on recorded sessions: the healthy tool flow against the heartbeat loop,
a session against itself, a capture against its own fixture, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import run_workbench

pytestmark = pytest.mark.slow


def _diff(db: Path, *args: str) -> tuple[int, str, str]:
    p = run_workbench("diff", *args, "--db", str(db))
    return p.returncode, p.stdout, p.stderr


def test_tool_flow_vs_heartbeat_loop_names_the_missing_stream_close_and_the_stall(
        diff_demo: tuple[Path, dict[str, str]]) -> None:
    db, ids = diff_demo
    rc, out, err = _diff(db, ids["tool_flow"], ids["heartbeat_loop"])
    assert rc == 1, err
    assert "first divergence:" in out
    exec_lines = [line for line in out.splitlines() if line.strip().startswith("exec shell #1")]
    assert exec_lines and "stream_close only in A" in exec_lines[0]
    assert "heartbeat stall begins at seq" in out
    rc, js, err = _diff(db, ids["tool_flow"], ids["heartbeat_loop"], "--json")
    assert rc == 1, err
    doc = json.loads(js)
    assert doc["same"] is False and doc["b"]["session_id"] == ids["heartbeat_loop"]
    assert doc["first_divergence"] is not None and doc["first_sequence_divergence"]["type"] in (
        "only_in_a", "only_in_b", "count")
    missing = [d for d in doc["differences"] if d["type"] == "exec" and d.get("missing") == "exec_client_control_message.stream_close"]
    assert missing and missing[0]["a_ending"] == "stream_close" and missing[0]["b_ending"] == "open"
    stall = doc["stall"]["b"]
    assert doc["stall"]["a"] is None and stall["heartbeats"] >= 5
    # the stall starts with the first heartbeat after the unclosed exec's result: a step of B alone,
    # or (when the healthy run happened to beat at that point too) one with more heartbeats in B
    beats = [d for d in doc["differences"] if d["type"] in ("only_in_b", "count")
             and d.get("kind") == "interaction_update.heartbeat" and d.get("b_seq") == stall["first_seq"]]
    assert beats, doc["differences"]
    assert stall["last_client_kind"] == "exec_client_message.shell_result"
    codes = {d["code"] for d in doc["differences"] if d["type"] == "finding"}
    assert "missing_stream_close" in codes
    ending = [d for d in doc["differences"] if d["type"] == "ending" and isinstance(d.get("a"), dict)]
    assert ending and ending[0]["a"]["turn_ended"] and not ending[0]["b"]["turn_ended"]


def test_same_session_is_same_and_exit_0(diff_demo: tuple[Path, dict[str, str]]) -> None:
    db, ids = diff_demo
    rc, out, err = _diff(db, ids["tool_flow"], ids["tool_flow"][:8])
    assert rc == 0, err + out
    assert "same:" in out


def test_capture_vs_its_fixture_is_same_across_sources(diff_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, ids = diff_demo
    fx = tmp_path / "tool_flow.json"
    p = run_workbench("export-fixture", ids["tool_flow"], "--db", str(db), "-o", str(fx))
    assert p.returncode == 0, p.stderr
    rc, js, err = _diff(db, ids["tool_flow"], str(fx), "--json")
    assert rc == 0, js
    doc = json.loads(js)
    assert doc["b"]["source"] == "fixture" and doc["a"]["source"] != "fixture"
    # and the fixture of the healthy run against the stalled capture differs as the capture does
    rc, js, _ = _diff(db, str(fx), ids["heartbeat_loop"], "--json")
    assert rc == 1 and json.loads(js)["stall"]["b"] is not None


def test_bad_input_exit_2_naming_it(diff_demo: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    db, ids = diff_demo
    rc, _, err = _diff(db, ids["tool_flow"], "no-such-session")
    assert rc == 2 and "no-such-session" in err and str(db) in err and "Traceback" not in err
    junk = tmp_path / "junk.json"
    junk.write_text("not json")
    rc, _, err = _diff(db, str(junk), ids["tool_flow"])
    assert rc == 2 and str(junk) in err and "Traceback" not in err
    rc, _, err = _diff(db, ids["tool_flow"], ids["tool_flow"], "--timing-threshold", "-1")
    assert rc == 2 and "--timing-threshold" in err
