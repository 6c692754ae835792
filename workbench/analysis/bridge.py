"""Diagnosing a bridge's translation: what the OpenAI client got against what the agent side sent.

For each OpenAI request (``openai_chat`` / ``openai_responses`` session) and the agent runs it is
linked to (``bridge_join``), the rules below compare the two sides of the same turn. Each finding
is reported on both sides: on the OpenAI session with its own frames as evidence, on each linked
run with the run's frames; the message names the other side's session and frames. A healthy
bridge gives none. docs/analysis.md ("Bridge findings") and docs/bridge.md describe them.

Codes: ``bridge_args_mismatch``, ``bridge_answer_not_delivered``, ``bridge_tool_result_lost``,
``bridge_client_stream_silent``, ``bridge_side_ended_early``, ``bridge_finish_reason_mismatch``,
``bridge_error_masked``, ``bridge_left_run`` (bridge_handoff.py), ``bridge_tool_not_offered``
(bridge_tools.py), ``bridge_client_retry`` (bridge_retry.py). ``ttft_split`` is no finding: it says where the time to the first token
went (``workbench diagnose`` prints it, ``--json`` carries it).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.message import DecodeError

from workbench.analysis.blobs import blob_rows
from workbench.analysis.bridge_handoff import handed_at, rule_left_run
from workbench.analysis.bridge_join import (
    AGENT_TRANSPORTS,
    JOINED,
    Link,
    agent_links,
    has_bridge_sessions,
    openai_links,
)
from workbench.analysis.bridge_pair import BridgeFinding, Pair, Side
from workbench.analysis.bridge_retry import failed_attempts, rule_client_retry
from workbench.analysis.bridge_tools import offered_tools, rule_not_offered
from workbench.analysis.context import ORDER_TIME, session_order
from workbench.analysis.model import Finding
from workbench.analysis.rows import CallRecord
from workbench.analysis.tools import tool_rows
from workbench.analysis.walk import load_facts
from workbench.protocol import kinds
from workbench.protocol.labels import prompt_of
from workbench.protocol.openai import RequestFacts, answer_facts, request_facts
from workbench.schema import pb
from workbench.store import bridge_reads as reads
from workbench.store.queries import Reader, session_row

# Every code the bridge rules report (causes.py may name them as the cause of an agent-side finding).
BRIDGE_CODES = ("bridge_args_mismatch", "bridge_answer_not_delivered", "bridge_tool_result_lost",
                "bridge_client_stream_silent", "bridge_side_ended_early", "bridge_finish_reason_mismatch",
                "bridge_error_masked", "bridge_left_run", "bridge_tool_not_offered", "bridge_client_retry")
# A silent stretch of the client's stream counts when it lasts this long while the agent side
# heartbeated at least this often and made no progress.
SILENT_MIN_S = 1.0
SILENT_MIN_HEARTBEATS = 3
# One side counts as having gone on after the other ended past this much time.
ENDED_SLACK_S = 1.0
# What the client should have received from a run: generation, tool calls, the end of the turn.
_PROGRESS = (kinds.TEXT_DELTA, kinds.THINKING_DELTA, kinds.TOOL_CALL_STARTED, kinds.PARTIAL_TOOL_CALL,
             kinds.TOOL_CALL_COMPLETED, kinds.TURN_ENDED, kinds.TOKEN_DELTA)


def _load_side(src: Reader, link: Link) -> Side | None:
    row = reads.session_span(src, link.session_id)
    if row is None:
        return None
    side = Side(link.session_id, link.role, row["status"], row["error"], int(row["start_us"] or 0), row["end_us"])
    frames = reads.side_frames(src, link.session_id, (kinds.TEXT_DELTA, kinds.END_STREAM_ERROR))
    for f in frames:
        if f["kind"] == kinds.TEXT_DELTA and f["payload"]:
            try:
                side.text += pb.AgentServerMessage.FromString(f["payload"]).interaction_update.text_delta.text
                side.text_seqs.append(f["seq"])
            except DecodeError:
                pass
        elif f["kind"] == kinds.END_STREAM_ERROR and side.error_seq is None:
            side.error_seq = f["seq"]
        elif f["direction"] == "client" and f["payload"]:
            side.client_payloads.append((f["seq"], f["ts"], f["payload"]))
            if f["kind"] == kinds.RUN_REQUEST and not side.prompt:
                side.prompt = prompt_of(f["kind"], f["payload"]) or ""
        f.pop("payload", None)
    side.frames = frames
    facts = load_facts(src, link.session_id).facts
    side.calls = tool_rows(facts)
    for b in blob_rows(facts, final=True, grace=0):
        if b.get("status") in ("miss", "empty") and b.get("seq") is not None:
            side.blob_misses.append(int(b["seq"]))
        if b.get("op") == "set" and b.get("role") == "assistant":
            text = "".join(str(p.get("text") or "") for p in b.get("parts") or [] if isinstance(p, dict))
            if text.strip():
                side.assistant_blob = (int(b["seq"]), text)
    return side


def load_pair(src: Reader, sid: str) -> Pair | None:
    row = reads.session_span(src, sid)
    if row is None or row["transport"] not in JOINED:
        return None
    frames = reads.frames_with_payloads(src, sid)
    req = next((f for f in frames if f["kind"] == kinds.OPENAI_REQUEST), None)
    answer = answer_facts((f["seq"], f["ts"], f["kind"], f["payload"]) for f in frames if f["direction"] == "server")
    end = row["end_us"] or (frames[-1]["ts"] if frames else row["start_us"])
    links = openai_links(src, sid)
    sides = [s for s in (_load_side(src, lk) for lk in links) if s is not None]
    for s in sides:
        if s.role == "asked":
            s.handed_us = handed_at(src, s.session_id, sid)
    ids = [sid, *(s.session_id for s in sides)]
    orders = [_order(meta) for meta in reads.session_metas(src, ids)]
    return Pair(sid, row["status"], row["http_status"], int(row["start_us"] or 0), int(end or 0),
                request_facts(req["payload"] if req else None) or RequestFacts(),
                req["seq"] if req else None, req["ts"] if req else None, answer,
                [{k: v for k, v in f.items() if k != "payload"} for f in frames],
                [s for s in sides if s.role == "caused"], [s for s in sides if s.role == "asked"],
                timed=all(o == ORDER_TIME for o in orders), offered=offered_tools(req["payload"] if req else None),
                retry_of=failed_attempts(src, sid, req["payload"] if req else None, int(row["start_us"] or 0)))


def _order(meta: str | None) -> str:
    try:
        doc = json.loads(meta) if meta else {}
    except ValueError:
        doc = {}
    return session_order(doc if isinstance(doc, dict) else {})


# findings ------------------------------------------------------------------------------------

def _secs(us: int) -> str:
    return f"{us / 1e6:.1f} s"


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _json_values(text: str) -> list[Any]:
    """The JSON values ``text`` holds one after another (two or more: concatenated snapshots)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    text = text.strip()
    while i < len(text):
        value, end = dec.raw_decode(text, i)
        out.append(value)
        while end < len(text) and text[end].isspace():
            end += 1
        i = end
    return out


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value.strip() else []
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def args_difference(agent: Any, client_text: str, same_tool: bool) -> str | None:
    """How the arguments the client received differ from the agent's merged arguments (None: alike).
    ``same_tool``: the client's function is the agent's tool (an MCP call passed through), so keys
    and types must match; otherwise the bridge maps a built-in tool and only its values are checked."""
    try:
        values = _json_values(client_text)
    except ValueError:
        full = _canon(agent)
        compact = json.dumps(agent, ensure_ascii=False, separators=(",", ":"))
        if client_text and (full.startswith(client_text) or compact.startswith(client_text)
                            or len(client_text) < len(full)):
            return f"truncated: the client got {len(client_text)} characters of JSON that does not parse"
        return f"not JSON: {client_text[:80]!r}"
    if len(values) > 1:
        return f"concatenated: the client got {len(values)} JSON values one after another"
    got = values[0] if values else None
    if not isinstance(agent, dict) or not isinstance(got, dict):
        return None if _canon(agent) == _canon(got) else "different values"
    if same_tool:
        missing = sorted(set(agent) - set(got))
        if missing:
            return f"keys missing: {', '.join(missing)}"
        changed = sorted(k for k in agent if type(agent[k]) is not type(got[k])
                         and not (isinstance(agent[k], int | float) and isinstance(got[k], int | float)))
        if changed:
            return "types changed: " + ", ".join(f"{k} {type(agent[k]).__name__}→{type(got[k]).__name__}"
                                                 for k in changed)
    got_strings = _strings(got)
    for s in _strings(agent):
        if s in got_strings or any(s in g for g in got_strings):
            continue
        cut = [g for g in got_strings if s.startswith(g)]
        return (f"truncated: a value of {len(s)} characters arrived as {len(cut[0])}" if cut
                else f"a value is missing: {s[:60]!r}")
    return None


