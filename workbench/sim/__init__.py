"""workbench.sim — a simulated Cursor agent backend (HTTP/2 + HTTP/1.1 over TLS on loopback).

``running_sim`` / ``SimThread`` start one in-process; ``workbench.sim.transport`` is the reusable
transport layer; scenarios are JSON files (``workbench/sim/scenarios/``). See docs/sim.md.
"""

from workbench.sim.engine import RunRecord, SimBackend, SimConfig, SimState
from workbench.sim.runner import SimServer, SimThread, running_sim, start_sim
from workbench.sim.scenario import Scenario, ScenarioError, load_scenarios

__all__ = ["RunRecord", "Scenario", "ScenarioError", "SimBackend", "SimConfig", "SimServer", "SimState",
           "SimThread", "load_scenarios", "running_sim", "start_sim"]
