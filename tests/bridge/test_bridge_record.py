"""Recording both sides of ``workbench proxy`` (a real bridge) with ``workbench capture --bridge``:
the openai SDK talks to the printed ``bridge:`` URL, the bridge reaches ``workbench sim`` through
the same capture. The same traffic written by mitmdump as a flow file and as HAR imports alike."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest
from bridge_rig import BridgeRig, start_bridge_rig
from support import run_workbench

from workbench.protocol import kinds


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BridgeRig, Path]]:
    tmp = tmp_path_factory.mktemp("bridge-record")
    rig = start_bridge_rig(tmp, mitm_args=("-w", str(tmp / "both.flows"), "--set", f"hardump={tmp / 'both.har'}"))
    try:
        c = rig.sdk()
        text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "[scenario:text] streamed"}], stream=True)
            if ch.choices)
        assert text.endswith("You said: streamed")
        whole = c.chat.completions.create(model="default", messages=[{"role": "user", "content": "[scenario:text] whole"}])
        assert whole.choices[0].message.content and whole.choices[0].message.content.endswith("whole")
        events = [e.type for e in c.responses.create(model="default", input="[scenario:text] responses", stream=True)]
        assert "response.completed" in events
        assert c.responses.create(model="default", input="[scenario:text] whole response").output_text.endswith(
            "whole response")
        assert [m.id for m in c.models.list()]
    finally:
        rig.stop()
    yield rig, tmp


def _rows(db: Path, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        cur = con.execute(sql, params or [])
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]
    finally:
        con.close()


def _openai_kinds(db: Path) -> dict[str, list[str]]:
    """transport/label → the kinds of its frames, for every OpenAI session."""
    out: dict[str, list[str]] = {}
    for s in _rows(db, "SELECT session_id, transport, path FROM sessions WHERE transport LIKE 'openai%' ORDER BY started_at"):
        ks = [r["kind"] for r in _rows(db, "SELECT kind FROM frames WHERE session_id = ? ORDER BY seq", [s["session_id"]])]
        out.setdefault(s["transport"], []).append(" ".join(k for k in ks if k != kinds.OPENAI_COMMENT))
    return out


@pytest.mark.slow
def test_both_sides_recorded_into_one_database(recorded: tuple[BridgeRig, Path]) -> None:
    rig, _ = recorded
    assert rig.lines[-1] == f"bridge: {rig.client_url}" and rig.client_url.startswith("http://127.0.0.1:")
    sessions = _rows(rig.db, "SELECT * FROM sessions ORDER BY started_at")
    by_transport: dict[str, list[dict[str, Any]]] = {}
    for s in sessions:
        by_transport.setdefault(s["transport"], []).append(s)
    assert len(by_transport["openai_chat"]) == 2 and len(by_transport["openai_responses"]) == 2
    assert len(by_transport["openai_models"]) == 1
    assert len(by_transport["run"]) == 4  # one agent run per completion request
    streamed = by_transport["openai_chat"][0]
    assert streamed["status"] == "complete" and streamed["model"] == "default"
    ks = _openai_kinds(rig.db)
    first = ks["openai_chat"][0].split()
    assert first[0] == kinds.OPENAI_REQUEST and kinds.OPENAI_CONTENT in first
    assert first[-2:] == [kinds.OPENAI_FINISH, kinds.OPENAI_DONE]
    assert ks["openai_chat"][1] == f"{kinds.OPENAI_REQUEST} {kinds.OPENAI_RESPONSE}"
    resp = ks["openai_responses"][0].split()
    assert kinds.OPENAI_CONTENT in resp and kinds.OPENAI_FINISH in resp
    assert ks["openai_models"] == [kinds.OPENAI_MODELS]
    assert ks["openai_responses"][1] == f"{kinds.OPENAI_REQUEST} {kinds.OPENAI_RESPONSE}"


@pytest.mark.slow
def test_every_request_linked_and_no_bridge_finding(recorded: tuple[BridgeRig, Path]) -> None:
    """Streamed and whole, chat and Responses: each request is linked to its run, none is a finding."""
    rig, _ = recorded
    r = run_workbench("diagnose", "--all", "--json", "--db", str(rig.db))
    docs = [json.loads(line) for line in r.stdout.splitlines()]
    assert r.returncode == 0, [d["findings"] for d in docs]
    transports = {s["session_id"]: s["transport"] for s in _rows(rig.db, "SELECT session_id, transport FROM sessions")}
    for d in docs:
        if transports[d["session_id"]] in ("openai_chat", "openai_responses"):
            assert [lk["role"] for lk in d["links"]] == ["caused"], d
            assert "prompt" in d["links"][0]["by"]
            assert d["ttft"]["total_us"] > 0


@pytest.mark.slow
def test_client_key_never_stored(recorded: tuple[BridgeRig, Path]) -> None:
    rig, _ = recorded
    con = duckdb.connect(str(rig.db), read_only=True)
    try:
        for table in ("sessions", "frames"):
            for row in con.execute(f"SELECT * FROM {table}").fetchall():
                assert "sk-client-key-never-stored" not in repr(row)
                assert "sk-test-bridge-upstream-token" not in repr(row)
    finally:
        con.close()
    meta = json.loads(_rows(rig.db, "SELECT CAST(meta AS VARCHAR) AS m FROM sessions WHERE transport = 'openai_chat'")[0]["m"])
    auth = [v for k, v in meta["request_headers"] if k.lower() == "authorization"]
    assert auth and auth[0].startswith("Bearer [redacted sha256:")


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["both.flows", "both.har"])
def test_flow_and_har_imports_hold_the_same_openai_frames(recorded: tuple[BridgeRig, Path], fmt: str,
                                                          tmp_path: Path) -> None:
    rig, tmp = recorded
    db = tmp_path / "imported.duckdb"
    r = run_workbench("import", str(tmp / fmt), "--db", str(db))
    assert r.returncode == 0, r.stderr
    # Each session's frames must match; the order of sessions of one transport need not: a file's
    # session starts at its first frame's time as the proxy stamped it, a live one when the addon
    # saw the request, and under load two sessions a few ms apart have been seen to swap.
    live = {t: sorted(v) for t, v in _openai_kinds(rig.db).items()}
    imported = {t: sorted(v) for t, v in _openai_kinds(db).items()}
    assert imported == live
    runs = _rows(db, "SELECT count(*) AS n FROM sessions WHERE transport = 'run'")[0]["n"]
    assert runs == 4
