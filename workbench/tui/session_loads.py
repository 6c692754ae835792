"""What the session screen reads in its workers: the first index of a session, and what a poll of a
capture in progress brings (new frames, findings, the session row). Plain data, built off the UI
thread and handed to the screen."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.analysis.model import Finding
from workbench.tui.data import FrameFilter, FrameIndex, LiveFindings, SessionSummary, TuiData


@dataclass
class IndexLoad:
    t0: int
    index: FrameIndex
    max_seq: int
    summary: SessionSummary | None
    rows: dict[int, dict[str, Any]]
    complete: bool = True   # False: the index stops at session_screen.PREFIX_SEQS, the rest is being read


@dataclass
class PollResult:
    seqs: np.ndarray
    hb: np.ndarray
    up: np.ndarray
    max_seq: int
    findings: list[Finding]
    summary: SessionSummary | None


def poll_session(data: TuiData, sid: str, flt: FrameFilter, after: int, live: LiveFindings | None) -> PollResult:
    """The frames of ``sid`` after seq ``after`` that ``flt`` keeps, its findings (stored, else
    those of the live analyzer fed so far) and its row."""
    upto = max(after, data.max_seq(sid))
    seqs, hb, up = data.new_frames_since(sid, after, flt, upto_seq=upto)
    findings = data.stored_findings(sid)
    if findings is None:  # not analysed yet: the capture's frames so far, analysed as they come
        findings = live.update(data) if live is not None else []
    return PollResult(seqs, hb, up, upto, findings, data.session(sid))
