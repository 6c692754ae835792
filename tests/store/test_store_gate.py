"""The write gate (issue 20): what every frame and session row passes on its way into DuckDB.

Real DuckDB files throughout; frames are built as the decoder builds them from the wire.
"""

from __future__ import annotations

import gzip
import json
import shutil
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.capture.spool import FrameRecord, Spool, merge_spools, spool_candidates
from workbench.client.recording import Journal, RunWire
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, Frame, default_decoder
from workbench.schema import pb
from workbench.store.db import SessionInfo, Store
from workbench.store.gate import SCRUB_LIMIT, wire_bytes, wire_text
from workbench.store.recorder import Recorder
from workbench.wire.envelope import encode

CANARY = "sk-canary-GATE-5d1e0c"


def _run_request(pad: int = 0) -> bytes:
    return pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_id="conv-gate",
        requested_model=pb.RequestedModel(model_id="m", api_key_credentials=pb.ApiKeyCredentials(api_key=CANARY)),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="x" * pad))),
    )).SerializeToString()


def _subagent_exec() -> bytes:
    return pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=3, exec_id="ex-3", subagent_args=pb.SubagentArgs(
            tool_call_id="call-3", prompt="look around",
            api_key_credentials=pb.ApiKeyCredentials(api_key=CANARY, base_url="https://llm.example"))),
    ).SerializeToString()


def _inflated_payloads(db: Path) -> list[bytes]:
    """Every stored payload and raw, gzip ones inflated (as a viewer would see them)."""
    with Store(db, read_only=True) as s:
        rows = s.query("SELECT payload, raw FROM frames").to_pylist()
    out = []
    for r in rows:
        for blob in (r["payload"], r["raw"]):
            if not blob:
                continue
            out.append(blob)
            if blob[:2] == b"\x1f\x8b":
                out.append(zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(blob))
    return out


# text from the wire --------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_any_wire_bytes_are_stored_as_utf8_and_come_back(raw: bytes) -> None:
    s = raw.decode("utf-8", "surrogateescape")  # what mitmproxy hands over for a header value
    stored = wire_text(s)
    stored.encode("utf-8")  # valid UTF-8: Arrow and DuckDB take it
    assert wire_bytes(stored) == raw


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_valid_text_comes_back_too_and_plain_text_is_unchanged(s: str) -> None:
    if any(0xD800 <= ord(c) <= 0xDFFF for c in s):
        return
    assert wire_bytes(wire_text(s)) == s.encode()
    if "\\" not in s:
        assert wire_text(s) == s


def test_session_and_frame_text_that_is_not_utf8_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    sid = "rid-\udcfe"
    with Store(db) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo(sid, client_version="1.0\udcff", error="grpc-status 14 caf\udce9 down",
                                     meta={"trailers": {"grpc-message": "caf\udce9 down"}}))
        rec.add(sid, 1_000, "server", "run", "k\udc80", Frame("end_stream.error", "14 caf\udce9 down", b"{}",
                                                                error="caf\udce9", request_id=sid,
                                                                meta={"note": "caf\udce9"}))
        rec.flush()
        rec.add(sid, 2_000, "server", "run", None, Frame("empty", "later", b""))  # the session goes on
        rec.flush()
    with Store(db, read_only=True) as s:
        [row] = s.query("SELECT * FROM sessions").to_pylist()
        frames = s.query("SELECT * FROM frames ORDER BY seq").to_pylist()
    assert wire_bytes(row["session_id"]) == b"rid-\xfe"
    assert wire_bytes(row["client_version"]) == b"1.0\xff"
    assert wire_bytes(json.loads(row["meta"])["trailers"]["grpc-message"]) == b"caf\xe9 down"
    assert row["frame_count"] == 2
    assert [f["seq"] for f in frames] == [0, 1]
    assert {f["session_id"] for f in frames} == {row["session_id"]}
    assert wire_bytes(frames[0]["summary"]) == b"14 caf\xe9 down"
    assert wire_bytes(frames[0]["stream"]) == b"k\x80"
    assert wire_bytes(json.loads(frames[0]["meta"])["note"]) == b"caf\xe9"


# credentials, also compressed ----------------------------------------------------------------

