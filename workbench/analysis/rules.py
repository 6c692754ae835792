"""Diagnostic rules: one small function per finding code, registered in ``RULES``.

Every rule reads a ``Context`` (the session's facts, blob rows, tool-call rows, thresholds, and
whether the session is over) and returns findings. Rules never touch the store, so the batch and
the live analysis run the same code. ``final`` is False while a capture is in progress: rules then
give an answer time to arrive (``Config.live_grace_frames``) and do not call a stream "ended".

Severities: ``error`` for stalls and protocol violations the server cannot recover from;
``warning`` for data-loss hazards and anomalies that may or may not bite; ``info`` is never used
for a rule listed here (so a healthy session has no finding at all).
"""

from __future__ import annotations

import json
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.blobs import summarize_blob
from workbench.analysis.facts import COMPLETED, TURN_ENDED, ExecReq, HeartbeatRun, SessionFacts
from workbench.analysis.model import Config, Finding
from workbench.analysis.tools import canonical_args
from workbench.decode.classify import default_decoder
from workbench.wire.endstream import parse_end_stream, parse_grpc_web_trailer


@dataclass
class Context:
    facts: SessionFacts
    blobs: list[dict[str, Any]]
    tool_calls: list[dict[str, Any]]
    config: Config
    final: bool
    runs: list[HeartbeatRun]
    # a checkpoint this conversation received in an earlier session: (session_id, seq)
    prior_checkpoint: tuple[str, int] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def session_id(self) -> str:
        return self.facts.session_id

    def finding(self, code: str, message: str, evidence: Sequence[int | None], fix: str,
                severity: str | None = None) -> Finding:
        ev = [int(s) for s in evidence if s is not None]
        return Finding(code, severity or RULES[code].severity, message, min(ev) if ev else None,
                       max(ev) if ev else None, ev, fix, self.session_id)

    def turn_ended_between(self, lo: int, hi: int | None) -> list[int]:
        seqs = [s for s, _seg in self.facts.turn_ended]
        i = bisect_right(seqs, lo)
        j = len(seqs) if hi is None else bisect_left(seqs, hi)
        return seqs[i:j]

    def text_between(self, lo: int, hi: int | None) -> list[int]:
        seqs = self.facts.text_seqs
        i = bisect_right(seqs, lo)
        j = len(seqs) if hi is None else bisect_left(seqs, hi)
        return seqs[i:j]

    def heartbeats_between(self, lo: int, hi: int | None) -> int:
        seqs = self.facts.heartbeat_seqs
        i = bisect_right(seqs, lo)
        j = len(seqs) if hi is None else bisect_left(seqs, hi)
        return max(0, j - i)

    def handed_off(self, req: ExecReq) -> bool:
        """The client closed the run right after an exec it did not answer, before the server
        parked (no heartbeat since): the fresh-run flow of a proxy that hands the exec to its own
        caller and continues in a new run with the history (seed dec10). Not a stall."""
        if not self.final or (self.extra.get("session") or {}).get("status") == "error":
            return False
        end = self.seg_end(req.seg)
        if self.heartbeats_between(req.seq, end):
            return False
        return not self.turn_ended_between(req.seq, end) and not self.text_between(req.seq, end)

    def run_after(self, seq: int) -> HeartbeatRun | None:
        """The first heartbeat stretch starting after ``seq``."""
        for run in self.runs:
            if run.first_seq > seq:
                return run
        return None

    def seg_end(self, seg: int) -> int | None:
        """The seq of the run_request that starts the next segment (None: the last one)."""
        for rr in self.facts.run_requests:
            if rr.seg == seg + 1:
                return rr.seq
        return None

    def settled(self, seq: int) -> bool:
        """True when enough later frames exist to call a missing answer missing."""
        if self.final:
            return True
        last = self.facts.last_seq if self.facts.last_seq is not None else seq
        return last - seq >= self.config.live_grace_frames


RuleFn = Callable[[Context], list[Finding]]


@dataclass(frozen=True)
class Rule:
    code: str
    severity: str  # the usual severity; a rule may lower it for a milder variant
    fn: RuleFn
    summary: str


RULES: dict[str, Rule] = {}


def rule(code: str, severity: str, summary: str) -> Callable[[RuleFn], RuleFn]:
    def wrap(fn: RuleFn) -> RuleFn:
        RULES[code] = Rule(code, severity, fn, summary)
        return fn
    return wrap


