"""The real ``workbench`` console script: decode, sessions, frames, sql."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.decode.classify import default_decoder
from workbench.schema import pb
from workbench.store import SessionInfo, Store, now_us
from workbench.store.recorder import Recorder
from workbench.wire.envelope import FLAG_END_STREAM, encode

pytestmark = pytest.mark.slow  # starts subprocesses or servers

EXE = shutil.which("workbench", path=str(Path(sys.executable).parent)) or "workbench"
HEARTBEAT = "00000000040a026a00"
TEXT = encode(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(
    text_delta=pb.TextDelta(text="Hello"))).SerializeToString())
UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


Call = tuple[list[str], "str | bytes | None", "Path | None"]


def wb_many(calls: list[Call]) -> list[subprocess.CompletedProcess[str]]:
    """Run several invocations at once (start-up dominates on a busy machine)."""
    procs = []
    for args, _stdin, cwd in calls:
        procs.append(subprocess.Popen([EXE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, cwd=cwd))
    out = []
    for p, (args, stdin, _cwd) in zip(procs, calls, strict=True):
        data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
        stdout, stderr = p.communicate(data, timeout=180)
        out.append(subprocess.CompletedProcess(args, p.returncode, stdout.decode(), stderr.decode()))
    return out


def wb(*args: str, stdin: str | bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return wb_many([(list(args), stdin, cwd)])[0]


# ---- decode ----------------------------------------------------------------------------------

def test_decode_hex_argument() -> None:
    r, r2 = wb_many([(["decode", "00 00 00 00 04 0a 02 6a 00"], None, None),
                     (["decode", "0x" + (TEXT + encode(b"{}", FLAG_END_STREAM)).hex()], None, None)])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["interaction_update.heartbeat", "heartbeat"]
    lines = r2.stdout.splitlines()
    assert lines[0].split(None, 1) == ["interaction_update.text_delta", 'text "Hello"']
    assert lines[1].split(None, 1) == ["end_stream", "end-stream ok"]


def test_decode_json_file_and_stdin(tmp_path: Path) -> None:
    f = tmp_path / "frame.bin"
    f.write_bytes(TEXT)
    r, r2, r3 = wb_many([(["decode", "--file", str(f), "--json"], None, None),
                         (["decode", "--json"], TEXT.hex() + "\n", None),
                         (["decode", "--file", "-"], TEXT, None)])
    assert r.returncode == 0, r.stderr
    obj = json.loads(r.stdout)
    assert obj["kind"] == "interaction_update.text_delta"
    assert obj["summary"] == 'text "Hello"'
    assert obj["fields"] == {"interaction_update": {"text_delta": {"text": "Hello"}}}
    assert json.loads(r2.stdout)["fields"] == obj["fields"]
    assert r3.stdout.split(None, 1) == ["interaction_update.text_delta", 'text "Hello"\n']


def test_decode_transports_and_directions() -> None:
    inner = bytes.fromhex("3a00")
    body = pb.BidiAppendRequest(data=inner.hex(), request_id=pb.BidiRequestId(request_id=UUID),
                                append_seqno=4).SerializeToString()
    r, r2, r3 = wb_many([
        (["decode", "--transport", "bidi_append", "--direction", "client", "--json", body.hex()], None, None),
        (["decode", "--transport", "runsse", "--direction", "client", "00000000260a24" + UUID.encode().hex()],
         None, None),
        (["decode", "--transport", "unary", "0a03666f6f"], None, None)])
    obj = json.loads(r.stdout)
    assert (obj["kind"], obj["append_seqno"], obj["request_id"]) == ("client_heartbeat", 4, UUID)
    assert r2.stdout.split()[0] == "bidi_request_id"
    assert UUID in r2.stdout
    assert r3.stdout.split()[0] == "unary"


def test_decode_proto_option(tmp_path: Path) -> None:
    proto = tmp_path / "td.proto"
    proto.write_text('syntax = "proto3";\npackage agent.v1;\nmessage TextDelta { string text = 1; string newer = 7; }\n')
    payload = bytes.fromhex("0a0b0a090a0268693a0378797a")  # text "hi", field 7 "xyz"
    r, r2 = wb_many([(["decode", "--json", "--proto", str(proto), encode(payload).hex()], None, None),
                     (["decode", "--proto", str(tmp_path / "missing.proto"), HEARTBEAT], None, None)])
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fields"] == {"interaction_update": {"text_delta": {"text": "hi", "newer": "xyz"}}}
    assert r2.returncode == 2
    assert "missing.proto" in r2.stderr


def test_decode_errors_name_the_input(tmp_path: Path) -> None:
    r1, r2, r3, r4, r5 = wb_many([
        (["decode", "0a0z"], None, None),
        (["decode"], "nothex!", None),
        (["decode", "--file", str(tmp_path / "nope.bin")], None, None),
        (["decode", "--transport", "carrier-pigeon", HEARTBEAT], None, None),
        (["decode", "0000000003ffffff"], None, None)])
    assert r1.returncode == 2
    assert "hex argument" in r1.stderr
    assert "not valid hex" in r1.stderr
    assert r2.returncode == 2
    assert "stdin" in r2.stderr
    assert r3.returncode == 2
    assert "nope.bin" in r3.stderr
    assert r4.returncode == 2
    assert "--transport" in r4.stderr
    # a malformed frame is reported with its error and a non-zero exit
    assert r5.returncode == 1
    assert r5.stdout.startswith("malformed")
    assert "error:" in r5.stdout
    assert not any("Traceback" in r.stderr for r in (r1, r2, r3, r4, r5))


def test_decode_batch_keeps_order_and_reports_bad_lines(tmp_path: Path) -> None:
    append = pb.BidiAppendRequest(data="3a00", request_id=pb.BidiRequestId(request_id=UUID)).SerializeToString()
    lines = [
        {"hex": TEXT.hex(), "direction": "server", "transport": "run"},
        {"hex": "zz", "direction": "server", "transport": "run"},
        {"hex": append.hex(), "direction": "client", "transport": "bidi_append"},
        {"hex": HEARTBEAT, "direction": "sideways"},
        {"hex": "00000000020a05", "direction": "client", "transport": "runsse"},
        {"hex": HEARTBEAT},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\nnot json\n"
    f = tmp_path / "in.ndjson"
    f.write_text(json.dumps({"hex": HEARTBEAT}) + "\n{\n")
    r, rf, rok = wb_many([(["decode", "--batch"], text, None),
                          (["decode", "--batch", "--file", str(f)], None, None),
                          (["decode", "--batch"], json.dumps({"hex": HEARTBEAT}) + "\n", None)])
    assert r.returncode == 1
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(out) == 7
    assert out[0]["kind"] == "interaction_update.text_delta"
    assert out[0]["fields"]
    assert out[1]["kind"] == "error"
    assert "stdin:2" in out[1]["error"]
    assert out[2]["kind"] == "client_heartbeat"
    assert out[2]["request_id"] == UUID
    assert out[3]["kind"] == "error"
    assert "stdin:4" in out[3]["error"]
    assert "sideways" in out[3]["error"]
    assert out[4]["kind"] == "malformed"
    assert "BidiRequestId" in out[4]["summary"]
    assert out[5]["kind"] == "interaction_update.heartbeat"
    assert out[6]["kind"] == "error"
    assert "stdin:7" in out[6]["error"]
    assert all({"kind", "summary", "fields"} <= set(o) for o in out)
    # from a file: errors name the file and line
    out = [json.loads(x) for x in rf.stdout.splitlines()]
    assert out[0]["kind"] == "interaction_update.heartbeat"
    assert f"{f}:2" in out[1]["error"]
    assert rf.returncode == 1
    assert rok.returncode == 0
    assert json.loads(rok.stdout)["kind"] == "interaction_update.heartbeat"


# ---- sessions / frames / sql -----------------------------------------------------------------

@pytest.fixture(scope="module")
def capture_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("cli") / "cap.duckdb"
    dec = default_decoder()
    t0 = now_us()
    with Store(db) as s:
        rec = Recorder(s)
        rec.open_session(SessionInfo("sess-alpha-1", source="capture", transport="run", model="claude-x"))
        rec.open_session(SessionInfo("sess-beta-2", source="sim", transport="runsse"))
        body = TEXT + encode(bytes.fromhex("0a026a00")) + encode(b"{}", FLAG_END_STREAM)
        for i, f in enumerate(dec.decode_body(body, "run", "server")):
            rec.add("sess-alpha-1", t0 + i, "server", "run", "1", f)
        for f in dec.decode_body(encode(bytes.fromhex("3a00")), "run", "client"):
            rec.add("sess-alpha-1", t0 + 10, "client", "run", "1", f)
        for f in dec.decode_body(HEARTBEAT_BYTES, "runsse", "server"):
            rec.add("sess-beta-2", t0 + 20, "server", "runsse", "3", f)
        rec.flush()
    return db


HEARTBEAT_BYTES = bytes.fromhex(HEARTBEAT)


def test_sessions(capture_db: Path) -> None:
    r, rj = wb_many([(["sessions", "--db", str(capture_db)], None, None),
                     (["sessions", "--db", str(capture_db), "--json"], None, None)])
    assert r.returncode == 0, r.stderr
    assert "sess-alpha-1" in r.stdout
    assert "sess-beta-2" in r.stdout
    assert "claude-x" in r.stdout
    assert r.stdout.rstrip().endswith("(2 rows)")
    r = rj
    rows = {x["session_id"]: x for x in map(json.loads, r.stdout.splitlines())}
    assert rows["sess-alpha-1"]["frame_count"] == 4
    assert rows["sess-beta-2"]["source"] == "sim"


def test_frames_table_filters_and_json(capture_db: Path) -> None:
    db = str(capture_db)
    r, rj, rd, rl = wb_many([
        (["frames", "sess-alpha", "--db", db], None, None),  # a unique prefix is enough
        (["frames", "sess-alpha-1", "--db", db, "--kind", "interaction_update", "--json"], None, None),
        (["frames", "sess-alpha-1", "--db", db, "--direction", "client"], None, None),
        (["frames", "sess-alpha-1", "--db", db, "--limit", "2"], None, None)])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 4
    assert "interaction_update.text_delta" in lines[0]
    assert 'text "Hello"' in lines[0]
    assert "←" in lines[0]
    assert "client_heartbeat" in lines[3]
    assert "→" in lines[3]
    objs = [json.loads(x) for x in rj.stdout.splitlines()]
    assert [o["kind"] for o in objs] == ["interaction_update.text_delta", "interaction_update.heartbeat"]
    assert objs[0]["fields"] == {"interaction_update": {"text_delta": {"text": "Hello"}}}
    assert objs[0]["seq"] == 0
    assert "payload" not in objs[0]
    assert len(rd.stdout.splitlines()) == 1
    assert "client_heartbeat" in rd.stdout
    assert len(rl.stdout.splitlines()) == 2


def test_frames_unknown_or_ambiguous_session(capture_db: Path) -> None:
    r, r2 = wb_many([(["frames", "nosuch", "--db", str(capture_db)], None, None),
                     (["frames", "sess-", "--db", str(capture_db)], None, None)])
    assert r.returncode == 2
    assert "nosuch" in r.stderr
    assert r2.returncode == 2
    assert "ambiguous" in r2.stderr


def test_sql(capture_db: Path) -> None:
    db = str(capture_db)
    r, rj, rbad = wb_many([
        (["sql", "SELECT kind, count(*) AS n FROM frames GROUP BY kind ORDER BY kind", "--db", db], None, None),
        (["sql", "SELECT seq, payload FROM frames WHERE session_id = 'sess-beta-2'", "--db", db, "--json"],
         None, None),
        (["sql", "SELEKT 1", "--db", db], None, None)])
    assert r.returncode == 0, r.stderr
    assert "interaction_update.heartbeat   2" in r.stdout
    assert "(4 rows)" in r.stdout
    assert json.loads(rj.stdout) == {"seq": 0, "payload": "0a026a00"}
    assert rbad.returncode == 2
    assert "query failed" in rbad.stderr


def test_sql_prints_what_python_dates_cannot_hold(capture_db: Path) -> None:
    """DuckDB's ±infinity and dates past year 9999, alone or inside a list or struct: printed as
    DuckDB writes them, as a table and as JSON, never a traceback (issue 20, finding 6)."""
    db = str(capture_db)
    query = ("SELECT 'infinity'::timestamp AS t, '-infinity'::date AS d, '10000-01-02'::date AS far, "
             "'-infinity'::timestamptz AS tz, ['infinity'::date] AS l, {'at': 'infinity'::timestamp} AS s, 7 AS n")
    r, rj = wb_many([(["sql", query, "--db", db], None, None), (["sql", query, "--db", db, "--json"], None, None)])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.splitlines()[1].split() == ["infinity", "-infinity", "10000-01-02", "-infinity", "['infinity']",
                                                "{'at':", "'infinity'}", "7"], r.stdout
    assert rj.returncode == 0, rj.stderr
    assert json.loads(rj.stdout) == {"t": "infinity", "d": "-infinity", "far": "10000-01-02", "tz": "-infinity",
                                     "l": ["infinity"], "s": {"at": "infinity"}, "n": 7}


def test_frames_prints_a_time_past_year_9999_as_its_text(capture_db: Path) -> None:
    """A hostile import can stamp a frame past what Python's datetime holds; `workbench frames` prints
    DuckDB's text for it and every other frame as before, never a traceback."""
    with Store(capture_db) as store:
        sid, seq = store.con.execute("SELECT session_id, max(seq) FROM frames GROUP BY session_id LIMIT 1").fetchone()
        store.con.execute("UPDATE frames SET ts = TIMESTAMPTZ '10000-01-01 00:00:00+00' WHERE session_id = ? "
                          "AND seq = ?", [sid, seq])
    r, rj = wb_many([(["frames", sid, "--db", str(capture_db)], None, None),
                     (["frames", sid, "--json", "--db", str(capture_db)], None, None)])
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    last = [ln for ln in r.stdout.splitlines() if ln.split() and ln.split()[0] == str(seq)]
    assert last and "10000-01-01" in last[0], r.stdout
    assert rj.returncode == 0 and json.loads(rj.stdout.splitlines()[-1])["ts"].startswith("10000-01-01"), rj.stdout


def test_missing_db_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "none.duckdb"
    calls: list[Call] = [([*a, "--db", str(missing)], None, None)
                         for a in (["sessions"], ["frames", "x"], ["sql", "SELECT 1"])]
    for r in wb_many(calls):
        assert r.returncode == 2, (r.args, r.stderr)
        assert "none.duckdb" in r.stderr
        assert "no such capture database" in r.stderr
        assert "Traceback" not in r.stderr
    assert not missing.exists()


def test_default_db_path(tmp_path: Path, capture_db: Path) -> None:
    r = wb("sessions", cwd=tmp_path)
    assert r.returncode == 2
    assert "captures/workbench.duckdb" in r.stderr
    (tmp_path / "captures").mkdir()
    shutil.copy(capture_db, tmp_path / "captures" / "workbench.duckdb")
    r = wb("sessions", cwd=tmp_path)
    assert r.returncode == 0
    assert "sess-alpha-1" in r.stdout
