"""A small, realistic agent turn as wire bytes: the sample shipped under captures/samples/.

Used by the README quick start (``workbench decode --batch captures/samples/run-turn.ndjson``)
and by tests that need a known-good frame sequence without starting servers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from workbench.schema import pb
from workbench.wire.envelope import FLAG_END_STREAM, encode


def sample_turn() -> Iterator[tuple[str, str, bytes]]:
    """(direction, transport, enveloped bytes) of one Run turn with a shell tool call."""
    system = json.dumps({"role": "system", "content": "You are a coding agent."}).encode()
    user = json.dumps({"role": "user", "content": [{"type": "text", "text": "<user_query>list files</user_query>"}]}).encode()
    req = pb.AgentClientMessage(run_request=pb.AgentRunRequest(
        conversation_state=pb.ConversationStateStructure(),
        action=pb.ConversationAction(user_message_action=pb.UserMessageAction(
            user_message=pb.UserMessage(text="list files", message_id="m1"))),
        requested_model=pb.RequestedModel(model_id="claude-4-sonnet"),
        conversation_id="c0ffee00-0000-4000-8000-000000000001"))
    yield "client", "run", encode(req.SerializeToString())
    for kv_id, blob in ((1, system), (2, user)):
        m = pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
            id=kv_id, set_blob_args=pb.SetBlobArgs(blob_id=hashlib.sha256(blob).digest(), blob_data=blob)))
        yield "server", "run", encode(m.SerializeToString())
        r = pb.AgentClientMessage(kv_client_message=pb.KvClientMessage(id=kv_id, set_blob_result=pb.SetBlobResult()))
        yield "client", "run", encode(r.SerializeToString())

    def upd(**kw: Any) -> bytes:
        return encode(pb.AgentServerMessage(interaction_update=pb.InteractionUpdate(**kw)).SerializeToString())

    yield "server", "run", upd(thinking_delta=pb.ThinkingDelta(text="The user wants a listing."))
    args = '{"command": "ls -la"}'
    for cut in (8, 16, len(args)):
        yield "server", "run", upd(partial_tool_call=pb.PartialToolCall(call_id="call_1", args_text_delta=args[:cut]))
    tool = pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=pb.ShellArgs(command="ls -la")))
    yield "server", "run", upd(tool_call_started=pb.ToolCallStarted(call_id="call_1", tool_call=tool))
    ex = pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
        id=7, exec_id="exec-7", shell_args=pb.ShellArgs(command="ls -la", tool_call_id="call_1")))
    yield "server", "run", encode(ex.SerializeToString())
    yield "server", "run", upd(heartbeat=pb.Heartbeat())
    res = pb.AgentClientMessage(exec_client_message=pb.ExecClientMessage(
        id=7, exec_id="exec-7", shell_result=pb.ShellResult(success=pb.ShellSuccess(
            command="ls -la", exit_code=0, stdout="README.md\nworkbench\n"))))
    yield "client", "run", encode(res.SerializeToString())
    close = pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
        stream_close=pb.ExecClientStreamClose(id=7)))
    yield "client", "run", encode(close.SerializeToString())
    yield "server", "run", upd(tool_call_completed=pb.ToolCallCompleted(call_id="call_1", tool_call=tool))
    for chunk in ("Two entries: ", "README.md and ", "workbench."):
        yield "server", "run", upd(text_delta=pb.TextDelta(text=chunk))
    yield "server", "run", upd(token_delta=pb.TokenDelta(tokens=9))
    ck = pb.AgentServerMessage(conversation_checkpoint_update=pb.ConversationStateStructure(
        root_prompt_messages_json=[hashlib.sha256(system).digest()],
        token_details=pb.ConversationTokenDetails(used_tokens=812, max_tokens=200000)))
    yield "server", "run", encode(ck.SerializeToString())
    yield "server", "run", upd(step_completed=pb.StepCompleted(step_id=1, step_duration_ms=1200))
    yield "server", "run", upd(turn_ended=pb.TurnEnded())
    yield "server", "run", encode(b"{}", flags=FLAG_END_STREAM)


def sample_ndjson() -> str:
    return "".join(json.dumps({"hex": data.hex(), "direction": d, "transport": t}) + "\n"
                   for d, t, data in sample_turn())
