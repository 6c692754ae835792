"""Exec answering rules, driven message by message (no network): the close policies (result then
stream_close, or the result alone), the streamed shell's exit → shell_result → stream_close, throw
(+ stream_close) for unknown exec kinds, KV answers, queries answered."""

from __future__ import annotations

from typing import Any

import pytest

from workbench.client.agent import AgentClient, ClientRun
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


def setup(**kw: Any) -> tuple[AgentClient, ClientRun, RecordingChannel]:
    ch = RecordingChannel()
    return AgentClient("https://example.invalid", "t", **kw), ClientRun(ch, [], "default"), ch  # type: ignore[arg-type]


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
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=5, exec_id="x5", computer_use_args=pb.ComputerUseArgs(
        tool_call_id="t5")))
    assert isinstance(ev, ExecHandled)
    assert not ev.ok
    # a member this schema does not know at all (field 99)
    raw = pb.ExecServerMessage(id=6, exec_id="x6").SerializeToString() + b"\x9a\x06\x00"
    ev = await client.execs.answer(run, pb.ExecServerMessage.FromString(raw))
    assert isinstance(ev, ExecHandled)
    assert not ev.ok
    # Cursor's own executor: throw, then stream_close, for an exec it has no handler for
    assert controls(ch) == [("throw", 5), ("stream_close", 5), ("throw", 6), ("stream_close", 6)]
    throws = [m.exec_client_control_message.throw for m in ch.sent
              if m.exec_client_control_message.WhichOneof("message") == "throw"]
    assert [t.error_code for t in throws] == ["UNIMPLEMENTED"] * 2


async def test_caller_answer_is_result_then_stream_close() -> None:
    client, run, ch = setup()
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=2, exec_id="x2", read_args=pb.ReadArgs(path="a.txt")))
    assert isinstance(ev, ExecRequest)
    assert ev.kind == "read"
    assert ev.args["path"] == "a.txt"
    await ev.respond("line one\n")
    kinds = [m.WhichOneof("message") for m in ch.sent]
    assert kinds == ["exec_client_message", "exec_client_control_message"]
    result = ch.sent[0].exec_client_message
    assert (result.id, result.exec_id) == (2, "x2")  # both ids echoed
    assert result.read_result.success.content == "line one\n"
    assert controls(ch) == [("stream_close", 2)]


async def test_no_stream_close_fault_drops_only_the_close() -> None:
    client, run, ch = setup(faults={"no_stream_close"})
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=3, exec_id="x3", shell_args=pb.ShellArgs(command="ls")))
    assert isinstance(ev, ExecRequest)
    await ev.respond("out")
    assert [m.WhichOneof("message") for m in ch.sent] == ["exec_client_message"]
    assert run.unclosed == [3]


async def test_failed_caller_answer_is_a_throw() -> None:
    client, run, ch = setup()
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=4, exec_id="x4", mcp_args=pb.McpArgs(name="t")))
    assert isinstance(ev, ExecRequest)
    await ev.fail("tool crashed")
    assert controls(ch) == [("throw", 4), ("stream_close", 4)]
    assert ch.sent[0].exec_client_control_message.throw.error == "tool crashed"


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
    assert resp.id == 9
    assert resp.web_search_request_response.HasField("rejected")
    assert client.blobs.mismatched == []
    assert client.blobs.misses == [b"\x00" * 32]


# close policies ---------------------------------------------------------------------------------

ANSWERED = [  # (exec kind, args message, what the caller answers)
    ("read", pb.ReadArgs(path="a.txt"), "text"),
    ("write", pb.WriteArgs(path="b.txt", file_text="x"), "ok"),
    ("delete", pb.DeleteArgs(path="c.txt"), "ok"),
    ("ls", pb.LsArgs(path="."), "a.txt\nb.txt"),
    ("grep", pb.GrepArgs(pattern="x", path="."), "a.txt"),
    ("shell", pb.ShellArgs(command="ls"), "a.txt"),
    ("mcp", pb.McpArgs(name="t", tool_name="t"), "done"),
]


