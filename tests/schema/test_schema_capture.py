"""A capture decodes with the active schema and records its identity: the built-in client talks to
``workbench sim`` through a real mitmdump running the capture addon.

The schema made the default is the one extracted from the next build (next_build.py), where
``TextDelta.text`` moved from 1 to 7: the simulator speaks the overlay, so a capture read with the
next build shows its text deltas empty, one read with the overlay shows the text.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from next_build import ADDON, Mitmdump
from support import stop_popen

from workbench.client.agent import AgentClient
from workbench.store import open_reader

TOKEN = "wb-schema-test-token-41c2"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("schema-sim")
    proc = subprocess.Popen([sys.executable, "-m", "workbench.cli", "sim", "--port", "0", "--cert-dir", str(d / "certs"),
                             "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("https://127.0.0.1:"), url
    yield url
    stop_popen(proc)


def _wb(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          env={**os.environ, "XDG_CONFIG_HOME": str(config)})


async def _capture_turn(sim: str, tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch,
                        *options: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    db = tmp_path / "capture.duckdb"
    confdir = tmp_path / "mitm"
    m = Mitmdump(["-s", str(ADDON), "--set", "ssl_insecure=true", "--set", f"cursor_db={db}", *options], confdir,
                 {"XDG_CONFIG_HOME": str(config)})
    try:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{m.port}")
        async with AgentClient(sim, TOKEN, transport="run", verify=str(confdir / "mitmproxy-ca-cert.pem"),
                               heartbeat_interval=0.3) as c:
            res = await asyncio.wait_for(c.run_turn("[scenario:text] say something", raise_on_error=False), 120)
        assert res.error is None, res.error
        sid = c.last_request_id
    finally:
        assert m.stop() == 0, m.log.read_text()[-3000:]
    r = open_reader(db)
    try:
        session = r.query("SELECT * FROM sessions WHERE session_id = ?", [sid]).to_pylist()[0]
        frames = r.query("SELECT kind, summary FROM frames WHERE session_id = ? ORDER BY seq", [sid]).to_pylist()
    finally:
        r.close()
    return session, frames


@pytest.mark.slow
async def test_capture_uses_the_configured_schema_and_records_it(sim: str, next_extracted: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config"
    assert _wb(config, "schema", "use", str(next_extracted)).returncode == 0
    ident = json.loads(_wb(config, "schema", "show", "--json").stdout)["identity"]

    session, frames = await _capture_turn(sim, tmp_path / "a", config, monkeypatch)
    assert json.loads(session["meta"])["schema"] == {"hash": ident["hash"], "source": str(next_extracted.resolve()),
                                                     "messages": ident["messages"]}
    deltas = [f["summary"] for f in frames if f["kind"] == "interaction_update.text_delta"]
    assert deltas
    assert set(deltas) == {'text ""'}  # the next build reads text at field 7; the simulator sends 1

    # cursor_schema=builtin overrides the configured default for this capture
    session, frames = await _capture_turn(sim, tmp_path / "b", config, monkeypatch, "--set", "cursor_schema=builtin")
    recorded = json.loads(session["meta"])["schema"]
    assert recorded["source"] == "built-in overlay"
    assert recorded["hash"] != ident["hash"]
    deltas = [f["summary"] for f in frames if f["kind"] == "interaction_update.text_delta"]
    assert deltas
    assert 'text ""' not in deltas


@pytest.mark.slow
def test_capture_refuses_a_schema_it_cannot_use(tmp_path: Path) -> None:
    config = tmp_path / "config"
    proc = _wb(config, "capture", "--port", "0", "--db", str(tmp_path / "c.duckdb"), "--confdir", str(tmp_path / "m"),
               "--proto", str(tmp_path / "missing-schema"))
    assert proc.returncode == 2
    assert "missing-schema" in proc.stderr
    assert "Traceback" not in proc.stderr
    mitm = subprocess.run(
        [str(Path(sys.executable).with_name("mitmdump")), "-q", "-s", str(ADDON), "--listen-port", "0",
         "--set", f"confdir={tmp_path / 'm'}", "--set", f"cursor_db={tmp_path / 'c.duckdb'}",
         "--set", f"cursor_schema={tmp_path / 'missing-schema'}"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "XDG_CONFIG_HOME": str(config)})
    assert mitm.returncode != 0
    assert "cursor_schema" in mitm.stdout + mitm.stderr
    assert "missing-schema" in mitm.stdout + mitm.stderr
