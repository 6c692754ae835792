"""How the client answers exec requests, and when it closes them (its *close policy*).

An exec is answered with its result message(s) — or with ``throw`` when it cannot be — and then,
depending on the policy, with ``exec_client_control_message.stream_close{id}``:

- ``always``: result(s) then ``stream_close`` for every exec. What the December 2025 service needed
  (a built-in tool's result alone left the run heartbeating until the close came); accepted by the
  service since.
- ``streams-only``: what current real clients send. ``stream_close`` only after a streamed shell
  (ShellStream events, ``exit``, a final ``shell_result``, then ``stream_close``); request_context,
  read, write, delete, ls, grep, shell and MCP execs get their result alone.

Under both, a ``throw`` is followed by ``stream_close`` (Cursor's own executor does that for an exec
it has no handler for), and a streamed shell always ends exit → ``shell_result`` → ``stream_close``.
The ``no_stream_close`` fault drops every close (request_context excepted under ``always``).
With ``answer_request_context`` off, ``request_context_args`` gets no answer at all: the context went in
the run request (``UserMessageAction.request_context``, ``AgentRunRequest.mcp_tools``), as stateless
proxies do.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message

from workbench.client._pb import pb
from workbench.client.events import CallState, Event, ExecHandled, ExecRequest
from workbench.client.localexec import (
    LOCAL_KINDS,
    LocalExecutor,
    ResultParts,
    caller_result,
    final_shell_result,
    result_field,
)
from workbench.client.run import ClientRun
from workbench.protocol import args as tool_args

CLOSE_POLICIES = ("always", "streams-only")
# Exec kinds whose answer is a stream of events: under streams-only they still end with stream_close.
STREAMED_KINDS = frozenset({"shell_stream"})


def check_close_policy(policy: str) -> str:
    if policy not in CLOSE_POLICIES:
        raise ValueError(f"close_policy {policy!r}: choose one of {', '.join(CLOSE_POLICIES)}")
    return policy


class ExecAnswers:
    """Answers the exec requests of a run as the client's settings say: local execution (``executor``),
    close policy, faults, the client heartbeat of a long local exec, and the request context
    (``request_context``: the client's tools → ``RequestContext``). ``AgentClient`` holds one."""

    def __init__(self, *, executor: LocalExecutor | None, faults: frozenset[str], close_policy: str,
                 heartbeat_interval: float, answer_request_context: bool,
                 request_context: Callable[[Iterable[Any]], Any]) -> None:
        self.executor = executor
        self.faults = faults
        self.close_policy = check_close_policy(close_policy)
        self.heartbeat_interval = heartbeat_interval
        self.answer_request_context = answer_request_context
        self.request_context = request_context

    def closes_after_result(self, kind: str) -> bool:
        """Whether an exec of ``kind`` answered with a result gets ``stream_close`` (the policy)."""
        return self.close_policy == "always" or kind in STREAMED_KINDS

    async def _exec_heartbeats(self, run: ClientRun, eid: int) -> None:
        # Newer CLIs keep a long local exec alive with ExecClientHeartbeat{id} (docs/protocol.md §5).
        beat = bytes(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
            heartbeat=pb.ExecClientHeartbeat(id=eid))).SerializeToString())
        while not run.channel.closed:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(Exception):
                await run.channel.send(beat)

    def _link_exec(self, run: ClientRun, args_msg: Any, kind: str, exec_id: str) -> CallState | None:
        tcid = getattr(args_msg, "tool_call_id", "") if isinstance(args_msg, Message) else ""
        st = run.calls.get(tcid) if tcid else None
        if st is None:
            for cid in reversed(run.call_order):
                cand = run.calls[cid]
                if cand.exec_id is None and not cand.completed:
                    st = cand
                    break
        if st is not None:
            st.exec_id = exec_id
            if not st.kind:
                st.kind = kind
            if kind == "mcp" and isinstance(args_msg, Message):
                st.exec_args = tool_args.mcp_args_to_json(args_msg.args)  # type: ignore[attr-defined]
                if not st.name or st.name == "mcp":
                    st.name = args_msg.tool_name or args_msg.name  # type: ignore[attr-defined]
        return st

    async def _run_local(self, run: ClientRun, eid: int, exec_id: str, kind: str, args_msg: Any) -> None:
        assert self.executor is not None
        beats = asyncio.create_task(self._exec_heartbeats(run, eid))
        streamed: ResultParts = []  # a shell stream's events, sent while the command ran

        async def emit(event: Any) -> None:
            streamed.append(("shell_stream_result", event))
            ecm = pb.ExecClientMessage(id=eid, exec_id=exec_id)
            ecm.shell_stream_result.CopyFrom(event)
            await run.send({"exec_client_message": ecm})

        try:
            parts = await self.executor.run(kind, args_msg, emit if kind == "shell_stream" else None)
        except Exception as exc:
            await self._throw(run, eid, f"{type(exc).__name__}: {exc}")
            run.done.append(ExecHandled(eid, exec_id, kind, False, f"thrown: {exc}"))
            return
        finally:
            beats.cancel()
            run.local.pop(eid, None)
        await self._send_result(run, eid, exec_id, kind, args_msg, streamed + parts, already_sent=len(streamed))
        refused = _refusal(parts)
        run.done.append(ExecHandled(eid, exec_id, kind, refused is None,
                                    "executed locally" if refused is None else f"refused: {refused}"))

    async def answer(self, run: ClientRun, ex: Any) -> Event | None:
        """Answer one ExecServerMessage; the event for the caller (an ``ExecRequest`` to answer,
        an ``ExecHandled``), or None while a local execution runs in the background."""
        member = ex.WhichOneof("args")
        eid, exec_id = ex.id, ex.exec_id
        if member is None or not member.endswith("_args"):
            if "ignore_unknown_exec" in self.faults:
                # The fault: an exec case this schema cannot decode is dropped, never answered (pi-cursor #13).
                return ExecHandled(eid, exec_id, "unknown", False, "left unanswered: unknown exec case")
            await self._throw(run, eid, f"unknown exec kind (no known args member in ExecServerMessage id {eid})",
                              "UNIMPLEMENTED")
            return ExecHandled(eid, exec_id, member or "unknown", False, "thrown: unknown exec kind")
        kind = member.removesuffix("_args")
        args_msg = getattr(ex, member)
        if kind == "request_context" and not self.answer_request_context:
            # Left unanswered on purpose: the run request already carries the same context.
            run.context_unanswered.append(eid)
            return ExecHandled(eid, exec_id, kind, True, "request_context left unanswered (context in the run request)")
        if kind == "request_context":
            parts: ResultParts = [("request_context_result", pb.RequestContextResult(
                success=pb.RequestContextSuccess(request_context=self.request_context(run.tools))))]
            # Closed under "always" even with no_stream_close: the documented hang is a tool handler's.
            await self._send_result(run, eid, exec_id, kind, args_msg, parts,
                                    force_close=self.close_policy == "always")
            return ExecHandled(eid, exec_id, kind, True, "request_context answered by the client")
        if self.executor is not None and kind in LOCAL_KINDS:
            # In the background: the run keeps reading (KV, heartbeats, an abort for this very exec).
            self._link_exec(run, args_msg, kind, exec_id)
            run.local[eid] = (asyncio.create_task(self._run_local(run, eid, exec_id, kind, args_msg)), exec_id, kind)
            return None
        if result_field(kind) is None or not isinstance(args_msg, Message):
            await self._throw(run, eid, f"unknown exec kind {member!r}: the workbench client cannot answer it",
                              "UNIMPLEMENTED")
            return ExecHandled(eid, exec_id, kind, False, f"thrown: unknown exec kind {member}")
        call = self._link_exec(run, args_msg, kind, exec_id)
        req = ExecRequest(eid, exec_id, kind, json_format.MessageToDict(args_msg, preserving_proto_field_name=True),
                          call, bytes(ex.SerializeToString()))
        if kind == "mcp":
            req.args["args"] = tool_args.mcp_args_to_json(args_msg.args)  # type: ignore[attr-defined]

        async def respond(result: Any) -> None:
            parts = caller_result(kind, args_msg, result)
            req.answered = True
            run.unanswered.pop(eid, None)
            await self._send_result(run, eid, exec_id, kind, args_msg, parts)

        async def fail(error: str) -> None:
            req.answered = True
            run.unanswered.pop(eid, None)
            await self._throw(run, eid, error)

        req._respond, req._fail = respond, fail
        run.unanswered[eid] = req
        return req

    async def _send_result(self, run: ClientRun, eid: int, exec_id: str, kind: str, args_msg: Any, parts: ResultParts,
                           force_close: bool = False, already_sent: int = 0) -> None:
        """Send ``parts`` (the first ``already_sent`` of them went out while the exec ran), then close
        as the policy says."""
        if kind == "shell_stream":
            parts = final_shell_result(args_msg, parts)
        for field_name, message in parts[already_sent:]:
            ecm = pb.ExecClientMessage(id=eid, exec_id=exec_id)
            getattr(ecm, field_name).CopyFrom(message)
            await run.send({"exec_client_message": ecm})
        if force_close:
            await self._close(run, eid)
        elif not self.closes_after_result(kind):
            run.unclosed_by_policy.append(eid)
        elif "no_stream_close" in self.faults:
            run.unclosed.append(eid)
        else:
            await self._close(run, eid)

    async def _throw(self, run: ClientRun, eid: int, error: str, code: str = "") -> None:
        await run.send({"exec_client_control_message": pb.ExecClientControlMessage(
            throw=pb.ExecClientThrow(id=eid, error=error, error_code=code))})
        if "no_stream_close" not in self.faults:
            await self._close(run, eid)

    async def _close(self, run: ClientRun, eid: int) -> None:
        await run.send({"exec_client_control_message": pb.ExecClientControlMessage(
            stream_close=pb.ExecClientStreamClose(id=eid))})


def _refusal(parts: ResultParts) -> str | None:
    """The reason when a local answer is a refusal (rejected / permission denied), else None."""
    for _, message in parts:
        which = message.WhichOneof("event" if "event" in message.DESCRIPTOR.oneofs_by_name else "result")
        if which in ("rejected", "permission_denied"):
            sub = getattr(message, which)
            return str(getattr(sub, "reason", "") or getattr(sub, "error", "") or which)
    return None
