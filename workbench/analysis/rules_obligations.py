"""Rules about what the client owes the server during a run and the stall that follows a debt:
heartbeat_loop, missing_stream_close, unanswered_exec, unanswered_query, kv_only_response, blob_miss.

Each obligation rule needs the harm (``Context.stall_after``): the server made no progress after
the obligation and the turn never ended, with heartbeats (or a timeout) to show the server waited.
"""

from __future__ import annotations

import json
from bisect import bisect_left

from workbench.analysis.blobs import summarize_blob
from workbench.analysis.context import ORDER_NOTE, Context, exec_label, rule
from workbench.analysis.model import Finding
from workbench.analysis.records import ExecReq, HeartbeatRun
from workbench.analysis.rows import BlobPart, BlobRow
from workbench.protocol import kinds

REQUEST_CONTEXT = "request_context_args"
_CLOSE_FIX = ("If this server waits for it (the service did in December 2025; a result completes an exec for "
              "the service in 2026), send ExecClientControlMessage{{stream_close{{id: {id}}}}} after the result "
              "message(s); Cursor's own CLI always does.")


def _delivered_results(ctx: Context, req: ExecReq) -> list[int]:
    return [s for s in req.result_seqs if ctx.delivered(s)]


def _answered(ctx: Context, req: ExecReq) -> bool:
    return bool(_delivered_results(ctx, req)) or req.abort_seq is not None or any(
        ctx.delivered(s) for s in (req.throw_seq, req.close_seq) if s is not None)


def _unclosed(ctx: Context, req: ExecReq) -> bool:
    """Results delivered, but no stream_close, throw or abort."""
    if not _delivered_results(ctx, req) or req.abort_seq is not None:
        return False
    return not any(ctx.delivered(s) for s in (req.throw_seq, req.close_seq) if s is not None)


def _rejected_note(ctx: Context, seqs: list[int]) -> str:
    rejected = [s for s in seqs if not ctx.delivered(s)]
    if not rejected:
        return ""
    fail = ctx.facts.http_failures[rejected[0]]
    return (f" Its answer at seq {rejected[0]} was refused by the server ({fail.label}; see "
            "append_rejected).")


# heartbeat_loop --------------------------------------------------------------------------------