def run_rules(ctx: Context, codes: list[str] | None = None) -> list[Finding]:
    out: list[Finding] = []
    for code, r in RULES.items():
        if codes is not None and code not in codes:
            continue
        out.extend(r.fn(ctx))
    return out


def _sample(run: HeartbeatRun | None, n: int = 6) -> list[int]:
    if run is None:
        return []
    return run.sample[:n] + [run.last_seq]


def _exec_label(req: ExecReq) -> str:
    ex = f", exec_id {req.exec_id}" if req.exec_id else ""
    return f"exec {req.id} ({req.member}{ex})"


# heartbeat_loop --------------------------------------------------------------------------------

@rule("heartbeat_loop", "error", "a heartbeat-only stretch the run never recovered from")
def heartbeat_loop(ctx: Context) -> list[Finding]:
    cfg = ctx.config
    out = []
    for run in ctx.runs:
        if run.count < cfg.heartbeat_min_count or run.span_s < cfg.heartbeat_min_span_s:
            continue
        recovered = run.next_kind is not None and not run.next_kind.startswith("end_stream")
        if recovered:
            continue  # a long wait the server came back from is not a loop
        # Heartbeats after the turn ended, with no new client input since, are just an idle stream.
        since = run.prev_client_seq if run.prev_client_seq is not None else -1
        if ctx.turn_ended_between(since, run.first_seq):
            continue
        if not ctx.final and any(r.client_hb_seq is not None and r.client_hb_seq > run.first_seq
                                 and not r.result_seqs for r in ctx.facts.execs):
            continue  # live: a local exec is still running (the client heartbeats it)
        cause = _stall_cause(ctx, run)
        after = f" after {run.prev_kind} at seq {run.prev_seq}" if run.prev_kind else ""
        state = "and the stream ended" if run.next_kind else (
            "and nothing else came" if ctx.final else "and it is still going")
        msg = (f"{run.count} server heartbeats over {run.span_s:.1f} s with no other server frame{after}, "
               f"{state} (no turn_ended).{cause[0]}")
        ev = ([run.prev_seq] if run.prev_seq is not None else []) + cause[1] + run.sample + [run.last_seq]
        if run.next_seq is not None:
            ev.append(run.next_seq)
        out.append(ctx.finding("heartbeat_loop", msg, ev, cause[2] or
                               "Find the obligation the server is waiting for: every exec answered with "
                               "result(s) then stream_close{id}, every KV request and interaction_query "
                               "answered; tool results belong in a new run (same conversation_id + "
                               "checkpoint), not appended to a finished one."))
    return out


def _stall_cause(ctx: Context, run: HeartbeatRun) -> tuple[str, list[int], str]:
    """A likely reason for a stall: the open obligation just before it."""
    for req in reversed(ctx.facts.execs):
        if req.seq > run.first_seq:
            continue
        if req.result_seqs and req.close_seq is None and req.throw_seq is None and req.abort_seq is None:
            return (f" Likely cause: {_exec_label(req)} got its result at seq {req.result_seqs[0]} but no "
                    f"stream_close{{{req.id}}} (see missing_stream_close).",
                    [req.seq] + req.result_seqs[:3],
                    f"Send ExecClientControlMessage.stream_close{{id: {req.id}}} after the result(s).")
        if not req.result_seqs and req.throw_seq is None and req.abort_seq is None and req.close_seq is None:
            return (f" Likely cause: {_exec_label(req)} at seq {req.seq} was never answered "
                    "(see unanswered_exec).", [req.seq],
                    f"Answer exec {req.id} (result then stream_close), or throw{{id: {req.id}}} if unsupported.")
        break
    for q in ctx.facts.queries:
        if q.response_seq is None and q.seq < run.first_seq:
            return (f" Likely cause: interaction_query {q.id} at seq {q.seq} was never answered.", [q.seq],
                    f"Send interaction_response{{id: {q.id}}}.")
    for b in ctx.blobs:
        if b["status"] == "unanswered" and b["seq"] < run.first_seq:
            return (f" Likely cause: KV {b['op']}_blob id {b['kv_id']} at seq {b['seq']} was never answered.",
                    [b["seq"]], "Answer every KV request with a kv_client_message of the same id.")
    before = [b for b in ctx.blobs if b["op"] == "set" and b.get("role") == "assistant" and b["seq"] < run.first_seq]
    if before and ctx.text_between(before[-1]["seq"], run.first_seq) == []:
        b = before[-1]
        return (f" The model's answer went to KV blob {b['blob_id'][:12]}… at seq {b['seq']} "
                "(see kv_only_response).", [b["seq"]],
                "Start a new run with the same conversation_id and the echoed checkpoint instead of appending "
                "tool results into the open run.")
    return "", [], ""


