"""Flow-file and HAR imports of agent traffic recorded by a real mitmdump."""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path
from types import ModuleType

import pytest
from support import query_rows

from workbench.cli import main
from workbench.ingest import detect_format


def _import(db: Path, *files: Path, extra: tuple[str, ...] = ()) -> int:
    return main(["import", *map(str, files), "--db", str(db), *extra])


@pytest.mark.slow
def test_detects_recorded_formats(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    flows, har = ingest_recorded
    assert detect_format(flows) == "flow"
    assert detect_format(har) == "har"
    zhar = tmp_path / "agent.zhar"  # mitmproxy's compressed HAR
    zhar.write_bytes(zlib.compress(har.read_bytes(), 9))
    assert detect_format(zhar) == "har"
    assert _import(tmp_path / "z.duckdb", zhar) == 0
    assert capsys.readouterr().out.startswith(f"imported {zhar}: 6 sessions, 24 frames")


@pytest.mark.slow
def test_flow_import_sessions(tmp_path: Path, ingest_recorded: tuple[Path, Path], ingest_traffic_mod: ModuleType,
                              capsys: pytest.CaptureFixture[str]) -> None:
    flows, _ = ingest_recorded
    db = tmp_path / "f.duckdb"
    assert _import(db, flows) == 0
    cap = capsys.readouterr()
    assert cap.out.strip() == (f"imported {flows}: 6 sessions, 24 frames "
                               "(1 flow without bodies: streamed; 1 flow not agent traffic, skipped)")
    # the streamed flow is reported on its own line, naming it
    streamed_lines = [line for line in cap.err.splitlines() if "not recorded (streamed)" in line]
    assert len(streamed_lines) == 1
    assert "RunSSE" in streamed_lines[0]
    assert "flow 9" in streamed_lines[0]

    m = ingest_traffic_mod
    rows = {r["request_id"] + ":" + r["transport"]: r for r in query_rows(db, "SELECT * FROM sessions")}
    ok = rows[f"{m.RID_OK}:runsse"]
    assert (ok["source"], ok["status"], ok["model"], ok["conversation_id"]) == (
        "import:flow", "complete", "claude-4.5-sonnet", "conv-7f3e")
    assert ok["client_version"] == m.CLIENT_VERSION
    assert ok["http_status"] == 200
    assert ok["path"] == "/agent.v1.AgentService/RunSSE"
    meta = json.loads(ok["meta"])
    assert meta["timing"] == "per-message"
    assert meta["file"] == str(flows)
    assert meta["flow_id"] == ok["session_id"]
    assert [a["append_seqno"] for a in meta["appends"]] == [0, 1, 2]

    big = rows[f"{m.RID_BIG}:runsse"]
    assert (big["status"], big["error"]) == ("incomplete", "body not recorded (streamed)")
    limit = rows[f"{m.RID_LIMIT}:runsse"]
    assert limit["status"] == "error"
    assert "resource_exhausted" in limit["error"]
    run = rows[f"{m.RID_OK}:run"]
    assert (run["status"], run["http_status"], run["error"]) == ("error", 464, "HTTP 464")
    assert rows[f"{m.RID_OK}:unary"]["path"] == "/agent.v1.AgentService/GetUsableModels"


@pytest.mark.slow
def test_bidi_append_join_and_reorder(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                      ingest_traffic_mod: ModuleType) -> None:
    flows, _ = ingest_recorded
    db = tmp_path / "f.duckdb"
    assert _import(db, flows) == 0
    m = ingest_traffic_mod
    frames = query_rows(db, "SELECT f.* FROM frames f JOIN sessions s USING (session_id) "
                    "WHERE s.request_id = ? AND s.transport = 'runsse' ORDER BY seq", [m.RID_OK])
    got = [(f["direction"], f["transport"], f["kind"], f["append_seqno"]) for f in frames]
    # causal order: each answer right after what it answers, appends by seqno whatever their capture order
    assert got == [
        ("client", "runsse", "bidi_request_id", None),
        ("client", "bidi_append", "run_request", 0),          # captured second, ordered first
        ("server", "runsse", "interaction_update.thinking_delta", None),
        ("server", "runsse", "interaction_update.text_delta", None),
        ("server", "runsse", "interaction_update.tool_call_started", None),
        ("server", "runsse", "exec_server_message.shell_args", None),
        ("client", "bidi_append", "exec_client_message.shell_result", 1),  # answers exec 1
        ("client", "bidi_append", "client_heartbeat", 2),     # captured first
        ("server", "runsse", "interaction_update.text_delta", None),
        ("server", "runsse", "interaction_update.turn_ended", None),
        ("server", "runsse", "end_stream", None),
    ]
    (session,) = query_rows(db, "SELECT meta FROM sessions WHERE request_id = ? AND transport = 'runsse'", [m.RID_OK])
    assert json.loads(session["meta"])["order"] == "causal"
    # body order stays recoverable: the stream's client frames, the appends by seqno, the server frames
    metas = [json.loads(f["meta"]) for f in frames]
    by_body = [f["kind"] for _, f in sorted(zip([x["body_index"] for x in metas], frames, strict=True),
                                             key=lambda p: p[0])]
    assert by_body[:4] == ["bidi_request_id", "run_request", "exec_client_message.shell_result", "client_heartbeat"]
    # each append keeps its HTTP evidence, as live capture writes it
    for f, meta in zip(frames, metas, strict=True):
        if f["transport"] == "bidi_append":
            assert meta["http_status"] == 200 and meta["content_type"] == "application/proto"
            assert meta["request_headers"]["x-request-id"] == m.RID_OK
            assert meta["request_headers"]["authorization"].startswith("Bearer [redacted sha256:")
        else:
            assert set(meta) == {"body_index"}
    assert {f["request_id"] for f in frames if f["transport"] == "bidi_append"} == {m.RID_OK}
    started = next(f for f in frames if f["kind"] == "interaction_update.tool_call_started")
    assert started["call_id"] == m.CALL_ID
    # appends keep their wrapper bytes; each frame's stream names the HTTP exchange it came on
    assert all(f["raw"] for f in frames if f["transport"] == "bidi_append")
    assert len({f["stream"] for f in frames if f["transport"] == "bidi_append"}) == 3

    poll = query_rows(db, "SELECT f.* FROM frames f JOIN sessions s USING (session_id) "
                  "WHERE s.request_id = ? AND s.transport = 'runpoll' ORDER BY seq", [m.RID_POLL])
    # the append was captured after the poll's response; the poll records keep their seqno
    assert [(f["transport"], f["kind"], f["append_seqno"]) for f in poll] == [
        ("runpoll", "bidi_poll_request", None), ("bidi_append", "run_request", 0),
        ("runpoll", "interaction_update.text_delta", 0), ("runpoll", "empty", 1), ("runpoll", "end_stream", None)]


@pytest.mark.slow
def test_secrets_never_stored(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                              ingest_traffic_mod: ModuleType) -> None:
    flows, har = ingest_recorded
    db = tmp_path / "s.duckdb"
    assert _import(db, flows, har) == 0
    blob = db.read_bytes()
    wal = db.with_name(db.name + ".wal")
    if wal.exists():
        blob += wal.read_bytes()
    assert len(blob) > 10_000
    # DuckDB may compress strings on disk, so also look at every stored value.
    values = b""
    for table in ("sessions", "frames"):
        for row in query_rows(db, f"SELECT * FROM {table}"):
            for v in row.values():
                values += v if isinstance(v, bytes) else str(v).encode()
    assert b"[redacted sha256:" in values
    for secret in ingest_traffic_mod.SECRETS:
        for piece in (secret, secret[:24], secret[-24:]):
            for form in (piece.encode(), piece.encode().hex().encode()):  # BidiAppend data is hex
                assert form not in blob, piece
                assert form not in values, piece
    # the model key was in the run requests (Run body and BidiAppend seqno 0): they are kept, redacted
    runs = query_rows(db, "SELECT payload FROM frames WHERE kind = 'run_request'")
    assert len(runs) >= 4
    assert all(b"[redacted sha256:" in r["payload"] for r in runs)
    rows = query_rows(db, "SELECT DISTINCT auth_hash FROM sessions")
    assert len(rows) == 1
    assert len(rows[0]["auth_hash"]) == 12


@pytest.mark.slow
def test_har_matches_flow_import(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                 capsys: pytest.CaptureFixture[str]) -> None:
    flows, har = ingest_recorded
    db = tmp_path / "h.duckdb"
    assert _import(db, flows, har) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1] == (f"imported {har}: 6 sessions, 24 frames "
                      "(1 entry without bodies: streamed; 1 entry not agent traffic, skipped)")
    per_source = {}
    for src in ("import:flow", "import:har"):
        per_source[src] = query_rows(db, "SELECT s.request_id, s.transport, s.status, f.seq, f.kind, f.payload, "
                                 "f.append_seqno FROM frames f JOIN sessions s USING (session_id) "
                                 "WHERE s.source = ? ORDER BY s.request_id, s.transport, f.seq", [src])
    assert per_source["import:flow"] == per_source["import:har"]


