"""Turns of the client styles we know, built message by message with the real protobuf runtime.

- ``always``: our client's default (result(s), then stream_close for every exec);
- ``streams-only``: what current real clients send (the result alone for request_context, read,
  write, ls, grep and MCP; a streamed shell ends exit → final ``shell_result`` → stream_close;
  an exec without a handler gets throw + stream_close); they never half-close the request.

A turn runs against a server ``policy``: ``accepted`` (a result completes an exec: the 2026
service) or ``required`` (the server waits for stream_close: the December 2025 service). Events
are recorded first and written in ``time`` order (as on the wire) or ``body`` order (all client
frames of the exchange first, as an import without per-frame timing has them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from analysis_helpers import SessionBuilder

from workbench.protocol.args import json_to_mcp_args
from workbench.schema import pb

STYLES = ("always", "streams-only")
TOOLS = ("request_context", "read", "write", "ls", "grep", "mcp", "shell_stream", "unknown")
SYSTEM = json.dumps({"role": "system", "content": "You are a coding agent."}).encode()
# A blob the client names in its run_request state (root_prompt_messages_json) that the server
# never asks for: not a miss.
CLIENT_ONLY = json.dumps({"role": "user", "content": "<rules>be brief</rules>"}).encode()


@dataclass
class Event:
    direction: str
    write: Callable[[SessionBuilder], int]
    tag: str = ""


@dataclass
class Turn:
    events: list[Event]
    stalled_on: int | None = None  # the exec id the server parked on (policy required, result alone)


def _exec_args(kind: str, id_: int, call_id: str) -> dict[str, Any]:
    if kind == "request_context":
        return {"request_context_args": pb.RequestContextArgs(workspace_id="ws-1")}
    if kind == "read":
        return {"read_args": pb.ReadArgs(path="README.md", tool_call_id=call_id)}
    if kind == "write":
        return {"write_args": pb.WriteArgs(path="NOTES.md", file_text="notes", tool_call_id=call_id)}
    if kind == "ls":
        return {"ls_args": pb.LsArgs(path=".", tool_call_id=call_id)}
    if kind == "grep":
        return {"grep_args": pb.GrepArgs(pattern="TODO", path=".", tool_call_id=call_id)}
    if kind == "mcp":
        return {"mcp_args": pb.McpArgs(name="lookup", tool_name="lookup", tool_call_id=call_id,
                                       args=json_to_mcp_args({"q": "workbench"}))}
    if kind == "shell_stream":
        return {"shell_stream_args": pb.ShellArgs(command="ls", tool_call_id=call_id)}
    return {"fetch_args": pb.FetchArgs(url="https://example.invalid", tool_call_id=call_id)}


def _results(kind: str, id_: int) -> list[dict[str, Any]]:
    """The exec_client_message results a real client sends for ``kind``."""
    e = f"e{id_}"

    def m(**r: Any) -> dict[str, Any]:
        return {"exec_client_message": pb.ExecClientMessage(id=id_, exec_id=e, **r)}

    if kind == "request_context":
        return [m(request_context_result=pb.RequestContextResult(success=pb.RequestContextSuccess(
            request_context=pb.RequestContext())))]
    if kind == "read":
        return [m(read_result=pb.ReadResult(success=pb.ReadSuccess(path="README.md", content="# demo\n")))]
    if kind == "write":
        return [m(write_result=pb.WriteResult(success=pb.WriteSuccess(path="NOTES.md", lines_created=1)))]
    if kind == "ls":
        return [m(ls_result=pb.LsResult(success=pb.LsSuccess()))]
    if kind == "grep":
        return [m(grep_result=pb.GrepResult(success=pb.GrepSuccess(pattern="TODO", path=".")))]
    if kind == "mcp":
        return [m(mcp_result=pb.McpResult(success=pb.McpSuccess(
            content=[pb.McpToolResultContentItem(text=pb.McpTextContent(text="found it"))])))]
    if kind == "shell_stream":
        return [m(shell_stream_result=pb.ShellStream(stdout=pb.ShellStreamStdout(data="README.md\n"))),
                m(shell_stream_result=pb.ShellStream(exit=pb.ShellStreamExit(code=0))),
                m(shell_result=pb.ShellResult(success=pb.ShellSuccess(command="ls", exit_code=0, stdout="README.md\n")))]
    return []


def _tool_call(kind: str) -> pb.ToolCall:
    if kind == "mcp":
        return pb.ToolCall(mcp_tool_call=pb.McpToolCall(args=pb.McpArgs(name="lookup", tool_name="lookup",
                                                                         args=json_to_mcp_args({"q": "workbench"}))))
    if kind == "shell_stream":
        return pb.ToolCall(shell_tool_call=pb.ShellToolCall(args=pb.ShellArgs(command="ls")))
    if kind in ("read", "write", "ls", "grep"):
        field = {"read": "read_tool_call", "write": "edit_tool_call", "ls": "ls_tool_call", "grep": "grep_tool_call"}[kind]
        return pb.ToolCall(**{field: {}})
    return pb.ToolCall(fetch_tool_call=pb.FetchToolCall())


def tool_turn(style: str, tools: tuple[str, ...] = TOOLS, *, policy: str = "accepted",
              client_beats: bool = True) -> Turn:
    """A whole turn: run_request → KV → each tool → text → checkpoint → turn_ended → end-stream."""
    ev: list[Event] = []

    def server(**fields: Any) -> None:
        ev.append(Event("server", lambda b, f=fields: b.server(**f)))

    def update(**fields: Any) -> None:
        ev.append(Event("server", lambda b, f=fields: b.update(**f)))

    def client(tag: str = "", **fields: Any) -> None:
        ev.append(Event("client", lambda b, f=fields: b.client(**f), tag))

    state = pb.ConversationStateStructure(root_prompt_messages_json=[_sha(CLIENT_ONLY)])
    ev.append(Event("client", lambda b: b.run_request(state=state, text="look around the repo"), "run_request"))
    ev.append(Event("server", lambda b: b.set_blob(1, SYSTEM)[0]))
    client(kv_client_message=pb.KvClientMessage(id=1, set_blob_result=pb.SetBlobResult()))
    server(kv_server_message=pb.KvServerMessage(id=2, get_blob_args=pb.GetBlobArgs(blob_id=_sha(SYSTEM))))
    client(kv_client_message=pb.KvClientMessage(id=2, get_blob_result=pb.GetBlobResult(blob_data=SYSTEM)))
    update(thinking_delta=pb.ThinkingDelta(text="Let me look."))
    stalled = None
    for n, kind in enumerate(tools, start=1):
        call_id = f"call-{n}"
        is_tool = kind != "request_context"
        if is_tool:
            args = json.dumps({"kind": kind, "n": n})
            for cut in (len(args) // 2, len(args)):
                update(partial_tool_call=pb.PartialToolCall(call_id=call_id, args_text_delta=args[:cut]))
            update(tool_call_started=pb.ToolCallStarted(call_id=call_id, tool_call=_tool_call(kind)))
        server(exec_server_message=pb.ExecServerMessage(id=n, exec_id=f"e{n}", **_exec_args(kind, n, call_id)))
        if client_beats:
            ev.append(Event("client", lambda b: b.client_heartbeat(), "client_heartbeat"))
        results = _results(kind, n)
        for r in results:
            client("result", **r)
        closes = style == "always" or kind in ("shell_stream", "unknown")
        if kind == "unknown":
            client("throw", exec_client_control_message=pb.ExecClientControlMessage(
                throw=pb.ExecClientThrow(id=n, error="no handler", error_code="UNIMPLEMENTED")))
        if closes:
            client("close", exec_client_control_message=pb.ExecClientControlMessage(
                stream_close=pb.ExecClientStreamClose(id=n)))
        if policy == "required" and not closes:
            stalled = n
            for _ in range(8):
                ev.append(Event("server", lambda b: b.heartbeat(dt_ms=2000)))
            ev.append(Event("server", lambda b: b.end_stream({"code": "deadline_exceeded",
                                                              "message": "waiting for stream_close"}), "end"))
            return Turn(ev, stalled)
        if is_tool:
            update(tool_call_completed=pb.ToolCallCompleted(call_id=call_id, tool_call=_tool_call(kind)))
    for chunk in ("I looked ", "around."):
        update(text_delta=pb.TextDelta(text=chunk))
    # The checkpoint names the client's own blob too (it echoes the state): never asked for, no miss.
    server(conversation_checkpoint_update=pb.ConversationStateStructure(
        root_prompt_messages_json=[_sha(CLIENT_ONLY), _sha(SYSTEM)]))
    update(step_completed=pb.StepCompleted())
    update(turn_ended=pb.TurnEnded())
    ev.append(Event("server", lambda b: b.end_stream(), "end"))
    return Turn(ev, stalled)


def _sha(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha256(data).digest()


def write_turn(b: SessionBuilder, turn: Turn, order: str = "time") -> dict[int, int]:
    """Write the events; returns event index → seq. ``body``: client frames first."""
    idx = list(range(len(turn.events)))
    if order == "body":
        idx = [i for i in idx if turn.events[i].direction == "client"] + \
              [i for i in idx if turn.events[i].direction == "server"]
    return {i: turn.events[i].write(b) for i in idx}


def body_meta(order: str) -> dict[str, Any]:
    """Session meta of an import without per-frame timing (as the importer writes it)."""
    if order == "body":
        return {"timing": "per-message", "order": "body"}
    if order == "causal":
        return {"timing": "per-message", "order": "causal"}
    return {}
