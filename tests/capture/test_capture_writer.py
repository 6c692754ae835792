"""The capture writer on its own: events in, sessions and frames out (no proxy)."""

from __future__ import annotations

import binascii
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import wait_until

from workbench.capture.spool import spool_candidates
from workbench.capture.writer import (
    Body,
    CaptureWriter,
    Chunk,
    Done,
    Eof,
    FlowOpen,
    Open,
    Response,
    WriterConfig,
)
from workbench.schema import pb
from workbench.store import open_reader
from workbench.wire.envelope import FLAG_END_STREAM, encode

TOKEN = "eyJhbGciOiJIUzI1NiJ9.tok-SECRET-7f3a"
API_KEY = "sk-live-MODELKEY-99c1"


def _run_request(model: str = "claude-x", conv: str = "conv-1") -> bytes:
    return pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_id=conv,
        requested_model=pb.RequestedModel(model_id=model, api_key_credentials=pb.ApiKeyCredentials(api_key=API_KEY)),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="please refactor foo.py"))),
    )).SerializeToString()


def _text(t: str) -> bytes:
    return pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
        text_delta=pb.TextDelta(text=t))).SerializeToString()


def _hb() -> bytes:
    return pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString()


def _open(key: str, transport: str, streaming: bool = True, rid: str | None = "rid-1") -> tuple:
    path = {"run": "/agent.v1.AgentService/Run", "runsse": "/agent.v1.AgentService/RunSSE",
            "bidi_append": "/aiserver.v1.BidiService/BidiAppend"}.get(transport, "/agent.v1.AgentService/GetUsableModels")
    return Open(FlowOpen(key=key, transport=transport, streaming=streaming, host="127.0.0.1", path=path,
                              ts_us=time.time_ns() // 1000, request_id=rid, client_version="cli-2026.01.01-abc",
                              auth_hash="0123456789ab", meta={"request_headers": [["x-request-id", rid]]}))


def _writer(tmp_path: Path, **kw) -> CaptureWriter:
    w = CaptureWriter(WriterConfig(db_path=str(tmp_path / "cap.duckdb"), flush_interval=0.05, live=False, **kw))
    w.start()
    return w


