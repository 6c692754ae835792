"""Real processes for capture tests: ``workbench sim`` upstream and mitmdump with the addon."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ADDON = ROOT / "addons" / "cursor_capture.py"
BIN = Path(sys.executable).parent

# A long paced turn (~3 s at --pace 0.02) for the kill and follow tests.
LONG_SCENARIO = {
    "description": "many streamed text deltas",
    "steps": [
        {"kv_set": "system"},
        {"kv_set": "user"},
        {"text": "word " * 150, "chunks": 150},
        {"turn_ended": True},
        {"end": "ok"},
    ],
}


@dataclass
class Sim:
    url: str
    cert: Path
    proc: subprocess.Popen[str]


@dataclass
class Mitm:
    port: int
    db: Path
    ca: Path
    proc: subprocess.Popen[bytes]
    flush_ms: int

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 90) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before listening")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port} after {timeout} s")


@pytest.fixture(scope="session")
def capture_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    d = tmp_path_factory.mktemp("capture-sim")
    (d / "scenarios").mkdir()
    (d / "scenarios" / "long.json").write_text(json.dumps(LONG_SCENARIO))
    # ~8 s: long enough for a `workbench frames --follow` subprocess to start while it streams.
    longer = json.loads(json.dumps(LONG_SCENARIO))
    longer["steps"][2] = {"text": "word " * 400, "chunks": 400}
    (d / "scenarios" / "longer.json").write_text(json.dumps(longer))
    proc = subprocess.Popen(
        [str(BIN / "workbench"), "sim", "--port", "0", "--heartbeat-interval", "30", "--pace", "0.02",
         "--cert-dir", str(d / "certs"), "--scenario-dir", str(d / "scenarios"), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    cert_line = proc.stdout.readline().strip()
    assert url.startswith("https://127.0.0.1:"), url
    assert cert_line.startswith("cert: "), cert_line
    yield Sim(url, Path(cert_line[6:]), proc)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def capture_confdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mitmconf")


@pytest.fixture
def capture_mitm(capture_confdir: Path, tmp_path: Path) -> Iterator[callable]:  # type: ignore[valid-type]
    started: list[Mitm] = []

    def start(db: Path | None = None, flush_ms: int = 250, extra: tuple[str, ...] = ()) -> Mitm:
        port = free_port()
        db = db or tmp_path / "capture.duckdb"
        cmd = [str(BIN / "mitmdump"), "-q", "-s", str(ADDON), "--listen-host", "127.0.0.1",
               "--listen-port", str(port), "--set", f"confdir={capture_confdir}", "--set", "ssl_insecure=true",
               "--set", f"cursor_db={db}", "--set", f"cursor_flush_ms={flush_ms}", *extra]
        log = (tmp_path / f"mitmdump-{port}.log").open("w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
        log.close()
        wait_port(port, proc)
        m = Mitm(port, db, capture_confdir / "mitmproxy-ca-cert.pem", proc, flush_ms)  # type: ignore[arg-type]
        started.append(m)
        return m

    yield start
    for m in started:
        if m.proc.poll() is None:
            m.stop()


@pytest.fixture
def capture_proxy_env(monkeypatch: pytest.MonkeyPatch) -> callable:  # type: ignore[valid-type]
    """Point this process's clients at a proxy (HTTPS_PROXY) trusting its CA (SSL_CERT_FILE)."""

    def apply(m: Mitm) -> None:
        monkeypatch.setenv("HTTPS_PROXY", m.proxy)
        monkeypatch.setenv("https_proxy", m.proxy)
        monkeypatch.setenv("SSL_CERT_FILE", str(m.ca))
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)

    return apply


def env_without_proxy() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