def _compressed(payload: bytes, msg_type: str) -> Frame:
    """A gzip frame the decoder kept compressed (over an inflate budget)."""
    dec = default_decoder()
    env = encode(payload, compress=True)
    from workbench.wire.envelope import split_unary
    [e] = split_unary(env)
    f = dec.classify_carried(e.payload, msg_type)  # what it would be inflated; then kept compressed:
    return Frame("compressed", "gzip frame kept compressed (over an inflate budget)", env[5:], flags=1,
                 msg_type=f.msg_type or msg_type)


@pytest.mark.parametrize("make", [
    lambda: _compressed(_run_request(pad=100_000), CLIENT_MSG),
    lambda: _compressed(_subagent_exec() + b"", SERVER_MSG),
    lambda: Frame("run_request", "run", _run_request(), msg_type=CLIENT_MSG),
    lambda: default_decoder().classify_agent(_subagent_exec(), SERVER_MSG),
    # an RPC path the schema does not name (no message type): read as the agent messages
    lambda: Frame("unary", "message", _run_request(), flags=0, msg_type=None),
    lambda: Frame("unary", "message", _subagent_exec(), flags=0, msg_type=None),
    lambda: Frame("compressed", "kept compressed", gzip.compress(_run_request()), flags=1, msg_type=None),
    # a unary message of another type that holds a credentials oneof
    lambda: Frame("unary", "ModelDetails", pb.ModelDetails(
        model_id="m", api_key_credentials=pb.ApiKeyCredentials(api_key=CANARY)).SerializeToString(),
        msg_type="agent.v1.ModelDetails"),
], ids=["compressed-run-request", "compressed-subagent-exec", "run-request", "subagent-exec",
        "untyped-run-request", "untyped-subagent-exec", "untyped-compressed", "typed-model-details"])
def test_no_model_key_is_stored_whatever_the_frame_kind(tmp_path: Path, make: Any) -> None:
    db = tmp_path / "k.duckdb"
    f = make()
    kind = f.kind
    with Store(db) as store:
        rec = Recorder(store)
        rec.add("s", 1_000, "client", "run", None, f)
        rec.flush()
    blobs = _inflated_payloads(db)
    assert blobs
    assert not any(CANARY.encode() in b for b in blobs)
    assert CANARY.encode() not in db.read_bytes()
    with Store(db, read_only=True) as s:
        [row] = s.query("SELECT kind, payload FROM frames").to_pylist()
    assert row["kind"] == kind  # still what it was: a compressed frame stays compressed
    if kind == "compressed":  # and still inflates to the message, its key a marker
        inner = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(row["payload"])
        assert b"[redacted sha256:" in inner


