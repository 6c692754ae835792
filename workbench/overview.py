"""A list of sessions as people read it: each with its label and its top finding.

The top finding is the first of the session's findings in root-cause order
(``workbench.analysis.causes.order_findings``): the rule that explains the others, e.g.
``missing_stream_close`` rather than the ``stream_ended_without_turn_end`` it led to.
``workbench sessions``, the TUI's sessions screen and the notebooks all show this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa

Query = Callable[..., pa.Table]

FINDING_COLUMNS = "session_id, code, severity, coalesce(message, '') AS message, first_seq, last_seq"


def top_findings(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Finding rows (session_id, code, severity, message, first_seq, last_seq) → each session's
    top finding, root cause first."""
    by_session: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_session.setdefault(str(r["session_id"]), []).append(dict(r))
    out = {sid: items[0] for sid, items in by_session.items() if len(items) == 1}
    if len(out) < len(by_session):
        # imported only when needed: loading the analysis package takes most of a second
        from workbench.analysis.causes import order_findings

        out.update({sid: order_findings(items)[0] for sid, items in by_session.items() if len(items) > 1})
    return out


def query_top_findings(query: Query, session_ids: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """``top_findings`` of the sessions in a capture (``query(sql, params)`` as a reader has it)."""
    if session_ids is None:
        t = query(f"SELECT {FINDING_COLUMNS} FROM findings")
    else:
        t = query(f"SELECT {FINDING_COLUMNS} FROM findings WHERE session_id IN (SELECT unnest(?))",
                  [list(session_ids)])
    return top_findings(t.to_pylist())


def finding_text(f: dict[str, Any] | None) -> str:
    """``code: message`` of a top finding, or an empty string."""
    if not f:
        return ""
    msg = str(f.get("message") or "")
    return f"{f['code']}: {msg}" if msg else str(f["code"])