# exec obligations ------------------------------------------------------------------------------

@rule("missing_stream_close", "error", "an exec answered with a result but never closed")
def missing_stream_close(ctx: Context) -> list[Finding]:
    out = []
    for req in ctx.facts.execs:
        if not req.result_seqs or req.close_seq is not None or req.throw_seq is not None or req.abort_seq is not None:
            continue
        last_result = req.result_seqs[-1]
        if not ctx.settled(last_result):
            continue
        progressed = ctx.turn_ended_between(last_result, None)
        if progressed and req.member == "mcp_args":
            continue  # MCP execs may complete without stream_close (PROTOCOL §13 #1)
        run = ctx.run_after(last_result)
        tail = ""
        if not progressed:
            tail = " The run never progressed after it"
            tail += f" ({run.count} heartbeat-only frames follow)." if run else "."
        else:
            tail = " The server tolerated it this time (a turn_ended followed)."
        msg = (f"{_exec_label(req)} at seq {req.seq} was answered at seq "
               f"{', '.join(map(str, req.result_seqs[:5]))} but no stream_close{{{req.id}}} or throw{{{req.id}}} "
               f"followed.{tail}")
        out.append(ctx.finding(
            "missing_stream_close", msg, [req.seq] + req.result_seqs + _sample(run),
            f"After the result message(s) for exec {req.id}, send "
            f"ExecClientControlMessage{{stream_close{{id: {req.id}}}}} (the official CLI always does).",
            severity="error" if not progressed else "warning"))
    return out


@rule("unanswered_exec", "error", "an exec request with no result, throw or close")
def unanswered_exec(ctx: Context) -> list[Finding]:
    out = []
    for req in ctx.facts.execs:
        if req.result_seqs or req.throw_seq is not None or req.abort_seq is not None or req.close_seq is not None:
            continue
        if not ctx.settled(req.seq) or ctx.handed_off(req):
            continue
        if req.client_hb_seq is not None and not ctx.final:
            continue  # the client keeps saying it is still executing
        run = ctx.run_after(req.seq)
        tail = f" {run.count} heartbeat-only frames follow." if run else ""
        if req.client_hb_seq is not None:
            tail += f" The client sent exec heartbeats for it until seq {req.client_hb_seq}: still running."
        out.append(ctx.finding(
            "unanswered_exec",
            f"{_exec_label(req)} at seq {req.seq} was never answered: no exec_client_message, throw or "
            f"stream_close with id {req.id}.{tail}",
            [req.seq] + _sample(run),
            f"Answer every exec: result(s) with id {req.id} and exec_id echoed, then stream_close{{{req.id}}}; "
            f"reply throw{{id: {req.id}}} to exec types the client does not implement."))
    return out


@rule("unanswered_query", "error", "an interaction_query with no interaction_response")
def unanswered_query(ctx: Context) -> list[Finding]:
    out = []
    for q in ctx.facts.queries:
        if q.response_seq is not None or not ctx.settled(q.seq):
            continue
        run = ctx.run_after(q.seq)
        out.append(ctx.finding(
            "unanswered_query",
            f"{q.kind} id {q.id} at seq {q.seq} was never answered (no interaction_response with id {q.id}); "
            "the run parks until it is.",
            [q.seq] + _sample(run),
            f"Send interaction_response{{id: {q.id}}} with the member of the query's number "
            "(approved/rejected for approvals); answer every query, even unsupported ones."))
    return out


# KV ----------------------------------------------------------------------------------------------

