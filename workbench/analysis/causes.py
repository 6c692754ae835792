"""Which finding explains which, and the order a reader should see them in: root cause first.

``CAUSES`` maps a symptom code to the codes that can explain it, most direct first (e.g.
``stream_ended_without_turn_end`` ← ``heartbeat_loop`` ← ``missing_stream_close``). The relation
is acyclic. ``order_findings`` puts each root cause before the findings that follow from it and
returns each follower with ``cause`` / ``cause_seq`` set (``Finding`` is immutable: a copy), so
``workbench diagnose``, the TUI, the listing's top finding and the live analysis order findings
the same way. Importing this module does not load the rules or the engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, overload

from workbench.analysis.model import SEVERITY_RANK, Finding

# An unanswered message the server never took: the append carrying it was refused or lost.
_LOST_APPEND = ("append_rejected", "append_seqno_anomaly")
_OBLIGATIONS = ("missing_stream_close", "unanswered_exec", "unanswered_query", "blob_miss", "kv_only_response")
# The run's own end explains what the server reports after it: the client ended the run while work
# was in progress, or the stream's framing was lost so what came next could not be read.
_ENDED = ("client_cancelled", "framing_lost")

CAUSES: dict[str, tuple[str, ...]] = {
    "missing_stream_close": _ENDED + _LOST_APPEND,
    "unanswered_exec": _ENDED + _LOST_APPEND,
    "unanswered_query": _ENDED + _LOST_APPEND,
    # (a retried request's run resumed state whose blobs only the failed attempt's run had: bridge.py)
    "blob_miss": _LOST_APPEND + ("bridge_client_retry",),
    "heartbeat_loop": _ENDED + _OBLIGATIONS + _LOST_APPEND,
    "stream_ended_without_turn_end": _ENDED + ("heartbeat_loop",) + _OBLIGATIONS + ("missing_conversation_state",)
    + _LOST_APPEND,
    # a server that gave up waiting (deadline_exceeded), or refused a request without state
    "server_error": ("missing_conversation_state",) + _ENDED + ("heartbeat_loop",) + _OBLIGATIONS + _LOST_APPEND,
    "tool_loop": ("missing_conversation_state", "blob_miss", "completion_args_lossy", "args_cumulative_snapshots",
                  "kv_only_response", "missing_stream_close"),
}


def _key(f: Finding) -> tuple[int, int, str]:
    return (SEVERITY_RANK.get(f.severity, 3), -1 if f.first_seq is None else f.first_seq, f.code)


def cause_of(item: Finding, items: Sequence[Finding]) -> Finding | None:
    """The finding among ``items`` that explains ``item``: of the codes that can, the most direct
    one present that starts no later than ``item`` ends (the nearest before it, if several)."""
    end = item.last_seq
    for cause_code in CAUSES.get(item.code, ()):
        found = [c for c in items if c is not item and c.code == cause_code
                 and (end is None or c.first_seq is None or c.first_seq <= end)]
        if found:
            return max(found, key=lambda c: -1 if c.first_seq is None else c.first_seq)
    return None


@overload
def order_findings(items: Sequence[Finding]) -> list[Finding]: ...
@overload
def order_findings(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]: ...


def order_findings(items: Sequence[Finding] | Sequence[Mapping[str, Any]]) -> list[Finding] | list[dict[str, Any]]:
    """``Finding``s in root-cause order (``_order``). Rows of the ``findings`` table (or
    ``diagnose --json`` objects), as scripts written before the typed ``Finding`` pass them, come
    back as rows in that order with ``cause`` and ``cause_seq`` filled in."""
    if all(isinstance(f, Finding) for f in items):
        return [f for _, f in _order([f for f in items if isinstance(f, Finding)])]
    rows = [dict(r) for r in items if isinstance(r, Mapping)]
    typed = [Finding.from_json(r) for r in rows]
    row_of = {id(f): r for f, r in zip(typed, rows, strict=True)}
    return [{**row_of[id(src)], "cause": f.cause, "cause_seq": f.cause_seq} for src, f in _order(typed)]


def _order(items: Sequence[Finding]) -> list[tuple[Finding, Finding]]:
    """Root causes first (by severity, then seq), each followed by what follows from it; notes last,
    in seq order. A note did no harm, so it neither explains a finding nor follows from one."""
    notes = [(f, f.caused_by(None)) for f in sorted((f for f in items if f.is_note), key=_key)]
    problems = [f for f in items if not f.is_note]
    cause = {id(f): cause_of(f, problems) for f in problems}
    children: dict[int, list[Finding]] = {}
    for f in problems:
        c = cause[id(f)]
        if c is not None:
            children.setdefault(id(c), []).append(f)
    out: list[tuple[Finding, Finding]] = []  # (as given, with its cause)
    seen: set[int] = set()

    def emit(f: Finding) -> None:
        if id(f) in seen:
            return
        seen.add(id(f))
        out.append((f, f.caused_by(cause[id(f)])))
        for child in sorted(children.get(id(f), []), key=_key):
            emit(child)

    for root in sorted((f for f in problems if cause[id(f)] is None), key=_key):
        emit(root)
    for f in sorted(problems, key=_key):  # nothing is left over in an acyclic relation; be safe anyway
        emit(f)
    return out + notes
