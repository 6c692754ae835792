"""Which finding explains which, and the order a reader should see them in: root cause first.

``CAUSES`` maps a symptom code to the codes that can explain it, most direct first (e.g.
``stream_ended_without_turn_end`` ← ``heartbeat_loop`` ← ``missing_stream_close``). The relation
is acyclic. ``order_findings`` puts each root cause before the findings that follow from it and
sets ``cause`` / ``cause_seq`` on each follower. It takes ``Finding`` objects or finding rows
(dicts with code, severity, first_seq, last_seq), so ``workbench diagnose``, the TUI and the live
analysis order findings the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from workbench.analysis.model import SEVERITY_RANK

# An unanswered message the server never took: the append carrying it was refused or lost.
_LOST_APPEND = ("append_rejected", "append_seqno_anomaly")
_OBLIGATIONS = ("missing_stream_close", "unanswered_exec", "unanswered_query", "blob_miss", "kv_only_response")

CAUSES: dict[str, tuple[str, ...]] = {
    "missing_stream_close": _LOST_APPEND,
    "unanswered_exec": _LOST_APPEND,
    "unanswered_query": _LOST_APPEND,
    "blob_miss": _LOST_APPEND,
    "heartbeat_loop": _OBLIGATIONS + _LOST_APPEND,
    "stream_ended_without_turn_end": ("heartbeat_loop",) + _OBLIGATIONS + ("missing_conversation_state",)
    + _LOST_APPEND,
    # a server that gave up waiting (deadline_exceeded), or refused a request without state
    "server_error": ("missing_conversation_state", "heartbeat_loop") + _OBLIGATIONS + _LOST_APPEND,
    "tool_loop": ("missing_conversation_state", "blob_miss", "completion_args_lossy", "args_cumulative_snapshots",
                  "kv_only_response", "missing_stream_close"),
}

T = TypeVar("T")


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name)


def _set(item: Any, name: str, value: Any) -> None:
    if isinstance(item, dict):
        item[name] = value
    else:
        setattr(item, name, value)


def _seq(item: Any, name: str) -> int:
    v = _get(item, name)
    return int(v) if v is not None else -1


def _key(item: Any) -> tuple[int, int, str]:
    return (SEVERITY_RANK.get(_get(item, "severity"), 3), _seq(item, "first_seq"), str(_get(item, "code")))


def cause_of(item: Any, items: Sequence[Any]) -> Any | None:
    """The finding among ``items`` that explains ``item``: of the codes that can, the most direct
    one present that starts no later than ``item`` ends (the nearest before it, if several)."""
    code = _get(item, "code")
    end = _get(item, "last_seq")
    for cause_code in CAUSES.get(code, ()):
        found = [c for c in items if c is not item and _get(c, "code") == cause_code
                 and (end is None or _get(c, "first_seq") is None or _get(c, "first_seq") <= end)]
        if found:
            return max(found, key=lambda c: _seq(c, "first_seq"))
    return None


def _is_note(item: Any) -> bool:
    return _get(item, "severity") not in ("error", "warning")


def order_findings(items: Sequence[T]) -> list[T]:
    """Root causes first (by severity, then seq), each followed by what follows from it; notes last,
    in seq order. A note did no harm, so it neither explains a finding nor follows from one."""
    notes = sorted((it for it in items if _is_note(it)), key=_key)
    for it in notes:
        _set(it, "cause", None)
        _set(it, "cause_seq", None)
    items = [it for it in items if not _is_note(it)]
    cause: dict[int, Any] = {}
    for it in items:
        c = cause_of(it, items)
        cause[id(it)] = c
        _set(it, "cause", _get(c, "code") if c is not None else None)
        _set(it, "cause_seq", _get(c, "first_seq") if c is not None else None)
    children: dict[int, list[Any]] = {}
    for it in items:
        c = cause[id(it)]
        if c is not None:
            children.setdefault(id(c), []).append(it)
    out: list[T] = []
    seen: set[int] = set()

    def emit(it: Any) -> None:
        if id(it) in seen:
            return
        seen.add(id(it))
        out.append(it)
        for child in sorted(children.get(id(it), []), key=_key):
            emit(child)

    for root in sorted((it for it in items if cause[id(it)] is None), key=_key):
        emit(root)
    for it in sorted(items, key=_key):  # nothing is left over in an acyclic relation; be safe anyway
        emit(it)
    return out + notes
