"""stream-json NDJSON import: frames, tool extraction, assistant forms, malformed lines, sessions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.ingest import IngestError, detect_format, import_file
from workbench.ingest.ndjson import parse_line
from workbench.protocol.stream_json import (
    assistant_form,
    naive_assistant_text,
    reconstruct_assistant_text,
    tool_info,
)
from workbench.store import Store, open_reader

SID = "5b0e9d1c-7a42-4f3e-a8c6-2d91e07b4f58"
EXPECTED_TEXT = ("I'll run the failing test first.\n\nThe config sets `currency = \"usd\"` "
                 "but the test expects \"eur\".")


def _frames(db: Path) -> list[dict]:
    r = open_reader(db)
    try:
        return r.query("SELECT * FROM frames ORDER BY session_id, seq").to_pylist()
    finally:
        r.close()


def _sessions(db: Path) -> list[dict]:
    r = open_reader(db)
    try:
        return r.query("SELECT * FROM sessions ORDER BY session_id").to_pylist()
    finally:
        r.close()


def test_sample_import_frames(tmp_path: Path, ingest_sample: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "t.duckdb"
    assert main(["import", str(ingest_sample), "--db", str(db)]) == 0
    out = capsys.readouterr()
    assert out.out.strip() == f"imported {ingest_sample}: 1 session, 20 frames"
    assert "\r" not in out.err  # not a terminal: no progress line

    lines = ingest_sample.read_bytes().splitlines()
    frames = _frames(db)
    assert [f["payload"] for f in frames] == lines  # the raw line bytes exactly
    assert {f["transport"] for f in frames} == {"cli_ndjson"}
    assert {f["direction"] for f in frames} == {"server"}
    assert all(f["msg_type"] is None for f in frames)
    kinds = [f["kind"] for f in frames]
    assert kinds[:5] == ["system.init", "user", "thinking.delta", "thinking.delta", "thinking.completed"]
    assert kinds[-1] == "result.success"
    assert "connection.reconnecting" in kinds

    started = [f for f in frames if f["kind"] == "tool_call.started"]
    assert started[0]["call_id"] == "toolu_vrtx_01Hc4sQ\nfc_0a9d3e"  # newline kept verbatim
    assert started[0]["summary"].startswith("tool_call.started 'toolu_vrtx_01Hc4sQ\\nfc_0a9d3e' shell {\"command\": ")
    shell_done = json.loads([f for f in frames if f["kind"] == "tool_call.completed"][0]["decoded"])
    assert shell_done["$tool"]["name"] == "shell"
    assert shell_done["$tool"]["args"]["command"] == "python -m pytest -q tests/test_cart.py"
    assert shell_done["$tool"]["result"]["exitCode"] == 1
    assert shell_done["$tool"]["error"] is None
    read_done = json.loads([f for f in frames if f["kind"] == "tool_call.completed"][1]["decoded"])
    assert read_done["$tool"]["name"] == "read"
    assert read_done["$tool"]["result"]["readRange"] == {"startLine": 1, "endLine": 3}

    forms = [json.loads(f["decoded"])["$assistant_form"] for f in frames if f["kind"] == "assistant"]
    assert forms == ["delta", "delta", "delta", "snapshot", "delta", "delta", "delta", "snapshot", "full"]
    first_delta = next(f for f in frames if f["kind"] == "assistant")
    assert first_delta["summary"] == '"I\'ll run the" [delta]'

    # Times come from timestamp_ms; untimed leading events take the first timestamp.
    ts = [f["ts"] for f in frames]
    assert ts == sorted(ts)

    (s,) = _sessions(db)
    assert s["session_id"] == SID
    assert (s["source"], s["transport"], s["model"], s["status"]) == (
        "import:ndjson", "cli_ndjson", "Claude 4.5 Sonnet", "complete")
    assert s["request_id"] == "e4d2a8b6-13c5-4f70-9e1a-6b8c0d2f3a95"
    meta = json.loads(s["meta"])
    assert meta["usage"]["outputTokens"] == 187
    assert meta["cwd"] == "/home/dev/shop"
    assert s["frame_count"] == 20


def test_reimport_same_content_is_skipped(tmp_path: Path, ingest_sample: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "t.duckdb"
    assert main(["import", str(ingest_sample), "--db", str(db)]) == 0
    assert main(["import", str(ingest_sample), "--db", str(db)]) == 0
    assert "skipped" in capsys.readouterr().out
    assert len(_frames(db)) == 20


def test_assistant_text_reconstruction(ingest_sample: Path) -> None:
    lines = ingest_sample.read_bytes().splitlines()
    assert reconstruct_assistant_text(lines) == EXPECTED_TEXT
    naive = naive_assistant_text(lines)
    assert naive.count("I'll run the failing test first.") == 3  # delta, snapshot and full
    assert len(naive) > 2 * len(EXPECTED_TEXT)
    # decoded dicts (as stored) work the same
    events = [json.loads(line) for line in lines]
    assert reconstruct_assistant_text(events) == EXPECTED_TEXT


def _a(text: str, ts: int | None = None, mc: str | None = None) -> dict:
    ev: dict = {"type": "assistant", "message": {"role": "assistant", "content": [{"type": "text", "text": text}]}}
    if ts is not None:
        ev["timestamp_ms"] = ts
    if mc is not None:
        ev["model_call_id"] = mc
    return ev


def test_assistant_forms_edge_cases() -> None:
    assert assistant_form(_a("x", 1)) == "delta"
    assert assistant_form(_a("x", 1, "mc")) == "snapshot"
    assert assistant_form(_a("x")) == "full"
    # without partial output every segment is its own full message: they add up
    assert reconstruct_assistant_text([_a("Looking."), _a("Done.")]) == "Looking.Done."
    # a repeated snapshot does not duplicate
    evs = [_a("ab", 1), _a("ab", 2, "m"), _a("ab", 3, "m"), _a("c", 4)]
    assert reconstruct_assistant_text(evs) == "abc"
    assert naive_assistant_text(evs) == "abababc"
    # a cumulative full message replaces everything before it
    assert reconstruct_assistant_text([_a("a", 1), _a("b", 2), _a("ab")]) == "ab"
    # non-assistant and malformed inputs are ignored
    assert reconstruct_assistant_text([b"not json", {"type": "user"}, _a("z", 5)]) == "z"


def test_tool_info_shapes() -> None:
    t = tool_info({"function": {"name": "web_fetch", "arguments": "{\"url\": \"https://x\"}"}})
    assert t == {"name": "web_fetch", "args": {"url": "https://x"}, "result": None, "error": None}
    t = tool_info({"editToolCall": {"args": {"path": "a"}, "result": {"writePermissionDenied": {"path": "a"}}}})
    assert t is not None
    assert t["name"] == "edit"
    assert t["error"] == {"writePermissionDenied": {"path": "a"}}
    t = tool_info({"shellToolCall": {"args": {"command": "x"}, "result": {"rejected": {"reason": "no"}}}})
    assert t is not None
    assert t["result"] is None
    assert t["error"] == {"rejected": {"reason": "no"}}
    assert tool_info({"somethingElse": 1}) is None


def test_malformed_lines_are_frames(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bad.ndjson"
    src.write_bytes(
        b'{"type":"system","subtype":"init","session_id":"s1","model":"auto"}\n'
        b'Error: connect ECONNREFUSED 127.0.0.1:443\n'
        b'\n'
        b'[1, 2]\n'
        b'{"type":"result","subtype":"error","is_error":true,"session_id":"s1",'
        b'"error":{"message":"usage limit reached","code":"resource_exhausted"}}\n'
        b'{"type":"assistant","message":{"content":[{"type":"text","text":"cut')  # truncated last line
    db = tmp_path / "t.duckdb"
    assert main(["import", str(src), "--db", str(db)]) == 0
    cap = capsys.readouterr()
    assert "3 malformed lines" in cap.out
    frames = _frames(db)
    assert [f["kind"] for f in frames] == ["system.init", "malformed", "malformed", "result.error", "malformed"]
    bad = frames[1]
    assert bad["payload"] == b"Error: connect ECONNREFUSED 127.0.0.1:443"
    assert bad["error"].startswith("line 2: not JSON")
    assert frames[2]["error"].startswith("line 4:")
    assert frames[4]["error"].startswith("line 6:")
    (s,) = _sessions(db)
    assert s["status"] == "error"
    assert s["error"] == "usage limit reached"


def test_lines_before_session_id_and_no_result(tmp_path: Path) -> None:
    src = tmp_path / "early.ndjson"
    src.write_text(
        '{"type":"protocol","data":{"version":"1.0"}}\n'
        '{"type":"system","subtype":"init","session_id":"s2","model":"gpt-5"}\n'
        '{"type":"assistant","message":{"content":[{"type":"text","text":"hi"}]},"session_id":"s2","timestamp_ms":1795320000000}\n')
    db = tmp_path / "t.duckdb"
    with Store(db) as store:
        res = import_file(src, store)
    assert res.sessions == 1
    assert res.frames == 3
    frames = _frames(db)
    assert [f["session_id"] for f in frames] == ["s2"] * 3
    assert frames[0]["kind"] == "protocol"
    (s,) = _sessions(db)
    assert s["status"] == "incomplete"
    assert "without a result" in s["error"]


def test_detection_and_errors(tmp_path: Path, ingest_sample: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert detect_format(ingest_sample) == "ndjson"
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    empty = tmp_path / "empty.ndjson"
    empty.write_bytes(b"")
    for p in (junk, empty):
        with pytest.raises(IngestError, match=str(p)):
            detect_format(p)
    db = tmp_path / "t.duckdb"
    assert main(["import", str(junk), "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert str(junk) in err
    assert "not a recognised format" in err
    assert main(["import", str(tmp_path / "missing.ndjson"), "--db", str(db)]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["import", str(ingest_sample), "--format", "nope", "--db", str(db)]) == 2
    assert "unknown format 'nope'" in capsys.readouterr().err


def test_parse_line_summary_and_kind() -> None:
    p = parse_line(b'{"type":"retry","subtype":"starting","attempt":2,"is_resume":true,"session_id":"x"}', 7)
    assert p.frame.kind == "retry.starting"
    assert p.session_id == "x"
    assert json.loads(p.decoded or "{}")["$line"] == 7
    p = parse_line(b'{"type":"interaction_query","session_id":"x"}', 1)
    assert p.frame.kind == "interaction_query"


def test_second_import_into_existing_db(tmp_path: Path, ingest_sample: Path) -> None:
    db = tmp_path / "t.duckdb"
    other = tmp_path / "other.ndjson"
    other.write_text('{"type":"system","subtype":"init","session_id":"s-other","model":"auto"}\n')
    assert main(["import", str(ingest_sample), "--db", str(db)]) == 0
    assert main(["import", str(other), "--db", str(db)]) == 0  # reopens the file and writes again
    assert {s["session_id"] for s in _sessions(db)} == {SID, "s-other"}


def test_resumed_chat_continues_its_session(tmp_path: Path) -> None:
    first = tmp_path / "turn1.ndjson"
    second = tmp_path / "turn2.ndjson"
    first.write_text('{"type":"system","subtype":"init","session_id":"chat-1","model":"auto"}\n'
                     '{"type":"result","subtype":"success","is_error":false,"result":"a","session_id":"chat-1"}\n')
    second.write_text('{"type":"system","subtype":"init","session_id":"chat-1","model":"auto"}\n'
                      '{"type":"user","message":{"content":[{"type":"text","text":"and now?"}]},"session_id":"chat-1"}\n')
    db = tmp_path / "t.duckdb"
    assert main(["import", str(first), "--db", str(db)]) == 0
    assert main(["import", str(second), "--db", str(db)]) == 0
    frames = _frames(db)
    assert [f["seq"] for f in frames] == [0, 1, 2, 3]
    (s,) = _sessions(db)
    assert s["frame_count"] == 4
    assert s["status"] == "incomplete"  # the second turn has no result yet
    meta = json.loads(s["meta"])
    assert meta["file"] == str(first)
    assert meta["also_from"][0]["file"] == str(second)
