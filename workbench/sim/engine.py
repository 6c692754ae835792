"""The simulated agent backend's turn logic: a transport ``Handler`` that plays scenarios.

One ``SimBackend`` holds what outlives a run (its blob store, the checkpoints of the
conversations it has seen, the record of every run) and validates each run the way the real
service does: a bearer token, a known model, a ``conversation_state`` present. Everything a run
sends comes from its scenario's steps; the waits (KV results, exec answers under the
``stream_close`` policy of ``exec_completion``) are where a client's mistakes show, and while
waiting the run heartbeats just as the real server parks a run (docs/protocol.md §5, §7). A fresh
run whose request carries the history of answered tool calls continues after them (``history``).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, struct_pb2

from workbench.schema import pb
from workbench.sim import history as H
from workbench.sim.exec_completion import (
    DEFAULT_POLICY,
    ExecRecord,
    ExecWait,
    exec_numeric_id_of,
    resolve,
    server_policy,
)
from workbench.sim.models import LISTING_CHOICES, listing_handlers
from workbench.sim.scenario import (
    DEFAULT_SCENARIO,
    Scenario,
    ScenarioError,
    load_scenarios,
    marker_in,
    unknown_scenario_message,
    verb_of,
)
from workbench.sim.transport import (
    AgentConnection,
    ConnectionClosed,
    UnaryRequest,
    UnaryResponse,
    connect_error,
)

log = logging.getLogger("workbench.sim")

GET_SERVER_CONFIG = "/aiserver.v1.ServerConfigService/GetServerConfig"
DEFAULT_MODELS = ("default", "auto", "claude-4-sonnet", "claude-4-sonnet-thinking", "claude-4.5-sonnet",
                  "gpt-5", "gpt-5-codex", "composer-1", "grok-code-fast-1")
ERROR_NUMBERS = {"ERROR_NOT_LOGGED_IN": 2, "ERROR_BAD_MODEL_NAME": 5, "ERROR_OPENAI": 13,
                 "ERROR_OUTDATED_CLIENT": 30, "ERROR_UNAUTHORIZED": 38, "ERROR_RATE_LIMITED_CHANGEABLE": 51}
MAX_TOKENS = 200_000


@dataclass(slots=True)
class SimConfig:
    scenario: str = DEFAULT_SCENARIO  # for requests without a [scenario:NAME] marker
    scenario_dirs: list[str] = field(default_factory=list)
    token: str | None = None  # None: any non-empty bearer token is accepted
    heartbeat_interval: float = 2.0
    park_timeout: float | None = None  # None: a parked run heartbeats until the client leaves
    models: tuple[str, ...] = DEFAULT_MODELS
    pace: float = 0.0  # seconds between streamed deltas
    stream_close: str = DEFAULT_POLICY  # required | accepted | ignored (docs/sim.md "Exec completion")
    exec_stream_close: tuple[str, ...] = ()  # per exec type: "shell_stream=required", …
    model_listing: str = "both"  # which GetUsableModels to serve: both | agent | aiserver


@dataclass
class RunRecord:
    """What one run did, for tests, the CLI log and other tools' end-to-end checks."""

    index: int
    transport: str
    request_id: str | None
    framing: str = "connect"  # connect | grpc_web | grpc_web_text | grpc (workbench.sim.framing)
    scenario: str | None = None
    model: str | None = None
    conversation_id: str | None = None
    # "steps"; "continuation" (new run on a known conversation); "resumed" (new run after tool calls
    # handed out by an unfinished turn); "history" (fresh run whose request carries answered tool
    # calls: continued after them); "on_reuse" (the client continued inside the same run)
    path: str = "steps"
    client_kinds: list[str] = field(default_factory=list)
    sent_kinds: list[str] = field(default_factory=list)
    execs: list[ExecRecord] = field(default_factory=list)
    blob_misses: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    waiting_for: str | None = None  # set while the run is parked on a client answer
    heartbeats: int = 0
    outcome: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def summary(self) -> str:
        bits = [f"run {self.index}", self.transport, f"scenario={self.scenario}", f"model={self.model}"]
        if self.framing != "connect":
            bits.insert(2, self.framing)
        if self.path != "steps":
            bits.append(f"path={self.path}")
        bits.append(f"-> {self.outcome}")
        bits.append(f"(sent {len(self.sent_kinds)}, received {len(self.client_kinds)})")
        if self.blob_misses:
            bits.append(f"blob misses: {len(self.blob_misses)}")
        if self.faults:
            bits.append("faults: " + "; ".join(self.faults))
        return " ".join(bits)


class SimState:
    """Per-server memory: blobs (hex id → data), conversations (id → last checkpoint), runs.

    ``open_tools`` holds, per conversation whose last turn did not end, the tool calls already
    handed out to the client (call_id, name, args): a new run on that conversation resumes after
    them instead of asking again (what a client that answers tool calls with a fresh run needs).
    """

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.conversations: dict[str, bytes] = {}
        self.seen_conversations: set[str] = set()
        self.open_tools: dict[str, list[dict[str, Any]]] = {}
        self.runs: list[RunRecord] = []
        self._lock = threading.Lock()

    def new_run(self, transport: str, request_id: str | None) -> RunRecord:
        with self._lock:
            rec = RunRecord(len(self.runs) + 1, transport, request_id)
            self.runs.append(rec)
            return rec

    async def finished_runs(self, count: int, timeout: float = 30.0) -> list[RunRecord]:
        """Async twin of ``wait_runs`` for code on the simulator's own event loop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            runs = list(self.runs)
            if len(runs) >= count and all(r.finished.is_set() for r in runs[:count]):
                return runs
            if loop.time() > deadline:
                raise TimeoutError(f"expected {count} finished runs, have {[r.outcome for r in runs]}")
            await asyncio.sleep(0.02)

    def wait_runs(self, count: int, timeout: float = 30.0, finished: bool = True) -> list[RunRecord]:
        """Block until ``count`` runs exist (and have finished); from another thread than the server's."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                runs = list(self.runs)
            if len(runs) >= count and (not finished or all(r.finished.is_set() for r in runs[:count])):
                return runs
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {count} finished runs, have {[r.outcome for r in runs]}")
            time.sleep(0.02)


