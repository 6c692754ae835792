"""The same faulty runs recorded both ways: through the proxy (``workbench capture``, mitmdump) and
without it (``workbench capture --keylog``: tcpdump + ``SSLKEYLOGFILE``). Both recordings must tell
the same story: the same frames per direction, the same session status, the same findings.

Scenarios: a heartbeat loop (``stream_close_stall`` with a client that omits stream_close), an
answer hidden in KV (``kv_only_on_reuse`` with ``reuse_session``) and garbled tool arguments
(``mcp_large_args`` with ``naive_args_concat``).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import packet_capture_env
import pytest
from capture_rig import BIN
from support import env_without_proxy, proxied_environ

from workbench.analysis import analyze
from workbench.client.agent import AgentClient
from workbench.client.events import ExecRequest
from workbench.sim.runner import SimThread
from workbench.store.db import Store

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def _packet_capture_possible() -> None:
    """Before anything of this module starts: skip (or fail in CI) without tcpdump, tshark and root."""
    packet_capture_env.need()
TOKEN = "wb-both-ways-token-91c4"
TIMING_ONLY = {"client_heartbeat", "interaction_update.heartbeat", "exec_client_control_message.heartbeat"}


async def _echo_args_text(ev: ExecRequest) -> str:
    text = ev.call.args_text if ev.call is not None else json.dumps(ev.args)
    return f"task tool received: {text}"


SCENARIOS: dict[str, tuple[list[str], dict[str, Any]]] = {
    "heartbeat_loop": (["[scenario:stream_close_stall] run echo"], {"faults": ["no_stream_close"]}),
    "kv_only_response": (["[scenario:kv_only_on_reuse] run echo", "[scenario:kv_only_on_reuse] go on"],
                         {"faults": ["reuse_session"]}),
    "args_cumulative_snapshots": (["[scenario:mcp_large_args] dispatch"],
                                  {"faults": ["naive_args_concat"], "execute_locally": False,
                                   "on_exec": _echo_args_text}),
}


async def _runs(url: str, verify: str, workspace: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for code, (prompts, kw) in SCENARIOS.items():
        kw = dict(kw)
        on_exec = kw.pop("on_exec", None)
        async with AgentClient(url, TOKEN, verify=verify, workspace=workspace, heartbeat_budget=8,
                               heartbeat_interval=0.05, **{"execute_locally": True, **kw}) as client:
            ids: list[str] = []
            for prompt in prompts:
                await client.run_turn(prompt, raise_on_error=False, on_exec=on_exec)
                if client.last_request_id and client.last_request_id not in ids:
                    ids.append(client.last_request_id)
        out[code] = ids
    return out


def _stop(proc: subprocess.Popen[str], sig: int) -> str:
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out


@pytest.fixture(scope="module")
def both_ways(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("both-ways")
    ws = d / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("# demo\n")
    rec: dict[str, Any] = {"proxy_db": d / "proxy.duckdb", "keylog_db": d / "keylog.duckdb"}
    with SimThread(heartbeat_interval=0.05, cert_dir=d / "certs") as sim:
        conf = d / "mitm"
        proxy = subprocess.Popen([str(BIN / "workbench"), "capture", "--port", "0", "--db", str(rec["proxy_db"]),
                                  "--confdir", str(conf), "--flush-ms", "50", "--", "--set", "ssl_insecure=true"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
        try:
            assert proxy.stdout is not None
            url = proxy.stdout.readline().strip()
            with proxied_environ(HTTPS_PROXY=url, https_proxy=url):
                rec["proxy"] = asyncio.run(_runs(sim.url, str(conf / "mitmproxy-ca-cert.pem"), ws))
        finally:
            _stop(proxy, signal.SIGTERM)
        keylog = subprocess.Popen([str(BIN / "workbench"), "capture", "--keylog", "--interface", "lo", "--port",
                                   str(sim.port), "--db", str(rec["keylog_db"]), "--keylog-dir", str(d / "cap")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
        try:
            assert keylog.stdout is not None
            env: dict[str, str] = {}
            for line in keylog.stdout:
                if line.startswith("export "):
                    k, v = line.removeprefix("export ").strip().split("=", 1)
                    env[k] = v
                if "NODE_OPTIONS" in env:
                    break
            with proxied_environ(SSLKEYLOGFILE=env["SSLKEYLOGFILE"]):
                rec["keylog"] = asyncio.run(_runs(sim.url, str(sim.cert_path), ws))
        finally:
            rec["keylog_out"] = _stop(keylog, signal.SIGINT)
    for side in ("proxy", "keylog"):
        store = Store(rec[f"{side}_db"])
        try:
            rec[f"{side}_findings"] = analyze(store)
            rec[f"{side}_rows"] = {
                rid: store.query("SELECT direction, kind, ref_id, payload FROM frames WHERE session_id = "
                                 "(SELECT session_id FROM sessions WHERE request_id = ? AND transport = 'run') "
                                 "ORDER BY seq", [rid]).to_pylist()
                for ids in rec[side].values() for rid in ids}
            rec[f"{side}_sessions"] = {r["request_id"]: r for r in store.query("SELECT * FROM sessions").to_pylist()}
        finally:
            store.close()
    return rec


def _story(rows: list[dict[str, Any]], direction: str) -> list[tuple[str, int | None]]:
    """What one side said, without the heartbeats whose number is a matter of timing."""
    return [(r["kind"], r["ref_id"]) for r in rows if r["direction"] == direction and r["kind"] not in TIMING_ONLY]


@pytest.mark.parametrize("code", list(SCENARIOS))
def test_same_story_both_ways(both_ways: dict[str, Any], code: str) -> None:
    proxy_ids, keylog_ids = both_ways["proxy"][code], both_ways["keylog"][code]
    assert len(proxy_ids) == len(keylog_ids) >= 1
    found: dict[str, list[str]] = {}
    for side, ids in (("proxy", proxy_ids), ("keylog", keylog_ids)):
        sessions = both_ways[f"{side}_sessions"]
        results = both_ways[f"{side}_findings"]
        found[side] = sorted({f.code for rid in ids for f in results[sessions[rid]["session_id"]].findings})
    assert code in found["proxy"]
    assert found["keylog"] == found["proxy"]
    for p_rid, k_rid in zip(proxy_ids, keylog_ids, strict=True):
        p_rows, k_rows = both_ways["proxy_rows"][p_rid], both_ways["keylog_rows"][k_rid]
        for direction in ("client", "server"):
            assert _story(k_rows, direction) == _story(p_rows, direction), direction
        p, k = both_ways["proxy_sessions"][p_rid], both_ways["keylog_sessions"][k_rid]
        assert (k["source"], p["source"]) == ("import:pcap", "capture")
        assert k["status"] == p["status"], (k["error"], p["error"])
