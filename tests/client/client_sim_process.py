"""A real ``workbench sim`` subprocess for the client's end-to-end tests, and readers for what the
client recorded. The sim prints its URL, then ``cert: PATH``; each finished run is one summary line
on stderr (``run N <transport> scenario=… -> <outcome> (…) [faults: …]``)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.store.reader import open_reader

# Not `python -m workbench.cli`: that imports the CLI module twice (see tests/proxy/conftest.py).
WORKBENCH = [sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main())"]
STARTUP_S = 60.0


@dataclass
class SimProcess:
    proc: subprocess.Popen[str]
    url: str
    cert: str
    runs: queue.Queue[str] = field(default_factory=queue.Queue)  # finished-run summary lines

    def next_run(self, timeout: float = 120.0) -> str:
        """The summary line of the next run the sim finishes."""
        while True:
            line = self.runs.get(timeout=timeout)
            if line.startswith("run "):
                return line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_sim(tmp: Path, *extra: str, scenarios: dict[str, Any] | None = None) -> SimProcess:
    """``workbench sim --port 0`` with fast heartbeats and, if given, a folder of extra scenarios."""
    args = ["sim", "--port", "0", "--heartbeat-interval", "0.05", "--cert-dir", str(tmp / "sim-cert"), *extra]
    if scenarios:
        folder = tmp / "scenarios"
        folder.mkdir(exist_ok=True)
        for name, doc in scenarios.items():
            (folder / f"{name}.json").write_text(json.dumps(doc), encoding="utf-8")
        args += ["--scenario-dir", str(folder)]
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("https_proxy", "http_proxy", "all_proxy")}
    proc = subprocess.Popen([*WORKBENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: queue.Queue[str | None] = queue.Queue()
    runs: queue.Queue[str] = queue.Queue()

    def pump_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line.rstrip("\n"))
        out.put(None)

    def pump_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            runs.put(line.rstrip("\n"))

    threading.Thread(target=pump_out, daemon=True).start()
    threading.Thread(target=pump_err, daemon=True).start()
    try:
        url = out.get(timeout=STARTUP_S)
        cert = out.get(timeout=STARTUP_S) if url is not None else None
        if url is None or cert is None or not cert.startswith("cert:"):
            proc.wait(timeout=STARTUP_S)
            said = " | ".join(runs.get(timeout=5) for _ in range(runs.qsize()))
            raise RuntimeError(f"workbench sim {' '.join(extra)} did not start (rc={proc.returncode}): {said}")
    except BaseException:
        proc.kill()
        raise
    return SimProcess(proc, url.strip(), cert.split(":", 1)[1].strip(), runs)


def recorded_frames(db: Path, session_id: str | None = None) -> list[dict[str, Any]]:
    """The recorded frames (seq order) of one session, or of the only/last one."""
    reader = open_reader(db)
    try:
        if session_id is None:
            rows = reader.query("SELECT session_id FROM sessions ORDER BY started_at").to_pylist()
            session_id = rows[-1]["session_id"]
        return reader.query("SELECT seq, direction, transport, kind, ref_id, payload FROM frames "
                            "WHERE session_id = ? ORDER BY seq", [session_id]).to_pylist()
    finally:
        reader.close()


def exec_answers(frames: list[dict[str, Any]]) -> dict[int, list[str]]:
    """Per exec id the server asked for: the client's frames for it, in order, as short names
    ('read_result', 'stream_close', 'throw', 'shell_stream_result.exit', …)."""
    from workbench.schema import pb

    asked = [f["ref_id"] for f in frames if f["direction"] == "server" and f["kind"].startswith("exec_server_message.")]
    out: dict[int, list[str]] = {eid: [] for eid in asked}
    for f in frames:
        if f["direction"] != "client" or f["ref_id"] not in out:
            continue
        kind = f["kind"]
        if kind.startswith("exec_client_message."):
            member = kind.split(".", 1)[1]
            if member == "shell_stream_result":
                msg = pb.message("AgentClientMessage").FromString(f["payload"])
                member += "." + str(msg.exec_client_message.shell_stream_result.WhichOneof("event"))
            out[f["ref_id"]].append(member)
        elif kind.startswith("exec_client_control_message."):
            member = kind.split(".", 1)[1]
            if member != "heartbeat":
                out[f["ref_id"]].append(member)
    return out


def exec_kinds(frames: list[dict[str, Any]]) -> dict[int, str]:
    """exec id → the args member the server sent ('read_args', …)."""
    return {f["ref_id"]: f["kind"].split(".", 1)[1] for f in frames
            if f["direction"] == "server" and f["kind"].startswith("exec_server_message.")}
