"""How the client's turn ends: the end of the stream read after ``turn_ended``, and the errors a
turn ends with (stream cut short, no ``turn_ended``, a heartbeat stall, the server's end that never
comes).

``TurnEnding`` holds the client's end settings and the one thing it needs of the client: how a
server message is dispatched (``Dispatch``, to answer what still comes after ``turn_ended``).
``AgentClient`` holds one; its own module stays about building messages and dispatching them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf.message import DecodeError

from workbench.client._pb import pb
from workbench.client.events import Error, Event, StreamEndMissing, TransportLostAfterTurn
from workbench.client.net import H2Stream, NetError
from workbench.client.run import ClientRun
from workbench.client.transport import Incoming, RunChannel, TransportError

# The client's handling of one server message (an AgentServerMessage and its oneof case): the events it yields.
Dispatch = Callable[[ClientRun, Any, str | None], AsyncIterator[Event]]


class TurnEnding:
    """How a turn ends, under the client's ``end_timeout`` and ``heartbeat_budget``."""

    def __init__(self, *, end_timeout: float, heartbeat_budget: int | None, dispatch: Dispatch) -> None:
        self.end_timeout = end_timeout
        self.heartbeat_budget = heartbeat_budget
        self.dispatch = dispatch

    def ended_by(self, run: ClientRun, item: Incoming) -> Error | None:
        """What the end of the stream (or its failure) means for the turn."""
        if item.kind == "error":
            return error_from(item.error)
        end = item.end
        if run.watchdog_fired is not None and not run.ended and (end is None or not end.is_error):
            return Error("watchdog", f"{run.watchdog_fired}; the stream then ended without turn_ended")
        if end is not None and end.is_error:
            return Error(end.code or "unknown", end.message or "", end.details)
        if not run.ended:
            return Error("incomplete", f"the {run.channel.transport} stream ended without turn_ended "
                         f"(last frame: {run.last_kind or 'none'}); the turn is incomplete and retryable")
        return None

    async def until_end(self, run: ClientRun) -> AsyncIterator[Event]:
        """After turn_ended, as real clients do: keep the request open (heartbeats go on), answer
        whatever still comes, and read until the server ends the response — its end-stream frame
        and, on HTTP/2, the END_STREAM flag — for at most ``end_timeout`` seconds."""
        assert run.iterator is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.end_timeout
        try:
            while True:
                try:
                    item = await asyncio.wait_for(_next_item(run.iterator), max(0.0, deadline - loop.time()))
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    yield self._end_missing(loop.time() - started, frame_seen=False)
                    return
                while run.done:
                    yield run.done.pop(0)
                if item.kind == "error":
                    # cut off after turn_ended: the turn stands, the response is over
                    yield self._lost(run, str(item.error or "transport failure"))
                    return
                if item.kind != "message":
                    break  # the end-stream frame (even an error one: turn_ended already settled the turn)
                try:
                    msg = pb.AgentServerMessage.FromString(item.payload)
                except DecodeError:
                    continue
                case = msg.WhichOneof("message")
                if case == "interaction_update" and msg.interaction_update.WhichOneof("message") == "heartbeat":
                    continue
                async for ev in self.dispatch(run, msg, case):
                    yield ev
            # On HTTP/2 the end-stream frame is data: a proxy can pass it on and still hold the
            # stream's END_STREAM flag back (mitmproxy does, until the request side has ended).
            stream = run.channel.stream if isinstance(run.channel, RunChannel) else None
            if stream is not None and not stream.ended_remote:
                try:
                    await asyncio.wait_for(_drain(stream), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    yield self._end_missing(loop.time() - started, frame_seen=True)
                except NetError as exc:  # reset or connection gone after the end-stream frame: ended all the same
                    yield self._lost(run, str(exc))
        finally:
            run.end_settled = True

    def _lost(self, run: ClientRun, what: str) -> TransportLostAfterTurn:
        after = time.monotonic() - run.ended_at
        run.lost_after_turn = f"{what} ({after:.2f} s after turn_ended)"
        return TransportLostAfterTurn(after, f"the transport failed after turn_ended: {run.lost_after_turn}; "
                                             "the turn itself is complete")

    def _end_missing(self, waited: float, frame_seen: bool) -> StreamEndMissing:
        what = ("its end-stream frame came, the HTTP/2 END_STREAM flag did not" if frame_seen
                else "neither its end-stream frame nor the end of the response came")
        return StreamEndMissing(waited, (
            f"the server's end of stream never arrived: {what} within {waited:.1f} s after turn_ended "
            f"(end timeout {self.end_timeout:g} s; this client kept its request open and heartbeating meanwhile, "
            "as real clients do). The turn itself is complete. Usual cause: a proxy between client and server "
            "that holds back the response's end until the request side ends (mitmproxy does this to HTTP/2 "
            "bidi streams); otherwise a server keeping the run open for a follow-up message. See docs/client.md."))

    def stall_message(self, run: ClientRun) -> str:
        secs = time.monotonic() - run.first_heartbeat_at
        msg = (f"gave up after {run.heartbeats} consecutive server heartbeats ({secs:.1f} s) with no progress "
               f"(heartbeat budget {self.heartbeat_budget}; last other frame: {run.last_kind or 'none'})")
        if run.unclosed:
            ids = ", ".join(map(str, run.unclosed))
            msg += (f"; exec id {ids} got a result but no stream_close, so the server is still waiting on it "
                    "(docs/protocol.md §5)")
        elif run.unanswered:
            ids = ", ".join(map(str, run.unanswered))
            msg += f"; exec id {ids} was never answered (docs/protocol.md §5)"
        elif run.context_unanswered:
            ids = ", ".join(map(str, run.context_unanswered))
            msg += (f"; request_context exec id {ids} was left unanswered on purpose (the context went in the run "
                    "request), and a server that waits for that answer — `workbench sim "
                    "--strict-request-context` — is probably still waiting on it (docs/protocol.md §5)")
        elif run.unclosed_by_policy:
            ids = ", ".join(map(str, run.unclosed_by_policy))
            msg += (f"; exec id {ids} got its result alone (close policy streams-only), and a server that "
                    "requires stream_close after it — the December 2025 service, `workbench sim "
                    "--strict-stream-close` — is probably still waiting on it (docs/protocol.md §5): "
                    "use close policy always")
        else:
            msg += "; the server sent only heartbeats and no turn_ended (docs/protocol.md §6)"
        return msg


def error_from(exc: BaseException | None) -> Error:
    """The turn's error for a transport failure."""
    if isinstance(exc, TransportError):
        return Error(exc.code, exc.message, exc.details, exc.http_status)
    return Error("transport", str(exc) if exc else "unknown transport failure")


async def _next_item(items: AsyncIterator[Incoming]) -> Incoming:
    return await anext(items)


async def _drain(stream: H2Stream) -> None:
    """Read an HTTP/2 response to its END_STREAM (nothing may follow an end-stream frame)."""
    async for _ in stream.chunks():
        pass
