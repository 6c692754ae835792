"""Result types of the analysis: findings (and notes), thresholds and the per-session result.

A ``Finding`` is immutable: the analysis builds it, ``causes.order_findings`` returns copies with
``cause`` set, and every view (``diagnose`` and its ``--json``, the TUI, the sessions listing, the
stored ``findings`` rows) reads the same type. A *note* is a ``Finding`` with severity ``note``:
what the server did that did no harm here but breaks a naive client. It has the same fields, the
same table and the same JSON as a finding; ``Finding.is_note`` tells them apart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, cast

from workbench.analysis.rows import BlobRow, ToolCallRow

# ``note``: what the server did that did no harm here but breaks a naive client (a lossy completion,
# cumulative snapshots handled right, a request context left unanswered while the run went on).
# Notes are never counted as findings: they come after them and do not change the exit status.
# ``info`` is kept only so rows written by older versions still load.
Severity = Literal["error", "warning", "info", "note"]
SEVERITIES = ("error", "warning", "note")
SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2, "note": 3}
PROBLEMS = ("error", "warning")
# Evidence lists are for a reader, not a dump: a 10,000-heartbeat loop keeps its head and tail.
MAX_EVIDENCE = 40


class FindingJson(TypedDict):
    """A finding as ``workbench diagnose --json`` prints it: these keys, in this order (scripts
    read them; keep both)."""

    code: str
    severity: str
    message: str
    first_seq: int | None
    last_seq: int | None
    evidence: list[int]
    suggested_fix: str
    session_id: str
    cause: str | None
    cause_seq: int | None


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what went wrong, where (frame seqs), and what to do about it.

    ``evidence`` is at most ``MAX_EVIDENCE`` seqs, sorted. When none is given but the seq range is,
    the range's ends are the evidence: rows an older workbench (or an import) stored without
    evidence get the same evidence a fresh analysis would show.
    """

    code: str
    severity: Severity
    message: str
    first_seq: int | None
    last_seq: int | None
    evidence: tuple[int, ...] = ()
    suggested_fix: str = ""
    session_id: str = ""
    # set by ``causes.order_findings``: the finding this one follows from (code and first seq)
    cause: str | None = None
    cause_seq: int | None = None

    def __post_init__(self) -> None:
        if self.severity not in SEVERITY_RANK:
            raise ValueError(f"finding {self.code}: unknown severity {self.severity!r}")
        evidence = clip_evidence(self.evidence)
        if not evidence and self.first_seq is not None:
            evidence = tuple(sorted({self.first_seq, self.first_seq if self.last_seq is None else self.last_seq}))
        # frozen: the normalised evidence is set once, here
        object.__setattr__(self, "evidence", evidence)

    @property
    def is_note(self) -> bool:
        return self.severity not in PROBLEMS

    def caused_by(self, cause: Finding | None) -> Finding:
        """This finding with ``cause``/``cause_seq`` naming ``cause`` (None: a root cause)."""
        code, seq = (cause.code, cause.first_seq) if cause is not None else (None, None)
        if (code, seq) == (self.cause, self.cause_seq):
            return self
        return replace(self, cause=code, cause_seq=seq)

    def to_json(self) -> FindingJson:
        """The ``diagnose --json`` object (key order kept: users' scripts depend on it)."""
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "first_seq": self.first_seq, "last_seq": self.last_seq, "evidence": list(self.evidence),
                "suggested_fix": self.suggested_fix, "session_id": self.session_id,
                "cause": self.cause, "cause_seq": self.cause_seq}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Finding:
        """A finding from ``to_json``'s object, or from a ``findings`` row (no cause; NULL message,
        fix or evidence read as empty)."""
        return cls(str(doc["code"]), cast(Severity, str(doc["severity"])), str(doc.get("message") or ""),
                   _opt_int(doc.get("first_seq")), _opt_int(doc.get("last_seq")),
                   tuple(int(s) for s in doc.get("evidence") or () if s is not None),
                   str(doc.get("suggested_fix") or ""), str(doc.get("session_id") or ""),
                   None if doc.get("cause") is None else str(doc["cause"]), _opt_int(doc.get("cause_seq")))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def clip_evidence(seqs: Iterable[int | None]) -> tuple[int, ...]:
    uniq = sorted({int(s) for s in seqs if s is not None})
    if len(uniq) <= MAX_EVIDENCE:
        return tuple(uniq)
    half = MAX_EVIDENCE // 2
    return tuple(uniq[:half] + uniq[-half:])


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
    blobs: list[BlobRow] = field(default_factory=list)
    tool_calls: list[ToolCallRow] = field(default_factory=list)
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
