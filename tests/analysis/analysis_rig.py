"""Sessions made by the real rig: the simulated backend (in-process, HTTP/2 over TLS on loopback)
and the workbench client (with fault switches) recording its own session into a DuckDB file."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from workbench.analysis import AnalysisResult, analyze
from workbench.client.agent import AgentClient
from workbench.client.events import Error, ExecRequest, TurnEnded, TurnResult
from workbench.sim import SimConfig
from workbench.sim.runner import running_sim
from workbench.store.db import Store

Prompt = str | Callable[[TurnResult | None], str]


def sim_policy(policy: str | None) -> dict[str, Any]:
    """SimConfig overrides for an exec-completion policy (required: the server waits for
    stream_close, as the service did in December 2025; accepted: a result completes an exec).
    A simulator without the policy switch always waits (its only behaviour)."""
    if policy is None:
        return {}
    if "stream_close" in {f.name for f in dataclasses.fields(SimConfig)}:
        return {"stream_close": policy}
    if policy != "required":
        pytest.skip(f"this simulator has no exec-completion policy {policy!r} yet")
    return {}


def client_close_policy(policy: str | None) -> dict[str, Any]:
    """AgentClient overrides for a close policy (always | streams-only)."""
    if policy is None:
        return {}
    if "close_policy" in inspect.signature(AgentClient).parameters:
        return {"close_policy": policy}
    pytest.skip(f"this client has no close policy {policy!r} yet")

# Short waits so parked runs show their heartbeat loop quickly; the client gives up after 8.
SIM_HEARTBEAT_S = 0.05
HEARTBEAT_BUDGET = 8


@dataclass
class RigRun:
    db: Path
    results: dict[str, AnalysisResult]
    session_ids: list[str]  # in the order the turns ran
    turn_errors: list[str | None] = field(default_factory=list)

    def only(self, index: int = 0) -> AnalysisResult:
        return self.results[self.session_ids[index]]

    def codes(self, index: int = 0) -> list[str]:
        """Codes of the findings proper (notes did no harm and are left out)."""
        return sorted({f.code for f in self.only(index).problems})

    def finding(self, code: str, index: int = 0) -> Any:
        found = [f for f in self.only(index).findings if f.code == code]
        assert found, f"no {code} in {self.codes(index)}"
        return found[0]


async def rig_session(tmp_path: Path, prompts: Sequence[Prompt], *, faults: Sequence[str] = (), transport: str = "run",
                      execute_locally: bool = True, on_exec: Callable[[ExecRequest], Awaitable[Any]] | None = None,
                      ignore_execs: bool = False, abandon_on_exec: bool = False,
                      scenario_dirs: Sequence[Path] = (), stream_close: str | None = None,
                      close_policy: str | None = None) -> RigRun:
    """Run ``prompts`` as consecutive turns of one client against a fresh simulator; analyse.
    A prompt may be a function of the previous turn's result (a stateless client's history)."""
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    (workspace / "README.md").write_text("# demo\nhello\n")
    db = tmp_path / "rig.duckdb"
    store = Store(db)
    errors: list[str | None] = []
    ids: list[str] = []
    kw: dict[str, Any] = {"heartbeat_interval": SIM_HEARTBEAT_S, **sim_policy(stream_close)}
    ckw = client_close_policy(close_policy)
    if scenario_dirs:
        kw["scenario_dirs"] = [str(d) for d in scenario_dirs]
    try:
        async with running_sim(**kw) as sim:
            async with AgentClient(sim.url, "test-token", transport=transport, faults=faults,
                                   heartbeat_budget=HEARTBEAT_BUDGET, verify=str(sim.cert_path), record_to=store,
                                   execute_locally=execute_locally, workspace=workspace, **ckw) as client:
                last: TurnResult | None = None
                for item in prompts:
                    prompt = item if isinstance(item, str) else item(last)
                    last = None
                    error: str | None = None
                    if ignore_execs or abandon_on_exec:
                        # ignore: a caller whose exec handler never answers (docs/protocol.md §7, unanswered_exec), still
                        # reading; abandon: a proxy handing the exec to its own caller, leaving the run.
                        async for ev in client.stream_turn(prompt):
                            if isinstance(ev, Error):
                                error = ev.code
                            if isinstance(ev, TurnEnded) or (abandon_on_exec and isinstance(ev, ExecRequest)):
                                break
                    else:
                        res = await client.run_turn(prompt, on_exec=on_exec, raise_on_error=False)
                        error = res.error.code if res.error else None
                        last = res
                    errors.append(error)
                    if client.last_request_id and client.last_request_id not in ids:
                        ids.append(client.last_request_id)
        results = analyze(store)
    finally:
        store.close()
    return RigRun(db, results, ids, errors)


async def echo_args_text(ev: ExecRequest) -> str:
    """An MCP tool that reports the args the client handed it (the streamed args it rebuilt)."""
    text = ev.call.args_text if ev.call is not None else json.dumps(ev.args)
    return f"task tool received: {text}"


@asynccontextmanager
async def workbench_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Path, Path]]:
    """``workbench capture`` (mitmdump + addon) as the client's proxy: yields (its CA, the database);
    stopped (SIGTERM, exit 0) on leaving."""
    db = tmp_path / "cap.duckdb"
    conf = tmp_path / "mitm"
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
    proc = subprocess.Popen([str(Path(sys.executable).parent / "workbench"), "capture", "--port", "0", "--db", str(db), "--confdir",
                             str(conf), "--flush-ms", "50", "--", "--set", "ssl_insecure=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        monkeypatch.setenv("HTTPS_PROXY", url)
        monkeypatch.setenv("https_proxy", url)
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        yield conf / "mitmproxy-ca-cert.pem", db
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=90)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
