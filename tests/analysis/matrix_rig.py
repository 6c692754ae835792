"""The healthy-traffic matrix, recorded once (issue 11, item 5).

One ``workbench sim`` process, one mitmdump with the capture addon and the whole-body flow writer
(``tests/ingest/data/whole_body_flows.py``, which also exports a HAR through mitmproxy's own
exporter at shutdown), every cell's client run concurrently through it; then one import of the
flow file and one of the HAR, and ``workbench diagnose --all --json`` on every source's database.

Five sources: the live capture (``live``), the flow-file import (``flow``), the HAR import
(``har``), our client's own recording (``client``: ``record_to``, every wire frame as the client
saw it) and stream-json (``stream-json``: each of our client's turns printed the way
``cursor-agent -p --output-format stream-json --stream-partial-output`` prints one, by
``tests/clients/stream_json_reporter.py``, then ``workbench import``-ed). The Node client has no
recording of its own; stream-json shows no wire, so its failure cells are those a CLI's output can
show (``tool_loop``, ``server_error``).

A cell is (scenario, transport, client style, expected code): our client with ``--close-policy
always`` or ``streams-only``, or the Node.js test client (``tests/clients/node_agent_client.mjs``:
result alone, a final ``shell_result`` after a stream, never half-closing; Run and RunSSE only); and
both as clients that never answer ``request_context_args`` (``no-context``: ours, close policy
always; ``node-no-context``), their context in the run request, in every transport and framing
they speak (issue 21; a sample per scenario, see ``healthy_cells``).
Healthy cells expect no finding; failure cells their code, with evidence frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
for _dir in (HERE.parent / "capture", HERE.parent / "ingest", HERE.parent / "clients"):
    if str(_dir) not in sys.path:
        sys.path.insert(0, str(_dir))

from analysis_rig import echo_args_text  # noqa: E402
from capture_rig import ADDON, BIN, NODE_CLIENT  # noqa: E402
from import_rig import WHOLE_BODY_ADDON  # noqa: E402
from stream_json_reporter import stream_json_lines  # noqa: E402
from support import ci_run, env_without_proxy, free_port, proxied_environ, wait_port  # noqa: E402

TOKEN = "wb-matrix-token-7c1d5e"
SOURCES = ("live", "flow", "har", "client", "stream-json")
STREAM_JSON_CODES = ("tool_loop", "server_error")  # what a CLI's output can show of the failures
STYLES = ("always", "streams-only", "node", "no-context", "node-no-context")
# Clients that never answer request_context_args and put their context in the run request (issue 21):
# ours (close policy always) and the Node client, in every transport and framing they speak.
NO_CONTEXT = {"no-context": (("run", "connect"), ("runsse", "connect"), ("runsse", "grpc-web"), ("runpoll", "connect")),
              "node-no-context": (("run", "connect"), ("runsse", "connect"), ("runsse", "grpc-web"))}
# The scenarios that send request_context_args: every (transport, framing) of both clients. The others
# send none (they differ only in the run request's tools): each takes one (transport, framing) in turn,
# so every scenario and every transport/framing is covered; WORKBENCH_FULL_MATRIX=1 runs them all.
CONTEXT_SCENARIOS = ("tool_flow", "read_write")
TRANSPORTS = ("run", "runsse", "runpoll")
# Every scenario a well-behaved client completes (built-in, sim/scenarios/).
HEALTHY_SCENARIOS = ("text", "tool_flow", "read_write", "shell_stream", "explore", "web_search", "exec_abort",
                     "goaway_after_turn", "mcp_large_args")
SIM_HEARTBEAT_S = 0.1  # the simulator's heartbeat while it waits: stalls show quickly
CLIENT_HEARTBEAT_S = 2.0  # the clients' own heartbeats (real ones: 5 s), each a BidiAppend on RunSSE/RunPoll; slower
# than any append's trip through a loaded mitmdump, so a heartbeat in flight at the end is told from a late one
HEARTBEAT_BUDGET = 8  # a stalled client gives up after this many server heartbeats in a row
CONCURRENCY = 6


@dataclass(frozen=True)
class Cell:
    scenario: str
    transport: str
    style: str  # always | streams-only | node | no-context | node-no-context
    expect: str | None = None  # the finding code a failure cell must produce
    case: str = "healthy"  # the failure's name in the matrix table
    faults: tuple[str, ...] = ()
    turns: int = 1
    ignore_exec: bool = False  # the exec handler never answers (unanswered exec)
    also: tuple[str, ...] = ()  # codes that must come with ``expect`` (what the failure leads to)
    framing: str = "connect"  # connect | grpc-web

    @property
    def node(self) -> bool:
        return self.style.startswith("node")

    @property
    def answers_context(self) -> bool:
        return not self.style.endswith("no-context")

    @property
    def name(self) -> str:
        framing = "" if self.framing == "connect" else f"+{self.framing}"
        return f"{self.case}/{self.scenario}/{self.transport}{framing}/{self.style}"

    @property
    def sources(self) -> tuple[str, ...]:
        """The sources that hold this cell: the Node client has no recording and prints no stream-json."""
        out = ["live", "flow", "har"]
        if not self.node:
            out.append("client")
            if not self.ignore_exec and (self.expect is None or self.expect in STREAM_JSON_CODES):
                out.append("stream-json")
        return tuple(out)

    def prompts(self) -> list[str]:
        first = f"[scenario:{self.scenario}] please go ahead"
        return [first] + [f"[scenario:{self.scenario}] and now?"] * (self.turns - 1)


def _transports(style: str, transports: Sequence[str] = TRANSPORTS) -> list[str]:
    return [t for t in transports if not style.startswith("node") or t != "runpoll"]  # the Node client: Run, RunSSE


def healthy_cells() -> list[Cell]:
    """The healthy cells. CI (``support.ci_run``) runs every (style, transport) of every scenario;
    a developer's run (README command 2) runs them for the scenarios that send request_context_args
    and a third of them, in turn, for each other scenario, so every scenario and every (style,
    transport) still runs (the matrix is the suite's slowest fixture)."""
    combos = [(style, t) for style in STYLES if style not in NO_CONTEXT for t in _transports(style)]
    full = os.environ.get("WORKBENCH_FULL_MATRIX", "") not in ("", "0")
    every = full or ci_run()
    out = [Cell(s, t, style) for i, s in enumerate(HEALTHY_SCENARIOS)
           for j, (style, t) in enumerate(combos) if every or s in CONTEXT_SCENARIOS or j % 3 == i % 3]
    for style, combos in NO_CONTEXT.items():
        for i, s in enumerate(HEALTHY_SCENARIOS):
            take = combos if full or s in CONTEXT_SCENARIOS else (combos[i % len(combos)],)
            out.extend(Cell(s, t, style, framing=f) for t, f in take)
    return out


def failure_cells() -> list[Cell]:
    out: list[Cell] = []

    def add(case: str, expect: str, scenario: str, styles: Sequence[str], transports: Sequence[str] = TRANSPORTS,
            **kw: Any) -> None:
        out.extend(Cell(scenario, t, style, expect, case, **kw) for style in styles for t in _transports(style, transports))

    # The December 2025 service (scenario stream_close: required) and a client that sends results alone.
    add("strict_sim_no_close", "missing_stream_close", "stream_close_stall", ("streams-only", "node"),
        also=("heartbeat_loop",))
    add("kv_only_answer", "kv_only_response", "kv_only_on_reuse", ("always",), faults=("reuse_session",), turns=2)
    add("cumulative_args", "args_cumulative_snapshots", "mcp_large_args", ("always",), faults=("naive_args_concat",))
    add("append_seqno_restart", "append_seqno_anomaly", "tool_flow", ("always",), ("runsse", "runpoll"),
        faults=("reset_append_seqno",))
    add("no_turn_end", "stream_ended_without_turn_end", "no_turn_end", ("always", "node"))
    add("no_conversation_state", "missing_conversation_state", "text", ("always",),
        faults=("omit_conversation_state",))
    add("tool_loop", "tool_loop", "tool_loop", ("always", "node"))
    add("unanswered_exec", "unanswered_exec", "tool_flow", ("always", "node"), ignore_exec=True,
        also=("heartbeat_loop",))
    add("rate_limit", "server_error", "rate_limit", ("always", "node"))
    return out


@dataclass
class Source:
    db: Path
    sessions: list[dict[str, Any]]  # the sessions table
    findings: dict[str, list[dict[str, Any]]]  # session_id → the findings diagnose printed
    frames: dict[str, dict[int, dict[str, Any]]]  # session_id → seq → (kind, direction, transport, append_seqno)
    transport: str | None = None  # every session's transport when the source has one (stream-json: cli_ndjson)

    def session(self, rid: str, transport: str) -> dict[str, Any] | None:
        transport = self.transport or transport
        found = [s for s in self.sessions if s["request_id"] == rid and s["transport"] == transport]
        return found[0] if len(found) == 1 else None


@dataclass
class Matrix:
    out: Path
    cells: list[Cell]
    client_db: Path | None = None  # our client's own recordings (record_to)
    stream_json: list[Path] = field(default_factory=list)  # one stream-json file per turn of our client
    rids: dict[Cell, list[str]] = field(default_factory=dict)  # the runs of a cell (a new run per turn, or one)
    outcomes: dict[Cell, list[str | None]] = field(default_factory=dict)  # per turn: the client's error, or None
    sources: dict[str, Source] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def sessions(self, cell: Cell, source: str) -> list[dict[str, Any] | None]:
        """The cell's sessions in ``source``, one per run (None where the source has no session for it)."""
        if source not in cell.sources:
            return []
        return [self.sources[source].session(rid, cell.transport) for rid in self.rids[cell]]

    def findings(self, cell: Cell, source: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(session, finding) for every finding in the cell's sessions; notes (severity "note":
        what did no harm here) are not findings."""
        return [(s, f) for s in self.sessions(cell, source) if s is not None
                for f in self.sources[source].findings.get(s["session_id"], []) if f["severity"] != "note"]

    def codes(self, cell: Cell, source: str) -> list[str]:
        return sorted({f["code"] for _s, f in self.findings(cell, source)})

    def recorded(self, cell: Cell, source: str) -> bool:
        return all(s is not None for s in self.sessions(cell, source))


# clients -----------------------------------------------------------------------------------------


def _workspace(root: Path) -> Path:
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text("# demo\nTODO: hello\n")
    (root / "tmp" / "scratch.txt").write_text("scratch\n")
    return root


def _print_stream_json(m: Matrix, n: int, prompt: str, res: Any, ws: Path, start_ms: int) -> None:
    """The turn as the CLI would print it (one chat per ``-p`` invocation), to a file of its own."""
    folder = m.out / "stream-json"
    folder.mkdir(exist_ok=True)
    path = folder / f"turn-{n:04d}.ndjson"
    lines = stream_json_lines(prompt, res, session_id=str(uuid.uuid4()), cwd=str(ws), model="default",
                              start_ms=start_ms, end_ms=int(time.time() * 1000))
    path.write_text("\n".join(lines) + "\n")
    m.stream_json.append(path)


async def _ours(m: Matrix, i: int, cell: Cell, url: str, ca: Path, ws: Path, store: Any
                ) -> tuple[list[str], list[str | None]]:
    from workbench.client.agent import AgentClient
    from workbench.client.events import Error, TurnEnded

    kw: dict[str, Any] = {"transport": cell.transport, "faults": cell.faults,
                          "close_policy": cell.style if cell.answers_context else "always", "framing": cell.framing,
                          "answer_request_context": cell.answers_context,
                          "heartbeat_interval": CLIENT_HEARTBEAT_S, "verify": str(ca), "record_to": store}
    if cell.expect is not None:
        kw["heartbeat_budget"] = HEARTBEAT_BUDGET
    if not cell.ignore_exec:  # files and shell answered here, MCP by the caller (echoing the args it got)
        kw.update(execute_locally=True, workspace=ws, allow_shell=True)
    errors: list[str | None] = []
    rids: list[str] = []
    async with AgentClient(url, TOKEN, **kw) as client:
        for turn, prompt in enumerate(cell.prompts()):
            error: str | None = None
            start_ms = int(time.time() * 1000)
            if cell.ignore_exec:  # a caller that takes the exec and never answers it, still reading
                async for ev in client.stream_turn(prompt):
                    if isinstance(ev, Error):
                        error = ev.code
                    if isinstance(ev, TurnEnded):
                        break
            else:
                res = await client.run_turn(prompt, on_exec=echo_args_text, raise_on_error=False)
                error = res.error.code if res.error else None
                if "stream-json" in cell.sources:
                    _print_stream_json(m, i * 10 + turn, prompt, res, ws, start_ms)
            errors.append(error)
            assert client.last_request_id
            if client.last_request_id not in rids:
                rids.append(client.last_request_id)
    return rids, errors


async def _node(cell: Cell, url: str, ca: Path, proxy: str, logs: Path) -> tuple[list[str], list[str | None]]:
    rid = str(uuid.uuid4())
    cmd = [str(shutil.which("node")), str(NODE_CLIENT), "--base-url", url, "--ca", str(ca), "--proxy", proxy,
           "--transport", cell.transport, "--prompt", cell.prompts()[0], "--request-id", rid, "--token", TOKEN,
           "--heartbeat-ms", str(int(CLIENT_HEARTBEAT_S * 1000)), "--timeout-ms", "120000"]
    if cell.expect is not None:
        cmd += ["--heartbeat-budget", str(HEARTBEAT_BUDGET)]
    if cell.ignore_exec:
        cmd += ["--ignore-exec", "shell"]
    if cell.framing != "connect":
        cmd += ["--framing", cell.framing]
    if not cell.answers_context:
        cmd += ["--no-request-context"]
    with (logs / f"node-{rid}.stderr").open("wb") as err:
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.PIPE, stderr=err, env=env_without_proxy())
        out, _ = await proc.communicate()
    summary = json.loads(out.decode().splitlines()[-1])
    assert summary["request_id"] == rid
    if proc.returncode == 0:
        return [rid], [None]
    return [rid], [summary["error"] or f"turn_ended {summary['turn_ended']}, end {summary['end_frame']}"]


async def _drive(m: Matrix, url: str, ca: Path, proxy: str, store: Any) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int, cell: Cell) -> None:
        async with gate:
            if cell.node:
                rids, errors = await asyncio.wait_for(_node(cell, url, ca, proxy, m.out), 180)
            else:
                rids, errors = await asyncio.wait_for(
                    _ours(m, i, cell, url, ca, _workspace(m.out / f"ws-{i}"), store), 180)
            m.rids[cell] = rids
            m.outcomes[cell] = errors

    with proxied_environ(HTTPS_PROXY=proxy, https_proxy=proxy, SSL_CERT_FILE=str(ca)):
        await asyncio.gather(*(one(i, c) for i, c in enumerate(m.cells)))


# processes -----------------------------------------------------------------------------------------


def _stop(proc: subprocess.Popen[Any], sig: int, timeout: float = 120) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def _cli(*args: str) -> str:
    """Run a workbench command in this process (no interpreter start-up per call); its stdout."""
    from workbench.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(list(args))
    assert code in (0, 1), (args, code, buf.getvalue()[-2000:])
    return buf.getvalue()


def _source(db: Path, transport: str | None = None) -> Source:
    from workbench.store import open_reader

    findings: dict[str, list[dict[str, Any]]] = {}
    for line in _cli("diagnose", "--all", "--json", "--db", str(db)).splitlines():
        doc = json.loads(line)
        findings[doc["session_id"]] = doc["findings"]
    r = open_reader(db)
    try:
        sessions = r.query("SELECT session_id, request_id, transport, status, source, meta FROM sessions").to_pylist()
        frames: dict[str, dict[int, dict[str, Any]]] = {}
        for row in r.query("SELECT session_id, seq, kind, direction, transport, append_seqno FROM frames").to_pylist():
            frames.setdefault(row.pop("session_id"), {})[row.pop("seq")] = row
    finally:
        r.close()
    for s in sessions:
        s["meta"] = json.loads(s["meta"]) if s["meta"] else {}
    return Source(db, sessions, findings, frames, transport)


def record_matrix(out: Path, cells: Sequence[Cell]) -> Matrix:
    """Run every cell once through one simulator and one mitmdump; import; diagnose the five sources."""
    from workbench.store import Store

    m = Matrix(out, list(cells), client_db=out / "client.duckdb")
    live_db, flows, har = out / "live.duckdb", out / "whole.flows", out / "whole.har"
    t0 = time.monotonic()
    sim = subprocess.Popen(
        [str(BIN / "workbench"), "sim", "--port", "0", "--heartbeat-interval", str(SIM_HEARTBEAT_S), "--pace", "0.005",
         "--park-timeout", "60", "--cert-dir", str(out / "sim-certs"), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env_without_proxy())
    mitm: subprocess.Popen[Any] | None = None
    try:
        assert sim.stdout is not None
        url = sim.stdout.readline().strip()
        assert url.startswith("https://127.0.0.1:"), url
        sim.stdout.readline()
        port = free_port()
        confdir = out / "mitm-conf"
        with (out / "mitmdump.log").open("w") as log:
            mitm = subprocess.Popen(
                [str(BIN / "mitmdump"), "-q", "-s", str(ADDON), "-s", str(WHOLE_BODY_ADDON),
                 "--listen-host", "127.0.0.1", "--listen-port", str(port), "--set", f"confdir={confdir}",
                 "--set", "ssl_insecure=true", "--set", f"cursor_db={live_db}",
                 "--set", f"whole_body_flows={flows}", "--set", f"whole_body_har={har}"],
                stdout=log, stderr=subprocess.STDOUT, env=env_without_proxy())
        wait_port(port, mitm)
        ca = confdir / "mitmproxy-ca-cert.pem"
        m.seconds["start"] = time.monotonic() - t0
        store = Store(m.client_db)  # one writer for every client of this process (DuckDB: one per file)
        try:
            asyncio.run(_drive(m, url, ca, f"http://127.0.0.1:{port}", store))
        finally:
            store.close()
        m.seconds["clients"] = time.monotonic() - t0 - m.seconds["start"]
    finally:
        if mitm is not None:
            assert _stop(mitm, signal.SIGINT) == 0, (out / "mitmdump.log").read_text()[-3000:]
        _stop(sim, signal.SIGTERM)
    t1 = time.monotonic()
    flow_db, har_db, sj_db = out / "flow.duckdb", out / "har.duckdb", out / "stream-json.duckdb"
    _cli("import", str(flows), "--db", str(flow_db))
    _cli("import", str(har), "--db", str(har_db))
    _cli("import", *map(str, m.stream_json), "--db", str(sj_db))
    m.seconds["imports"] = time.monotonic() - t1
    t2 = time.monotonic()
    for name, db in (("live", live_db), ("flow", flow_db), ("har", har_db), ("client", m.client_db)):
        m.sources[name] = _source(db)
    m.sources["stream-json"] = _source(sj_db, "cli_ndjson")
    m.seconds["diagnose"] = time.monotonic() - t2
    return m


# the table ---------------------------------------------------------------------------------------


def table(m: Matrix) -> str:
    """The matrix for the report: sessions/findings per (style, transport) × source on healthy cells,
    and per failure the cells that gave their code in each source ("-": the source cannot hold it)."""
    lines = []
    healthy = [c for c in m.cells if c.expect is None]
    diagnosed = sum(len(c.sources) for c in healthy)
    lines.append(f"healthy: {len(HEALTHY_SCENARIOS)} scenarios × transports × styles = {len(healthy)} cells; "
                 f"{diagnosed} sessions diagnosed across {len(SOURCES)} sources (sessions/findings)")
    lines.append(f"{'style':15} {'transport':16} " + " ".join(f"{s:>11}" for s in SOURCES))
    for style, transport, framing in dict.fromkeys((c.style, c.transport, c.framing) for c in healthy):
        cells = [c for c in healthy if (c.style, c.transport, c.framing) == (style, transport, framing)]
        row = []
        for s in SOURCES:
            held = [c for c in cells if s in c.sources]
            n = sum(1 for c in held for x in m.sessions(c, s) if x is not None)
            f = sum(len(m.findings(c, s)) for c in held)
            row.append(f"{n}/{f}" if held else "-")
        shown = transport if framing == "connect" else f"{transport}+{framing}"
        lines.append(f"{style:15} {shown:16} " + " ".join(f"{r:>11}" for r in row))
    per_source = {s: sum(len(m.findings(c, s)) for c in healthy) for s in SOURCES}
    lines.append(f"findings on healthy sessions: {sum(per_source.values())} "
                 f"({', '.join(f'{s} {n}' for s, n in per_source.items())})")
    lines.append("")
    lines.append(f"{'failure':22} {'expected code':30} {'cells':5} " + " ".join(f"{s:>11}" for s in SOURCES)
                 + "  what the clients saw")
    for case in dict.fromkeys(c.case for c in m.cells if c.expect is not None):
        cells = [c for c in m.cells if c.case == case]
        hits = []
        for s in SOURCES:
            held = [c for c in cells if s in c.sources]
            hits.append(f"{sum(1 for c in held if c.expect in m.codes(c, s))}/{len(held)}" if held else "-")
        saw = sorted({" → ".join((e or "turn completed").split(":")[0] for e in m.outcomes[c]) for c in cells})
        lines.append(f"{case:22} {cells[0].expect:30} {len(cells):5} " + " ".join(f"{h:>11}" for h in hits)
                     + "  " + "; ".join(saw))
    lines.append("")
    lines.append("timing (s): " + ", ".join(f"{k} {v:.1f}" for k, v in m.seconds.items()))
    return "\n".join(lines)
