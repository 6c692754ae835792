"""One simulated run: validate its request, pick its scenario, play the steps (``ScenarioRun``).

The run is checked the way the real service checks it (a known model, a ``conversation_state``
present) and then plays its scenario's steps, one verb at a time: streamed content and endings
(``stream_steps``), KV blobs and checkpoints (``blob_steps``), execs, tool calls and queries
(``exec_steps``). Which steps: the scenario's ``steps``; its ``continuation`` for a new run on a
known conversation; after the tool calls already handed out when a new run resumes an unfinished
turn; after the answered tool calls a fresh run's request carries (``history``); ``on_reuse``
when the client continues inside the same run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.protocol import kinds
from workbench.schema import pb
from workbench.sim import blob_steps, exec_steps, history, stream_steps
from workbench.sim.blob_steps import get_blob
from workbench.sim.client_link import ClientLink, ParkTimeout
from workbench.sim.error_docs import error_doc
from workbench.sim.exec_completion import ExecWait
from workbench.sim.run_context import SimHost, Step, StopSteps
from workbench.sim.scenario import VERBS, Scenario, marker_in, unknown_scenario_message, verb_of
from workbench.transport import AgentConnection, ConnectionClosed, connect_error

log = logging.getLogger("workbench.sim")

class _SafeFormat(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class ScenarioRun:
    """One run of the simulated backend, from its run_request to its end (the steps see it as a
    ``run_context.RunContext``)."""

    def __init__(self, backend: SimHost, conn: AgentConnection) -> None:
        self.backend = backend
        self.cfg = backend.config
        self.conn = conn
        self.rec = backend.state.new_run(conn.transport, conn.request_id)
        framing = getattr(conn, "framing", None)  # transports other than ours may not say
        self.rec.framing = getattr(framing, "name", None) or "connect"
        self.link = ClientLink(conn, self.rec, self.cfg.heartbeat_interval, self.cfg.park_timeout)
        self.exec_seq = 0
        self.kv_seq = 0
        self.step_seq = 0
        self.started = time.monotonic()
        self.request: Any = None
        self.scenario: Scenario | None = None
        self.user_text = ""
        self.model = ""
        self.client_tools: list[Any] = []
        self.context_waits: list[ExecWait] = []  # request_context execs the run did not wait for
        self.context_taken: dict[int, int] = {}  # exec id → its results already read for tools
        self.context_grace_spent = False
        self.system_id: bytes | None = None
        self.user_id: bytes | None = None
        self.last_blob_id: bytes | None = None
        self.turn_steps: list[bytes] = []
        self.text_out = ""
        self.tokens_out = 0
        self.last_tool: JsonObject = {}
        self.handed_out: list[JsonObject] = []  # tool calls of this (possibly resumed) turn
        self.resume: list[JsonObject] = []  # of those, the ones a previous run already handed out
        self.history: history.History | None = None  # the answered tool calls a fresh run's request carried

    # lifecycle --------------------------------------------------------------------------------

    async def run(self) -> None:
        reader: asyncio.Task[None] | None = None
        body: asyncio.Task[None] | None = None
        cancel: asyncio.Task[Any] | None = None
        loop = self.link.loop
        try:
            steps = await self._open()
            if steps is None:
                return
            reader = loop.create_task(self.link.read())
            body = loop.create_task(self._play_turn(steps))
            cancel = loop.create_task(self.link.cancelled.wait())
            done, _ = await asyncio.wait({body, cancel}, return_when=asyncio.FIRST_COMPLETED)
            if body in done:
                cancel.cancel()
                body.result()
            else:
                body.cancel()
                await asyncio.gather(body, return_exceptions=True)
                self.rec.outcome = "cancelled"
                await self.conn.end()
        except ParkTimeout as exc:
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
            unused = self.link.unused()
            if unused:
                self.rec.faults.append(f"client messages the run never used: {', '.join(unused)}")
            self.rec.faults.extend(getattr(self.conn, "append_faults", []))
            self.rec.finished.set()
            self.backend.run_finished(self.rec)

    async def fail(self, doc: JsonObject) -> None:
        self.rec.outcome = f"error:{doc.get('code')}"
        await self.conn.end(doc)

    async def _open(self) -> list[JsonObject] | None:
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
                await self.fail(connect_error("invalid_argument", f"first client frame is not an "
                                              f"AgentClientMessage: {exc}"))
                return None
            kind = msg.WhichOneof("message") or "empty"
            self.rec.client_kinds.append(kind)
            if kind in (kinds.CLIENT_HEARTBEAT, kinds.PREWARM_REQUEST):
                continue
            if kind != kinds.RUN_REQUEST:
                await self.fail(connect_error("invalid_argument", f"expected run_request first, got {kind}"))
                return None
            break
        req = self.request = msg.run_request
        if not req.HasField("conversation_state"):
            await self.fail(connect_error("invalid_argument", "Conversation state is required"))
            return None
        self.model = req.requested_model.model_id or req.model_details.model_id or "default"
        self.rec.model = self.model
        self.rec.conversation_id = req.conversation_id
        if self.model not in self.cfg.models:
            await self.fail(error_doc("not_found", "Error", "ERROR_BAD_MODEL_NAME", "Invalid model",
                                      f"Model name {self.model!r} is not valid."))
            return None
        action = req.action.WhichOneof("action")
        if action == "user_message_action":
            self.user_text = req.action.user_message_action.user_message.text
            self.client_tools += list(req.action.user_message_action.request_context.tools)
        self.client_tools += list(req.mcp_tools.mcp_tools)
        name = marker_in(self.user_text) or self.conn.headers.get("x-workbench-scenario") or self.cfg.scenario
        self.rec.scenario = name
        scenario = self.backend.scenarios.get(name)
        if scenario is None:
            await self.fail(connect_error("invalid_argument", unknown_scenario_message(name, self.backend.scenarios)))
            return None
        self.scenario = scenario
        conv = req.conversation_id
        state = self.backend.state
        known = bool(conv) and conv in state.seen_conversations
        if conv:
            state.seen_conversations.add(conv)
        if scenario.continuation is not None and (known or len(req.conversation_state.turns) > 0):
            self.rec.path = "continuation"
            return scenario.continuation
        self.handed_out = list(state.open_tools.get(conv, [])) if conv else []
        self.resume = list(self.handed_out)
        if self.resume:
            self.rec.path = "resumed"
        return scenario.steps

    async def _play_turn(self, steps: list[JsonObject]) -> None:
        if self.rec.path == "steps":
            steps = await self._from_history(steps)
        await self.play(steps)

    async def _from_history(self, steps: list[JsonObject]) -> list[JsonObject]:
        """A fresh run whose request carries answered tool calls continues after them.

        The prompt is read first (flattened history); without one there, the JSON messages of the
        state's root_prompt_messages_json — from this server's blob store, else asked of the
        client with get_blob — when the state has no turns (a structured stateless history).
        """
        assert self.scenario is not None
        hist = history.from_prompt(self.user_text)
        state = self.request.conversation_state
        if hist is None and state.root_prompt_messages_json and not state.turns:
            messages: list[Any] = []
            for blob_id in list(state.root_prompt_messages_json)[:8]:
                data = self.backend.state.blobs_of(self.request.conversation_id).get(bytes(blob_id).hex())
                if data is None:
                    data = await get_blob(self, bytes(blob_id), "root_prompt_messages_json")
                messages += history.messages_in_blob(data or b"")
            hist = history.from_messages(messages)
        if hist is None or not hist.answered:
            return steps
        # A scenario that says how a new run goes on (continuation) uses that; else resume after the tools.
        plan = self.scenario.continuation if self.scenario.continuation is not None else \
            history.resume_steps(steps, len(hist.answered), self.scenario.prelude)
        if plan is None:
            return steps
        self.history = hist
        self.rec.path = "history"
        last = hist.answered[-1]
        self.last_tool = {"name": last.name or "tool", "call_id": last.call_id, "args": {}, "result": last.result}
        return plan

    async def play(self, steps: list[JsonObject]) -> None:
        table = step_table()
        try:
            for step in steps:
                verb = verb_of(step)
                await table[verb](self, step[verb], step)
        except StopSteps:
            return
        if not getattr(self.conn, "ended", False):
            self.rec.outcome = self.rec.outcome or ("turn_ended" if "turn_ended" in self.rec.sent_kinds
                                                    else "ended without turn_ended")
            await self.conn.end()

    async def reuse(self) -> None:
        """The client continues inside this run: play ``on_reuse`` (else the steps again), then stop."""
        assert self.scenario is not None
        self.rec.path = "on_reuse"
        self.rec.outcome = None
        await self.play(self.scenario.on_reuse if self.scenario.on_reuse is not None else self.scenario.steps)
        raise StopSteps

    async def pace(self) -> None:
        if self.cfg.pace > 0:
            await asyncio.sleep(self.cfg.pace)

    def fmt(self, text: str) -> str:
        """A scenario string with ``{user}``, ``{model}``, ``{scenario}``, ``{tool_result}``, ``{tool_name}``,
        ``{long_exec_seconds}``."""
        user = self.history.last_user if self.history is not None and self.history.last_user else self.user_text
        marker = marker_in(user)
        if marker:
            user = user.replace(f"[scenario:{marker}]", "").strip()
        values = _SafeFormat(model=self.model, user=user[:200], scenario=self.rec.scenario or "",
                             tool_result=str(self.last_tool.get("result", ""))[:300],
                             tool_name=str(self.last_tool.get("name", "")),
                             long_exec_seconds=str(self.cfg.long_exec_seconds))
        return text.format_map(values)


_STEPS: dict[str, Step] = {**stream_steps.STEPS, **blob_steps.STEPS, **exec_steps.STEPS}


def step_table() -> dict[str, Step]:
    """Verb → step function, from the step modules (checked against the verbs the loader accepts)."""
    mismatch = set(VERBS) ^ set(_STEPS)
    if mismatch:
        raise RuntimeError(f"scenario verbs without a step (or steps without a verb): {sorted(mismatch)}")
    return _STEPS