@rule("heartbeat_loop", "error", "a heartbeat-only stretch the run never recovered from")
def heartbeat_loop(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    out = []
    for run in ctx.runs:
        if run.count < cfg.heartbeat_min_count or run.span_s < cfg.heartbeat_min_span_s:
            continue
        recovered = run.next_kind is not None and not kinds.is_end_stream(run.next_kind)
        if recovered:
            continue  # a long wait the server came back from is not a loop
        # Heartbeats after the turn ended, with no new client input since, are just an idle stream.
        since = run.prev_client_seq if run.prev_client_seq is not None else -1
        if ctx.turn_ended_between(since, run.first_seq):
            continue
        if not ctx.final and any(r.client_hb_seq is not None and r.client_hb_seq > run.first_seq
                                 and not r.result_seqs for r in ctx.facts.execs):
            continue  # live: a local exec is still running (the client heartbeats it)
        if any(r.seq < run.first_seq and not _answered(ctx, r) and ctx.answered_in_follow_up(r)
               for r in ctx.facts.execs):
            continue  # a run a bridge left after its hand-off: bridge_left_run says how long it idled
        cause, cause_ev, cause_fix = _stall_cause(ctx, run)
        if cause and not ctx.order_known:
            cause = " " + ORDER_NOTE + cause.lstrip()
        after = f" after {run.prev_kind} at seq {run.prev_seq}" if run.prev_kind else ""
        state = "and the stream ended" if run.next_kind else (
            "and nothing else came" if ctx.final else "and it is still going")
        msg = (f"{run.count} server heartbeats over {run.span_s:.1f} s with no other server frame{after}, "
               f"{state} (no turn_ended).{cause}")
        ev = ([run.prev_seq] if run.prev_seq is not None else []) + cause_ev + run.sample + [run.last_seq]
        if run.next_seq is not None:
            ev.append(run.next_seq)
        out.append(ctx.finding("heartbeat_loop", msg, ev, cause_fix or
                               "Find the obligation the server is waiting for: every exec answered (and closed "
                               "where the server expects stream_close), every KV request and interaction_query "
                               "answered, every BidiAppend accepted; tool results belong in a new run (same "
                               "conversation_id + checkpoint), not appended to a finished one."))
    return out


def _stall_cause(ctx: Context, run: HeartbeatRun) -> tuple[str, list[int], str]:
    """The open obligation just before a stall, in the words of the rule that reports it."""
    seg = run.seg if run.seg else ctx.seg_of(run.first_seq)
    for req in reversed(ctx.facts.execs):
        if req.seq > run.first_seq or req.seg != seg:
            continue
        if _unclosed(ctx, req) and ctx.stall_after(req.ref_seq, req.seg, any_progress=True):
            res = _delivered_results(ctx, req)
            return (f" Likely cause: {exec_label(req)} got its result at seq {res[0]} but no "
                    f"stream_close{{{req.id}}} (see missing_stream_close).", [req.seq] + res[:3],
                    _CLOSE_FIX.format(id=req.id))
        if not _answered(ctx, req) and ctx.stall_after(req.seq, req.seg):
            waited = " This server waited for the context." if req.member == REQUEST_CONTEXT else ""
            return (f" Likely cause: {exec_label(req)} at seq {req.seq} was never answered "
                    f"(see unanswered_exec).{waited}{_rejected_note(ctx, req.result_seqs)}", [req.seq],
                    f"Answer exec {req.id} (its result, or throw{{id: {req.id}}} if unsupported).")
    for q in ctx.facts.queries:
        if q.response_seq is None and q.seq < run.first_seq and q.seg == seg:
            return (f" Likely cause: interaction_query {q.id} at seq {q.seq} was never answered.", [q.seq],
                    f"Send interaction_response{{id: {q.id}}}.")
    for b in ctx.blobs:
        if b["status"] == "unanswered" and b["seq"] < run.first_seq:
            return (f" Likely cause: KV {b['op']}_blob id {b['kv_id']} at seq {b['seq']} was never answered.",
                    [b["seq"]], "Answer every KV request with a kv_client_message of the same id.")
    rejected = sorted((f for f in ctx.facts.http_failures.values()
                       if f.transport == "bidi_append" and (f.status or f.grpc) and f.seq < run.first_seq),
                      key=lambda f: f.seq)
    if rejected:
        f = next((f for f in rejected if f.kind == kinds.RUN_REQUEST), rejected[-1])
        never = ", so the run never started" if f.kind == kinds.RUN_REQUEST else ""
        return (f" Likely cause: the BidiAppend carrying {f.kind} at seq {f.seq} was refused ({f.label}; "
                f"see append_rejected): the server never got it{never}.", [f.seq], "Fix the rejected append first.")
    before = [b for b in ctx.blobs if b["op"] == "set" and b.get("role") == "assistant" and b["seq"] < run.first_seq]
    if before and ctx.text_between(before[-1]["seq"], run.first_seq) == []:
        b = before[-1]
        return (f" The model's answer went to KV blob {b['blob_id'][:12]}… at seq {b['seq']} "
                "(see kv_only_response).", [b["seq"]],
                "Start a new run with the same conversation_id and the echoed checkpoint instead of appending "
                "tool results into the open run.")
    return "", [], ""


# exec obligations ------------------------------------------------------------------------------

@rule("missing_stream_close", "error", "an exec answered but never closed, and the run parked after it")
def missing_stream_close(ctx: Context) -> list[Finding]:
    out = []
    for req in ctx.facts.execs:
        if not _unclosed(ctx, req):
            continue
        results = _delivered_results(ctx, req)
        ref = req.ref_seq
        if not ctx.settled(ref):
            continue
        stall = ctx.stall_after(ref, req.seg, any_progress=True)
        if stall is None:
            continue  # the server went on (or the turn ended): a result alone completed the exec
        msg = (f"{exec_label(req)} at seq {req.seq} was answered at seq {', '.join(map(str, results[:5]))} "
               f"but no stream_close{{{req.id}}} or throw{{{req.id}}} followed, and the run parked: "
               f"{stall.describe()}.")
        out.append(ctx.finding("missing_stream_close", msg, [req.seq] + results + stall.evidence,
                               _CLOSE_FIX.format(id=req.id), order_dependent=True))
    return out


@rule("unanswered_exec", "error", "an exec request with no result, throw or close, and the run parked")
def unanswered_exec(ctx: Context) -> list[Finding]:
    out = []
    for req in ctx.facts.execs:
        if _answered(ctx, req) or not ctx.settled(req.seq):
            continue
        if req.client_hb_seq is not None and not ctx.final:
            continue  # the client keeps saying it is still executing
        if ctx.answered_in_follow_up(req):
            continue  # a bridge's hand-off: answered in its follow-up run (bridge_left_run)
        stall = ctx.stall_after(req.seq, req.seg)
        context = req.member == REQUEST_CONTEXT
        if stall is None:
            # The turn went on or ended, or the client left the run to hand the exec over. The
            # service does not wait for the request context (clients send it in run_request), but
            # a server that does would park here: say so, as a note.
            if context and ctx.final and not ctx.handed_off(req):
                out.append(ctx.finding(
                    "unanswered_exec",
                    f"{exec_label(req)} at seq {req.seq} was never answered and the run went on without it "
                    "(the service takes the environment and tools from the run request). A server that waits "
                    "for the context would park here.",
                    [req.seq], "Answer request_context_args with a request_context_result (environment, tools) "
                    "if you target servers that wait for it.", severity="note"))
            continue
        tail = f" After it {stall.describe()}."
        if context:
            tail += (" This server waited for the context: it did not go on without a request_context_result "
                     "(the service since December 2025 does, taking the context from the run request).")
        if req.client_hb_seq is not None:
            tail += f" The client sent exec heartbeats for it until seq {req.client_hb_seq}: still running."
        tail += _rejected_note(ctx, req.result_seqs + [s for s in (req.throw_seq, req.close_seq) if s is not None])
        unknown = req.member.isdigit()
        if unknown:
            tail += (f" Its args are field {req.member} of ExecServerMessage, a case the client's schema does not "
                     "know: a client that ignores execs it cannot decode leaves the server waiting.")
        out.append(ctx.finding(
            "unanswered_exec",
            f"{exec_label(req)} at seq {req.seq} was never answered: no exec_client_message, throw or "
            f"stream_close with id {req.id} reached the server.{tail}",
            [req.seq] + stall.evidence,
            (f"Answer request_context_args with a request_context_result{{id: {req.id}}} (environment, tools): "
             "this server does not go on without it." if context else
             f"Answer an exec whose case you cannot decode (field {req.member}) with a throw: "
             f"ExecClientControlMessage{{throw{{id: {req.id}}}}} (an exec error, then stream_close), never "
             "ignore it; the id is readable even when the case is not." if unknown else
             f"Answer every exec: result(s) with id {req.id} and exec_id echoed; reply throw{{id: {req.id}}} "
             "(then stream_close) to exec types the client does not implement.")))
    return out


@rule("unanswered_query", "error", "an interaction_query with no interaction_response, and the run parked")
def unanswered_query(ctx: Context) -> list[Finding]:
    out = []
    for q in ctx.facts.queries:
        if (q.response_seq is not None and ctx.delivered(q.response_seq)) or not ctx.settled(q.seq):
            continue
        stall = ctx.stall_after(q.seq, q.seg)
        if stall is None:
            continue
        note = _rejected_note(ctx, [q.response_seq] if q.response_seq is not None else [])
        out.append(ctx.finding(
            "unanswered_query",
            f"{q.kind} id {q.id} at seq {q.seq} was never answered (no interaction_response with id {q.id}); "
            f"the run parked: {stall.describe()}.{note}",
            [q.seq] + stall.evidence,
            f"Send interaction_response{{id: {q.id}}} with the member of the query's number "
            "(approved/rejected for approvals); answer every query, even unsupported ones."))
    return out


# KV ----------------------------------------------------------------------------------------------

@rule("kv_only_response", "error", "the model's answer went to a KV blob, not the stream, and the run parked")
def kv_only_response(ctx: Context) -> list[Finding]:
    out = []
    facts = ctx.facts
    triggers = sorted([s for r in facts.execs for s in r.result_seqs[:1]]
                      + [c.completed_seq for c in facts.calls.values() if c.completed_seq is not None]
                      + [r.seq for r in facts.run_requests])
    reported: set[int] = set()
    for row in ctx.blobs:
        if row["op"] != "set" or row.get("role") != "assistant":
            continue
        s = row["seq"]
        i = bisect_left(triggers, s)
        trigger = triggers[i - 1] if i else (facts.first_seq or 0)
        seg = ctx.seg_of(s)
        if seg in reported:
            continue
        end = ctx.seg_end(seg)
        if ctx.turn_ended_between(s, end) or ctx.text_between(trigger, end) or not ctx.settled(s):
            continue
        stall = ctx.stall_after(s, seg)
        if stall is None:
            continue  # no wait after it: the client left the run (it had what it needed)
        reported.add(seg)
        what = _parts_label(row.get("parts"))
        others = [b["seq"] for b in ctx.blobs if b["op"] == "set" and b.get("role") == "assistant"
                  and b["seq"] != s and ctx.seg_of(b["seq"]) == seg]
        msg = (f"The answer went only to KV: {summarize_blob(row)} set at seq {s} holds {what}; no text_delta "
               f"since seq {trigger} and the run parked: {stall.describe()}.")
        out.append(ctx.finding(
            "kv_only_response", msg, [trigger, s] + others + stall.evidence,
            "Do not append tool results into a run that already streamed its tool call: start a new run with the "
            "same conversation_id and the echoed checkpoint (or the full history). Surface the blob as "
            "'answer hidden in KV' meanwhile.", order_dependent=True))
    return out


def _parts_label(parts: list[BlobPart] | None) -> str:
    if not parts:
        return "no content parts"
    bits = []
    for p in parts[:3]:
        if p["type"] == "tool-call":
            args = json.dumps(p.get("args"), sort_keys=True)
            bits.append(f"a tool-call {p.get('name')} {args[:80]}")
        elif p["type"] == "text":
            bits.append(f"text {json.dumps(p.get('text', '')[:60])}")
        else:
            bits.append(p["type"])
    types = {p["type"] for p in parts}
    note = " (not text)" if "text" not in types else ""
    return ", ".join(bits) + note


@rule("blob_miss", "warning", "a blob the server asked for (get_blob) answered absent, or a KV request "
      "never answered while the run parked")
def blob_miss(ctx: Context) -> list[Finding]:
    """Only requests the server made count. A blob id the client names (its run_request state, a
    checkpoint it echoes) that the server never asks for is nobody's loss."""
    groups: dict[str, list[BlobRow]] = {}
    for row in ctx.blobs:
        status = row["status"]
        if status in ("miss", "empty", "served", "stored", "set_error") and row.get("result_seq") is not None \
                and not ctx.delivered(row["result_seq"]):
            status = "unanswered"  # the answer was refused with the append that carried it
        if status in ("miss", "empty"):
            groups.setdefault(status, []).append(row)
        elif status == "unanswered" and ctx.stall_after(row["seq"], ctx.seg_of(row["seq"])) is not None:
            groups.setdefault(status, []).append(row)
    out = []
    for status, rows in groups.items():
        ids = ", ".join(f"{r['blob_id'][:12]}…" for r in rows[:5])
        more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
        ev = [s for r in rows for s in (r["seq"], r.get("result_seq")) if s is not None]
        if status in ("miss", "empty"):
            msg = (f"{len(rows)} get_blob request(s) answered {'without data' if status == 'miss' else 'with empty data'}: "
                   f"{ids}{more}. The model loses that context (re-asks, redoes work).")
            fix = ("Keep every blob the server set (keyed by hex id) for the whole conversation and serve it on "
                   "get_blob; check ids are SHA-256 of the data; a conversation resumed elsewhere needs its blobs.")
            out.append(ctx.finding("blob_miss", msg, ev, fix, severity="warning"))
        else:
            msg = f"{len(rows)} KV request(s) never answered: {ids}{more}, and the run parked after them."
            fix = "Answer every KV request with a kv_client_message of the same id (get: data or absent; set: ack)."
            out.append(ctx.finding("blob_miss", msg, ev, fix, severity="error"))
    return out
