"""Our Connect framing against a third-party implementation (``connect-python`` from PyPI).

Envelopes written by connect-python's Connect protocol writer are parsed by
``workbench.wire.envelope`` (plain and gzip, plus its end-stream error), and envelopes we encode are
read back by connect-python's reader, which raises its own ConnectError for our end-stream error.
"""

from __future__ import annotations

import json

import pytest

connectrpc = pytest.importorskip("connectrpc")

from connectrpc._codec import ProtoBinaryCodec  # noqa: E402
from connectrpc._compression import IdentityCompression  # noqa: E402
from connectrpc._protocol import ConnectWireError  # noqa: E402
from connectrpc._protocol_connect import ConnectEnvelopeReader, ConnectEnvelopeWriter  # noqa: E402
from connectrpc.code import Code  # noqa: E402
from connectrpc.compression.gzip import GzipCompression  # noqa: E402
from connectrpc.errors import ConnectError  # noqa: E402

from workbench.schema import pb  # noqa: E402
from workbench.wire.endstream import parse_end_stream  # noqa: E402
from workbench.wire.envelope import FLAG_END_STREAM, EnvelopeParser, encode  # noqa: E402


def server_messages() -> list:
    return [
        pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(text_delta=pb.TextDelta(text="héllo " * 50))),
        pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(heartbeat=pb.Heartbeat())),
        pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
            id=7, exec_id="e-7", shell_args=pb.ShellArgs(command="ls -la"))),
        pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(turn_ended=pb.TurnEnded())),
    ]


@pytest.mark.parametrize("compression", [IdentityCompression(), GzipCompression()], ids=["identity", "gzip"])
def test_we_parse_what_connect_python_writes(compression) -> None:
    writer = ConnectEnvelopeWriter(ProtoBinaryCodec(), compression)
    msgs = server_messages()
    wire = b"".join(writer.write(m) for m in msgs)
    wire += writer.end(None, ConnectWireError(Code.RESOURCE_EXHAUSTED, "usage limit", ()))
    parser = EnvelopeParser()
    envs = []
    for i in range(0, len(wire), 7):  # arbitrary chunk boundaries, as on a real socket
        envs += parser.feed(wire[i:i + 7])
    envs += parser.close()
    assert [e.error for e in envs] == [None] * (len(msgs) + 1)
    assert [pb.AgentServerMessage.FromString(e.payload) for e in envs[:-1]] == msgs
    assert envs[-1].is_end_stream
    end = parse_end_stream(envs[-1].payload)
    assert end.code == "resource_exhausted"
    assert end.message == "usage limit"


def test_connect_python_reads_what_we_encode() -> None:
    msgs = server_messages()
    error = {"error": {"code": "not_found", "message": "Error", "details": []}}
    wire = b"".join(encode(m.SerializeToString(), compress=(i % 2 == 1)) for i, m in enumerate(msgs))
    wire += encode(json.dumps(error).encode(), FLAG_END_STREAM)
    reader = ConnectEnvelopeReader(pb.AgentServerMessage, ProtoBinaryCodec(), GzipCompression(), None)
    got = []
    with pytest.raises(ConnectError) as info:
        for i in range(0, len(wire), 5):
            got.extend(reader.feed(wire[i:i + 5]))
    assert got == msgs
    assert info.value.code == Code.NOT_FOUND


def test_client_request_bytes_are_valid_connect_envelopes() -> None:
    """The exact envelope bytes our Run channel writes parse with connect-python's reader."""
    from workbench.client.agent import AgentClient

    c = AgentClient("https://example.invalid", "t")
    body = c.build_run_request("hi", "default", [], "conv-1")
    reader = ConnectEnvelopeReader(pb.AgentClientMessage, ProtoBinaryCodec(), IdentityCompression(), None)
    [msg] = list(reader.feed(encode(body)))
    assert msg.run_request.conversation_id == "conv-1"
    assert msg.run_request.HasField("conversation_state")
    assert body[0] == 0x0A
    assert body[3:5] == b"\x0a\x00"  # run_request, then the empty state `0a 00`
