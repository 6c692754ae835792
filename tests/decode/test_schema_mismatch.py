"""Decoding as far as the bytes go (issue 21 item 4): a frame from an older or a newer build than the
schema keeps the kind of the path that parsed, the field that does not fit is shown schemaless and
flagged (``schema_mismatch``); ``malformed`` stays for frames broken at the envelope or wire level.

The disagreeing frames are built two ways: by hand with the wire layer (varint + length-delimited),
as another build would send them, decoded with the overlay; and with the overlay's own classes,
decoded with a user ``.proto`` (``--proto``) that gives ExecServerMessage/ExecClientMessage 44 and
InteractionUpdate 18 other types, older and newer.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from decode_pbbytes import ld, tag, vi
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import run_workbench

from workbench.decode import fields_of, frame_to_json
from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, Decoder, Frame, default_decoder
from workbench.decode.lenient import MAX_FOUND
from workbench.schema import load_schema, pb
from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT
from workbench.wire.envelope import FLAG_END_STREAM, encode
from workbench.wire.varint import encode_varint

DEC = default_decoder()
SLOW = Decoder(fast=False)
ESM, ECM, IU = 2, 2, 1  # AgentServerMessage.exec_server_message, AgentClientMessage.exec_client_message, …interaction_update
GIT_DIFF_ARGS = "exec_server_message.git_diff_request_args"
GIT_DIFF_RESULT = "exec_client_message.git_diff_request_result"
SUGGESTION = "interaction_update.prompt_suggestion"


def one(payload: bytes, direction: str = "server", dec: Decoder = DEC) -> Frame:
    [f] = dec.decode_body(encode(payload), "run", direction)
    return f


def paths(f: Frame) -> list[str]:
    return [m["path"] for m in (f.meta or {}).get("schema_mismatch", [])]


def at(tree: Any, path: str) -> Any:
    for name in path.split("."):
        tree = tree[name]
    return tree


# ---- hand-built frames of other builds, decoded with the overlay ------------------------------

# (name, payload, direction, kind, flagged path, schemaless value shown at that path)
OTHER_SHAPES = [
    ("esm44 varint", ld(ESM, vi(1, 3) + vi(44, 7)), "server", GIT_DIFF_ARGS, GIT_DIFF_ARGS, 7),
    ("esm44 string", ld(ESM, vi(1, 3) + ld(44, "origin/main")), "server", GIT_DIFF_ARGS, GIT_DIFF_ARGS,
     "origin/main"),
    ("esm44 fixed32", ld(ESM, vi(1, 3) + tag(44, 5) + (9).to_bytes(4, "little")), "server", GIT_DIFF_ARGS,
     GIT_DIFF_ARGS, 9),
    ("esm44 cwd not utf-8", ld(ESM, vi(1, 3) + ld(44, ld(1, b"\xff\xfe") + ld(2, "main"))), "server",
     GIT_DIFF_ARGS, GIT_DIFF_ARGS + ".cwd", {"$hex": "fffe"}),
    ("esm44 cwd a message", ld(ESM, vi(1, 3) + ld(44, ld(1, ld(1, b"\x80\x81")))), "server", GIT_DIFF_ARGS,
     GIT_DIFF_ARGS + ".cwd", {"1": {"$hex": "8081"}}),
    ("ecm44 varint", ld(ECM, vi(1, 4) + vi(44, 1)), "client", GIT_DIFF_RESULT, GIT_DIFF_RESULT, 1),
    ("ecm44 string", ld(ECM, vi(1, 4) + ld(44, "3 files changed")), "client", GIT_DIFF_RESULT, GIT_DIFF_RESULT,
     "3 files changed"),
    ("iu18 varint", ld(IU, vi(18, 2)), "server", SUGGESTION, SUGGESTION, 2),
    ("iu18 string", ld(IU, ld(18, "run the tests")), "server", SUGGESTION, SUGGESTION, "run the tests"),
    ("iu18 suggestion not utf-8", ld(IU, ld(18, ld(1, b"\xc0"))), "server", SUGGESTION, SUGGESTION + ".suggestion",
     {"$hex": "c0"}),
]


@pytest.mark.parametrize(("payload", "direction", "kind", "path", "value"),
                         [c[1:] for c in OTHER_SHAPES], ids=[c[0] for c in OTHER_SHAPES])
def test_other_build_keeps_its_kind_and_flags_the_field(payload: bytes, direction: str, kind: str, path: str,
                                                        value: Any) -> None:
    f = one(payload, direction)
    assert (f.kind, f.error, f.payload) == (kind, None, payload)
    assert path in f.summary and "schema mismatch" in f.summary
    out = frame_to_json(DEC, f)
    assert [m["path"] for m in out["schema_mismatch"]] == [path]
    node = at(out["fields"], path)
    assert node["$schemaless"] == value
    assert node["$schema_mismatch"].startswith("schema has ")
    # the exec id parsed: the exec still pairs with its result
    if kind.startswith("exec_"):
        assert f.ref_id == payload[3]
    # the capture's incremental decoder and the protobuf-only decoder say the same
    assert f == one(payload, direction, SLOW)
    sd = DEC.stream("run", direction)
    body = encode(payload)
    assert [*sd.feed(body[:3]), *sd.feed(body[3:]), *sd.close()] == [f]


def test_flag_is_stored_with_the_frame_and_not_cached_away() -> None:
    payload = ld(IU, vi(18, 2))  # small enough for the small-frame cache
    first, again = one(payload), one(payload)
    assert paths(first) == paths(again) == [SUGGESTION]
    assert first.meta == {"schema_mismatch": [{"path": SUGGESTION, "field": 18, "found": "varint",
                                               "expected": "message agent.v1.PromptSuggestionUpdate"}]}


def test_wire_level_breakage_stays_malformed() -> None:
    for broken in (ld(ESM, vi(1, 3))[:-1],           # length runs past the end
                   b"\x12\x02\x08",                    # same, inside
                   b"\x0f\x00",                        # reserved wire type 7
                   b"\x00\x01",                        # field number 0
                   b"\x0c",                            # end-group without its start
                   ld(ESM, b"\xff\xff"),               # the top-level member is no message at all
                   ld(IU, ld(18, vi(1, 5)))[:-2]):     # truncated
        f = one(broken)
        assert (f.kind, f.payload) == ("malformed", broken), broken.hex()
        assert f.error and f.error.startswith("protobuf:")
        assert not paths(f)


def test_deep_field_the_runtime_tolerates_is_flagged_in_the_tree() -> None:
    # ShellArgs.command (a string) sent as a varint: the runtime files it as unknown and the frame
    # classifies as usual; the tree (decode --json, frames --json, the TUI) shows and flags it.
    payload = ld(ESM, vi(1, 5) + ld(2, vi(1, 42) + ld(2, "/work")))
    f = one(payload)
    assert (f.kind, f.ref_id, f.meta) == ("exec_server_message.shell_args", 5, None)
    found: list[dict[str, Any]] = []
    tree = fields_of(DEC, f.kind, f.payload, f.msg_type, f.flags, found)
    assert found == [{"path": "exec_server_message.shell_args.command", "field": 1, "expected": "string",
                      "found": "varint"}]
    assert tree["exec_server_message"]["shell_args"]["command"]["$schemaless"] == 42
    assert tree["exec_server_message"]["shell_args"]["working_directory"] == "/work"
    assert frame_to_json(DEC, f)["schema_mismatch"] == found


def test_thousands_of_disagreeing_fields_are_counted_not_each_described() -> None:
    # a hostile 60 KB frame: 30,000 target_paths sent as varints, and a cwd that is no UTF-8
    payload = ld(ESM, vi(1, 3) + ld(44, vi(5, 1) * 30000 + ld(1, b"\xff")))
    f = one(payload)
    assert (f.kind, f.error) == (GIT_DIFF_ARGS, None)
    assert len(f.meta["schema_mismatch"]) == MAX_FOUND
    assert f.meta["schema_mismatch_omitted"] == 30001 - MAX_FOUND
    assert f.summary.endswith(f"[schema mismatch: {GIT_DIFF_ARGS}.target_paths (+{30001 - MAX_FOUND} more)]")
    out = frame_to_json(DEC, f)
    assert out["schema_mismatch_omitted"] == 30001 - MAX_FOUND
    assert len(out["fields"]["exec_server_message"]["git_diff_request_args"]["target_paths"]) == MAX_FOUND


def test_bidi_append_carrying_another_build() -> None:
    inner = ld(ECM, vi(1, 4) + vi(44, 1))
    body = ld(4, inner) + ld(2, ld(1, "0f8fad5b-d9cb-469f-a165-70867728950e")) + vi(3, 7)
    [f] = DEC.decode_body(body, "bidi_append", "client")
    assert (f.kind, f.append_seqno, f.ref_id, f.raw) == (GIT_DIFF_RESULT, 7, 4, body)
    assert paths(f) == [GIT_DIFF_RESULT]


def test_unary_message_of_another_build() -> None:
    # a unary message's own fields may disagree too (its type comes from the RPC path): classifying
    # a unary body does not parse it, its tree shows and flags the field. ErrorDetails.details is a
    # message; here a number, then text.
    for body, found in ((vi(1, 13) + vi(2, 1), "varint"), (vi(1, 13) + ld(2, "quota"), "5 bytes that are not")):
        [f] = DEC.decode_body(body, "unary", "server", msg_type="aiserver.v1.ErrorDetails")
        assert (f.kind, f.error) == ("unary", None)
        out = frame_to_json(DEC, f)
        assert [m["path"] for m in out["schema_mismatch"]] == ["details"]
        assert out["schema_mismatch"][0]["found"].startswith(found)
        assert out["fields"]["error"] == "ERROR_OPENAI"
    [f] = DEC.decode_body(vi(9, 1), "unary", "server", msg_type="aiserver.v1.ErrorDetails")
    assert "schema_mismatch" not in frame_to_json(DEC, f)  # a field the schema does not know is no mismatch
    # a wrapper's (BidiRequestId) fields that do not fit make it malformed, as before
    [f] = DEC.decode_body(encode(ld(1, b"\xff")), "runsse", "client")
    assert f.kind == "malformed"


# ---- the property: arbitrary bytes at a known field ----------------------------------------

def _members() -> list[tuple[str, int, str, int, str]]:
    """(direction, container number, container name, member number, member name) of every oneof
    member of every container message of AgentServerMessage / AgentClientMessage."""
    out = []
    for direction, top in (("server", pb.AgentServerMessage), ("client", pb.AgentClientMessage)):
        for cfd in top.DESCRIPTOR.oneofs[0].fields:
            sub = cfd.message_type
            oneofs = [o for o in sub.oneofs if not (len(o.fields) == 1 and o.name == "_" + o.fields[0].name)]
            if oneofs:
                out += [(direction, cfd.number, cfd.name, m.number, m.name) for m in oneofs[0].fields]
    return out


MEMBERS = _members()
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), database=None)
_ANY_FIELD = st.one_of(
    st.binary(max_size=200).map(lambda b: (2, encode_varint(len(b)) + b)),
    st.integers(0, 2**64 - 1).map(lambda v: (0, encode_varint(v))),
    st.binary(min_size=4, max_size=4).map(lambda b: (5, b)),
    st.binary(min_size=8, max_size=8).map(lambda b: (1, b)),
)


def test_members_cover_the_fields_of_the_issue() -> None:
    names = {(c, m) for _, _, c, _, m in MEMBERS}
    assert {("exec_server_message", "git_diff_request_args"), ("exec_client_message", "git_diff_request_result"),
            ("interaction_update", "prompt_suggestion")} <= names


@settings(max_examples=600, **FUZZ)  # type: ignore[arg-type]
@given(member=st.sampled_from(MEMBERS), field=_ANY_FIELD, exec_id=st.integers(1, 2**32 - 1))
def test_arbitrary_bytes_at_a_known_field_keep_the_known_kind(
        member: tuple[str, int, str, int, str], field: tuple[int, bytes], exec_id: int) -> None:
    direction, cnum, cname, mnum, mname = member
    wire_type, value = field
    ids = vi(1, exec_id) if cname.startswith(("exec_", "kv_")) else b""
    payload = ld(cnum, ids + tag(mnum, wire_type) + value)
    msg_type = SERVER_MSG if direction == "server" else CLIENT_MSG
    f = DEC.classify_agent(payload, msg_type)
    assert f.kind == f"{cname}.{mname}", (payload.hex(), f)
    assert f.error is None
    assert f == SLOW.classify_agent(payload, msg_type)
    assert f == DEC.classify_agent(payload, msg_type)  # twice: the small-frame cache
    json.dumps(frame_to_json(DEC, f))  # the tree of whatever came is JSON, never an exception


# ---- a user .proto that disagrees (older and newer builds), via --proto ----------------------

def _schema_copy(root: Path, *edits: tuple[str, str]) -> Path:
    for name in BUILTIN_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((PROTO_ROOT / name).read_text())
    path = root / "agent/v1/agent.proto"
    text = path.read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path.write_text(text)
    return root


def older_schema(root: Path) -> Path:
    """Before these fields were messages: 44 a number / a string, 18 a plain string."""
    return _schema_copy(root, ("GetDiffRequest git_diff_request_args = 44;", "uint64 git_diff_request_args = 44;"),
                        ("GetDiffResponse git_diff_request_result = 44;", "string git_diff_request_result = 44;"),
                        ("PromptSuggestionUpdate prompt_suggestion = 18;", "string prompt_suggestion = 18;"))


def newer_schema(root: Path) -> Path:
    """Same messages, other shapes inside: GetDiffRequest.cwd a message, ref a number; a suggestion
    a list of ranked messages."""
    return _schema_copy(root, ("message GetDiffRequest {  // aiserver.v1 in Cursor's bundle\n  string cwd = 1;\n"
                               "  string ref = 2;",
                               "message DiffRoot {\n  string path = 1;\n}\n\n"
                               "message GetDiffRequest {\n  DiffRoot cwd = 1;\n  uint64 ref = 2;"),
                        ("message PromptSuggestionUpdate {\n  string suggestion = 1;\n}",
                         "message PromptSuggestionUpdate {\n  repeated RankedSuggestion suggestion = 1;\n}\n\n"
                         "message RankedSuggestion {\n  uint32 rank = 1;\n}"))


def overlay_frames() -> dict[str, tuple[str, bytes]]:
    """Frames of the overlay's build, made with its generated classes."""
    esm = pb.AgentServerMessage()
    esm.exec_server_message.id = 3
    esm.exec_server_message.git_diff_request_args.cwd = "/work"
    esm.exec_server_message.git_diff_request_args.ref = "main"
    ecm = pb.AgentClientMessage()
    ecm.exec_client_message.id = 3
    chunk = ecm.exec_client_message.git_diff_request_result.diff.diffs.add().chunks.add()
    chunk.content = "+" + "x" * 200  # its length varint (0xc9 0x01) is no UTF-8
    iu = pb.AgentServerMessage()
    iu.interaction_update.prompt_suggestion.suggestion = "try make test"
    return {GIT_DIFF_ARGS: ("server", esm.SerializeToString()), GIT_DIFF_RESULT: ("client", ecm.SerializeToString()),
            SUGGESTION: ("server", iu.SerializeToString())}


