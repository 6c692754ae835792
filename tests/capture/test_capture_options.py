"""Options on every path: a real mitmdump with the addon, and ``workbench capture`` in reverse mode."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from capture_rig import ADDON, BIN, NODE_CLIENT, Sim
from support import env_without_proxy, free_port

from workbench.store import open_reader

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def test_mitmdump_refuses_an_unknown_redaction_level(tmp_path: Path, capture_confdir: Path) -> None:
    db = tmp_path / "never.duckdb"
    proc = subprocess.run(
        [str(BIN / "mitmdump"), "-q", "-s", str(ADDON), "--listen-host", "127.0.0.1", "--listen-port",
         str(free_port()), "--set", f"confdir={capture_confdir}", "--set", f"cursor_db={db}",
         "--set", "cursor_redact=contents"],
        capture_output=True, text=True, timeout=120, env=env_without_proxy())
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "OptionsError" in out
    assert "cursor_redact='contents'" in out
    assert "secrets, content" in out
    assert not db.exists()  # stopped before recording anything with the wrong redaction


def test_mitmdump_logs_the_effective_redaction_and_database(tmp_path: Path, capture_confdir: Path) -> None:
    db = tmp_path / "sub" / "logged.duckdb"
    proc = subprocess.Popen(
        [str(BIN / "mitmdump"), "-s", str(ADDON), "--listen-host", "127.0.0.1", "--listen-port", str(free_port()),
         "--set", f"confdir={capture_confdir}", "--set", f"cursor_db={db}", "--set", "cursor_redact=content"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env_without_proxy())
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "cursor capture: recording" in line:
                break
        else:
            pytest.fail("mitmdump ended without logging where it records")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert f"recording agent traffic into {db} (redaction: content)" in line


@pytest.mark.skipif(shutil.which("node") is None, reason="node (v20+) is not installed")
def test_capture_command_reverse_mode_prints_the_base_url_clients_use(capture_sim: Sim, capture_confdir: Path,
                                                                      tmp_path: Path) -> None:
    db = tmp_path / "rev.duckdb"
    proc = subprocess.Popen(
        [str(BIN / "workbench"), "capture", "--port", "0", "--db", str(db), "--confdir", str(capture_confdir),
         "--mode", f"reverse:{capture_sim.url}", "--", "--set", "ssl_insecure=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(6)]
        url = lines[0]
        assert url.startswith("https://127.0.0.1:")
        assert lines[1] == f"ca: {capture_confdir / 'mitmproxy-ca-cert.pem'}"
        assert lines[2].startswith(f"base url: {url}  (reverse proxy to {capture_sim.url}")
        assert lines[3] == f"export CURSOR_API_ENDPOINT={url}"
        assert not any("HTTPS_PROXY" in ln for ln in lines)
        base = lines[2].split()[2]
        node = subprocess.run(
            [str(shutil.which("node")), str(NODE_CLIENT), "--base-url", base, "--ca",
             str(capture_confdir / "mitmproxy-ca-cert.pem"), "--no-proxy", "--prompt", "[scenario:text] reverse"],
            capture_output=True, text=True, timeout=120, env=env_without_proxy())
        summary: dict[str, Any] = json.loads(node.stdout.splitlines()[-1])
        assert node.returncode == 0, summary
        assert summary["turn_ended"], summary
        assert summary["end_stream"], summary
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "(redaction: secrets)" in err
    r = open_reader(db)
    row = r.query("SELECT status, transport, meta FROM sessions WHERE session_id = ?",
                  [summary["request_id"]]).to_pylist()
    r.close()
    assert row
    assert row[0]["status"] == "complete"
    assert '"proxy_mode": "reverse"' in row[0]["meta"]
