"""Fixtures and checks for the whole suite.

- ``processes``: start ``workbench`` (or any command) as a real process for one test; everything
  it started is stopped at teardown (``tests/support.py`` has the helpers behind it).
- The ``slow`` marker: a test that starts a subprocess or a server (a socket that listens) must be
  marked ``@pytest.mark.slow``, so that ``pytest -m "not slow"`` is a quick everyday loop. A test
  that does so unmarked fails and says so; CI runs everything.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Generator, Iterator
from typing import Any

import pytest
from support import ProcessGroup, process_group

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
