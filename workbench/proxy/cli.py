"""``workbench proxy`` and ``workbench client`` subcommands."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from workbench.client.agent import CLOSE_POLICIES, END_TIMEOUT_S, FAULTS, AgentClient
from workbench.client.events import (
    Error,
    ExecRequest,
    StreamEndMissing,
    TextDelta,
    ToolCall,
    TransportLostAfterTurn,
    TurnEnded,
    TurnRetried,
)
from workbench.client.misbehave import WATCHDOG_ACTIONS
from workbench.client.transport import FRAMINGS, TRANSPORTS
from workbench.commands.table import add_command
from workbench.errors import CliError
from workbench.proxy.server import DEFAULT_PORT, DEFAULT_UPSTREAM, ProxyConfig, ProxyServer
from workbench.security.origin import AccessPolicy

TOKEN_ENV = "CURSOR_ACCESS_TOKEN"


def read_token(token_file: str | None) -> str:
    """The upstream bearer token: ``--token-file`` wins over ``$CURSOR_ACCESS_TOKEN``; never printed."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise CliError(f"--token-file {token_file}: {exc.strerror}") from exc
        if not token:
            raise CliError(f"--token-file {token_file} is empty")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise CliError(f"no upstream token: set {TOKEN_ENV} or pass --token-file FILE")
    return token


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upstream", default=DEFAULT_UPSTREAM,
                   help=f"agent backend URL (default {DEFAULT_UPSTREAM}; the simulator prints its own)")
    p.add_argument("--transport", choices=TRANSPORTS, default="run",
                   help="run = HTTP/2 bidi (default), runsse = RunSSE + BidiAppend, runpoll = RunPoll + BidiAppend")
    p.add_argument("--framing", choices=FRAMINGS, default="connect",
                   help="connect (default) = Connect envelopes, bare application/proto BidiAppends; grpc-web = "
                        "application/grpc-web+proto everywhere, enveloped BidiAppends, 0x80 trailer frames "
                        "(mode D, as stateless Bun proxies speak it)")
    p.add_argument("--token-file", help=f"file holding the bearer token (default: ${TOKEN_ENV})")
    p.add_argument("--ca-file", help="extra CA/certificate to trust for the upstream, e.g. the simulator's "
                                     "cert.pem (SSL_CERT_FILE is honoured too)")
    p.add_argument("--fault", action="append", default=[], choices=sorted(FAULTS),
                   help="reproduce a known client bug on purpose (repeatable)")
    p.add_argument("--heartbeat-budget", type=int, default=None, metavar="N",
                   help="give up after N consecutive server heartbeats with no progress")
    p.add_argument("--heartbeat-interval", type=float, default=5.0, metavar="S",
                   help="seconds between client heartbeats (default 5)")
    p.add_argument("--workspace", help="folder local execution is confined to")
    p.add_argument("--execute-locally", action="store_true",
                   help="answer read/write/delete/ls/grep execs locally, confined to --workspace (symbolic links "
                        "out of it refused); shell execs are refused unless the client gets --allow-shell")


