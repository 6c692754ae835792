"""Scenario steps that stream the model's content and end the turn (docs/sim.md "Steps").

``thinking``, ``text``, ``heartbeats``, ``pause``, ``step_completed``, ``turn_ended``,
``await_followup``, ``park``, ``end_stream_error`` and ``end``: each a function of the run, the
verb's value and the whole step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from workbench.jsontypes import JsonObject
from workbench.schema import pb
from workbench.sim.error_docs import error_doc
from workbench.sim.run_context import RunContext, Step, StopSteps


def chunks(text: str, n: int) -> list[str]:
    """``text`` in ``n`` pieces of about equal size ([""] for no text)."""
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n) if text else 0
    return [text[i:i + size] for i in range(0, len(text), size)] if text else [""]


async def thinking(run: RunContext, text: str, step: JsonObject) -> None:
    text = run.fmt(text)
    for part in chunks(text, int(step.get("chunks", 3))):
        await run.link.update("thinking_delta", text=part)
        await run.pace()
    duration = int(step.get("duration_ms", 800))
    await run.link.update("thinking_completed", thinking_duration_ms=duration)
    run.turn_steps.append(pb.ConversationStep(thinking_message=pb.ThinkingMessage(
        text=text, duration_ms=duration)).SerializeToString())


async def text(run: RunContext, value: str, step: JsonObject) -> None:
    value = run.fmt(value)
    link = run.link
    for part in chunks(value, int(step.get("chunks", 3))):
        await link.update("text_delta", text=part)
        tokens = max(1, len(part) // 4)
        run.tokens_out += tokens
        await link.update("token_delta", tokens=tokens)
        await run.pace()
    run.text_out += value
    run.turn_steps.append(pb.ConversationStep(assistant_message=pb.AssistantMessage(
        text=value)).SerializeToString())


async def bad_length_prefix(run: RunContext, value: str, step: JsonObject) -> None:
    """One text_delta whose envelope says ``off_by`` bytes more (or fewer) than it carries: the
    client's framing is out of sync from here on, so what follows (turn_ended included) is sent
    but unreadable to it (pi-cursor 1.4.17)."""
    upd = pb.InteractionUpdate(text_delta=pb.TextDelta(text=run.fmt(value)))
    data = bytes(pb.AgentServerMessage(interaction_update=upd).SerializeToString())
    send = getattr(run.conn, "send_misframed", None)
    if send is None:  # a transport that cannot write a broken frame: say so instead of faking one
        await run.fail(error_doc("unimplemented", "bad_length_prefix needs the workbench transport"))
        raise StopSteps
    await send(data, int(step.get("off_by", 5)))
    run.rec.sent_kinds.append("text_delta (bad length prefix)")


async def http_status(run: RunContext, status: int, step: JsonObject) -> None:
    """Reached only when the response had already started (RunSSE/RunPoll pick the scenario from a
    BidiAppend, after the status line): the closest the stream can still say."""
    await run.fail(error_doc("unavailable", f"HTTP {status} (the response had started: this transport "
                             "chose the scenario too late to change the status line)"))
    raise StopSteps


async def heartbeats(run: RunContext, n: int, step: JsonObject) -> None:
    for _ in range(n):
        await asyncio.sleep(run.cfg.heartbeat_interval)
        await run.link.heartbeat()


async def pause(run: RunContext, seconds: float, step: JsonObject) -> None:
    await asyncio.sleep(seconds)


async def step_completed(run: RunContext, _value: Any, step: JsonObject) -> None:
    run.step_seq += 1
    await run.link.update("step_completed", step_id=run.step_seq,
                          step_duration_ms=int((time.monotonic() - run.started) * 1000))


async def turn_ended(run: RunContext, _value: Any, step: JsonObject) -> None:
    await run.link.update("turn_ended")
    run.rec.outcome = "turn_ended"
    if run.request.conversation_id:
        run.backend.state.open_tools.pop(run.request.conversation_id, None)


async def await_followup(run: RunContext, _value: Any, step: JsonObject) -> None:
    def followup(m: Any) -> bool:
        k = m.WhichOneof("message")
        return k == "run_request" or (k == "conversation_action"
                                      and m.conversation_action.WhichOneof("action") == "user_message_action")

    m = await run.link.wait(followup, "a follow-up on the same run", eof_returns=True)
    if m is None:
        return
    if m.WhichOneof("message") == "run_request":
        said = m.run_request.action.user_message_action.user_message.text
    else:
        said = m.conversation_action.user_message_action.user_message.text
    run.user_text = said or run.user_text
    await run.reuse()


async def park(run: RunContext, _value: Any, step: JsonObject) -> None:
    run.rec.outcome = "parked"
    await run.link.wait(lambda m: False, "nothing (parked by the scenario)")


async def end_stream_error(run: RunContext, spec: JsonObject, step: JsonObject) -> None:
    doc = error_doc(spec["code"], spec.get("message", "Error"), spec.get("error"), spec.get("title", ""),
                    spec.get("detail", ""), bool(spec.get("is_retryable", False)),
                    bool(spec.get("is_expected", True)))
    await run.fail(doc)
    raise StopSteps


async def end(run: RunContext, how: str, step: JsonObject) -> None:
    conn = run.conn
    if run.rec.outcome != "turn_ended":
        run.rec.outcome = {"eof": "eof without end-stream", "reset": "stream reset"}.get(
            how, "ended without turn_ended")
    if how == "eof":
        await conn.close()
    elif how == "reset":
        await _optional(conn, "reset", conn.close)()
    else:
        await conn.end()
        if how == "goaway":
            await _optional(conn, "goaway", _noop)()
    raise StopSteps


def _optional(conn: Any, name: str, fallback: Callable[[], Any]) -> Callable[[], Any]:
    """A transport extra (goaway/reset) when the connection has it (other transports may not)."""
    return getattr(conn, name, fallback)


async def _noop() -> None:
    return None


STEPS: dict[str, Step] = {
    "thinking": thinking, "text": text, "heartbeats": heartbeats, "pause": pause,
    "step_completed": step_completed, "turn_ended": turn_ended, "await_followup": await_followup,
    "park": park, "end_stream_error": end_stream_error, "end": end,
    "bad_length_prefix": bad_length_prefix, "http_status": http_status,
}