def error_detail(error: str, title: str = "", detail: str = "", is_retryable: bool = False,
                 is_expected: bool = True) -> dict[str, Any]:
    """A Connect ``details[]`` entry carrying a real aiserver.v1.ErrorDetails (value + debug)."""
    num = ERROR_NUMBERS.get(error)
    if num is None:
        raise ValueError(f"unknown ErrorDetails error {error!r} (known: {', '.join(ERROR_NUMBERS)})")
    msg = pb.ErrorDetails(error=num, is_expected=is_expected,
                          details=pb.CustomErrorDetails(title=title, detail=detail, is_retryable=is_retryable))
    value = base64.b64encode(msg.SerializeToString()).decode().rstrip("=")
    return {"type": "aiserver.v1.ErrorDetails", "value": value,
            "debug": {"error": error, "details": {"title": title, "detail": detail, "isRetryable": is_retryable},
                      "isExpected": is_expected}}


def error_doc(code: str, message: str, error: str | None = None, title: str = "", detail: str = "",
              is_retryable: bool = False, is_expected: bool = True) -> dict[str, Any]:
    details = [error_detail(error, title, detail, is_retryable, is_expected)] if error else None
    return connect_error(code, message, details)


class _Stop(Exception):
    """A step ended the stream; the remaining steps are skipped."""


class _ParkTimeout(Exception):
    pass


_EOF = object()
_TIMEOUT = object()


class SimBackend:
    def __init__(self, config: SimConfig | None = None) -> None:
        self.config = config or SimConfig()
        self.scenarios: dict[str, Scenario] = load_scenarios(self.config.scenario_dirs)
        if self.config.scenario not in self.scenarios:
            raise ScenarioError(unknown_scenario_message(self.config.scenario, self.scenarios))
        self.policy = server_policy(self.config.stream_close, self.config.exec_stream_close)
        if self.config.model_listing not in LISTING_CHOICES:
            raise ValueError(f"model_listing {self.config.model_listing!r}: choose {', '.join(LISTING_CHOICES)}")
        self.state = SimState()
        self.on_run_finished: list[Callable[[RunRecord], None]] = []

    async def handle(self, conn: AgentConnection) -> None:
        await _Run(self, conn).run()

    def auth(self, headers: Mapping[str, str]) -> dict[str, Any] | None:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return error_doc("unauthenticated", "Not logged in", "ERROR_NOT_LOGGED_IN", "Not logged in",
                             "No bearer token in the authorization header.")
        if self.config.token is not None and token != self.config.token:
            return error_doc("unauthenticated", "Not logged in", "ERROR_NOT_LOGGED_IN", "Not logged in",
                             "The bearer token is not the one this simulator was started with (--token).")
        return None

    @property
    def unary(self) -> dict[str, Callable[[UnaryRequest], Any]]:
        return {**listing_handlers(self.config.models, self.config.model_listing),
                GET_SERVER_CONFIG: self.get_server_config}

    async def get_server_config(self, req: UnaryRequest) -> UnaryResponse:
        # http2_config 0 (unspecified): the client keeps its own transport choice.
        return UnaryResponse(body=bytes(pb.GetServerConfigResponse().SerializeToString()))