def register(sub: Any) -> None:
    p = add_command(sub, "proxy")
    _common(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="listen address (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"default {DEFAULT_PORT}; 0 = a free port")
    _access_args(p)
    p.add_argument("--quiet", action="store_true", help="do not log each request on stderr")
    p.add_argument("--model", action="append", default=[], dest="models",
                   help="model id to list on /v1/models instead of asking GetUsableModels (repeatable)")
    p.set_defaults(func=run_proxy)

    c = add_command(sub, "client")
    _common(c)
    c.add_argument("prompt", help="the user message of the turn")
    c.add_argument("--model", default="default", help="model id sent in the run request (default: default)")
    c.add_argument("--events", action="store_true", help="print every event, not just the text")
    c.add_argument("--record", metavar="DB", help="record the client's own frames into this DuckDB file")
    c.add_argument("--close-policy", choices=CLOSE_POLICIES, default="always",
                   help="when to send stream_close after an exec: always = after every exec's result(s) (what the "
                        "December 2025 service needed; default); streams-only = as current real clients, only after "
                        "a streamed shell and after a throw (other execs get their result alone)")
    c.add_argument("--no-request-context", action="store_true",
                   help="never answer request_context_args: the context (environment, tools) goes in the run "
                        "request only, as stateless OpenAI-compatible proxies do; the service goes on without it")
    c.add_argument("--allow-shell", action="store_true",
                   help="with --execute-locally, also run shell commands. NOT A SANDBOX: only the starting folder "
                        "is checked, a command can read and change anything your user can; it runs with a scrubbed "
                        "environment (no token, no CURSOR_* or credential variables)")
    c.add_argument("--end-timeout", type=float, default=END_TIMEOUT_S, metavar="S",
                   help="after turn_ended, wait up to S seconds for the server to end the response (as real clients "
                        f"do) and report it when it does not (default {END_TIMEOUT_S:g})")
    c.add_argument("--no-end-wait", action="store_true",
                   help="old behaviour: close about 1 s after turn_ended without waiting for or reporting the "
                        "response's end (hides a proxy that holds END_STREAM back)")
    c.add_argument("--retry-after-turn", action="store_true",
                   help="misbehave like pi-cursor #3's client: when the transport fails after turn_ended (a reset, "
                        "a dropped connection, a GOAWAY), send the same user message again as a new run on the same "
                        "conversation (the user pays twice)")
    c.add_argument("--max-retries", type=int, default=1, metavar="N",
                   help="with --retry-after-turn: at most N retries of one turn (default 1)")
    c.add_argument("--watchdog", type=float, default=None, metavar="SECONDS",
                   help="abort a run that has not finished after SECONDS, as a stream watchdog does (oh-my-pi "
                        "#6176), whatever is still in progress")
    c.add_argument("--watchdog-action", choices=WATCHDOG_ACTIONS, default="cancel",
                   help="what the watchdog does: cancel = a cancel_action conversation action (default), reset = "
                        "HTTP/2 RST_STREAM (CANCEL) for the Run stream, disconnect = close the connection. Over "
                        "RunSSE/RunPoll reset and disconnect both drop the response")
    c.set_defaults(func=run_client)


API_KEY_ENV = "WORKBENCH_PROXY_API_KEY"


def _access_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="also accept requests whose Host is NAME (repeatable). By default only loopback "
                        "names and addresses (and the --host address) are accepted: anything else is refused "
                        "with 403 (DNS rebinding)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="accept requests carrying this browser Origin, e.g. http://localhost:3000 "
                        "(repeatable). By default any request with an Origin header is refused with 403, and "
                        "CORS preflights always are")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every request (401 otherwise); "
                        f"${API_KEY_ENV} does the same without showing the key in the process list")


def access_policy(args: argparse.Namespace) -> Any:
    """The proxy's AccessPolicy from --host, --allow-host, --allow-origin, --api-key / $WORKBENCH_PROXY_API_KEY."""
    key = args.api_key if args.api_key is not None else (os.environ.get(API_KEY_ENV) or None)
    if key is not None and not key.strip():
        raise CliError("--api-key is empty")
    return AccessPolicy.build(args.host, args.allow_host, args.allow_origin, key.strip() if key else None)


def _check_common(args: argparse.Namespace) -> None:
    if args.execute_locally and not args.workspace:
        raise CliError("--execute-locally needs --workspace DIR")
    if args.workspace and not Path(args.workspace).is_dir():
        raise CliError(f"--workspace {args.workspace}: not a directory")
    if args.ca_file and not Path(args.ca_file).is_file():
        raise CliError(f"--ca-file {args.ca_file}: no such file")
    if not args.upstream.startswith(("https://", "http://")):
        raise CliError(f"--upstream {args.upstream!r}: must be an https:// (or http://) URL")


