"""Issue 21, item 1: clients that never answer request_context_args, against the simulator directly.

Two such clients (their context and tools in the run request, as the published Bun proxy sends
them): ours (``answer_request_context=False`` / ``workbench client --no-request-context``) and the
independent Node client (``--no-request-context``). Against the default simulator each completes
the default scenarios on every transport and framing it speaks, and ``workbench diagnose`` of our
client's own recording finds no warning or error. Against a simulator started with
``--strict-request-context`` (a server that waits for the answer) the same clients are parked
until the park timeout ends the run ``deadline_exceeded``. The same cells through a real mitmdump
capture are part of the healthy matrix (``tests/analysis/test_healthy_matrix.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for _dir in (HERE.parent / "analysis", HERE.parent / "capture", HERE.parent / "ingest", HERE.parent / "clients"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

from analysis_rig import echo_args_text  # noqa: E402
from matrix_rig import HEALTHY_SCENARIOS, NO_CONTEXT, Cell, healthy_cells  # noqa: E402
from support import ProcessGroup, env_without_proxy, start_sim  # noqa: E402

from workbench.client.agent import AgentClient  # noqa: E402
from workbench.client.events import ExecHandled  # noqa: E402
from workbench.store import Store  # noqa: E402

NODE = shutil.which("node")
NODE_CLIENT = HERE.parent / "clients" / "node_agent_client.mjs"
TOKEN = "wb-no-context-token"
CELLS = [c for c in healthy_cells() if not c.answers_context]  # the matrix's sample (all with WORKBENCH_FULL_MATRIX=1)

pytestmark = pytest.mark.slow


def _workspace(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text("# demo\nTODO: hello\n")
    (root / "tmp").mkdir(exist_ok=True)
    (root / "tmp" / "scratch.txt").write_text("scratch\n")
    return root


async def _ours(cell: Cell, url: str, ca: Any, ws: Path, store: Any, **kw: Any) -> tuple[Any, list[Any], str]:
    async with AgentClient(url, TOKEN, transport=cell.transport, framing=cell.framing, answer_request_context=False,
                           execute_locally=True, workspace=ws, allow_shell=True, verify=ca, record_to=store,
                           heartbeat_interval=2.0, **kw) as client:
        res = await client.run_turn(f"[scenario:{cell.scenario}] please go ahead", on_exec=echo_args_text,
                                    raise_on_error=False)
        assert client.last_request_id
        return res, res.events, client.last_request_id


async def _node(cell: Cell, url: str, ca: Any, *extra: str) -> tuple[int, dict[str, Any]]:
    assert NODE is not None
    cmd = [NODE, str(NODE_CLIENT), "--base-url", url, "--ca", str(ca), "--no-proxy", "--no-request-context",
           "--transport", cell.transport, "--framing", cell.framing, "--token", TOKEN, "--heartbeat-ms", "2000",
           "--prompt", f"[scenario:{cell.scenario}] please go ahead", "--timeout-ms", "60000", *extra]
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                env=env_without_proxy())
    out, err = await proc.communicate()
    assert out, err.decode()[-2000:]
    return proc.returncode or 0, json.loads(out.decode().splitlines()[-1])


def _diagnose(db: Path) -> dict[str, list[dict[str, Any]]]:
    from workbench.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["diagnose", "--all", "--json", "--db", str(db)])
    assert code in (0, 1), buf.getvalue()[-2000:]
    return {doc["session_id"]: doc["findings"] for doc in map(json.loads, buf.getvalue().splitlines())}


def test_the_sample_covers_every_scenario_transport_and_framing() -> None:
    for style, combos in NO_CONTEXT.items():
        mine = [c for c in CELLS if c.style == style]
        assert {c.scenario for c in mine} == set(HEALTHY_SCENARIOS), style
        assert {(c.transport, c.framing) for c in mine} == set(combos), style
        for scenario in ("tool_flow", "read_write"):  # the scenarios that send request_context_args
            assert {(c.transport, c.framing) for c in mine if c.scenario == scenario} == set(combos)


async def test_clients_that_never_answer_complete_every_default_scenario_directly(sim_factory: Any,
                                                                                tmp_path: Path) -> None:
    if NODE is None:
        pytest.skip("node (v20+) is not installed")
    sim = await sim_factory(heartbeat_interval=0.1, park_timeout=30, token=TOKEN)
    db = tmp_path / "client.duckdb"
    store = Store(db)
    gate = asyncio.Semaphore(6)
    ours: dict[Cell, tuple[Any, list[Any], str]] = {}
    node: dict[Cell, tuple[int, dict[str, Any]]] = {}

    async def one(i: int, cell: Cell) -> None:
        async with gate:
            if cell.node:
                node[cell] = await _node(cell, sim.url, sim.cert_path)
            else:
                ours[cell] = await _ours(cell, sim.url, sim.cert_path, _workspace(tmp_path / f"ws-{i}"), store)

    try:
        await asyncio.wait_for(asyncio.gather(*(one(i, c) for i, c in enumerate(CELLS))), 240)
    finally:
        store.close()
    for cell, (res, events, _rid) in ours.items():
        assert res.error is None, (cell.name, res.error)
        assert res.ended and res.end_missing is None, cell.name
        if cell.scenario in ("tool_flow", "read_write"):
            assert any(isinstance(e, ExecHandled) and e.kind == "request_context" and "unanswered" in e.detail
                       for e in events), cell.name
    for cell, (code, summary) in node.items():
        assert code == 0, (cell.name, summary)
        assert summary["turn_ended"] and summary["error"] is None, (cell.name, summary)
    runs = await sim.state.finished_runs(len(CELLS))
    assert [(r.scenario, r.faults) for r in runs if r.faults] == []
    for r in runs:
        for e in r.execs:
            if e.kind == "request_context":
                assert (e.results, e.background) == (0, True), r.summary()

    # Our client's own recordings, diagnosed: no warning and no error in any of them.
    findings = _diagnose(db)
    assert len(findings) == len(ours)
    bad = {sid: [(f["code"], f["severity"], f["message"][:200]) for f in fs if f["severity"] != "note"]
           for sid, fs in findings.items()}
    assert {sid: fs for sid, fs in bad.items() if fs} == {}


def test_strict_sim_parks_clients_that_never_answer(tmp_path: Path, processes: ProcessGroup) -> None:
    """``workbench sim --strict-request-context``: the same clients wait until the park timeout."""
    sim = processes.add(start_sim(tmp_path, "--strict-request-context", "--park-timeout", "1", "--token", TOKEN))
    ca = Path(sim.cert)  # type: ignore[attr-defined]
    cells = [Cell("tool_flow", "run", "no-context"), Cell("read_write", "runsse", "no-context", framing="grpc-web"),
             Cell("tool_flow", "runsse", "node-no-context", framing="grpc-web")]
    if NODE is None:
        cells = cells[:2]

    async def drive() -> list[Any]:
        async def one(i: int, cell: Cell, **kw: Any) -> Any:
            if cell.node:
                return await _node(cell, sim.url, ca)  # type: ignore[attr-defined]
            res, _ev, _rid = await _ours(cell, sim.url, ca, _workspace(tmp_path / f"ws-{i}"), None, **kw)  # type: ignore[attr-defined]
            return res

        # The last: with a heartbeat budget our client gives up first and says what the server waits for.
        return list(await asyncio.gather(*(one(i, c) for i, c in enumerate(cells)),
                                         one(len(cells), cells[0], heartbeat_budget=5)))

    results = asyncio.run(drive())
    # The command-line client with --no-request-context, the same way.
    cli = subprocess.run([sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main(sys.argv[1:]))",
                          "client", "--upstream", sim.url, "--ca-file", str(ca), "--no-request-context",  # type: ignore[attr-defined]
                          "[scenario:tool_flow] go"], capture_output=True, text=True, timeout=60,
                         env=env_without_proxy({"CURSOR_ACCESS_TOKEN": TOKEN}))
    assert cli.returncode == 1, cli.stderr
    assert "deadline_exceeded" in cli.stderr and "request_context" in cli.stderr, cli.stderr
    assert "Traceback" not in cli.stderr
    for cell, got in zip(cells, results, strict=False):
        if cell.node:
            code, summary = got
            # deadline_exceeded: the Connect end-stream code, gRPC status 4 in a gRPC-Web trailer frame
            assert code == 1 and summary["end_frame"] in ("deadline_exceeded", "grpc-status 4"), summary
            assert not summary["turn_ended"]
        else:
            assert got.error is not None and got.error.code == "deadline_exceeded", (cell.name, got.error)
            assert "request_context" in got.error.message
            assert not got.ended
    budget = results[-1]
    assert budget.error is not None and budget.error.code == "heartbeat_budget"
    assert "request_context exec id 1 was left unanswered on purpose" in budget.error.message
    assert "--strict-request-context" in budget.error.message
    logged = [sim.next_run() for _ in range(len(cells) + 2)]  # type: ignore[attr-defined]
    parked = [line for line in logged if "park timeout waiting for exec 1 (request_context) result" in line]
    assert len(parked) == len(cells) + 1, logged
