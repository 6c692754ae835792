"""Rules about a run as a whole and how its stream ended: missing_conversation_state,
stream_ended_without_turn_end, server_error, ndjson_duplicate_text."""

from __future__ import annotations

from workbench.analysis.context import Context, rule
from workbench.analysis.facts import COMPLETED, TURN_ENDED
from workbench.analysis.model import Finding
from workbench.analysis.ndjson import assistant_texts, duplicated_final, error_results
from workbench.analysis.records import HttpError, RunRequest
from workbench.analysis.rules_client import lost_framing
from workbench.protocol import kinds
from workbench.protocol.status import (
    CONNECT_CODES,
    DEFAULT_FIX,
    ERROR_FIX,
    grpc_code_name,
    http_cause,
)

_MIN_PROMPT = 8  # shorter earlier prompts prove nothing when found again in a later one


# run requests ----------------------------------------------------------------------------------

def _carries_history(rr: RunRequest, earlier_prompt: str | None) -> bool:
    """A stateless client flattens the history into the prompt: the earlier prompt is in it."""
    return bool(earlier_prompt and len(earlier_prompt.strip()) >= _MIN_PROMPT
                and earlier_prompt.strip() in rr.prompt)


@rule("missing_conversation_state", "error",
      "a run request without conversation_state that failed, or a follow-up that lost the conversation's context")
def missing_conversation_state(ctx: Context) -> list[Finding]:
    out = []
    facts = ctx.facts
    for rr in facts.run_requests:
        end = ctx.seg_end(rr.seg)
        if not rr.has_state:
            if ctx.turn_ended_between(rr.seq, end):
                continue  # this server answered it anyway
            errors = [e for e in ctx.end_streams_between(rr.seq, end) if kinds.is_end_stream_error(e.kind)]
            said = ""
            if errors:
                err = ctx.stream_error(errors[0])
                said = f" The run failed: {err.code} {err.message!r} at seq {errors[0].seq}." if err else ""
            out.append(ctx.finding(
                "missing_conversation_state",
                f"run_request at seq {rr.seq} has no conversation_state (field 1 absent) and its run never "
                f"completed; the service answers \"Conversation state is required\".{said}",
                [rr.seq] + [e.seq for e in errors[:1]],
                "Always write AgentRunRequest.conversation_state, even empty (bytes 0a 00); encoders that skip "
                "empty sub-messages drop it."))
            continue
        if not rr.state_empty or rr.action not in (None, "user_message_action"):
            continue
        # A checkpoint for this conversation earlier in the session (an earlier run of it).
        earlier = [(s, seg) for s, seg, _p in facts.checkpoints if s < rr.seq and seg != rr.seg]
        same_conv = [(s, seg) for s, seg in earlier
                     if _conversation_of(ctx, seg) in (rr.conversation_id, None, "")]
        if same_conv:
            cp_seq, cp_seg = same_conv[-1]
            first = next((r for r in facts.run_requests if r.seg == cp_seg), None)
            if _carries_history(rr, first.prompt if first else None):
                continue
            out.append(ctx.finding(
                "missing_conversation_state",
                f"follow-up run_request at seq {rr.seq} sent an empty conversation_state although a checkpoint "
                f"arrived at seq {cp_seq}, and its prompt does not carry the history: the conversation's context "
                "is lost.",
                [cp_seq, rr.seq],
                "Echo the latest checkpoint as conversation_state with the same conversation_id (or, for a "
                "stateless client, carry the history in the prompt).", order_dependent=True))
        elif ctx.prior_checkpoint is not None and rr is facts.run_requests[0]:
            if _carries_history(rr, ctx.prior_prompt):
                continue
            sid, seq = ctx.prior_checkpoint
            out.append(ctx.finding(
                "missing_conversation_state",
                f"run_request at seq {rr.seq} continues conversation {rr.conversation_id!r} with an empty "
                f"conversation_state although session {sid} received a checkpoint (seq {seq}), and its prompt does "
                "not carry the history: context lost.",
                [rr.seq],
                "Echo the latest checkpoint as conversation_state with the same conversation_id."))
    return out


def _conversation_of(ctx: Context, seg: int) -> str | None:
    return next((r.conversation_id for r in ctx.facts.run_requests if r.seg == seg), None)


# stream end ------------------------------------------------------------------------------------

_AGENT_SERVER = ("interaction_update.", "exec_server_message.", "kv_server_message.", "interaction_query.",
                 "conversation_checkpoint_update")


def _stream_http_errors(ctx: Context) -> list[HttpError]:
    """HTTP errors answering the stream itself (not a BidiAppend, not a unary call)."""
    return [e for e in ctx.facts.http_errors if e.transport not in ("bidi_append", "unary")]


