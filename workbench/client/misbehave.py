"""The client on the misbehaving side of two public bridge reports, on purpose.

- **Watchdog** (oh-my-pi #6176): a run not finished after ``seconds`` is aborted as a stream
  watchdog would, whatever is still in progress: ``cancel`` sends a ``cancel_action``
  conversation action (and resets the stream if the server has not ended it ``CANCEL_GRACE_S``
  later), ``reset`` sends HTTP/2 RST_STREAM (CANCEL) for the Run stream, ``disconnect`` closes the
  connection without GOAWAY. Over RunSSE/RunPoll the cancel is a BidiAppend and both ``reset`` and
  ``disconnect`` drop the response (HTTP/1.1 has no stream reset).
- **Retry after a completed turn** (pi-cursor #3): when the transport fails after ``turn_ended``
  (a reset, a dropped connection, or a GOAWAY on the HTTP/2 connection within
  ``GOAWAY_GRACE_S`` of the end), the same run request is sent again as a new run on the same
  conversation; the user pays twice and sees the answer twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from workbench.client._pb import pb
from workbench.client.run import ClientRun
from workbench.client.transport import RunChannel

WATCHDOG_ACTIONS = ("cancel", "reset", "disconnect")
CANCEL_GRACE_S = 5.0  # after a cancel_action, how long the server gets to end the stream
GOAWAY_GRACE_S = 0.5  # a GOAWAY this soon after the end of a completed run counts as its failure


def check_watchdog(seconds: float | None, action: str) -> None:
    if seconds is not None and not seconds > 0:
        raise ValueError(f"watchdog must be > 0 seconds, not {seconds}")
    if action not in WATCHDOG_ACTIONS:
        raise ValueError(f"watchdog action {action!r}: choose one of {', '.join(WATCHDOG_ACTIONS)}")


async def watchdog(run: ClientRun, seconds: float, action: str) -> None:
    """Abort ``run`` if it has not finished (turn_ended, or the stream's end) after ``seconds``."""
    await asyncio.sleep(seconds)
    if run.ended or run.channel.closed or run.channel.seen.response_ended:
        return
    in_flight = in_progress(run)
    run.watchdog_fired = (f"the client's watchdog ended the run after {seconds:g} s with {action}"
                          f"{' while ' + in_flight if in_flight else ''}")
    if action == "cancel":
        with contextlib.suppress(Exception):
            await run.send({"conversation_action": pb.ConversationAction(cancel_action=pb.CancelAction())})
        await asyncio.sleep(CANCEL_GRACE_S)
        if run.channel.closed or run.channel.seen.response_ended:
            return
        action = "reset"
    await run.channel.abort(action, run.watchdog_fired)


def in_progress(run: ClientRun) -> str:
    """What was still going on in the run, in words (for the watchdog's message)."""
    work = [f"exec {eid} ({kind}) running locally" for eid, (_, _, kind) in run.local.items()]
    work += [f"exec {eid} ({req.kind}) waiting for the caller" for eid, req in run.unanswered.items()]
    if not work and run.last_kind:
        work.append(f"the server's last frame was {run.last_kind}")
    return ", ".join(work)


async def lost_after_turn(run: ClientRun) -> str | None:
    """Why the transport of a completed run failed after turn_ended, or None when it ended cleanly.
    Waits up to ``GOAWAY_GRACE_S`` for a GOAWAY on the run's HTTP/2 connection."""
    if not run.ended:
        return None
    if run.lost_after_turn is not None:
        return run.lost_after_turn
    if isinstance(run.channel, RunChannel):
        conn = run.channel.conn
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(conn.goaway_seen.wait(), GOAWAY_GRACE_S)
        if conn.goaway:
            return f"GOAWAY on the connection {time.monotonic() - run.ended_at:.2f} s after turn_ended"
    return None
