"""The simulated agent backend: what outlives a run, and the checks every call passes.

One ``SimBackend`` holds its scenarios, its stream_close policy and its ``SimState`` (blob store,
the checkpoints of the conversations it has seen, the record of every run). It is the transport's
``Handler`` (each run is played by a ``ScenarioRun``), its ``auth`` check (a bearer token, as the
real service asks) and its unary methods (both model listings, GetServerConfig).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from workbench.schema import pb
from workbench.sim.error_docs import error_doc
from workbench.sim.exec_completion import server_policy
from workbench.sim.models import LISTING_CHOICES, listing_handlers
from workbench.sim.player import ScenarioRun
from workbench.sim.scenario import Scenario, ScenarioError, load_scenarios, unknown_scenario_message
from workbench.sim.state import RunRecord, SimConfig, SimState
from workbench.transport import AgentConnection, UnaryHandler, UnaryRequest, UnaryResponse

log = logging.getLogger("workbench.sim")

GET_SERVER_CONFIG = "/aiserver.v1.ServerConfigService/GetServerConfig"


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
        await ScenarioRun(self, conn).run()

    def run_finished(self, rec: RunRecord) -> None:
        for cb in self.on_run_finished:
            try:
                cb(rec)
            except Exception:  # a logging callback must not break the server
                log.exception("on_run_finished callback failed")

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
    def unary(self) -> dict[str, UnaryHandler]:
        return {**listing_handlers(self.config.models, self.config.model_listing),
                GET_SERVER_CONFIG: self.get_server_config}

    async def get_server_config(self, req: UnaryRequest) -> UnaryResponse:
        # http2_config 0 (unspecified): the client keeps its own transport choice.
        return UnaryResponse(body=bytes(pb.GetServerConfigResponse().SerializeToString()))
