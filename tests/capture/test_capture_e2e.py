"""Built-in client → mitmdump with the capture addon → ``workbench sim``, all real processes."""

from __future__ import annotations

import asyncio
import binascii
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
from capture_rig import BIN, Mitm, Sim, turn_with_mitmdump_killed
from support import env_without_proxy, session_row, wait_until_async

from workbench.client.agent import AgentClient
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder
from workbench.redact import redact_payload, short_hash
from workbench.schema import pb
from workbench.store import open_reader
from workbench.store.reader import sidecar_path

pytestmark = pytest.mark.slow  # starts subprocesses or servers

TOKEN = "wb-test-token-7c1e0f9a2b"


def _session_frames(db: Path, sid: str) -> list[dict[str, Any]]:
    r = open_reader(db)
    try:
        return r.query("SELECT seq, ts, direction, transport, kind, payload, append_seqno FROM frames "
                       "WHERE session_id = ? ORDER BY seq", [sid]).to_pylist()
    finally:
        r.close()


def _wire_only(rows: list[dict[str, Any]], direction: str) -> list[bytes]:
    """Agent messages of one direction (the client does not log the BidiRequestId or end-stream)."""
    return [r["payload"] for r in rows if r["direction"] == direction and not _envelope_only(r)]


def _envelope_only(r: dict[str, Any]) -> bool:
    """Frames of the transport itself, which the client does not log as agent messages."""
    return r["kind"] in ("bidi_request_id", "bidi_poll_request", "end_stream", "end_stream.error",
                         "http_error") or (
        r["transport"] == "runpoll" and r["kind"] == "empty" and not r["payload"])  # the eof poll record


def _assert_matches_client_log(rows: list[dict[str, Any]], log: list[Any], transport: str) -> None:
    dec = default_decoder()
    for direction, msg_type in (("client", CLIENT_MSG), ("server", SERVER_MSG)):
        entries = [e for e in log if e.direction == direction]
        sent = [redact_payload(e.data, msg_type) for e in entries]
        stored = _wire_only(rows, direction)
        if direction == "client" and transport != "run" and len(stored) > len(sent):
            # The client logs an append once the server answered it. One it cut off while
            # closing the run may still have reached the wire (the capture saw it): only such a
            # tail of appends may be extra in the DB. Not "after the server's last frame": the
            # client may send it before that frame arrives and close before the answer comes.
            extra = [r for r in rows if r["direction"] == "client" and not _envelope_only(r)][len(sent):]
            assert all(r["append_seqno"] is not None and r["kind"] != "run_request" for r in extra), \
                f"the DB holds a client frame the client never sent: {[(r['seq'], r['kind']) for r in extra]}"
            stored = stored[:len(sent)]
        if stored != sent:
            at = next((i for i, (a, b) in enumerate(zip(stored, sent, strict=False)) if a != b), min(len(stored), len(sent)))
            db_view = [(r["seq"], r["kind"], r["append_seqno"], str(r["ts"])[11:]) for r in rows
                       if r["direction"] == direction][max(0, at - 3):at + 6]
            log_view = [(dec.classify_agent(e.data, msg_type).kind, e.ts_us) for e in entries][max(0, at - 3):at + 6]
            raise AssertionError(f"{transport} {direction}: DB frames differ from the client's log at {at} "
                                 f"(db {len(stored)}, log {len(sent)}): db {db_view} log {log_view}")
        # (the same tail allowance as above: only what the client logged is compared)
        kinds = [r["kind"] for r in rows if r["direction"] == direction and not _envelope_only(r)][:len(sent)]
        assert kinds == [dec.classify_agent(p, msg_type).kind for p in sent]
    assert [r["seq"] for r in rows] == list(range(len(rows)))


async def _turn(sim: Sim, m: Mitm, transport: str, prompt: str, workspace: Path | None = None,
                client_cls: type[AgentClient] = AgentClient, heartbeat: float = 0.3) -> tuple[AgentClient, Any]:
    kw: dict[str, Any] = {"workspace": workspace, "execute_locally": True} if workspace else {}
    async with client_cls(sim.url, TOKEN, transport=transport, verify=str(m.ca), heartbeat_interval=heartbeat,
                          **kw) as c:
        res = await asyncio.wait_for(c.run_turn(prompt, raise_on_error=False), 120)
    return c, res


