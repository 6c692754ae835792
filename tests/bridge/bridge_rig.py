"""Both sides of a bridge, with real processes: openai SDK → ``workbench capture --bridge`` (reverse
listener) → a bridge → the same capture (forward proxy) → ``workbench sim``.

The bridge is ``workbench proxy`` (ours) or ``fault_bridge.py`` (a bridge with one injectable fault
per bridge finding). Its port is chosen first, so the capture can be started with ``--bridge`` to
it and the bridge with ``HTTPS_PROXY`` set to the capture.
"""

from __future__ import annotations

import json
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from support import (
    Process,
    free_port,
    listening_socket,
    start_process,
    start_server,
    start_workbench,
    wait_port,
)

HERE = Path(__file__).resolve().parent
FAULT_BRIDGE = HERE / "fault_bridge.py"
TOKEN = "sk-test-bridge-upstream-token"
# how long the SDK waits for a byte: a bound for a hang, not a speed (CI saw a first turn wait over 60 s
# while two suites shared the two cores)
SDK_TIMEOUT_S = 300


@dataclass
class BridgeRig:
    sim: Process
    capture: Process
    bridge: Process
    db: Path
    client_url: str              # the ``bridge: URL`` line: what the OpenAI client is given
    proxy_url: str               # the capture's forward proxy (the bridge's HTTPS_PROXY)
    ca: Path
    lines: list[str] = field(default_factory=list)

    def sdk(self, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.client_url + "/v1", api_key="sk-client-key-never-stored",
                             max_retries=0, timeout=SDK_TIMEOUT_S, **kw)

    def stop(self) -> None:
        self.bridge.stop()
        self.capture.stop(signal.SIGINT, timeout=60)
        self.sim.stop()


def start_capture(tmp: Path, bridge_port: int, db: Path, mitm_args: tuple[str, ...] = ()) -> tuple[Process, list[str]]:
    cap = start_workbench("capture", "--port", "0", "--db", str(db), "--confdir", str(tmp / "mitm"),
                          "--flush-ms", "50", "--bridge", f"http://127.0.0.1:{bridge_port}",
                          "--", "--set", "ssl_insecure=true", *mitm_args)
    lines: list[str] = []
    while not lines or not lines[-1].startswith("bridge: "):
        lines.append(cap.next_line(90))
    return cap, lines


def start_bridge_rig(tmp: Path, kind: str = "proxy", fault: str = "none", transport: str = "run",
                     sim_args: tuple[str, ...] = (), mitm_args: tuple[str, ...] = (),
                     proxy_args: tuple[str, ...] = ()) -> BridgeRig:
    sim = start_server("sim", "--port", "0", "--heartbeat-interval", "0.05", "--cert-dir", str(tmp / "certs"),
                       *sim_args, want_cert=True)
    # a fault bridge serves on a socket bound here; ``workbench proxy`` binds the port itself and says
    # so on its first line (it fails loudly, never silently, if another process took the port)
    sock = listening_socket() if kind != "proxy" else None
    port = int(sock.getsockname()[1]) if sock is not None else free_port()
    db = tmp / "bridge.duckdb"
    try:
        cap, lines = start_capture(tmp, port, db, mitm_args)
    except BaseException:
        sim.stop()
        if sock is not None:
            sock.close()
        raise
    proxy_url = lines[0].strip()
    ca = tmp / "mitm" / "mitmproxy-ca-cert.pem"
    client_url = lines[-1].split(": ", 1)[1].strip()
    env = {"HTTPS_PROXY": proxy_url, "CURSOR_ACCESS_TOKEN": TOKEN}
    try:
        if kind == "proxy":
            bridge = start_server("proxy", "--port", str(port), "--upstream", sim.url, "--transport", transport,
                                  "--ca-file", str(ca), *proxy_args, env=env)
        else:
            assert sock is not None
            bridge = start_process([sys.executable, str(FAULT_BRIDGE), "--port", str(port), "--fd", str(sock.fileno()),
                                    "--upstream", sim.url, "--ca-file", str(ca), "--fault", fault],
                                   env={**_base_env(), **env}, pass_fds=(sock.fileno(),))
            wait_port(port, bridge.proc)
            assert bridge.next_line(90).strip() == f"http://127.0.0.1:{port}", bridge.err
    except BaseException:
        cap.stop(signal.SIGINT)
        sim.stop()
        raise
    finally:
        if sock is not None:
            sock.close()  # the bridge holds its own copy
    return BridgeRig(sim, cap, bridge, db, client_url, proxy_url, ca, lines)