@rule("stream_ended_without_turn_end", "error", "a run's stream ended without turn_ended")
def stream_ended_without_turn_end(ctx: Context) -> list[Finding]:
    facts = ctx.facts
    out: list[Finding] = []
    if facts.ndjson and not facts.run_requests:
        return []  # stream-json output has no turn_ended; its end is the result event
    if ctx.session.get("transport") == "unary":
        return []
    # Only agent runs have turns: not unary calls, not a capture of something else. A run whose
    # request was not captured still shows by its agent messages.
    agent = bool(facts.run_requests) or any(k.startswith(_AGENT_SERVER) for k in facts.kinds)
    if not agent or _stream_http_errors(ctx):
        return []  # server_error names the HTTP error the stream was answered with
    if "not recorded" in str(ctx.session.get("error") or "") and facts.last_server_seq is None:
        return []  # the recording has no response body at all: how the stream went is unknown
    segs = [rr.seg for rr in facts.run_requests] or [0]
    for seg in segs:
        start = next((rr.seq for rr in facts.run_requests if rr.seg == seg), facts.first_seq or 0)
        end = ctx.seg_end(seg)
        ended_by_next = end is not None
        ends = ctx.end_streams_between(start, end)
        if any(kinds.is_end_stream_error(e.kind) for e in ends) or (end is None and session_server_error(ctx)):
            continue  # server_error explains it
        if any(r.seg == seg and not r.result_seqs and r.throw_seq is None and r.close_seq is None
               and ctx.handed_off(r) for r in facts.execs):
            continue  # the client left the run on purpose to hand an exec over
        if not (ended_by_next or ends or ctx.final):
            continue
        if any(m.seq > start and (end is None or m.seq < end) for m in lost_framing(ctx)):
            continue  # the rest of the stream was unreadable: framing_lost says what was (probably) lost
        late = False
        if ctx.turn_ended_between(start, end):
            last_te = ctx.turn_ended_between(start, end)[-1]
            # tool results appended after the turn ended and never answered with a new turn
            later_input = [r.result_seqs[0] for r in facts.execs if r.result_seqs and r.result_seqs[0] > last_te
                           and (end is None or r.result_seqs[0] < end)]
            if not later_input:
                continue
            late = True
        last_server = _last_server_before(ctx, end)
        close = ends[-1].seq if ends else (end if ended_by_next else facts.last_seq)
        how = (f"end-stream at seq {close}" if ends else
               f"the next run_request at seq {end}" if ended_by_next else "the end of the capture")
        idle = ""
        if facts.last_progress_ts is not None and facts.last_ts is not None and not ended_by_next:
            idle = f", {max(0.0, (facts.last_ts - facts.last_progress_ts) / 1e6):.1f} s after the last non-heartbeat server frame"
        checkpoints = [s for s, sg, _p in facts.checkpoints if sg == seg]
        cp = f"; a checkpoint came at seq {checkpoints[-1]}" if checkpoints else ""
        what = ("tool results were appended after its turn ended and no new turn answered them"
                if late else "without turn_ended")
        last = (f"last server frame (not counting heartbeats): {last_server[1]} at seq {last_server[0]}"
                if last_server[0] is not None else "the server sent nothing but heartbeats")
        out.append(ctx.finding(
            "stream_ended_without_turn_end",
            f"the run started at seq {start} ended ({how}{idle}) {what}; {last}{cp}.",
            [start] + checkpoints[-1:] + ([last_server[0]] if last_server[0] is not None else []) + [close],
            "Treat the turn as incomplete and retryable (same conversation_id + last checkpoint); a checkpoint is "
            "not the end. Look at what closed it: provider abort, proxy idle timeout/GOAWAY, FRAME_SIZE_ERROR.",
            order_dependent=late))
    return out


def _last_server_before(ctx: Context, end: int | None) -> tuple[int | None, str]:
    if end is None:
        return ctx.facts.last_progress_seq, ctx.facts.last_server_kind or "none"
    best: tuple[int | None, str] = (None, "none")
    for s, kind in _server_markers(ctx):
        if s < end:
            best = (s, kind)
    return best


def _server_markers(ctx: Context) -> list[tuple[int, str]]:
    f = ctx.facts
    items = [(s, TURN_ENDED) for s, _ in f.turn_ended] + [(s, kinds.CHECKPOINT) for s, _g, _p in f.checkpoints]
    items += [(c.completed_seq, COMPLETED) for c in f.calls.values() if c.completed_seq is not None]
    items += [(r.seq, f"{kinds.EXEC_SERVER}.{r.member}") for r in f.execs]
    items += [(s, kinds.TEXT_DELTA) for s in f.text_seqs[-1:]]
    return sorted(items)


