"""``--proto`` with a complete schema folder, several paths, descriptor sets: it takes effect or says why not.

The folder is built like a public extraction of Cursor's schema (``agent/v1/agent.proto`` +
``aiserver/v1/aiserver.proto`` importing it) from our overlay plus what extractions add: a message
where we have bytes (``DiagnosticsArgs``), ``McpArgs.args`` as ``map<string, google.protobuf.Value>``,
``McpToolDefinition.input_schema`` as ``google.protobuf.Value``, and a ``BidiAppendRequest`` without
our field 4.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import json_format, struct_pb2

from workbench.decode import fields_of
from workbench.decode.classify import Decoder
from workbench.schema import SchemaError, load_schema
from workbench.schema.loader import BUILTIN_FILES, PROTO_ROOT
from workbench.wire.envelope import encode

DIAGNOSTICS = "0000000013121108074a0d0a05612e747874120474633031"  # exec#7 diagnostics_args {a.txt, tc01}


def _edit(path: Path, *pairs: tuple[str, str]) -> None:
    text = path.read_text()
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)


def _public_like(root: Path, mcp_args: str = "map<string, google.protobuf.Value> args = 2;",
                 input_schema: str = "google.protobuf.Value input_schema = 3;") -> Path:
    for name in BUILTIN_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text((PROTO_ROOT / name).read_text())
    _edit(root / "agent/v1/agent.proto",
          ("message DiagnosticsArgs {\n  string path = 1;", "message DiagnosticsArgs {\n  string file_path = 1;"),
          ("  map<string, bytes> args = 2;", "  " + mcp_args),
          ("  bytes input_schema = 3;", "  " + input_schema))
    _edit(root / "aiserver/v1/aiserver.proto",
          ('package aiserver.v1;\n', 'package aiserver.v1;\n\nimport "agent/v1/agent.proto";\n'),
          ("  bytes data_bytes = 4;", ""),
          ("message BidiAppendResponse {}", "message BidiAppendResponse {}\n\n"
                                            "message RunEnvelope {\n  agent.v1.AgentClientMessage message = 1;\n}"))
    return root


def _decode(hex_: str, *proto: str, transport: str = "run", direction: str = "server") -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-m", "workbench.cli", "decode", "--json", "--transport", transport,
            "--direction", direction, hex_]
    for p in proto:
        args += ["--proto", p]
    return subprocess.run(args, capture_output=True, text=True)


@pytest.mark.slow
def test_complete_folder_takes_effect(tmp_path: Path) -> None:
    root = _public_like(tmp_path / "schema")
    builtin = _decode(DIAGNOSTICS)
    assert json.loads(builtin.stdout)["fields"]["exec_server_message"]["diagnostics_args"] == {
        "path": "a.txt", "tool_call_id": "tc01"}
    proc = _decode(DIAGNOSTICS, str(root))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "", proc.stderr
    assert json.loads(proc.stdout)["fields"]["exec_server_message"]["diagnostics_args"] == {
        "file_path": "a.txt", "tool_call_id": "tc01"}
    schema = load_schema([root])
    ident = schema.identity
    assert ident.user_messages > 250
    assert ident.replaced > 250
    assert len(ident.hash) == 16
    assert str(root) in ident.source
    assert schema.has("aiserver.v1.RunEnvelope")
    # the same two files named one by one: imports resolve from the package layout
    proc = _decode(DIAGNOSTICS, str(root / "agent/v1/agent.proto"), str(root / "aiserver/v1/aiserver.proto"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fields"]["exec_server_message"]["diagnostics_args"]["file_path"] == "a.txt"


def _mcp_frame(values: dict[str, object]) -> tuple[bytes, dict[str, object]]:
    from workbench.schema import pb

    args = {k: json_format.ParseDict(v, struct_pb2.Value()).SerializeToString() for k, v in values.items()}
    msg = pb.AgentServerMessage(exec_server_message={"id": 4, "mcp_args": {"name": "srv", "args": args}})
    return msg.SerializeToString(), values


@pytest.mark.slow
@pytest.mark.parametrize("declared", ["map<string, google.protobuf.Value> args = 2;",
                                      "map<string, bytes> args = 2;", "map<string, string> args = 2;"])
def test_mcp_args_and_input_schema_stay_json(tmp_path: Path, declared: str) -> None:
    root = _public_like(tmp_path / "s", mcp_args=declared)
    payload, values = _mcp_frame({"path": "/a b", "n": 3.5, "flags": [True, None], "obj": {"k": "\u00e9\x01"}})
    dec = Decoder(load_schema([root]))
    [f] = dec.decode_body(encode(payload), "run", "server")
    assert fields_of(dec, f.kind, f.payload, f.msg_type)["exec_server_message"]["mcp_args"]["args"] == values


@pytest.mark.slow
@pytest.mark.parametrize("declared", ["google.protobuf.Value input_schema = 3;",
                                      "google.protobuf.Struct input_schema = 3;", "bytes input_schema = 3;"])
def test_tool_input_schema_stays_json(tmp_path: Path, declared: str) -> None:
    root = _public_like(tmp_path / "s", input_schema=declared)
    schema = load_schema([root])
    cls = schema.message_class("agent.v1.McpToolDefinition")
    doc = {"type": "object", "properties": {"q": {"type": "string"}}}
    raw = json_format.ParseDict(doc, struct_pb2.Value()).SerializeToString()
    payload = b"\x0a\x03srv" + b"\x1a" + bytes((len(raw),)) + raw
    from workbench.decode.tree import message_to_tree

    assert message_to_tree(cls.FromString(payload))["input_schema"] == doc


@pytest.mark.slow
def test_wrappers_blob_ids_and_appends_decode_as_before(tmp_path: Path) -> None:
    from workbench.schema import pb

    root = _public_like(tmp_path / "s")
    schema = load_schema([root])
    assert any("BidiAppendRequest" in n for n in schema.notes)
    user, builtin = Decoder(schema), Decoder()
    inner = pb.AgentClientMessage(client_heartbeat={}).SerializeToString()
    append = pb.BidiAppendRequest(data_bytes=inner, request_id={"request_id": "r1"}, append_seqno=2).SerializeToString()
    blob = pb.AgentServerMessage(kv_server_message={"id": 9, "set_blob_args": {
        "blob_id": bytes(range(32)), "blob_data": b'{"role":"user","content":"hi"}'}}).SerializeToString()
    for body, transport, direction in ((append, "bidi_append", "client"), (encode(blob), "run", "server")):
        [a] = user.decode_body(body, transport, direction)
        [b] = builtin.decode_body(body, transport, direction)
        assert (a.kind, a.summary, a.request_id, a.append_seqno) == (b.kind, b.summary, b.request_id, b.append_seqno)
        assert fields_of(user, a.kind, a.payload, a.msg_type) == fields_of(builtin, b.kind, b.payload, b.msg_type)


@pytest.mark.slow
def test_conflicts_name_files_and_types(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "one.proto").write_text('syntax = "proto3";\npackage agent.v1;\nmessage TextDelta { string text = 1; }\n')
    (b / "two.proto").write_text('syntax = "proto3";\npackage agent.v1;\nmessage TextDelta { string text = 1; '
                                 "string extra = 2; }\n")
    proc = _decode(DIAGNOSTICS, str(a), str(b))
    assert proc.returncode == 2
    assert "TextDelta" in proc.stderr
    assert "one.proto" in proc.stderr
    assert "two.proto" in proc.stderr
    (b / "one.proto").write_text((b / "two.proto").read_text())
    (b / "two.proto").unlink()
    proc = _decode(DIAGNOSTICS, str(a), str(b))
    assert proc.returncode == 2
    assert str(a / "one.proto") in proc.stderr
    assert str(b / "one.proto") in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_unusable_schemas_are_errors(tmp_path: Path) -> None:
    root = _public_like(tmp_path / "s")
    _edit(root / "agent/v1/agent.proto", ("message ExecServerMessage {\n  uint32 id = 1;", "message ExecServerMessage {"))
    proc = _decode(DIAGNOSTICS, str(root))
    assert proc.returncode == 2
    assert "agent.v1.ExecServerMessage" in proc.stderr
    assert "`id`" in proc.stderr
    with pytest.raises(SchemaError, match="ExecServerMessage"):
        load_schema([root])
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.proto").write_text('syntax = "proto3";\npackage agent.v1;\nmessage X { strin y = 1; }\n')
    proc = _decode(DIAGNOSTICS, str(bad))
    assert proc.returncode == 2
    assert "x.proto" in proc.stderr
    assert "Traceback" not in proc.stderr
    dup_only = tmp_path / "copy"
    (dup_only / "agent/v1").mkdir(parents=True)
    (dup_only / "agent/v1/agent.proto").write_text((PROTO_ROOT / "agent/v1/agent.proto").read_text())
    assert load_schema([dup_only]).identity.replaced > 0  # a copy of the overlay is still a schema


@pytest.mark.slow
def test_descriptor_set_as_proto(tmp_path: Path) -> None:
    root = _public_like(tmp_path / "s")
    out = tmp_path / "set.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{root}", f"-I{_wkt()}", "--include_imports",
                    f"--descriptor_set_out={out}", "agent/v1/agent.proto", "aiserver/v1/aiserver.proto"], check=True,
                   capture_output=True)
    proc = _decode(DIAGNOSTICS, str(out))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["fields"]["exec_server_message"]["diagnostics_args"]["tool_call_id"] == "tc01"
    junk = tmp_path / "junk.pb"
    junk.write_bytes(b"\xff\xff\xff")
    proc = _decode(DIAGNOSTICS, str(junk))
    assert proc.returncode == 2
    assert "junk.pb" in proc.stderr
    assert "FileDescriptorSet" in proc.stderr


def _wkt() -> str:
    import grpc_tools

    return str(Path(grpc_tools.__file__).parent / "_proto")


def test_every_decoder_need_names_something_in_the_overlay() -> None:
    """The contract is checked only where its path exists: a typo there would check nothing."""
    from workbench.schema import contract

    overlay = load_schema()
    for need in contract.NEEDS:
        found = contract._containers(overlay.descriptor(need.root), need.path, need.root)
        assert isinstance(found, list), need
        assert found, need
        for desc, _where in found:
            fd = desc.fields_by_name.get(need.name)
            assert fd is not None, (need, desc.full_name)
            assert contract._kind_ok(fd, need.kind), (need, desc.full_name)
    assert contract.check(overlay.descriptor) == []
