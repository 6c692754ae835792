"""workbench.sim — a simulated Cursor agent backend (HTTP/2 + HTTP/1.1 over TLS on loopback).

Only behaviour lives here: the backend (``backend``), one run playing a scenario (``player`` with
its steps in ``stream_steps``, ``blob_steps``, ``exec_steps``; tool messages in ``tools``; waits
and heartbeats in ``client_link``), scenarios (JSON files in ``workbench/sim/scenarios/``),
exec completion policies, history resumption and model listings. The HTTP side is
``workbench.transport``. ``running_sim`` / ``SimThread`` start one in-process. See docs/sim.md.
"""

from workbench.sim.backend import SimBackend
from workbench.sim.runner import SimServer, SimThread, running_sim, start_sim
from workbench.sim.scenario import Scenario, ScenarioError, load_scenarios
from workbench.sim.state import RunRecord, SimConfig, SimState

__all__ = ["RunRecord", "Scenario", "ScenarioError", "SimBackend", "SimConfig", "SimServer", "SimState",
           "SimThread", "load_scenarios", "running_sim", "start_sim"]
