"""What a turn yields to the caller (``async for ev in client.stream_turn(...)``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import WorkbenchError


@dataclass(slots=True)
class Usage:
    """Token counts: ``output_tokens`` sums token_delta; ``context_tokens`` is the checkpoint's
    token_details.used_tokens (context in use, docs/protocol.md §6)."""

    output_tokens: int = 0
    context_tokens: int = 0
    max_tokens: int = 0


@dataclass(slots=True)
class TextDelta:
    """A piece of the model's answer as streamed (``interaction_update.text_delta``)."""

    text: str


@dataclass(slots=True)
class ThinkingDelta:
    """A piece of the model's reasoning (``interaction_update.thinking_delta``), kept apart from the answer."""

    text: str


@dataclass(slots=True)
class ToolCall:
    """A tool call the server reported complete (``tool_call_completed``), args rebuilt.

    ``args`` is the merged result (streamed args + completion McpArgs, see ``args.merge_mcp_args``);
    ``args_text`` the streamed JSON text as accumulated (garbled under ``naive_args_concat``).
    """

    call_id: str
    name: str
    args: dict[str, Any]
    exec_id: str | None = None
    kind: str = ""
    args_text: str = ""
    completion_args: dict[str, Any] | None = None


@dataclass(slots=True)
class CallState:
    """What the client knows about one call_id while it streams."""

    call_id: str
    kind: str = ""
    name: str = ""
    args_text: str = ""
    deltas: list[str] = field(default_factory=list)
    typed_args: dict[str, Any] | None = None
    completion_args: dict[str, Any] | None = None
    exec_args: dict[str, Any] | None = None
    exec_id: str | None = None
    completed: bool = False


@dataclass(slots=True)
class ExecRequest:
    """An exec the client did not run itself: the caller answers with ``await ev.respond(result)``
    (a result message of the matching type, a dict in its JSON form, or plain text) or
    ``await ev.fail(error)``. ``call`` links it to the streamed tool call when one is known."""

    id: int
    exec_id: str
    kind: str
    args: dict[str, Any]
    call: CallState | None = None
    raw: bytes = b""
    _respond: Callable[[Any], Awaitable[None]] | None = field(default=None, repr=False)
    _fail: Callable[[str], Awaitable[None]] | None = field(default=None, repr=False)
    answered: bool = False

    async def respond(self, result: Any) -> None:
        if self._respond is None:
            raise RuntimeError("this exec request cannot be answered (its run is gone)")
        await self._respond(result)

    async def fail(self, error: str) -> None:
        if self._fail is None:
            raise RuntimeError("this exec request cannot be answered (its run is gone)")
        await self._fail(error)


@dataclass(slots=True)
class ExecHandled:
    """An exec the client answered itself (locally executed, request_context, or thrown)."""

    id: int
    exec_id: str
    kind: str
    ok: bool
    detail: str = ""


@dataclass(slots=True)
class Checkpoint:
    """conversation_checkpoint_update (kept and echoed on the next turn); not the end of a turn."""

    state: bytes


@dataclass(slots=True)
class KvSet:
    """A KV set_blob the server stored with us (used to spot an answer hidden in KV, docs/protocol.md §7)."""

    blob_id: bytes
    data: bytes


@dataclass(slots=True)
class TurnEnded:
    """The server ended the turn (``interaction_update.turn_ended``); ``usage`` as counted during it."""

    usage: Usage


@dataclass(slots=True)
class StreamEndMissing:
    """After ``turn_ended`` the server's end of the stream did not reach the client in time.

    The turn itself is complete (its ``TurnEnded`` came first); what is missing is the end of the
    response — the end-stream frame and, on HTTP/2, the END_STREAM flag. A proxy that holds back a
    bidi stream's end until the request side ends is the usual cause (``message`` says so)."""

    waited_s: float
    message: str


@dataclass(slots=True)
class TransportLostAfterTurn:
    """After ``turn_ended`` the transport failed (a reset, the connection dropped, a GOAWAY): the
    turn is complete all the same. ``message`` says what ended it and how long after turn_ended."""

    after_s: float
    message: str


@dataclass(slots=True)
class TurnRetried:
    """``retry_after_turn``: the client sends the same user message again as a new run on the same
    conversation because the transport failed after a completed turn (pi-cursor #3's client did;
    the user pays twice). ``attempt`` counts the retries (1 = the second run)."""

    attempt: int
    reason: str


@dataclass(slots=True)
class Error:
    """The turn failed: end-stream error, HTTP/transport failure, heartbeat budget, no turn_ended.

    ``code``: Connect code (resource_exhausted, not_found, unauthenticated, …) or one of ours:
    ``heartbeat_budget``, ``incomplete`` (stream ended without turn_ended), ``transport``, ``watchdog``
    (the client's own watchdog ended the run)."""

    code: str
    message: str
    details: list[dict[str, Any]] = field(default_factory=list)
    http_status: int | None = None


Event = (TextDelta | ThinkingDelta | ToolCall | ExecRequest | ExecHandled | Checkpoint | KvSet | TurnEnded
         | StreamEndMissing | TransportLostAfterTurn | TurnRetried | Error)


@dataclass(slots=True)
class TurnResult:
    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    ended: bool = False
    error: Error | None = None
    end_missing: StreamEndMissing | None = None  # the turn ended but the stream's end never came
    request_id: str = ""
    conversation_id: str = ""
    events: list[Event] = field(default_factory=list)


class AgentError(WorkbenchError):
    """Raised by ``run_turn`` when a turn fails; carries the :class:`Error` event."""

    def __init__(self, error: Error) -> None:
        super().__init__(f"{error.code}: {error.message}")
        self.error = error
