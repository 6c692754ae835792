"""A list of sessions as people read it: each with its label and its top finding.

The top finding is the first of the session's findings in root-cause order
(``workbench.analysis.causes.order_findings``): the rule that explains the others, e.g.
``missing_stream_close`` rather than the ``stream_ended_without_turn_end`` it led to.
``workbench sessions``, the TUI's sessions screen and the notebooks all show this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from workbench.store.queries import FINDING_COLUMNS, Reader, finding_counts, finding_rows

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["FINDING_COLUMNS", "PROBLEMS", "FindingState", "finding_states", "finding_text", "query_top_findings",
           "top_findings"]


PROBLEMS = ("error", "warning")  # notes (severity "note") are never a session's top finding


def top_findings(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Finding rows (session_id, code, severity, message, first_seq, last_seq) → each session's
    top finding, root cause first. Notes are left out: they did no harm."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("severity") not in PROBLEMS:
            continue
        by_session.setdefault(str(r["session_id"]), []).append(dict(r))
    out = {sid: items[0] for sid, items in by_session.items() if len(items) == 1}
    if len(out) < len(by_session):
        # imported only when needed: loading the analysis package takes most of a second
        from workbench.analysis.causes import order_findings

        out.update({sid: order_findings(items)[0] for sid, items in by_session.items() if len(items) > 1})
    return out


def query_top_findings(reader: Reader, session_ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """``top_findings`` of the sessions in a capture (all, or ``session_ids``)."""
    return top_findings(finding_rows(reader, session_ids))


def finding_text(f: dict[str, Any] | None) -> str:
    """``code: message`` of a top finding, or an empty string."""
    if not f:
        return ""
    msg = str(f.get("message") or "")
    return f"{f['code']}: {msg}" if msg else str(f["code"])


@dataclass
class FindingState:
    """What a session's stored findings say: counts (notes apart) and whether they are current."""

    findings: int = 0
    notes: int = 0
    by_severity: dict[str, int] = field(default_factory=dict)
    # current | stale (an older analysis wrote them) | not analysed | open (still being captured)
    analysis: str = "not analysed"

    @property
    def analysed(self) -> bool:
        return self.analysis in ("current", "stale")

    def text(self) -> str:
        """The findings cell of a sessions list: ``2``, ``0``, ``1 (stale)``, ``not analysed``."""
        if not self.analysed:
            return self.analysis
        return f"{self.findings}" + (" (stale)" if self.analysis == "stale" else "")


def finding_states(reader: Reader | Callable[..., pa.Table], statuses: dict[str, Any]) -> dict[str, FindingState]:
    """session_id → ``FindingState`` for the sessions in ``statuses`` (session_id → status)."""
    from workbench.analysis.stamp import analysis_state, stamps

    # PENDING_OTHER_BRANCH: tui/data.py still passes its bound ``query``; once it passes itself (a
    # Reader), this takes a Reader only.
    if callable(reader):
        reader = _QueryReader(reader)
    have = stamps(reader.query)
    out = {sid: FindingState(analysis=analysis_state(have.get(sid), status)) for sid, status in statuses.items()}
    for r in finding_counts(reader):
        st = out.get(r["session_id"])
        if st is None:
            continue
        n = int(r["n"])
        st.by_severity[r["severity"]] = n
        if r["severity"] in PROBLEMS:
            st.findings += n
        else:
            st.notes += n
    for st in out.values():
        if st.analysis == "not analysed" and st.by_severity:
            st.analysis = "stale"  # rows written before analyses were stamped
    return out


class _QueryReader:
    """A ``Reader`` over a bare ``query(sql, params)`` callable (see ``finding_states``)."""

    path = "(query)"
    live = False

    def __init__(self, query: Callable[..., pa.Table]) -> None:
        self.query = query

    def close(self) -> None:
        pass
