"""``AgentClient``: the built-in agent client (one turn = one run on the chosen transport).

It meets the client obligations of PROTOCOL.md §7: a run_request with conversation_state (even
empty), answers to every KV get/set (SHA-256-keyed in-memory blob store) and interaction query,
exec results followed by stream_close (throw on failure or unknown exec kinds), client heartbeats,
the last checkpoint echoed with the same conversation_id on the next turn. Fault switches break
these obligations on purpose so the known client bugs can be reproduced against a backend.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import platform
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx
from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from workbench.client import args as A
from workbench.client._pb import pb
from workbench.client.blobs import BlobStore
from workbench.client.events import (
    AgentError,
    CallState,
    Checkpoint,
    Error,
    Event,
    ExecHandled,
    ExecRequest,
    KvSet,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    TurnEnded,
    TurnResult,
    Usage,
)
from workbench.client.localexec import LOCAL_KINDS, LocalExecutor, ResultParts, caller_result, result_field
from workbench.client.net import H2Connection, NetError, Verify, cancel_and_wait
from workbench.client.transport import (
    END_WAIT_S,
    FRAMINGS,
    MODELS_PATH,
    TRANSPORTS,
    Channel,
    RunChannel,
    RunPollChannel,
    RunSSEChannel,
    TransportError,
    make_http_client,
    unary,
)

if TYPE_CHECKING:
    from workbench.decode.classify import Frame

FAULTS = frozenset({"no_stream_close", "naive_args_concat", "reuse_session", "omit_conversation_state",
                    "reset_append_seqno"})


class FrameLogEntry(NamedTuple):
    """One agent message the client sent or received: exact AgentClientMessage/AgentServerMessage
    bytes (unwrapped from BidiAppend hex / BidiPoll base64), as a capture would store them."""

    ts_us: int
    direction: str  # "client" (client→server) | "server"
    transport: str  # "run" | "bidi_append" | "runsse" | "runpoll"
    data: bytes


ToolDef = Any  # a McpToolDefinition dict (see tool_definition) or message


class _RunWire:
    """One run's traffic: agent messages go to ``client.frame_log`` (kept in timestamp order:
    a BidiAppend is logged only once answered, possibly after later frames), wire frames to the
    client's recording journal under this run's session."""

    def __init__(self, client: AgentClient, session_id: str) -> None:
        self.client = client
        self.session_id = session_id
        self.recording = client._recorder is not None

    def message(self, ts_us: int, direction: str, transport: str, data: bytes) -> None:
        bisect.insort(self.client.frame_log, FrameLogEntry(ts_us, direction, transport, data),
                      key=lambda e: e.ts_us)

    def frame(self, ts_us: int, direction: str, transport: str, frame: Frame) -> None:
        self.client._journal.append((ts_us, self.session_id, direction, transport, frame))


def tool_definition(tool: ToolDef) -> Any:
    """A McpToolDefinition from a dict (``input_schema`` as a JSON schema dict) or a message."""
    if isinstance(tool, Message):
        return tool
    name = str(tool["name"])
    schema = tool.get("input_schema") or tool.get("parameters") or {"type": "object", "properties": {}}
    return pb.McpToolDefinition(
        name=name, description=str(tool.get("description") or ""),
        input_schema=schema if isinstance(schema, bytes) else A.encode_value(schema),
        provider_identifier=str(tool.get("provider_identifier") or ""),
        tool_name=str(tool.get("tool_name") or name))


def describe_tool_call(tc: Any) -> tuple[str, str, dict[str, Any] | None, dict[str, Any] | None]:
    """(kind, name, typed args as JSON, McpArgs map as JSON) of a ToolCall message."""
    member = tc.WhichOneof("tool")
    if member is None:
        return "", "", None, None
    kind = member.removesuffix("_tool_call")
    wrapper = getattr(tc, member)
    if not wrapper.HasField("args"):
        return kind, kind, None, None
    targs = wrapper.args
    if kind == "mcp":
        return kind, targs.tool_name or targs.name, None, A.mcp_args_to_json(targs.args)
    return kind, kind, json_format.MessageToDict(targs, preserving_proto_field_name=True), None


def final_args(st: CallState) -> dict[str, Any]:
    """The best reconstruction of a call's arguments (see ``args.merge_mcp_args``)."""
    streamed = A.parse_args_text(st.args_text)
    other = st.completion_args if st.completion_args is not None else st.exec_args
    if st.kind == "mcp" or other is not None:
        return A.merge_mcp_args(streamed, other)
    if streamed is not None:
        return streamed
    return dict(st.typed_args or {})


