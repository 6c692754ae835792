"""append_seqno_anomaly on a real capture: client (reset_append_seqno) → `workbench capture`
(mitmdump + addon, a real process) → simulator. The client's own recording keeps only the
AgentClientMessage of each BidiAppend, so the seqno is visible only to a capture of the wire."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from analysis_rig import client_close_policy, sim_policy, workbench_capture

from workbench.analysis import analyze
from workbench.client.agent import AgentClient
from workbench.sim.runner import running_sim
from workbench.store.db import Store

pytestmark = pytest.mark.slow  # starts subprocesses or servers

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(("transport", "faults", "style"), [
    ("runsse", ["reset_append_seqno"], None), ("runsse", [], None), ("run", [], None),
    ("runsse", [], "streams-only"), ("run", [], "streams-only")])
async def test_capture_append_seqno_reset_and_healthy_captures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                transport: str, faults: list[str],
                                                                style: str | None) -> None:
    """``style`` streams-only: the real-client style (result alone) against a simulator that
    completes an exec on its result, captured through mitmdump: healthy, no finding."""
    sim_kw = sim_policy("accepted") if style else {}
    client_kw = client_close_policy(style)
    scenario = "read_write" if style else "tool_flow"
    async with workbench_capture(tmp_path, monkeypatch) as (ca, db):
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        async with running_sim(heartbeat_interval=0.05, **sim_kw) as sim:
            async with AgentClient(sim.url, "test-token", transport=transport, faults=faults,
                                   heartbeat_budget=8, verify=str(ca), workspace=tmp_path,
                                   execute_locally=True, **client_kw) as client:
                res = await client.run_turn(f"[scenario:{scenario}] hello", raise_on_error=False)
                sid = client.last_request_id
        # with the fault, the server never saw the message whose seqno was reused
        assert (res.error is not None) == bool(faults)
        assert sid is not None
    store = Store(db)
    try:
        results = analyze(store)
        appends = store.query("SELECT seq, append_seqno FROM frames WHERE session_id = ? AND transport = "
                              "'bidi_append' ORDER BY seq", [sid]).to_pylist()
    finally:
        store.close()
    seqnos = [a["append_seqno"] for a in appends]
    if not faults:
        assert all(r.problems == [] for r in results.values()), {k: [f.message for f in r.findings]
                                                                 for k, r in results.items()}
        assert seqnos == list(range(len(seqnos)))
        return
    assert seqnos[:2] == [0, 0]
    found = [f for f in results[sid].findings if f.code == "append_seqno_anomaly"]
    assert found, [f.code for f in results[sid].findings]
    assert any(w in found[0].message for w in ("duplicate 0", "restart at 0", "seqno 0 reused"))
    assert appends[1]["seq"] in found[0].evidence