def wire(ch: RecordingChannel) -> list[str]:
    """What went out, as 'result member' / 'control member' names."""
    out = []
    for m in ch.sent:
        if m.WhichOneof("message") == "exec_client_message":
            out.append(m.exec_client_message.WhichOneof("result"))
        elif m.WhichOneof("message") == "exec_client_control_message":
            out.append(m.exec_client_control_message.WhichOneof("message"))
    return out


@pytest.mark.parametrize(("kind", "args", "answer"), ANSWERED, ids=[a[0] for a in ANSWERED])
@pytest.mark.parametrize("policy", ["always", "streams-only"])
async def test_result_then_close_or_result_alone(policy: str, kind: str, args: Any, answer: str) -> None:
    client, run, ch = setup(close_policy=policy)
    ex = pb.ExecServerMessage(id=7, exec_id="x7")
    getattr(ex, f"{kind}_args").CopyFrom(args)
    ev = await client.execs.answer(run, ex)
    assert isinstance(ev, ExecRequest)
    await ev.respond(answer)
    if policy == "always":
        assert wire(ch) == [f"{kind}_result", "stream_close"]
        assert run.unclosed_by_policy == []
    else:  # what current real clients send for a non-streaming exec: the result alone
        assert wire(ch) == [f"{kind}_result"]
        assert run.unclosed_by_policy == [7]


@pytest.mark.parametrize("policy", ["always", "streams-only"])
async def test_request_context_is_closed_only_under_always(policy: str) -> None:
    client, run, ch = setup(close_policy=policy)
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=1, exec_id="x1", request_context_args=pb.RequestContextArgs()))
    assert isinstance(ev, ExecHandled)
    assert ev.ok
    expected = ["request_context_result", "stream_close"] if policy == "always" else ["request_context_result"]
    assert wire(ch) == expected


@pytest.mark.parametrize("policy", ["always", "streams-only"])
async def test_streamed_shell_ends_exit_shell_result_stream_close(policy: str) -> None:
    client, run, ch = setup(close_policy=policy)
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=3, exec_id="x3",
                                                      shell_stream_args=pb.ShellArgs(command="echo hi")))
    assert isinstance(ev, ExecRequest)
    await ev.respond("hi\n")
    assert wire(ch) == ["shell_stream_result", "shell_stream_result", "shell_result", "stream_close"]
    stream = [m.exec_client_message.shell_stream_result for m in ch.sent[:2]]
    assert [s.WhichOneof("event") for s in stream] == ["stdout", "exit"]
    final = ch.sent[2].exec_client_message
    assert (final.id, final.exec_id) == (3, "x3")
    assert final.shell_result.success.stdout == "hi\n"
    assert final.shell_result.success.command == "echo hi"
    assert final.shell_result.success.exit_code == 0


async def test_streamed_shell_exit_code_goes_into_a_failure_result() -> None:
    client, run, ch = setup(close_policy="streams-only")
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=4, exec_id="x4", shell_stream_args=pb.ShellArgs(command="x")))
    assert isinstance(ev, ExecRequest)
    await ev.respond([{"stderr": {"data": "boom"}}, {"exit": {"code": 2, "cwd": "/w"}}])
    assert wire(ch) == ["shell_stream_result", "shell_stream_result", "shell_result", "stream_close"]
    failure = ch.sent[2].exec_client_message.shell_result.failure
    assert (failure.exit_code, failure.stderr, failure.working_directory) == (2, "boom", "/w")


async def test_no_stream_close_fault_drops_every_close() -> None:
    client, run, ch = setup(close_policy="streams-only", faults={"no_stream_close"})
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=5, exec_id="x5", shell_stream_args=pb.ShellArgs(command="x")))
    assert isinstance(ev, ExecRequest)
    await ev.respond("out")
    ev = await client.execs.answer(run, pb.ExecServerMessage(id=6, exec_id="x6", mcp_args=pb.McpArgs(name="t")))
    assert isinstance(ev, ExecRequest)
    await ev.fail("no")
    assert "stream_close" not in wire(ch)
    assert wire(ch)[-1] == "throw"
    assert run.unclosed == [5]


def test_unknown_close_policy_is_named() -> None:
    with pytest.raises(ValueError, match="close_policy 'sometimes'"):
        AgentClient("https://x", "t", close_policy="sometimes")
