"""``ClientRun``: one run of the client, its channel and per-turn state (kept open under
``reuse_session``). The parts of the client that answer execs (``execs``) and end a turn
(``turn_end``) work on a run, never on the client itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from workbench.client._pb import pb
from workbench.client.events import CallState, Event, ExecRequest, Usage
from workbench.client.transport import Channel


class ClientRun:
    """One run of the client: its channel and per-turn state (kept open under ``reuse_session``)."""

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
        self.unclosed: list[int] = []  # exec ids whose stream_close the no_stream_close fault dropped
        self.unclosed_by_policy: list[int] = []  # answered with the result alone (close policy streams-only)
        self.unanswered: dict[int, ExecRequest] = {}
        self.context_unanswered: list[int] = []  # request_context execs left unanswered on purpose
        self.ended = False
        self.end_settled = False  # the wait for the server's end after turn_ended is over
        self.hb_task: asyncio.Task[None] | None = None
        # exec id → (task, exec_id, kind) of a local execution in progress
        self.local: dict[int, tuple[asyncio.Task[None], str, str]] = {}
        self.aborted: list[asyncio.Task[None]] = []
        self.done: list[Event] = []  # ExecHandled of finished local execs, yielded at the next frame
        self.iterator: AsyncIterator[Any] | None = None
        self.request = b""  # the run_request as sent (a retry sends it again)
        self.ended_at = 0.0  # monotonic time of turn_ended
        self.lost_after_turn: str | None = None  # what failed the transport after turn_ended
        self.watchdog_task: asyncio.Task[None] | None = None
        self.watchdog_fired: str | None = None  # what the client's watchdog did, once it fired

    async def send(self, msg: dict[str, Any] | bytes) -> None:
        """Send one AgentClientMessage: its members as a dict, or already serialized."""
        await self.channel.send(bytes(pb.AgentClientMessage(**msg).SerializeToString())
                                if isinstance(msg, dict) else msg)