# errors ----------------------------------------------------------------------------------------

def session_server_error(ctx: Context) -> tuple[str, str] | None:
    """(code, message) when the session record says the stream ended with a Connect or gRPC error."""
    info = ctx.session
    if info.get("status") != "error" or not info.get("error"):
        return None
    text = str(info["error"])
    if text.startswith("grpc-status "):
        num, _, message = text[len("grpc-status "):].partition(" ")
        code = grpc_code_name(num)
        return (code, message.strip()) if code else None
    code, _, message = text.partition(":")
    code = code.strip()
    if code not in CONNECT_CODES:
        return None
    return code, message.strip()


@rule("server_error", "error", "the stream ended with an error (rate limit, bad model, auth, outage) or an HTTP error")
def server_error(ctx: Context) -> list[Finding]:
    out = []
    unary = ctx.session.get("transport") == "unary"  # unary_error speaks for unary calls
    for end in ctx.facts.end_streams:
        if not kinds.is_end_stream_error(end.kind) or unary:
            continue
        err = ctx.stream_error(end)
        if err is None:
            out.append(ctx.finding("server_error", f"end-stream at seq {end.seq} is not valid JSON", [end.seq],
                                   "Check what rewrote the stream (a proxy?)."))
            continue
        where = "gRPC-Web trailer" if err.framing == "grpc-web" else "end-stream error"
        text = f"{where} at seq {end.seq}: {' / '.join(b for b in (err.code, err.label) if b)}"
        if err.message:
            text += f" — {err.message!r}"
        if err.title or err.detail:
            text += f"; {err.title}{': ' if err.title and err.detail else ''}{err.detail}"
        if err.retryable is not None:
            text += f" (retryable: {'yes' if err.retryable else 'no'})"
        out.append(ctx.finding("server_error", text, [end.seq], ERROR_FIX.get(err.code, DEFAULT_FIX)))
    for e in [] if unary else _stream_http_errors(ctx):
        status = e.status
        if status is None and isinstance(ctx.session.get("http_status"), int):
            status = ctx.session["http_status"]
        out.append(ctx.finding(
            "server_error",
            f"the {e.transport or 'stream'} request was answered {e.text} (seq {e.seq}): likely "
            f"{http_cause(status, transport=e.transport)}.",
            [e.seq], "Fix what the status names; a stream path answers 200 and puts errors in its end-stream."))
    if not out and not unary and (serr := session_server_error(ctx)) is not None:
        # Recorders that keep only agent messages (the client's own log) lose the end-stream frame
        # itself; the session row still carries the error the stream ended with.
        ecode, emsg = serr
        last = ctx.facts.last_seq
        out.append(ctx.finding(
            "server_error",
            f"the stream ended with error {ecode}" + (f": {emsg[:300]!r}" if emsg else "")
            + " (from the session record; the end-stream frame itself was not stored).",
            [last] if last is not None else [],
            ERROR_FIX.get(ecode, DEFAULT_FIX)))
    if ctx.facts.ndjson:
        for seq, ev in error_results(ctx.facts.ndjson):
            nerr = ev.get("error")
            msg = nerr.get("message") if isinstance(nerr, dict) else nerr
            ndcode = nerr.get("code") if isinstance(nerr, dict) else None
            out.append(ctx.finding(
                "server_error",
                f"stream-json result at seq {seq} reports an error" + (f" {ndcode}" if ndcode else "")
                + f": {str(msg or ev.get('result') or 'is_error')[:200]!r}",
                [seq], "Read the error (usage limit, model name, login); the CLI exits non-zero."))
    return out


# NDJSON ----------------------------------------------------------------------------------------

@rule("ndjson_duplicate_text", "warning", "stream-json text duplicated by concatenating delta and snapshot forms")
def ndjson_duplicate_text(ctx: Context) -> list[Finding]:
    """The CLI mixes delta, snapshot and full assistant events in every partial-output run; that is
    healthy. The finding needs the recording's own final text (the result event, or the last full
    message) to show the duplication a naive consumer makes."""
    events = ctx.facts.ndjson
    if not events:
        return []
    dup = duplicated_final(events)
    if dup is None:
        return []
    seq, text, good, _naive = dup
    _g, _n, ev = assistant_texts(events)
    return [ctx.finding(
        "ndjson_duplicate_text",
        f"the final text at seq {seq} ({len(text)} characters) repeats what the assistant events already said: "
        f"whoever wrote it concatenated delta, snapshot and full forms; the answer has {len(good)} characters "
        f"({good[:60]!r} …).",
        ev + [seq],
        "Accumulate deltas (timestamp_ms, no model_call_id); let snapshots (with model_call_id) and full messages "
        "(no timestamp_ms) replace the text instead of appending.")]
