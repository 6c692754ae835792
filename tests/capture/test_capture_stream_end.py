"""End of stream through the capture, as real clients need it (issue 10).

Real processes throughout: mitmdump with the addon, ``workbench sim`` (or a scripted h2 server
where the sim has no step for a wire behaviour), and clients we did not derive from our own: the
Node.js client on ``node:http2``/``node:https`` and a plain-``h2`` Python client. Both keep their
request stream open until the response ends, as current agent clients do.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from capture_rig import NODE_CLIENT, Sim
from h2_agent_client import H2AgentClient
from h2_script_server import ScriptServer
from support import env_without_proxy, session_row

from workbench.redact import short_hash
from workbench.store import open_reader

pytestmark = pytest.mark.slow  # starts subprocesses or servers

TOKEN = "wb-node-token-3f9a17c2"
NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="node (v20+) is not installed")


def _node(base_url: str, ca: Path, log: Path, *args: str, proxy: str | None = None,
          timeout: float = 120) -> tuple[int, dict[str, Any]]:
    cmd = [str(NODE), str(NODE_CLIENT), "--base-url", base_url, "--ca", str(ca), "--token", TOKEN,
           "--log", str(log), "--heartbeat-ms", "1000", *args]
    cmd += ["--proxy", proxy] if proxy else ["--no-proxy"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env_without_proxy())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"node client printed no summary (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return proc.returncode, json.loads(lines[-1])


def _rows(db: Path, sid: str) -> list[dict[str, Any]]:
    r = open_reader(db)
    try:
        return r.query("SELECT seq, direction, transport, kind, payload, raw, flags, append_seqno, meta "
                       "FROM frames WHERE session_id = ? ORDER BY seq", [sid]).to_pylist()
    finally:
        r.close()


def _read_log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_recording_is_the_log(rows: list[dict[str, Any]], log: list[dict[str, Any]]) -> None:
    """Byte for byte: every frame of each direction, in order, with its envelope flags; for
    BidiAppends also the body as sent (``raw``)."""
    for direction in ("client", "server"):
        stored = [(r["payload"].hex(), r["flags"]) for r in rows if r["direction"] == direction]
        logged = [(e["hex"], e["flags"]) for e in log if e["direction"] == direction]
        if stored != logged:
            at = next((i for i, (a, b) in enumerate(zip(stored, logged, strict=False)) if a != b),
                      min(len(stored), len(logged)))
            kinds = [r["kind"] for r in rows if r["direction"] == direction][max(0, at - 2):at + 3]
            lkinds = [e["kind"] for e in log if e["direction"] == direction][max(0, at - 2):at + 3]
            raise AssertionError(f"{direction}: recording differs from the client's log at frame {at} "
                                 f"(recorded {len(stored)}, logged {len(logged)}): {kinds} vs {lkinds}")
    appends = [r for r in rows if r["transport"] == "bidi_append" and r["direction"] == "client"]
    sent = [e for e in log if e["transport"] == "bidi_append"]
    assert [r["raw"].hex() for r in appends] == [e["wire_hex"] for e in sent]
    assert [r["append_seqno"] for r in appends] == [e["seqno"] for e in sent]
    assert [r["seq"] for r in rows] == list(range(len(rows)))


def _turn_shape(db: Path, sid: str) -> dict[str, Any]:
    """What must not depend on how the client reached the capture."""
    s = session_row(db, sid, meta=True)
    rows = _rows(db, sid)
    headers = dict(s["meta"].get("request_headers", []))
    # Per direction, without heartbeats: how the two directions interleave and how many
    # heartbeats a turn takes depend on timing, not on the route.
    def kinds(direction: str) -> list[str]:
        return [r["kind"] for r in rows if r["direction"] == direction and "heartbeat" not in r["kind"]]

    return {"client": kinds("client"), "server": kinds("server"), "status": s["status"],
            "transport": s["transport"], "model": s["model"], "auth_hash": s["auth_hash"],
            "authorization": headers.get("authorization"), "http_status": s["http_status"]}


@needs_node
@pytest.mark.parametrize("transport", ["run", "runsse"])
def test_node_client_forward_and_reverse_record_the_same(capture_sim: Sim, capture_mitm: Any, tmp_path: Path,
                                                         transport: str) -> None:
    fwd = capture_mitm(db=tmp_path / "forward.duckdb")
    rev = capture_mitm(db=tmp_path / "reverse.duckdb", extra=("--mode", f"reverse:{capture_sim.url}"))
    shapes = []
    for m, base, proxy in ((fwd, capture_sim.url, fwd.proxy), (rev, f"https://127.0.0.1:{rev.port}", None)):
        log = tmp_path / f"{m.db.stem}.ndjson"
        rc, summary = _node(base, m.ca, log, "--transport", transport, "--prompt", "[scenario:node_tools] go",
                            "--model", "gpt-5", proxy=proxy)
        assert rc == 0, summary
        assert summary["error"] is None, summary
        assert summary["turn_ended"]
        assert summary["end_stream"]
        assert summary["end_frame"] == "ok"
        assert m.stop() == 0
        sid = summary["request_id"]
        assert_recording_is_the_log(_rows(m.db, sid), _read_log(log))
        s = session_row(m.db, sid, meta=True)
        assert s["status"] == "complete"
        assert s["error"] is None
        assert s["meta"]["proxy_mode"] == ("regular" if m is fwd else "reverse")
        # Node's stream.close() after the response's END_STREAM ends the request side cleanly.
        assert "reset" not in s["meta"]
        blob = b"".join(p.read_bytes() for p in m.db.parent.glob(m.db.name + "*"))
        assert TOKEN.encode() not in blob
        shapes.append(_turn_shape(m.db, sid))
    assert shapes[0] == shapes[1]
    assert shapes[0]["auth_hash"] == short_hash(TOKEN)
    assert shapes[0]["model"] == "gpt-5"
    assert shapes[0]["authorization"] == f"Bearer [redacted sha256:{short_hash(TOKEN)}]"
    kinds = shapes[0]["client"] + shapes[0]["server"]
    for k in ("exec_server_message.shell_stream_args", "exec_client_message.shell_stream_result",
              "exec_client_message.shell_result", "exec_client_control_message.stream_close",
              "exec_client_message.read_result", "exec_client_message.write_result", "exec_client_message.ls_result",
              "exec_client_message.grep_result", "exec_client_message.delete_result",
              "kv_client_message.set_blob_result", "kv_client_message.get_blob_result"):
        assert k in kinds, k


def test_python_h2_client_that_never_half_closes(capture_sim: Sim, capture_mitm: Any, tmp_path: Path) -> None:
    m = capture_mitm()
    log = tmp_path / "h2.ndjson"
    res = H2AgentClient(capture_sim.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=60,
                        heartbeat_interval=0.5, log_path=log).run_turn("[scenario:node_tools] from h2")
    assert res.completed, res.error
    assert res.reset_code is None  # nothing reset the stream under the client
    assert m.stop() == 0
    assert_recording_is_the_log(_rows(m.db, res.request_id), _read_log(log))
    s = session_row(m.db, res.request_id, meta=True)
    # This client resets its request stream once it has the whole answer: the session stays complete.
    assert s["status"] == "complete"
    assert s["error"] is None
    assert s["meta"]["reset"] == {"side": "client", "code": "NO_ERROR", "h2_error_code": 0,
                                  "after_response_end": True, "message": "stream reset by client (NO_ERROR)"}


def test_client_half_closes_first_while_the_server_streams(capture_sim: Sim, capture_mitm: Any,
                                                           tmp_path: Path) -> None:
    m = capture_mitm()
    log = tmp_path / "half.ndjson"
    res = H2AgentClient(capture_sim.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=60,
                        half_close=True, log_path=log).run_turn("[scenario:stream_only] half-close first")
    assert res.completed, res.error
    assert res.frames_sent == 1
    assert res.frames_received > 60  # the server kept streaming after our end
    assert m.stop() == 0
    rows = _rows(m.db, res.request_id)
    assert_recording_is_the_log(rows, _read_log(log))
    s = session_row(m.db, res.request_id, meta=True)
    assert s["status"] == "complete"
    assert "reset" not in s["meta"]
    # The client's end came before most of the server's frames, and capture kept recording them.
    first_server = next(r["seq"] for r in rows if r["direction"] == "server")
    assert rows[0]["kind"] == "run_request"
    assert first_server == 1


@needs_node
def test_client_cancel_mid_turn_is_forwarded_and_recorded(capture_sim: Sim, capture_mitm: Any,
                                                          tmp_path: Path) -> None:
    m = capture_mitm()
    log = tmp_path / "cancel.ndjson"
    rc, summary = _node(capture_sim.url, m.ca, log, "--prompt", "[scenario:long] cancel me", "--cancel-after", "10",
                        proxy=m.proxy)
    assert rc == 1
    assert summary["error"] == "cancelled by this client"
    assert not summary["end_stream"]
    assert m.stop() == 0
    s = session_row(m.db, summary["request_id"], meta=True)
    assert s["status"] == "aborted"
    assert s["error"] == "stream reset by client (CANCEL)"
    assert s["meta"]["reset"]["side"] == "client"
    assert s["meta"]["reset"]["code"] == "CANCEL"
    assert s["meta"]["reset"]["after_response_end"] is False
    rows = _rows(m.db, summary["request_id"])
    logged = _read_log(log)
    # Everything the client sent, and every server frame it received, is in the recording.
    assert [r["payload"].hex() for r in rows if r["direction"] == "client"] == \
        [e["hex"] for e in logged if e["direction"] == "client"]
    recorded_server = [r["payload"].hex() for r in rows if r["direction"] == "server"]
    received = [e["hex"] for e in logged if e["direction"] == "server"]
    assert recorded_server[:len(received)] == received


@needs_node
def test_server_reset_mid_turn_is_forwarded_and_recorded(capture_sim: Sim, capture_mitm: Any,
                                                         tmp_path: Path) -> None:
    m = capture_mitm()
    log = tmp_path / "drop.ndjson"
    rc, summary = _node(capture_sim.url, m.ca, log, "--prompt", "[scenario:network_drop] go", proxy=m.proxy)
    assert rc == 1
    assert summary["rst_code"] == 2
    assert not summary["end_stream"]  # INTERNAL_ERROR, as sent
    assert m.stop() == 0
    s = session_row(m.db, summary["request_id"], meta=True)
    assert s["status"] == "aborted"
    assert s["error"] == "stream reset by server (INTERNAL_ERROR)"
    assert s["meta"]["reset"]["side"] == "server"
    assert s["meta"]["reset"]["h2_error_code"] == 2
    assert_recording_is_the_log(_rows(m.db, summary["request_id"]), _read_log(log))


@pytest.fixture
def script_server(tmp_path: Path) -> Any:
    srv = ScriptServer(tmp_path / "script-certs")
    yield srv
    srv.close()


def test_server_end_then_rst_no_error_stays_complete(script_server: ScriptServer, capture_mitm: Any) -> None:
    m = capture_mitm()
    res = H2AgentClient(script_server.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=30,
                        extra_headers=[("x-test-mode", "end_then_rst")]).run_turn("hello")
    assert res.completed, res.error
    assert res.reset_code == 0  # the server's NO_ERROR arrives as NO_ERROR (mitmproxy alone: INTERNAL_ERROR)
    assert m.stop() == 0
    s = session_row(m.db, res.request_id, meta=True)
    assert s["status"] == "complete"
    assert s["error"] is None
    assert s["meta"]["reset"] == {"side": "server", "code": "NO_ERROR", "h2_error_code": 0,
                                  "after_response_end": True, "message": "stream reset by server (NO_ERROR)"}
    assert [r["kind"] for r in _rows(m.db, res.request_id)][-2:] == ["interaction_update.turn_ended", "end_stream"]


def test_server_reset_code_reaches_the_client_unchanged(script_server: ScriptServer, capture_mitm: Any) -> None:
    m = capture_mitm()
    res = H2AgentClient(script_server.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=30,
                        extra_headers=[("x-test-mode", "rst:7")]).run_turn("hello")
    assert res.reset_code == 7
    assert not res.end_stream  # REFUSED_STREAM, not mitmproxy's INTERNAL_ERROR
    assert m.stop() == 0
    s = session_row(m.db, res.request_id, meta=True)
    assert s["status"] == "aborted"
    assert s["error"] == "stream reset by server (REFUSED_STREAM)"


def test_client_reset_reaches_the_server_with_its_code(script_server: ScriptServer, capture_mitm: Any) -> None:
    m = capture_mitm()
    res = H2AgentClient(script_server.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=30,
                        heartbeat_interval=0.05, cancel_after=3,
                        extra_headers=[("x-test-mode", "echo")]).run_turn("hello")
    assert res.cancelled
    seen = script_server.wait(0)
    assert seen.reset_code == 8
    assert not seen.end_stream  # CANCEL, forwarded at once
    assert m.stop() == 0
    s = session_row(m.db, res.request_id, meta=True)
    assert s["status"] == "aborted"
    assert s["meta"]["reset"]["code"] == "CANCEL"


def test_client_frames_after_an_early_end_still_reach_the_server(script_server: ScriptServer,
                                                                  capture_mitm: Any) -> None:
    """The server ends first and keeps reading: the client's later frames are forwarded and recorded."""
    m = capture_mitm()
    res = H2AgentClient(script_server.url, token=TOKEN, ca_file=str(m.ca), proxy=m.proxy, timeout=30,
                        heartbeat_interval=60, after_end="end", linger_frames=3,
                        extra_headers=[("x-test-mode", "end_at_first")]).run_turn("hello")
    assert res.completed, res.error
    seen = script_server.wait(0)
    # run_request (which crossed the server's early end) and the three lingering heartbeats
    assert seen.frames_after_response_end == 4
    assert seen.end_stream
    assert seen.reset_code is None
    assert m.stop() == 0
    rows = _rows(m.db, res.request_id)
    assert [r["kind"] for r in rows if r["direction"] == "client"][-3:] == ["client_heartbeat"] * 3
    s = session_row(m.db, res.request_id, meta=True)
    assert s["status"] == "complete"
    assert "reset" not in s["meta"]
