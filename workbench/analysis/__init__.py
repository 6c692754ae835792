"""Analysis of stored sessions: KV blobs, tool-call reconstruction and diagnostic findings.

Public API (the TUI, demo and fixtures call these):

- ``analyze_session(store_or_reader, session_id) -> AnalysisResult`` (reads only);
- ``analyze(store, session_ids=None) -> {session_id: AnalysisResult}`` (also replaces the rows of
  ``blobs``, ``tool_calls`` and ``findings`` for those sessions);
- ``IncrementalAnalyzer(session_id).feed(rows)`` / ``.findings()`` for a capture in progress;
- ``session_findings(reader, session_id) -> list[Finding]``: stored, else computed (what views show);
- ``Finding``, ``AnalysisResult``, ``Config``; ``workbench.analysis.rules.RULES`` (code → rule).

The names load on first use: listing sessions reads ``analysis.stamp`` and should not pay for
loading the rules.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.analysis.engine import IncrementalAnalyzer, analyze, analyze_session, write_results
    from workbench.analysis.findings import session_findings, stored_findings
    from workbench.analysis.model import AnalysisResult, Config, Finding

_WHERE = {"IncrementalAnalyzer": "engine", "analyze": "engine", "analyze_session": "engine",
          "write_results": "engine", "AnalysisResult": "model", "Config": "model", "Finding": "model",
          "session_findings": "findings", "stored_findings": "findings"}

__all__ = ["AnalysisResult", "Config", "Finding", "IncrementalAnalyzer", "analyze", "analyze_session",
           "session_findings", "stored_findings", "write_results"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"workbench.analysis.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'workbench.analysis' has no attribute {name!r}")
