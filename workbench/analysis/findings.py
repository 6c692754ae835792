"""A session's findings for a view: the stored ones when the session was analysed, else computed.

Every view asks here (the TUI's panels, its follow mode, scripts), so stored and computed findings
come out alike: ``Finding`` objects in root-cause order (``causes.order_findings``, ``cause`` set),
evidence filled in the same way (``Finding``: the seq range when a row has none). Importing this
module does not load the rules; computing does.
"""

from __future__ import annotations

from workbench.analysis.causes import order_findings
from workbench.analysis.model import Config, Finding
from workbench.analysis.stamp import stamps
from workbench.store import analysis_reads as reads
from workbench.store.queries import Reader


def stored_findings(src: Reader, session_id: str) -> list[Finding] | None:
    """The session's stored findings and notes, root cause first; None when it was never analysed
    (no stamp and no rows: clean and never analysed are told apart, see ``stamp``)."""
    rows = reads.finding_rows(src, session_id).to_pylist()
    if not rows and session_id not in stamps(src, [session_id]):
        return None
    return order_findings([Finding.from_json(r) for r in rows])


def session_findings(src: Reader, session_id: str, config: Config | None = None) -> list[Finding]:
    """The stored findings of a session, else those a fresh analysis finds (nothing is written)."""
    stored = stored_findings(src, session_id)
    if stored is not None:
        return stored
    # deferred: the rules and the engine (pyarrow.compute, the schema) load only when a view computes
    from workbench.analysis.engine import analyze_session

    return analyze_session(src, session_id, config).findings
