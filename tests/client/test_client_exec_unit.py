"""Exec answering rules, driven message by message (no network): result then stream_close,
throw for unknown exec kinds, KV answers, queries answered."""

from __future__ import annotations

from typing import Any

from workbench.client.agent import AgentClient, _Run
from workbench.client.events import ExecHandled, ExecRequest
from workbench.schema import pb


class RecordingChannel:
    """Stands in for the wire: collects what the client sends."""

    transport = "run"
    request_id = "rid"
    closed = False

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, msg: bytes) -> None:
        self.sent.append(pb.AgentClientMessage.FromString(msg))


def setup(**kw: Any) -> tuple[AgentClient, _Run, RecordingChannel]:
    ch = RecordingChannel()
    return AgentClient("https://example.invalid", "t", **kw), _Run(ch, [], "default"), ch  # type: ignore[arg-type]


def controls(ch: RecordingChannel) -> list[tuple[str, int]]:
    out = []
    for m in ch.sent:
        if m.WhichOneof("message") == "exec_client_control_message":
            c = m.exec_client_control_message
            member = c.WhichOneof("message")
            out.append((member, getattr(c, member).id))
    return out


async def test_unknown_exec_kinds_are_thrown() -> None:
    client, run, ch = setup()
    # a member the schema types but the client has no feature for
    ev = await client._exec(run, pb.ExecServerMessage(id=5, exec_id="x5", computer_use_args=pb.ComputerUseArgs(
        tool_call_id="t5")))
    assert isinstance(ev, ExecHandled) and not ev.ok
    # a member this schema does not know at all (field 99)
    raw = pb.ExecServerMessage(id=6, exec_id="x6").SerializeToString() + b"\x9a\x06\x00"
    ev = await client._exec(run, pb.ExecServerMessage.FromString(raw))
    assert isinstance(ev, ExecHandled) and not ev.ok
    assert controls(ch) == [("throw", 5), ("throw", 6)]
    assert [m.exec_client_control_message.throw.error_code for m in ch.sent] == ["UNIMPLEMENTED"] * 2


async def test_caller_answer_is_result_then_stream_close() -> None:
    client, run, ch = setup()
    ev = await client._exec(run, pb.ExecServerMessage(id=2, exec_id="x2", read_args=pb.ReadArgs(path="a.txt")))
    assert isinstance(ev, ExecRequest) and ev.kind == "read" and ev.args["path"] == "a.txt"
    await ev.respond("line one\n")
    kinds = [m.WhichOneof("message") for m in ch.sent]
    assert kinds == ["exec_client_message", "exec_client_control_message"]
    result = ch.sent[0].exec_client_message
    assert (result.id, result.exec_id) == (2, "x2")  # both ids echoed
    assert result.read_result.success.content == "line one\n"
    assert controls(ch) == [("stream_close", 2)]


async def test_no_stream_close_fault_drops_only_the_close() -> None:
    client, run, ch = setup(faults={"no_stream_close"})
    ev = await client._exec(run, pb.ExecServerMessage(id=3, exec_id="x3", shell_args=pb.ShellArgs(command="ls")))
    assert isinstance(ev, ExecRequest)
    await ev.respond("out")
    assert [m.WhichOneof("message") for m in ch.sent] == ["exec_client_message"]
    assert run.unclosed == [3]


async def test_failed_caller_answer_is_a_throw() -> None:
    client, run, ch = setup()
    ev = await client._exec(run, pb.ExecServerMessage(id=4, exec_id="x4", mcp_args=pb.McpArgs(name="t")))
    assert isinstance(ev, ExecRequest)
    await ev.fail("tool crashed")
    assert controls(ch) == [("throw", 4)] and ch.sent[0].exec_client_control_message.throw.error == "tool crashed"


async def test_kv_and_queries_are_always_answered() -> None:
    client, run, ch = setup()
    data = b'{"role":"system","content":"x"}'
    from workbench.client.blobs import blob_id

    await client._kv(run, pb.KvServerMessage(id=1, set_blob_args=pb.SetBlobArgs(blob_id=blob_id(data), blob_data=data)))
    await client._kv(run, pb.KvServerMessage(id=2, get_blob_args=pb.GetBlobArgs(blob_id=blob_id(data))))
    await client._kv(run, pb.KvServerMessage(id=3, get_blob_args=pb.GetBlobArgs(blob_id=b"\x00" * 32)))
    await client._answer_query(run, pb.InteractionQuery(id=9, web_search_request_query=pb.WebSearchRequestQuery()))
    kv = [m.kv_client_message for m in ch.sent[:3]]
    assert [k.id for k in kv] == [1, 2, 3]
    assert kv[1].get_blob_result.blob_data == data
    assert not kv[2].get_blob_result.HasField("blob_data")  # a miss: field absent
    resp = ch.sent[3].interaction_response
    assert resp.id == 9 and resp.web_search_request_response.HasField("rejected")
    assert client.blobs.mismatched == [] and client.blobs.misses == [b"\x00" * 32]