@pytest.mark.parametrize("transport", ["run", "runsse", "runpoll"])
async def test_turn_through_capture_matches_client_log(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any,
                                                       transport: str, tmp_path: Path) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    c, res = await _turn(capture_sim, m, transport, "[scenario:tool_flow] run a command", workspace=tmp_path)
    assert res.error is None, res.error
    assert res.tool_calls
    assert res.text
    log = list(c.frame_log)
    sid = c.last_request_id
    assert m.stop() == 0
    assert not sidecar_path(m.db).exists()

    rows = _session_frames(m.db, sid)
    _assert_matches_client_log(rows, log, transport)
    s = session_row(m.db, sid)
    assert s["status"] == "complete"
    assert s["http_status"] == 200
    assert s["transport"] == transport
    assert s["auth_hash"] == short_hash(TOKEN)
    assert s["model"]
    kinds = [r["kind"] for r in rows]
    assert "exec_server_message.shell_args" in kinds
    assert "exec_client_message.shell_result" in kinds
    server = [r for r in rows if r["direction"] == "server"]
    stream = [r for r in server if r["transport"] == transport]
    assert stream[-1]["kind"] == "end_stream"
    # Only the refusal of a heartbeat append that crossed the run's end (404: no live stream, as the
    # service answers) may come after it, recorded as that append's answer; nothing else does.
    heartbeats = {r["append_seqno"] for r in rows if r["direction"] == "client" and r["kind"] == "client_heartbeat"
                  and r["transport"] == "bidi_append"}
    late = server[server.index(stream[-1]) + 1:]
    assert all(r["transport"] == "bidi_append" and r["kind"] == "http_error" and r["append_seqno"] in heartbeats
               for r in late), [(r["seq"], r["transport"], r["kind"], r["append_seqno"]) for r in late]
    if transport == "run":  # HTTP/2 on both legs of the proxy
        assert '"client_alpn": "h2"' in s["meta"]
        assert '"server_alpn": "h2"' in s["meta"]
    if transport in ("runsse", "runpoll"):
        assert kinds[0] == ("bidi_request_id" if transport == "runsse" else "bidi_poll_request")
        appends = [r["append_seqno"] for r in rows if r["transport"] == "bidi_append"]
        assert appends == list(range(len(appends)))
    # No stall: the client had server frames in hand while the stream was still being written.
    first_server = next(e.ts_us for e in log if e.direction == "server")
    end_ts = next(r["ts"] for r in rows if r["kind"] == "end_stream")
    assert first_server < _us(end_ts)


def _us(ts: Any) -> int:
    import datetime as dt

    return int(ts.replace(tzinfo=dt.UTC).timestamp() * 1_000_000)


