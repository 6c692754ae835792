"""Rules about tool-call arguments and repeated calls: args_cumulative_snapshots,
completion_args_lossy, tool_loop.

The server's own habits (cumulative args snapshots, a lossy McpArgs in tool_call_completed) are
no finding by themselves: every client sees them. A warning needs the client's own later message
to carry what only a client that mishandled them would send; without one they are notes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from workbench.analysis.argsdiff import args_diff
from workbench.analysis.context import Context, rule
from workbench.analysis.model import Finding
from workbench.analysis.rows import CallRecord
from workbench.analysis.tools import canonical_args
from workbench.protocol.args import accumulate_all, naive_junctions

_MIN_NEEDLE = 8  # shorter texts turn up by chance


def _forms(texts: Iterable[str]) -> list[bytes]:
    """Each text raw and as it reads inside a JSON string (escaped), as UTF-8 bytes."""
    out: list[bytes] = []
    for t in texts:
        for form in (t, json.dumps(t)[1:-1], json.dumps(t, ensure_ascii=False)[1:-1]):
            b = form.encode()
            if b not in out:
                out.append(b)
    return out


def _later_hit(ctx: Context, needles: list[bytes]) -> tuple[str, int] | None:
    """The first run request / action of a later session (the next turn of a client that replays
    its history) that carries one of ``needles``."""
    for sid, seq, payload in ctx.later_payloads():
        if any(n in payload for n in needles):
            return sid, seq
    return None


def _where(hits: list[int], later: tuple[str, int] | None) -> str:
    if hits:
        return f"its message at seq {hits[0]}"
    assert later is not None
    return f"its next run (session {later[0]}, seq {later[1]})"


def _hay(ctx: Context, row: CallRecord, after: int) -> list[tuple[int, bytes]]:
    """Client messages that may echo a call's args: its exec's result(s), later requests/actions.
    In a body-order session every client message is a candidate (positions say nothing)."""
    hay = [(row.get("result_seq") or after, p) for p in row.get("_echo") or []]
    hay += [(seq, p) for seq, p in ctx.facts.client_payloads if seq > after or not ctx.order_known]
    return hay


@rule("args_cumulative_snapshots", "warning", "the client concatenated cumulative args snapshots")
def args_cumulative_snapshots(ctx: Context) -> list[Finding]:
    """The server always streams cumulative snapshots, so their presence alone is healthy. The
    finding needs the client's own later messages (history, results, next request) to carry text
    that only a naive concatenation produces; without one the snapshots make one note per session."""
    out = []
    handled: list[tuple[CallRecord, int, int, int]] = []
    for row in ctx.tool_calls:
        deltas = row.get("_deltas") or []
        good = accumulate_all(deltas) if len(deltas) >= 2 else ""
        if len(deltas) < 2 or row.get("args_naive") in (None, good):
            continue
        junctions = [j for j in naive_junctions(deltas) if j not in good]
        needles = _forms(junctions)
        if not needles:
            continue
        first = row["_delta_seqs"][0]
        hits = sorted(seq for seq, p in _hay(ctx, row, first) if any(n in p for n in needles))
        later = None if hits else _later_hit(ctx, needles)
        naive = row["args_naive"] or ""
        if not hits and later is None:
            handled.append((row, len(deltas), len(good), len(naive)))
            continue
        at = naive.find(junctions[0])
        shown = naive[max(0, at - 20): at + len(junctions[0]) + 20] if at >= 0 else naive[:60]
        out.append(ctx.finding(
            "args_cumulative_snapshots",
            f"call {row['call_id']} ({row.get('tool_name')}): {len(deltas)} args_text_delta values were cumulative "
            f"snapshots and the client concatenated them; {_where(hits, later)} carries the garbled args "
            f"(…{shown}…, {len(naive)} chars, not JSON) instead of the {len(good)}-char snapshot.",
            row["_delta_seqs"] + hits[:5],
            "A delta that starts with the text so far is a snapshot: replace the buffer, append only the suffix "
            "(workbench.protocol.args.accumulate_args_text); cross-check with the started/completed args."))
    if handled:
        calls = "; ".join(f"{r['call_id']} ({r.get('tool_name')}): {n} deltas, {good} chars right, {naive} naive"
                          for r, n, good, naive in handled[:5])
        more = f"; and {len(handled) - 5} more" if len(handled) > 5 else ""
        out.append(ctx.finding(
            "args_cumulative_snapshots",
            f"The server sent the args_text_delta of {len(handled)} call{'s' if len(handled) != 1 else ''} as "
            f"cumulative snapshots ({calls}{more}). Nothing this client sent carries the garbled text a naive "
            "concatenation gives; a client that appends every delta would run the tool with non-JSON args.",
            [s for r, *_ in handled for s in r["_delta_seqs"][:1] + r["_delta_seqs"][-1:]],
            "A delta that starts with the text so far is a snapshot: replace the buffer, append only the suffix "
            "(workbench.protocol.args.accumulate_args_text).", severity="note"))
    return out


def _lossy_needles(completion: dict[str, Any], downgraded: list[str], missing: list[str]) -> list[bytes]:
    """Text only a client that took the completion's args as they are would send back."""
    texts: list[str] = []
    for k in downgraded:
        for sep in (": ", ":"):
            for ascii_only in (True, False):
                texts.append(json.dumps(k) + sep + json.dumps(completion[k], ensure_ascii=ascii_only))
    if missing and completion:
        for keys in (list(completion), sorted(completion)):
            ordered = {k: completion[k] for k in keys}
            for seps in ((", ", ": "), (",", ":")):
                for ascii_only in (True, False):
                    texts.append(json.dumps(ordered, separators=seps, ensure_ascii=ascii_only))
    return [n for n in _forms(texts) if len(n) >= _MIN_NEEDLE]