def _base_env() -> dict[str, str]:
    from support import env_without_proxy

    return env_without_proxy({"PYTHONPATH": str(HERE.parents[1])})


@dataclass
class FaultRig:
    """One sim, one capture with a ``--bridge`` per fault, one fault bridge behind each."""

    sim: Process
    capture: Process
    db: Path
    bridges: dict[str, tuple[Process, str]]   # fault → (bridge process, the client's base URL)

    def sdk(self, fault: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.bridges[fault][1] + "/v1", api_key="sk-client-key-never-stored",
                             max_retries=0, timeout=SDK_TIMEOUT_S)

    def stop(self) -> None:
        for p, _ in self.bridges.values():
            p.stop()
        self.capture.stop(signal.SIGINT, timeout=60)
        self.sim.stop()


def start_fault_rig(tmp: Path, faults: list[str], scenarios: dict[str, Any]) -> FaultRig:
    folder = tmp / "scenarios"
    folder.mkdir()
    for name, doc in scenarios.items():
        (folder / f"{name}.json").write_text(json.dumps(doc), encoding="utf-8")
    sim = start_server("sim", "--port", "0", "--heartbeat-interval", "0.05", "--pace", "0.02",
                       "--scenario-dir", str(folder), "--cert-dir", str(tmp / "certs"), want_cert=True)
    socks = {f: listening_socket() for f in faults}  # each bridge serves on a socket bound here
    ports = {f: int(sk.getsockname()[1]) for f, sk in socks.items()}
    db = tmp / "faults.duckdb"
    args = ["capture", "--port", "0", "--db", str(db), "--confdir", str(tmp / "mitm"), "--flush-ms", "50"]
    for f in faults:
        args += ["--bridge", f"http://127.0.0.1:{ports[f]}"]
    cap = start_workbench(*args, "--", "--set", "ssl_insecure=true")
    bridges: dict[str, tuple[Process, str]] = {}
    try:
        lines: list[str] = []
        while sum(ln.startswith("bridge: ") for ln in lines) < len(faults):
            lines.append(cap.next_line(90))
        urls = [ln.split(": ", 1)[1].strip() for ln in lines if ln.startswith("bridge: ")]
        env = {**_base_env(), "HTTPS_PROXY": lines[0].strip(), "CURSOR_ACCESS_TOKEN": TOKEN}
        for f, url in zip(faults, urls, strict=True):
            fd = socks[f].fileno()
            p = start_process([sys.executable, str(FAULT_BRIDGE), "--port", str(ports[f]), "--fd", str(fd),
                               "--upstream", sim.url,
                               "--ca-file", str(tmp / "mitm" / "mitmproxy-ca-cert.pem"), "--fault", f], env=env,
                              pass_fds=(fd,))
            bridges[f] = (p, url)
        for f, (p, _) in bridges.items():
            wait_port(ports[f], p.proc)
            assert p.next_line(90).strip() == f"http://127.0.0.1:{ports[f]}", p.err  # serving, on the socket given
    except BaseException:
        for p, _ in bridges.values():
            p.stop()
        cap.stop(signal.SIGINT)
        sim.stop()
        raise
    finally:
        for sk in socks.values():  # each bridge holds its own copy now
            sk.close()
    return FaultRig(sim, cap, db, bridges)