@pytest.mark.slow
@pytest.mark.parametrize(("build", "expected"), [
    ("older", {GIT_DIFF_ARGS: [GIT_DIFF_ARGS], GIT_DIFF_RESULT: [GIT_DIFF_RESULT], SUGGESTION: []}),
    ("newer", {GIT_DIFF_ARGS: [GIT_DIFF_ARGS + ".cwd", GIT_DIFF_ARGS + ".ref"], GIT_DIFF_RESULT: [],
               SUGGESTION: [SUGGESTION + ".suggestion"]}),
])
def test_overlay_frames_against_a_disagreeing_schema(tmp_path: Path, build: str,
                                                     expected: dict[str, list[str]]) -> None:
    root = (older_schema if build == "older" else newer_schema)(tmp_path / build)
    dec = Decoder(load_schema([root]))
    for kind, (direction, payload) in overlay_frames().items():
        f = one(payload, direction, dec)
        assert (f.kind, f.error, f.payload) == (kind, None, payload), f
        assert paths(f) == expected[kind], (kind, f)
        out = frame_to_json(dec, f)
        if build == "older" and kind == SUGGESTION:
            # the message bytes are valid UTF-8, so the older schema reads them as its string: they fit
            assert out["fields"]["interaction_update"]["prompt_suggestion"] == "\n\rtry make test"
        for path in expected[kind]:
            node = at(out["fields"], path)
            assert "$schemaless" in (node[0] if isinstance(node, list) else node)  # a repeated field's element
    out = frame_to_json(dec, one(overlay_frames()[GIT_DIFF_ARGS][1], "server", dec))
    if build == "newer":
        args = out["fields"]["exec_server_message"]["git_diff_request_args"]
        assert (args["cwd"]["$schemaless"], args["ref"]["$schemaless"]) == ("/work", "main")
    else:
        assert out["fields"]["exec_server_message"]["git_diff_request_args"]["$schemaless"] == {
            "1": "/work", "2": "main"}


