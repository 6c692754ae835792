"""A stateless bridge's hand-off: the run it left after handing a tool call to its OpenAI client.

A bridge that keeps no run open between requests streams the agent's tool call to its client
(``finish_reason: tool_calls``), leaves that run, and sends the client's tool result in a new run
of the same conversation (docs/bridge.md; the fresh-run flow of docs/protocol.md §6). The left
run's exec is then answered — in the follow-up run, not in its own — so the agent-side rules must
not call it unanswered (``calls_answered_in_follow_up`` is what ``Context.answered_in_follow_up``
consults), and the bridge rules say it as what it is: ``bridge_left_run``, with which run got the
answer, by which id, how long the left run stayed open and whether it was ever closed. A left run
that was closed (or cancelled) promptly is a note; one left open is a warning, because it holds a
stream (and, over HTTP/2, a slot of the connection) until the server gives up on it.
"""

from __future__ import annotations

from workbench.analysis.bridge_join import JOINED, agent_links, openai_links, request_payload
from workbench.analysis.bridge_pair import BridgeFinding, Pair
from workbench.protocol.openai import request_facts
from workbench.store import bridge_reads as reads
from workbench.store.queries import Reader

# A left run closed within this long after the client got the tool call was closed promptly (a note).
PROMPT_CLOSE_S = 2.0


def calls_answered_in_follow_up(src: Reader, run_sid: str) -> set[str]:
    """Tool-call ids of this run whose results a follow-up OpenAI request sent, when that request
    started a run of its own (the linked follow-up run that got the answer). A bridge that renames
    ids is linked through the earlier answer that handed the ids out (``bridge_join``): then every
    call of the run counts, since the follow-up answers the calls this run asked for."""
    mine = {cid for _, cid in reads.call_ids_of(src, [run_sid], ("server",))}
    if not mine:
        return set()
    out: set[str] = set()
    for lk in agent_links(src, run_sid):
        if lk.role != "asked":
            continue
        facts = request_facts(request_payload(src, lk.session_id))
        if facts is None or not facts.tool_results:
            continue
        if not any(o.role == "caused" for o in openai_links(src, lk.session_id, answered=False)):
            continue  # the result reached no new run: bridge_tool_result_lost speaks, not this
        direct = mine & set(facts.tool_results)
        out |= direct if direct else (mine if "earlier_answer" in lk.by else set())
    return out


def handed_at(src: Reader, run_sid: str, follow_up: str) -> int | None:
    """When the client got the run's tool call: the end of the earlier OpenAI answer (the request
    that caused the run, not the follow-up), or None when that request was not recorded."""
    for lk in agent_links(src, run_sid):
        if lk.role == "caused" and lk.session_id != follow_up:
            row = reads.session_span(src, lk.session_id)
            if row is not None and row["transport"] in JOINED and row["end_us"]:
                return int(row["end_us"])
    return None


def rule_left_run(p: Pair) -> list[BridgeFinding]:
    out: list[BridgeFinding] = []
    answered = set(p.request.tool_results)
    follow_runs = [s for s in p.caused]
    if not follow_runs or not answered:
        return out
    for s in p.asked:
        pending = [c for c in s.calls if c.get("exec_seq") is not None and c.get("result_seq") is None]
        if not pending:
            continue
        by_id = [c for c in pending if c.get("call_id") in answered]
        calls = by_id or pending  # a bridge that renamed the ids: linked through the earlier answer
        call = calls[0]
        exec_seq = int(call["exec_seq"] or 0)
        exec_ts = next((int(f["ts"]) for f in s.frames if f["seq"] == exec_seq), s.start_us)
        handed = s.handed_us if s.handed_us is not None else exec_ts
        closed = s.status not in ("open", None) and s.end_us is not None
        end_us = int(s.end_us) if s.end_us else max([int(f["ts"]) for f in s.frames] or [s.start_us])
        open_s = max(0, end_us - handed) / 1e6
        prompt = closed and s.status != "complete" and open_s <= PROMPT_CLOSE_S
        client_id = call.get("call_id") if by_id else next(iter(sorted(answered)))
        follow = follow_runs[0].session_id
        how = (f"closed {open_s:.1f} s after the client got the call (status {s.status})" if closed
               else f"never closed: still open {open_s:.1f} s after the client got the call, when the recording ended")
        beats = sum(1 for f in s.frames if f["direction"] == "server" and f["kind"].endswith("heartbeat")
                    and f["ts"] > handed)
        message = (f"the bridge handed tool call {call.get('tool_name')} ({call.get('call_id')}) to its client and "
                   f"left run {s.session_id[:8]}; the client's result (tool_call_id {client_id}) went to the "
                   f"follow-up run {follow[:8]} of request {p.session_id[:8]}, so the exec was answered there. "
                   f"The left run was {how}" + (f"; it sent {beats} heartbeats meanwhile" if beats else ""))
        ev_agent = [exec_seq] + [f["seq"] for f in s.frames[-1:]]
        out.append(BridgeFinding(
            "bridge_left_run", "note" if prompt else "warning", message,
            "cancel the left run as soon as the tool call is handed to the client (close the Run stream, "
            "or drop the RunSSE response): a left run holds its stream until the server gives up on it",
            [p.request_seq] if p.request_seq is not None else [],
            {s.session_id: ev_agent}))
    return out
