"""What a simulated backend is configured with and what it remembers: ``SimConfig``, one
``RunRecord`` per run (for tests, the CLI log and other tools' end-to-end checks), ``SimState``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from workbench.sim.exec_completion import DEFAULT_POLICY, ExecRecord
from workbench.sim.scenario import DEFAULT_SCENARIO

DEFAULT_MODELS = ("default", "auto", "claude-4-sonnet", "claude-4-sonnet-thinking", "claude-4.5-sonnet",
                  "gpt-5", "gpt-5-codex", "composer-1", "grok-code-fast-1")


@dataclass(slots=True)
class SimConfig:
    scenario: str = DEFAULT_SCENARIO  # for requests without a [scenario:NAME] marker
    scenario_dirs: list[str] = field(default_factory=list)
    token: str | None = None  # None: any non-empty bearer token is accepted
    heartbeat_interval: float = 2.0
    park_timeout: float | None = None  # None: a parked run heartbeats until the client leaves
    models: tuple[str, ...] = DEFAULT_MODELS
    pace: float = 0.0  # seconds between streamed deltas
    stream_close: str = DEFAULT_POLICY  # required | accepted | ignored (docs/sim.md "Exec completion")
    exec_stream_close: tuple[str, ...] = ()  # per exec type: "shell_stream=required", …
    model_listing: str = "both"  # which GetUsableModels to serve: both | agent | aiserver
    # Hold the run until request_context_args is answered (a server that waits for it); by default
    # the run goes on and the tools come from the answer if one comes, else from the run request.
    strict_request_context: bool = False
    request_context_grace: float = 1.0  # seconds the first tool call waits for an answer on its way
    long_exec_seconds: int = 5  # {long_exec_seconds} in scenarios: how long long_exec's command runs


@dataclass
class RunRecord:
    """What one run did, for tests, the CLI log and other tools' end-to-end checks."""

    index: int
    transport: str
    request_id: str | None
    framing: str = "connect"  # connect | grpc_web | grpc_web_text | grpc (workbench.transport.framing)
    scenario: str | None = None
    model: str | None = None
    conversation_id: str | None = None
    # "steps"; "continuation" (new run on a known conversation); "resumed" (new run after tool calls
    # handed out by an unfinished turn); "history" (fresh run whose request carries answered tool
    # calls: continued after them); "on_reuse" (the client continued inside the same run)
    path: str = "steps"
    client_kinds: list[str] = field(default_factory=list)
    sent_kinds: list[str] = field(default_factory=list)
    execs: list[ExecRecord] = field(default_factory=list)
    blob_misses: list[str] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    waiting_for: str | None = None  # set while the run is parked on a client answer
    heartbeats: int = 0
    outcome: str | None = None
    finished: threading.Event = field(default_factory=threading.Event)

    def summary(self) -> str:
        bits = [f"run {self.index}", self.transport, f"scenario={self.scenario}", f"model={self.model}"]
        if self.framing != "connect":
            bits.insert(2, self.framing)
        if self.path != "steps":
            bits.append(f"path={self.path}")
        bits.append(f"-> {self.outcome}")
        bits.append(f"(sent {len(self.sent_kinds)}, received {len(self.client_kinds)})")
        if self.blob_misses:
            bits.append(f"blob misses: {len(self.blob_misses)}")
        if self.faults:
            bits.append("faults: " + "; ".join(self.faults))
        return " ".join(bits)


class SimState:
    """Per-server memory: blobs per conversation (conversation id → hex id → data; ``blobs_of``),
    conversations (id → last checkpoint), runs.

    ``open_tools`` holds, per conversation whose last turn did not end, the tool calls already
    handed out to the client (call_id, name, args): a new run on that conversation resumes after
    them instead of asking again (what a client that answers tool calls with a fresh run needs).
    """

    def __init__(self) -> None:
        self.blobs: dict[str, dict[str, bytes]] = {}
        self.conversations: dict[str, bytes] = {}
        self.seen_conversations: set[str] = set()
        self.open_tools: dict[str, list[dict[str, Any]]] = {}
        self.runs: list[RunRecord] = []
        self._lock = threading.Lock()

    def blobs_of(self, conversation_id: str) -> dict[str, bytes]:
        """The blobs of one conversation (hex id → data): what its client was asked to keep or gave
        back. Another conversation's blobs are not in it, even with the same id (ids are content
        hashes), as a client's blob store is per conversation."""
        return self.blobs.setdefault(conversation_id or "", {})

    def new_run(self, transport: str, request_id: str | None) -> RunRecord:
        with self._lock:
            rec = RunRecord(len(self.runs) + 1, transport, request_id)
            self.runs.append(rec)
            return rec

    async def finished_runs(self, count: int, timeout: float = 30.0) -> list[RunRecord]:
        """Async twin of ``wait_runs`` for code on the simulator's own event loop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            runs = list(self.runs)
            if len(runs) >= count and all(r.finished.is_set() for r in runs[:count]):
                return runs
            if loop.time() > deadline:
                raise TimeoutError(f"expected {count} finished runs, have {[r.outcome for r in runs]}")
            await asyncio.sleep(0.02)

    def wait_runs(self, count: int, timeout: float = 30.0, finished: bool = True) -> list[RunRecord]:
        """Block until ``count`` runs exist (and have finished); from another thread than the server's."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                runs = list(self.runs)
            if len(runs) >= count and (not finished or all(r.finished.is_set() for r in runs[:count])):
                return runs
            if time.monotonic() > deadline:
                raise TimeoutError(f"expected {count} finished runs, have {[r.outcome for r in runs]}")
            time.sleep(0.02)