def run_proxy(args: argparse.Namespace) -> int:
    _check_common(args)
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: must be 0-65535")
    config = ProxyConfig(token=read_token(args.token_file), upstream=args.upstream, transport=args.transport,
                         host=args.host, port=args.port, verify=args.ca_file, faults=frozenset(args.fault),
                         heartbeat_budget=args.heartbeat_budget, heartbeat_interval=args.heartbeat_interval,
                         execute_locally=args.execute_locally, workspace=args.workspace, models=args.models,
                         framing=args.framing,
                         access=access_policy(args))
    if not args.quiet:
        # One line per request on stderr (never the token: it is not in any log call).
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
        logging.getLogger("httpx").setLevel(logging.WARNING)
    return asyncio.run(_serve(config))


async def _serve(config: ProxyConfig) -> int:
    server = ProxyServer(config)
    try:
        await server.start()
    except OSError as exc:
        raise CliError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from exc
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the URL line: a caller may stop us right after it
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    print(server.url, flush=True)
    print(f"upstream: {config.upstream} ({config.transport}, {config.framing})", flush=True)
    try:
        await stop.wait()
    finally:
        await server.close()
    return 0


def run_client(args: argparse.Namespace) -> int:
    _check_common(args)
    if args.allow_shell and not args.execute_locally:
        raise CliError("--allow-shell needs --execute-locally --workspace DIR")
    if not args.end_timeout > 0:
        raise CliError(f"--end-timeout {args.end_timeout:g}: must be > 0 seconds")
    if args.watchdog is not None and not args.watchdog > 0:
        raise CliError(f"--watchdog {args.watchdog:g}: must be > 0 seconds")
    if args.max_retries < 0:
        raise CliError(f"--max-retries {args.max_retries}: must be >= 0")
    return asyncio.run(_client(args))


async def _client(args: argparse.Namespace) -> int:
    client = AgentClient(args.upstream, read_token(args.token_file), transport=args.transport,
                         workspace=args.workspace, execute_locally=args.execute_locally, faults=args.fault,
                         heartbeat_budget=args.heartbeat_budget, heartbeat_interval=args.heartbeat_interval,
                         verify=args.ca_file, record_to=args.record, close_policy=args.close_policy,
                         allow_shell=args.allow_shell, wait_for_end=not args.no_end_wait,
                         end_timeout=args.end_timeout, framing=args.framing,
                         answer_request_context=not args.no_request_context,
                         retry_after_turn=args.max_retries if args.retry_after_turn else 0,
                         watchdog=args.watchdog, watchdog_action=args.watchdog_action)
    rc = 0
    try:
        async for ev in client.stream_turn(args.prompt, args.model):
            if args.events and not isinstance(ev, TextDelta):
                print(f"\n[{type(ev).__name__}] {_short(ev)}", file=sys.stderr, flush=True)
            if isinstance(ev, TextDelta):
                print(ev.text, end="", flush=True)
            elif isinstance(ev, ExecRequest):
                await ev.fail(f"exec {ev.kind} not handled (start with --execute-locally --workspace DIR)")
            elif isinstance(ev, ToolCall) and not args.events:
                print(f"\n[tool {ev.name}]", file=sys.stderr, flush=True)
            elif isinstance(ev, TurnEnded):
                print(flush=True)
            elif isinstance(ev, TransportLostAfterTurn | TurnRetried) and not args.events:
                print(f"workbench client: {_short(ev)}", file=sys.stderr, flush=True)
            elif isinstance(ev, StreamEndMissing):
                print(f"workbench client: {ev.message}", file=sys.stderr, flush=True)
                rc = 1
            elif isinstance(ev, Error):
                print(f"\nworkbench client: {ev.code}: {ev.message}", file=sys.stderr, flush=True)
                rc = 1
    finally:
        await client.aclose()
    return rc


def _short(ev: Any) -> str:
    text = repr(ev)
    return text if len(text) < 300 else text[:297] + "..."
