"""An asyncio server on a background thread, for synchronous callers.

The ``openai`` SDK, a notebook, a sync test or the pytest replay fixture cannot ``await`` a
server; ``BackgroundServer`` runs one on its own event loop in a daemon thread: ``start()`` waits
until it listens (or re-raises why it could not), ``call()`` runs a coroutine on its loop,
``stop()`` closes the server there and ends the thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Generic, Protocol, TypeVar


class Closable(Protocol):
    async def close(self) -> None:
        ...


S = TypeVar("S", bound=Closable)
T = TypeVar("T")


class BackgroundServer(Generic[S]):
    """``start`` (an async factory returning a server with ``async close()``) on a loop of its own."""

    def __init__(self, start: Callable[[], Awaitable[S]], *, name: str, start_timeout: float = 60.0,
                 stop_timeout: float = 30.0) -> None:
        self._start = start
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self.server: S | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def start(self) -> S:
        """Start the thread and the server; the server, once it listens."""
        self._thread.start()
        try:
            self.server = self.call(self._started(), self._start_timeout)
        except BaseException:
            self._stop_loop()
            raise
        return self.server

    async def _started(self) -> S:
        return await self._start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=timeout)

    def stop(self) -> None:
        """Close the server (on its loop), then end the loop and its thread. Safe to call twice."""
        if self.server is not None:
            server, self.server = self.server, None
            if self._loop.is_running():
                self.call(server.close(), self._stop_timeout)
        self._stop_loop()

    def _stop_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        if not self._loop.is_running() and not self._loop.is_closed():
            self._loop.close()
