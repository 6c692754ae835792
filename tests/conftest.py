"""Fixtures and checks for the whole suite.

- ``processes``: start ``workbench`` (or any command) as a real process for one test; everything
  it started is stopped at teardown (``tests/support.py`` has the helpers behind it).
- The ``slow`` marker: a test that starts a subprocess or a server (a socket that listens) must be
  marked ``@pytest.mark.slow``, so that ``pytest -m "not slow"`` is a quick everyday loop. A test
  that does so unmarked fails and says so; CI runs everything.
- Running on every core (``-n auto --dist loadgroup``, README command 2): tests that share a costly
  fixture run on one worker (an ``xdist_group``), so that it is built once; those groups start
  first, then the other slow tests, and the quick ones fill the workers' time at the end.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections import Counter
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from support import ProcessGroup, process_group, report_examples

_started: list[str] = []
_popen_execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]
_socket_listen = socket.socket.listen
_forkpty = os.forkpty


def _noting_execute_child(self: subprocess.Popen[Any], args: Any, *rest: Any, **kw: Any) -> Any:
    _started.append(f"subprocess {args!r}"[:200])
    return _popen_execute_child(self, args, *rest, **kw)


def _noting_listen(self: socket.socket, *args: Any) -> None:
    _started.append(f"a server listening on {self.getsockname()!r}")
    _socket_listen(self, *args)


def _noting_forkpty() -> tuple[int, int]:
    _started.append("a process on a pseudo-terminal")
    return _forkpty()


@pytest.fixture
def processes() -> Iterator[ProcessGroup]:
    """Processes a test starts with ``processes.workbench(...)``, ``.server(...)`` or ``.start(argv)``."""
    yield from process_group()


def pytest_configure(config: pytest.Config) -> None:
    # The overlay is compiled by protoc (a subprocess) on first use and cached on disk: do it once
    # here, so the first test to load a schema on a fresh clone is not charged with a process.
    from workbench.schema.loader import builtin_descriptor_set

    builtin_descriptor_set()
    subprocess.Popen._execute_child = _noting_execute_child  # type: ignore[attr-defined]
    socket.socket.listen = _noting_listen  # type: ignore[method-assign]
    os.forkpty = _noting_forkpty


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen._execute_child = _popen_execute_child  # type: ignore[attr-defined]
    socket.socket.listen = _socket_listen  # type: ignore[method-assign]
    os.forkpty = _forkpty


# Session fixtures that record traffic (a simulator, mitmdump, clients) or build a database from it: on
# two workers each would be made twice, so their tests share a group. Cheap session fixtures (a
# simulator's certificate folder, an idle simulator) are left out: grouping them would put whole
# folders on one worker.
RECORDING_FIXTURES = ("fixtures_captured_db", "fixtures_demo_db", "ingest_live", "ingest_recorded", "tui_rig_db",
                      "web_demo_db", "next_recording", "next_extracted", "generators")


def _xdist_group(item: pytest.Item) -> str | None:
    """The group a test runs in: the recording fixture it uses, else its module when it uses a
    module-scoped fixture (a server or a recording made once for the module), else none."""
    names = getattr(item, "fixturenames", ())
    for name in RECORDING_FIXTURES:
        if name in names:
            return name
    info = getattr(item, "_fixtureinfo", None)
    for name in names:
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].scope == "module":
            return item.nodeid.split("::", 1)[0]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups into the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Longest first, so that no long piece starts last: the groups, then the slow tests, then the rest
    # (each in collection order).
    grouped: list[pytest.Item] = []
    slow: list[pytest.Item] = []
    quick: list[pytest.Item] = []
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("xdist_group"):
            grouped.append(item)
        else:
            (slow if item.get_closest_marker("slow") else quick).append(item)
    items[:] = grouped + slow + quick


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    # What started between tests is no test's: pytest-xdist runs `uname -p` (platform.platform())
    # when a worker reports in, which would otherwise be charged to that worker's first test.
    _started.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    started = list(_started)
    _started.clear()
    outcome = yield
    report = outcome.get_result()
    if started and report.passed and item.get_closest_marker("slow") is None:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} starts {started[0]} but is not marked @pytest.mark.slow; "
                           f"mark it so that `pytest -m \"not slow\"` stays the quick loop")


# The hostile properties' example counts from pytest-xdist workers (tests/hostile/conftest.py puts
# them in each worker's output; that conftest is not loaded in the controller, this one is).
_worker_examples: Counter[str] = Counter()
_worker_planned: dict[str, int] = {}


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: without the plugin it is never called
def pytest_testnodedown(node: Any, error: object) -> None:
    got = json.loads(getattr(node, "workeroutput", {}).get("hostile_examples") or "{}")
    _worker_examples.update(got.get("ran", {}))
    _worker_planned.update(got.get("planned", {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    report_examples(terminalreporter, _worker_examples, _worker_planned)
