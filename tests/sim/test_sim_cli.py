"""``workbench sim`` as a process: URL on the first line, real TLS clients, SIGTERM, bad options."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from support import WORKBENCH, ProcessGroup, run_workbench

pytestmark = pytest.mark.slow  # starts subprocesses or servers


def test_cli_prints_url_first_serves_and_stops_on_sigterm(tmp_path: Path, processes: ProcessGroup) -> None:
    proc = processes.workbench("sim", "--port", "0", "--cert-dir", str(tmp_path), "--heartbeat-interval", "0.05")
    url = proc.next_line().strip()
    assert re.fullmatch(r"https://127\.0\.0\.1:\d+", url), url
    cert_line = proc.next_line().strip()
    assert cert_line == f"cert: {tmp_path / 'sim-cert.pem'}"
    # A client that trusts the certificate through SSL_CERT_FILE (OpenSSL's default paths).
    probe = textwrap.dedent(f"""
        import ssl, urllib.request
        req = urllib.request.Request("{url}/agent.v1.AgentService/GetUsableModels", data=b"{{}}",
            headers={{"authorization": "Bearer t", "content-type": "application/json"}})
        print(urllib.request.urlopen(req, context=ssl.create_default_context()).read().decode())
    """)
    env = {**os.environ, "SSL_CERT_FILE": str(tmp_path / "sim-cert.pem")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"modelId": "claude-4-sonnet"' in out.stdout
    assert proc.stop(timeout=30) == 0
    err = "\n".join(proc.err)
    assert "stopped" in err
    assert "Traceback" not in err


def test_cli_unknown_scenario_exits_2(tmp_path: Path) -> None:
    r = run_workbench("sim", "--scenario", "nope", "--cert-dir", str(tmp_path), timeout=60)
    err = r.stderr
    assert r.returncode == 2
    assert "unknown scenario 'nope'" in err
    assert "tool_flow" in err
    assert "kv_only_on_reuse" in err


def test_cli_list_and_bad_scenario_dir(tmp_path: Path) -> None:
    (tmp_path / "mine.json").write_text('{"description": "mine", "steps": [{"text": "x"}]}')
    out = subprocess.run([*WORKBENCH, "sim", "--scenario-dir", str(tmp_path),
                          "--list-scenarios"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert re.search(r"^mine\s+mine$", out.stdout, re.M)
    for name in ("reset_after_turn", "held_open_after_turn", "bad_length_prefix", "unknown_exec_case",
                 "empty_blob_answer", "run_http_error", "args_in_started", "long_exec"):
        assert re.search(rf"^{name}\s+\S", out.stdout, re.M), name
    out = subprocess.run([*WORKBENCH, "sim", "--scenario-dir", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "does not exist" in out.stderr


def test_cli_policy_options_are_checked(tmp_path: Path) -> None:
    for args, message in [(["--strict-stream-close", "--stream-close", "accepted"], "contradicts --stream-close"),
                          (["--exec-stream-close", "shell"], "KIND=POLICY"),
                          (["--exec-stream-close", "bash=required"], "unknown exec type 'bash'"),
                          (["--exec-stream-close", "shell=sometimes"], "must be one of required, accepted, ignored"),
                          (["--request-context-grace", "-1"], "--request-context-grace must be >= 0"),
                          (["--long-exec-seconds", "-1"], "--long-exec-seconds must be >= 0")]:
        out = subprocess.run([*WORKBENCH, "sim", "--cert-dir", str(tmp_path), *args],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, (args, out.stderr)
        assert message in out.stderr, (args, out.stderr)
        assert "Traceback" not in out.stderr, (args, out.stderr)


def test_cli_strict_switch_and_listing_choice_are_announced(tmp_path: Path, processes: ProcessGroup) -> None:
    proc = processes.workbench("sim", "--port", "0", "--cert-dir", str(tmp_path), "--strict-stream-close",
                               "--exec-stream-close", "mcp=accepted", "--model-listing", "aiserver",
                               "--strict-request-context")
    lines = [proc.next_line().strip() for _ in range(6)]
    assert "stream_close: required, mcp=accepted; framings: connect, grpc-web(-text), grpc" in lines
    assert "request_context: waits for the answer" in lines
    url = lines[0]
    probe = textwrap.dedent(f"""
        import ssl, urllib.request, urllib.error
        ctx = ssl.create_default_context(cafile="{tmp_path / 'sim-cert.pem'}")
        for path in ("/aiserver.v1.AiService/GetUsableModels", "/agent.v1.AgentService/GetUsableModels"):
            req = urllib.request.Request("{url}" + path, data=b"{{}}",
                headers={{"authorization": "Bearer t", "content-type": "application/json"}})
            try:
                print(path, urllib.request.urlopen(req, context=ctx).read().decode())
            except urllib.error.HTTPError as exc:
                print(path, exc.code, exc.read().decode())
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    ai, agent = out.stdout.splitlines()
    assert '"modelId": "gpt-5"' in ai
    assert agent.startswith("/agent.v1.AgentService/GetUsableModels 501")
    assert '"unimplemented"' in agent
    assert proc.stop(timeout=30) == 0