def _rule_args(p: Pair) -> list[BridgeFinding]:
    out = []
    agent_calls = [(s, c) for s in p.caused for c in s.calls if c.get("args_merged") is not None]
    by_id = {c["call_id"]: (s, c) for s, c in agent_calls}
    unmatched = [(s, c) for s, c in agent_calls if c["call_id"] not in {cc.call_id for cc in p.answer.calls}]
    for i, cc in enumerate(p.answer.calls):
        match = by_id.get(cc.call_id) or (unmatched[i] if len(unmatched) == len(p.answer.calls) else None)
        if match is None:
            continue
        side, call = match
        diff = args_difference(call["args_merged"], cc.arguments, call.get("tool_name") == cc.name)
        if diff:
            seqs = [x for x in (call.get("first_seq"), call.get("last_seq"), call.get("exec_seq")) if x is not None]
            out.append(BridgeFinding(
                "bridge_args_mismatch", "error",
                f"tool call {cc.name} ({cc.call_id}): the arguments the client received differ from the agent's "
                f"merged arguments: {diff}",
                "build the client's arguments from the merged arguments (snapshots replace, they do not "
                "append; McpArgs of tool_call_completed may be lossy): workbench tools shows them",
                cc.seqs, {side.session_id: seqs}))
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


def _rule_answer(p: Pair) -> list[BridgeFinding]:
    got = _norm(p.answer.text)
    ev = p.answer.text_seqs + ([p.answer.finish_seq] if p.answer.finish_seq is not None else [])
    for s in p.caused:
        if _norm(s.text) and _norm(s.text) not in got:
            return [BridgeFinding(
                "bridge_answer_not_delivered", "error",
                f"the agent streamed {len(s.text)} characters of answer text; the client received "
                f"{len(p.answer.text)}" + (f" ({p.answer.text[:40]!r}…)" if p.answer.text else ""),
                "pass every text_delta on as content", ev, {s.session_id: s.text_seqs})]
        if not _norm(s.text) and s.assistant_blob and _norm(s.assistant_blob[1]) not in got:
            return [BridgeFinding(
                "bridge_answer_not_delivered", "error",
                f"the agent's answer ({len(s.assistant_blob[1])} characters) came only as an assistant KV blob; "
                f"the client received {len(p.answer.text)} characters of text",
                "read the answer from the assistant blob the run stored (kv set_blob) when no text_delta came, "
                "or run follow-ups as fresh runs (docs/protocol.md §7)", ev, {s.session_id: [s.assistant_blob[0]]})]
    return []