async def test_twenty_concurrent_sessions(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    results = await asyncio.gather(*[
        _turn(capture_sim, m, "run" if i % 2 else "runsse", f"[scenario:text] session {i}", heartbeat=1.0) for i in range(20)])
    assert m.stop() == 0
    r = open_reader(m.db)
    stored = {row["session_id"]: row for row in r.query("SELECT * FROM sessions").to_pylist()}
    r.close()
    assert set(stored) == {c.last_request_id for c, _ in results}
    for c, res in results:
        assert res.error is None
        rows = _session_frames(m.db, c.last_request_id)
        _assert_matches_client_log(rows, list(c.frame_log), c.transport)
        assert stored[c.last_request_id]["status"] == "complete"


async def test_kill_9_keeps_flushed_frames(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    # The recording in mitmdump's own process dies with it: what was committed stays. (The child
    # process of cursor_writer=process outlives it and keeps more: test_capture_process.py.)
    m = capture_mitm(extra=("--set", "cursor_writer=thread"))
    capture_proxy_env(m)
    async with AgentClient(capture_sim.url, TOKEN, transport="run", verify=str(m.ca)) as c:
        killed_at, log, sid = await turn_with_mitmdump_killed(c, m)
    assert sidecar_path(m.db).exists()  # stale: the reader must ignore it (dead pid)
    rows = _session_frames(m.db, sid)
    stored = Counter((r["direction"], r["payload"]) for r in rows if r["kind"] != "end_stream")
    old = [e for e in log if e.ts_us < killed_at - m.flush_ms * 1000]
    assert len(old) > 20
    missing = [e for e in old if stored[(e.direction, e.data)] == 0]
    assert not missing, f"{len(missing)} frames older than one flush interval are missing"
    assert session_row(m.db, sid)["status"] == "open"
    # The next capture on the same file closes the orphaned session.
    m2 = capture_mitm(db=m.db)
    assert m2.stop() == 0
    s = session_row(m.db, sid)
    assert s["status"] == "incomplete"
    assert "capture ended" in s["error"]


class _ClientWithModelKey(AgentClient):
    def build_run_request(self, prompt: str, model: str, tools: Any, conversation_id: str) -> bytes:
        msg = pb.AgentClientMessage.FromString(super().build_run_request(prompt, model, tools, conversation_id))
        msg.run_request.model_details.api_key_credentials.api_key = MODEL_KEY
        msg.run_request.requested_model.model_id = model
        msg.run_request.requested_model.bedrock_credentials.secret_key = BEDROCK_SECRET
        return bytes(msg.SerializeToString())


MODEL_KEY = "sk-proj-MODELKEY-5a5a5a5a"
BEDROCK_SECRET = "bedrock-SECRET-9e9e9e"
COOKIE = "CursorCookie=Cookie-abcdefSECRETck"
CLIENT_KEY = "f" * 60 + "c0de"
CHECKSUM = "zQ8-CHECKSUM-value/6d1f"


async def test_no_secret_reaches_the_database(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    c, res = await _turn(capture_sim, m, "runsse", "[scenario:text] hello", client_cls=_ClientWithModelKey)
    assert res.error is None
    async with httpx.AsyncClient(proxy=m.proxy, verify=ssl.create_default_context(cafile=str(m.ca))) as http:
        resp = await http.post(capture_sim.url + "/agent.v1.AgentService/GetUsableModels", content=b"",
                               headers={"authorization": f"Bearer {TOKEN}", "cookie": COOKIE,
                                        "x-client-key": CLIENT_KEY, "x-cursor-checksum": CHECKSUM,
                                        "content-type": "application/proto", "connect-protocol-version": "1"})
        assert resp.status_code == 200
    assert m.stop() == 0
    blobs = b"".join(p.read_bytes() for p in m.db.parent.iterdir() if p.name.startswith(m.db.name))
    for secret in (TOKEN, COOKIE, "abcdefSECRETck", CLIENT_KEY, CHECKSUM, MODEL_KEY, BEDROCK_SECRET):
        assert secret.encode() not in blobs, f"{secret} stored in clear"
        assert binascii.hexlify(secret.encode()) not in blobs, f"{secret} stored as hex"
    r = open_reader(m.db)
    unary = r.query("SELECT transport, status, auth_hash, meta FROM sessions WHERE path LIKE '%GetUsableModels'"
                    ).to_pylist()
    run = r.query("SELECT model FROM sessions WHERE session_id = ?", [c.last_request_id]).to_pylist()
    r.close()
    assert unary
    assert unary[0]["transport"] == "unary"
    assert unary[0]["status"] == "complete"
    assert unary[0]["auth_hash"] == short_hash(TOKEN)
    assert "[redacted sha256:" in unary[0]["meta"]
    assert run[0]["model"]


async def test_follow_sees_frames_while_capturing(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    lines: list[tuple[float, str]] = []
    follower: subprocess.Popen[str] | None = None
    try:
        async with AgentClient(capture_sim.url, TOKEN, transport="run", verify=str(m.ca)) as c:
            async for ev in c.stream_turn("[scenario:longer] follow me"):
                if follower is None and type(ev).__name__ == "TextDelta":
                    sid = c.last_request_id
                    await wait_until_async(lambda sid=sid: _has_session(m.db, sid), timeout=30, interval=0.05,
                                           what="the session in the database")
                    follower = subprocess.Popen(
                        [str(BIN / "workbench"), "frames", sid, "--db", str(m.db), "--follow"],
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
                    threading.Thread(target=_collect, args=(follower, lines), daemon=True).start()
            turn_done = time.monotonic()
            assert open_reader(m.db).live
        total = len(_session_frames(m.db, sid))
        await wait_until_async(lambda: len(lines) >= total, timeout=60, interval=0.05,
                               what=lambda: f"{total} frames followed, got {len(lines)}")
    finally:
        if follower is not None:
            follower.terminate()
            follower.wait(30)
    seqs = [int(text.split()[0]) for _, text in lines]
    # Frames keep coming after the turn (the client's closing messages): compare what was printed.
    assert len(seqs) >= total, "follow lost or duplicated frames"
    assert seqs == list(range(len(seqs))), "follow lost or duplicated frames"
    assert any(t < turn_done for t, _ in lines), "follow saw nothing while the capture was in progress"
    assert m.stop() == 0
    assert not sidecar_path(m.db).exists()


def _has_session(db: Path, sid: str) -> bool:
    r = open_reader(db)
    return bool(r.query("SELECT 1 FROM sessions WHERE session_id = ?", [sid]).num_rows)


def _collect(proc: subprocess.Popen[str], out: list[tuple[float, str]]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip():
            out.append((time.monotonic(), line.rstrip("\n")))


async def test_workbench_capture_command(capture_sim: Sim, capture_confdir: Path, capture_proxy_env: Any,
                                         tmp_path: Path) -> None:
    db = tmp_path / "cli.duckdb"
    proc = subprocess.Popen(
        [str(BIN / "workbench"), "capture", "--port", "0", "--db", str(db), "--confdir", str(capture_confdir),
         "--", "--set", "ssl_insecure=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        rest = [proc.stdout.readline().strip() for _ in range(4)]
        ca = capture_confdir / "mitmproxy-ca-cert.pem"
        assert rest[0] == f"ca: {ca}"
        assert rest[1] == f"export HTTPS_PROXY={url}"
        assert rest[2] == f"export NODE_EXTRA_CA_CERTS={ca}"
        assert "useHttp1ForAgent" in rest[3]
        m = Mitm(int(url.rsplit(":", 1)[1]), db, ca, proc, 250)  # type: ignore[arg-type]
        capture_proxy_env(m)
        c, res = await _turn(capture_sim, m, "run", "[scenario:text] via the command")
        assert res.error is None
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "frames" in err
    assert not sidecar_path(db).exists()
    rows = _session_frames(db, c.last_request_id)
    _assert_matches_client_log(rows, list(c.frame_log), "run")
    assert session_row(db, c.last_request_id)["status"] == "complete"


async def test_stream_error_and_client_abort(capture_sim: Sim, capture_mitm: Any, capture_proxy_env: Any) -> None:
    m = capture_mitm()
    capture_proxy_env(m)
    c1, res = await _turn(capture_sim, m, "run", "[scenario:rate_limit] again")
    assert res.error is not None
    async with AgentClient(capture_sim.url, TOKEN, transport="run", verify=str(m.ca)) as c2:
        async for ev in c2.stream_turn("[scenario:long] abandon me"):
            if type(ev).__name__ == "TextDelta":
                break  # abandon the run mid-stream: the client resets its h2 stream
    def closed() -> bool:
        r = open_reader(m.db)
        rows = r.query("SELECT status FROM sessions WHERE session_id = ?", [c2.last_request_id]).to_pylist()
        return bool(rows and rows[0]["status"] != "open")

    await wait_until_async(closed, timeout=60, interval=0.1, what="the abandoned session to close")
    assert m.stop() == 0
    s1 = session_row(m.db, c1.last_request_id)
    assert s1["status"] == "error"
    assert "resource_exhausted" in s1["error"]
    # The server's last word is the error end; a client heartbeat already on its way may still be
    # recorded after it (capture keeps recording the client's side until the client ends it).
    server_frames = [f for f in _session_frames(m.db, c1.last_request_id) if f["direction"] == "server"]
    assert server_frames[-1]["kind"] == "end_stream.error"
    s2 = session_row(m.db, c2.last_request_id)
    assert s2["status"] == "aborted"
    assert s2["error"]


async def test_capture_command_reverse_mode(capture_sim: Sim, capture_confdir: Path, tmp_path: Path) -> None:
    db = tmp_path / "rev.duckdb"
    proc = subprocess.Popen(
        [str(BIN / "workbench"), "capture", "--port", "0", "--db", str(db), "--confdir", str(capture_confdir),
         "--mode", f"reverse:{capture_sim.url}", "--", "--set", "ssl_insecure=true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_proxy())
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("https://127.0.0.1:")
        ca = capture_confdir / "mitmproxy-ca-cert.pem"
        async with AgentClient(url, TOKEN, transport="runsse", verify=str(ca)) as c:
            res = await asyncio.wait_for(c.run_turn("[scenario:text] reverse", raise_on_error=False), 120)
        assert res.error is None
        assert res.text
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    s = session_row(db, c.last_request_id)
    assert s["status"] == "complete"
    assert s["transport"] == "runsse"
    assert '"proxy_mode": "reverse"' in s["meta"]


_HOLD_DB = """
import duckdb, sys
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
"""


async def test_locked_database_spools_loudly_then_merges(capture_sim: Sim, capture_mitm: Any,
                                                         capture_proxy_env: Any, tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_DB, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        m = capture_mitm(db=db)
        capture_proxy_env(m)
        c, res = await _turn(capture_sim, m, "run", "[scenario:text] while the db is held")
        assert res.error is None  # the proxy kept working
        assert m.stop() == 0
    finally:
        holder.communicate("")
    logtext = "".join(p.read_text() for p in tmp_path.glob("mitmdump-*.log"))
    assert "cannot open capture database" in logtext
    assert ".spool" in logtext
    spool = Path(str(db) + ".spool")
    assert spool.exists()
    assert TOKEN.encode() not in spool.read_bytes()
    m2 = capture_mitm(db=db)  # the next start merges the spool
    assert m2.stop() == 0
    assert not spool.exists()
    rows = _session_frames(db, c.last_request_id)
    _assert_matches_client_log(rows, list(c.frame_log), "run")
    assert session_row(db, c.last_request_id)["status"] == "complete"


async def test_http_error_recorded_on_the_session(capture_mitm: Any, tmp_path: Path) -> None:
    sim = subprocess.Popen([str(BIN / "workbench"), "sim", "--port", "0", "--token", "the-right-token",
                            "--cert-dir", str(tmp_path / "certs"), "--quiet"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env_without_proxy())
    try:
        assert sim.stdout is not None
        url = sim.stdout.readline().strip()
        m = capture_mitm()
        # httpx's default 5 s read timeout is not an answer time the capture promises: a loaded
        # machine (the suite on every core beside other jobs) took longer
        async with httpx.AsyncClient(proxy=m.proxy, verify=ssl.create_default_context(cafile=str(m.ca)),
                                     timeout=60) as http:
            resp = await http.post(url + "/agent.v1.AgentService/GetUsableModels", content=b"",
                                   headers={"authorization": "Bearer wrong-token", "x-request-id": "unauth-1",
                                            "content-type": "application/proto", "connect-protocol-version": "1"})
        assert resp.status_code == 401
        assert m.stop() == 0
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(30)
    r = open_reader(m.db)
    s = r.query("SELECT session_id, status, http_status, error, request_id FROM sessions").to_pylist()
    frames = r.query("SELECT direction, kind, error FROM frames ORDER BY seq").to_pylist()
    r.close()
    assert len(s) == 1
    assert s[0]["status"] == "error"
    assert s[0]["http_status"] == 401
    assert s[0]["request_id"] == "unauth-1"
    assert "unauthenticated" in s[0]["error"]
    assert frames[-1]["direction"] == "server"
    assert frames[-1]["kind"] == "http_error"
