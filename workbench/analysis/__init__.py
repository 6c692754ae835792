"""Analysis of stored sessions: KV blobs, tool-call reconstruction and diagnostic findings.

Public API (the TUI, demo and fixtures call these):

- ``analyze_session(store_or_reader, session_id) -> AnalysisResult`` (reads only);
- ``analyze(store, session_ids=None) -> {session_id: AnalysisResult}`` (also replaces the rows of
  ``blobs``, ``tool_calls`` and ``findings`` for those sessions);
- ``IncrementalAnalyzer(session_id).feed(rows)`` / ``.findings()`` for a capture in progress;
- ``Finding``, ``AnalysisResult``, ``Config``; ``workbench.analysis.rules.RULES`` (code → rule).
"""

from workbench.analysis.engine import IncrementalAnalyzer, analyze, analyze_session, write_results
from workbench.analysis.model import AnalysisResult, Config, Finding

__all__ = ["AnalysisResult", "Config", "Finding", "IncrementalAnalyzer", "analyze", "analyze_session",
           "write_results"]
