"""Findings stored when a session ends (issue 21, items 2 and 3), end to end.

One real mitmdump with the capture addon and the whole-body flow writer, the simulator, and our
client through it: a broken turn (``no_turn_end``), a healthy one (``text``) and the lossy
completion (``mcp_large_args``). Right after the capture stops, and right after ``workbench
import`` of the flow file, ``workbench sessions`` (no ``diagnose`` run) shows each session's real
finding count and top finding, and the lossy one's note.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for _dir in (HERE.parent / "capture", HERE.parent / "ingest"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

from analysis_rig import echo_args_text  # noqa: E402
from capture_rig import ADDON, BIN  # noqa: E402
from import_rig import WHOLE_BODY_ADDON  # noqa: E402
from support import env_without_proxy, free_port, proxied_environ, run_workbench, wait_port  # noqa: E402

from workbench.client.agent import AgentClient  # noqa: E402
from workbench.sim.runner import running_sim  # noqa: E402

pytestmark = pytest.mark.slow  # starts mitmdump and a simulator

PROMPTS = {"broken": "[scenario:no_turn_end] hi", "healthy": "[scenario:text] hi",
           "lossy": "[scenario:mcp_large_args] dispatch"}


def _sessions(db: Path) -> dict[str, dict[str, Any]]:
    r = run_workbench("sessions", "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    return {d["session_id"]: d for d in map(json.loads, r.stdout.splitlines())}


def _sql(db: Path, query: str) -> list[dict[str, Any]]:
    r = run_workbench("sql", query, "--json", "--db", str(db))
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def _session_ids(db: Path, rids: dict[str, str]) -> dict[str, str]:
    """name → the RunSSE session of that request in ``db`` (ids differ between sources)."""
    rows = _sql(db, "SELECT session_id, request_id FROM sessions WHERE transport = 'runsse'")
    by_rid = {r["request_id"]: r["session_id"] for r in rows}
    return {name: by_rid[rid] for name, rid in rids.items()}


def _stored_codes(db: Path) -> set[str]:
    """Findings rows as the file holds them (read-only: nothing is recomputed here)."""
    return {r["code"] for r in _sql(db, "SELECT DISTINCT code FROM findings")}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("stored")
    live_db, flows = out / "live.duckdb", out / "whole.flows"
    port = free_port()
    confdir = out / "mitm-conf"
    with (out / "mitmdump.log").open("w") as log:
        mitm = subprocess.Popen(
            [str(BIN / "mitmdump"), "-q", "-s", str(ADDON), "-s", str(WHOLE_BODY_ADDON),
             "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set", f"confdir={confdir}",
             "--set", "ssl_insecure=true", "--set", f"cursor_db={live_db}", "--set", "cursor_flush_ms=50",
             "--set", f"whole_body_flows={flows}"],
            stdout=log, stderr=subprocess.STDOUT, env=env_without_proxy())
    ids: dict[str, str] = {}
    try:
        wait_port(port, mitm)
        ca = confdir / "mitmproxy-ca-cert.pem"
        proxy = f"http://127.0.0.1:{port}"

        async def drive() -> None:
            async with running_sim(heartbeat_interval=0.05) as sim:
                with proxied_environ(HTTPS_PROXY=proxy, https_proxy=proxy, SSL_CERT_FILE=str(ca)):
                    for name, prompt in PROMPTS.items():
                        async with AgentClient(sim.url, "test-token", transport="runsse", verify=str(ca),
                                               heartbeat_budget=8, workspace=out,
                                               execute_locally=name != "lossy") as client:
                            await client.run_turn(prompt, on_exec=echo_args_text, raise_on_error=False)
                            assert client.last_request_id
                            ids[name] = client.last_request_id

        import asyncio

        asyncio.run(drive())
    finally:
        mitm.send_signal(signal.SIGINT)
        try:
            rc = mitm.wait(120)
        except subprocess.TimeoutExpired:
            mitm.kill()
            mitm.wait()
            raise
    assert rc == 0, (out / "mitmdump.log").read_text()[-3000:]
    stored_live = _stored_codes(live_db)     # before any listing could compute them
    live = _sessions(live_db)
    flow_db = out / "flow.duckdb"
    r = run_workbench("import", str(flows), "--db", str(flow_db))
    assert r.returncode == 0, r.stderr
    stored_flow = _stored_codes(flow_db)
    return {"ids": {"live": _session_ids(live_db, ids), "flow": _session_ids(flow_db, ids)},
            "live": live, "flow": _sessions(flow_db), "stored": {"live": stored_live, "flow": stored_flow},
            "live_db": live_db, "flow_db": flow_db}


@pytest.mark.parametrize("source", ["live", "flow"])
def test_sessions_show_findings_stored_when_the_session_ended(recorded: dict[str, Any], source: str) -> None:
    """No diagnose run: the capture's writer (at the session's end) or the import stored them."""
    assert "stream_ended_without_turn_end" in recorded["stored"][source]
    rows = recorded[source]
    ids = recorded["ids"][source]
    broken = rows[ids["broken"]]
    assert broken["analysis"] == "current"
    assert broken["findings"] >= 1
    assert broken["top_finding"] == "stream_ended_without_turn_end"
    assert broken["top_finding_message"]
    healthy = rows[ids["healthy"]]
    assert (healthy["analysis"], healthy["findings"], healthy["top_finding"]) == ("current", 0, None)
    lossy = rows[ids["lossy"]]
    assert (lossy["analysis"], lossy["findings"], lossy["top_finding"]) == ("current", 0, None)
    assert lossy["notes"] >= 1  # notes never count as findings, nor become the top finding


def test_sessions_table_says_not_analysed_rather_than_zero(recorded: dict[str, Any], tmp_path: Path) -> None:
    """A stamp from another analysis is stale: the listing recomputes it when the file is free,
    and a session nobody analysed is never shown as 0."""
    import duckdb

    db = recorded["live_db"]
    sid = recorded["ids"]["live"]["broken"]
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM findings WHERE session_id = ?", [sid])
        con.execute("UPDATE meta SET value = 'a1 older' WHERE key = ?", [f"analysis:{sid}"])
    finally:
        con.close()
    r = run_workbench("sessions", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert "stored the findings of 1 session" in r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith(sid))
    assert "stream_ended_without_turn_end" in line
    con = duckdb.connect(str(db))
    try:
        con.execute("DELETE FROM meta WHERE key = ?", [f"analysis:{sid}"])
        con.execute("DELETE FROM findings WHERE session_id = ?", [sid])
    finally:
        con.close()
    # read through a reader only (as while a capture holds the file): no analysis, and it says so
    from workbench.overview import finding_states
    from workbench.store.reader import open_reader

    reader = open_reader(str(db))
    try:
        states = finding_states(reader, {sid: "error"})
    finally:
        reader.close()
    assert states[sid].analysis == "not analysed"
    assert states[sid].text() == "not analysed"


def test_lossy_completion_note_in_diagnose_json(recorded: dict[str, Any]) -> None:
    sid = recorded["ids"]["live"]["lossy"]
    r = run_workbench("diagnose", sid, "--json", "--db", str(recorded["live_db"]))
    assert r.returncode == 0, r.stdout + r.stderr  # notes leave the exit status alone
    [doc] = [json.loads(line) for line in r.stdout.splitlines()]
    assert doc["failed"] is False
    assert doc["findings"] == []
    notes = doc["notes"]
    assert notes and all(f["severity"] == "note" for f in notes)
    [lossy] = [f for f in notes if f["code"] == "completion_args_lossy"]
    assert "omitted key: tasks" in lossy["message"]
    assert "options: " in lossy["message"] and "(object) → " in lossy["message"] and "(string)" in lossy["message"]
    r = run_workbench("diagnose", sid, "--db", str(recorded["live_db"]))
    assert r.returncode == 0
    assert "clean (" in r.stdout and "notes (no harm here" in r.stdout
    r = run_workbench("tools", sid, "--db", str(recorded["live_db"]))
    assert r.returncode == 0, r.stderr
    assert "completion vs merged: omitted key: tasks; type change: options: " in r.stdout


async def test_client_record_stores_findings_when_it_ends(tmp_path: Path) -> None:
    """`workbench client --record`: the recording's findings are stored as it closes."""
    import asyncio

    from support import WORKBENCH

    db = tmp_path / "rec.duckdb"
    async with running_sim(heartbeat_interval=0.05) as sim:
        proc = await asyncio.create_subprocess_exec(
            *WORKBENCH, "client", "--upstream", sim.url, "--ca-file", str(sim.cert_path), "--transport", "runsse",
            "--heartbeat-budget", "8", "--record", str(db), "[scenario:no_turn_end] hi",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env_without_proxy({"CURSOR_ACCESS_TOKEN": "sk-record-test"}))
        _out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert b"Traceback" not in err, err
    assert "stream_ended_without_turn_end" in _stored_codes(db)  # before any listing could compute them
    [row] = _sessions(db).values()
    assert (row["analysis"], row["top_finding"]) == ("current", "stream_ended_without_turn_end")
    assert row["findings"] >= 1