@rule("completion_args_lossy", "warning", "the client used the lossy MCP args of tool_call_completed")
def completion_args_lossy(ctx: Context) -> list[Finding]:
    """The server's tool_call_completed McpArgs may drop oversized keys and downgrade structured
    values to strings. A warning needs a later client message carrying the lossy args (a
    downgraded value as a string, or the completion's args object as it stands); without one the
    client merged them right and the lossy completion is a note (a naive client would trip on it)."""
    out = []
    for row in ctx.tool_calls:
        completion = row.get("args_completion")
        completed = row.get("_completed_seq")
        if not isinstance(completion, dict) or completed is None:
            continue
        if row.get("_case") != "mcp_tool_call" and not (row.get("_exec_args") or {}).get("args"):
            continue
        streamed = row.get("args_streamed")
        reference = streamed if isinstance(streamed, dict) else (row.get("_exec_args") or {}).get("args")
        diff = args_diff(reference, completion)
        if not diff:
            continue
        missing, downgraded = diff.omitted, diff.downgraded
        needles = _lossy_needles(completion, downgraded, missing)
        hits = sorted(seq for seq, p in ctx.facts.client_payloads
                      if (seq > completed or not ctx.order_known) and any(n in p for n in needles))
        later = None if hits else _later_hit(ctx, needles)
        src = "streamed args" if isinstance(streamed, dict) else "exec mcp_args"
        ev: list[int | None] = [*row["_delta_seqs"][-1:], completed, row.get("exec_seq")]
        fix = ("Merge the completion map into the streamed (or exec) args instead of overwriting: keep keys it omits "
               "and structured values it downgraded (workbench.protocol.args.merge_mcp_args).")
        if not hits and later is None:
            # No harm here: nothing shows the client used these args. Still worth saying.
            out.append(ctx.finding(
                "completion_args_lossy",
                f"call {row['call_id']} ({row.get('tool_name')}): the tool_call_completed McpArgs differ from the "
                f"{src} ({diff.describe()}); this client kept the full args, a client that takes the completion's "
                "args as they stand would run the tool with these.",
                ev, fix, severity="note"))
            continue
        where = _where(hits, later).replace("its", "the client's", 1)
        out.append(ctx.finding(
            "completion_args_lossy",
            f"call {row['call_id']} ({row.get('tool_name')}): the tool_call_completed McpArgs differ from the {src} "
            f"({diff.describe()}), and {where} carries those lossy args "
            f"(merged args keep {sorted(row['args_merged']) if isinstance(row.get('args_merged'), dict) else '?'}).",
            [*ev, *hits[:5]], fix, order_dependent=True))
    return out


@rule("tool_loop", "warning", "the same tool with the same args several times in a row, answered, with no text between")
def tool_loop(ctx: Context) -> list[Finding]:
    """A model that calls the same tool with the same args again and again, each call executed and
    answered and no text in between, is not getting the results (docs/protocol.md §7: checkpoint
    not echoed, blob misses, lost args, a result rejected every time)."""
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
        rep = rows[i:j]
        answered = all(r.get("result_seq") is not None or r.get("status") == "completed" for r in rep)
        talked = ctx.text_between(rep[0]["first_seq"], rep[-1]["first_seq"]) if len(rep) > 1 else []
        if j - i >= n and answered and not talked:
            results = {json.dumps(r.get("result"), sort_keys=True, default=str)[:60] for r in rep}
            ev = [s for r in rep for s in (r["first_seq"], r.get("exec_seq"), r.get("result_seq")) if s is not None]
            out.append(ctx.finding(
                "tool_loop",
                f"{key[0]} called {j - i} times in a row with the same args {key[1][:100]} "
                f"(seq {rep[0]['first_seq']}–{rep[-1]['last_seq']}), each answered, no text between; "
                + ("every result was the same." if len(results) == 1 else f"{len(results)} distinct results."),
                ev,
                "The results are probably not reaching the model: echo the latest checkpoint with the same "
                "conversation_id, serve every blob, and check whether the tool result is rejected/error each time "
                "(a rejection makes the model re-plan)."))
        i = j
    return out
