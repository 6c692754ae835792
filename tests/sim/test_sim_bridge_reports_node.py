"""The bridge-report scenarios seen by code we did not derive from our own client: the Node client
in tests/clients (node:http2 / node:https only) against the simulator over TLS on loopback. It
reports the HTTP status, the server's RST_STREAM code, whether turn_ended came and how the
response ended."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import env_without_proxy

NODE = shutil.which("node")
NODE_CLIENT = Path(__file__).resolve().parent.parent / "clients" / "node_agent_client.mjs"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(NODE is None, reason="node (v20+) is not installed")]


async def node_run(sim: Any, scenario: str, *extra: str, transport: str = "run") -> tuple[int, bytes, bytes]:
    assert NODE is not None
    cmd = [NODE, str(NODE_CLIENT), "--base-url", sim.url, "--ca", str(sim.cert_path), "--no-proxy",
           "--transport", transport, "--prompt", f"[scenario:{scenario}] go", "--heartbeat-ms", "200",
           "--timeout-ms", "20000", *extra]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                env=env_without_proxy())
    out, err = await proc.communicate()
    return proc.returncode or 0, out, err


async def node_turn(sim: Any, scenario: str, *extra: str, transport: str = "run") -> tuple[int, dict[str, Any]]:
    code, out, err = await node_run(sim, scenario, *extra, transport=transport)
    assert out, err.decode()[-2000:]
    return code, json.loads(out.decode().splitlines()[-1])


async def test_node_sees_the_reset_after_a_completed_turn(sim_factory: Any) -> None:
    sim = await sim_factory()
    code, summary = await node_turn(sim, "reset_after_turn")
    assert summary["turn_ended"] is True
    assert summary["rst_code"] == 2  # INTERNAL_ERROR, from node:http2's own stream state
    assert not summary["end_stream"]
    assert code == 1  # that client counts a turn without the response's end as failed


async def test_node_sees_the_503(sim_factory: Any) -> None:
    sim = await sim_factory()
    code, summary = await node_turn(sim, "run_http_error")
    assert summary["http_status"] == 503 and summary["turn_ended"] is False and code == 1
    code, summary = await node_turn(sim, "text")  # the same server, another scenario: read-ahead handed on
    assert code == 0 and summary["http_status"] == 200


async def test_node_waits_out_the_held_open_stream(sim_factory: Any) -> None:
    sim = await sim_factory(heartbeat_interval=0.3)
    code, summary = await node_turn(sim, "held_open_after_turn")
    assert code == 0 and summary["turn_ended"] and summary["end_stream"]
    assert summary["elapsed"] >= 0.9  # three heartbeats after turn_ended before the end


async def test_node_loses_the_frame_sync_on_the_bad_length_prefix(sim_factory: Any) -> None:
    """That client hard-fails on the corrupted frame boundary, as pi-cursor did before 1.4.17."""
    sim = await sim_factory()
    code, out, err = await node_run(sim, "bad_length_prefix")
    assert code != 0
    assert b"turn_ended" not in out  # no summary: it died reading the frames after the broken one
    assert b"truncated" in err or b"Error" in err
    rec = (await sim.state.finished_runs(1))[0]
    assert "turn_ended" in rec.sent_kinds


@pytest.mark.parametrize("transport", ["run", "runsse"])
async def test_node_healthy_twins(sim_factory: Any, transport: str) -> None:
    """Arguments only in tool_call_started and an unknown exec case answered with throw: healthy."""
    sim = await sim_factory()
    for scenario in ("args_in_started", "unknown_exec_case"):
        code, summary = await node_turn(sim, scenario, transport=transport)
        assert code == 0, summary
        assert summary["turn_ended"] and summary["end_stream"] and not summary["error"]
    runs = await sim.state.finished_runs(2)
    assert runs[1].execs[0].kind == "unknown_56" and runs[1].execs[0].thrown
