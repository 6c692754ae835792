"""The demo's sessions in a real trace backend: Arize Phoenix (``arize-phoenix`` from PyPI, in a virtual
environment of its own: .ci/run makes it and sets WORKBENCH_PHOENIX), started on loopback, fed by
``workbench export --otlp``, and read back through Phoenix's own REST API."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import bridge_db, wb

from workbench.otel.spans import trace_id_of

pytestmark = [pytest.mark.xdist_group("otel"), pytest.mark.slow]


def _phoenix() -> str:
    found = os.environ.get("WORKBENCH_PHOENIX") or shutil.which("phoenix")
    if found and Path(found).exists():
        return found
    reason = ("Phoenix is not installed: set WORKBENCH_PHOENIX to its `phoenix` program (.ci/run installs "
              "arize-phoenix in .ci-venv-phoenix)")
    if os.environ.get("WORKBENCH_CI") or os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    program = _phoenix()
    work = tmp_path_factory.mktemp("phoenix")
    port = _free_port()
    env = {**os.environ, "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port),
           "PHOENIX_GRPC_PORT": str(_free_port()), "PHOENIX_WORKING_DIR": str(work),
           "PHOENIX_TELEMETRY_ENABLED": "false"}
    log = (work / "phoenix.log").open("w")
    proc = subprocess.Popen([program, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                _get(url + "/v1/projects")
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail("Phoenix did not start: " + (work / "phoenix.log").read_text()[-2000:])
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _spans(url: str, want: int, timeout: float = 60) -> list[dict[str, Any]]:
    """Every span of the default project, once at least ``want`` are there (Phoenix ingests
    asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        spans: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = _get(url + "/v1/projects/default/spans?limit=1000" + (f"&cursor={cursor}" if cursor else ""))
            spans += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        if len(spans) >= want or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def test_phoenix_receives_the_demo_as_genai_traces(phoenix: str, demo_db: Path, tmp_path: Path) -> None:
    r = wb("export", "--otlp", phoenix, "--db", str(demo_db), "--json")
    assert r.returncode == 0, r.stderr
    sent = json.loads(r.stdout)
    b = wb("export", "--otlp", phoenix, "--db", str(bridge_db(tmp_path / "bridge.duckdb")), "--json")
    assert b.returncode == 0, b.stderr
    total = sent["spans"] + json.loads(b.stdout)["spans"]
    spans = _spans(phoenix, total)
    assert len(spans) == total
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["context"]["trace_id"], []).append(s)
    for sid in sent["sessions"]:
        trace = by_trace[f"{trace_id_of(sid):032x}"]
        roots = [s for s in trace if not s["parent_id"]]
        assert len(roots) == 1 and roots[0]["name"].startswith("invoke_agent")
        assert roots[0]["attributes"]["gen_ai.operation.name"] == "invoke_agent"
        assert roots[0]["attributes"]["workbench.session_id"] == sid
        names = {s["attributes"]["gen_ai.operation.name"] for s in trace}
        assert names <= {"invoke_agent", "chat", "execute_tool"}
    tools = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "execute_tool"]
    assert tools and all(s["attributes"]["gen_ai.tool.call.id"] for s in tools)
    # the demo's heartbeat loop: a finding event, and the span it is about failed
    loops = [s for s in spans for e in s["events"] if e["attributes"].get("workbench.finding.code") == "heartbeat_loop"]
    assert loops and all(s["status_code"] == "ERROR" for s in loops)
    # the bridge's two sides, linked (Phoenix keeps no span links: the same link as an attribute)
    o1 = next(s for s in spans if s["attributes"].get("workbench.session_id") == "o1" and not s["parent_id"])
    assert o1["attributes"]["gen_ai.operation.name"] == "chat"
    assert [lk["session_id"] for lk in json.loads(o1["attributes"]["workbench.links"])] == ["r1"]
