"""The write gate under a real capture (issue 20, findings 1 and 10).

A real mitmdump with the addon between the plain-``h2`` test client and a scripted HTTP/2
server. The client sends header values that are not UTF-8 (``x-cursor-client-version: 1.0\\xff``,
an ``x-request-id`` with a stray byte), the server a response header and a ``grpc-message``
trailer that are not UTF-8 (``caf\\xe9 down``). mitmproxy hands such values to the addon as
strings with surrogate escapes, which Arrow refuses: the capture used to lose its database for
the rest of the run (every frame spooled, the live read service gone, the next start failing to
merge). Now the text is stored escaped and the capture goes on.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from h2_agent_client import H2AgentClient
from h2_script_server import ScriptServer
from support import run_workbench

from workbench.capture.spool import spool_candidates
from workbench.store import open_reader
from workbench.store.gate import wire_bytes

pytestmark = pytest.mark.slow  # starts subprocesses or servers

TOKEN = "wb-gate-token-77c1"


@pytest.fixture
def script_server(tmp_path: Path) -> Any:
    srv = ScriptServer(tmp_path / "script-certs")
    yield srv
    srv.close()


def _sessions(db: Path) -> list[dict[str, Any]]:
    res = run_workbench("sessions", "--db", str(db), "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_header_bytes_that_are_not_utf8_are_stored_escaped_and_the_capture_goes_on(
        script_server: ScriptServer, capture_mitm: Any, tmp_path: Path) -> None:
    m = capture_mitm(db=tmp_path / "gate.duckdb")
    bad = H2AgentClient(script_server.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=30,
                        request_id="rid-gate-bad",
                        extra_headers=[("x-test-mode", "bad_utf8"), (b"x-cursor-client-version", b"1.0\xff"),
                                       (b"x-request-id", b"rid-\xfe")]).run_turn("hello")
    assert res_ok(bad)
    assert script_server.wait(0).headers["x-cursor-client-version"].endswith("1.0\ufffd")  # passed on as sent

    # The live read service still answers while the capture runs: the session is there.
    live = {s["session_id"]: s for s in _sessions(m.db)}
    [sid] = [s for s in live if s.startswith("rid-gate-bad")]
    assert wire_bytes(sid).endswith(b"rid-\xfe")  # the stray byte, recoverable from its escape
    # The database and its WAL are private to the user (finding 10).
    assert _mode(m.db) == 0o600
    wal = Path(str(m.db) + ".wal")
    assert wal.exists() and _mode(wal) == 0o600

    # A later turn still goes to the database (not to a spool).
    good = H2AgentClient(script_server.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=30,
                         extra_headers=[("x-test-mode", "end_at_first")]).run_turn("again")
    assert good.completed, good.error
    assert m.stop() == 0
    log = "".join(p.read_text() for p in tmp_path.glob("mitmdump-*.log"))
    assert "spool" not in log and "ERROR" not in log, log[-3000:]
    assert not any(p.exists() for p in spool_candidates(m.db))

    r = open_reader(m.db)
    try:
        rows = {row["session_id"]: row for row in r.query(
            "SELECT session_id, client_version, status, error, meta, frame_count FROM sessions").to_pylist()}
        frames = r.query("SELECT session_id, count(*) AS n FROM frames GROUP BY 1").to_pylist()
    finally:
        r.close()
    assert set(rows) == {sid, good.request_id}
    s = rows[sid]
    assert wire_bytes(s["client_version"]).endswith(b"1.0\xff")
    meta = json.loads(s["meta"])
    assert wire_bytes(meta["trailers"]["grpc-message"]) == b"caf\xe9 down"
    assert wire_bytes(dict(meta["response_headers"])["x-server-note"]) == b"caf\xe9"
    assert s["error"] is not None and "caf\\xe9 down" in s["error"]
    assert {f["session_id"]: f["n"] for f in frames} == {k: v["frame_count"] for k, v in rows.items()}
    assert {x["session_id"] for x in _sessions(m.db)} == {sid, good.request_id}


def res_ok(res: Any) -> bool:
    """The client saw its turn through (the server's status 14 trailer is not a transport failure)."""
    assert res.error is None or "grpc" in res.error.lower(), res.error
    assert res.turn_ended, res.error
    return True
