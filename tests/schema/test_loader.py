"""Schema overlay loading, ``pb`` lookups and ``--proto`` user schemas taking precedence."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.decode import fields_of
from workbench.decode.classify import SERVER_MSG, Decoder, default_decoder
from workbench.schema import SchemaError, load_schema, pb
from workbench.wire.envelope import encode

USER_TEXT_DELTA = """
syntax = "proto3";
package agent.v1;

// A newer build's TextDelta with a field the overlay does not know.
message TextDelta {
  string text = 1;
  string provider_chunk_id = 7;
}
"""


def _text_delta_with_7() -> bytes:
    inner = b"\x0a\x02hi" + b"\x3a\x05chunk"  # text = "hi", field 7 = "chunk"
    upd = b"\x0a" + bytes((len(inner),)) + inner
    return b"\x0a" + bytes((len(upd),)) + upd


def test_pb_lookups() -> None:
    assert pb.AgentServerMessage.DESCRIPTOR.full_name == "agent.v1.AgentServerMessage"
    assert pb.BidiAppendRequest.DESCRIPTOR.full_name == "aiserver.v1.BidiAppendRequest"
    assert pb.Value.DESCRIPTOR.full_name == "google.protobuf.Value"
    assert pb.message("aiserver.v1.ErrorDetails").DESCRIPTOR.fields_by_name["error"].number == 1
    with pytest.raises(AttributeError, match="NoSuchThing"):
        _ = pb.NoSuchThing


def test_overlay_numbers_match_protocol() -> None:
    """Spot checks of numbers (docs/protocol.md §3, §5) the classifier depends on."""
    f = pb.AgentServerMessage.DESCRIPTOR.fields_by_name
    assert {n: f[n].number for n in ("interaction_update", "exec_server_message", "conversation_checkpoint_update",
                                     "kv_server_message", "exec_server_control_message", "interaction_query")} == {
        "interaction_update": 1, "exec_server_message": 2, "conversation_checkpoint_update": 3,
        "kv_server_message": 4, "exec_server_control_message": 5, "interaction_query": 7}
    e = pb.ExecServerMessage.DESCRIPTOR.fields_by_name
    assert (e["id"].number, e["exec_id"].number, e["shell_stream_args"].number, e["mcp_args"].number) == (1, 15, 14, 11)
    c = pb.ExecClientMessage.DESCRIPTOR.fields_by_name
    assert (c["pi_read_result"].number, c["pi_ls_result"].number, c["mini_swe_agent_bash_result"].number) == (46, 52, 55)
    a = pb.BidiAppendRequest.DESCRIPTOR.fields_by_name
    assert (a["data"].number, a["request_id"].number, a["append_seqno"].number, a["data_bytes"].number) == (1, 2, 3, 4)
    p = pb.BidiPollResponse.DESCRIPTOR.fields_by_name
    assert (p["seqno"].number, p["data"].number, p["eof"].number) == (1, 2, 3)


@pytest.mark.slow
def test_user_proto_file_takes_precedence(tmp_path: Path) -> None:
    proto = tmp_path / "newer.proto"
    proto.write_text(USER_TEXT_DELTA)
    payload = _text_delta_with_7()
    builtin = default_decoder()
    [f] = builtin.decode_body(encode(payload), "run", "server")
    assert fields_of(builtin, f.kind, f.payload, f.msg_type) == {
        "interaction_update": {"text_delta": {"text": "hi", "7": "chunk"}}}

    user = Decoder(load_schema([proto]))
    [f] = user.decode_body(encode(payload), "run", "server")
    assert (f.kind, f.summary) == ("interaction_update.text_delta", 'text "hi"')
    assert fields_of(user, f.kind, f.payload, f.msg_type) == {
        "interaction_update": {"text_delta": {"text": "hi", "provider_chunk_id": "chunk"}}}
    # the user's type is the one embedded in the overlay's messages, and the rest still works
    upd = user.schema.descriptor("agent.v1.InteractionUpdate")
    assert "provider_chunk_id" in upd.fields_by_name["text_delta"].message_type.fields_by_name
    assert user.schema.has(SERVER_MSG)
    assert user.schema.has("aiserver.v1.BidiAppendRequest")
    # the overlay itself (and pb) is unchanged
    assert "provider_chunk_id" not in pb.TextDelta.DESCRIPTOR.fields_by_name


@pytest.mark.slow
def test_user_proto_folder_with_new_types_importing_the_overlay(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "td.proto").write_text(USER_TEXT_DELTA)
    (tmp_path / "extra.proto").write_text(
        'syntax = "proto3";\npackage my.v1;\nimport "aiserver/v1/aiserver.proto";\n'
        "message Wrapper { aiserver.v1.BidiRequestId rid = 1; }\n")
    schema = load_schema([tmp_path])
    assert schema.has("my.v1.Wrapper")
    assert "provider_chunk_id" in schema.descriptor("agent.v1.TextDelta").fields_by_name
    cls = schema.message_class("my.v1.Wrapper")
    assert cls.FromString(b"\x0a\x03\x0a\x01x").rid.request_id == "x"


@pytest.mark.slow
def test_bad_user_protos_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.proto"
    bad.write_text('syntax = "proto3";\nmessage X { strin x = 1; }\n')
    with pytest.raises(SchemaError, match="broken.proto"):
        load_schema([bad])
    with pytest.raises(SchemaError, match="nothere.proto"):
        load_schema([tmp_path / "nothere.proto"])
    empty = tmp_path / "empty_dir"
    empty.mkdir()
    with pytest.raises(SchemaError, match="no .proto files"):
        load_schema([empty])
