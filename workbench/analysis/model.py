"""Result types of the analysis: findings, thresholds and the per-session result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# ``note``: what the server did that did no harm here but breaks a naive client (a lossy completion,
# cumulative snapshots handled right, a request context left unanswered while the run went on).
# Notes are never counted as findings: they come after them and do not change the exit status.
# ``info`` is kept only so rows written by older versions still load.
SEVERITIES = ("error", "warning", "note")
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2, "note": 3}
PROBLEMS = ("error", "warning")
# Evidence lists are for a reader, not a dump: a 10,000-heartbeat loop keeps its head and tail.
MAX_EVIDENCE = 40


@dataclass
class Finding:
    """One diagnosis: what went wrong, where (frame seqs), and what to do about it."""

    code: str
    severity: str
    message: str
    first_seq: int | None
    last_seq: int | None
    evidence: list[int] = field(default_factory=list)
    suggested_fix: str = ""
    session_id: str = ""
    # set by ``causes.order_findings``: the finding this one follows from (code and first seq)
    cause: str | None = None
    cause_seq: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"finding {self.code}: unknown severity {self.severity!r}")
        self.evidence = clip_evidence(self.evidence)

    @property
    def is_note(self) -> bool:
        return self.severity not in PROBLEMS

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def clip_evidence(seqs: list[int]) -> list[int]:
    uniq = sorted({int(s) for s in seqs if s is not None})
    if len(uniq) <= MAX_EVIDENCE:
        return uniq
    half = MAX_EVIDENCE // 2
    return uniq[:half] + uniq[-half:]


@dataclass
class Config:
    """Thresholds of the rules. Defaults suit real captures; tests may shorten them."""

    # heartbeat_loop: a stretch of >= heartbeat_min_count server heartbeats with no other server
    # frame, lasting >= heartbeat_min_span_s seconds, that the server never recovered from.
    heartbeat_min_count: int = 5
    heartbeat_min_span_s: float = 0.0
    # tool_loop: same tool with the same canonical args this many times in a row.
    tool_loop_min_repeats: int = 3
    # While a capture is in progress, an exec/KV/query request counts as unanswered only after
    # this many later server frames (the answer may simply not have arrived yet).
    live_grace_frames: int = 5
    # end_stream_not_delivered: the heartbeat interval to assume when the session shows none
    # (clients beat every 5 s, or 15 s; servers every few seconds).
    heartbeat_interval_s: float = 5.0


@dataclass
class AnalysisResult:
    """Everything the analysis derived from one session's frames."""

    session_id: str
    blobs: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    frame_count: int = 0

    @property
    def problems(self) -> list[Finding]:
        """The findings proper (errors and warnings), notes left out."""
        return [f for f in self.findings if not f.is_note]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.is_note]

    @property
    def worst(self) -> str | None:
        if not self.problems:
            return None
        return min((f.severity for f in self.problems), key=SEVERITY_RANK.__getitem__)

    @property
    def failed(self) -> bool:
        """True when a warning or error exists (what the CLI's exit code 1 means); notes never count."""
        return bool(self.problems)
