"""`workbench tui` on the command line: errors without a terminal, a real run in a pseudo-terminal."""

from __future__ import annotations

import os
import pty
import select
import sys
import time
from pathlib import Path

import pytest
from support import run_workbench

from workbench.tui.sample_db import HANG_SESSION


@pytest.mark.slow
def test_without_a_terminal_fails_clearly(tui_sample_db: Path) -> None:
    r = run_workbench("tui", "--db", str(tui_sample_db))
    assert r.returncode == 2
    assert "needs an interactive terminal" in r.stderr


@pytest.mark.slow
def test_missing_database_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.duckdb"
    r = run_workbench("tui", "--db", str(missing))
    assert r.returncode == 2
    assert f"{missing}: no such capture database" in r.stderr


def _read_until(fd: int, needle: bytes, timeout: float = 60) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        if time.monotonic() > deadline:
            raise AssertionError(f"{needle!r} not seen; got {buf[-2000:]!r}")
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    return buf


@pytest.mark.slow
def test_runs_in_a_terminal_and_quits(tui_sample_db: Path) -> None:
    pid, fd = pty.fork()
    if pid == 0:  # the child: the real command on a pseudo-terminal
        os.environ["TERM"] = "xterm-256color"
        os.environ["COLUMNS"], os.environ["LINES"] = "140", "40"
        os.execv(sys.executable, [sys.executable, "-m", "workbench.cli", "tui", "--db", str(tui_sample_db),
                                  HANG_SESSION[:8]])
    try:
        _read_until(fd, b"heartbeats over")          # the session screen with its folded run
        os.write(fd, b"q")                           # back to the sessions list
        _read_until(fd, b"sorted by")              # its status line
        os.write(fd, b"q")                           # quit
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                raise AssertionError("workbench tui did not exit on q")
            try:
                os.read(fd, 65536)
            except OSError:
                pass
            time.sleep(0.05)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        try:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        os.close(fd)
