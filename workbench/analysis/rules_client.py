"""Rules about how a run's transport ended around its turn, as bridge authors reported them
(docs/analysis.md): retried_turn and transport_error_after_turn (a transport error after a completed
turn, and the client sending the same message again), client_cancelled (the client ended a run while
work was in progress: the root cause of the stall rules that follow), framing_lost (the Connect
envelope sync was lost, so what follows is unreadable, not missing) and stream_held_open (the
server kept the stream open with heartbeats after turn_ended).

What ended a stream is in the session record: ``meta.reset`` (``side``, ``code`` of an HTTP/2
RST_STREAM, none for a lost connection, ``after_response_end``) as the capture notes it and a flow
import reads it back, else ``status``/``error``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.message import DecodeError

from workbench.analysis.context import Context, exec_label, rule
from workbench.analysis.facts import RUN_REQUEST
from workbench.analysis.model import Finding
from workbench.analysis.records import ExecReq, Malformed, RunRequest
from workbench.protocol import kinds
from workbench.protocol.run_request import run_request_facts
from workbench.schema import pb

_PROBE_LIMIT = 1 << 20  # unreadable bytes searched for a turn_ended (a bound: the rest is not scanned)
_PROBE_TRIES = 4096     # candidate envelope headers parsed at most (adversarial junk stays cheap)
_MAX_ENVELOPE = 1 << 24


# what ended the transport ------------------------------------------------------------------------

def _reset(ctx: Context) -> Mapping[str, Any] | None:
    reset = ctx.session.get("meta", {}).get("reset")
    return reset if isinstance(reset, Mapping) and isinstance(reset.get("side"), str) else None


def transport_end(ctx: Context) -> tuple[str, str] | None:
    """(side, words) for a transport failure the recording kept: an HTTP/2 reset, a lost connection
    or a failed exchange; None when the stream ended as streams do."""
    reset = _reset(ctx)
    if reset is not None:
        side = str(reset["side"])
        if reset.get("code") is not None:
            return side, f"an HTTP/2 RST_STREAM ({reset['code']}) from the {side}"
        msg = str(reset.get("message") or "").strip()
        return side, f"the {side}'s connection dropped" + (f" ({msg})" if msg else "")
    error = str(ctx.session.get("error") or "")
    low = error.lower()
    if ctx.session.get("status") == "aborted" and error:
        side = "client" if "client" in low else "server" if "server" in low else "?"
        return side, f"a transport failure ({error})"
    if "goaway" in low:
        return "server", f"a GOAWAY ({error})"
    return None


def timed(ctx: Context) -> bool:
    """Frames carry their own times (a capture, a client's recording), not an import's per-message
    times (a flow file or HAR: every frame of a body shares one)."""
    return ctx.order_known and ctx.session.get("meta", {}).get("timing") != "per-message"


def _after_turn_s(ctx: Context, te_seq: int) -> str:
    """How long after turn_ended the stream ended, in words ('' when the times are unknown)."""
    te = ctx.facts.turn_ended_ts.get(te_seq)
    end = ctx.session.get("ended_us")
    if not te or not isinstance(end, int) or not timed(ctx) or end < te:
        return ""
    return f" {(end - te) / 1e6:.2f} s after turn_ended"


def _last_turn_end(ctx: Context) -> int | None:
    """The turn_ended of the session's last run, when its turn completed."""
    seg = ctx.facts.run_requests[-1].seg if ctx.facts.run_requests else 0
    ends = [s for s, g in ctx.facts.turn_ended if g == seg]
    return ends[-1] if ends else None


# retried turn ------------------------------------------------------------------------------------

def _repeats(ctx: Context, rr: RunRequest, after: int, failed: bool) -> list[tuple[str, int]]:
    """Later run requests on the same conversation that send the same request again: in this
    session (a later run on the same stream) and in the sessions that started later. The same bytes
    (the state not advanced to the turn's checkpoint: the request replayed), or, after a transport
    failure (``failed``), the same user message."""
    if not rr.prompt:
        return []
    out = [(ctx.session_id, r.seq) for r in ctx.facts.run_requests
           if r.seq > after and r.conversation_id == rr.conversation_id
           and (r.payload == rr.payload or (failed and r.prompt == rr.prompt))]
    if not rr.conversation_id or ctx.alone:
        return out  # no other session of the conversation: nothing later to read
    for sid, seq, payload in ctx.later_payloads():
        if sid == ctx.session_id:
            continue
        facts = run_request_facts(RUN_REQUEST, payload, pb.AgentClientMessage)
        if facts is None or facts.conversation_id != rr.conversation_id:
            continue
        if facts.prompt != rr.prompt or not (failed or payload == rr.payload):
            break  # the conversation went on with another message: what follows is no retry of this one
        out.append((sid, seq))
    return out


@rule("retried_turn", "warning",
      "a new run on the same conversation repeats a user message whose turn had already ended")
def retried_turn(ctx: Context) -> list[Finding]:
    return [f for f in _after_turn(ctx) if f.code == "retried_turn"]


@rule("transport_error_after_turn", "note", "a transport error after turn_ended that did no harm (no retry)")
def transport_error_after_turn(ctx: Context) -> list[Finding]:
    return [f for f in _after_turn(ctx) if f.code == "transport_error_after_turn"]


def _after_turn(ctx: Context) -> list[Finding]:
    facts = ctx.facts
    if not ctx.final or not facts.run_requests or ctx.session.get("transport") == "unary":
        return []
    out: list[Finding] = []
    for rr in facts.run_requests:
        end = ctx.seg_end(rr.seg)
        ended = ctx.turn_ended_between(rr.seq, end)
        if not ended:
            continue  # a turn that failed: sending it again is the right thing
        te = ended[-1]
        if rr is facts.run_requests[0] and ctx.prior_prompt and ctx.prior_prompt == rr.prompt:
            continue  # this run is itself a repeat: the finding belongs to the first of them
        last_run = end is None
        how = transport_end(ctx) if last_run else None
        repeats = _repeats(ctx, rr, te, how is not None)
        if repeats:
            what = (f"the stream ended by {how[1]}{_after_turn_s(ctx, te)}" if how else
                    "the stream ended with nothing on it to show why (a GOAWAY on the connection, or the client "
                    "taking a closed connection for a failed run, leaves no trace on the stream)")
            where = ", ".join(f"seq {q}" if s == ctx.session_id else f"session {s[:8]} seq {q}" for s, q in repeats[:5])
            times = "once" if len(repeats) == 1 else f"{len(repeats)} times"
            out.append(ctx.finding(
                "retried_turn",
                f"the turn of the run started at seq {rr.seq} ended (turn_ended at seq {te}), then {what}; the "
                f"client sent the same user message {rr.prompt[:60]!r} again as a new run on conversation "
                f"{rr.conversation_id!r} {times} ({where}): the user pays for the turn again and sees the answer "
                "twice.",
                [rr.seq, te, facts.last_seq if last_run else end] + [q for s, q in repeats if s == ctx.session_id],
                "A run whose turn_ended arrived is complete: take the answer and do not retry it when the "
                "transport fails afterwards (a GOAWAY, a reset or a dropped connection after turn_ended is "
                "harmless). Retry only a run that ended without turn_ended (or with a retryable error), with the "
                "same conversation_id and the last checkpoint."))
        elif how is not None and how[0] != "client":
            out.append(ctx.finding(
                "transport_error_after_turn",
                f"the turn of the run started at seq {rr.seq} completed (turn_ended at seq {te}), then the stream "
                f"ended by {how[1]}{_after_turn_s(ctx, te)}. It did no harm here (the client kept the answer and "
                "did not send the message again); a client that treats any transport error as a failed run "
                "would retry the turn (see retried_turn).",
                [te, facts.last_seq],
                "Treat a run as complete at turn_ended, whatever happens to the transport afterwards.",
                severity="note"))
    return out


# client cancelled --------------------------------------------------------------------------------

def _stream_finished(req: ExecReq) -> bool:
    """A streamed shell exec whose latest result carries its exit: the command is over."""
    try:
        res = pb.AgentClientMessage.FromString(req.last_result or b"").exec_client_message
    except (DecodeError, ValueError, RecursionError):
        return False
    member = res.WhichOneof("result")
    return member is not None and getattr(res, member).WhichOneof("event") == "exit" \
        if member == "shell_stream_result" else member is not None


def _parked_since(ctx: Context, seg: int) -> int | None:
    """The first heartbeat of the stretch the run ended in (the server only waited from there on),
    None when the run did not end waiting."""
    tail = [r for r in ctx.runs if ctx.seg_of(r.first_seq) == seg and r.count >= ctx.config.heartbeat_min_count]
    if not tail or (tail[-1].next_kind is not None and not kinds.is_end_stream(tail[-1].next_kind)):
        return None
    return tail[-1].first_seq


def _in_flight(ctx: Context, rr: RunRequest, before: int | None) -> tuple[list[str], list[int], list[str]]:
    """What was still going on in a run when the client ended it: execs the client was running
    (a streamed shell without its exit, an exec the client heartbeats), text streaming, the server
    still working. Returns (work in words, evidence seqs, what the client still owed the server
    that was waiting for it: an exec never answered, one answered but not closed, a KV request, a
    query)."""
    words: list[str] = []
    ev: list[int] = []
    owed: list[str] = []
    seg = rr.seg
    parked = _parked_since(ctx, seg)
    for req in ctx.facts.execs:
        if req.seg != seg or (before is not None and ctx.order_known and req.seq > before):
            continue
        if req.close_seq is not None or req.throw_seq is not None or req.abort_seq is not None:
            continue
        if req.result_seqs and req.member.startswith("shell_stream") and not _stream_finished(req):
            n = len(req.result_seqs)
            words.append(f"{exec_label(req)} streaming output ({n} message{'s' if n != 1 else ''} sent, no "
                         "exit yet)")
        elif not req.result_seqs and req.client_hb_seq is not None:
            words.append(f"{exec_label(req)} running (the client sent exec heartbeats for it)")
        elif not req.result_seqs:
            owed.append(f"{exec_label(req)} at seq {req.seq}")
            continue
        else:
            if parked is not None and req.result_seqs[-1] < parked:
                owed.append(f"stream_close{{{req.id}}}")  # answered, not closed, and the server waited
            continue
        ev.append(req.seq)
    owed += [f"KV {k.op}_blob id {k.id} at seq {k.seq}" for k in ctx.facts.kv if k.seg == seg and k.result_seq is None]
    owed += [f"{q.kind} id {q.id} at seq {q.seq}" for q in ctx.facts.queries
             if q.seg == seg and q.response_seq is None]
    last = ctx.facts.seg_last_any.get(seg)  # the last server frame showing progress of any kind
    texts = ctx.text_between(rr.seq, ctx.seg_end(seg))
    if texts and last is not None and last == texts[-1] and parked is None:
        words.append("the model's text streaming")
        ev.append(texts[-1])
    return words, ev, owed


@rule("client_cancelled", "error", "the client cancelled or reset the run while work was in progress")
def client_cancelled(ctx: Context) -> list[Finding]:
    facts = ctx.facts
    if not facts.run_requests or ctx.session.get("transport") == "unary":
        return []
    out: list[Finding] = []
    how = transport_end(ctx)
    reset = _reset(ctx)
    for rr in facts.run_requests:
        seg = rr.seg
        end = ctx.seg_end(seg)
        cancel = next(((s, ts) for s, ts, g in facts.cancels if g == seg), None)
        by_transport = (end is None and ctx.final and how is not None and how[0] == "client"
                        and not (reset is not None and reset.get("after_response_end")))
        if cancel is None and not by_transport:
            continue
        at = cancel[0] if cancel is not None else None
        if ctx.turn_ended_between(rr.seq, at if at is not None else end):
            continue  # the turn had completed: ending its stream is the right thing
        if any(kinds.is_end_stream_error(e.kind) for e in ctx.end_streams_between(rr.seq, at)):
            continue  # the server had already failed the run (server_error)
        words, ev, owed = _in_flight(ctx, rr, at)
        if owed and not words:
            # the server was waiting for the client (an exec it never answered): the client gave up on
            # a stall of its own making (unanswered_exec speaks), or a bridge left the run after
            # handing its tool call over (the bridge findings speak)
            continue
        who = ("the client sent a cancel_action" if cancel is not None else f"the client ended it with {how[1]}"
               if how is not None else "the client ended it")
        if cancel is not None and how is not None and how[0] == "client":
            who += f", then {how[1]}"
        stop_ts = cancel[1] if cancel is not None else ctx.session.get("ended_us")
        timing = ""
        if timed(ctx) and isinstance(stop_ts, int) and rr.ts and stop_ts >= rr.ts:
            timing = f" {(stop_ts - rr.ts) / 1e6:.1f} s after the run started"
            last = facts.last_progress_ts
            if last and last <= stop_ts:
                timing += f" and {(stop_ts - last) / 1e6:.1f} s after the server's last progress"
        if not words and _parked_since(ctx, seg) is not None:
            continue  # the server had stopped and only waited: heartbeat_loop speaks, not the client's exit
        doing = "; in flight: " + "; ".join(words) if words else \
            f"; the server was still working on the turn (last server frame: {facts.last_server_kind or 'none'})"
        out.append(ctx.finding(
            "client_cancelled",
            f"the run started at seq {rr.seq} was ended by the client while work was in progress: {who}{timing}"
            f"{doing}. What the server reports after this (an unanswered or unclosed exec, heartbeats, an end "
            "without turn_ended) follows from the cancel, not from the client's answers.",
            [rr.seq, *ev, at if at is not None else (end - 1 if end is not None else facts.last_seq)],
            "Do not end a run that is still making progress: reset a watchdog on every server frame (heartbeats, "
            "exec output, text), and give long execs (shell_stream) their own limit; cancel with a cancel_action "
            "only when the user asks to stop, and expect the turn to end without turn_ended then."))
    return out


# framing lost ------------------------------------------------------------------------------------

def _probe_turn_end(data: bytes) -> bool:
    """Whether the unreadable bytes hold an enveloped AgentServerMessage with turn_ended: every
    position is tried as an envelope start (flags 0, a length that fits), up to ``_PROBE_LIMIT``."""
    data = data[:_PROBE_LIMIT]
    n = len(data)
    tries = 0
    for i in range(max(0, n - 4)):
        if data[i] != 0:
            continue
        length = int.from_bytes(data[i + 1:i + 5], "big")
        if length == 0 or length > _MAX_ENVELOPE or i + 5 + length > n:
            continue
        tries += 1
        if tries > _PROBE_TRIES:
            return False
        try:
            msg = pb.AgentServerMessage.FromString(bytes(data[i + 5:i + 5 + length]))
        except (DecodeError, ValueError, RecursionError):
            continue
        if msg.WhichOneof("message") == "interaction_update" and \
                msg.interaction_update.WhichOneof("message") == "turn_ended":
            return True
    return False


def lost_framing(ctx: Context) -> list[Malformed]:
    """The malformed frames of the stream's server side (the response body), in order."""
    return [m for m in ctx.facts.malformed_frames
            if m.direction == "server" and m.transport not in ("bidi_append", "unary", "cli_ndjson")
            and "body unusable" not in m.error]


@rule("framing_lost", "error", "the Connect envelope framing of the stream was lost: what follows is unreadable")
def framing_lost(ctx: Context) -> list[Finding]:
    bad = lost_framing(ctx)
    if not bad:
        return []
    first = bad[0]
    # a frame that was framed but did not parse also lost its 5-byte header; junk after the sync was
    # lost is kept whole (no header of its own)
    unreadable = sum(len(m.payload) + (5 if m.error.startswith("protobuf") else 0) for m in bad)
    ended = ctx.turn_ended_between(first.seq, None)
    if ended:
        lost = "a turn_ended was read after it (the stream found its framing again)"
    elif _probe_turn_end(b"".join(m.payload for m in bad)):
        lost = ("the unreadable bytes hold a turn_ended: the turn did complete, it is unreadable here, not "
                "missing")
    else:
        lost = ("no turn_ended was found in them; the rest of the turn (text, its turn_ended, the end-stream) "
                "is unreadable, so whether it completed cannot be told")
    where = f" at byte {first.offset} of the response body" if first.offset is not None else ""
    why = f" ({first.error})" if first.error else ""
    return [ctx.finding(
        "framing_lost",
        f"the stream's envelope framing was lost at seq {first.seq}{where}{why}: {unreadable} byte"
        f"{'s' if unreadable != 1 else ''} in {len(bad)} frame{'s' if len(bad) != 1 else ''} could not be read; "
        f"{lost}. An end without turn_ended or a stall reported for this run follows from it.",
        [m.seq for m in bad],
        "Find what wrote a wrong length prefix (the server, or a proxy that rewrote the body: compression, "
        "re-chunking). A client should not hard-fail: resynchronise on the next plausible envelope header "
        "(flags 0x00/0x01/0x02, a length that fits) and treat the turn as retryable when its turn_ended cannot be "
        "read.")]


# stream held open ----------------------------------------------------------------------------------

@rule("stream_held_open", "note", "the server kept the stream open with heartbeats after turn_ended")
def stream_held_open(ctx: Context) -> list[Finding]:
    facts = ctx.facts
    if not ctx.final:
        return []
    out: list[Finding] = []
    for te, seg in facts.turn_ended:
        end = ctx.seg_end(seg)
        beats = ctx.heartbeats_between(te, end)
        if not beats:
            continue
        sample = ctx.heartbeat_sample(te, end, 3)
        ends = ctx.end_streams_between(te, end)
        last_beat = sample[-1]
        span = ""
        te_ts = facts.turn_ended_ts.get(te)
        stop = ends[0].ts if ends else None
        if timed(ctx) and te_ts and stop and stop >= te_ts:
            span = f" for {(stop - te_ts) / 1e6:.1f} s"
        closed = f"until its end-stream at seq {ends[0].seq}" if ends else "and the recording ends there"
        out.append(ctx.finding(
            "stream_held_open",
            f"after turn_ended at seq {te} the server kept the stream open{span} with {beats} heartbeat"
            f"{'s' if beats != 1 else ''} {closed}. Harmless here: a client that ends the run at turn_ended did "
            "right; a client that waits for the end of the stream would hang that long.",
            [te, *sample, *(e.seq for e in ends[:1])] if last_beat else [te],
            "End the run at turn_ended (close the stream); do not wait for the server's end-stream.",
            severity="note"))
    return out