@rule("kv_only_response", "error", "the model's answer went to a KV blob, not the stream")
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
        seg = _seg_of(ctx, s)
        if seg in reported:
            continue
        end = ctx.seg_end(seg)
        if ctx.turn_ended_between(s, end) or ctx.text_between(trigger, end):
            continue
        if not ctx.settled(s):
            continue
        reported.add(seg)
        what = _parts_label(row.get("parts"))
        run = ctx.run_after(s)
        others = [b["seq"] for b in ctx.blobs if b["op"] == "set" and b.get("role") == "assistant"
                  and b["seq"] != s and _seg_of(ctx, b["seq"]) == seg]
        msg = (f"The answer went only to KV: {summarize_blob(row)} set at seq {s} holds {what}; no text_delta "
               f"since seq {trigger} and no turn_ended" + (f" ({run.count} heartbeat-only frames follow)" if run else "")
               + ".")
        out.append(ctx.finding(
            "kv_only_response", msg, [trigger, s] + others + _sample(run),
            "Do not append tool results into a run that already streamed its tool call: start a new run with the "
            "same conversation_id and the echoed checkpoint (or the full history). Surface the blob as "
            "'answer hidden in KV' meanwhile."))
    return out


def _seg_of(ctx: Context, seq: int) -> int:
    seg = 0
    for rr in ctx.facts.run_requests:
        if rr.seq <= seq:
            seg = rr.seg
    return seg


def _parts_label(parts: list[dict[str, Any]] | None) -> str:
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
    kinds = {p["type"] for p in parts}
    note = " (not text)" if "text" not in kinds else ""
    return ", ".join(bits) + note


@rule("blob_miss", "warning", "a KV get answered empty, a checkpoint naming a blob never set, or a KV request unanswered")
def blob_miss(ctx: Context) -> list[Finding]:
    out = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in ctx.blobs:
        if row["status"] in ("miss", "empty", "never_set", "unanswered"):
            groups.setdefault(row["status"], []).append(row)
    for status, rows in groups.items():
        ids = ", ".join(f"{r['blob_id'][:12]}…" + (f" ({r['checkpoint_ref']})" if r.get("checkpoint_ref") else "")
                        for r in rows[:5])
        more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
        ev = [s for r in rows for s in (r["seq"], r.get("result_seq")) if s is not None]
        if status in ("miss", "empty"):
            msg = (f"{len(rows)} get_blob request(s) answered {'without data' if status == 'miss' else 'with empty data'}: "
                   f"{ids}{more}. The model loses that context (re-asks, redoes work).")
            fix = ("Keep every blob the server set (keyed by hex id) for the whole conversation and serve it on "
                   "get_blob; check ids are SHA-256 of the data; a conversation resumed elsewhere needs its blobs.")
            sev = "warning"
        elif status == "never_set":
            msg = f"{len(rows)} blob id(s) named by a checkpoint were never set or served in this conversation: {ids}{more}."
            fix = ("Echo checkpoints only with the blob store that goes with them; the named field shows which part "
                   "of the conversation is lost.")
            sev = "warning"
        else:
            msg = f"{len(rows)} KV request(s) never answered: {ids}{more}. The run waits for them."
            fix = "Answer every KV request with a kv_client_message of the same id (get: data or absent; set: ack)."
            sev = "error"
        out.append(ctx.finding("blob_miss", msg, ev, fix, severity=sev))
    return out


# tool-call args --------------------------------------------------------------------------------

_JUNCTION = 12


def _junctions(deltas: list[str]) -> list[str]:
    """Text that only a naive concatenation contains: tail of one snapshot + head of the next."""
    out = []
    acc = ""
    for prev, cur in zip(deltas, deltas[1:], strict=False):
        acc = acc or prev
        if prev and cur.startswith(prev):
            j = prev[-_JUNCTION:] + cur[:_JUNCTION]
            out.append(j)
    return out


