"""What a scenario step may use of its run, and what a run needs of its backend.

The step modules (``stream_steps``, ``blob_steps``, ``exec_steps``) are functions of a
``RunContext``; ``player.ScenarioRun`` is the one implementation, and a ``SimHost`` (the
``SimBackend``) is what it plays for. Both are interfaces here, so the player imports the steps
and the backend imports the player, and nothing imports back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from workbench.jsontypes import JsonObject
from workbench.sim.client_link import ClientLink
from workbench.sim.exec_completion import ExecWait, StreamClosePolicy
from workbench.sim.scenario import Scenario
from workbench.sim.state import RunRecord, SimConfig, SimState
from workbench.transport import AgentConnection


class StopSteps(Exception):
    """A step ended the stream; the remaining steps are skipped."""


class SimHost(Protocol):
    """What outlives a run: the backend's settings, scenarios, shared state and server policy."""

    @property
    def config(self) -> SimConfig: ...

    @property
    def scenarios(self) -> dict[str, Scenario]: ...

    @property
    def state(self) -> SimState: ...

    @property
    def policy(self) -> StreamClosePolicy: ...

    def run_finished(self, rec: RunRecord) -> None: ...


class RunContext(Protocol):
    """One run as its steps see it: the link to the client, the run's record and request, what the
    turn has produced so far, and the few actions a step takes on the whole run."""

    backend: SimHost
    cfg: SimConfig
    conn: AgentConnection
    link: ClientLink
    rec: RunRecord
    request: Any  # the AgentRunRequest
    scenario: Scenario | None
    model: str
    user_text: str
    started: float
    # id counters (execs and queries, KV, steps)
    exec_seq: int
    kv_seq: int
    step_seq: int
    # what the turn has produced and learned
    text_out: str
    tokens_out: int
    turn_steps: list[bytes]
    system_id: bytes | None
    user_id: bytes | None
    last_blob_id: bytes | None
    last_tool: JsonObject
    handed_out: list[JsonObject]
    resume: list[JsonObject]
    client_tools: list[Any]
    context_waits: list[ExecWait]
    context_taken: dict[int, int]
    context_grace_spent: bool

    async def fail(self, doc: JsonObject) -> None:
        """End the run with an error end-stream."""

    async def reuse(self) -> None:
        """Play ``on_reuse`` inside this run (the client continued it), then stop the steps."""

    async def pace(self) -> None:
        """Wait the configured pace between streamed pieces."""

    def fmt(self, text: str) -> str:
        """A scenario string with its ``{placeholders}`` filled in."""


Step = Callable[[RunContext, Any, JsonObject], Awaitable[None]]
