"""A run answered with a non-200 HTTP status (the ``http_status`` step, scenario ``run_http_error``).

The transport answers every Run/RunSSE/RunPoll with 200 before the run's handler sees a message,
as the real service does once it has accepted the stream. A scenario whose first step is
``{"http_status": N}`` stands for what answers before that — a load balancer or gateway in
front of the service (oh-my-pi #6176): the status line itself is N. ``StatusGate`` wraps the
three stream routes and decides before the transport starts its 200:

- by the ``x-workbench-scenario`` header, else, on Run over HTTP/2, by the ``[scenario:NAME]``
  marker of the first client message (read ahead, at most ``PEEK_LIMIT`` bytes, and handed on
  untouched to the transport when the scenario is another), else by the server's ``--scenario``;
- RunSSE/RunPoll carry the run request in a BidiAppend, after their status line: there only the
  header and ``--scenario`` can choose it (a marker reaches the ``http_status`` step, which ends
  the already-started stream with an ``unavailable`` error instead).

The refused request is recorded as a run (outcome ``http <N>``) like any other.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from functools import partial
from typing import Any, cast

from workbench.protocol import kinds
from workbench.schema import pb
from workbench.sim.scenario import Scenario, marker_in, verb_of
from workbench.sim.state import RunRecord, SimState
from workbench.transport import Exchange, Router
from workbench.wire.envelope import EnvelopeParser

RUN_PATH = "/agent.v1.AgentService/Run"
STREAM_PATHS = {RUN_PATH: "run", "/agent.v1.AgentService/RunSSE": "runsse",
                "/agent.v1.AgentService/RunPoll": "runpoll"}
PEEK_LIMIT = 1 << 20  # bytes read ahead for a Run's first message
PEEK_WAIT_S = 2.0  # at most this long: a client that waits for the response headers first is not held up longer


class _ReadAhead:
    """An exchange whose first body chunks were already read: they are returned again first."""

    def __init__(self, ex: Exchange, chunks: list[bytes], ended: bool) -> None:
        self._ex = ex
        self._chunks = chunks
        self._ended = ended

    async def read_chunk(self) -> bytes | None:
        if self._chunks:
            return self._chunks.pop(0)
        if self._ended:
            return None
        return await self._ex.read_chunk()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ex, name)


class StatusGate:
    """Wraps the stream routes of a router so a scenario can answer with an HTTP status."""

    def __init__(self, scenarios: dict[str, Scenario], default: str, state: SimState,
                 finished: Callable[[RunRecord], None]) -> None:
        self.scenarios = scenarios
        self.default = default
        self.state = state
        self.finished = finished

    def install(self, router: Router) -> None:
        for path, transport in STREAM_PATHS.items():
            router.route(path, partial(self._gate, inner=router.handler_for(path), transport=transport))

    def status_of(self, name: str | None) -> tuple[int, dict[str, Any]] | None:
        sc = self.scenarios.get(name or "")
        if sc is None or not sc.steps or verb_of(sc.steps[0]) != "http_status":
            return None
        step = sc.steps[0]
        return int(step["http_status"]), {"code": step.get("code", "unavailable"),
                                           "message": step.get("message", f"HTTP {step['http_status']}")}

    async def _gate(self, ex: Exchange, inner: Callable[[Exchange], Any], transport: str) -> None:
        if ex.method != "POST" or not any(self.status_of(n) for n in self.scenarios):
            await inner(ex)
            return
        name = ex.headers.get("x-workbench-scenario")
        handed: Exchange = ex
        if name is None and transport == "run" and ex.http_version == "2" and \
                "text" not in ex.headers.get("content-type", ""):
            name, handed = await self._peek(ex)
        name = name or self.default
        answer = self.status_of(name)
        if answer is None:
            await inner(handed)
            return
        status, body = answer
        rec = self.state.new_run(transport, ex.headers.get("x-request-id"))
        rec.scenario = name
        rec.outcome = f"http {status}"
        await ex.respond(status, json.dumps(body).encode(), "application/json")
        rec.finished.set()
        self.finished(rec)

    async def _peek(self, ex: Exchange) -> tuple[str | None, Exchange]:
        """The scenario marker of a Run's first client message, and the exchange to hand on."""
        chunks: list[bytes] = []
        parser = EnvelopeParser()
        size = 0
        ended = False
        marker = None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PEEK_WAIT_S
        while size < PEEK_LIMIT:
            try:
                chunk = await asyncio.wait_for(ex.read_chunk(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                break
            if chunk is None:
                ended = True
                break
            chunks.append(chunk)
            size += len(chunk)
            envs = parser.feed(chunk)
            if envs:  # the first envelope (or what broke it): enough to decide
                if envs[0].error is None and not envs[0].is_end_stream:
                    marker = _marker_of(envs[0].payload)
                break
        return marker, cast(Exchange, _ReadAhead(ex, chunks, ended))


def _marker_of(payload: bytes) -> str | None:
    try:
        msg = pb.AgentClientMessage.FromString(payload)
    except Exception:  # not ours to judge here: the transport and the run report it
        return None
    if msg.WhichOneof("message") != kinds.RUN_REQUEST:
        return None
    return marker_in(msg.run_request.action.user_message_action.user_message.text)