def test_a_compressed_frame_that_cannot_be_inspected_is_stored_without_its_payload(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    whole = gzip.compress(_run_request())
    cut = whole[:-8]  # a truncated gzip (no trailer): what there is still inflates to the key
    assert CANARY.encode() in zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(cut)
    with Store(db) as store:
        rec = Recorder(store)
        rec.add("s", 1_000, "client", "run", None, Frame("compressed", "kept", cut, flags=1, msg_type=CLIENT_MSG))
        rec.flush()
        [row] = store.query("SELECT payload, error FROM frames").to_pylist()
    assert row["payload"].startswith(b"[redacted sha256:")
    assert "could not be inflated" in row["error"]


def test_redaction_is_idempotent_so_sources_that_redacted_already_keep_their_markers(tmp_path: Path) -> None:
    from workbench.redact import redact_frame

    once = redact_frame(Frame("run_request", "run", _run_request(), msg_type=CLIENT_MSG))
    db = tmp_path / "i.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        rec.add("s", 1, "client", "run", None, Frame(once.kind, once.summary, once.payload, msg_type=CLIENT_MSG))
        rec.open_session(SessionInfo("s"))
        rec.sessions["s"].meta["request_headers"] = [["authorization", "Bearer tok-SECRET"]]
        rec.touch("s")
        rec.flush()
        [f] = store.query("SELECT payload FROM frames").to_pylist()
        [s] = store.query("SELECT meta FROM sessions").to_pylist()
    assert f["payload"] == once.payload
    assert "tok-SECRET" not in s["meta"] and "Bearer [redacted sha256:" in s["meta"]


def test_client_recording_redacts_what_the_server_sent(tmp_path: Path) -> None:
    """``workbench client --record``: the server's subagent exec carries the user's model key."""
    db = tmp_path / "client.duckdb"
    journal = Journal(str(db))
    journal.open_session("run-1", transport="run")
    wire = RunWire([], journal, "run-1")
    dec = default_decoder().stream("run", "server")
    for f in dec.feed(encode(_subagent_exec())):
        wire.frame(1_000, "server", "run", f)
    journal.close()
    blobs = _inflated_payloads(db)
    assert blobs and not any(CANARY.encode() in b for b in blobs)


# one transaction -----------------------------------------------------------------------------

def test_frames_and_their_session_commit_together_or_not_at_all(tmp_path: Path) -> None:
    db = tmp_path / "tx.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        rec.open_session(SessionInfo("s", http_status=2**40))  # does not fit the column: the write fails
        rec.add("s", 1, "client", "run", None, Frame("empty", "e", b""))
        with pytest.raises(Exception):  # noqa: B017 - whatever the engine raises
            rec.flush()
        assert store.query("SELECT count(*) AS n FROM frames").to_pylist() == [{"n": 0}]


# the spool -----------------------------------------------------------------------------------

def _frame(n: int) -> Frame:
    return Frame("empty", f"frame {n}", b"")


def _spool(db: Path, sessions: list[SessionInfo], records: list[FrameRecord]) -> Path:
    sp = Spool(db)
    sp.write(sessions, records)
    sp.close()
    assert sp.path is not None
    return sp.path


def test_spool_merge_keeps_seq_and_is_idempotent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    db = tmp_path / "m.duckdb"
    # A batch reached the database as frames without its session row (what an earlier workbench
    # left when the session insert failed after the frames' commit), and then went to the spool too.
    with Store(db) as store:
        rec = Recorder(store)
        for n in range(3):
            rec.add("s", 1_000 + n, "client", "run", None, _frame(n))
        rec.flush()
        store.con.execute("DELETE FROM sessions")
    records = [FrameRecord("s", n, 1_000 + n, "client", "run", None, _frame(n)) for n in range(5)]
    path = _spool(db, [SessionInfo("s", status="complete")], records)
    copy = tmp_path / "copy.spool"
    shutil.copy(path, copy)
    with Store(db) as store:
        assert merge_spools(store, db) == 2  # seq 3 and 4; 0-2 were stored already
        assert not path.exists()
        rows = store.query("SELECT seq, summary FROM frames ORDER BY seq").to_pylist()
        [s] = store.query("SELECT status, frame_count FROM sessions").to_pylist()
    assert rows == [{"seq": n, "summary": f"frame {n}"} for n in range(5)]
    assert s == {"status": "complete", "frame_count": 5}
    # Killed after the commit, before the delete: the file is back, merging it again adds nothing.
    shutil.copy(copy, path)
    with Store(db) as store:
        assert merge_spools(store, db) == 0
        assert store.query("SELECT count(*) AS n FROM frames").to_pylist() == [{"n": 5}]
    assert not any(p.exists() for p in spool_candidates(db))
    assert "already stored" in capsys.readouterr().err


def test_a_spool_written_without_the_database_goes_after_the_stored_frames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    db = tmp_path / "n.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        rec.add("s", 1, "client", "run", None, _frame(0))
        rec.flush()
    # the spool numbered its own frames from 0 (it never saw the database): different frames
    path = _spool(db, [SessionInfo("s")], [FrameRecord("s", n, 50 + n, "server", "run", None, _frame(9))
                                           for n in range(3)])
    with Store(db) as store:
        assert merge_spools(store, db) == 3
        rows = store.query("SELECT seq, ts_us FROM (SELECT seq, epoch_us(ts) AS ts_us FROM frames) ORDER BY seq").to_pylist()
    # after the stored frame, in the spool's order
    assert rows == [{"seq": 0, "ts_us": 1}, {"seq": 1, "ts_us": 50}, {"seq": 2, "ts_us": 51}, {"seq": 3, "ts_us": 52}]
    assert not path.exists()


def test_a_merge_that_fails_leaves_the_spool_and_stores_nothing(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    db = tmp_path / "f.duckdb"
    Store(db).close()
    path = _spool(db, [SessionInfo("s", http_status=2**40)],  # its session row cannot be written
                  [FrameRecord("s", 0, 1, "client", "run", None, _frame(0))])
    with Store(db) as store:
        with pytest.raises(Exception):  # noqa: B017 - whatever the engine raises
            merge_spools(store, db)
        assert store.query("SELECT count(*) AS n FROM frames").to_pylist() == [{"n": 0}]
    assert path.exists()


def test_a_gzip_payload_that_fails_to_inflate_is_looked_in_too(tmp_path: Path) -> None:
    """The decoder keeps a broken gzip frame as ``malformed`` with its compressed bytes."""
    cut = gzip.compress(_run_request())[:-8]
    env = bytes((1,)) + len(cut).to_bytes(4, "big") + cut
    [f] = default_decoder().stream("run", "client").feed(env)
    assert f.kind == "malformed" and f.payload == cut
    db = tmp_path / "m.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        rec.add("s", 1, "client", "run", None, f)
        rec.flush()
        [row] = store.query("SELECT payload, error FROM frames").to_pylist()
    assert row["payload"].startswith(b"[redacted sha256:")
    assert "may carry a credential" in row["error"]


# every credential field, every way a frame can arrive ----------------------------------------

def _creds(kind: str) -> dict[str, Any]:
    if kind == "api_key":
        return {"api_key_credentials": pb.ApiKeyCredentials(api_key=CANARY, base_url="https://b")}
    if kind == "azure":
        return {"azure_credentials": pb.AzureCredentials(api_key=CANARY, base_url="https://b", deployment="d")}
    return {"bedrock_credentials": pb.BedrockCredentials(access_key=CANARY + "-a", secret_key=CANARY + "-s",
                                                         session_token=CANARY + "-t", region="eu")}


def _message(holder: str, cred: str) -> tuple[str, bytes]:
    """(direction, agent message bytes) with the canary in the chosen credential field."""
    c = _creds(cred)
    if holder == "subagent":
        return "server", pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
            id=1, subagent_args=pb.SubagentArgs(tool_call_id="c", **c))).SerializeToString()
    model = (pb.RequestedModel(model_id="m", **c) if holder.endswith("requested")
             else pb.ModelDetails(model_id="m", **c))
    field = "requested_model" if holder.endswith("requested") else "model_details"
    if holder.startswith("run"):
        msg = pb.AgentClientMessage(run_request=pb.AgentRunRequest(**{field: model}))
    else:
        msg = pb.AgentClientMessage()
        getattr(msg.prewarm_request, field).CopyFrom(model)
    return "client", msg.SerializeToString()


