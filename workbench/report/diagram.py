"""Layout of the report's pictures: the sequence diagram and the timeline, as plain data.

The templates (``templates/sequence.svg.j2``, ``timeline.svg.j2``) draw what these functions place;
nothing here writes markup. Coordinates are in SVG user units.

Sequence diagram: one row per message, an arrow from the sender's lane to the receiver's, named
by kind. Runs of server heartbeats become one row (count and span; client keep-alives inside the
run are counted with it), and so do runs of streamed deltas (text, tokens, thinking, tool-call
argument pieces), so a 1,000-frame session stays readable. Each exec gets a bar on the right from
its request to its ``stream_close`` (or to the end, dashed, when none came); the stall (see
``shape.find_stall``) is a red band over its row.

The other side of a bridge: when the session is linked (``SessionView.links``), an agent run gains
an "OpenAI client" lane left of its client (the bridge), an OpenAI request an "agent service" lane
right of its server (the bridge); the linked sessions' messages are placed among the session's own
by time, collapsed the same way, and drawn without a link (their frames are in their own reports).

Timeline: frames binned over time, per direction (client above, server below), stacked by family;
gaps (no frame but heartbeats for a while) shaded; each finding's span outlined.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.bridge_join import JOINED
from workbench.protocol import kinds
from workbench.report.session import LinkedFrame, LinkedSession, LoadedFrame, SessionView
from workbench.report.shape import COLLAPSE_MIN, Stall, execs, find_stall, heartbeat_runs

# streamed pieces of one answer: a run of them is one row
STREAM_KINDS = frozenset({kinds.TEXT_DELTA, kinds.TOKEN_DELTA, kinds.THINKING_DELTA, kinds.TOOL_CALL_DELTA,
                          kinds.PARTIAL_TOOL_CALL, kinds.SHELL_OUTPUT_DELTA})

ROW_H = 22
TOP = 48
LANE_X = {"client": 150, "server": 560}
EXEC_X0 = 600
EXEC_DX = 14
WIDTH = 860

# one colour per family, shared by the diagram, the timeline and the frame table
FAMILY_COLOURS = {
    kinds.RUN_REQUEST: "#334155", kinds.INTERACTION_UPDATE: "#0891b2", kinds.EXEC_SERVER: "#ca8a04",
    kinds.EXEC_CLIENT: "#a16207", kinds.EXEC_CLIENT_CONTROL: "#d97706", kinds.EXEC_SERVER_CONTROL: "#d97706",
    kinds.KV_SERVER: "#2563eb", kinds.KV_CLIENT: "#1d4ed8", kinds.CHECKPOINT: "#16a34a",
    kinds.INTERACTION_QUERY: "#c026d3", kinds.INTERACTION_RESPONSE: "#a21caf", kinds.END_STREAM: "#15803d",
    kinds.CLIENT_HEARTBEAT: "#9ca3af", kinds.CONVERSATION_ACTION: "#334155", kinds.HTTP_ERROR: "#dc2626",
    kinds.MALFORMED: "#dc2626",
}
HEARTBEAT_COLOUR = "#9ca3af"
OTHER_COLOUR = "#6b7280"


def colour(kind: str) -> str:
    if kinds.is_heartbeat(kind):
        return HEARTBEAT_COLOUR
    if kinds.is_end_stream_error(kind):
        return "#dc2626"
    return FAMILY_COLOURS.get(kinds.family(kind), OTHER_COLOUR)


@dataclass
class Row:
    y: int
    x1: int
    x2: int
    label: str
    seq: int                      # the frame the row links to (the first of a run)
    offset: str                   # +s.sss
    colour: str
    run: bool = False             # a collapsed run
    stall: bool = False
    ref: str = ""                 # "exec 2" on exec rows, "openai_chat c4153c0d" on a linked session's
    seqs: str = ""                # "16–31" for a run
    side: str = ""                # a linked session's id: the row draws its message (its frame is not here)


@dataclass
class ExecBar:
    x: int
    y1: int
    y2: int
    label: str
    closed: bool
    ending: str


@dataclass
class Diagram:
    rows: list[Row] = field(default_factory=list)
    bars: list[ExecBar] = field(default_factory=list)
    height: int = 0
    width: int = WIDTH
    lanes: dict[str, int] = field(default_factory=lambda: dict(LANE_X))
    stall: Stall | None = None
    heartbeat_runs: int = 0
    names: dict[str, str] = field(default_factory=dict)   # a lane's shown name, when not its key
    exec_x0: int = EXEC_X0


def _run_label(frames: Sequence[LoadedFrame] | Sequence[LinkedFrame]) -> str:
    counts = Counter(kinds.member(f.kind) or f.kind for f in frames)
    return "stream: " + ", ".join(f"{n}× {k}" for k, n in counts.most_common())


def sequence_diagram(view: SessionView) -> Diagram:
    frames = view.frames
    t0 = view.t0_us
    runs = [r for r in heartbeat_runs(frames) if r.count >= COLLAPSE_MIN]
    stall = find_stall(frames)
    run_at = {r.first: r for r in runs}
    in_run: set[int] = set()
    for r in runs:
        # client keep-alives inside a heartbeat run are folded into it; other client frames stay
        in_run.update(i for i in range(r.first, r.last + 1)
                      if frames[i].direction == "server" or kinds.is_client_heartbeat(frames[i].kind))
    d = Diagram(stall=stall, heartbeat_runs=len(runs))
    ends = _bridge_lanes(d, view) if view.links else None
    cx, sx = d.lanes["client"], d.lanes["server"]
    # rows before placement: (time, row, height in rows, the seqs it stands for)
    own: list[tuple[int, Row, int, list[int]]] = []
    i = 0
    while i < len(frames):
        f = frames[i]
        x1, x2 = (cx, sx) if f.direction == "client" else (sx, cx)
        off = f"+{(f.ts_us - t0) / 1e6:.3f}s"
        if i in run_at:
            r = run_at[i]
            client_beats = sum(1 for j in range(r.first, r.last + 1) if kinds.is_client_heartbeat(frames[j].kind))
            extra = f" (+{client_beats} client keep-alive{'s' if client_beats != 1 else ''})" if client_beats else ""
            is_stall = stall is not None and stall.run.first == r.first
            own.append((f.ts_us, Row(0, x1, x2, f"heartbeat ×{r.count} over {r.span_s:.3f} s{extra}", f.seq, off,
                                     HEARTBEAT_COLOUR, run=True, stall=is_stall, seqs=f"{r.seqs[0]}–{r.seqs[-1]}"),
                        2 if is_stall else 1, [frames[j].seq for j in range(r.first, r.last + 1)]))
            i += 1
            continue
        if i in in_run:
            i += 1
            continue
        if f.direction == "server" and f.kind in STREAM_KINDS:
            j = i
            while j + 1 < len(frames) and frames[j + 1].direction == "server" and frames[j + 1].kind in STREAM_KINDS:
                j += 1
            if j > i:
                group = frames[i:j + 1]
                own.append((f.ts_us, Row(0, x1, x2, _run_label(group), f.seq, off, colour(f.kind), run=True,
                                         seqs=f"{f.seq}–{frames[j].seq}"), 1, [g.seq for g in group]))
                i = j + 1
                continue
        ref = f"exec {f.ref_id}" if f.ref_id is not None and kinds.in_family(
            f.kind, kinds.EXEC_SERVER, kinds.EXEC_CLIENT, kinds.EXEC_CLIENT_CONTROL, kinds.EXEC_SERVER_CONTROL) else ""
        own.append((f.ts_us, Row(0, x1, x2, f.kind, f.seq, off, colour(f.kind), ref=ref), 1, [f.seq]))
        i += 1
    placed = own
    if ends is not None:
        # the other side's messages by time among this session's (on a tie this session's come first)
        other = sorted((row for lk in view.links for row in _linked_rows(lk, t0, ends)), key=lambda r: r[0])
        placed = list(heapq.merge(own, other, key=lambda r: r[0]))
    y = TOP
    row_of_seq: dict[int, int] = {}
    for _ts, row, height, seqs in placed:
        row.y = y
        d.rows.append(row)
        if not row.side:
            for seq in seqs:
                row_of_seq[seq] = y
        y += ROW_H * height
    end_y = y
    for n, e in enumerate(execs(frames)):
        y1 = row_of_seq.get(e.request_seq, TOP)
        last = e.close_seq or e.throw_seq or e.abort_seq
        y2 = row_of_seq.get(last, end_y) if last is not None else end_y
        d.bars.append(ExecBar(d.exec_x0 + (n % 8) * EXEC_DX, y1, y2, f"exec {e.ref_id} {e.name}", last is not None,
                              e.ending))
    d.height = end_y + ROW_H
    return d


# --- the other side of a bridge ---------------------------------------------------------------

BRIDGE_DX = 300          # room for the extra lane: the diagram widens by this much


def _bridge_lanes(d: Diagram, view: SessionView) -> tuple[int, int]:
    """Add the other side's lane; returns the x of the linked sessions' client and server ends.

    An agent run: its client is the bridge, so the OpenAI client goes left of it and the run's
    lanes move right. An OpenAI request: its server is the bridge, so the agent service goes right.
    """
    d.width = WIDTH + BRIDGE_DX
    if view.facts.get("transport") in JOINED:
        d.lanes["agent service"] = LANE_X["server"] + BRIDGE_DX
        d.names = {"client": "OpenAI client", "server": "bridge"}
        return d.lanes["server"], d.lanes["agent service"]
    d.lanes = {"OpenAI client": LANE_X["client"], "client": LANE_X["client"] + BRIDGE_DX,
               "server": LANE_X["server"] + BRIDGE_DX}
    d.names = {"client": "client (bridge)"}
    d.exec_x0 = EXEC_X0 + BRIDGE_DX
    return d.lanes["OpenAI client"], d.lanes["client"]


def _is_openai_delta(kind: str) -> bool:
    return kinds.family(kind) == kinds.OPENAI and kind.startswith(kinds.OPENAI + ".delta.")


def _linked_rows(lk: LinkedSession, t0: int, ends: tuple[int, int]) -> list[tuple[int, Row, int, list[int]]]:
    """One row per message of a linked session; heartbeats (either way) and deltas of one kind in a
    row collapse into one row with their count and span, as this session's own do."""
    frames = lk.frames
    cx, sx = ends
    side = f"{lk.transport} {lk.session_id[:8]}"
    out: list[tuple[int, Row, int, list[int]]] = []
    i = 0
    while i < len(frames):
        f = frames[i]
        j = i
        if kinds.is_heartbeat(f.kind):
            while j + 1 < len(frames) and kinds.is_heartbeat(frames[j + 1].kind):
                j += 1
        elif f.kind in STREAM_KINDS and f.direction == "server":  # a run's pieces, mixed as its own rows are
            while j + 1 < len(frames) and frames[j + 1].kind in STREAM_KINDS and frames[j + 1].direction == "server":
                j += 1
        elif _is_openai_delta(f.kind):
            while j + 1 < len(frames) and (frames[j + 1].kind, frames[j + 1].direction) == (f.kind, f.direction):
                j += 1
        group = frames[i:j + 1]
        server = any(g.direction == "server" for g in group) if kinds.is_heartbeat(f.kind) else f.direction == "server"
        x1, x2 = (sx, cx) if server else (cx, sx)
        off = f"{(f.ts_us - t0) / 1e6:+.3f}s"
        if j > i:
            span = (group[-1].ts_us - f.ts_us) / 1e6
            if kinds.is_heartbeat(f.kind):
                label, tint = f"heartbeat ×{len(group)} over {span:.3f} s", HEARTBEAT_COLOUR
            elif f.kind in STREAM_KINDS:
                label, tint = f"{_run_label(group)} over {span:.3f} s", colour(f.kind)
            else:
                label, tint = f"{f.kind} ×{len(group)} over {span:.3f} s", colour(f.kind)
            row = Row(0, x1, x2, label, f.seq, off, tint, run=True, ref=side, seqs=f"{f.seq}–{group[-1].seq}",
                      side=lk.session_id)
        else:
            row = Row(0, x1, x2, f.kind, f.seq, off, colour(f.kind), ref=side, side=lk.session_id)
        out.append((f.ts_us, row, 1, [g.seq for g in group]))
        i = j + 1
    return out