def _har_doc(har: Path) -> dict:
    return json.loads(har.read_text())


def _runsse_ok_entry(doc: dict, rid: str) -> dict:
    for e in doc["log"]["entries"]:
        if e["request"]["url"].endswith("/RunSSE") and rid in e["request"]["postData"]["text"]:
            return e
    raise AssertionError("no RunSSE entry")


@pytest.mark.slow
def test_har_base64_bodies(tmp_path: Path, ingest_recorded: tuple[Path, Path], ingest_traffic_mod: ModuleType) -> None:
    _, har = ingest_recorded
    doc = _har_doc(har)
    e = _runsse_ok_entry(doc, ingest_traffic_mod.RID_OK)
    body = e["response"]["content"]["text"].encode("latin-1")
    e["response"]["content"].update(text=base64.b64encode(body).decode(), encoding="base64")
    e["response"]["content"]["size"] = 0  # sizes are optional; the framing decides
    edited = tmp_path / "b64.har"
    edited.write_text(json.dumps(doc))
    db = tmp_path / "b.duckdb"
    assert _import(db, edited) == 0
    kinds = [r["kind"] for r in query_rows(db, "SELECT f.kind FROM frames f JOIN sessions s USING (session_id) "
                                       "WHERE s.request_id = ? AND s.transport = 'runsse' ORDER BY seq",
                                   [ingest_traffic_mod.RID_OK])]
    assert kinds[-1] == "end_stream"
    assert "exec_server_message.shell_args" in kinds