@pytest.mark.slow
def test_decode_cli_json_shows_the_flag(tmp_path: Path) -> None:
    root = newer_schema(tmp_path / "newer")
    direction, payload = overlay_frames()[GIT_DIFF_ARGS]
    proc = run_workbench("decode", "--json", "--direction", direction, "--proto", str(root), encode(payload).hex())
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = json.loads(proc.stdout)
    assert out["kind"] == GIT_DIFF_ARGS
    assert out["schema_mismatch"][0] == {"path": GIT_DIFF_ARGS + ".cwd", "field": 1,
                                         "expected": "message agent.v1.DiffRoot",
                                         "found": "5 bytes that are not a message (reserved wire type 7 (field 5))"}
    assert out["fields"]["exec_server_message"]["id"] == 3
    # the overlay reads the same bytes cleanly: no flag
    proc = run_workbench("decode", "--json", "--direction", direction, encode(payload).hex())
    assert proc.returncode == 0, proc.stderr
    assert "schema_mismatch" not in json.loads(proc.stdout)
    # text output names the path; a hand-built frame of another build, with the overlay
    proc = run_workbench("decode", encode(ld(IU, vi(18, 2))).hex())
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == SUGGESTION
    assert f"[schema mismatch: {SUGGESTION}]" in proc.stdout