def _rule_tool_result(p: Pair) -> list[BridgeFinding]:
    out = []
    for cid, text in p.request.new_results.items():
        needle = text.strip()
        reached = any(cid in s.prompt or (needle and needle in s.prompt) for s in p.caused)
        for s in p.asked + p.caused:
            for c in s.calls:
                if c.get("call_id") == cid and c.get("result_seq") is not None:
                    reached = reached or any(seq == c["result_seq"] and ts >= p.start_us
                                             for seq, ts, _ in s.client_payloads)
            if needle and any(ts >= p.start_us and needle.encode() in pl for _, ts, pl in s.client_payloads):
                reached = True
        if not reached:
            runs = {s.session_id: [f["seq"] for f in s.frames if f["kind"] == kinds.RUN_REQUEST][:1]
                    for s in p.caused}
            out.append(BridgeFinding(
                "bridge_tool_result_lost", "error",
                f"the client sent the result of tool call {cid} ({len(text)} characters); it reached no agent run "
                f"(not in the prompt of the run{'s' if len(p.caused) != 1 else ''} it started, no exec result)",
                "put the tool result into the run: the exec's result, or the history of the fresh run",
                [p.request_seq] if p.request_seq is not None else [], runs))
    return out


def _agent_frames(p: Pair) -> list[tuple[int, str, str, int]]:
    return sorted((f["ts"], f["kind"], s.session_id, f["seq"]) for s in p.caused + p.asked for f in s.frames
                  if f["direction"] == "server")


