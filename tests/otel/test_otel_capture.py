"""``workbench capture --otlp``: a session recorded through a real mitmdump reaches the OTLP endpoint as a
trace once it ended and was analysed; a backend that is down is a warning, never the capture's end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from otlp_receiver import attrs, otlp_receiver
from support import stop_popen

pytestmark = [pytest.mark.xdist_group("otel"), pytest.mark.slow]


def _lines_until(proc: subprocess.Popen[str], prefix: str, timeout: float = 60) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith(prefix):
            return line.strip()
    raise AssertionError(f"no line starting {prefix!r}")


@contextmanager
def _started(args: list[str], cwd: Path, stderr: Path) -> Iterator[subprocess.Popen[str]]:
    with stderr.open("w") as err:  # a file: mitmdump's output must never fill a pipe nobody reads
        proc = subprocess.Popen([sys.executable, "-m", "workbench", *args], cwd=cwd, stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
    try:
        yield proc
    finally:
        stop_popen(proc, signal.SIGINT, 60)


@pytest.mark.parametrize("backend", ["up", "down"])
def test_capture_sends_each_ended_session(tmp_path: Path, backend: str) -> None:
    with otlp_receiver() as (url, got), _started(["sim", "--port", "0", "--cert-dir", str(tmp_path / "sim")],
                                                  tmp_path, tmp_path / "sim.log") as sim:
        sim_url = _lines_until(sim, "https://")
        cert = _lines_until(sim, "cert: ").removeprefix("cert: ")
        if backend == "down":
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                url = f"http://127.0.0.1:{s.getsockname()[1]}"
        db = tmp_path / "c.duckdb"
        with _started(["capture", "--port", "0", "--db", str(db), "--confdir", str(tmp_path / "mitm"),
                       "--mode", f"reverse:{sim_url}", "--otlp", url, "--",
                       "--set", f"ssl_verify_upstream_trusted_ca={cert}"], tmp_path, tmp_path / "capture.log") as cap:
            base = _lines_until(cap, "base url: ").split()[2]
            client = subprocess.run(
                [sys.executable, "-m", "workbench", "client", "--upstream", base, "--ca-file",
                 str(tmp_path / "mitm" / "mitmproxy-ca-cert.pem"), "[scenario:text] Say hello."],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, "CURSOR_ACCESS_TOKEN": "otel-test-token", "SSL_CERT_FILE": cert})
            assert client.returncode == 0, client.stderr
            if backend == "up":
                assert got.got.wait(60), "no trace arrived while the capture ran"
                roots = [s for s in got.spans if not s.parent_span_id]
                assert [attrs(s)["gen_ai.operation.name"] for s in roots] == ["invoke_agent"]
                assert attrs(roots[0])["workbench.source"] == "capture"
            cap.send_signal(signal.SIGINT)
            cap.communicate(timeout=120)
        err = (tmp_path / "capture.log").read_text()
        assert cap.returncode == 0, err[-2000:]
        assert "Traceback" not in err
        if backend == "down":
            assert "--otlp" in err and "retrying" in err and "not sent" in err, err[-2000:]
        else:
            assert len([s for s in got.spans if not s.parent_span_id]) == 1  # sent once, not again at stop
