"""Path → handler for workbench's HTTP servers, Connect methods and plain HTTP handlers alike.

A handler takes the ``Exchange`` and answers it however it likes: the agent service's Connect
methods (``agent_service``) negotiate their framing from the request headers, the OpenAI proxy
writes JSON and SSE. A ``guard`` sees every request before routing (the proxy's Host/Origin/API-key
check, which must refuse before any body is read). Requests that cannot be used — a body that breaks
its framing, one too large, an HTTP/1.1 message h11 rejects — are answered with ``error_body``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from workbench.transport.exchange import Exchange, RequestError

ExchangeHandler = Callable[[Exchange], Awaitable[None]]
Guard = Callable[[Exchange], Awaitable[bool]]  # True: route the request; False: the guard answered it
ErrorBody = Callable[[int, str], "tuple[str, bytes]"]  # (status, message) → (content type, body)


def plain_error(status: int, message: str) -> tuple[str, bytes]:
    return "text/plain", message.encode() + b"\n"


def request_path(target: str) -> str:
    """The path of a request target, without its query."""
    return target.split("?", 1)[0]


class Router:
    def __init__(self, fallback: ExchangeHandler, *, guard: Guard | None = None,
                 normalize: Callable[[str], str] | None = None, error_body: ErrorBody = plain_error) -> None:
        self.fallback = fallback
        self.guard = guard
        self.normalize = normalize
        self.error_body = error_body
        self.routes: dict[str, ExchangeHandler] = {}
        self.prefixes: list[tuple[str, ExchangeHandler]] = []
        self._on_close: list[Callable[[], None]] = []

    def route(self, path: str, handler: ExchangeHandler) -> None:
        self.routes[path] = handler

    def route_prefix(self, prefix: str, handler: ExchangeHandler) -> None:
        """Every path under ``prefix`` (exact routes win)."""
        self.prefixes.append((prefix, handler))

    def on_close(self, fn: Callable[[], None]) -> None:
        self._on_close.append(fn)

    def path_of(self, ex: Exchange) -> str:
        path = request_path(ex.path)
        return self.normalize(path) if self.normalize is not None else path

    def handler_for(self, path: str) -> ExchangeHandler:
        handler = self.routes.get(path)
        if handler is not None:
            return handler
        for prefix, h in self.prefixes:
            if path.startswith(prefix):
                return h
        return self.fallback

    async def handle(self, ex: Exchange) -> None:
        try:
            if self.guard is not None and not await self.guard(ex):
                return
            await self.handler_for(self.path_of(ex))(ex)
        except RequestError as exc:
            if ex.started:  # too late for a status: the response is cut off
                await ex.reset()
                return
            content_type, body = self.error_body(exc.status, exc.message)
            await ex.respond(exc.status, body, content_type)

    def bad_request(self, reason: str) -> tuple[int, str, bytes]:
        content_type, body = self.error_body(400, f"malformed HTTP request: {reason}")
        return 400, content_type, body

    def close(self) -> None:
        for fn in self._on_close:
            fn()
