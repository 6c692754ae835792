"""``workbench sim``: run the simulated agent backend until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.sim.exec_completion import DEFAULT_POLICY, EXEC_TYPES, POLICIES, REQUIRED, server_policy
from workbench.sim.models import LISTING_CHOICES
from workbench.sim.scenario import DEFAULT_SCENARIO, ScenarioError, load_scenarios, unknown_scenario_message
from workbench.sim.state import DEFAULT_MODELS, RunRecord, SimConfig


def register(sub: Any) -> None:
    p = add_command(sub, "sim")
    p.add_argument("--port", type=int, default=0, help="listen port (0 = a free port; default 0)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--token", default=None,
                   help="accept only this bearer token (default: any non-empty token)")
    p.add_argument("--scenario", default=DEFAULT_SCENARIO,
                   help=f"scenario for requests without a marker (default {DEFAULT_SCENARIO})")
    p.add_argument("--scenario-dir", action="append", default=[], metavar="DIR",
                   help="extra folder of scenario *.json files (repeatable; later folders win)")
    p.add_argument("--list-scenarios", action="store_true", help="list the scenarios and exit")
    p.add_argument("--heartbeat-interval", type=float, default=2.0,
                   help="seconds between heartbeats while waiting for the client (default 2.0)")
    p.add_argument("--park-timeout", type=float, default=None,
                   help="end a parked run with deadline_exceeded after this many seconds (default: never)")
    p.add_argument("--pace", type=float, default=0.0, help="seconds between streamed deltas (default 0)")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS),
                   help="comma-separated model ids GetUsableModels lists and runs accept")
    p.add_argument("--no-tls", action="store_true", help="plain TCP (h2c prior knowledge and HTTP/1.1)")
    p.add_argument("--cert-dir", default=None,
                   help="where the self-signed certificate is made/reused (default ~/.cache/workbench/sim)")
    p.add_argument("--gzip-over", type=int, default=None, metavar="BYTES",
                   help="gzip (envelope flag 0x01) frames of at least BYTES for clients that send "
                        "connect-accept-encoding: gzip (default: never)")
    p.add_argument("--stream-close", choices=POLICIES, default=None,
                   help=f"when an exec counts as answered (default {DEFAULT_POLICY}): required = results then "
                        "stream_close (results alone stall the run with heartbeats, as in December 2025); "
                        "accepted = the result completes it, a later stream_close is welcome; ignored = "
                        "stream_close plays no part. Scenarios and steps may set their own")
    p.add_argument("--strict-stream-close", action="store_true",
                   help="shorthand for --stream-close required: reproduce the December 2025 heartbeat stall")
    p.add_argument("--exec-stream-close", action="append", default=[], metavar="KIND=POLICY",
                   help=f"policy for one exec type (repeatable); KIND: {', '.join(EXEC_TYPES)}")
    p.add_argument("--strict-request-context", action="store_true",
                   help="hold a run until its request_context_args is answered (a server that waits for it: a "
                        "client that puts its context in the run request and never answers parks until "
                        "--park-timeout). Default: the run goes on; tools come from the answer when one comes, "
                        "else from the run request")
    p.add_argument("--request-context-grace", type=float, default=1.0, metavar="S",
                   help="without --strict-request-context: how long a run's first tool call waits for a "
                        "request_context answer still on its way, once per run and only when the run request "
                        "carries no context of its own (default 1.0; 0 = not at all)")
    p.add_argument("--model-listing", choices=LISTING_CHOICES, default="both",
                   help="which GetUsableModels to serve: both (default), agent (agent.v1.AgentService) or "
                        "aiserver (aiserver.v1.AiService); the other answers unimplemented")
    p.add_argument("--long-exec-seconds", type=int, default=5, metavar="S",
                   help="how long the long_exec scenario's command runs on the client (default 5)")
    p.add_argument("--quiet", action="store_true", help="do not log each finished run on stderr")
    p.set_defaults(func=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> int:
    if args.heartbeat_interval <= 0:
        raise CliError(f"--heartbeat-interval must be > 0, not {args.heartbeat_interval}")
    if args.request_context_grace < 0:
        raise CliError(f"--request-context-grace must be >= 0, not {args.request_context_grace}")
    if args.gzip_over is not None and args.gzip_over < 0:
        raise CliError(f"--gzip-over must be >= 0, not {args.gzip_over}")
    if args.long_exec_seconds < 0:
        raise CliError(f"--long-exec-seconds must be >= 0, not {args.long_exec_seconds}")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port} is not a port number")
    try:
        scenarios = load_scenarios(args.scenario_dir)
    except ScenarioError as exc:
        raise CliError(str(exc)) from exc
    if args.list_scenarios:
        for name, sc in sorted(scenarios.items()):
            print(f"{name:20} {sc.description}")
        return 0
    if args.scenario not in scenarios:
        raise CliError(f"--scenario: {unknown_scenario_message(args.scenario, scenarios)}")
    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    if not models:
        raise CliError("--models is empty")
    if args.strict_stream_close and args.stream_close not in (None, REQUIRED):
        raise CliError(f"--strict-stream-close contradicts --stream-close {args.stream_close}")
    policy = REQUIRED if args.strict_stream_close else (args.stream_close or DEFAULT_POLICY)
    try:
        server_policy(policy, args.exec_stream_close)
    except ValueError as exc:
        raise CliError(str(exc)) from exc
    config = SimConfig(scenario=args.scenario, scenario_dirs=list(args.scenario_dir), token=args.token,
                       heartbeat_interval=args.heartbeat_interval, park_timeout=args.park_timeout,
                       models=models, pace=args.pace, stream_close=policy,
                       exec_stream_close=tuple(args.exec_stream_close), model_listing=args.model_listing,
                       strict_request_context=args.strict_request_context,
                       request_context_grace=args.request_context_grace,
                       long_exec_seconds=args.long_exec_seconds)
    try:
        return asyncio.run(_serve(args, config))
    except OSError as exc:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from exc


async def _serve(args: argparse.Namespace, config: SimConfig) -> int:
    from workbench.sim.runner import start_sim  # the server stack (h2, TLS): only when serving

    sim = await start_sim(config, host=args.host, port=args.port, tls=not args.no_tls, cert_dir=args.cert_dir,
                          gzip_min=args.gzip_over)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if not args.quiet:
        sim.backend.on_run_finished.append(_log_run)
    print(sim.url, flush=True)
    if sim.cert_path is not None:
        print(f"cert: {sim.cert_path}")
        print(f"trust it with: SSL_CERT_FILE={sim.cert_path}  (or httpx verify=…)")
    print(f"default scenario: {config.scenario}; pick per request with [scenario:NAME] in the prompt; "
          f"scenarios: {', '.join(sorted(sim.backend.scenarios))}", flush=True)
    extra = "".join(f", {p}" for p in config.exec_stream_close)
    context = "waits for the answer" if config.strict_request_context else "the run goes on without the answer"
    print(f"stream_close: {config.stream_close}{extra}; framings: connect, grpc-web(-text), grpc", flush=True)
    print(f"request_context: {context}", flush=True)
    try:
        await stop.wait()
    finally:
        await sim.close()
        print("stopped", file=sys.stderr, flush=True)
    return 0


def _log_run(rec: RunRecord) -> None:
    print(rec.summary(), file=sys.stderr, flush=True)