@pytest.mark.slow
def test_imported_frames_keep_the_flag_in_the_database(tmp_path: Path) -> None:
    """A Run exchange of another build, imported from a HAR into a real DuckDB file: the frames keep
    their kinds, ``frames.meta`` lists the mismatches and ``frames`` names them."""
    run = pb.AgentClientMessage()
    run.run_request.conversation_id = "c-1"
    req = encode(run.SerializeToString())
    body = (encode(ld(ESM, vi(1, 3) + vi(44, 7))) + encode(ld(IU, ld(18, "run the tests")))
            + encode(b"{}", FLAG_END_STREAM))

    def content(data: bytes) -> dict[str, Any]:
        return {"mimeType": "application/connect+proto", "encoding": "base64",
                "text": base64.b64encode(data).decode()}

    headers = [{"name": "content-type", "value": "application/connect+proto"}]
    entry = {"startedDateTime": "2026-01-01T00:00:00+00:00", "time": 100.0,
             "timings": {"connect": 1.0, "ssl": 1.0, "send": 1.0, "wait": 50.0, "receive": 40.0},
             "request": {"method": "POST", "url": "https://api2.cursor.sh/agent.v1.AgentService/Run",
                         "httpVersion": "HTTP/2.0", "headers": headers, "postData": content(req),
                         "bodySize": len(req)},
             "response": {"status": 200, "httpVersion": "HTTP/2.0", "headers": headers,
                          "content": {"size": len(body), **content(body)}, "bodySize": len(body)}}
    har, db = tmp_path / "other-build.har", tmp_path / "capture.duckdb"
    har.write_text(json.dumps({"log": {"version": "1.2", "creator": {"name": "test", "version": "1"},
                                       "entries": [entry]}}))
    proc = run_workbench("import", str(har), "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    proc = run_workbench("sql", "SELECT seq, kind, error, meta FROM frames ORDER BY seq", "--db", str(db), "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["kind"], r["error"]) for r in rows] == [
        ("run_request", None), (GIT_DIFF_ARGS, None), (SUGGESTION, None), ("end_stream", None)]
    assert [m["path"] for m in json.loads(rows[1]["meta"])["schema_mismatch"]] == [GIT_DIFF_ARGS]
    assert [m["path"] for m in json.loads(rows[2]["meta"])["schema_mismatch"]] == [SUGGESTION]
    sid = json.loads(run_workbench("sessions", "--db", str(db), "--json").stdout.splitlines()[0])["session_id"]
    proc = run_workbench("frames", sid, "--db", str(db))
    assert proc.returncode == 0, proc.stderr
    assert f"[schema mismatch: {SUGGESTION}]" in proc.stdout
