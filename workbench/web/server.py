"""The ``workbench web`` server: textual-serve's aiohttp application, guarded like every workbench
server.

textual-serve serves a page with a terminal (xterm.js) and, for each page that connects its
websocket, runs one TUI process whose screen it relays. We add:

- the **Host/Origin checks** of ``workbench.security.origin.AccessPolicy`` on every request (page,
  static files, websocket): a Host that is not a loopback name (DNS rebinding) or a request from
  another web page's Origin gets 403. The server's own page is allowed: its origin is
  ``http://<loopback name or allowed host>:<port>``;
- a cap on **open sessions** (each is a process reading the database): a page over the cap gets 503;
- a **free port** when asked for port 0, the URL printed once the socket listens;
- a page that loads **nothing from another host** (``page.py``): it works offline.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp_jinja2
from aiohttp import web
from textual_serve.server import Server

from workbench.security.origin import AccessPolicy
from workbench.web.page import offline_loader

log = logging.getLogger("workbench.web")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")


@dataclass
class WebConfig:
    command: str                      # the shell command one browser session runs
    host: str = "127.0.0.1"
    port: int = 0
    title: str = "workbench"
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()
    max_sessions: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


def url_host(host: str) -> str:
    """``host`` as it goes in a URL (IPv6 in brackets; a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def own_origins(host: str, port: int, allow_hosts: Iterable[str]) -> list[str]:
    """The origins the server's own page has, whichever name the browser used to reach it."""
    names = {*LOOPBACK_NAMES, url_host(host), *(h for h in allow_hosts if h.strip() and h != "*")}
    return [f"http://{name}:{port}" for name in sorted(names)]


def build_policy(config: WebConfig, port: int) -> AccessPolicy:
    origins = [*own_origins(config.host, port, config.allow_hosts), *config.allow_origins]
    return AccessPolicy.build(config.host, config.allow_hosts, origins)


def access_middleware(policy: Callable[[], AccessPolicy | None]) -> Any:
    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        current = policy()
        if current is None:  # not listening yet: nothing is served before the policy exists
            return web.json_response({"error": "starting"}, status=503)
        headers = {k.lower(): v for k, v in request.headers.items()}
        refusal = current.refusal(request.method, headers)
        if refusal is not None:
            status, why = refusal
            log.warning("refused %s %s: %s", request.method, request.path, why)
            return web.json_response({"error": why}, status=status)
        return await handler(request)  # type: ignore[no-any-return]

    return check


def security_headers(origins: Iterable[str]) -> Callable[[web.Request, web.StreamResponse], Any]:
    """Headers on every answer: the page may load and connect to this server only (no third-party
    fonts or scripts; ``page.py`` already takes textual-serve's web-font link out of the page), may
    not be framed by another site, and sends no referrer."""
    own = " ".join(origins)
    ws = " ".join("ws" + o[4:] for o in origins)
    policy = (f"default-src 'self' {own}; script-src 'self' 'unsafe-inline' {own}; "
              f"style-src 'self' 'unsafe-inline' {own}; img-src 'self' data: {own}; font-src 'self' {own}; "
              f"connect-src 'self' {own} {ws}; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")

    async def add(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["Content-Security-Policy"] = policy
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cross-Origin-Resource-Policy"] = "same-origin"

    return add


class WebServer(Server):
    """textual-serve's server with our checks, a session cap and a quiet start."""

    def __init__(self, config: WebConfig) -> None:
        super().__init__(config.command, host=url_host(config.host), port=config.port or 1, title=config.title)
        self.config = config
        self.policy: AccessPolicy | None = None
        self.sessions = 0
        self.url = ""

    async def on_startup(self, app: web.Application) -> None:
        """textual-serve prints a banner here; the CLI prints the URL instead."""

    async def handle_websocket(self, request: web.Request) -> web.WebSocketResponse:
        if self.sessions >= self.config.max_sessions:
            raise web.HTTPServiceUnavailable(
                text=f"{self.sessions} browser sessions are open (--max-sessions {self.config.max_sessions})")
        self.sessions += 1
        try:
            return await super().handle_websocket(request)
        finally:
            self.sessions -= 1

    async def start(self) -> web.AppRunner:
        """Listen; sets ``url`` (the real port when 0 was asked for) and the access policy."""
        app = await self._make_app()
        # the same page, minus its links to other hosts (``page.py``): the UI works offline
        aiohttp_jinja2.setup(app, loader=offline_loader(self.templates_path))
        app.middlewares.append(access_middleware(lambda: self.policy))
        headers: list[Callable[[web.Request, web.StreamResponse], Any]] = []

        async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
            for add in headers:
                await add(request, response)

        app.on_response_prepare.append(on_prepare)
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        port = int(sockets[0].getsockname()[1]) if sockets else self.config.port
        self.port = port
        self.public_url = self.url = f"http://{url_host(self.config.host)}:{port}"
        self.policy = build_policy(self.config, port)
        headers.append(security_headers(own_origins(self.config.host, port, self.config.allow_hosts)))
        return runner


async def serve(config: WebConfig, ready: Callable[[str], None]) -> None:
    """Run until SIGINT/SIGTERM; ``ready(url)`` is called once the server listens."""
    server = WebServer(config)
    runner = await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        ready(server.url)
        await stop.wait()
    finally:
        await runner.cleanup()