@rule("args_cumulative_snapshots", "warning", "the client concatenated cumulative args snapshots")
def args_cumulative_snapshots(ctx: Context) -> list[Finding]:
    """Evidence-based: the server always streams cumulative snapshots, so their presence alone is
    healthy. The finding needs the client's own later messages (history, results, next request) to
    carry text that only a naive concatenation produces."""
    out = []
    payloads = ctx.facts.client_payloads
    for row in ctx.tool_calls:
        deltas = row.get("_deltas") or []
        if len(deltas) < 2 or row.get("args_naive") in (None, _accumulated(deltas)):
            continue
        needles = []
        for j in _junctions(deltas):
            needles.append(j.encode())
            needles.append(json.dumps(j)[1:-1].encode())  # the same text inside a JSON string
        if not needles:
            continue
        first = row["_delta_seqs"][0]
        # Where a client would echo a call's args: its exec's result(s), later requests/actions.
        hay = [(row.get("result_seq") or first, p) for p in row.get("_echo") or []]
        hay += [(seq, p) for seq, p in payloads if seq > first]
        hits = sorted(seq for seq, p in hay if any(n in p for n in needles))
        if not hits:
            continue
        naive = row["args_naive"] or ""
        junction = _junctions(deltas)[0]
        at = naive.find(junction)
        shown = naive[max(0, at - 20): at + len(junction) + 20] if at >= 0 else naive[:60]
        out.append(ctx.finding(
            "args_cumulative_snapshots",
            f"call {row['call_id']} ({row.get('tool_name')}): {len(deltas)} args_text_delta values were cumulative "
            f"snapshots and the client concatenated them; its message at seq {hits[0]} carries the garbled args "
            f"(…{shown}…, {len(naive)} chars, not JSON) instead of the {len(_accumulated(deltas))}-char snapshot.",
            row["_delta_seqs"] + hits[:5],
            "A delta that starts with the text so far is a snapshot: replace the buffer, append only the suffix "
            "(workbench.client.args.accumulate_args_text); cross-check with the started/completed args."))
    return out


def _accumulated(deltas: list[str]) -> str:
    from workbench.analysis.argsutil import accumulate_args_text

    text = ""
    for d in deltas:
        text = accumulate_args_text(text, d)
    return text


@rule("completion_args_lossy", "warning", "tool_call_completed dropped or downgraded MCP args the stream had")
def completion_args_lossy(ctx: Context) -> list[Finding]:
    out = []
    for row in ctx.tool_calls:
        completion = row.get("args_completion")
        if not isinstance(completion, dict) or row.get("_completed_seq") is None:
            continue
        if row.get("_case") != "mcp_tool_call" and not (row.get("_exec_args") or {}).get("args"):
            continue
        streamed = row.get("args_streamed")
        reference = streamed if isinstance(streamed, dict) else (row.get("_exec_args") or {}).get("args")
        if not isinstance(reference, dict):
            continue
        missing = [k for k in reference if k not in completion]
        downgraded = [k for k in reference if k in completion and isinstance(completion[k], str)
                      and not isinstance(reference[k], str)]
        if not missing and not downgraded:
            continue
        bits = []
        if missing:
            bits.append(f"dropped {missing}")
        if downgraded:
            bits.append(f"downgraded {downgraded} to strings")
        src = "streamed args" if isinstance(streamed, dict) else "exec mcp_args"
        out.append(ctx.finding(
            "completion_args_lossy",
            f"call {row['call_id']} ({row.get('tool_name')}): the tool_call_completed McpArgs {' and '.join(bits)} "
            f"that the {src} had; a client that lets the completion overwrite loses them "
            f"(merged args keep {sorted(row['args_merged']) if isinstance(row.get('args_merged'), dict) else '?'}).",
            (row["_delta_seqs"][-1:] if row["_delta_seqs"] else []) + [row["_completed_seq"], row.get("exec_seq")],
            "Merge the completion map into the streamed (or exec) args instead of overwriting: keep keys it omits "
            "and structured values it downgraded (workbench.client.args.merge_mcp_args)."))
    return out


@rule("tool_loop", "warning", "the same tool with the same args several times in a row")
def tool_loop(ctx: Context) -> list[Finding]:
    rows = [r for r in ctx.tool_calls if r.get("tool_name")]
    keys = [(r["tool_name"], canonical_args(r)) for r in rows]
    out = []
    i = 0
    n = ctx.config.tool_loop_min_repeats
    while i < len(rows):
        key = keys[i]
        j = i + 1
        while j < len(rows) and keys[j] == key:
            j += 1
        if j - i >= n:
            rep = rows[i:j]
            results = {json.dumps(r.get("result"), sort_keys=True, default=str)[:60] for r in rep}
            ev = [s for r in rep for s in (r["first_seq"], r.get("exec_seq"), r.get("result_seq")) if s is not None]
            out.append(ctx.finding(
                "tool_loop",
                f"{key[0]} called {j - i} times in a row with the same args {key[1][:100]} "
                f"(seq {rep[0]['first_seq']}–{rep[-1]['last_seq']}); "
                + ("every result was the same." if len(results) == 1 else f"{len(results)} distinct results."),
                ev,
                "The results are probably not reaching the model: echo the latest checkpoint with the same "
                "conversation_id, serve every blob, send stream_close after results, and check whether the tool "
                "result is rejected/error each time (a rejection makes the model re-plan)."))
        i = j
    return out


