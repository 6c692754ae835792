"""Real recordings for import tests: ``workbench sim`` → mitmdump → our client, saved three ways.

One mitmdump process runs the capture addon (the live recording, frame by frame, in wire order)
and ``data/whole_body_flows.py`` (the same exchanges saved by mitmproxy's ``io.FlowWriter`` with
whole bodies, as a proxy that buffered them would have saved them). ``mitmdump -nr FLOWS --set
hardump=HAR`` turns that flow file into a HAR with mitmproxy's own exporter. So the live capture,
the flow file and the HAR hold the same traffic, and their imports can be compared frame by frame.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support import free_port, proxied_environ, wait_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CAPTURE_ADDON = ROOT / "addons" / "cursor_capture.py"
WHOLE_BODY_ADDON = Path(__file__).parent / "data" / "whole_body_flows.py"
TOKEN = "wb-import-token-5e2a91c07d"
# Healthy scenarios our client can run on its own (execs executed in a scratch workspace).
HEALTHY = ("text", "tool_flow", "read_write", "shell_stream", "web_search", "explore")
TIMING_ONLY = frozenset({"client_heartbeat", "interaction_update.heartbeat", "exec_client_control_message.heartbeat"})


@dataclass
class Recording:
    live_db: Path
    flows: Path
    har: Path
    # (scenario, transport) → the run's request id (the live session id, the imported request_id)
    runs: dict[tuple[str, str], str] = field(default_factory=dict)
    errors: dict[tuple[str, str], str | None] = field(default_factory=dict)


def _stop(proc: subprocess.Popen[Any], sig: int = signal.SIGINT, timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _turns(url: str, ca: Path, runs: Sequence[tuple[str, str]], workspace: Path, rec: Recording) -> None:
    from workbench.client.agent import AgentClient

    for scenario, transport in runs:
        async with AgentClient(url, TOKEN, transport=transport, verify=str(ca), heartbeat_interval=0.05,
                               workspace=workspace, execute_locally=True) as client:
            res = await asyncio.wait_for(client.run_turn(f"[scenario:{scenario}] please go", raise_on_error=False), 120)
            assert client.last_request_id
            rec.runs[(scenario, transport)] = client.last_request_id
            rec.errors[(scenario, transport)] = res.error.code if res.error else None


def record(out: Path, runs: Sequence[tuple[str, str]], *, pace: float = 0.01, heartbeat: float = 0.05) -> Recording:
    """Run each (scenario, transport) as one turn through mitmdump; returns the three recordings."""
    out.mkdir(parents=True, exist_ok=True)
    workspace = out / "workspace"
    (workspace / "tmp").mkdir(parents=True, exist_ok=True)
    (workspace / "README.md").write_text("# demo\nTODO: hello\n")
    (workspace / "tmp" / "scratch.txt").write_text("scratch\n")
    rec = Recording(out / "live.duckdb", out / "whole.flows", out / "whole.har")
    sim = subprocess.Popen(
        [str(BIN / "workbench"), "sim", "--port", "0", "--heartbeat-interval", str(heartbeat), "--pace", str(pace),
         "--cert-dir", str(out / "sim-certs"), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    mitm: subprocess.Popen[Any] | None = None
    try:
        assert sim.stdout is not None
        url = sim.stdout.readline().strip()
        assert url.startswith("https://127.0.0.1:"), url
        sim.stdout.readline()
        port = free_port()
        confdir = out / "mitm-conf"
        log = (out / "mitmdump.log").open("w")
        mitm = subprocess.Popen(
            [str(BIN / "mitmdump"), "-q", "-s", str(CAPTURE_ADDON), "-s", str(WHOLE_BODY_ADDON),
             "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set", f"confdir={confdir}",
             "--set", "ssl_insecure=true", "--set", f"cursor_db={rec.live_db}",
             "--set", f"whole_body_flows={rec.flows}"], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_port(port, mitm)
        ca = confdir / "mitmproxy-ca-cert.pem"
        with proxied_environ(HTTPS_PROXY=f"http://127.0.0.1:{port}", https_proxy=f"http://127.0.0.1:{port}",
                             SSL_CERT_FILE=str(ca)):
            asyncio.run(_turns(url, ca, runs, workspace, rec))
    finally:
        if mitm is not None:
            _stop(mitm)
        _stop(sim, signal.SIGTERM)
    subprocess.run([str(BIN / "mitmdump"), "-q", "-nr", str(rec.flows), "--set", f"hardump={rec.har}"],
                   check=True, timeout=300)
    return rec


def wire_view(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, int | None]]:
    """(direction, kind, id) in seq order without timing-only frames and trailing answers: the part
    of a session's order the protocol determines. A close may follow its results at any distance, and
    so may the final ``shell_result`` a client sends after a shell stream's exit (the stream already
    completed the exec, so the server goes on without waiting for it), and a ``request_context_result``
    (the server does not wait for the request context either: docs/protocol.md §5)."""
    streamed: set[int] = set()
    view = []
    for r in rows:
        kind = r["kind"]
        if kind.startswith("exec_client_message.shell_stream"):
            streamed.add(r["ref_id"])
        if kind in TIMING_ONLY or kind in ("exec_client_control_message.stream_close",
                                           "exec_client_message.request_context_result"):
            continue
        if kind == "exec_client_message.shell_result" and r["ref_id"] in streamed:
            continue
        view.append((r["direction"], kind, r["ref_id"]))
    return view


def closes_follow_results(rows: Sequence[dict[str, Any]]) -> bool:
    """Every stream_close comes after its exec and after that exec's results."""
    seen_exec: set[int] = set()
    results: dict[int, int] = {}
    for i, r in enumerate(rows):
        if r["kind"].startswith("exec_server_message"):
            seen_exec.add(r["ref_id"])
        elif r["kind"].startswith("exec_client_message"):
            results[r["ref_id"]] = i
        elif r["kind"] == "exec_client_control_message.stream_close":
            if r["ref_id"] not in seen_exec or results.get(r["ref_id"], -1) > i:
                return False
    return True
