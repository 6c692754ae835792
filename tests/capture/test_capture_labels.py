"""Session labels from real traffic: a live capture, a flow file of it imported, the client's own
recording. Sim traffic is labelled with the scenario its ``[scenario:NAME]`` marker names, other
sessions with an excerpt of the first prompt, and ``--redact content`` leaves no excerpt."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
from capture_rig import BIN, Mitm, Sim

from workbench.client.agent import AgentClient
from workbench.store.db import Store
from workbench.store.reader import open_reader

pytestmark = pytest.mark.slow  # every test records through workbench sim (and most through mitmdump)

TOKEN = "label-test-token"
PLAIN = "Fix the flaky   cart test\nand explain why it failed in the nightly build, with the full reasoning"
EXCERPT = "Fix the flaky cart test and explain why it failed in the ni…"


def _labels(db: Path) -> dict[str, str | None]:
    r = open_reader(db)
    try:
        return {row["session_id"]: row["label"] for row in r.query("SELECT session_id, label FROM sessions").to_pylist()}
    finally:
        r.close()


async def _turn(sim: Sim, m: Mitm | None, prompt: str, transport: str = "run", record_to: Any = None) -> str:
    async with AgentClient(sim.url, TOKEN, transport=transport, verify=str(m.ca) if m else str(sim.cert),
                           heartbeat_interval=1.0, record_to=record_to) as c:
        await asyncio.wait_for(c.run_turn(prompt, raise_on_error=False), 120)
        return str(c.last_request_id)


async def test_capture_labels_sessions_and_the_flow_file_import_agrees(
        capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any, tmp_path: Path) -> None:
    flows = tmp_path / "capture.flows"
    m = capture_mitm(extra=("-w", str(flows)))
    capture_proxy_env(m)
    marked = await _turn(capture_sim, m, "[scenario:tool_flow] list the files", transport="runsse")
    plain = await _turn(capture_sim, m, PLAIN)
    assert m.stop() == 0
    labels = _labels(m.db)
    assert labels[marked] == "tool_flow"
    assert labels[plain] == EXCERPT
    # the flow file written alongside has the streamed bodies (kept for mitmproxy's views): an
    # import of it labels the same sessions the same way
    imported = tmp_path / "imported.duckdb"
    r = subprocess.run([str(BIN / "workbench"), "import", str(flows), "--db", str(imported)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert set(_labels(imported).values()) >= {"tool_flow", EXCERPT}


async def test_redact_content_gives_no_excerpt(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    m = capture_mitm(extra=("--set", "cursor_redact=content"))
    capture_proxy_env(m)
    sid = await _turn(capture_sim, m, PLAIN)
    assert m.stop() == 0
    assert _labels(m.db)[sid] is None


async def test_client_recording_is_labelled(capture_sim: Sim, tmp_path: Path) -> None:
    db = tmp_path / "client.duckdb"
    store = Store(db)
    try:
        marked = await _turn(capture_sim, None, "[scenario:text] hello", record_to=store)
        plain = await _turn(capture_sim, None, PLAIN, record_to=store)
    finally:
        store.close()
    labels = _labels(db)
    assert labels[marked] == "text" and labels[plain] == EXCERPT
