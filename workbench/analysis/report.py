"""The human-readable diagnosis report (``workbench diagnose`` and the demo print it)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import TextIO

from workbench.analysis.model import AnalysisResult, Finding


def print_report(results: Mapping[str, AnalysisResult] | Iterable[AnalysisResult], file: TextIO | None = None) -> int:
    """Print findings per session, root causes first (``causes.order_findings``), each followed by the
    findings that follow from it; returns the exit code (0 clean, 1 warning/error)."""
    out = file or sys.stdout
    items = list(results.values()) if isinstance(results, Mapping) else list(results)
    if not items:
        print("no sessions", file=out)
        return 0
    for r in items:
        counts: dict[str, int] = {}
        for f in r.problems:
            counts[f.severity] = counts.get(f.severity, 0) + 1
        tally = ", ".join(f"{n} {sev}{'s' if n != 1 else ''}" for sev, n in counts.items()) or "clean"
        if r.notes:
            tally += f" ({len(r.notes)} note{'s' if len(r.notes) != 1 else ''})"
        print(f"session {r.session_id} ({r.frame_count} frames): {tally}", file=out)
        for f in r.problems:
            print(format_finding(f), file=out)
        if r.notes:
            # after the findings: what the server did that did no harm here but would break a naive client
            print("  notes (no harm here; a naive client would trip on these):", file=out)
            for f in r.notes:
                print(format_finding(f), file=out)
    bad = sum(1 for r in items if r.failed)
    print(f"{len(items)} session{'s' if len(items) != 1 else ''} analysed, {bad} with warnings or errors", file=out)
    return 1 if bad else 0


def format_finding(f: Finding) -> str:
    if f.first_seq is None:
        where = "no seq"
    elif f.first_seq == f.last_seq:
        where = f"seq {f.first_seq}"
    else:
        where = f"seq {f.first_seq}–{f.last_seq}"
    lines = [f"  {f.severity.upper():7} {f.code}  [{where}]", f"          {f.message}"]
    if f.cause:
        at = f" (seq {f.cause_seq})" if f.cause_seq is not None else ""
        lines.append(f"          follows from: {f.cause}{at}")
    if f.evidence:
        lines.append(f"          evidence: {', '.join(map(str, f.evidence))}")
    if f.suggested_fix:
        lines.append(f"          fix: {f.suggested_fix}")
    return "\n".join(lines)
