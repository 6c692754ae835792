"""``workbench proxy`` / ``workbench client`` command lines: errors name the option, the client
command streams an answer, SIGTERM stops the proxy cleanly."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support import run_workbench, start_server

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if k not in ("CURSOR_ACCESS_TOKEN", "HTTPS_PROXY")}
    e.update(env or {})
    return run_workbench(*args, env=e, timeout=120)


def test_proxy_without_a_token_names_the_variable() -> None:
    r = run_cli("proxy", "--port", "0")
    assert r.returncode == 2
    assert "CURSOR_ACCESS_TOKEN" in r.stderr
    assert "--token-file" in r.stderr


def test_proxy_bad_options_name_themselves(tmp_path: Path) -> None:
    r = run_cli("proxy", "--token-file", str(tmp_path / "missing"))
    assert r.returncode == 2
    assert "--token-file" in r.stderr
    r = run_cli("proxy", "--upstream", "ftp://x", env={"CURSOR_ACCESS_TOKEN": "t"})
    assert r.returncode == 2
    assert "--upstream" in r.stderr
    r = run_cli("proxy", "--execute-locally", env={"CURSOR_ACCESS_TOKEN": "t"})
    assert r.returncode == 2
    assert "--workspace" in r.stderr


def test_client_command_streams_the_answer(tmp_path: Path) -> None:
    sim = start_server("sim", "--port", "0", "--cert-dir", str(tmp_path), want_cert=True)
    try:
        token = tmp_path / "token"
        token.write_text("file-token\n")
        r = run_cli("client", "--upstream", sim.url, "--ca-file", str(sim.cert), "--token-file", str(token),
                    "--transport", "runsse", "[scenario:text] from the command line")
        bad = run_cli("client", "--upstream", sim.url, "--ca-file", str(sim.cert), "--token-file", str(token),
                      "[scenario:rate_limit] x")
    finally:
        assert sim.stop() == 0
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "Hello from the workbench simulator (default). You said: from the command line"
    assert bad.returncode == 1
    assert "resource_exhausted" in bad.stderr
    assert "file-token" not in r.stdout + r.stderr + bad.stderr


def test_proxy_prints_its_url_first_and_stops_on_sigterm(tmp_path: Path) -> None:
    p = start_server("proxy", "--port", "0", "--upstream", "https://127.0.0.1:9",
                     env={"CURSOR_ACCESS_TOKEN": "t"})
    assert p.url.startswith("http://127.0.0.1:")
    assert int(p.url.rsplit(":", 1)[1]) > 0
    assert p.stop() == 0