def _rule_silent(p: Pair) -> list[BridgeFinding]:
    if not p.timed:
        return []  # an import without per-frame times cannot tell how long anything was silent
    marks = [p.request_ts or p.start_us] + [f["ts"] for f in p.frames if f["direction"] == "server"
                                            and f["kind"] != kinds.OPENAI_COMMENT] + [p.end_us]
    agent = _agent_frames(p)
    out = []
    for a, b in zip(marks, marks[1:], strict=False):
        inside = [x for x in agent if a < x[0] < b]
        progress = [x[0] for x in inside if x[1] not in (kinds.SERVER_HEARTBEAT, kinds.EMPTY)
                    and not kinds.is_end_stream(x[1])]
        start = max([a, *progress])  # the agent's heartbeat-only stretch runs from its last progress
        hb = [x for x in inside if x[1] == kinds.SERVER_HEARTBEAT and x[0] > start]
        if b - start < SILENT_MIN_S * 1e6 or len(hb) < SILENT_MIN_HEARTBEATS:
            continue
        ev_o = [f["seq"] for f in p.frames if f["ts"] in (a, b)]
        runs: dict[str, list[int]] = {}
        for x in hb[:3] + hb[-2:]:
            runs.setdefault(x[2], []).append(x[3])
        out.append(BridgeFinding(
            "bridge_client_stream_silent", "error",
            f"the client's stream was silent for {_secs(b - start)} while the agent side only heartbeated "
            f"({len(hb)} heartbeats, no progress)",
            "hand the pending tool call (or the error) to the client instead of waiting on the run; a run "
            "that only heartbeats waits for something the bridge owes it", ev_o, runs))
    return out


def _rule_ended(p: Pair) -> list[BridgeFinding]:
    if not p.timed:
        return []  # which side ended first needs per-frame times on both
    out = []
    slack = ENDED_SLACK_S * 1e6
    client_end = p.end_us
    last_o = p.frames[-1]["seq"] if p.frames else None
    for s in p.caused:
        after = [f for f in s.frames if f["direction"] == "server" and f["kind"] in _PROGRESS and f["ts"] > client_end + slack]
        if after:
            out.append(BridgeFinding(
                "bridge_side_ended_early", "error",
                f"the client's stream ended while the agent run went on: {len(after)} progress frames "
                f"({after[0]['kind']} …) over {_secs(after[-1]['ts'] - client_end)} after it",
                "keep the client's stream open until the run's turn ends (turn_ended) or the bridge hands "
                "over a tool call", [last_o] if last_o is not None else [], {s.session_id: [f["seq"] for f in after]}))
    ends = [_turn_end(s) for s in p.caused]
    if p.caused and all(e is not None for e in ends):
        agent_end = max(e for e in ends if e is not None)
        answered = [f for f in p.frames if f["direction"] == "server" and f["kind"] != kinds.OPENAI_COMMENT]
        last_real = answered[-1]["ts"] if answered else p.start_us
        if client_end - agent_end > slack and last_real - agent_end > slack or (
                p.status in ("incomplete", "aborted") and client_end - agent_end > slack):
            s = max(p.caused, key=lambda x: _turn_end(x) or 0)
            out.append(BridgeFinding(
                "bridge_side_ended_early", "error",
                f"the agent run ended; the client's stream went on for {_secs(client_end - agent_end)} more "
                f"(status {p.status})",
                "end the client's stream (finish_reason and [DONE]) when the run ends",
                [f["seq"] for f in p.frames if f["ts"] > agent_end][:5], {s.session_id: [s.frames[-1]["seq"]]}))
    return out


def _turn_end(s: Side) -> int | None:
    """When a run's turn was over: its turn_ended or end of stream, else the session's end."""
    for f in s.frames:
        if f["direction"] == "server" and (f["kind"] == kinds.TURN_ENDED or kinds.is_end_stream(f["kind"])):
            return int(f["ts"])
    return int(s.end_us) if s.end_us else None


def _pending(s: Side) -> list[CallRecord]:
    return [c for c in s.calls if c.get("exec_seq") is not None and c.get("result_seq") is None]


def _rule_finish(p: Pair) -> list[BridgeFinding]:
    fin, got_calls = p.answer.finish_reason, bool(p.answer.calls)
    ev = [p.answer.finish_seq] if p.answer.finish_seq is not None else []
    if fin in ("stop", "length") and not got_calls:
        for s in p.caused:
            pend = _pending(s)
            if pend:
                return [BridgeFinding(
                    "bridge_finish_reason_mismatch", "error",
                    f"finish_reason {fin!r} while the agent run has a tool call pending ({pend[0].get('tool_name')}, "
                    f"{pend[0].get('call_id')}): the client was told the turn is over",
                    "hand the exec to the client as a tool call with finish_reason 'tool_calls'",
                    ev, {s.session_id: [int(pend[0]["exec_seq"] or 0)]})]  # _pending: exec_seq is set
    if fin == "tool_calls" and not got_calls:
        asked = [c for s in p.caused for c in s.calls]
        return [BridgeFinding(
            "bridge_finish_reason_mismatch", "error",
            "finish_reason 'tool_calls' but the client received no tool call"
            + ("" if asked else " and the agent run asked for none"),
            "say 'tool_calls' only with the tool calls themselves", ev,
            {s.session_id: [s.frames[-1]["seq"]] for s in p.caused if s.frames})]
    return []