def _arrivals(direction: str, data: bytes, wrap: bool, how: str) -> tuple[str, list[Frame]]:
    """(transport, frames) as the decoder gives them for this message on the wire."""
    import base64

    dec = default_decoder()
    if direction == "client":
        transport, carried = ("bidi_append", "aiserver.v1.BidiAppendRequest") if wrap else ("run", CLIENT_MSG)
        body = pb.BidiAppendRequest(data=data.hex(), request_id=pb.BidiRequestId(request_id="r"),
                                      append_seqno=0).SerializeToString() if wrap else data
    else:
        transport, carried = ("runpoll", "aiserver.v1.BidiPollResponse") if wrap else ("run", SERVER_MSG)
        body = pb.BidiPollResponse(seqno=0, data=base64.b64encode(data).decode()).SerializeToString() if wrap else data
    if how == "kept-compressed":
        return transport, [Frame("compressed", "kept", gzip.compress(body), flags=1, msg_type=carried)]
    if how == "truncated-gzip":
        return transport, [Frame("malformed", "undecodable", gzip.compress(body)[:-8], flags=1, error="truncated")]
    if transport == "bidi_append":
        return transport, dec.decode_body(body, transport, direction)
    return transport, dec.stream(transport, direction).feed(encode(body, compress=how == "gzip"))


@settings(max_examples=80, deadline=None)
@given(holder=st.sampled_from(["run-requested", "run-details", "prewarm-requested", "prewarm-details", "subagent"]),
       cred=st.sampled_from(["api_key", "azure", "bedrock"]), wrap=st.booleans(),
       how=st.sampled_from(["plain", "gzip", "kept-compressed", "truncated-gzip"]))
