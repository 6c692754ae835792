"""What a session diff is made of: steps, options, the differences it lists (``--json``'s shape)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, cast

from workbench.report.session import LoadedFrame, SessionView
from workbench.report.shape import StallDoc

DEFAULT_TIMING_S = 0.5


@dataclass
class Item:
    """Consecutive frames of one direction and kind: one step of the conversation (a stream with
    heartbeats between its deltas is one step too). ``anchor``: the key of a step that carries the
    session's structure (``compare.items``), else None."""

    direction: str
    kind: str
    frames: list[LoadedFrame]
    anchor: Hashable | None = None
    # server heartbeats that came between the frames of a streamed step (not compared: they follow the clock)
    beats: list[LoadedFrame] = field(default_factory=list)
    content: Hashable | None = None   # compare.step_key, once computed

    @property
    def token(self) -> tuple[str, str]:
        return self.direction, self.kind

    def where(self, t0: int) -> str:
        a, b = self.frames[0], self.frames[-1]
        seqs = f"seq {a.seq}" if a is b else f"seq {a.seq}–{b.seq}"
        return f"{seqs}, +{(a.ts_us - t0) / 1e6:.3f} s"

    def label(self) -> str:
        arrow = "→" if self.direction == "client" else "←"
        n = len(self.frames)
        beats = f" (and {len(self.beats)} heartbeats)" if self.beats else ""
        return f"{arrow} {self.kind}" + (f" ×{n}" if n > 1 else "") + beats


@dataclass
class Options:
    timing_threshold_s: float = DEFAULT_TIMING_S
    compare_ids: bool = False
    client_heartbeats: bool = False


class FieldChange(TypedDict):
    """One field that differs between two aligned frames of the same kind (``a``/``b``: the value,
    shortened; None on the side without the field)."""

    a_seq: int
    b_seq: int
    kind: str
    path: str
    a: str | None
    b: str | None


class Difference(StallDoc, total=False):
    """One difference, as ``workbench diff --json`` lists it: ``type`` and ``text`` always; the
    frames of the item on each side when it has them; then what its type adds (see ``add`` calls;
    a stall adds the keys of ``StallDoc``)."""

    type: Required[str]   # only_in_a, only_in_b, moved, count, changed_fields, timing, exec, tool_call, ...
    text: Required[str]
    a_seq: int
    a_last_seq: int
    a_count: int
    b_seq: int
    b_last_seq: int
    b_count: int
    kind: str
    direction: str
    fields: list[FieldChange]          # changed_fields
    more_frames: int                   # changed_fields: frames of the step past the ones listed that differ too
    offset: int                        # changed_fields of a streamed step: where its texts first differ
    a_chars: int                       # ... and each text's length
    b_chars: int
    steps: list[str]                   # moved: the steps that moved (labels)
    a_gap_s: float                     # timing
    b_gap_s: float
    exec: str                          # exec
    a_ending: str | None
    b_ending: str | None
    missing: str | None
    tool: str                          # tool_call, tool_args
    field: str
    a: Any                             # the value on each side (tool_args, tool_call, ending)
    b: Any
    code: str                          # finding
    severity: str
    side: str                          # finding, stall


@dataclass
class Diff:
    a: SessionView
    b: SessionView
    differences: list[Difference] = field(default_factory=list)
    unaligned: list[FieldChange] = field(default_factory=list)
    first_divergence: Difference | None = None
    first_sequence_divergence: Difference | None = None   # the first message in one session only
    stall: dict[str, StallDoc | None] = field(default_factory=dict)
    aligned_items: int = 0
    windowed_gaps: int = 0         # stretches too long to align exactly, aligned window by window (align.WINDOW)
    work: int = 0                  # comparisons made (align.Alignment.work plus frames compared): grows linearly
    # where each difference happens, as a position along A (by ``id`` of the row): orders the first divergence
    at: dict[int, float] = field(default_factory=dict)
    protocol: set[int] = field(default_factory=set)   # ids of the rows that are protocol differences

    @property
    def same(self) -> bool:
        return not self.differences


def add(d: Diff, kind: str, text: str, *, x: Item | None = None, y: Item | None = None, at: float | None = None,
        protocol: bool = True, **extra: Any) -> Difference:
    """Append one difference. ``at``: its position along A (a seq; None: after everything), for
    the first divergence; ``protocol``: whether it is a protocol difference (else content or time)."""
    fields: dict[str, Any] = {"type": kind, "text": text}  # keys in this order: the JSON output keeps it
    if x is not None:
        fields.update(a_seq=x.frames[0].seq, a_last_seq=x.frames[-1].seq, kind=x.kind, direction=x.direction,
                      a_count=len(x.frames))
    if y is not None:
        fields.update(b_seq=y.frames[0].seq, b_last_seq=y.frames[-1].seq, kind=y.kind, direction=y.direction,
                      b_count=len(y.frames))
    fields.update(extra)
    row = cast(Difference, fields)  # the keyword arguments of the callers are Difference's keys
    d.differences.append(row)
    d.at[id(row)] = float("inf") if at is None else at
    if protocol:
        d.protocol.add(id(row))
    if kind in ("only_in_a", "only_in_b", "moved", "count") and d.first_sequence_divergence is None:
        d.first_sequence_divergence = row
    return row


def settle_first_divergence(d: Diff) -> None:
    """The first divergence: the earliest protocol difference along A (content and timing
    differences only when there is nothing else); ties keep the order they were found in."""
    if not d.differences:
        return
    rows = [r for r in d.differences if id(r) in d.protocol] or d.differences
    d.first_divergence = min(rows, key=lambda r: d.at[id(r)])