# --- timeline --------------------------------------------------------------------------------

TL_WIDTH = 860
TL_LEFT = 60
TL_BAND = 70           # height of one direction's band
TL_BINS = 120
GAP_MIN_S = 0.25       # no progress for at least this long (and 5% of the session): a shaded gap


@dataclass
class Bar:
    x: float
    y: float
    w: float
    h: float
    colour: str
    title: str


@dataclass
class Span:
    x: float
    w: float
    title: str
    code: str = ""
    anchor: str = ""


@dataclass
class Timeline:
    width: int = TL_WIDTH
    height: int = 2 * TL_BAND + 50
    left: int = TL_LEFT
    band: int = TL_BAND
    bars: list[Bar] = field(default_factory=list)
    gaps: list[Span] = field(default_factory=list)
    findings: list[Span] = field(default_factory=list)
    ticks: list[tuple[float, str]] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    duration_s: float = 0.0


def timeline(view: SessionView, anchor: str) -> Timeline:
    frames = view.frames
    tl = Timeline()
    if not frames:
        return tl
    t0, t1 = frames[0].ts_us, frames[-1].ts_us
    span_us = max(t1 - t0, 1)
    tl.duration_s = span_us / 1e6
    plot_w = TL_WIDTH - TL_LEFT - 10
    bins = TL_BINS
    bin_w = plot_w / bins

    def x_of(ts: int) -> float:
        return TL_LEFT + (ts - t0) / span_us * plot_w

    counts: dict[tuple[int, str, str], int] = Counter()
    for f in frames:
        b = min(bins - 1, int((f.ts_us - t0) / span_us * bins))
        counts[(b, f.direction, kinds.family(f.kind) if not kinds.is_heartbeat(f.kind) else "heartbeat")] += 1
    peak = max(sum(n for (b, dr, _), n in counts.items() if b == k and dr == d) for k in range(bins)
               for d in ("client", "server")) or 1
    stacked: dict[tuple[int, str], float] = {}
    families: dict[str, str] = {}
    for (b, direction, fam), n in sorted(counts.items()):
        h = n / peak * (TL_BAND - 8)
        base = stacked.get((b, direction), 0.0)
        stacked[(b, direction)] = base + h
        c = HEARTBEAT_COLOUR if fam == "heartbeat" else colour(fam)
        families[fam] = c
        # client frames grow up from the axis, server frames down from it
        axis = 20 + TL_BAND
        y = axis - base - h if direction == "client" else axis + base
        tl.bars.append(Bar(TL_LEFT + b * bin_w, y, max(bin_w - 0.5, 0.5), h, c,
                           f"{n} {fam} frame{'s' if n != 1 else ''} ({direction}) near +{b * span_us / bins / 1e6:.3f} s"))
    tl.legend = sorted(families.items())
    # gaps: stretches with nothing but heartbeats, long enough to see
    min_gap = max(GAP_MIN_S * 1e6, 0.05 * span_us)
    progress = [f.ts_us for f in frames if not kinds.is_heartbeat(f.kind)]
    ends = progress + [t1]
    for a, b in zip(ends, ends[1:], strict=False):
        if b - a >= min_gap:
            tl.gaps.append(Span(x_of(a), x_of(b) - x_of(a), f"no progress for {(b - a) / 1e6:.3f} s"))
    by_seq = {f.seq: f.ts_us for f in frames}
    for fd in view.findings:
        if fd["is_note"] or fd["first_seq"] is None:
            continue
        a = by_seq.get(int(fd["first_seq"]), t0)
        b = by_seq.get(int(fd["last_seq"] if fd["last_seq"] is not None else fd["first_seq"]), a)
        tl.findings.append(Span(x_of(a), max(x_of(b) - x_of(a), 2.0), f"{fd['code']}: seq {fd['first_seq']}–{fd['last_seq']}",
                                str(fd["code"]), f"{anchor}-frame-{fd['first_seq']}"))
    tl.height = 2 * TL_BAND + 56 + 16 * len(tl.findings)
    for k in range(6):
        tl.ticks.append((TL_LEFT + k * plot_w / 5, f"+{k * span_us / 5 / 1e6:.2f}s"))
    return tl


def is_stall_finding(f: dict[str, Any], stall: Stall | None) -> bool:
    return stall is not None and f["first_seq"] is not None and f["last_seq"] is not None \
        and int(f["last_seq"]) >= stall.run.seqs[0]
