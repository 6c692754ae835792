"""Frame kinds: the constants name what the decoder really produces, and the predicates answer for
decoded frames (no hand-made kind strings on the side being tested)."""

from __future__ import annotations

import pytest

from workbench.decode.classify import CLIENT_MSG, SERVER_MSG, default_decoder
from workbench.protocol import kinds
from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, FLAG_TRAILER, encode

DEC = default_decoder()


def _server(msg: pb.AgentServerMessage) -> str:
    return DEC.classify_agent(msg.SerializeToString(), SERVER_MSG).kind


def _client(msg: pb.AgentClientMessage) -> str:
    return DEC.classify_agent(msg.SerializeToString(), CLIENT_MSG).kind


def _member_constants() -> list[tuple[str, str]]:
    return [(name, value) for name, value in vars(kinds).items()
            if name.isupper() and isinstance(value, str) and "." in value]


@pytest.mark.parametrize(("name", "value"), _member_constants())
def test_every_member_constant_names_a_schema_member(name: str, value: str) -> None:
    """A typo in a constant would silently match nothing; each ``family.member`` exists in the schema."""
    family, member = value.split(".", 1)
    if family.startswith("end_stream") or family == kinds.OPENAI:
        return  # transport kinds, not messages (tested on decoded frames below; openai.*: tests/bridge)
    for top in (pb.AgentServerMessage, pb.AgentClientMessage):
        field = top.DESCRIPTOR.fields_by_name.get(family)
        if field is not None and field.message_type is not None:
            assert member in field.message_type.fields_by_name, f"{name} = {value!r}"
            return
    pytest.fail(f"{name} = {value!r}: {family} is no member of AgentServerMessage/AgentClientMessage")


def test_heartbeats_as_the_decoder_names_them() -> None:
    server_hb = _server(pb.AgentServerMessage(interaction_update={"heartbeat": {}}))
    client_hb = _client(pb.AgentClientMessage(client_heartbeat={}))
    exec_hb = _client(pb.AgentClientMessage(exec_client_control_message={"heartbeat": {"id": 3}}))
    assert (server_hb, client_hb, exec_hb) == (kinds.SERVER_HEARTBEAT, kinds.CLIENT_HEARTBEAT, kinds.EXEC_HEARTBEAT)
    assert all(kinds.is_heartbeat(k) for k in (server_hb, client_hb, exec_hb))
    assert kinds.is_server_heartbeat(server_hb) and not kinds.is_client_heartbeat(server_hb)
    assert kinds.is_client_heartbeat(client_hb) and kinds.is_client_heartbeat(exec_hb)
    text = _server(pb.AgentServerMessage(interaction_update={"text_delta": {"text": "hi"}}))
    assert text == kinds.TEXT_DELTA and not kinds.is_heartbeat(text)


def test_end_stream_predicates_on_decoded_ends() -> None:
    ok = DEC.decode_body(encode(b"{}", FLAG_END_STREAM), "run", "server")[0].kind
    err = DEC.decode_body(encode(b'{"error":{"code":"unavailable","message":"Error"}}', FLAG_END_STREAM),
                          "run", "server")[0].kind
    trailer_ok = DEC.decode_body(encode(b"grpc-status: 0\r\n", FLAG_TRAILER), "run", "server")[0].kind
    trailer_err = DEC.decode_body(encode(b"grpc-status: 8\r\n", FLAG_TRAILER), "run", "server")[0].kind
    assert (ok, err, trailer_ok, trailer_err) == (kinds.END_STREAM, kinds.END_STREAM_ERROR, kinds.END_STREAM,
                                                  kinds.END_STREAM_ERROR)
    assert all(kinds.is_end_stream(k) for k in (ok, err, trailer_ok, trailer_err))
    assert [kinds.is_end_stream_error(k) for k in (ok, err, trailer_ok, trailer_err)] == [False, True, False, True]
    bad = DEC.decode_body(encode(b"not json", FLAG_END_STREAM), "run", "server")[0].kind
    assert bad == kinds.MALFORMED and not kinds.is_end_stream(bad)


def test_families() -> None:
    kv = _server(pb.AgentServerMessage(kv_server_message={"id": 1, "get_blob_args": {"blob_id": b"x"}}))
    assert kv == kinds.KV_GET_BLOB_ARGS
    assert kinds.family(kv) == kinds.KV_SERVER and kinds.member(kv) == "get_blob_args"
    assert kinds.in_family(kv, kinds.EXEC_SERVER, kinds.KV_SERVER) and not kinds.in_family(kv, kinds.KV_CLIENT)
    assert kinds.family(kinds.END_STREAM) == kinds.END_STREAM and kinds.member(kinds.END_STREAM) == ""


def test_sql_list_quotes_kinds_and_refuses_anything_else() -> None:
    assert kinds.sql_list(kinds.HEARTBEATS) == ("('interaction_update.heartbeat', 'client_heartbeat', "
                                                "'exec_client_control_message.heartbeat')")
    with pytest.raises(ValueError, match="not a frame kind"):
        kinds.sql_list(["x') OR 1=1 --"])
