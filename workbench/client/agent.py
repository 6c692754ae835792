"""``AgentClient``: the built-in agent client (one turn = one run on the chosen transport).

It meets the client obligations of docs/protocol.md §5: a run_request with conversation_state (even
empty), answers to every KV get/set (SHA-256-keyed in-memory blob store) and interaction query,
exec results closed as its close policy says (``workbench.client.execs``: ``always`` or the
real clients' ``streams-only``; throw on failure or unknown exec kinds), client heartbeats, the
last checkpoint echoed with the same conversation_id on the next turn. After ``turn_ended`` it
reads on until the server ends the response, as real clients do, and says so when that end never
comes (a proxy holding it back). Fault switches break these obligations on purpose so the known
client bugs can be reproduced against a backend.

Answering execs lives in ``execs.py`` (``ExecAnswers``) and how a turn ends — reading on after
``turn_ended``, the end that never comes, a heartbeat stall — in ``turn_end.py`` (``TurnEnding``);
``AgentClient`` holds one of each, built from its settings. A run's state is ``run.ClientRun``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from workbench.client._pb import pb
from workbench.client.blobs import BlobStore
from workbench.client.connections import Connections
from workbench.client.events import (
    AgentError,
    CallState,
    Checkpoint,
    Error,
    Event,
    ExecHandled,
    ExecRequest,
    KvSet,
    StreamEndMissing,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    TurnEnded,
    TurnResult,
    TurnRetried,
)
from workbench.client.execs import CLOSE_POLICIES, ExecAnswers, check_close_policy
from workbench.client.localexec import LocalExecutor
from workbench.client.misbehave import check_watchdog, lost_after_turn, watchdog
from workbench.client.net import NetError, Verify, cancel_and_wait
from workbench.client.recording import FrameLogEntry, Journal, RunWire
from workbench.client.run import ClientRun
from workbench.client.toolcalls import ToolDef, describe_tool_call, final_args, tool_definition
from workbench.client.transport import (
    END_WAIT_S,
    FRAMINGS,
    TRANSPORTS,
    Channel,
    RunChannel,
    RunPollChannel,
    RunSSEChannel,
    TransportError,
    list_usable_models,
)
from workbench.client.turn_end import TurnEnding, error_from
from workbench.protocol import args as tool_args
from workbench.protocol.labels import prompt_label

FAULTS = frozenset({"no_stream_close", "naive_args_concat", "reuse_session", "omit_conversation_state",
                    "reset_append_seqno", "forget_blobs", "ignore_unknown_exec"})
# After turn_ended, how long a turn waits for the server to end the response before saying so.
END_TIMEOUT_S = 30.0

__all__ = ["CLOSE_POLICIES", "END_TIMEOUT_S", "FAULTS", "AgentClient", "AgentError", "ClientRun", "Connections",
           "FrameLogEntry", "ToolDef", "describe_tool_call", "final_args", "tool_definition"]


class AgentClient:
    """A client for ``agent.v1.AgentService`` (see docs/client.md for the full API)."""

    def __init__(self, base_url: str, token: str, transport: str = "run", workspace: str | os.PathLike[str] | None = None,
                 execute_locally: bool = False, faults: Iterable[str] = (), heartbeat_budget: int | None = None,
                 heartbeat_interval: float = 5.0, verify: Verify = None, record_to: Any = None,
                 model: str = "default", connections: Connections | None = None, close_policy: str = "always",
                 allow_shell: bool = False, wait_for_end: bool = True, end_timeout: float = END_TIMEOUT_S,
                 framing: str = "connect", answer_request_context: bool = True, retry_after_turn: int = 0,
                 watchdog: float | None = None, watchdog_action: str = "cancel") -> None:
        if transport not in TRANSPORTS:
            raise ValueError(f"transport {transport!r}: choose one of {', '.join(TRANSPORTS)}")
        if framing not in FRAMINGS:
            raise ValueError(f"framing {framing!r}: choose one of {', '.join(FRAMINGS)}")
        self.framing = framing  # connect | grpc-web (mode D), see client/transport.py
        bad = set(faults) - FAULTS
        if bad:
            raise ValueError(f"unknown fault(s) {', '.join(sorted(bad))}; known: {', '.join(sorted(FAULTS))}")
        if not token:
            raise ValueError("token is empty: the backend requires 'authorization: Bearer <token>'")
        if execute_locally and workspace is None:
            raise ValueError("execute_locally needs a workspace folder to confine execution to")
        if allow_shell and not execute_locally:
            raise ValueError("allow_shell only makes sense with execute_locally (and a workspace)")
        if end_timeout <= 0:
            raise ValueError(f"end_timeout must be > 0 seconds, not {end_timeout}")
        self.close_policy = check_close_policy(close_policy)
        check_watchdog(watchdog, watchdog_action)
        if retry_after_turn < 0:
            raise ValueError(f"retry_after_turn is a number of retries >= 0, not {retry_after_turn}")
        # Misbehaving on purpose (misbehave.py): retries of a completed turn, a stream watchdog.
        self.retry_after_turn = retry_after_turn
        self.watchdog = watchdog
        self.watchdog_action = watchdog_action
        # False: the context (environment, tools) goes in the run request only and request_context_args
        # is never answered, as stateless proxies do (docs/protocol.md §5; the service goes on without it).
        self.answer_request_context = answer_request_context
        self.wait_for_end = wait_for_end
        self.end_timeout = end_timeout
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.transport = transport
        self.workspace = str(Path(workspace).resolve()) if workspace is not None else os.getcwd()
        self.executor = (LocalExecutor(workspace, allow_shell=allow_shell, secrets=(token,))
                         if execute_locally and workspace is not None else None)
        self.faults = frozenset(faults)
        self.heartbeat_budget = heartbeat_budget
        self.heartbeat_interval = heartbeat_interval
        self.verify = verify
        self.default_model = model
        self.blobs = BlobStore()
        self.frame_log: list[FrameLogEntry] = []
        self.conversation_id: str | None = None
        self.checkpoint: bytes | None = None
        self.last_request_id: str | None = None
        self._own_conns = connections is None
        self.connections = connections or Connections(self.base_url, verify)
        self._parked: ClientRun | None = None
        self._last_run: ClientRun | None = None  # the run a turn's events came from (for a retry)
        self._journal = Journal(record_to) if record_to is not None else None
        self.execs = ExecAnswers(executor=self.executor, faults=self.faults, close_policy=self.close_policy,
                                 heartbeat_interval=heartbeat_interval, answer_request_context=answer_request_context,
                                 request_context=self._request_context)
        self.ending = TurnEnding(end_timeout=end_timeout, heartbeat_budget=heartbeat_budget, dispatch=self._dispatch)

    def __repr__(self) -> str:  # never show the token
        return (f"AgentClient({self.base_url!r}, transport={self.transport!r}, close_policy={self.close_policy!r}, "
                f"faults={sorted(self.faults)})")

    # lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._parked is not None:
            await self._close_run(self._parked)
            self._parked = None
        if self._own_conns:
            await self.connections.aclose()
        if self._journal is not None:
            self._journal.close()
            self._journal = None

    # recording ------------------------------------------------------------------------------

    def _record_session(self, run: ClientRun, prompt: str) -> None:
        if self._journal is None:
            return
        meta: dict[str, Any] = {"close_policy": self.close_policy}
        if not self.answer_request_context:
            meta["request_context"] = "run_request_only"
        if self.faults:
            meta["faults"] = sorted(self.faults)
        rid = run.channel.request_id
        self._journal.open_session(
            rid, transport=self.transport, request_id=rid, conversation_id=self.conversation_id, model=run.model,
            client_version=f"workbench-client ({self.transport})", host=self.base_url, meta=meta,
            label=prompt_label(prompt))

    def _finish_session(self, run: ClientRun) -> None:
        """The run's channel is closed: its recording gets the status of what the wire showed
        (``workbench.client.ending``), the same a capture of these bytes gets."""
        if self._journal is not None:
            ch = run.channel
            self._journal.finish_session(ch.request_id, ch.seen.exchange_end(ch.transport, ch.framing),
                                         ch.seen.refused)

    # building messages ----------------------------------------------------------------------

    def _request_context(self, tools: Iterable[Any]) -> Any:
        env = pb.RequestContextEnv(os_version=f"{platform.system()} {platform.release()}",
                                   workspace_paths=[self.workspace], shell=os.environ.get("SHELL", "/bin/sh"),
                                   time_zone=time.strftime("%Z") or "UTC", project_folder=self.workspace)
        return pb.RequestContext(env=env, tools=list(tools))

    def build_run_request(self, prompt: str, model: str, tools: Sequence[Any], conversation_id: str) -> bytes:
        req = pb.AgentRunRequest(conversation_id=conversation_id)
        if "omit_conversation_state" not in self.faults:
            # Always present, even empty (`0a 00`): the server rejects a run without it (docs/protocol.md §7).
            req.conversation_state.SetInParent()
            if self.checkpoint:
                req.conversation_state.ParseFromString(self.checkpoint)
        uma = req.action.user_message_action
        uma.user_message.CopyFrom(pb.UserMessage(text=prompt, message_id=str(uuid.uuid4()), mode=1))
        uma.request_context.CopyFrom(self._request_context(tools))
        req.model_details.model_id = model
        req.model_details.display_model_id = model
        req.mcp_tools.SetInParent()
        req.mcp_tools.mcp_tools.extend(tools)
        return bytes(pb.AgentClientMessage(run_request=req).SerializeToString())

    # transport ------------------------------------------------------------------------------

    async def _channel(self) -> Channel:
        rid = str(uuid.uuid4())
        wire = RunWire(self.frame_log, self._journal, rid)  # the session id is the run's request id
        if self.transport == "run":
            return RunChannel(self.base_url, self._token, wire, await self.connections.h2(), request_id=rid,
                              framing=self.framing)
        cls = RunSSEChannel if self.transport == "runsse" else RunPollChannel
        return cls(self.base_url, self._token, wire, self.connections.http(), request_id=rid,
                   reset_seqno="reset_append_seqno" in self.faults, framing=self.framing)

    async def _heartbeats(self, run: ClientRun) -> None:
        beat = bytes(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())
        while not run.channel.closed:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(Exception):
                await run.channel.send(beat)

    async def _close_run(self, run: ClientRun) -> None:
        await cancel_and_wait([task for task, _, _ in run.local.values()] + run.aborted)
        if run.hb_task is not None:
            await cancel_and_wait([run.hb_task])
        if run.watchdog_task is not None and run.watchdog_task is not asyncio.current_task():
            await cancel_and_wait([run.watchdog_task])
        try:
            if run.ended and not run.end_settled:
                # The caller left at turn_ended (the proxy does): give the end a moment, so a
                # recording still ends with it, but never keep the caller waiting longer.
                await run.channel.settle(END_WAIT_S)
        finally:
            await run.channel.close()
            self._finish_session(run)

    # public API -----------------------------------------------------------------------------

    async def list_models(self) -> list[str]:
        """``GetUsableModels``: the model ids the backend offers (agent.v1, else aiserver.v1.AiService)."""
        return await list_usable_models(self.connections.http(), self.base_url, self._token, self.framing)

    async def stream_turn(self, prompt: str, model: str | None = None, tools: Sequence[ToolDef] | None = None,
                          conversation_id: str | None = None) -> AsyncIterator[Event]:
        """Run one turn, yielding events as they arrive (see docs/client.md).

        Stopping the iteration early abandons the run (the proxy does this when it hands an exec
        to its caller); under the ``reuse_session`` fault the run is parked instead and the next
        turn is written into it (same-session continuation, docs/protocol.md §6). With
        ``retry_after_turn`` a run whose transport failed after turn_ended is sent again
        (``TurnRetried``, then the new run's events).
        """
        request: bytes | None = None
        for attempt in range(self.retry_after_turn + 1):
            self._last_run = None
            # aclosing: a caller that stops early closes this run at once (its finally closes the channel)
            async with contextlib.aclosing(self._one_run(prompt, model, tools, conversation_id, request)) as run_events:
                async for ev in run_events:
                    yield ev
            run = self._last_run
            if run is None or attempt == self.retry_after_turn:
                return
            lost = await lost_after_turn(run)
            if lost is None:
                return
            yield TurnRetried(attempt + 1, f"the transport failed after a completed turn: {lost}")
            request = run.request

    async def _one_run(self, prompt: str, model: str | None, tools: Sequence[ToolDef] | None,
                       conversation_id: str | None, request: bytes | None) -> AsyncGenerator[Event, None]:
        """One run of a turn (``request``: the run request to send again, for a retry)."""
        model = model or self.default_model
        defs = [tool_definition(t) for t in tools or ()]
        run: ClientRun | None = None
        error: Error | None = None
        keep = False
        try:
            if "reuse_session" in self.faults and self._parked is not None and not self._parked.channel.closed:
                run = self._parked
                self._parked = None
                run.ended = False
                run.tools = defs
                action = pb.ConversationAction(user_message_action=pb.UserMessageAction(
                    user_message=pb.UserMessage(text=prompt, message_id=str(uuid.uuid4()), mode=1),
                    request_context=self._request_context(defs)))
                await run.send({"conversation_action": action})
            else:
                if self._parked is not None:
                    await self._close_run(self._parked)
                    self._parked = None
                self.conversation_id = conversation_id or self.conversation_id or str(uuid.uuid4())
                channel = await self._channel()
                run = ClientRun(channel, defs, model)
                self.last_request_id = channel.request_id
                self._record_session(run, prompt)
                run.request = request or self.build_run_request(prompt, model, defs, self.conversation_id)
                self._last_run = run
                await channel.open(run.request)
                run.hb_task = asyncio.create_task(self._heartbeats(run))
                if self.watchdog is not None:
                    run.watchdog_task = asyncio.create_task(watchdog(run, self.watchdog, self.watchdog_action))
                run.iterator = channel.incoming()
            async for ev in self._events(run):
                if isinstance(ev, Error):
                    error = ev
                yield ev
            keep = "reuse_session" in self.faults and error is None
        except (TransportError, NetError, OSError) as exc:
            error = error_from(exc)
            yield error
        except GeneratorExit:
            keep = "reuse_session" in self.faults and run is not None and run.unanswered != {}
            raise
        finally:
            if run is not None:
                if keep:
                    self._parked = run
                else:
                    # Closed first so appends still in flight are answered and recorded with the turn.
                    await self._close_run(run)

    async def run_turn(self, prompt: str, model: str | None = None, tools: Sequence[ToolDef] | None = None,
                       conversation_id: str | None = None,
                       on_exec: Callable[[ExecRequest], Awaitable[Any]] | None = None,
                       raise_on_error: bool = True) -> TurnResult:
        """Run a turn to the end and collect it. Exec requests the client does not run itself go to
        ``on_exec`` (its return value is the result); without one they are answered with throw."""
        res = TurnResult(conversation_id=self.conversation_id or "")
        async for ev in self.stream_turn(prompt, model, tools, conversation_id):
            res.events.append(ev)
            if isinstance(ev, TextDelta):
                res.text += ev.text
            elif isinstance(ev, ThinkingDelta):
                res.thinking += ev.text
            elif isinstance(ev, ToolCall):
                res.tool_calls.append(ev)
            elif isinstance(ev, ExecRequest):
                if on_exec is None:
                    await ev.fail(f"exec {ev.kind} is not handled by this caller")
                else:
                    try:
                        await ev.respond(await on_exec(ev))
                    except Exception as exc:
                        await ev.fail(f"{type(exc).__name__}: {exc}")
            elif isinstance(ev, TurnEnded):
                res.ended = True
                res.usage = ev.usage
            elif isinstance(ev, StreamEndMissing):
                res.end_missing = ev
            elif isinstance(ev, Error):
                res.error = ev
        res.request_id = self.last_request_id or ""
        res.conversation_id = self.conversation_id or ""
        if res.error is not None and raise_on_error:
            raise AgentError(res.error)
        return res

    # the turn -------------------------------------------------------------------------------

    async def _events(self, run: ClientRun) -> AsyncIterator[Event]:
        assert run.iterator is not None
        async for item in run.iterator:
            while run.done:
                yield run.done.pop(0)
            if item.kind != "message":
                last = self.ending.ended_by(run, item)
                if last is not None:
                    yield last
                return
            try:
                msg = pb.AgentServerMessage.FromString(item.payload)
            except DecodeError as exc:
                yield Error("internal", f"undecodable AgentServerMessage ({len(item.payload)} bytes): {exc}")
                return
            case = msg.WhichOneof("message")
            if case == "interaction_update" and msg.interaction_update.WhichOneof("message") == "heartbeat":
                if run.local or run.channel.delivering():
                    continue  # the wait is on our own exec or on our answer still in flight, not the server
                if run.heartbeats == 0:
                    run.first_heartbeat_at = time.monotonic()
                run.heartbeats += 1
                if self.heartbeat_budget is not None and run.heartbeats >= self.heartbeat_budget:
                    yield Error("heartbeat_budget", self.ending.stall_message(run))
                    return
                continue
            run.heartbeats = 0
            async for ev in self._dispatch(run, msg, case):
                yield ev
            if run.ended:
                while run.done:
                    yield run.done.pop(0)
                break
        else:
            return
        # turn_ended: the turn is complete, the response is not over yet (reuse_session keeps it open).
        if self.wait_for_end and "reuse_session" not in self.faults:
            async for ev in self.ending.until_end(run):
                yield ev

    async def _dispatch(self, run: ClientRun, msg: Any, case: str | None) -> AsyncIterator[Event]:
        if case == "interaction_update":
            iu = msg.interaction_update
            sub = iu.WhichOneof("message")
            run.last_kind = f"interaction_update.{sub}"
            for ev in self._update(run, iu, sub):
                yield ev
        elif case == "kv_server_message":
            run.last_kind = "kv_server_message"
            kv_ev = await self._kv(run, msg.kv_server_message)
            if kv_ev is not None:
                yield kv_ev
        elif case == "exec_server_message":
            run.last_kind = "exec_server_message"
            exec_ev = await self.execs.answer(run, msg.exec_server_message)
            if exec_ev is not None:
                yield exec_ev
        elif case == "conversation_checkpoint_update":
            run.last_kind = "conversation_checkpoint_update"
            ckpt = msg.conversation_checkpoint_update
            self.checkpoint = bytes(ckpt.SerializeToString())
            if ckpt.HasField("token_details"):
                run.usage.context_tokens = ckpt.token_details.used_tokens
                run.usage.max_tokens = ckpt.token_details.max_tokens
            yield Checkpoint(self.checkpoint)
        elif case == "interaction_query":
            run.last_kind = "interaction_query"
            await self._answer_query(run, msg.interaction_query)
        elif case == "exec_server_control_message":
            run.last_kind = "exec_server_control_message"
            ctl = msg.exec_server_control_message
            if ctl.HasField("abort"):
                run.unanswered.pop(ctl.abort.id, None)
                local = run.local.pop(ctl.abort.id, None)
                if local is not None:
                    task, exec_id, kind = local
                    task.cancel()
                    run.aborted.append(task)  # reaped (process killed and waited for) at close
                    run.done.append(ExecHandled(ctl.abort.id, exec_id, kind, False, "aborted by the server"))
        else:
            run.last_kind = f"AgentServerMessage.{case}"

    def _update(self, run: ClientRun, iu: Any, sub: str | None) -> list[Event]:
        if sub == "text_delta":
            return [TextDelta(iu.text_delta.text)]
        if sub == "thinking_delta":
            return [ThinkingDelta(iu.thinking_delta.text)]
        if sub == "token_delta":
            run.usage.output_tokens += iu.token_delta.tokens
            return []
        if sub == "turn_ended":
            run.ended = True
            run.ended_at = time.monotonic()
            return [TurnEnded(run.usage)]
        if sub in ("partial_tool_call", "tool_call_started", "tool_call_completed"):
            upd = getattr(iu, sub)
            st = self._call(run, upd.call_id)
            if upd.HasField("tool_call"):
                kind, name, typed, mcp = describe_tool_call(upd.tool_call)
                if kind:
                    st.kind = kind
                if name and (not st.name or kind != "mcp" or name != "mcp"):
                    st.name = name
                if typed is not None:
                    st.typed_args = typed
                if sub == "tool_call_completed" and mcp is not None:
                    st.completion_args = mcp
            if sub == "partial_tool_call" and upd.args_text_delta:
                st.deltas.append(upd.args_text_delta)
                st.args_text = (tool_args.naive_concat(st.deltas) if "naive_args_concat" in self.faults
                                else tool_args.accumulate_args_text(st.args_text, upd.args_text_delta))
            if sub == "tool_call_completed":
                st.completed = True
                return [ToolCall(st.call_id, st.name, final_args(st), st.exec_id, st.kind, st.args_text,
                                 st.completion_args)]
        return []

    def _call(self, run: ClientRun, call_id: str) -> CallState:
        st = run.calls.get(call_id)
        if st is None:
            st = run.calls[call_id] = CallState(call_id)
            run.call_order.append(call_id)
        return st

    async def _kv(self, run: ClientRun, kv: Any) -> Event | None:
        which = kv.WhichOneof("args")
        if which == "get_blob_args":
            data = self.blobs.get(bytes(kv.get_blob_args.blob_id))
            res = pb.GetBlobResult()
            if data is not None:
                res.blob_data = data
            await run.send({"kv_client_message": pb.KvClientMessage(id=kv.id, get_blob_result=res)})
            return None
        if which == "set_blob_args":
            blob_id, data = bytes(kv.set_blob_args.blob_id), bytes(kv.set_blob_args.blob_data)
            if "forget_blobs" not in self.faults:  # the fault: acknowledged, never kept (pi-cursor #25)
                self.blobs.put(data, blob_id)
            await run.send({"kv_client_message": pb.KvClientMessage(
                id=kv.id, set_blob_result=pb.SetBlobResult())})
            return KvSet(blob_id, data)
        # Unknown KV operation: answer with an empty result so the id is not left hanging.
        await run.send({"kv_client_message": pb.KvClientMessage(id=kv.id)})
        return None

    async def _answer_query(self, run: ClientRun, q: Any) -> None:
        which = q.WhichOneof("query")
        resp = pb.InteractionResponse(id=q.id)
        if which is not None:
            name = which.replace("_query", "_response").replace("_args", "_result")
            field = pb.InteractionResponse.DESCRIPTOR.fields_by_name.get(name)
            if field is not None and field.message_type is not None:
                sub = getattr(resp, name)
                if "rejected" in field.message_type.fields_by_name:
                    sub.rejected.reason = "not supported by the workbench client"
                else:
                    sub.SetInParent()
            elif field is not None:
                setattr(resp, name, b"")
        await run.send({"interaction_response": resp})

