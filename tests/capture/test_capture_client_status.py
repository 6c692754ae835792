"""The client's own recording and a capture of the same run get the same session status.

Both judge by ``workbench.protocol.status``: the capture on what mitmproxy saw, the client on what
it saw of the wire. Real processes: ``workbench sim`` upstream, mitmdump with the capture addon,
our client recording to its own database through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from capture_rig import Mitm, Sim
from support import session_row

from workbench.client.agent import AgentClient
from workbench.client.events import TextDelta

TOKEN = "wb-status-token-9f3c2a"

pytestmark = pytest.mark.slow


async def _turn(sim: Sim, m: Mitm, transport: str, prompt: str, record_to: Path, *, leave_early: bool = False) -> str:
    async with AgentClient(sim.url, TOKEN, transport=transport, verify=str(m.ca), heartbeat_interval=0.3,
                           record_to=record_to) as c:
        if leave_early:
            async with contextlib.aclosing(c.stream_turn(prompt)) as events:
                async for ev in events:
                    if isinstance(ev, TextDelta):
                        break  # the caller walks away mid-turn: the client closes the run
        else:
            await asyncio.wait_for(c.run_turn(prompt, raise_on_error=False), 120)
        assert c.last_request_id
        return c.last_request_id


@pytest.mark.parametrize(("transport", "prompt", "leave_early", "expected"), [
    ("run", "[scenario:text] hi", False, "complete"),
    ("runsse", "[scenario:text] hi", False, "complete"),
    ("run", "[scenario:rate_limit] hi", False, "error"),
    ("runpoll", "[scenario:rate_limit] hi", False, "error"),
    ("run", "[scenario:long] go", True, "aborted"),
])
async def test_client_recording_and_capture_agree(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any,
                                                  tmp_path: Path, transport: str, prompt: str, leave_early: bool,
                                                  expected: str) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    client_db = tmp_path / "client.duckdb"
    sid = await _turn(capture_sim, m, transport, prompt, client_db, leave_early=leave_early)
    assert m.stop() == 0
    captured, recorded = session_row(m.db, sid, "status, error, http_status, meta"), session_row(client_db, sid, "status, error, http_status, meta")
    assert (captured["status"], recorded["status"]) == (expected, expected)
    assert captured["http_status"] == recorded["http_status"] == 200
    if expected != "aborted":
        assert captured["error"] == recorded["error"]
    else:  # the client reset its stream (RST_STREAM CANCEL): the capture saw the same reset
        assert captured["error"] == recorded["error"] == "stream reset by client (CANCEL)"
        assert json.loads(recorded["meta"])["reset"]["code"] == json.loads(captured["meta"])["reset"]["code"]
