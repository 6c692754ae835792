"""A simulated run's link to its client: what it sends, and the waits for the client's answers.

While a run waits (a KV result, an exec answer, a follow-up), it heartbeats every
``heartbeat_interval`` just as the real server keeps a parked run alive (docs/protocol.md §5, §7),
and gives up after ``park_timeout`` when one is set. Client messages are read by one task
(``read``) into a queue; those no wait has asked for yet are kept, except answers for an exec
nobody waits on any more, which its ``ExecWait`` absorbs (docs/sim.md "Exec completion").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from workbench.protocol import kinds
from workbench.schema import pb
from workbench.sim.exec_completion import ExecWait, exec_numeric_id_of
from workbench.sim.state import RunRecord
from workbench.transport import AgentConnection, ConnectionClosed

# AgentClientMessage member → the name of its own oneof (for "kind.member" labels).
ONEOF = {"exec_client_message": "result", "kv_client_message": "result", "conversation_action": "action",
         "exec_client_control_message": "message", "interaction_response": "response"}
UPDATE_TYPES = {"text_delta": "TextDelta", "thinking_delta": "ThinkingDelta",
                "thinking_completed": "ThinkingCompleted", "token_delta": "TokenDelta",
                "partial_tool_call": "PartialToolCall", "tool_call_started": "ToolCallStarted",
                "tool_call_completed": "ToolCallCompleted", "tool_call_delta": "ToolCallDeltaUpdate",
                "heartbeat": "Heartbeat", "turn_ended": "TurnEnded", "step_completed": "StepCompleted",
                "step_started": "StepStarted"}

EOF = object()  # the client ended its side
TIMEOUT = object()  # a wait's ``until`` passed


class ParkTimeout(Exception):
    """The run waited longer than ``park_timeout`` for the client (the message says for what)."""


class ClientLink:
    def __init__(self, conn: AgentConnection, rec: RunRecord, heartbeat_interval: float,
                 park_timeout: float | None) -> None:
        self.conn = conn
        self.rec = rec
        self.heartbeat_interval = heartbeat_interval
        self.park_timeout = park_timeout
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.pending: list[Any] = []  # client messages no wait has taken yet
        self.client_done = False
        self.cancelled = asyncio.Event()  # the client sent conversation_action.cancel_action
        self.last_send = self.loop.time()
        self.waits: dict[int, ExecWait] = {}  # every exec of the run, by id (answers absorbed after the end)

    # sending ----------------------------------------------------------------------------------

    async def send(self, msg: Any, kind: str) -> None:
        await self.conn.send(bytes(msg.SerializeToString()))
        self.rec.sent_kinds.append(kind)
        self.last_send = self.loop.time()

    async def update(self, kind: str, **fields: Any) -> None:
        upd = pb.InteractionUpdate(**{kind: getattr(pb, UPDATE_TYPES[kind])(**fields)})
        await self.send(pb.AgentServerMessage(interaction_update=upd), kind)

    async def heartbeat(self) -> None:
        await self.update("heartbeat")
        self.rec.heartbeats += 1

    # receiving --------------------------------------------------------------------------------

    async def read(self) -> None:
        """The receive loop (one task per run): decode, label, queue; heartbeats and cancel aside."""
        while True:
            raw = await self.conn.receive()
            if raw is None:
                self.queue.put_nowait(EOF)
                return
            try:
                msg = pb.AgentClientMessage.FromString(raw)
            except Exception as exc:
                self.rec.faults.append(f"undecodable client frame ({len(raw)} bytes): {exc}")
                continue
            kind = msg.WhichOneof("message") or "empty"
            sub = getattr(msg, kind) if kind != "empty" else None
            member = sub.WhichOneof(ONEOF[kind]) if sub is not None and kind in ONEOF else None
            label = f"{kind}.{member}" if member else kind
            self.rec.client_kinds.append(label)
            if kinds.is_client_heartbeat(label):
                continue
            if kind == "conversation_action" and member == "cancel_action":
                self.cancelled.set()
                continue
            self.queue.put_nowait(msg)

    def drain(self) -> None:
        """Take what the client has sent so far without waiting (answers nobody waits on are absorbed)."""
        while not self.queue.empty():
            m = self.queue.get_nowait()
            if m is EOF:
                self.client_done = True
            elif not self.absorb(m):
                self.pending.append(m)

    async def wait(self, pred: Callable[[Any], bool], what: str, eof_returns: bool = False,
                   until: float | None = None) -> Any:
        """The next client message matching ``pred``, heartbeating while none comes.

        Returns None at the client's end of input when ``eof_returns``, ``TIMEOUT`` at ``until``.
        """
        started = self.loop.time()
        self.rec.waiting_for = what
        try:
            while True:
                self.pending = [m for m in self.pending if not self.absorb(m)]
                for i, m in enumerate(self.pending):
                    if pred(m):
                        return self.pending.pop(i)
                if self.client_done and eof_returns:
                    return None
                now = self.loop.time()
                if self.park_timeout is not None and now - started > self.park_timeout:
                    raise ParkTimeout(what)
                if until is not None and now >= until:
                    return TIMEOUT
                beat_at = self.last_send + self.heartbeat_interval
                timeout = max(0.0, (beat_at if until is None else min(beat_at, until)) - now)
                try:
                    m = await asyncio.wait_for(self.queue.get(), timeout)
                except TimeoutError:
                    if self.loop.time() >= beat_at:
                        await self.heartbeat()
                    continue
                if m is EOF:
                    self.client_done = True
                elif not self.absorb(m):
                    self.pending.append(m)
        except ConnectionClosed:
            self.rec.outcome = f"disconnected while waiting for {what}"
            raise
        finally:
            self.rec.waiting_for = None

    def absorb(self, m: Any) -> bool:
        """An answer for an exec no longer waited on (or a stream_close its policy ignores)."""
        ref = exec_numeric_id_of(m)
        w = self.waits.get(ref) if ref is not None else None
        return w is not None and w.absorb(m)

    def unused(self) -> list[str]:
        """Labels of the client messages the run never used (at its end)."""
        return [describe(m) for m in self.pending if not self.absorb(m)]


def describe(m: Any) -> str:
    """``kind.member#id`` of a client message, for faults."""
    kind = m.WhichOneof("message") or "empty"
    sub = getattr(m, kind) if kind != "empty" else None
    member = sub.WhichOneof(ONEOF[kind]) if sub is not None and kind in ONEOF else None
    ident = getattr(sub, "id", None) if kind in ("exec_client_message", "kv_client_message",
                                                  "interaction_response") else None
    if kind == "exec_client_control_message" and member:
        ident = getattr(sub, member).id
    return f"{kind}.{member}" + (f"#{ident}" if ident is not None else "") if member else kind