def test_a_canary_in_any_credential_field_is_stored_nowhere(holder: str, cred: str, wrap: bool, how: str) -> None:
    direction, data = _message(holder, cred)
    assert CANARY.encode() in data
    transport, frames = _arrivals(direction, data, wrap, how)
    assert frames
    with Store(":memory:") as store:
        rec = Recorder(store)
        for f in frames:
            rec.add("s", 1, direction, transport, None, f)
        rec.flush()
        rows = store.query("SELECT kind, payload, raw FROM frames").to_pylist()
    assert len(rows) == len(frames)  # stored, not dropped
    for r in rows:
        for blob in (r["payload"], r["raw"]):
            if not blob:
                continue
            assert CANARY.encode() not in blob
            if blob[:2] == b"\x1f\x8b":
                assert CANARY.encode() not in zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(blob)


def test_a_parquet_import_passes_the_gate_over_what_it_copied(tmp_path: Path) -> None:
    """An export written by an older workbench (or another engine) may hold a key in clear."""
    from workbench.export.parquet import export_parquet, import_parquet

    old = tmp_path / "old.duckdb"
    with Store(old) as store:
        rec = Recorder(store)
        rec.add("s", 1, "client", "run", None, Frame("empty", "e", b""))
        rec.flush()
        # what the gate never saw: written by SQL, as an older workbench stored it
        store.con.execute("UPDATE frames SET kind = 'run_request', msg_type = ?, payload = ?, meta = ?",
                          [CLIENT_MSG, _run_request(), json.dumps({"request_headers": [["x-api-key", CANARY]]})])
        store.con.execute("UPDATE sessions SET meta = ?", [json.dumps({"trailers": {"authorization": CANARY}})])
    export_parquet(old, tmp_path / "pq")
    new = tmp_path / "new.duckdb"
    with Store(new) as store:
        res = import_parquet(tmp_path / "pq", store)
        assert res.sessions == ["s"]
        [f] = store.query("SELECT payload, meta FROM frames").to_pylist()
        [s] = store.query("SELECT meta FROM sessions").to_pylist()
    assert CANARY.encode() not in f["payload"] and b"[redacted sha256:" in f["payload"]
    assert CANARY not in f["meta"] and CANARY not in s["meta"]


def test_text_holding_a_backslash_x_comes_back_whatever_its_neighbours(tmp_path: Path) -> None:
    r"""A valid string that reads like an escape (``C:\x41``) is stored by the same rule in a
    batch with no wire bytes as in one with them, so ``wire_bytes`` always gives it back."""
    db = tmp_path / "bs.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        rec.add("a", 1, "client", "run", None, Frame("empty", "C:\\x41 and C:\\Users", b"", meta={"p": "C:\\x41"}))
        rec.flush()
        rec.add("b", 1, "client", "run", None, Frame("empty", "C:\\x41 and C:\\Users", b"", meta={"p": "C:\\x41"}))
        rec.add("b", 2, "client", "run", None, Frame("empty", "caf\udce9", b""))
        rec.flush()
        rows = store.query("SELECT session_id, summary, meta FROM frames WHERE seq = 0 ORDER BY 1").to_pylist()
    assert rows[0]["summary"] == rows[1]["summary"] and rows[0]["meta"] == rows[1]["meta"]
    for r in rows:
        assert wire_bytes(r["summary"]) == b"C:\\x41 and C:\\Users"
        assert wire_bytes(json.loads(r["meta"])["p"]) == b"C:\\x41"


# the gate's fast path ---------------------------------------------------------------------------

_FAST_KINDS = ["interaction_update.text_delta", "exec_server_message.shell_args", "run_request", "end_stream",
               "end_stream.error", "compressed", "malformed", "openai.chat_chunk", "unary", "empty"]
_FAST_TYPES = [CLIENT_MSG, SERVER_MSG, None, "aiserver.v1.BidiAppendRequest", "aiserver.v1.BidiPollResponse",
               "agent.v1.ModelDetails"]


