"""Every scenario verb the loader accepts has exactly one step function that plays it."""

from __future__ import annotations

from workbench.sim import blob_steps, exec_steps, stream_steps
from workbench.sim.player import step_table
from workbench.sim.scenario import VERBS


def test_every_verb_has_one_step() -> None:
    modules = [stream_steps.STEPS, blob_steps.STEPS, exec_steps.STEPS]
    names = [verb for table in modules for verb in table]
    assert len(names) == len(set(names)), "a verb is played by two step modules"
    assert set(step_table()) == set(VERBS)