# run requests and streams ----------------------------------------------------------------------

@rule("missing_conversation_state", "error", "a run request without conversation_state, or an empty one on a follow-up")
def missing_conversation_state(ctx: Context) -> list[Finding]:
    out = []
    facts = ctx.facts
    errors = [s for s, kind, _p, _f in facts.end_streams if kind == "end_stream.error"]
    for rr in facts.run_requests:
        if not rr.has_state:
            later = [s for s in errors if s > rr.seq][:1]
            out.append(ctx.finding(
                "missing_conversation_state",
                f"run_request at seq {rr.seq} has no conversation_state (field 1 absent); the server answers "
                "\"Conversation state is required\".",
                [rr.seq] + later,
                "Always write AgentRunRequest.conversation_state, even empty (bytes 0a 00); encoders that skip "
                "empty sub-messages drop it."))
            continue
        if not rr.state_empty or rr.action not in (None, "user_message_action"):
            continue
        earlier = [s for s, _seg, _p in facts.checkpoints if s < rr.seq]
        if earlier:
            out.append(ctx.finding(
                "missing_conversation_state",
                f"follow-up run_request at seq {rr.seq} sent an empty conversation_state although a checkpoint "
                f"arrived at seq {earlier[-1]}: the conversation's context is lost.",
                [earlier[-1], rr.seq],
                "Echo the latest checkpoint as conversation_state with the same conversation_id."))
        elif ctx.prior_checkpoint is not None and rr is facts.run_requests[0]:
            sid, seq = ctx.prior_checkpoint
            out.append(ctx.finding(
                "missing_conversation_state",
                f"run_request at seq {rr.seq} continues conversation {rr.conversation_id!r} with an empty "
                f"conversation_state although session {sid} received a checkpoint (seq {seq}): context lost.",
                [rr.seq],
                "Echo the latest checkpoint as conversation_state with the same conversation_id."))
    return out


@rule("append_seqno_anomaly", "warning", "BidiAppend append_seqno reset, gap or duplicate")
def append_seqno_anomaly(ctx: Context) -> list[Finding]:
    out = []
    by_req: dict[str | None, list[Any]] = {}
    for a in ctx.facts.appends:
        by_req.setdefault(a.request_id, []).append(a)
    for rid, appends in by_req.items():
        seen: set[int] = set()
        high = -1
        problems: list[str] = []
        ev: list[int] = []
        for a in appends:
            if a.seqno in seen:
                if a.seqno == 0 and high > 0:
                    problems.append(f"restart at 0 (seq {a.seq}) after {high}")
                else:
                    problems.append(f"duplicate {a.seqno} (seq {a.seq})")
                ev.append(a.seq)
            elif a.seqno == 0 and high > 0:
                problems.append(f"restart at 0 (seq {a.seq}) after {high}")
                ev.append(a.seq)
            seen.add(a.seqno)
            high = max(high, a.seqno)
        missing = sorted(set(range(0, high + 1)) - seen)
        if missing and (ctx.final or len(appends) > 16):
            problems.append(f"gap: {', '.join(map(str, missing[:10]))} never sent")
            ev += [a.seq for a in appends if a.seqno > missing[0]][:3]
        if problems:
            out.append(ctx.finding(
                "append_seqno_anomaly",
                f"BidiAppend request_id {rid}: " + "; ".join(problems[:6])
                + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else "")
                + ". The server orders appends by seqno: a message it never sees leaves its exec/query unanswered.",
                ev,
                "Keep one append_seqno counter per request_id for the whole run (0, 1, 2, …); do not reset it on "
                "retry; resend a failed (non-200) append with the same seqno."))
    return out


_AGENT_SERVER = ("interaction_update.", "exec_server_message.", "kv_server_message.", "interaction_query.",
                 "conversation_checkpoint_update")


