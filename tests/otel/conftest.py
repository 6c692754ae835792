"""Shared pieces of the OpenTelemetry export tests: the demo's database (made once per run by
``workbench demo --no-tui``, the sessions a user sees first) and the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.analysis.bridge_join import store_links
from workbench.decode.frame import Frame
from workbench.protocol import kinds
from workbench.store.db import FrameBatch, SessionInfo, Store, us_to_datetime


def wb(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="session")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's capture: healthy and broken sessions through a real capture, diagnosed."""
    where = tmp_path_factory.mktemp("otel-demo")
    db = where / "demo.duckdb"
    proc = subprocess.run([sys.executable, "-m", "workbench", "demo", "--no-tui", "--db", str(db)], cwd=where,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return db


T0 = 1_760_000_000_000_000  # µs
S = 1_000_000


def bridge_db(path: Path) -> Path:
    """An OpenAI request (o1) whose run (r1) streamed a tool call the client then answered in a
    follow-up request (o2): the two sides of a bridge, with their links stored."""
    with Store(path) as store:
        store.upsert_sessions([
            SessionInfo("o1", transport="openai_chat", model="m", started_at=us_to_datetime(T0),
                        ended_at=us_to_datetime(T0 + 10 * S), status="complete", http_status=200),
            SessionInfo("r1", transport="run", model="m", started_at=us_to_datetime(T0 + S),
                        ended_at=us_to_datetime(T0 + 9 * S), status="complete"),
            SessionInfo("o2", transport="openai_chat", started_at=us_to_datetime(T0 + 30 * S),
                        ended_at=us_to_datetime(T0 + 31 * S), status="complete", http_status=200),
        ])
        b = FrameBatch()
        b.add("o1", 0, T0 + 100, "client", "openai_chat", None,
              Frame(kinds.OPENAI_REQUEST, "request", b'{"model":"m","stream":true}'))
        b.add("o1", 1, T0 + 5 * S, "server", "openai_chat", None,
              Frame(kinds.OPENAI_TOOL_CALLS, "tool call", b"{}", call_id="call_1"))
        b.add("o1", 2, T0 + 6 * S, "server", "openai_chat", None,
              Frame(kinds.OPENAI_FINISH, "finish", b'{"choices":[{"finish_reason":"tool_calls"}]}'))
        b.add("r1", 0, T0 + 1 * S, "client", "run", None, Frame(kinds.RUN_REQUEST, "run", b""))
        b.add("r1", 1, T0 + 2 * S, "server", "run", None, Frame(kinds.TEXT_DELTA, "text", b"hello"))
        b.add("r1", 2, T0 + 3 * S, "server", "run", None,
              Frame(kinds.TOOL_CALL_STARTED, "call", b"tc", call_id="call_1"))
        b.add("o2", 0, T0 + 30 * S, "client", "openai_chat", None,
              Frame(kinds.OPENAI_REQUEST, "follow-up", b'{"messages":[{"tool_call_id":"call_1"}]}', call_id="call_1"))
        store.insert_frames(b)
        store_links(store, ["o1", "r1", "o2"])
    return path
