"""docs/capture.md's install into a user's own mitmproxy, the pipx form, done as a user would.

``pipx install mitmproxy`` (the version this line runs) into a pipx home of its own, ``pipx inject
mitmproxy <this checkout>``, then that pipx ``mitmdump -s addons/cursor_capture.py``: it must load
the addon from the pipx venv with no warning, and a never-half-closing client (the Node.js test
client) must complete its turn through it, recorded. Only on the mitmproxy 12 line (Python 3.12+,
what pipx and Homebrew install today); pipx comes with the test extra there.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from capture_rig import ADDON, NODE_CLIENT, ROOT, Sim
from support import env_without_proxy, free_port, session_row, wait_port
from test_capture_stream_end import _read_log, _rows, assert_recording_is_the_log

pytestmark = [
    pytest.mark.slow,  # pipx builds two venvs, then mitmdump, the simulator and node run
    pytest.mark.skipif(sys.version_info < (3, 12), reason="the pipx install is tested on the mitmproxy 12 "
                       "line (Python 3.12+); .ci/run runs it there"),
]

TOKEN = "wb-pipx-token-81c4d2"
# A line that is a Python warning, or mitmproxy's report of one, about our code.
OUR_WARNING = re.compile(r"(Warning|deprecated).*(workbench|cursor_capture|[Cc]ontentview|CursorAgentView)"
                         r"|(workbench|cursor_capture).*(Warning|deprecated)")


def _pipx(env: dict[str, str], *args: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "pipx", *args], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, f"pipx {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


def test_pipx_mitmproxy_with_workbench_injected_loads_cleanly_and_completes_a_turn(
        capture_sim: Sim, tmp_path: Path) -> None:
    from mitmproxy import version

    node = shutil.which("node")
    assert node, "node (v20+) is needed for the never-half-closing client"
    lock = ROOT / "requirements" / f"py{sys.version_info.major}.{sys.version_info.minor}.txt"
    assert lock.exists(), f"no lock file {lock} for this Python"
    env = {**env_without_proxy(), "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(tmp_path / "bin"),
           "PIPX_MAN_DIR": str(tmp_path / "man")}
    env.pop("VIRTUAL_ENV", None)
    pins = f"--constraint={lock}"
    # what docs/capture.md tells the user, with this line's versions pinned
    _pipx(env, "install", "--python", sys.executable, f"mitmproxy=={version.VERSION}", f"--pip-args={pins}")
    _pipx(env, "inject", "mitmproxy", str(ROOT), f"--pip-args={pins}")
    venv_python = tmp_path / "pipx" / "venvs" / "mitmproxy" / "bin" / "python"
    where = subprocess.run([str(venv_python), "-c", "import workbench, mitmproxy.version as v; "
                            "print(workbench.__file__); print(v.VERSION)"],
                           capture_output=True, text=True, env=env, check=True, cwd=tmp_path).stdout.split()
    # the addon's import finds the injected package, not this checkout (its fallback for a bare mitmproxy)
    assert where[0].startswith(str(tmp_path / "pipx")), where
    assert where[1] == version.VERSION

    port = free_port()
    db = tmp_path / "pipx.duckdb"
    log_path = tmp_path / "mitmdump.log"
    with log_path.open("w") as log:
        mitm = subprocess.Popen(
            [str(tmp_path / "bin" / "mitmdump"), "-s", str(ADDON), "--listen-host", "127.0.0.1",
             "--listen-port", str(port), "--set", f"confdir={tmp_path / 'conf'}", "--set", "ssl_insecure=true",
             "--set", f"cursor_db={db}", "--set", "cursor_flush_ms=50"],
            stdout=log, stderr=subprocess.STDOUT, env={**env, "PYTHONWARNINGS": "default"}, cwd=tmp_path)
    try:
        wait_port(port, mitm)
        client_log = tmp_path / "node.ndjson"
        proc = subprocess.run(
            [node, str(NODE_CLIENT), "--base-url", capture_sim.url, "--ca", str(tmp_path / "conf" /
             "mitmproxy-ca-cert.pem"), "--token", TOKEN, "--log", str(client_log), "--heartbeat-ms", "1000",
             "--transport", "run", "--prompt", "[scenario:node_tools] go", "--proxy", f"http://127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=120, env=env_without_proxy())
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        assert proc.returncode == 0 and lines, proc.stderr[-2000:]
        summary = json.loads(lines[-1])
        assert summary["error"] is None, summary
        assert summary["turn_ended"] and summary["end_stream"] and summary["end_frame"] == "ok", summary
    finally:
        mitm.send_signal(signal.SIGINT)
        rc = mitm.wait(60)
    out = log_path.read_text(errors="replace")
    assert rc == 0, out[-3000:]
    assert "cursor capture: recording agent traffic" in out, out[-3000:]
    ours = [ln for ln in out.splitlines() if OUR_WARNING.search(ln) or "Traceback" in ln]
    assert ours == [], "\n".join(ours)
    sid = summary["request_id"]
    assert session_row(db, sid)["status"] == "complete"
    assert_recording_is_the_log(_rows(db, sid), _read_log(client_log))