@pytest.mark.slow
def test_har_mangled_binary_body_is_reported(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                            ingest_traffic_mod: ModuleType,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    _, har = ingest_recorded
    doc = _har_doc(har)
    e = _runsse_ok_entry(doc, ingest_traffic_mod.RID_OK)
    body = e["response"]["content"]["text"].encode("latin-1") + b"\xff\xfe"  # as a browser would save it:
    e["response"]["content"]["text"] = body.decode("utf-8", "replace")     # lossy UTF-8 text
    edited = tmp_path / "mangled.har"
    edited.write_text(json.dumps(doc))
    db = tmp_path / "m.duckdb"
    assert _import(db, edited) == 0
    cap = capsys.readouterr()
    assert "mangled in HAR text form" in cap.err
    assert "entry 7" in cap.err
    assert "1 body unusable" in cap.out
    (s,) = query_rows(db, "SELECT * FROM sessions WHERE request_id = ? AND transport = 'runsse'",
              [ingest_traffic_mod.RID_OK])
    assert s["status"] == "error"
    assert "mangled" in s["error"]
    server = query_rows(db, "SELECT kind, payload, error FROM frames WHERE session_id = ? AND direction = 'server'",
                [s["session_id"]])
    assert len(server) == 1
    assert server[0]["kind"] == "malformed"
    assert "U+FFFD" in server[0]["error"]
    assert server[0]["payload"]  # the text we got is kept


@pytest.mark.slow
def test_truncated_flow_file_imports_nothing(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    flows, _ = ingest_recorded
    data = flows.read_bytes()
    cut = tmp_path / "cut.flows"
    cut.write_bytes(data[: len(data) * 2 // 3])
    db = tmp_path / "c.duckdb"
    assert _import(db, cut) == 2
    err = capsys.readouterr().err
    assert str(cut) in err
    assert "cannot be read" in err
    assert "nothing imported" in err
    assert query_rows(db, "SELECT count(*) AS n FROM sessions")[0]["n"] == 0
    assert query_rows(db, "SELECT count(*) AS n FROM frames")[0]["n"] == 0


@pytest.mark.slow
def test_bad_har_entry_names_it(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                capsys: pytest.CaptureFixture[str]) -> None:
    _, har = ingest_recorded
    doc = _har_doc(har)
    del doc["log"]["entries"][3]["request"]["url"]
    bad = tmp_path / "bad.har"
    bad.write_text(json.dumps(doc))
    not_har = tmp_path / "other.json"
    not_har.write_text('{"log": {"pages": []}, "entries": 3}')
    db = tmp_path / "e.duckdb"
    assert _import(db, bad, not_har) == 2
    err = capsys.readouterr().err
    assert f"{bad}: entry 4: request has no url" in err
    assert f"{not_har}: JSON without log.entries" in err
    assert query_rows(db, "SELECT count(*) AS n FROM frames")[0]["n"] == 0


def test_format_override_on_wrong_file(tmp_path: Path, ingest_sample: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "w.duckdb"
    assert _import(db, ingest_sample, extra=("--format", "flow")) == 2
    err = capsys.readouterr().err
    assert str(ingest_sample) in err
    assert "flow 1" in err


@pytest.mark.slow
def test_appends_without_their_stream(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                      ingest_traffic_mod: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    _, har = ingest_recorded
    doc = _har_doc(har)
    rid = ingest_traffic_mod.RID_LIMIT
    doc["log"]["entries"] = [e for e in doc["log"]["entries"] if not (
        e["request"]["url"].endswith("/RunSSE") and rid in e["request"]["postData"]["text"])]
    edited = tmp_path / "orphan.har"
    edited.write_text(json.dumps(doc))
    db = tmp_path / "o.duckdb"
    assert _import(db, edited) == 0
    assert "1 BidiAppend group without a stream" in capsys.readouterr().out
    (s,) = query_rows(db, "SELECT * FROM sessions WHERE request_id = ?", [rid])
    assert (s["transport"], s["status"]) == ("bidi_append", "incomplete")
    assert "no RunSSE/RunPoll stream" in s["error"]
    frames = query_rows(db, "SELECT kind, append_seqno FROM frames WHERE session_id = ?", [s["session_id"]])
    assert frames == [{"kind": "run_request", "append_seqno": 0}]


@pytest.mark.slow
def test_har_request_body_left_out(tmp_path: Path, ingest_recorded: tuple[Path, Path],
                                   ingest_traffic_mod: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    _, har = ingest_recorded
    doc = _har_doc(har)
    e = _runsse_ok_entry(doc, ingest_traffic_mod.RID_OK)
    del e["request"]["postData"]  # some exporters drop binary request bodies
    edited = tmp_path / "nopost.har"
    edited.write_text(json.dumps(doc))
    db = tmp_path / "n.duckdb"
    assert _import(db, edited) == 0
    assert "entry 7 (POST /agent.v1.AgentService/RunSSE): request body not recorded in the HAR" in \
        capsys.readouterr().err
    (s,) = query_rows(db, "SELECT status, error FROM sessions WHERE meta->>'exchange' = 'entry 7'")
    assert s["status"] == "incomplete"
    assert "request body not recorded" in s["error"]


def test_har_stream_that_never_finished_has_no_response_end() -> None:
    """mitmproxy's HAR exporter writes ``receive: 0`` for a response that never finished (the client
    left a stalled stream): its end is unknown, so answers appended meanwhile keep their causal place
    instead of being put after "the end" (found by the healthy matrix, strict sim × RunSSE × HAR)."""
    from workbench.decode.classify import default_decoder
    from workbench.ingest.har import to_exchange
    from workbench.schema import pb
    from workbench.wire.envelope import encode

    beat = pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(heartbeat=pb.Heartbeat()))
    body = encode(beat.SerializeToString()) * 20
    rid = encode(pb.BidiRequestId(request_id="r-1").SerializeToString())

    def entry(receive: float) -> dict[str, object]:
        return {"startedDateTime": "2026-01-01T00:00:00+00:00", "time": 100.0,
                "timings": {"connect": 1.0, "ssl": 1.0, "send": 1.0, "wait": 50.0, "receive": receive},
                "request": {"method": "POST", "url": "https://h/agent.v1.AgentService/RunSSE", "httpVersion": "HTTP/1.1",
                            "headers": [{"name": "content-type", "value": "application/connect+proto"}],
                            "postData": {"mimeType": "application/connect+proto", "encoding": "base64",
                                         "text": base64.b64encode(rid).decode()}, "bodySize": len(rid)},
                "response": {"status": 200, "httpVersion": "HTTP/1.1",
                             "headers": [{"name": "content-type", "value": "application/connect+proto"}],
                             "content": {"size": len(body), "encoding": "base64",
                                         "text": base64.b64encode(body).decode()}, "bodySize": len(body)}}

    dec = default_decoder()
    unfinished = to_exchange(dec, entry(0), 1)
    assert unfinished.t_resp_start is not None
    assert unfinished.t_resp_end is None
    finished = to_exchange(dec, entry(900.0), 2)
    assert finished.t_resp_end is not None
    assert finished.t_resp_start is not None
    assert round(finished.t_resp_end - finished.t_resp_start, 3) == 0.9
