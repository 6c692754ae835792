"""``workbench demo``: the whole workbench on a fresh machine, with nothing to configure.

It starts the simulated backend, a live capture (mitmdump with our addon) in front of it, drives a
suite of healthy and deliberately broken sessions through the built-in client, then diagnoses the
capture and opens the TUI on it. Everything runs on loopback with throwaway credentials.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from workbench.analysis.report import print_report
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.protocol.labels import store_labels
from workbench.store.queries import meta_keys_and_rows

DEMO_DB = "captures/demo.duckdb"
DEMO_MARK = "workbench_demo"  # key in the database's meta table: this database is the demo's to replace
DEMO_TOKEN = "demo-token-not-a-secret"
HEARTBEAT_INTERVAL = 0.1


@dataclass
class Scenario:
    name: str
    title: str
    prompt: str
    transport: str = "run"
    faults: tuple[str, ...] = ()
    turns: int = 1
    tools: bool = False
    expect_error: bool = False


SUITE = [
    Scenario("text", "healthy text turn", "[scenario:text] Say hello to the workbench."),
    Scenario("tool_flow", "tool flow (shell exec, then text)", "[scenario:tool_flow] List the files here."),
    Scenario("tool_flow_sse", "tool flow over RunSSE + BidiAppend", "[scenario:tool_flow] List the files.",
             transport="runsse"),
    Scenario("heartbeat_loop", "heartbeat loop (client forgets stream_close, server requires it)",
             "[scenario:stream_close_stall] List the files here.", faults=("no_stream_close",), expect_error=True),
    Scenario("args_corruption", "args corruption (cumulative args concatenated)",
             "[scenario:mcp_large_args] Plan the tasks.", faults=("naive_args_concat",), tools=True),
    Scenario("kv_only", "answer only in KV (same-session continuation)",
             "[scenario:kv_only_on_reuse] Run the tests.", faults=("reuse_session",), turns=2, expect_error=True),
    Scenario("rate_limit", "rate-limit error mid-turn", "[scenario:rate_limit] Write a long essay.",
             expect_error=True),
]

DEMO_TOOLS = [
    {"name": "todo_write", "description": "Write the task list",
     "parameters": {"type": "object", "properties": {"tasks": {"type": "array"}, "merge": {"type": "boolean"}}}},
]


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "demo")
    p.add_argument("--db", default=DEMO_DB, help=f"capture database to (re)create (default {DEMO_DB})")
    p.add_argument("--no-tui", action="store_true", help="do not open the TUI at the end")
    p.add_argument("--keep", action="store_true", help="append to an existing demo database")
    p.add_argument("--force", action="store_true",
                   help="replace --db even when it is not a demo database or a capture is writing it")
    p.set_defaults(func=cmd_demo)


def say(msg: str) -> None:
    print(msg, flush=True)


def cmd_demo(args: argparse.Namespace) -> int:
    started = time.monotonic()
    db = Path(args.db)
    if not args.force:
        check_replaceable(db)
    if not args.keep:
        for suffix in ("", ".wal", ".spool", ".live.json"):
            Path(str(db) + suffix).unlink(missing_ok=True)
    mark_demo(db)

    # deferred: the simulator (h2, protobuf) loads when the demo runs, not for `demo --help`
    from workbench.sim.runner import SimThread

    say("[1/5] starting the simulated agent backend")
    with SimThread(heartbeat_interval=HEARTBEAT_INTERVAL, token=DEMO_TOKEN) as sim:
        say(f"      {sim.url} (self-signed certificate {sim.cert_path})")
        say("[2/5] starting the live capture (mitmdump + workbench addon)")
        capture = CaptureProcess(db)
        try:
            capture.start()
            say(f"      proxy {capture.url}, CA {capture.ca_path}")
            say("[3/5] running the scenario suite through the capture")
            labels: dict[str, str] = {}
            results = asyncio.run(run_suite(sim.url, capture, labels))
        finally:
            capture.stop()
    say(f"      capture stopped; {db} written")
    say("[4/5] diagnosing (the broken sessions are broken on purpose: their findings are the point)")
    diagnose(db, labels)
    failed = [name for name, outcome in results if outcome.startswith(("error:", "stalled"))]
    say(f"[5/5] done in {time.monotonic() - started:.1f} s — browse it with: workbench tui --db {db}")
    if failed:
        raise CliError(f"scenario(s) {', '.join(failed)} did not behave as the demo expects")
    if not args.no_tui and sys.stdin.isatty() and sys.stdout.isatty():
        # deferred: Textual loads only when the demo opens the TUI (a terminal on both ends)
        from workbench.tui.app import run_app

        run_app(str(db))
    return 0


def _live_writer(db: Path) -> int | None:
    """The pid of a capture proved to be writing ``db`` (``live.live_pid``: its sidecar passes the
    handshake), or None. A stale sidecar's pid may name any running process (PID 1 in a container)."""
    # deferred: the store (duckdb, pyarrow) loads when the demo runs, not for `demo --help`
    from workbench.store.live import live_pid

    return live_pid(db)