def _blob_id(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _chunks(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n) if text else 0
    return [text[i:i + size] for i in range(0, len(text), size)] if text else [""]


def _prefixes(text: str, n: int) -> list[str]:
    """Cumulative snapshots, each a longer prefix, the last the whole text (docs/protocol.md §5, §7 args_cumulative_snapshots)."""
    n = max(1, n)
    cuts = sorted({max(1, len(text) * i // n) for i in range(1, n + 1)})
    return [text[:c] for c in cuts]


def _value_bytes(v: Any) -> bytes:
    return bytes(json_format.ParseDict(v, struct_pb2.Value()).SerializeToString())


class _SafeFormat(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


_SHELL_HINTS = ("shell", "bash", "terminal", "exec", "command", "run")
_HINTS = {"shell": _SHELL_HINTS, "shell_stream": _SHELL_HINTS, "read": ("read", "cat", "view", "open"),
          "write": ("write", "edit", "create", "save"), "ls": ("ls", "list", "dir"),
          "grep": ("grep", "search", "find"), "delete": ("delete", "remove", "rm"), "mcp": ("task",)}
_TOOL_NAMES = {"shell": "Shell", "shell_stream": "Shell", "read": "Read", "write": "Write", "ls": "LS",
               "grep": "Grep", "delete": "Delete"}


class _Run:
    def __init__(self, backend: SimBackend, conn: AgentConnection) -> None:
        self.b = backend
        self.cfg = backend.config
        self.conn = conn
        self.rec = backend.state.new_run(conn.transport, conn.request_id)
        framing = getattr(conn, "framing", None)  # transports other than ours may not say
        self.rec.framing = getattr(framing, "name", None) or "connect"
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.pending: list[Any] = []
        self.client_done = False
        self.cancelled = asyncio.Event()
        self.exec_seq = 0
        self.kv_seq = 0
        self.step_seq = 0
        self.loop = asyncio.get_running_loop()
        self.last_send = self.loop.time()
        self.started = time.monotonic()
        self.request: Any = None
        self.scenario: Scenario | None = None
        self.user_text = ""
        self.model = ""
        self.client_tools: list[Any] = []
        self.system_id: bytes | None = None
        self.user_id: bytes | None = None
        self.turn_steps: list[bytes] = []
        self.text_out = ""
        self.tokens_out = 0
        self.last_tool: dict[str, Any] = {}
        self.handed_out: list[dict[str, Any]] = []  # tool calls of this (possibly resumed) turn
        self.resume: list[dict[str, Any]] = []  # of those, the ones a previous run already handed out
        self.waits: dict[int, ExecWait] = {}  # every exec of the run, by id (answers absorbed after the end)
        self.history: H.History | None = None  # the answered tool calls a fresh run's request carried

    # lifecycle --------------------------------------------------------------------------------

    async def run(self) -> None:
        reader: asyncio.Task[None] | None = None
        body: asyncio.Task[None] | None = None
        cancel: asyncio.Task[Any] | None = None
        try:
            steps = await self._open()
            if steps is None:
                return
            reader = self.loop.create_task(self._reader())
            body = self.loop.create_task(self._play_turn(steps))
            cancel = self.loop.create_task(self.cancelled.wait())
            done, _ = await asyncio.wait({body, cancel}, return_when=asyncio.FIRST_COMPLETED)
            if body in done:
                cancel.cancel()
                body.result()
            else:
                body.cancel()
                await asyncio.gather(body, return_exceptions=True)
                self.rec.outcome = "cancelled"
                await self.conn.end()
        except _ParkTimeout as exc:
            self.rec.outcome = f"park timeout waiting for {exc}"
            await self.conn.end(connect_error(
                "deadline_exceeded", f"simulated run parked {self.cfg.park_timeout}s waiting for {exc}"))
        except ConnectionClosed:
            what = f" while waiting for {self.rec.waiting_for}" if self.rec.waiting_for else ""
            self.rec.outcome = self.rec.outcome or f"disconnected{what}"
        except asyncio.CancelledError:
            self.rec.outcome = self.rec.outcome or "server shutdown"
            raise
        finally:
            for task in (reader, body, cancel):
                if task is not None and not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if self.rec.outcome is None:
                self.rec.outcome = "ended"
            leftovers = [m for m in self.pending if not self._absorb(m)]
            if leftovers:
                unused = ", ".join(_describe(m) for m in leftovers)
                self.rec.faults.append(f"client messages the run never used: {unused}")
            self.rec.faults.extend(getattr(self.conn, "append_faults", []))
            self.rec.finished.set()
            for cb in self.b.on_run_finished:
                try:
                    cb(self.rec)
                except Exception:  # a logging callback must not break the server
                    log.exception("on_run_finished callback failed")

    async def _fail(self, doc: dict[str, Any]) -> None:
        self.rec.outcome = f"error:{doc.get('code')}"
        await self.conn.end(doc)

    async def _open(self) -> list[dict[str, Any]] | None:
        """Read up to the run_request and validate it; the steps to play, or None after an error."""
        while True:
            raw = await self.conn.receive()
            if raw is None:
                self.rec.outcome = "client ended before run_request"
                await self.conn.end()
                return None
            try:
                msg = pb.AgentClientMessage.FromString(raw)
            except Exception as exc:
                await self._fail(connect_error("invalid_argument", f"first client frame is not an "
                                               f"AgentClientMessage: {exc}"))
                return None
            kind = msg.WhichOneof("message") or "empty"
            self.rec.client_kinds.append(kind)
            if kind in ("client_heartbeat", "prewarm_request"):
                continue
            if kind != "run_request":
                await self._fail(connect_error("invalid_argument", f"expected run_request first, got {kind}"))
                return None
            break
        req = self.request = msg.run_request
        if not req.HasField("conversation_state"):
            await self._fail(connect_error("invalid_argument", "Conversation state is required"))
            return None
        self.model = req.requested_model.model_id or req.model_details.model_id or "default"
        self.rec.model = self.model
        self.rec.conversation_id = req.conversation_id
        if self.model not in self.cfg.models:
            await self._fail(error_doc("not_found", "Error", "ERROR_BAD_MODEL_NAME", "Invalid model",
                                       f"Model name {self.model!r} is not valid."))
            return None
        action = req.action.WhichOneof("action")
        if action == "user_message_action":
            self.user_text = req.action.user_message_action.user_message.text
            self.client_tools += list(req.action.user_message_action.request_context.tools)
        self.client_tools += list(req.mcp_tools.mcp_tools)
        name = marker_in(self.user_text) or self.conn.headers.get("x-workbench-scenario") or self.cfg.scenario
        self.rec.scenario = name
        scenario = self.b.scenarios.get(name)
        if scenario is None:
            await self._fail(connect_error("invalid_argument", unknown_scenario_message(name, self.b.scenarios)))
            return None
        self.scenario = scenario
        conv = req.conversation_id
        known = bool(conv) and conv in self.b.state.seen_conversations
        if conv:
            self.b.state.seen_conversations.add(conv)
        if scenario.continuation is not None and (known or len(req.conversation_state.turns) > 0):
            self.rec.path = "continuation"
            return scenario.continuation
        self.handed_out = list(self.b.state.open_tools.get(conv, [])) if conv else []
        self.resume = list(self.handed_out)
        if self.resume:
            self.rec.path = "resumed"
        return scenario.steps

    async def _reader(self) -> None:
        while True:
            raw = await self.conn.receive()
            if raw is None:
                self.queue.put_nowait(_EOF)
                return
            try:
                msg = pb.AgentClientMessage.FromString(raw)
            except Exception as exc:
                self.rec.faults.append(f"undecodable client frame ({len(raw)} bytes): {exc}")
                continue
            kind = msg.WhichOneof("message") or "empty"
            sub = getattr(msg, kind) if kind != "empty" else None
            member = sub.WhichOneof(_ONEOF[kind]) if sub is not None and kind in _ONEOF else None
            self.rec.client_kinds.append(f"{kind}.{member}" if member else kind)
            if kind == "client_heartbeat" or (kind == "exec_client_control_message" and member == "heartbeat"):
                continue
            if kind == "conversation_action" and member == "cancel_action":
                self.cancelled.set()
                continue
            self.queue.put_nowait(msg)

    async def _play_turn(self, steps: list[dict[str, Any]]) -> None:
        if self.rec.path == "steps":
            steps = await self._from_history(steps)
        await self._play(steps)

    async def _from_history(self, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A fresh run whose request carries answered tool calls continues after them.

        The prompt is read first (flattened history); without one there, the JSON messages of the
        state's root_prompt_messages_json — from this server's blob store, else asked of the
        client with get_blob — when the state has no turns (a structured stateless history).
        """
        assert self.scenario is not None
        hist = H.from_prompt(self.user_text)
        state = self.request.conversation_state
        if hist is None and state.root_prompt_messages_json and not state.turns:
            messages: list[Any] = []
            for blob_id in list(state.root_prompt_messages_json)[:8]:
                data = self.b.state.blobs.get(bytes(blob_id).hex())
                if data is None:
                    data = await self._get_blob(bytes(blob_id), "root_prompt_messages_json")
                messages += H.messages_in_blob(data or b"")
            hist = H.from_messages(messages)
        if hist is None or not hist.answered:
            return steps
        # A scenario that says how a new run goes on (continuation) uses that; else resume after the tools.
        plan = self.scenario.continuation if self.scenario.continuation is not None else \
            H.resume_steps(steps, len(hist.answered), self.scenario.prelude)
        if plan is None:
            return steps
        self.history = hist
        self.rec.path = "history"
        last = hist.answered[-1]
        self.last_tool = {"name": last.name or "tool", "call_id": last.call_id, "args": {}, "result": last.result}
        return plan

    async def _play(self, steps: list[dict[str, Any]]) -> None:
        try:
            for step in steps:
                verb = verb_of(step)
                await getattr(self, "_do_" + verb)(step[verb], step)
        except _Stop:
            return
        if not getattr(self.conn, "ended", False):
            self.rec.outcome = self.rec.outcome or ("turn_ended" if "turn_ended" in self.rec.sent_kinds
                                                    else "ended without turn_ended")
            await self.conn.end()

    # plumbing ------------------------------------------------------------------------------------

    async def _send(self, msg: Any, kind: str) -> None:
        await self.conn.send(bytes(msg.SerializeToString()))
        self.rec.sent_kinds.append(kind)
        self.last_send = self.loop.time()

    async def _update(self, kind: str, **fields: Any) -> None:
        upd = pb.InteractionUpdate(**{kind: getattr(pb, _UPDATE_TYPES[kind])(**fields)})
        await self._send(pb.AgentServerMessage(interaction_update=upd), kind)

    async def _heartbeat(self) -> None:
        await self._update("heartbeat")
        self.rec.heartbeats += 1

    async def _pace(self) -> None:
        if self.cfg.pace > 0:
            await asyncio.sleep(self.cfg.pace)

    async def _wait(self, pred: Callable[[Any], bool], what: str, eof_returns: bool = False,
                    until: float | None = None) -> Any:
        """The next client message matching ``pred``, heartbeating while none comes.

        Returns None at the client's end of input when ``eof_returns``, ``_TIMEOUT`` at ``until``.
        """
        started = self.loop.time()
        self.rec.waiting_for = what
        try:
            while True:
                self.pending = [m for m in self.pending if not self._absorb(m)]
                for i, m in enumerate(self.pending):
                    if pred(m):
                        return self.pending.pop(i)
                if self.client_done and eof_returns:
                    return None
                now = self.loop.time()
                if self.cfg.park_timeout is not None and now - started > self.cfg.park_timeout:
                    raise _ParkTimeout(what)
                if until is not None and now >= until:
                    return _TIMEOUT
                beat_at = self.last_send + self.cfg.heartbeat_interval
                timeout = max(0.0, (beat_at if until is None else min(beat_at, until)) - now)
                try:
                    m = await asyncio.wait_for(self.queue.get(), timeout)
                except TimeoutError:
                    if self.loop.time() >= beat_at:
                        await self._heartbeat()
                    continue
                if m is _EOF:
                    self.client_done = True
                elif not self._absorb(m):
                    self.pending.append(m)
        except ConnectionClosed:
            self.rec.outcome = f"disconnected while waiting for {what}"
            raise
        finally:
            self.rec.waiting_for = None

    def _absorb(self, m: Any) -> bool:
        """An answer for an exec no longer waited on (or a stream_close its policy ignores)."""
        ref = exec_numeric_id_of(m)
        w = self.waits.get(ref) if ref is not None else None
        return w is not None and w.absorb(m)

    def _fmt(self, text: str) -> str:
        user = self.history.last_user if self.history is not None and self.history.last_user else self.user_text
        marker = marker_in(user)
        if marker:
            user = user.replace(f"[scenario:{marker}]", "").strip()
        values = _SafeFormat(model=self.model, user=user[:200], scenario=self.rec.scenario or "",
                             tool_result=str(self.last_tool.get("result", ""))[:300],
                             tool_name=str(self.last_tool.get("name", "")))
        return text.format_map(values)

    # KV ----------------------------------------------------------------------------------------------

    async def _set_blob(self, data: bytes) -> bytes:
        blob_id = _blob_id(data)
        self.kv_seq += 1
        kid = self.kv_seq
        await self._send(pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
            id=kid, set_blob_args=pb.SetBlobArgs(blob_id=blob_id, blob_data=data))), "set_blob_args")
        self.b.state.blobs[blob_id.hex()] = data
        m = await self._wait(lambda m: _kv_answer(m, kid), f"kv {kid} set_blob_result")
        res = m.kv_client_message
        if res.WhichOneof("result") != "set_blob_result":
            self.rec.faults.append(f"kv {kid}: set_blob answered with {res.WhichOneof('result')}")
        elif res.set_blob_result.HasField("error"):
            self.rec.faults.append(f"kv {kid}: set_blob error {res.set_blob_result.error.message!r}")
        return blob_id

    async def _get_blob(self, blob_id: bytes, label: str) -> bytes | None:
        self.kv_seq += 1
        kid = self.kv_seq
        await self._send(pb.AgentServerMessage(kv_server_message=pb.KvServerMessage(
            id=kid, get_blob_args=pb.GetBlobArgs(blob_id=blob_id))), "get_blob_args")
        m = await self._wait(lambda m: _kv_answer(m, kid), f"kv {kid} get_blob_result")
        res = m.kv_client_message
        if res.WhichOneof("result") != "get_blob_result" or not res.get_blob_result.HasField("blob_data"):
            self.rec.blob_misses.append(f"{label} {blob_id.hex()[:16]}")
            return None
        data = bytes(res.get_blob_result.blob_data)
        if _blob_id(data) != blob_id:
            self.rec.faults.append(f"kv {kid}: blob {blob_id.hex()[:16]} came back with different data")
        self.b.state.blobs.setdefault(blob_id.hex(), data)
        return data

    def _blob_json(self, kind: str, text: str | None) -> Any:
        if kind == "system":
            return {"role": "system", "content": _system_prompt(self.model)}
        if kind == "user":
            body = text if text is not None else self.user_text
            return {"role": "user", "content": [{"type": "text", "text": f"<user_query>\n{body}\n</user_query>"}],
                    "providerOptions": {"cursor": {"requestId": self.conn.request_id or ""}}}
        if kind == "assistant_text":
            return {"id": str(uuid.uuid4()), "role": "assistant",
                    "content": [{"type": "text", "text": self._fmt(text) if text else self.text_out}]}
        tool = self.last_tool or {"name": "Shell", "call_id": "call_none", "args": {}}
        if kind == "assistant_tool_call":
            return {"id": str(uuid.uuid4()), "role": "assistant",
                    "content": [{"type": "tool-call", "toolCallId": tool["call_id"], "toolName": tool["name"],
                                 "args": tool["args"]}]}
        return {"role": "tool", "id": str(uuid.uuid4()),
                "content": [{"type": "tool-result", "toolName": tool["name"], "toolCallId": tool["call_id"],
                             "result": tool.get("result", ""), "experimental_content": None}]}

    async def _do_kv_set(self, kind: str, step: dict[str, Any]) -> None:
        blob_id = await self._set_blob(_json_bytes(self._blob_json(kind, step.get("text"))))
        if kind == "system":
            self.system_id = blob_id
        elif kind == "user":
            self.user_id = blob_id

    async def _do_kv_get(self, which: str, step: dict[str, Any]) -> None:
        if which == "missing":
            if await self._get_blob(os.urandom(32), "unknown id") is not None:
                self.rec.faults.append("client returned data for a blob id nobody set")
            else:
                self.rec.blob_misses.pop()  # an expected miss
            return
        state = self.request.conversation_state
        wanted: list[tuple[str, bytes]] = [("turns", bytes(t)) for t in list(state.turns)[-1:]]
        wanted += [("root_prompt_messages_json", bytes(r)) for r in list(state.root_prompt_messages_json)[:1]]
        if not wanted and self.user_id is not None:
            wanted = [("user prompt", self.user_id)]
        for label, blob_id in wanted[: int(step.get("max", 2))]:
            await self._get_blob(blob_id, label)

    # exec ----------------------------------------------------------------------------------------------

    def _next_exec(self, kind: str) -> ExecRecord:
        self.exec_seq += 1
        er = ExecRecord(self.exec_seq, str(uuid.uuid4()), kind)
        self.rec.execs.append(er)
        return er

    def _policy(self, kind: str, step_value: Any) -> str:
        assert self.scenario is not None
        return resolve(kind, step_value, self.scenario.stream_close, self.b.policy)

    async def _await_exec(self, er: ExecRecord, policy: str,
                          abort_after: float | None = None) -> tuple[list[Any], str | None]:
        """Wait for the client's answer to an exec until its policy says it is complete."""
        w = self.waits[er.id] = ExecWait(er, policy, self.rec.faults)
        until = None if abort_after is None else self.loop.time() + abort_after
        while not w.done:
            m = await self._wait(w.concerns, w.waiting_for, until=until)
            if m is _TIMEOUT:
                # The server gives up on the exec: abort{id}; whatever the client still sends for it
                # is dropped, not reported.
                await self._send(pb.AgentServerMessage(exec_server_control_message=pb.ExecServerControlMessage(
                    abort=pb.ExecServerAbort(id=er.id))), "abort")
                w.abort()
                return w.results, f"aborted by the server after {abort_after:g} s"
            w.feed(m)
        return w.results, er.thrown

    async def _do_request_context(self, _value: Any, step: dict[str, Any]) -> None:
        er = self._next_exec("request_context")
        await self._send(pb.AgentServerMessage(exec_server_message=pb.ExecServerMessage(
            id=er.id, exec_id=er.exec_id,
            request_context_args=pb.RequestContextArgs(workspace_id=str(uuid.uuid4())))), "request_context_args")
        results, _ = await self._await_exec(er, self._policy("request_context", step.get("stream_close")))
        for r in results:
            if r.WhichOneof("result") == "request_context_result" and r.request_context_result.HasField("success"):
                self.client_tools += list(r.request_context_result.success.request_context.tools)

    async def _do_web_search(self, term: str, step: dict[str, Any]) -> None:
        """An interaction query the client must answer (same id) before the run goes on."""
        self.exec_seq += 1  # queries and execs draw ids from separate spaces upstream; one is enough here
        qid = self.exec_seq
        call_id = f"toolu_{uuid.uuid4().hex[:24]}"
        await self._send(pb.AgentServerMessage(interaction_query=pb.InteractionQuery(
            id=qid, web_search_request_query=pb.WebSearchRequestQuery(
                args=pb.WebSearchArgs(search_term=self._fmt(term), tool_call_id=call_id)))),
            "web_search_request_query")

        def answer(m: Any) -> bool:
            return m.WhichOneof("message") == "interaction_response" and m.interaction_response.id == qid

        resp = (await self._wait(answer, f"interaction_query {qid} response")).interaction_response
        member = resp.WhichOneof("response")
        if member != "web_search_request_response":
            self.rec.faults.append(f"interaction_query {qid}: answered with {member}, not web_search_request_response")
            result = f"answered with {member}"
        else:
            case = resp.web_search_request_response.WhichOneof("result")
            result = f"rejected: {resp.web_search_request_response.rejected.reason}" if case == "rejected" \
                else str(case or "no result")
        self.last_tool = {"name": "WebSearch", "call_id": call_id, "args": {"search_term": term}, "result": result}

    # steps: streamed content ------------------------------------------------------------------------

    async def _do_thinking(self, text: str, step: dict[str, Any]) -> None:
        text = self._fmt(text)
        for part in _chunks(text, int(step.get("chunks", 3))):
            await self._update("thinking_delta", text=part)
            await self._pace()
        duration = int(step.get("duration_ms", 800))
        await self._update("thinking_completed", thinking_duration_ms=duration)
        self.turn_steps.append(pb.ConversationStep(thinking_message=pb.ThinkingMessage(
            text=text, duration_ms=duration)).SerializeToString())

    async def _do_text(self, text: str, step: dict[str, Any]) -> None:
        text = self._fmt(text)
        for part in _chunks(text, int(step.get("chunks", 3))):
            await self._update("text_delta", text=part)
            tokens = max(1, len(part) // 4)
            self.tokens_out += tokens
            await self._update("token_delta", tokens=tokens)
            await self._pace()
        self.text_out += text
        self.turn_steps.append(pb.ConversationStep(assistant_message=pb.AssistantMessage(
            text=text)).SerializeToString())

    async def _do_heartbeats(self, n: int, step: dict[str, Any]) -> None:
        for _ in range(n):
            await asyncio.sleep(self.cfg.heartbeat_interval)
            await self._heartbeat()

    async def _do_pause(self, seconds: float, step: dict[str, Any]) -> None:
        await asyncio.sleep(seconds)

    async def _do_checkpoint(self, _value: Any, step: dict[str, Any], pending: list[str] | None = None) -> None:
        um_id = await self._set_blob(pb.UserMessage(text=self.user_text).SerializeToString())
        step_ids = [await self._set_blob(s) for s in self.turn_steps]
        turn = pb.ConversationTurnStructure(agent_conversation_turn=pb.AgentConversationTurnStructure(
            user_message=um_id, steps=step_ids, request_id=self.conn.request_id or ""))
        turn_id = await self._set_blob(turn.SerializeToString())
        incoming = self.request.conversation_state
        state = pb.ConversationStateStructure()
        roots = list(incoming.root_prompt_messages_json) or ([self.system_id] if self.system_id else [])
        state.root_prompt_messages_json.extend(roots)
        state.turns.extend(list(incoming.turns) + [turn_id])
        state.pending_tool_calls.extend(pending or [])
        used = incoming.token_details.used_tokens + (len(self.user_text) + len(self.text_out)) // 4 + 3000
        state.token_details.used_tokens = min(used, MAX_TOKENS)
        state.token_details.max_tokens = MAX_TOKENS
        await self._send(pb.AgentServerMessage(conversation_checkpoint_update=state),
                         "conversation_checkpoint_update")
        if self.request.conversation_id:
            self.b.state.conversations[self.request.conversation_id] = bytes(state.SerializeToString())

    async def _do_step_completed(self, _value: Any, step: dict[str, Any]) -> None:
        self.step_seq += 1
        await self._update("step_completed", step_id=self.step_seq,
                           step_duration_ms=int((time.monotonic() - self.started) * 1000))

    async def _do_turn_ended(self, _value: Any, step: dict[str, Any]) -> None:
        await self._update("turn_ended")
        self.rec.outcome = "turn_ended"
        if self.request.conversation_id:
            self.b.state.open_tools.pop(self.request.conversation_id, None)

    async def _do_await_followup(self, _value: Any, step: dict[str, Any]) -> None:
        def followup(m: Any) -> bool:
            k = m.WhichOneof("message")
            return k == "run_request" or (k == "conversation_action"
                                          and m.conversation_action.WhichOneof("action") == "user_message_action")

        m = await self._wait(followup, "a follow-up on the same run", eof_returns=True)
        if m is None:
            return
        if m.WhichOneof("message") == "run_request":
            text = m.run_request.action.user_message_action.user_message.text
        else:
            text = m.conversation_action.user_message_action.user_message.text
        self.user_text = text or self.user_text
        await self._reuse()

    async def _reuse(self) -> None:
        assert self.scenario is not None
        self.rec.path = "on_reuse"
        self.rec.outcome = None
        await self._play(self.scenario.on_reuse if self.scenario.on_reuse is not None else self.scenario.steps)
        raise _Stop

    async def _do_park(self, _value: Any, step: dict[str, Any]) -> None:
        self.rec.outcome = "parked"
        await self._wait(lambda m: False, "nothing (parked by the scenario)")

    async def _do_end_stream_error(self, spec: dict[str, Any], step: dict[str, Any]) -> None:
        doc = error_doc(spec["code"], spec.get("message", "Error"), spec.get("error"), spec.get("title", ""),
                        spec.get("detail", ""), bool(spec.get("is_retryable", False)),
                        bool(spec.get("is_expected", True)))
        await self._fail(doc)
        raise _Stop

    async def _do_end(self, how: str, step: dict[str, Any]) -> None:
        if self.rec.outcome != "turn_ended":
            self.rec.outcome = {"eof": "eof without end-stream", "reset": "stream reset"}.get(
                how, "ended without turn_ended")
        if how == "eof":
            await self.conn.close()
        elif how == "reset":
            await _optional(self.conn, "reset", self.conn.close)()
        else:
            await self.conn.end()
            if how == "goaway":
                await _optional(self.conn, "goaway", _noop)()
        raise _Stop

    # tools ---------------------------------------------------------------------------------------------

    async def _do_tool(self, spec: dict[str, Any], step: dict[str, Any]) -> None:
        if self.resume:
            # Handed out by an earlier run of this turn: the "model" reads the result from the prompt.
            done = self.resume.pop(0)
            self.last_tool = {**done, "result": H.result_in_text(self.user_text, done["call_id"])}
            return
        kind = spec["exec"]
        args = {k: self._fmt(v) if isinstance(v, str) else v for k, v in spec.get("args", {}).items()}
        policy = spec.get("client_tools", "auto")
        mcp_name = str(spec.get("mcp_tool", "workbench-sim___echo"))
        provider, _, tool_name = mcp_name.rpartition("___")
        if self.client_tools and policy != "never":
            tool = _pick_tool(self.client_tools, kind, mcp_name)
            if policy == "auto":
                args = _fit_args(args, tool)
            kind = "mcp"
            mcp_name = tool.name
            provider = tool.provider_identifier
            tool_name = tool.tool_name or tool.name
        call_id = f"toolu_{uuid.uuid4().hex[:24]}"
        model_call_id = str(uuid.uuid4())
        display = tool_name if kind == "mcp" else _TOOL_NAMES[kind]
        self.last_tool = {"name": display, "call_id": call_id, "args": args}
        args_text = json.dumps(args, ensure_ascii=False)

        skeleton = _tool_call(kind, {}, call_id, mcp_name, provider, tool_name, args_only_name=True)
        for snap in _prefixes(args_text, int(spec.get("partial_snapshots", 3))):
            await self._update("partial_tool_call", call_id=call_id, tool_call=skeleton, args_text_delta=snap,
                               model_call_id=model_call_id)
            await self._pace()
        started = _tool_call(kind, args, call_id, mcp_name, provider, tool_name)
        await self._update("tool_call_started", call_id=call_id, tool_call=started, model_call_id=model_call_id)
        if spec.get("checkpoint_before_exec"):
            part = {"type": "tool-call", "toolCallId": call_id, "toolName": display, "args": args}
            await self._do_checkpoint(True, {}, pending=[json.dumps(part)])

        er = self._next_exec(kind)
        exec_msg = _exec_message(kind, args, call_id, mcp_name, provider, tool_name)
        exec_msg.id = er.id
        exec_msg.exec_id = er.exec_id
        await self._send(pb.AgentServerMessage(exec_server_message=exec_msg), exec_msg.WhichOneof("args"))
        self.handed_out.append({"call_id": call_id, "name": display, "args": args})
        if self.request.conversation_id:
            self.b.state.open_tools[self.request.conversation_id] = list(self.handed_out)
        abort_after = spec.get("abort_after")
        step_policy = spec.get("stream_close")
        if step_policy is None and "require_stream_close" in spec:  # the older boolean form
            step_policy = "required" if spec["require_stream_close"] else "accepted"
        results, thrown = await self._await_exec(er, self._policy(kind, step_policy),
                                                 None if abort_after is None else float(abort_after))

        summary, output = _result_summary(kind, results, thrown)
        self.last_tool["result"] = summary
        if output and kind in ("shell", "shell_stream") and spec.get("output_deltas", True):
            delta = pb.ToolCallDelta(shell_tool_call_delta=pb.ShellToolCallDelta(
                stdout=pb.ShellToolCallStdoutDelta(content=output)))
            await self._update("tool_call_delta", call_id=call_id, tool_call_delta=delta,
                               model_call_id=model_call_id)
        completion = spec.get("completion") or {}
        final_args = {k: v for k, v in args.items() if k not in completion.get("omit_keys", [])}
        for k in completion.get("stringify_keys", []):
            if k in final_args and not isinstance(final_args[k], str):
                final_args[k] = json.dumps(final_args[k], ensure_ascii=False)
        completed = _tool_call(kind, final_args, call_id, mcp_name, provider, tool_name)
        _attach_result(completed, kind, results, thrown)
        await self._update("tool_call_completed", call_id=call_id, tool_call=completed, model_call_id=model_call_id)
        self.turn_steps.append(pb.ConversationStep(tool_call=completed).SerializeToString())
        if spec.get("then") == "reuse":
            await self._reuse()


# AgentClientMessage member → the name of its own oneof (for "kind.member" labels).
_ONEOF = {"exec_client_message": "result", "kv_client_message": "result", "conversation_action": "action",
          "exec_client_control_message": "message", "interaction_response": "response"}
_UPDATE_TYPES = {"text_delta": "TextDelta", "thinking_delta": "ThinkingDelta",
                 "thinking_completed": "ThinkingCompleted", "token_delta": "TokenDelta",
                 "partial_tool_call": "PartialToolCall", "tool_call_started": "ToolCallStarted",
                 "tool_call_completed": "ToolCallCompleted", "tool_call_delta": "ToolCallDeltaUpdate",
                 "heartbeat": "Heartbeat", "turn_ended": "TurnEnded", "step_completed": "StepCompleted",
                 "step_started": "StepStarted"}


def _optional(conn: Any, name: str, fallback: Callable[[], Any]) -> Callable[[], Any]:
    """A transport extra (goaway/reset) when the connection has it (other transports may not)."""
    return getattr(conn, name, fallback)


async def _noop() -> None:
    return None


def _describe(m: Any) -> str:
    kind = m.WhichOneof("message") or "empty"
    sub = getattr(m, kind) if kind != "empty" else None
    member = sub.WhichOneof(_ONEOF[kind]) if sub is not None and kind in _ONEOF else None
    ident = getattr(sub, "id", None) if kind in ("exec_client_message", "kv_client_message",
                                                  "interaction_response") else None
    if kind == "exec_client_control_message" and member:
        ident = getattr(sub, member).id
    return f"{kind}.{member}" + (f"#{ident}" if ident is not None else "") if member else kind


def _kv_answer(m: Any, kid: int) -> bool:
    return m.WhichOneof("message") == "kv_client_message" and m.kv_client_message.id == kid


def _pick_tool(tools: list[Any], kind: str, mcp_name: str) -> Any:
    hints = _HINTS.get(kind, ())
    if kind == "mcp":
        hints = (mcp_name.rpartition("___")[2].lower(), *hints)
    for hint in hints:
        for t in tools:
            if hint and hint in (t.tool_name or t.name).lower():
                return t
    return tools[0]


def _tool_schema(tool: Any) -> dict[str, Any]:
    try:
        if tool.input_schema_json:
            doc = json.loads(tool.input_schema_json)
        elif tool.input_schema:
            doc = json_format.MessageToDict(struct_pb2.Value.FromString(tool.input_schema))
        else:
            return {}
    except Exception:
        return {}
    return doc if isinstance(doc, dict) else {}


def _fit_args(args: dict[str, Any], tool: Any) -> dict[str, Any]:
    """The scenario's arguments reshaped to the client tool's JSON schema (by property name)."""
    schema = _tool_schema(tool)
    props = schema.get("properties")
    if not isinstance(props, dict) or not props:
        return args
    out = {k: v for k, v in args.items() if k in props}
    fallback = next((v for v in args.values() if isinstance(v, str)), "")
    for name in schema.get("required") or []:
        if name not in out and name in props:
            typ = props[name].get("type") if isinstance(props[name], dict) else None
            out[name] = {"integer": 1, "number": 1, "boolean": False, "array": [], "object": {}}.get(
                str(typ), fallback)
    return out or args


def _mcp_args(args: dict[str, Any], call_id: str, name: str, provider: str, tool_name: str) -> Any:
    return pb.McpArgs(name=name, args={k: _value_bytes(v) for k, v in args.items()}, tool_call_id=call_id,
                      provider_identifier=provider, tool_name=tool_name)


def _shell_args(args: dict[str, Any], call_id: str) -> Any:
    return pb.ShellArgs(command=str(args.get("command", "")), working_directory=str(args.get("working_directory", "")),
                        timeout=int(args.get("timeout", 30000)), tool_call_id=call_id)


def _file_text(args: dict[str, Any]) -> str:
    return str(args.get("file_text", args.get("contents", args.get("content", ""))))


def _tool_call(kind: str, args: dict[str, Any], call_id: str, name: str, provider: str, tool_name: str,
               args_only_name: bool = False) -> Any:
    """The ToolCall of partial/started/completed updates (skeleton: the type, no arguments)."""
    tc = pb.ToolCall(tool_call_id=call_id)
    if kind in ("shell", "shell_stream"):
        tc.shell_tool_call.args.CopyFrom(_shell_args(args, call_id) if args else pb.ShellArgs())
    elif kind == "read":
        tc.read_tool_call.args.CopyFrom(pb.ReadToolArgs(path=str(args.get("path", ""))))
    elif kind == "write":
        tc.edit_tool_call.args.CopyFrom(pb.EditArgs(path=str(args.get("path", "")), stream_content=_file_text(args)))
    elif kind == "ls":
        tc.ls_tool_call.args.CopyFrom(pb.LsArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "grep":
        tc.grep_tool_call.args.CopyFrom(pb.GrepArgs(pattern=str(args.get("pattern", "")),
                                                    path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "delete":
        tc.delete_tool_call.args.CopyFrom(pb.DeleteArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    else:
        if args_only_name:
            tc.mcp_tool_call.args.CopyFrom(pb.McpArgs(name=name, tool_name=tool_name,
                                                      provider_identifier=provider, tool_call_id=call_id))
        else:
            tc.mcp_tool_call.args.CopyFrom(_mcp_args(args, call_id, name, provider, tool_name))
    return tc


def _exec_message(kind: str, args: dict[str, Any], call_id: str, name: str, provider: str, tool_name: str) -> Any:
    m = pb.ExecServerMessage()
    if kind == "shell":
        m.shell_args.CopyFrom(_shell_args(args, call_id))
    elif kind == "shell_stream":
        m.shell_stream_args.CopyFrom(_shell_args(args, call_id))
    elif kind == "read":
        m.read_args.CopyFrom(pb.ReadArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "write":
        m.write_args.CopyFrom(pb.WriteArgs(path=str(args.get("path", "")), file_text=_file_text(args),
                                           tool_call_id=call_id))
    elif kind == "ls":
        m.ls_args.CopyFrom(pb.LsArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    elif kind == "grep":
        m.grep_args.CopyFrom(pb.GrepArgs(pattern=str(args.get("pattern", "")), path=str(args.get("path", "")),
                                         output_mode=str(args.get("output_mode", "content")), tool_call_id=call_id))
    elif kind == "delete":
        m.delete_args.CopyFrom(pb.DeleteArgs(path=str(args.get("path", "")), tool_call_id=call_id))
    else:
        m.mcp_args.CopyFrom(_mcp_args(args, call_id, name, provider, tool_name))
    return m


def _result_summary(kind: str, results: list[Any], thrown: str | None) -> tuple[str, str]:
    """A one-line description of the client's answer, and shell output for tool_call_delta."""
    if thrown is not None:
        return f"error: {thrown}", ""
    if not results:
        return "(no result)", ""
    r = results[-1]
    member = r.WhichOneof("result")
    if kind == "shell_stream":
        out = "".join(x.shell_stream_result.stdout.data for x in results
                      if x.WhichOneof("result") == "shell_stream_result"
                      and x.shell_stream_result.WhichOneof("event") == "stdout")
        return out.strip() or "(no output)", out
    if member == "shell_result":
        case = r.shell_result.WhichOneof("result")
        if case in ("success", "failure"):
            s = getattr(r.shell_result, case)
            out = s.stdout or s.interleaved_output
            return (out.strip() or f"exit {s.exit_code}"), out
        return f"shell {case}", ""
    if member == "read_result":
        case = r.read_result.WhichOneof("result")
        if case == "success":
            s = r.read_result.success
            content = s.content or s.data.decode("utf-8", "replace")
            return f"{len(content.splitlines())} lines of {s.path or 'the file'}", ""
        return f"read {case}", ""
    if member == "mcp_result":
        case = r.mcp_result.WhichOneof("result")
        if case == "success":
            texts = [c.text.text for c in r.mcp_result.success.content if c.WhichOneof("content") == "text"]
            return " ".join(texts).strip() or "(empty MCP result)", ""
        return f"mcp {case}", ""
    if member is None:
        return "(empty result)", ""
    case = getattr(r, member).WhichOneof("result")
    return f"{member.removesuffix('_result')} {case}", ""


def _attach_result(tc: Any, kind: str, results: list[Any], thrown: str | None) -> None:
    r: Any = results[-1] if results else None
    member = r.WhichOneof("result") if r is not None else None
    if kind == "shell_stream":
        exit_code = 0
        out = err = ""
        for x in results:
            if x.WhichOneof("result") != "shell_stream_result":
                continue
            ev = x.shell_stream_result
            case = ev.WhichOneof("event")
            if case == "stdout":
                out += ev.stdout.data
            elif case == "stderr":
                err += ev.stderr.data
            elif case == "exit":
                exit_code = ev.exit.code
        if thrown is None:
            tc.shell_tool_call.result.success.CopyFrom(pb.ShellSuccess(
                command=tc.shell_tool_call.args.command, exit_code=exit_code, stdout=out, stderr=err))
        return
    if kind == "shell" and member == "shell_result":
        tc.shell_tool_call.result.CopyFrom(r.shell_result)
    elif kind == "read" and member == "read_result":
        if r.read_result.WhichOneof("result") == "success":
            s = r.read_result.success
            tc.read_tool_call.result.success.CopyFrom(pb.ReadToolSuccess(
                content=s.content, path=s.path, total_lines=max(0, s.total_lines), file_size=s.file_size))
        else:
            tc.read_tool_call.result.error.error_message = f"read {r.read_result.WhichOneof('result')}"
    elif kind == "read" and thrown is not None:
        tc.read_tool_call.result.error.error_message = thrown
    elif kind == "write" and member == "write_result":
        if r.write_result.WhichOneof("result") == "success":
            s = r.write_result.success
            tc.edit_tool_call.result.success.CopyFrom(pb.EditSuccess(
                path=s.path, lines_added=s.lines_created, message="file written"))
        else:
            tc.edit_tool_call.result.error.error = f"write {r.write_result.WhichOneof('result')}"
    elif kind == "ls" and member == "ls_result":
        tc.ls_tool_call.result.CopyFrom(r.ls_result)
    elif kind == "grep" and member == "grep_result":
        tc.grep_tool_call.result.CopyFrom(r.grep_result)
    elif kind == "delete" and member == "delete_result":
        tc.delete_tool_call.result.CopyFrom(r.delete_result)
    elif kind == "mcp":
        if member == "mcp_result" and r.mcp_result.WhichOneof("result") == "success":
            tc.mcp_tool_call.result.success.CopyFrom(r.mcp_result.success)
        elif thrown is not None:
            tc.mcp_tool_call.result.error.error = thrown
        elif member == "mcp_result":
            tc.mcp_tool_call.result.error.error = f"mcp {r.mcp_result.WhichOneof('result')}"


def _system_prompt(model: str) -> str:
    rules = "\n".join(f"{i}. Follow the workbench simulator's rule number {i}: be concise, cite files, "
                      f"prefer small diffs, and explain each tool call." for i in range(1, 41))
    return (f"You are an AI coding assistant, powered by {model}. You operate in the workbench simulator, "
            "a stand-in for Cursor's agent backend used to reproduce client bugs.\n\n"
            f"<rules>\n{rules}\n</rules>\n")