def _chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def test_run_stream_reassembled_from_odd_chunks(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    q = w.queue.put
    q(_open("f1", "run"))
    client = encode(_run_request()) + encode(_hb())
    # connect-content-encoding: gzip compresses envelopes one by one (flag 0x01)
    server = (b"".join(encode(_text(f"t{i}"), compress=i == 3) for i in range(5))
              + encode(b"{}", FLAG_END_STREAM))
    now = time.time_ns() // 1000
    for i, c in enumerate(_chunks(client, 3)):
        q(Chunk("f1", "client", now + i, c))
    q(Response("f1", now, 200, [("content-type", "application/connect+proto")], "HTTP/2.0", "h2"))
    for i, c in enumerate(_chunks(server, 7)):
        q(Chunk("f1", "server", now + 100 + i, c))
    q(Eof("f1", "client", now + 200))
    q(Eof("f1", "server", now + 200))
    q(Eof("f1", "server", now + 201))  # mitmproxy calls the callable with b"" twice
    q(Done("f1", now + 300, None, {}))
    w.stop()

    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT seq, direction, kind, payload FROM frames WHERE session_id='rid-1' ORDER BY seq").to_pylist()
    assert [x["kind"] for x in rows] == ["run_request", "client_heartbeat"] + ["interaction_update.text_delta"] * 5 + ["end_stream"]
    assert [x["direction"] for x in rows] == ["client"] * 2 + ["server"] * 6
    assert rows[2]["payload"] == _text("t0")
    assert rows[5]["payload"] == _text("t3")
    s = r.query("SELECT status, model, conversation_id, http_status, transport, client_version FROM sessions").to_pylist()
    assert s == [{"status": "complete", "model": "claude-x", "conversation_id": "conv-1", "http_status": 200,
                  "transport": "run", "client_version": "cli-2026.01.01-abc"}]
    # the model key never reaches the file
    r.close()
    assert API_KEY.encode() not in (tmp_path / "cap.duckdb").read_bytes()


def _append_body(rid: str, seqno: int, msg: bytes) -> bytes:
    return pb.BidiAppendRequest(data=binascii.hexlify(msg).decode(), request_id=pb.BidiRequestId(request_id=rid),
                                append_seqno=seqno).SerializeToString()


def test_runsse_appends_joined_and_reordered(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    # seqno 1 and 2 arrive before the RunSSE flow and before seqno 0
    msgs = [_run_request(), _hb(), _hb(), _hb()]
    for n, key in ((2, "a2"), (1, "a1")):
        q(_open(key, "bidi_append", streaming=False, rid="sse-1"))
        q(Body(key, "client", now + n, _append_body("sse-1", n, msgs[n])))
        q(Response(key, now, 200, [], "HTTP/1.1", None))
        q(Body(key, "server", now, b""))
        q(Done(key, now, None, {}))
    q(_open("s", "runsse", rid="header-id"))
    q(Chunk("s", "client", now + 10, encode(pb.BidiRequestId(request_id="sse-1").SerializeToString())))
    q(Eof("s", "client", now + 10))
    q(Response("s", now, 200, [], "HTTP/1.1", None))
    q(Chunk("s", "server", now + 20, encode(_text("hi"))))
    for n in (0, 3):
        q(_open(f"a{n}", "bidi_append", streaming=False, rid="sse-1"))
        q(Body(f"a{n}", "client", now + 30 + n, _append_body("sse-1", n, msgs[n])))
        q(Done(f"a{n}", now, None, {}))
    q(Chunk("s", "server", now + 40, encode(b"{}", FLAG_END_STREAM)))
    q(Done("s", now + 50, None, {}))
    w.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT seq, transport, kind, append_seqno, raw FROM frames WHERE session_id='sse-1' ORDER BY seq").to_pylist()
    appends = [x["append_seqno"] for x in rows if x["transport"] == "bidi_append"]
    assert appends == [0, 1, 2, 3]
    assert rows[0]["kind"] == "bidi_request_id"
    assert {x["kind"] for x in rows} >= {"run_request", "client_heartbeat", "interaction_update.text_delta", "end_stream"}
    s = r.query("SELECT session_id, transport, status, model FROM sessions").to_pylist()
    assert s == [{"session_id": "sse-1", "transport": "runsse", "status": "complete", "model": "claude-x"}]
    r.close()
    data = (tmp_path / "cap.duckdb").read_bytes()
    assert API_KEY.encode() not in data
    assert binascii.hexlify(API_KEY.encode()) not in data  # nor its hex form inside the BidiAppend wrapper


@pytest.mark.parametrize("runsse_opens", ["before_the_append", "after_the_append"])
def test_an_append_that_overtakes_its_runsse_body_is_recorded_after_it(tmp_path: Path, runsse_opens: str) -> None:
    """mitmproxy hands a streamed RunSSE body over once the upstream connection is open, so the
    first append's whole body can come first; over HTTP/1.1 the two travel on two connections whose
    hooks run in any order, so the append can even come before the RunSSE's headers. The recording
    keeps the client's order."""
    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    if runsse_opens == "before_the_append":
        q(_open("s", "runsse", rid="header-id"))
    q(_open("a0", "bidi_append", streaming=False, rid="sse-2"))
    q(Body("a0", "client", now + 1, _append_body("sse-2", 0, _run_request())))
    q(Done("a0", now + 2, None, {}))
    time.sleep(0.2)  # several writer ticks: the append must still wait
    if runsse_opens == "after_the_append":
        q(_open("s", "runsse", rid="header-id"))
    q(Chunk("s", "client", now + 3, encode(pb.BidiRequestId(request_id="sse-2").SerializeToString())))
    q(Eof("s", "client", now + 3))
    q(Response("s", now + 4, 200, [], "HTTP/1.1", None))
    q(Chunk("s", "server", now + 5, encode(b"{}", FLAG_END_STREAM)))
    q(Done("s", now + 6, None, {}))
    w.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT seq, kind FROM frames WHERE session_id='sse-2' ORDER BY seq").to_pylist()
    r.close()
    assert [x["kind"] for x in rows] == ["bidi_request_id", "run_request", "end_stream"]


def test_append_waits_for_a_bodyless_runsse_only_for_a_while(tmp_path: Path) -> None:
    from workbench.capture.appends import STREAM_WAIT_S

    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    q(_open("s", "runsse", rid="header-id"))  # its body never comes
    q(_open("a0", "bidi_append", streaming=False, rid="sse-3"))
    q(Body("a0", "client", now + 1, _append_body("sse-3", 0, _run_request())))
    q(Done("a0", now + 2, None, {}))
    start = time.monotonic()
    wait_until(lambda: w.frames_committed >= 1, timeout=STREAM_WAIT_S + 10)
    assert time.monotonic() - start >= STREAM_WAIT_S * 0.9
    w.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    assert [x["kind"] for x in r.query("SELECT kind FROM frames WHERE session_id='sse-3'").to_pylist()] == ["run_request"]
    r.close()


def test_http_error_and_abort_recorded(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    q(_open("e", "run", rid="err-1"))
    q(Chunk("e", "client", now, encode(_run_request())))
    q(Response("e", now, 401, [("content-type", "application/json")], "HTTP/2.0", "h2"))
    q(Chunk("e", "server", now, b'{"code":"unauthenticated","message":"Not logged in"}'))
    q(Eof("e", "server", now))
    q(Done("e", now, None, {}))
    q(_open("x", "run", rid="abort-1"))
    q(Chunk("x", "client", now, encode(_run_request())))
    q(Chunk("x", "server", now, encode(_text("partial"))[:-2]))
    q(Done("x", now, "peer closed connection", {}))
    w.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    s = {x["session_id"]: x for x in r.query("SELECT session_id, status, http_status, error FROM sessions").to_pylist()}
    assert s["err-1"]["status"] == "error"
    assert s["err-1"]["http_status"] == 401
    assert "unauthenticated" in s["err-1"]["error"]
    assert s["abort-1"]["status"] == "aborted"
    assert s["abort-1"]["error"] == "peer closed connection"
    kinds = r.query("SELECT session_id, kind, error FROM frames ORDER BY session_id, seq").to_pylist()
    assert ("err-1", "http_error") in [(k["session_id"], k["kind"]) for k in kinds]
    assert [k for k in kinds if k["session_id"] == "abort-1"][-1]["kind"] == "malformed"  # truncated frame kept


def test_unary_call_is_its_own_session(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    q(_open("u", "unary", streaming=False, rid="run-7"))
    q(Body("u", "client", now, b""))
    q(Response("u", now, 200, [], "HTTP/2.0", "h2"))
    q(Body("u", "server", now, b"\x0a\x03foo"))
    q(Done("u", now, None, {}))
    w.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    s = r.query("SELECT transport, request_id, status, path FROM sessions").to_pylist()
    assert s == [{"transport": "unary", "request_id": "run-7", "status": "complete",
                  "path": "/agent.v1.AgentService/GetUsableModels"}]
    assert r.query("SELECT direction, kind FROM frames ORDER BY seq").to_pylist() == [
        {"direction": "client", "kind": "empty"}, {"direction": "server", "kind": "unary"}]


_HOLD = """
import duckdb, sys
con = duckdb.connect(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.mark.slow
def test_locked_database_spools_then_merges(tmp_path: Path) -> None:
    db = tmp_path / "cap.duckdb"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        errors: list[str] = []
        w = CaptureWriter(WriterConfig(db_path=str(db), flush_interval=0.05, live=False), on_error=errors.append)
        w.start()
        assert errors
        assert "cannot open capture database" in errors[0]
        assert ".spool" in errors[0]
        q = w.queue.put
        now = time.time_ns() // 1000
        q(_open("f", "run", rid="spooled-1"))
        q(Chunk("f", "client", now, encode(_run_request())))
        q(Chunk("f", "server", now + 1, encode(_text("a")) + encode(b"{}", FLAG_END_STREAM)))
        q(Done("f", now + 2, None, {}))
        w.stop()
        spool = spool_candidates(db)[0]
        assert spool.exists()
        assert API_KEY.encode() not in spool.read_bytes()
        assert b"MODELKEY" not in spool.read_bytes()
    finally:
        holder.communicate("")
    # the next start merges the spool and deletes it
    w2 = _writer(tmp_path)
    w2.stop()
    assert not spool_candidates(db)[0].exists()
    r = open_reader(db)
    rows = r.query("SELECT seq, kind FROM frames WHERE session_id='spooled-1' ORDER BY seq").to_pylist()
    assert [x["kind"] for x in rows] == ["run_request", "interaction_update.text_delta", "end_stream"]
    assert [x["seq"] for x in rows] == [0, 1, 2]
    assert r.query("SELECT status, model FROM sessions").to_pylist() == [{"status": "complete", "model": "claude-x"}]


def test_content_redaction_hides_prompts(tmp_path: Path) -> None:
    w = _writer(tmp_path, content=True)
    q = w.queue.put
    now = time.time_ns() // 1000
    q(_open("f", "run", rid="c-1"))
    q(Chunk("f", "client", now, encode(_run_request())))
    q(Chunk("f", "server", now, encode(_text("the model says secret plans"))))
    q(Done("f", now, None, {}))
    w.stop()
    data = (tmp_path / "cap.duckdb").read_bytes()
    assert b"please refactor" not in data
    assert b"secret plans" not in data
    r = open_reader(tmp_path / "cap.duckdb")
    kinds = r.query("SELECT kind, summary FROM frames ORDER BY seq").to_pylist()
    assert kinds[0]["kind"] == "run_request"
    assert kinds[1]["kind"] == "interaction_update.text_delta"
    assert "redacted" in kinds[1]["summary"]


def test_commit_failure_mid_capture_goes_to_the_spool(tmp_path: Path) -> None:
    errors: list[str] = []
    w = CaptureWriter(WriterConfig(db_path=str(tmp_path / "cap.duckdb"), flush_interval=0.05, live=False),
                      on_error=errors.append)
    w.start()
    q = w.queue.put
    now = time.time_ns() // 1000
    q(_open("f", "run", rid="mid-1"))
    q(Chunk("f", "client", now, encode(_run_request())))
    wait_until(lambda: w.frames_committed >= 1, timeout=30, interval=0.01, what="the first frame to be committed")
    assert w.frames_committed == 1
    assert w.sink.store is not None
    w.sink.store.con.close()  # the database goes away under the writer (disk gone, file removed...)
    q(Chunk("f", "server", now + 1, encode(_text("a")) + encode(_text("b"))))
    q(Chunk("f", "server", now + 2, encode(b"{}", FLAG_END_STREAM)))
    q(Done("f", now + 3, None, {}))
    w.stop()
    assert errors
    assert "failed" in errors[-1]
    assert ".spool" in errors[-1]
    w2 = _writer(tmp_path)
    w2.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT seq, kind FROM frames WHERE session_id = 'mid-1' ORDER BY seq").to_pylist()
    assert [x["kind"] for x in rows] == ["run_request", "interaction_update.text_delta",
                                         "interaction_update.text_delta", "end_stream"]
    assert [x["seq"] for x in rows] == [0, 1, 2, 3]
    assert r.query("SELECT status, frame_count FROM sessions").to_pylist() == [{"status": "complete", "frame_count": 4}]


def test_unwritable_directory_spools_to_the_state_dir(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the capture folder should be")
    db = blocker / "cap.duckdb"
    errors: list[str] = []
    w = CaptureWriter(WriterConfig(db_path=str(db), flush_interval=0.05, live=False), on_error=errors.append)
    w.start()
    now = time.time_ns() // 1000
    w.queue.put(_open("f", "run", rid="state-1"))
    w.queue.put(Chunk("f", "client", now, encode(_run_request())))
    w.queue.put(Done("f", now, "client went away", {}))
    w.stop()
    spool = spool_candidates(db)[1]
    assert spool.is_relative_to(tmp_path / "state")
    assert spool.exists()
    assert str(spool) in errors[-1]
    blocker.unlink()
    blocker.mkdir()
    _writer_at(db).stop()  # the next start finds the spool in the state dir and merges it
    assert not spool.exists()
    r = open_reader(db)
    assert r.query("SELECT session_id, status, error FROM sessions").to_pylist() == [
        {"session_id": "state-1", "status": "aborted", "error": "client went away"}]


def _writer_at(db: Path) -> CaptureWriter:
    w = CaptureWriter(WriterConfig(db_path=str(db), flush_interval=0.05, live=False))
    w.start()
    return w


def test_token_rpc_bodies_are_stored_as_markers(tmp_path: Path) -> None:
    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    fo = _open("t", "unary", streaming=False, rid=None).flow
    fo.path = "/aiserver.v1.DashboardService/RefreshGithubAccessToken"
    q(Open(fo))
    q(Body("t", "client", now, b"\x0a\x10gho_SECRETGITHUB"))
    q(Response("t", now, 200, [], "HTTP/2.0", "h2"))
    q(Body("t", "server", now, b"\x0a\x11ghu_NEWSECRETTOK"))
    q(Done("t", now, None, {}))
    w.stop()
    data = (tmp_path / "cap.duckdb").read_bytes()
    assert b"SECRETGITHUB" not in data
    assert b"NEWSECRETTOK" not in data
    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT direction, summary, payload FROM frames ORDER BY seq").to_pylist()
    assert [x["direction"] for x in rows] == ["client", "server"]
    assert all(x["payload"].startswith(b"[redacted sha256:") for x in rows)


def test_content_coded_unary_bodies_are_undone_within_the_budget(tmp_path: Path) -> None:
    """The addon hands whole bodies over as they crossed the wire (mitmproxy's ``get_content``
    would inflate them on the proxy's loop without a limit): a gzip'd answer is undone here, a
    few KB of gzip that inflate past the per-frame budget stay one ``compressed`` frame."""
    import gzip

    w = _writer(tmp_path)
    q = w.queue.put
    now = time.time_ns() // 1000
    q(_open("ok", "unary", streaming=False, rid="coded"))
    q(Body("ok", "client", now, b""))
    q(Response("ok", now, 200, [], "HTTP/2.0", "h2"))
    q(Body("ok", "server", now, gzip.compress(b"\x0a\x03foo"), ("gzip",)))
    q(Done("ok", now, None, {}))
    bomb = gzip.compress(b"\x00" * (40 << 20))  # 40 MiB of zeros in ~40 KB: past the 32 MiB frame budget
    q(_open("bomb", "unary", streaming=False, rid="bomb"))
    q(Body("bomb", "client", now, b""))
    q(Response("bomb", now, 200, [], "HTTP/2.0", "h2"))
    q(Body("bomb", "server", now, bomb, ("gzip",)))
    q(Done("bomb", now, None, {}))
    w.stop()
    r = open_reader(tmp_path / "cap.duckdb")
    rows = r.query("SELECT s.request_id, f.kind, f.payload, f.error FROM frames f JOIN sessions s USING (session_id) "
                   "WHERE f.direction = 'server' ORDER BY s.request_id").to_pylist()
    assert [(x["request_id"], x["kind"]) for x in rows] == [("bomb", "compressed"), ("coded", "unary")]
    assert rows[1]["payload"] == b"\x0a\x03foo"
    assert rows[0]["payload"] == bomb  # kept as it crossed the wire, inflated when viewed
    assert "budget" in rows[0]["error"]