def check_replaceable(db: Path) -> None:
    """Refuse (CliError, exit 2) a ``--db`` the demo would destroy someone's data by replacing.

    The demo deletes its database (with WAL, spool and sidecar) and writes into it. That is safe
    only for a database the demo made — it marks one in ``meta`` before anything is written — or
    one with nothing in it, and never while a capture is writing it (its live sidecar names a
    running process, or DuckDB's lock is held).
    """
    force = "; --force replaces it anyway"
    pid = _live_writer(db)
    if pid is not None:
        raise CliError(f"--db {db}: a capture (pid {pid}) is writing it; stop that capture or pick another --db{force}")
    if not db.exists():
        if Path(str(db) + ".spool").exists():
            raise CliError(f"--db {db}: frames of a capture wait in {db}.spool to be merged into it{force}")
        return
    import duckdb  # deferred, as the store below: when the demo runs, not for `demo --help`

    from workbench.store.reader import ConnectionReader  # deferred: duckdb, pyarrow

    try:
        con = duckdb.connect(str(db), read_only=True)
    except duckdb.IOException as exc:
        if "lock" in str(exc).lower():
            raise CliError(f"--db {db}: another process holds it open (a capture writing it?){force}") from exc
        raise CliError(f"--db {db}: not a workbench capture database ({exc}){force}") from exc
    except duckdb.Error as exc:
        raise CliError(f"--db {db}: not a workbench capture database ({exc}){force}") from exc
    try:
        keys, held = meta_keys_and_rows(ConnectionReader(con, str(db)))
    except duckdb.Error as exc:
        raise CliError(f"--db {db}: not a workbench capture database ({exc}){force}") from exc
    finally:
        con.close()
    if DEMO_MARK in keys:
        return
    if "schema_version" not in keys:
        raise CliError(f"--db {db}: not a workbench capture database{force}")
    if held:  # an empty capture database loses nothing
        raise CliError(f"--db {db}: not a demo database (it holds {held:,} sessions and frames); the demo "
                       f"replaces only a database it made{force}")


def mark_demo(db: Path) -> None:
    """Mark ``db`` as the demo's before the capture writes into it, so a later demo may replace it."""
    from workbench.store.db import Store  # deferred: duckdb loads when the demo runs, not for `demo --help`

    with Store(db) as store:
        store.set_meta(DEMO_MARK, json.dumps({"created_by": "workbench demo"}))


