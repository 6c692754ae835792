"""A list of sessions as people read it: each with its label and its top finding.

The top finding is the first of the session's findings in root-cause order
(``workbench.analysis.causes.order_findings``): the rule that explains the others, e.g.
``missing_stream_close`` rather than the ``stream_ended_without_turn_end`` it led to.
``workbench sessions``, the TUI's sessions screen and the notebooks all show this one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.causes import order_findings
from workbench.analysis.model import PROBLEMS, Finding
from workbench.store.queries import FINDING_COLUMNS, Reader, finding_counts, finding_rows

__all__ = ["FINDING_COLUMNS", "PROBLEMS", "FindingState", "finding_states", "query_top_findings", "top_findings"]


def top_findings(rows: Iterable[Mapping[str, Any]]) -> dict[str, Finding]:
    """Finding rows (session_id, code, severity, message, first_seq, last_seq) → each session's
    top finding, root cause first. Notes (severity "note") are left out: they did no harm."""
    by_session: dict[str, list[Finding]] = {}
    for r in rows:
        if r.get("severity") in PROBLEMS:
            by_session.setdefault(str(r["session_id"]), []).append(Finding.from_json(r))
    return {sid: order_findings(items)[0] for sid, items in by_session.items()}


def query_top_findings(reader: Reader, session_ids: Sequence[str] | None = None) -> dict[str, Finding]:
    """``top_findings`` of the sessions in a capture (all, or ``session_ids``)."""
    return top_findings(finding_rows(reader, session_ids))


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


def finding_states(reader: Reader, statuses: Mapping[str, object]) -> dict[str, FindingState]:
    """session_id → ``FindingState`` for the sessions in ``statuses`` (session_id → status)."""
    # deferred: the stamp loads the store (duckdb); `decode` imports this module, only `sessions` needs the stamp
    from workbench.analysis.stamp import analysis_state, stamps

    have = stamps(reader)
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