def _rule_error(p: Pair) -> list[BridgeFinding]:
    if p.answer.error is not None or (p.http_status is not None and p.http_status >= 400):
        return []
    for s in p.caused:
        if s.status == "error" or s.error_seq is not None:
            what = "an empty answer" if not p.answer.text.strip() else f"a {len(p.answer.text)}-character answer"
            return [BridgeFinding(
                "bridge_error_masked", "error",
                f"the service ended the run with an error ({(s.error or 'end_stream.error')[:120]}); the client got "
                f"{what} with HTTP {p.http_status} and finish_reason {p.answer.finish_reason!r}, no error",
                "turn the service's error into an OpenAI error (HTTP status and error object, or an error event "
                "once streaming), with the service's code and message", [f["seq"] for f in p.frames[-2:]],
                {s.session_id: [s.error_seq] if s.error_seq is not None else [s.frames[-1]["seq"]] if s.frames else []})]
    return []


RULES = (_rule_args, _rule_answer, _rule_tool_result, _rule_silent, _rule_ended, _rule_finish, _rule_error,
         rule_left_run, rule_not_offered, rule_client_retry)


def pair_findings(p: Pair) -> list[BridgeFinding]:
    return [f for rule in RULES for f in rule(p)]


def _settled(p: Pair) -> bool:
    return p.status != "open" and all(s.status != "open" for s in p.caused + p.asked)


def any_bridge_sessions(src: Reader) -> bool:
    """Whether the database holds an OpenAI session, so that a bridge can have findings at all."""
    try:
        return has_bridge_sessions(src)
    except Exception:  # a reader of an older or partial database: no bridge to judge
        return False


def bridge_findings(src: Reader, sid: str, *, bridged: bool | None = None) -> list[Finding]:
    """The bridge findings of a session on either side (the one registration in the engine).
    ``bridged``: ``any_bridge_sessions`` when the caller knows it already (a batch of sessions)."""
    if not (any_bridge_sessions(src) if bridged is None else bridged):
        return []
    try:
        row = session_row(src, sid, ["transport"])
    except Exception:  # a reader of an older or partial database: no bridge to judge
        return []
    transport = row["transport"] if row else None
    if transport in JOINED:
        p = load_pair(src, sid)
        return [b.on_openai(sid) for b in pair_findings(p)] if p is not None and _settled(p) else []
    if transport in AGENT_TRANSPORTS:
        out = []
        for lk in agent_links(src, sid):
            p = load_pair(src, lk.session_id)
            if p is not None and _settled(p):
                out += [b.on_agent(lk.session_id, sid) for b in pair_findings(p) if sid in b.agent]
        return out
    return []


def ttft_split(src: Reader, sid: str) -> dict[str, Any] | None:
    """Where the time to the first token of an OpenAI request went (µs), or None (no answer, no run)."""
    p = load_pair(src, sid)
    if p is None or not p.caused or p.answer.first_answer_ts is None or p.request_ts is None:
        return None
    run = min(p.caused, key=lambda s: s.start_us)
    gen = [f["ts"] for f in run.frames if f["direction"] == "server" and f["kind"] in _PROGRESS]
    if not gen:
        return None
    first_agent = gen[0]
    return {"run": run.session_id, "total_us": p.answer.first_answer_ts - p.start_us,
            "client_to_bridge_us": p.request_ts - p.start_us, "bridge_to_service_us": run.start_us - p.request_ts,
            "service_us": first_agent - run.start_us, "bridge_to_client_us": p.answer.first_answer_ts - first_agent}


def format_ttft(t: dict[str, Any]) -> str:
    ms = {k: round(v / 1000) for k, v in t.items() if k.endswith("_us")}
    return (f"time to first token {ms['total_us']} ms = client→bridge {ms['client_to_bridge_us']} ms + "
            f"bridge→service {ms['bridge_to_service_us']} ms + service {ms['service_us']} ms + "
            f"bridge→client {ms['bridge_to_client_us']} ms")