class CaptureProcess:
    """``workbench capture`` as a child process, stopped with SIGTERM (which flushes).

    Its mitmproxy configuration (the throwaway CA the demo's client trusts) goes in a temporary
    directory of its own, removed at ``stop``, unless ``confdir`` names one: the demo leaves
    nothing behind in the working directory or next to the database but the database itself.
    """

    def __init__(self, db: Path, confdir: Path | None = None) -> None:
        self.db = db
        self._own_confdir = confdir is None
        self.confdir = Path(tempfile.mkdtemp(prefix="workbench-demo-mitmproxy-")) if confdir is None else confdir
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.ca_path = str(self.confdir / "mitmproxy-ca-cert.pem")

    def start(self) -> None:
        cmd = [sys.executable, "-m", "workbench.cli", "capture", "--port", "0", "--db", str(self.db),
               "--confdir", str(self.confdir), "--", "--set", "ssl_insecure=true"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().strip()
        if not first.startswith("http"):
            self.stop()
            raise CliError(f"workbench capture did not start (first line: {first!r})")
        self.url = first
        _wait_for_port(self.url, self.proc)
        deadline = time.monotonic() + 30
        while not Path(self.ca_path).exists():
            if time.monotonic() > deadline:
                raise CliError(f"mitmproxy CA {self.ca_path} was not created")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self._own_confdir:
            shutil.rmtree(self.confdir, ignore_errors=True)


def _wait_for_port(url: str, proc: subprocess.Popen[str]) -> None:
    parts = urlsplit(url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CliError(f"workbench capture exited with {proc.returncode} before listening")
        try:
            with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise CliError(f"capture proxy {url} is not accepting connections")


async def run_suite(sim_url: str, capture: CaptureProcess,
                    labels: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Drive every scenario through the capture; ``labels`` collects session id → scenario name."""
    # deferred: the agent client (httpx, h2, protobuf) loads when the demo runs, not for `demo --help`
    from workbench.client.agent import AgentClient

    # The built-in client honours HTTPS_PROXY like any other client: that is how it is captured.
    os.environ["HTTPS_PROXY"] = capture.url
    os.environ.pop("NO_PROXY", None)
    os.environ.pop("no_proxy", None)
    results: list[tuple[str, str]] = []
    for sc in SUITE:
        client = AgentClient(sim_url, DEMO_TOKEN, transport=sc.transport, faults=sc.faults,
                             heartbeat_budget=15, heartbeat_interval=1.0, verify=capture.ca_path)
        sessions: list[str] = []
        try:
            outcome = await _drive(client, sc, sessions)
        finally:
            await client.aclose()
        if labels is not None:
            labels.update(dict.fromkeys(sessions, sc.name))
        say(f"      {sc.title}: {outcome}")
        results.append((sc.name, outcome))
    return results


async def _drive(client: Any, sc: Scenario, sessions: list[str]) -> str:
    """Run the scenario's turns; ``sessions`` gets the id of each run it started (its request id)."""
    # deferred: loaded by run_suite already; not for `demo --help`
    from workbench.client.agent import AgentError

    on_exec: Callable[[Any], Awaitable[Any]] = _answer_exec
    outcome = ""
    for turn in range(sc.turns):
        prompt = sc.prompt if turn == 0 else "[scenario:kv_only_on_reuse] And now?"
        try:
            res = await asyncio.wait_for(
                client.run_turn(prompt, tools=DEMO_TOOLS if sc.tools else None, on_exec=on_exec), timeout=30)
        except AgentError as exc:
            return f"error as expected: {exc}" if sc.expect_error else f"error: {exc}"
        except TimeoutError:
            return "stalled (gave up after 30 s)"
        finally:
            if client.last_request_id and client.last_request_id not in sessions:
                sessions.append(client.last_request_id)
        outcome = f"{len(res.text)} chars of text, {len(res.tool_calls)} tool call(s)"
        if not res.ended:
            outcome += ", no turn_ended"
    return outcome


async def _answer_exec(ev: Any) -> Any:
    """Stand-in results for the scenario's tools: the demo never runs commands on your machine."""
    if ev.kind in ("shell_args", "shell_stream_args"):
        return "README.md\nworkbench\ncaptures\n"
    # An MCP tool that reports what it was handed: the args as the client rebuilt them, which is
    # how a naive client's garbled concatenation becomes visible on the wire.
    text = ev.call.args_text if ev.call is not None else json.dumps(ev.args)
    return f"todo_write received: {text}"


def diagnose(db: Path, labels: dict[str, str] | None = None) -> int:
    """Label the demo's sessions with their scenario names, then analyse and report."""
    # deferred: the analysis engine and the store (duckdb, protobuf) load when the demo runs, not for `demo --help`
    from workbench.analysis import analyze
    from workbench.store.db import Store

    with Store(db) as store:
        store_labels(store, labels or {})
        results = analyze(store)
    return print_report(results)
