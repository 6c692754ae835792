"""Real processes for capture tests: ``workbench sim`` upstream and mitmdump with the addon."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from capture_rig import (
    ADDON,
    BIN,
    LONG_SCENARIO,
    NODE_TOOLS_SCENARIO,
    STREAM_ONLY_SCENARIO,
    Mitm,
    Sim,
)
from support import free_port, stop_popen, wait_port


@pytest.fixture(scope="session")
def capture_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sim]:
    d = tmp_path_factory.mktemp("capture-sim")
    (d / "scenarios").mkdir()
    (d / "scenarios" / "long.json").write_text(json.dumps(LONG_SCENARIO))
    # ~8 s: long enough for a `workbench frames --follow` subprocess to start while it streams.
    longer = json.loads(json.dumps(LONG_SCENARIO))
    longer["steps"][2] = {"text": "word " * 400, "chunks": 400}
    (d / "scenarios" / "longer.json").write_text(json.dumps(longer))
    (d / "scenarios" / "node_tools.json").write_text(json.dumps(NODE_TOOLS_SCENARIO))
    (d / "scenarios" / "stream_only.json").write_text(json.dumps(STREAM_ONLY_SCENARIO))
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
    stop_popen(proc)


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