@rule("stream_ended_without_turn_end", "error", "a run's stream ended without turn_ended")
def stream_ended_without_turn_end(ctx: Context) -> list[Finding]:
    facts = ctx.facts
    out = []
    if facts.ndjson and not facts.run_requests:
        return []  # stream-json output has no turn_ended; its end is the result event
    # Only agent runs have turns: not unary calls, not a capture of something else. A run whose
    # request was not captured still shows by its agent messages.
    agent = bool(facts.run_requests) or any(k.startswith(_AGENT_SERVER) for k in facts.kinds)
    if not agent:
        return []
    segs = [rr.seg for rr in facts.run_requests] or [0]
    for seg in segs:
        start = next((rr.seq for rr in facts.run_requests if rr.seg == seg), facts.first_seq or 0)
        end = ctx.seg_end(seg)
        ended_by_next = end is not None
        ends = [(s, k) for s, k, _p, _f in facts.end_streams if s > start and (end is None or s < end)]
        if any(k == "end_stream.error" for _s, k in ends) or (end is None and session_server_error(ctx)):
            continue  # server_error explains it
        if any(r.seg == seg and not r.result_seqs and r.throw_seq is None and r.close_seq is None
               and ctx.handed_off(r) for r in facts.execs):
            continue  # the client left the run on purpose to hand an exec over
        if not (ended_by_next or ends or ctx.final):
            continue
        if ctx.turn_ended_between(start, end):
            last_te = ctx.turn_ended_between(start, end)[-1]
            # tool results appended after the turn ended and never answered with a new turn
            later_input = [r.result_seqs[0] for r in facts.execs if r.result_seqs and r.result_seqs[0] > last_te
                           and (end is None or r.result_seqs[0] < end)]
            if not later_input:
                continue
        last_server = _last_server_before(ctx, end)
        close = ends[-1][0] if ends else (end if ended_by_next else facts.last_seq)
        how = (f"end-stream at seq {close}" if ends else
               f"the next run_request at seq {end}" if ended_by_next else "the end of the capture")
        idle = ""
        if facts.last_progress_ts is not None and facts.last_ts is not None and not ended_by_next:
            idle = f", {max(0.0, (facts.last_ts - facts.last_progress_ts) / 1e6):.1f} s after the last non-heartbeat server frame"
        checkpoints = [s for s, sg, _p in facts.checkpoints if sg == seg]
        cp = f"; a checkpoint came at seq {checkpoints[-1]}" if checkpoints else ""
        out.append(ctx.finding(
            "stream_ended_without_turn_end",
            f"the run started at seq {start} ended ({how}{idle}) without turn_ended; last server frame (not counting heartbeats): "
            f"{last_server[1]} at seq {last_server[0]}{cp}.",
            [start] + checkpoints[-1:] + ([last_server[0]] if last_server[0] is not None else []) + [close],
            "Treat the turn as incomplete and retryable (same conversation_id + last checkpoint); a checkpoint is "
            "not the end. Look at what closed it: provider abort, proxy idle timeout/GOAWAY, FRAME_SIZE_ERROR."))
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
    items = [(s, TURN_ENDED) for s, _ in f.turn_ended] + [(s, "conversation_checkpoint_update") for s, _g, _p in f.checkpoints]
    items += [(c.completed_seq, COMPLETED) for c in f.calls.values() if c.completed_seq is not None]
    items += [(r.seq, "exec_server_message." + r.member) for r in f.execs]
    items += [(s, "interaction_update.text_delta") for s in f.text_seqs[-1:]]
    return sorted(items)


CONNECT_CODES = frozenset({"canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found",
                           "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
                           "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss",
                           "unauthenticated"})


def session_server_error(ctx: Context) -> tuple[str, str] | None:
    """(code, message) when the session record says the stream ended with a Connect error."""
    info = ctx.extra.get("session") or {}
    if info.get("status") != "error" or not info.get("error"):
        return None
    code, _, message = str(info["error"]).partition(":")
    code = code.strip()
    if code not in CONNECT_CODES:
        return None
    return code, message.strip()


_ERROR_FIX = {
    "resource_exhausted": "Usage or rate limit (ERROR_RATE_LIMITED_CHANGEABLE): wait, switch model, or raise the plan.",
    "not_found": "Wrong model id (ERROR_BAD_MODEL_NAME): use a model_id the account offers.",
    "unauthenticated": "Token expired or missing (ERROR_NOT_LOGGED_IN / ERROR_UNAUTHORIZED): log in again.",
    "unavailable": "Provider outage (ERROR_OPENAI, retryable): retry with backoff.",
    "permission_denied": "The account may not use this feature or model.",
    "invalid_argument": "The server rejected the request itself (e.g. \"Conversation state is required\"): fix "
                        "the request encoding.",
}