@st.composite
def _any_frame(draw: st.DrawFn) -> Frame:
    payload = draw(st.one_of(
        st.binary(max_size=24),
        st.builds(lambda head, rest: head + rest, st.sampled_from([b"\x0a", b"\x42", b"\x12", b"\x1a", b"["]),
                  st.binary(max_size=24)),
        st.builds(lambda rest: b"\x12" + rest + b"\xe2\x01", st.binary(max_size=12)),
        st.sampled_from([_run_request(), _subagent_exec(), gzip.compress(_run_request())])))
    meta = draw(st.one_of(st.none(), st.just({"request_headers": [["authorization", f"Bearer {CANARY}"],
                                                                  ["x-other", "v"]], "http_status": 200})))
    return Frame(draw(st.sampled_from(_FAST_KINDS)), "s", payload, draw(st.sampled_from([0, 1])),
                 draw(st.sampled_from(_FAST_TYPES)), draw(st.sampled_from([None, "e"])),
                 draw(st.one_of(st.none(), st.binary(max_size=8))), meta=meta)


@settings(max_examples=400, deadline=None)
@given(_any_frame(), st.sampled_from([None, CLIENT_MSG, SERVER_MSG]))
def test_the_gate_fast_path_stores_what_the_full_gate_stores(f: Frame, carried: str | None) -> None:
    """``gate_frame`` skips the redaction chain for agent messages whose first bytes rule out a
    credential; whatever the frame, the result is the one of the full chain."""
    import copy
    import dataclasses

    from workbench.store.gate import _gate_frame_fully, gate_frame

    fast = gate_frame(copy.deepcopy(f), carried=carried)
    full = _gate_frame_fully(copy.deepcopy(f), carried, SCRUB_LIMIT)
    assert dataclasses.astuple(fast) == dataclasses.astuple(full)


@pytest.mark.parametrize("flush_first", [False, True], ids=["in-the-batch", "already-flushed"])
def test_a_late_frame_meta_passes_the_gate(tmp_path: Path, flush_first: bool) -> None:
    """``Recorder.patch_meta`` (a BidiAppend's answer, known after its frame was added) writes
    around ``FrameBatch.add``: its credential headers are redacted all the same."""
    db = tmp_path / "p.duckdb"
    with Store(db) as store:
        rec = Recorder(store)
        seq = rec.add("s", 1, "client", "bidi_append", None, Frame("bidi_append", "append", b"\x0a\x00",
                                                                     msg_type=CLIENT_MSG))
        if flush_first:
            rec.flush()
        rec.patch_meta("s", seq, {"response_headers": [["set-cookie", f"session={CANARY}"], ["x-ok", "1"]],
                                  "http_status": 200})
        rec.flush()
        [meta] = store.query("SELECT meta FROM frames").column(0).to_pylist()
    assert CANARY not in meta
    stored = json.loads(meta)
    assert stored["http_status"] == 200 and ["x-ok", "1"] in stored["response_headers"]
    assert CANARY.encode() not in db.read_bytes()


# a column holding one value throughout ----------------------------------------------------------

_TEXTS = st.one_of(st.none(), st.text(max_size=12), st.sampled_from(["caf\udce9", "C:\\x41", "a\\\\b", "\ud800",
                                                                   '{"k": "caf\udce9"}', '{"k": "C:\\\\x41"}']))


@settings(max_examples=300, deadline=None)
@given(_TEXTS, st.integers(2, 5), st.sampled_from(["session_id", "summary", "meta", "decoded", "raw", "flags"]))
def test_a_column_of_one_value_converts_as_value_by_value(value: Any, n: int, name: str) -> None:
    """A batch column whose values are all one (converted once and repeated, for speed) is the
    column the value-by-value conversion gives: same wire-text and JSON rules, same nulls."""
    import pyarrow as pa

    from workbench.store.db import FRAME_COLUMNS, _arrow_column, _arrow_values

    typ = dict(FRAME_COLUMNS)[name]
    if value is not None and typ != pa.string():
        value = value.encode("utf-8", "surrogatepass") if typ == pa.binary() else len(value)
    col = [value] * n
    expected = _arrow_values(list(col), typ, name)
    got = _arrow_column(col, typ, name)
    assert got.type == expected.type and got.to_pylist() == expected.to_pylist()
    # and one value apart from the others is converted with them, by the same rules
    mixed = [*col, "x" if typ == pa.string() else None]
    assert _arrow_column(mixed, typ, name).to_pylist() == _arrow_values(mixed, typ, name).to_pylist()
