"""Real processes for the proxy's end-to-end tests: ``workbench sim`` and ``workbench proxy``.

Both are started as subprocesses on free ports (``--port 0``); their URL is read from the first
line they print, and they are stopped with SIGTERM by the fixture.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

# `python -m workbench.cli` would run the module twice (as __main__ and as workbench.cli), and
# CliError raised by a command would then not be the class main() catches.
WORKBENCH = [sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main())"]
STARTUP_TIMEOUT = 60.0


@dataclass
class Proc:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str] = field(default_factory=list)
    cert: str | None = None
    stderr: list[str] = field(default_factory=list)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def start_process(args: list[str], env: dict[str, str] | None = None, want_cert: bool = False) -> Proc:
    """Start ``python -m workbench.cli ARGS`` and wait for the URL line (and the ``cert:`` line)."""
    full_env = dict(os.environ)
    full_env.pop("HTTPS_PROXY", None)
    full_env.pop("https_proxy", None)
    full_env.update(env or {})
    proc = subprocess.Popen([*WORKBENCH, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=full_env)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    errors: list[str] = []

    def pump_err() -> None:
        assert proc.stderr is not None
        errors.extend(proc.stderr)

    threading.Thread(target=pump, daemon=True).start()
    threading.Thread(target=pump_err, daemon=True).start()
    seen: list[str] = []
    try:
        first = lines.get(timeout=STARTUP_TIMEOUT)
        if first is None:
            raise RuntimeError(f"{args[0]} exited before printing its URL (rc={proc.wait()})")
        seen.append(first)
        cert = None
        if want_cert:
            second = lines.get(timeout=STARTUP_TIMEOUT)
            if second is None or not second.startswith("cert:"):
                raise RuntimeError(f"{args[0]}: expected 'cert: PATH' as the second line, got {second!r}")
            seen.append(second)
            cert = second.split(":", 1)[1].strip()
    except BaseException:
        proc.kill()
        raise
    return Proc(proc, first.strip(), seen, cert, errors)


@dataclass
class Rig:
    sim: Proc
    proxy: Proc

    @property
    def base_url(self) -> str:
        return self.proxy.url + "/v1"


def start_rig(tmp: Path, transport: str = "run", proxy_args: list[str] | None = None,
              sim_args: list[str] | None = None) -> Rig:
    sim = start_process(["sim", "--port", "0", "--heartbeat-interval", "0.05", "--cert-dir", str(tmp / "certs"),
                         *(sim_args or [])], want_cert=True)
    try:
        proxy = start_process(["proxy", "--port", "0", "--upstream", sim.url, "--transport", transport,
                               "--ca-file", str(sim.cert), *(proxy_args or [])],
                              env={"CURSOR_ACCESS_TOKEN": "sk-test-proxy-token"})
    except BaseException:
        sim.stop()
        raise
    return Rig(sim, proxy)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """sim + proxy (Run over HTTP/2), shared by a module's tests."""
    r = start_rig(tmp_path_factory.mktemp("rig"))
    yield r
    r.proxy.stop()
    r.sim.stop()