@rule("server_error", "error", "the stream ended with an error (rate limit, bad model, auth, outage)")
def server_error(ctx: Context) -> list[Finding]:
    out = []
    dec = default_decoder()
    for seq, kind, payload, flags in ctx.facts.end_streams:
        if kind != "end_stream.error":
            continue
        if flags & 0x80:
            t = parse_grpc_web_trailer(payload)
            code, message, label, title, detail, retry = (f"grpc-status {t.get('grpc-status')}", t.get("grpc-message", ""),
                                                           "", "", "", None)
        else:
            try:
                es = parse_end_stream(payload, dec.error_details)
            except ValueError as exc:
                out.append(ctx.finding("server_error", f"end-stream at seq {seq} is not valid JSON: {exc}", [seq],
                                       "Check what rewrote the stream (a proxy?)."))
                continue
            code, message = es.code or "unknown", es.message or ""
            label = title = detail = ""
            retry = None
            for d in es.details:
                v = d.get("value") or {}
                dbg = d.get("debug") or {}
                label = label or str(v.get("error") or dbg.get("error") or "")
                cd = v.get("details") or dbg.get("details") or {}
                if isinstance(cd, dict):
                    title = title or str(cd.get("title") or "")
                    detail = detail or str(cd.get("detail") or "")
                    if "is_retryable" in cd or "isRetryable" in cd:
                        retry = bool(cd.get("is_retryable", cd.get("isRetryable")))
        bits = [f"{code}"]
        if label:
            bits.append(label)
        text = f"end-stream error at seq {seq}: {' / '.join(bits)}"
        if message:
            text += f" — {message!r}"
        if title or detail:
            text += f"; {title}{': ' if title and detail else ''}{detail}"
        if retry is not None:
            text += f" (retryable: {'yes' if retry else 'no'})"
        out.append(ctx.finding("server_error", text, [seq],
                               _ERROR_FIX.get(str(code), "Read the error details (message is often just 'Error'); "
                                              "retry only if they say it is retryable.")))
    if not out and (err := session_server_error(ctx)) is not None:
        # Recorders that keep only agent messages (the client's own log) lose the end-stream frame
        # itself; the session row still carries the error the stream ended with.
        ecode, emsg = err
        last = ctx.facts.last_seq
        out.append(ctx.finding(
            "server_error",
            f"the stream ended with error {ecode}" + (f": {emsg[:300]!r}" if emsg else "")
            + " (from the session record; the end-stream frame itself was not stored).",
            [last] if last is not None else [],
            _ERROR_FIX.get(ecode, "Read the error details; retry only if they say it is retryable.")))
    if ctx.facts.ndjson:
        from workbench.analysis.ndjson import error_results

        for seq, ev in error_results(ctx.facts.ndjson):
            err = ev.get("error")
            msg = err.get("message") if isinstance(err, dict) else err
            ndcode = err.get("code") if isinstance(err, dict) else None
            out.append(ctx.finding(
                "server_error",
                f"stream-json result at seq {seq} reports an error" + (f" {ndcode}" if ndcode else "")
                + f": {str(msg or ev.get('result') or 'is_error')[:200]!r}",
                [seq], "Read the error (usage limit, model name, login); the CLI exits non-zero."))
    return out


# NDJSON ----------------------------------------------------------------------------------------

@rule("ndjson_duplicate_text", "warning", "stream-json delta/snapshot forms a naive consumer would duplicate")
def ndjson_duplicate_text(ctx: Context) -> list[Finding]:
    events = ctx.facts.ndjson
    if not events:
        return []
    from workbench.analysis.ndjson import assistant_texts

    good, naive, ev = assistant_texts(events)
    if naive == good or len(naive) <= len(good):
        return []
    return [ctx.finding(
        "ndjson_duplicate_text",
        f"stream-json assistant events mix delta, snapshot and full forms: concatenating them gives "
        f"{len(naive)} characters of text where the answer has {len(good)} "
        f"({good[:60]!r} … duplicated).",
        ev,
        "Accumulate deltas (timestamp_ms, no model_call_id); let snapshots (with model_call_id) and full messages "
        "(no timestamp_ms) replace the text instead of appending.")]
