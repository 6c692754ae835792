"""The two sides of one bridged turn as the bridge rules read them (``Pair``, ``Side``) and what a
rule reports (``BridgeFinding``): one home for the types that ``bridge.py`` builds and the rule
modules beside it (``bridge_handoff``, ``bridge_retry``, ``bridge_tools``) read, so that no rule
module imports the module that runs it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.model import Finding, Severity
from workbench.analysis.rows import CallRecord
from workbench.protocol.openai import AnswerFacts, RequestFacts


@dataclass
class FailedAttempt:
    session_id: str
    http_status: int
    end_us: int



@dataclass
class Side:
    """One agent run as the rules read it."""

    session_id: str
    role: str
    status: str | None
    error: str | None
    start_us: int
    end_us: int | None
    prompt: str = ""
    frames: list[dict[str, Any]] = field(default_factory=list)   # seq, ts, direction, kind, call_id
    text: str = ""
    text_seqs: list[int] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)    # tool_rows
    assistant_blob: tuple[int, str] | None = None                # (seq, text) of an assistant KV blob
    client_payloads: list[tuple[int, int, bytes]] = field(default_factory=list)
    error_seq: int | None = None
    handed_us: int | None = None     # an asked run: when the client got its tool call (bridge_handoff)
    blob_misses: list[int] = field(default_factory=list)   # get_blob answered without data (seqs)


@dataclass
class Pair:
    """An OpenAI request, what its client received, and its linked runs."""

    session_id: str
    status: str | None
    http_status: int | None
    start_us: int
    end_us: int
    request: RequestFacts
    request_seq: int | None
    request_ts: int | None
    answer: AnswerFacts
    frames: list[dict[str, Any]]
    caused: list[Side]
    asked: list[Side]
    timed: bool = True          # both sides recorded with per-frame times (not an import's body order)
    offered: dict[str, Mapping[str, Any]] | None = None   # tools the client offered (bridge_tools)
    retry_of: list[FailedAttempt] = field(default_factory=list)   # earlier 5xx attempts (bridge_retry)


@dataclass
class BridgeFinding:
    code: str
    severity: Severity
    message: str
    fix: str
    openai: list[int]                        # evidence seqs on the OpenAI side
    agent: dict[str, list[int]]              # run session id → evidence seqs

    def on_openai(self, sid: str) -> Finding:
        where = "; ".join(f"run {s[:8]} seq {seqs_text(q)}" for s, q in self.agent.items() if q) or "no run"
        return _finding(self, sid, self.openai, f"{self.message} [agent side: {where}]")

    def on_agent(self, pair_sid: str, run_sid: str) -> Finding:
        return _finding(self, run_sid, self.agent.get(run_sid, []),
                        f"{self.message} [OpenAI side: request {pair_sid[:8]} seq {seqs_text(self.openai)}]")


def seqs_text(seqs: list[int]) -> str:
    s = sorted(set(seqs))
    return ", ".join(map(str, s[:6])) + (f" … {s[-1]}" if len(s) > 6 else "") if s else "-"


def _finding(b: BridgeFinding, sid: str, seqs: list[int], message: str) -> Finding:
    s = sorted(set(seqs))
    return Finding(b.code, b.severity, message, s[0] if s else None, s[-1] if s else None, tuple(s), b.fix,
                   session_id=sid)