class Connections:
    """The HTTP/2 connection (Run) and httpx client (RunSSE/RunPoll/unary) to one upstream.

    One ``AgentClient`` owns its own; the proxy shares one between per-request clients so every
    OpenAI request reuses the warm TLS connection instead of paying a handshake in its TTFT.
    """

    def __init__(self, base_url: str, verify: Verify = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.verify = verify
        self._h2: H2Connection | None = None
        self._http: httpx.AsyncClient | None = None
        self._lock = asyncio.Lock()
        self._retired: list[H2Connection] = []

    async def h2(self) -> H2Connection:
        async with self._lock:
            if self._h2 is None or not self._h2.usable:
                if self._h2 is not None:
                    # After a GOAWAY, streams already running may finish: retire, don't cut.
                    if self._h2.active_streams and not self._h2.closed:
                        self._retired.append(self._h2)
                    else:
                        await self._h2.close()
                self._h2 = H2Connection(self.base_url, self.verify)
                try:
                    await self._h2.connect()
                except BaseException:
                    self._h2 = None
                    raise
            return self._h2

    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = make_http_client(self.verify)
        return self._http

    async def aclose(self) -> None:
        for old in self._retired:
            await old.close()
        self._retired.clear()
        if self._h2 is not None:
            await self._h2.close()
            self._h2 = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None


class _Run:
    """One open run: its channel and per-turn state."""

    def __init__(self, channel: Channel, tools: list[Any], model: str) -> None:
        self.channel = channel
        self.tools = tools
        self.model = model
        self.calls: dict[str, CallState] = {}
        self.call_order: list[str] = []
        self.usage = Usage()
        self.heartbeats = 0
        self.first_heartbeat_at = 0.0
        self.last_kind = ""
        self.unclosed: list[int] = []  # exec ids answered without stream_close
        self.unanswered: dict[int, ExecRequest] = {}
        self.ended = False
        self.hb_task: asyncio.Task[None] | None = None
        # exec id → (task, exec_id, kind) of a local execution in progress
        self.local: dict[int, tuple[asyncio.Task[None], str, str]] = {}
        self.aborted: list[asyncio.Task[None]] = []
        self.done: list[Event] = []  # ExecHandled of finished local execs, yielded at the next frame
        self.iterator: AsyncIterator[Any] | None = None


class AgentClient:
    """A client for ``agent.v1.AgentService`` (see docs/client.md for the full API)."""

    def __init__(self, base_url: str, token: str, transport: str = "run", workspace: str | os.PathLike[str] | None = None,
                 execute_locally: bool = False, faults: Iterable[str] = (), heartbeat_budget: int | None = None,
                 heartbeat_interval: float = 5.0, verify: Verify = None, record_to: Any = None,
                 model: str = "default", connections: Connections | None = None, framing: str = "connect") -> None:
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
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.transport = transport
        self.workspace = str(Path(workspace).resolve()) if workspace is not None else os.getcwd()
        self.executor = LocalExecutor(workspace) if execute_locally and workspace is not None else None
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
        self._parked: _Run | None = None
        self._recorder: Any = None
        self._store: Any = None
        self._own_store = False
        self._session_id: str | None = None
        # Recorded frames wait here until the turn is over, then go to the Recorder sorted by
        # timestamp (appends are only known to be sent once answered, after later frames).
        self._journal: list[tuple[int, str, str, str, Frame]] = []
        if record_to is not None:
            self._open_recorder(record_to)

    def __repr__(self) -> str:  # never show the token
        return f"AgentClient({self.base_url!r}, transport={self.transport!r}, faults={sorted(self.faults)})"

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
        if self._recorder is not None:
            self._drain_journal()
            self._recorder.flush()
            if self._own_store:
                self._store.close()
            self._recorder = None

    # recording ------------------------------------------------------------------------------

    def _open_recorder(self, record_to: Any) -> None:
        from workbench.store.db import Store
        from workbench.store.recorder import Recorder

        if isinstance(record_to, Store):
            self._store = record_to
        else:
            self._store = Store(record_to)
            self._own_store = True
        self._recorder = Recorder(self._store)

    def _drain_journal(self) -> None:
        if self._recorder is None or not self._journal:
            return
        self._journal.sort(key=lambda j: j[0])
        for ts, sid, direction, transport, frame in self._journal:
            self._recorder.add(sid, ts, direction, transport, None, frame)
        self._journal.clear()

    def _record_session(self, run: _Run) -> None:
        if self._recorder is None:
            return
        from workbench.store.db import SessionInfo

        self._session_id = run.channel.request_id
        self._recorder.open_session(SessionInfo(
            session_id=run.channel.request_id, source="client", transport=self.transport,
            request_id=run.channel.request_id, conversation_id=self.conversation_id, model=run.model,
            client_version=f"workbench-client ({self.transport})", host=self.base_url,
            meta={"faults": sorted(self.faults)} if self.faults else {}))

    def _finish_session(self, run: _Run, error: Error | None) -> None:
        if self._recorder is None or self._session_id is None:
            return
        self._drain_journal()
        info = self._recorder.sessions.get(self._session_id)
        if info is not None:
            info.status = "error" if error else ("complete" if run.ended else "incomplete")
            info.error = f"{error.code}: {error.message}" if error else None
            self._recorder.touch(self._session_id)
        self._recorder.flush()

    # building messages ----------------------------------------------------------------------

    def _request_context(self, tools: Sequence[Any]) -> Any:
        env = pb.RequestContextEnv(os_version=f"{platform.system()} {platform.release()}",
                                   workspace_paths=[self.workspace], shell=os.environ.get("SHELL", "/bin/sh"),
                                   time_zone=time.strftime("%Z") or "UTC", project_folder=self.workspace)
        return pb.RequestContext(env=env, tools=list(tools))

    def build_run_request(self, prompt: str, model: str, tools: Sequence[Any], conversation_id: str) -> bytes:
        req = pb.AgentRunRequest(conversation_id=conversation_id)
        if "omit_conversation_state" not in self.faults:
            # Always present, even empty (`0a 00`): the server rejects a run without it (§13 #6).
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
        wire = _RunWire(self, rid)  # the session id is the run's request id
        if self.transport == "run":
            return RunChannel(self.base_url, self._token, wire, await self.connections.h2(), request_id=rid,
                              framing=self.framing)
        cls = RunSSEChannel if self.transport == "runsse" else RunPollChannel
        return cls(self.base_url, self._token, wire, self.connections.http(), request_id=rid,
                   reset_seqno="reset_append_seqno" in self.faults, framing=self.framing)

    async def _send(self, run: _Run, msg: Any) -> None:
        await run.channel.send(bytes(pb.AgentClientMessage(**msg).SerializeToString())
                               if isinstance(msg, dict) else msg)

    async def _heartbeats(self, run: _Run) -> None:
        beat = bytes(pb.AgentClientMessage(client_heartbeat=pb.ClientHeartbeat()).SerializeToString())
        while not run.channel.closed:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(Exception):
                await run.channel.send(beat)

    async def _exec_heartbeats(self, run: _Run, eid: int) -> None:
        # Newer CLIs keep a long local exec alive with ExecClientHeartbeat{id} (PROTOCOL.md §7).
        beat = bytes(pb.AgentClientMessage(exec_client_control_message=pb.ExecClientControlMessage(
            heartbeat=pb.ExecClientHeartbeat(id=eid))).SerializeToString())
        while not run.channel.closed:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(Exception):
                await run.channel.send(beat)

    async def _close_run(self, run: _Run) -> None:
        await cancel_and_wait([task for task, _, _ in run.local.values()] + run.aborted)
        if run.hb_task is not None:
            await cancel_and_wait([run.hb_task])
        try:
            if run.ended:
                await run.channel.settle(END_WAIT_S)
        finally:
            await run.channel.close()

    # public API -----------------------------------------------------------------------------

    async def list_models(self) -> list[str]:
        """``GetUsableModels``: the model ids the backend offers."""
        body = await unary(self.connections.http(), self.base_url, self._token, MODELS_PATH)
        return _model_ids(body)

    async def stream_turn(self, prompt: str, model: str | None = None, tools: Sequence[ToolDef] | None = None,
                          conversation_id: str | None = None) -> AsyncIterator[Event]:
        """Run one turn, yielding events as they arrive (see docs/client.md).

        Stopping the iteration early abandons the run (the proxy does this when it hands an exec
        to its caller); under the ``reuse_session`` fault the run is parked instead and the next
        turn is written into it (same-session continuation, PROTOCOL.md §13 #3).
        """
        model = model or self.default_model
        defs = [tool_definition(t) for t in tools or ()]
        run: _Run | None = None
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
                await self._send(run, {"conversation_action": action})
            else:
                if self._parked is not None:
                    await self._close_run(self._parked)
                    self._parked = None
                self.conversation_id = conversation_id or self.conversation_id or str(uuid.uuid4())
                channel = await self._channel()
                run = _Run(channel, defs, model)
                self.last_request_id = channel.request_id
                self._record_session(run)
                await channel.open(self.build_run_request(prompt, model, defs, self.conversation_id))
                run.hb_task = asyncio.create_task(self._heartbeats(run))
                run.iterator = channel.incoming()
            async for ev in self._events(run):
                if isinstance(ev, Error):
                    error = ev
                yield ev
            keep = "reuse_session" in self.faults and error is None
        except (TransportError, NetError, OSError) as exc:
            error = _error_from(exc)
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
                self._finish_session(run, error)

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
            elif isinstance(ev, Error):
                res.error = ev
        res.request_id = self.last_request_id or ""
        res.conversation_id = self.conversation_id or ""
        if res.error is not None and raise_on_error:
            raise AgentError(res.error)
        return res

    # the turn -------------------------------------------------------------------------------

    async def _events(self, run: _Run) -> AsyncIterator[Event]:
        assert run.iterator is not None
        async for item in run.iterator:
            while run.done:
                yield run.done.pop(0)
            if item.kind == "error":
                yield _error_from(item.error)
                return
            if item.kind == "end":
                end = item.end
                if end is not None and end.is_error:
                    yield Error(end.code or "unknown", end.message or "", end.details)
                elif not run.ended:
                    yield Error("incomplete", f"the {run.channel.transport} stream ended without turn_ended "
                                f"(last frame: {run.last_kind or 'none'}); the turn is incomplete and retryable")
                return
            try:
                msg = pb.AgentServerMessage.FromString(item.payload)
            except DecodeError as exc:
                yield Error("internal", f"undecodable AgentServerMessage ({len(item.payload)} bytes): {exc}")
                return
            case = msg.WhichOneof("message")
            if case == "interaction_update" and msg.interaction_update.WhichOneof("message") == "heartbeat":
                if run.local:
                    continue  # the wait is on our own exec, not the server
                if run.heartbeats == 0:
                    run.first_heartbeat_at = time.monotonic()
                run.heartbeats += 1
                if self.heartbeat_budget is not None and run.heartbeats >= self.heartbeat_budget:
                    yield Error("heartbeat_budget", self._stall_message(run))
                    return
                continue
            run.heartbeats = 0
            async for ev in self._dispatch(run, msg, case):
                yield ev
            if run.ended:
                while run.done:
                    yield run.done.pop(0)
                return

    def _stall_message(self, run: _Run) -> str:
        secs = time.monotonic() - run.first_heartbeat_at
        msg = (f"gave up after {run.heartbeats} consecutive server heartbeats ({secs:.1f} s) with no progress "
               f"(heartbeat budget {self.heartbeat_budget}; last other frame: {run.last_kind or 'none'})")
        if run.unclosed:
            ids = ", ".join(map(str, run.unclosed))
            msg += (f"; exec id {ids} got a result but no stream_close, so the server is still waiting on it "
                    "(PROTOCOL.md §13 #1)")
        elif run.unanswered:
            ids = ", ".join(map(str, run.unanswered))
            msg += f"; exec id {ids} was never answered (PROTOCOL.md §13 #2)"
        else:
            msg += "; the server sent only heartbeats and no turn_ended (PROTOCOL.md §13 #3/#8)"
        return msg

    async def _dispatch(self, run: _Run, msg: Any, case: str | None) -> AsyncIterator[Event]:
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
            exec_ev = await self._exec(run, msg.exec_server_message)
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

    def _update(self, run: _Run, iu: Any, sub: str | None) -> list[Event]:
        if sub == "text_delta":
            return [TextDelta(iu.text_delta.text)]
        if sub == "thinking_delta":
            return [ThinkingDelta(iu.thinking_delta.text)]
        if sub == "token_delta":
            run.usage.output_tokens += iu.token_delta.tokens
            return []
        if sub == "turn_ended":
            run.ended = True
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
                st.args_text = (A.naive_concat(st.deltas) if "naive_args_concat" in self.faults
                                else A.accumulate_args_text(st.args_text, upd.args_text_delta))
            if sub == "tool_call_completed":
                st.completed = True
                return [ToolCall(st.call_id, st.name, final_args(st), st.exec_id, st.kind, st.args_text,
                                 st.completion_args)]
        return []

    def _call(self, run: _Run, call_id: str) -> CallState:
        st = run.calls.get(call_id)
        if st is None:
            st = run.calls[call_id] = CallState(call_id)
            run.call_order.append(call_id)
        return st

    async def _kv(self, run: _Run, kv: Any) -> Event | None:
        which = kv.WhichOneof("args")
        if which == "get_blob_args":
            data = self.blobs.get(bytes(kv.get_blob_args.blob_id))
            res = pb.GetBlobResult()
            if data is not None:
                res.blob_data = data
            await self._send(run, {"kv_client_message": pb.KvClientMessage(id=kv.id, get_blob_result=res)})
            return None
        if which == "set_blob_args":
            blob_id, data = bytes(kv.set_blob_args.blob_id), bytes(kv.set_blob_args.blob_data)
            self.blobs.put(data, blob_id)
            await self._send(run, {"kv_client_message": pb.KvClientMessage(
                id=kv.id, set_blob_result=pb.SetBlobResult())})
            return KvSet(blob_id, data)
        # Unknown KV operation: answer with an empty result so the id is not left hanging.
        await self._send(run, {"kv_client_message": pb.KvClientMessage(id=kv.id)})
        return None

    async def _answer_query(self, run: _Run, q: Any) -> None:
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
        await self._send(run, {"interaction_response": resp})

    def _link_exec(self, run: _Run, args_msg: Any, kind: str, exec_id: str) -> CallState | None:
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
                st.exec_args = A.mcp_args_to_json(args_msg.args)  # type: ignore[attr-defined]
                if not st.name or st.name == "mcp":
                    st.name = args_msg.tool_name or args_msg.name  # type: ignore[attr-defined]
        return st

    async def _run_local(self, run: _Run, eid: int, exec_id: str, kind: str, args_msg: Any) -> None:
        assert self.executor is not None
        beats = asyncio.create_task(self._exec_heartbeats(run, eid))
        try:
            parts = await self.executor.run(kind, args_msg)
        except Exception as exc:
            await self._throw(run, eid, f"{type(exc).__name__}: {exc}")
            run.done.append(ExecHandled(eid, exec_id, kind, False, f"thrown: {exc}"))
            return
        finally:
            beats.cancel()
            run.local.pop(eid, None)
        await self._send_result(run, eid, exec_id, parts)
        run.done.append(ExecHandled(eid, exec_id, kind, True, "executed locally"))

    async def _exec(self, run: _Run, ex: Any) -> Event | None:
        member = ex.WhichOneof("args")
        eid, exec_id = ex.id, ex.exec_id
        if member is None or not member.endswith("_args"):
            await self._throw(run, eid, f"unknown exec kind (no known args member in ExecServerMessage id {eid})",
                              "UNIMPLEMENTED")
            return ExecHandled(eid, exec_id, member or "unknown", False, "thrown: unknown exec kind")
        kind = member.removesuffix("_args")
        args_msg = getattr(ex, member)
        if kind == "request_context":
            parts: ResultParts = [("request_context_result", pb.RequestContextResult(
                success=pb.RequestContextSuccess(request_context=self._request_context(run.tools))))]
            # Always closed, even under no_stream_close: the documented hang is a tool handler's.
            await self._send_result(run, eid, exec_id, parts, close=True)
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
            req.args["args"] = A.mcp_args_to_json(args_msg.args)  # type: ignore[attr-defined]

        async def respond(result: Any) -> None:
            parts = caller_result(kind, args_msg, result)
            req.answered = True
            run.unanswered.pop(eid, None)
            await self._send_result(run, eid, exec_id, parts)

        async def fail(error: str) -> None:
            req.answered = True
            run.unanswered.pop(eid, None)
            await self._throw(run, eid, error)

        req._respond, req._fail = respond, fail
        run.unanswered[eid] = req
        return req

    async def _send_result(self, run: _Run, eid: int, exec_id: str, parts: ResultParts,
                           close: bool = False) -> None:
        for field_name, message in parts:
            ecm = pb.ExecClientMessage(id=eid, exec_id=exec_id)
            getattr(ecm, field_name).CopyFrom(message)
            await self._send(run, {"exec_client_message": ecm})
        if "no_stream_close" in self.faults and not close:
            run.unclosed.append(eid)
            return
        await self._send(run, {"exec_client_control_message": pb.ExecClientControlMessage(
            stream_close=pb.ExecClientStreamClose(id=eid))})

    async def _throw(self, run: _Run, eid: int, error: str, code: str = "") -> None:
        await self._send(run, {"exec_client_control_message": pb.ExecClientControlMessage(
            throw=pb.ExecClientThrow(id=eid, error=error, error_code=code))})


def _error_from(exc: BaseException | None) -> Error:
    if isinstance(exc, TransportError):
        return Error(exc.code, exc.message, exc.details, exc.http_status)
    return Error("transport", str(exc) if exc else "unknown transport failure")


def _model_ids(body: bytes) -> list[str]:
    """Model ids from a GetUsableModels answer. The overlay does not model the response, so read it
    schemalessly: each top-level length-delimited field 1 is a model whose field 1 is its id."""
    ids: list[str] = []
    for num, value in _fields(body):
        if num == 1 and isinstance(value, bytes):
            inner = [v for n, v in _fields(value) if n == 1 and isinstance(v, bytes)]
            if inner:
                ids.append(inner[0].decode("utf-8", "replace"))
    return ids


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return out, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """Top-level (number, value) pairs; [] when the bytes are not a protobuf message."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    try:
        while pos < len(buf):
            tag, pos = _varint(buf, pos)
            num, wt = tag >> 3, tag & 7
            if wt == 0:
                v, pos = _varint(buf, pos)
                out.append((num, v))
            elif wt == 2:
                n, pos = _varint(buf, pos)
                if pos + n > len(buf):
                    return []
                out.append((num, buf[pos:pos + n]))
                pos += n
            elif wt == 1:
                pos += 8
            elif wt == 5:
                pos += 4
            else:
                return []
    except ValueError:
        return []
    return out
