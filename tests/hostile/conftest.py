"""The hostile suite: example counts per property, printed (and saved) at the end of the run.

``WORKBENCH_HYPOTHESIS_EXAMPLES`` scales every property's count (strategies.example_count);
``WORKBENCH_HYPOTHESIS_REPORT=PATH`` also writes the counts as JSON, for the CI log or a closing
note: ``{"test_name": {"planned": N, "ran": M}}``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from strategies import PLANNED, RAN
from support import report_examples


@pytest.fixture
def scratch(tmp_path: Path) -> Callable[[], Path]:
    """A fresh folder per Hypothesis example (``tmp_path`` is shared by all examples of a test),
    with ``in/`` for the generated input (not scanned: it holds the canary by design) and ``run/``
    for everything the workbench writes (the database, exports, logs: scanned)."""
    def make() -> Path:
        d = Path(tempfile.mkdtemp(dir=tmp_path))
        (d / "in").mkdir()
        (d / "run").mkdir()
        return d

    return make


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A property runs all its examples (and shrinks a failure for up to 5 min) within one test:
    # the suite's 300 s per test is too short for that, so the hostile tests get 900 s.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(900))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # On a pytest-xdist worker the counts are the worker's: they travel to the controller in the
    # worker's output, and the root conftest (loaded there) prints them.
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["hostile_examples"] = json.dumps({"ran": dict(RAN), "planned": PLANNED})


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report_examples(terminalreporter, RAN, PLANNED)
