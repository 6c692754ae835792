"""Layout of the report's sequence diagram, as plain data, from a session read one frame at a time.

The template (``templates/sequence.svg.j2``) draws what this module places; nothing here writes
markup. Coordinates are in SVG user units. The timeline is placed by ``timeline.py``.

One row per message, an arrow from the sender's lane to the receiver's, named by kind. Runs of
heartbeats become one row (count and span; client keep-alives inside a run are counted with it),
and so do runs of streamed pieces (text, tokens, thinking, tool-call argument pieces, OpenAI deltas
of one kind). Each exec gets a bar on the right from its request to its ``stream_close`` (or to the
end, dashed, when none came); the stall (``shape.StallWatch``) is a red band over its row.

Bounded whatever the session: the frames are fed one at a time (``DiagramBuilder.add``), a run
is one row however long, and at most ``MAX_ROWS`` rows are kept — the first half and the last
half; the rows between are one "left out" row that says how many messages it stands for, their
seqs and times, and how to list them. A run row's label is cut to fit between its lanes (the
whole text is in its tooltip), so no label runs over an arrowhead or into another lane.

The other side of a bridge: when the session is linked (``SessionView.links``), an agent run gains
an "OpenAI client" lane left of its client (the bridge), an OpenAI request an "agent service" lane
right of its server (the bridge); the linked sessions' messages are placed among the session's own
by time, collapsed the same way, and drawn without a link (their frames are in their own reports).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from workbench.analysis.bridge_join import JOINED
from workbench.protocol import kinds
from workbench.report.session import LinkedFrame, LinkedSession
from workbench.report.shape import COLLAPSE_MIN, Exec, Stall

# streamed pieces of one answer: a run of them is one row
STREAM_KINDS = frozenset({kinds.TEXT_DELTA, kinds.TOKEN_DELTA, kinds.THINKING_DELTA, kinds.TOOL_CALL_DELTA,
                          kinds.PARTIAL_TOOL_CALL, kinds.SHELL_OUTPUT_DELTA})

MAX_ROWS = 400          # rows drawn per diagram: the first 200 and the last 200, the rest one "left out" row
PENDING_MAX = 200       # client rows held back while a heartbeat run is open (then the run is cut)
ROW_H = 22
TOP = 48
LANE_X = {"client": 150, "server": 560}
EXEC_X0 = 600
EXEC_DX = 14
WIDTH = 860
CHAR_W = 7.0            # upper bound of one label character's width at the label's 11.5 px (Chromium: 6.2–6.8)
BOLD_W = 7.0           # the same for the stall band's 12 px bold (measured ≈ 6.3 in Chromium)
HEAD_ROOM = 14          # room kept free at each end of an arrow for its head and the lane

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


@lru_cache(maxsize=4096)
def colour(kind: str) -> str:
    if kinds.is_heartbeat(kind):
        return HEARTBEAT_COLOUR
    if kinds.is_end_stream_error(kind):
        return "#dc2626"
    return FAMILY_COLOURS.get(kinds.family(kind), OTHER_COLOUR)


def fit(text: str, room: float) -> str:
    """``text`` cut at a word boundary, with an ellipsis, to fit ``room`` units at the label's size."""
    chars = max(4, int(room / CHAR_W))
    if len(text) <= chars:
        return text
    cut = text[:chars - 1]
    space = cut.rfind(" ")
    if space >= chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,·:") + "…"


@dataclass
class Row:
    y: int
    x1: int
    x2: int
    label: str
    seq: int                      # the frame the row links to (the first of a run)
    offset: str                   # +s.sss (set when the row is placed)
    colour: str
    run: bool = False             # a collapsed run
    stall: bool = False
    ref: str = ""                 # "exec 2" on exec rows, "openai_chat c4153c0d" on a linked session's
    seqs: str = ""                # "16–31" for a run
    side: str = ""                # a linked session's id: the row draws its message (its frame is not here)
    ts_us: int = 0
    count: int = 1                # messages the row stands for
    last_seq: int = -1
    beat: bool = False            # a run of heartbeats
    gap: bool = False             # the "left out" row
    shown: str = ""               # the label as drawn (cut to fit between the lanes)
    height: int = 1               # in rows

    @property
    def title(self) -> str:
        where = f"{self.ref} " if self.side else ""
        return f"{where}seq {self.seqs or self.seq} {self.offset}: {self.label}" + \
            (f" · {self.ref}" if self.ref and not self.side else "")


@dataclass
class ExecBar:
    x: int
    y1: int
    y2: int
    label: str
    closed: bool
    ending: str


@dataclass
class LeftOut:
    """What the "left out" row stands for."""

    rows: int = 0
    messages: int = 0
    first_seq: int | None = None
    last_seq: int = -1
    first_ts: int = 0
    last_ts: int = 0

    def take(self, row: Row) -> None:
        if row.side:  # a linked session's message: counted, its seqs are another session's
            self.rows += 1
            self.messages += row.count
            return
        if self.first_seq is None or row.seq < self.first_seq:
            self.first_seq, self.first_ts = row.seq, row.ts_us
        if row.last_seq > self.last_seq:
            self.last_seq, self.last_ts = row.last_seq, row.ts_us
        self.rows += 1
        self.messages += row.count


@dataclass
class Diagram:
    rows: list[Row] = field(default_factory=list)
    bars: list[ExecBar] = field(default_factory=list)
    height: int = 0
    width: int = WIDTH
    lanes: dict[str, int] = field(default_factory=lambda: dict(LANE_X))
    stall: Stall | None = None
    heartbeat_runs: int = 0          # runs of heartbeats drawn as one row each (own and linked sessions')
    heartbeat_runs_left_out: int = 0
    names: dict[str, str] = field(default_factory=dict)   # a lane's shown name, when not its key
    exec_x0: int = EXEC_X0
    left_out: LeftOut | None = None
    stall_text: str = ""             # the stall band's words, cut to fit its band
    max_rows: int = MAX_ROWS
    bars_left_out: int = 0


def _run_label(counts: Counter[str], span: float) -> str:
    """``stream ×N over S s: n1 kind1, n2 kind2``: count and span first, so a label cut to fit keeps them."""
    total = sum(counts.values())
    return f"stream ×{total} over {span:.3f} s: " + ", ".join(f"{n} {k}" for k, n in counts.most_common())


def _is_openai_delta(kind: str) -> bool:
    return kind.startswith(kinds.OPENAI + ".delta.")


class _Group:
    """A run being collected: heartbeats, or streamed pieces (fed frames or items of several)."""

    def __init__(self, f: LinkedFrame, beat: bool, linked: bool) -> None:
        self.linked = linked
        self.first = f
        self.last_seq, self.last_ts = f.end_seq, f.end_ts_us
        self.beat = beat
        self.count = f.count           # heartbeats (a beat run) or pieces (a stream run)
        self.keepalives = 0            # client keep-alives folded in
        self.server = f.direction == "server"
        self.kinds: Counter[str] = Counter({kinds.member(f.kind) or f.kind: f.count})
        self.pending: list[Row] = []   # client rows that came while a heartbeat run was open

    def joins(self, f: LinkedFrame) -> bool:
        if self.beat:
            return kinds.is_heartbeat(f.kind) if self.linked else kinds.is_server_heartbeat(f.kind)
        first = self.first.kind
        if f.direction != self.first.direction:
            return False
        if first in STREAM_KINDS:
            return f.kind in STREAM_KINDS
        return f.kind == first  # OpenAI deltas: one kind a run

    def add(self, f: LinkedFrame) -> None:
        self.last_seq, self.last_ts = f.end_seq, f.end_ts_us
        self.count += f.count
        self.server = self.server or f.direction == "server"
        self.kinds[kinds.member(f.kind) or f.kind] += f.count


class RowKeeper:
    """The first ``limit // 2`` rows and the last ``limit // 2``; those between are counted only."""

    def __init__(self, limit: int) -> None:
        self.head: list[Row] = []
        self.half = max(1, limit // 2)
        self.tail: deque[Row] = deque()
        self.left_out = LeftOut()
        self.beats_left_out = 0
        self.beats = 0

    def add(self, row: Row) -> None:
        if row.beat:
            self.beats += 1
        if len(self.head) < self.half:
            self.head.append(row)
            return
        self.tail.append(row)
        if len(self.tail) > self.half:
            gone = self.tail.popleft()
            self.left_out.take(gone)
            if gone.beat:
                self.beats_left_out += 1

    def rows(self) -> list[Row]:
        return self.head + list(self.tail)


class RowMaker:
    """Turns one session's frames, one at a time, into rows (runs collapsed) kept by a ``RowKeeper``."""

    def __init__(self, keeper: RowKeeper, t0: int, ends: tuple[int, int], side: str = "", ref: str = "",
                 linked: bool = False) -> None:
        self.keeper = keeper
        self.t0 = t0
        self.cx, self.sx = ends
        self.side = side               # a linked session's id ("" for the reported session)
        self.ref = ref
        self.linked = linked
        self.cur: _Group | None = None

    def _ends(self, server: bool) -> tuple[int, int]:
        return (self.sx, self.cx) if server else (self.cx, self.sx)

    def _single(self, f: LinkedFrame) -> Row:
        x1, x2 = self._ends(f.direction == "server")
        ref = self.ref
        if not self.side and f.ref_id is not None and kinds.in_family(
                f.kind, kinds.EXEC_SERVER, kinds.EXEC_CLIENT, kinds.EXEC_CLIENT_CONTROL, kinds.EXEC_SERVER_CONTROL):
            ref = f"exec {f.ref_id}"
        return Row(0, x1, x2, f.kind, f.seq, "", colour(f.kind), ref=ref, side=self.side, ts_us=f.ts_us,
                   last_seq=f.seq)

    def add(self, f: LinkedFrame) -> None:
        cur = self.cur
        if cur is not None and cur.joins(f):
            cur.add(f)
            return
        if kinds.is_client_heartbeat(f.kind) and cur is not None:
            cur.keepalives += f.count  # a client keep-alive inside a run is counted with it
            return
        beat = kinds.is_server_heartbeat(f.kind) or (self.linked and kinds.is_heartbeat(f.kind))
        if beat or (f.direction == "server" and (f.kind in STREAM_KINDS or _is_openai_delta(f.kind))):
            self.close()
            self.cur = _Group(f, beat, self.linked)
            return
        if cur is not None and cur.beat and f.direction == "client":
            cur.pending.append(self._single(f))   # the run goes on: its row comes first
            if len(cur.pending) >= PENDING_MAX:
                self.close()
            return
        self.close()
        self.keeper.add(self._single(f))

    def close(self) -> None:
        g = self.cur
        if g is None:
            return
        self.cur = None
        f = g.first
        if g.count < COLLAPSE_MIN and not (g.keepalives and g.beat):
            self.keeper.add(self._single(f))
        else:
            span = (g.last_ts - f.ts_us) / 1e6
            if g.beat:
                extra = f" (+{g.keepalives} client keep-alive{'s' if g.keepalives != 1 else ''})" \
                    if g.keepalives and not self.linked else ""
                n = g.count + (g.keepalives if self.linked else 0)
                label = f"heartbeat ×{n} over {span:.3f} s{extra}" if n >= COLLAPSE_MIN else f"{f.kind}{extra}"
                tint = HEARTBEAT_COLOUR
            elif f.kind in STREAM_KINDS:
                label, tint = _run_label(g.kinds, span), colour(f.kind)
            else:
                label, tint = f"{f.kind} ×{g.count} over {span:.3f} s", colour(f.kind)
            x1, x2 = self._ends(g.server)
            self.keeper.add(Row(0, x1, x2, label, f.seq, "", tint, run=True, ref=self.ref,
                                seqs=f"{f.seq}–{g.last_seq}", side=self.side, ts_us=f.ts_us,
                                count=g.count + g.keepalives, last_seq=g.last_seq,
                                beat=g.beat and label.startswith("heartbeat ×")))
        for row in g.pending:
            self.keeper.add(row)


BRIDGE_DX = 300          # room for the extra lane: the diagram widens by this much


def _bridge_lanes(d: Diagram, transport: str | None) -> tuple[int, int]:
    """Add the other side's lane; returns the x of the linked sessions' client and server ends.

    An agent run: its client is the bridge, so the OpenAI client goes left of it and the run's
    lanes move right. An OpenAI request: its server is the bridge, so the agent service goes right.
    """
    d.width = WIDTH + BRIDGE_DX
    if transport in JOINED:
        d.lanes["agent service"] = LANE_X["server"] + BRIDGE_DX
        d.names = {"client": "OpenAI client", "server": "bridge"}
        return d.lanes["server"], d.lanes["agent service"]
    d.lanes = {"OpenAI client": LANE_X["client"], "client": LANE_X["client"] + BRIDGE_DX,
               "server": LANE_X["server"] + BRIDGE_DX}
    d.names = {"client": "client (bridge)"}
    d.exec_x0 = EXEC_X0 + BRIDGE_DX
    return d.lanes["OpenAI client"], d.lanes["client"]


class DiagramBuilder:
    """The sequence diagram of one session, fed its frames one at a time (see the module doc)."""

    def __init__(self, t0: int, transport: str | None, links: Sequence[LinkedSession] = (),
                 max_rows: int = MAX_ROWS) -> None:
        self.d = Diagram(max_rows=max_rows)
        self.links = list(links)
        self.t0 = t0
        self.linked_ends = _bridge_lanes(self.d, transport) if self.links else None
        self.keeper = RowKeeper(max_rows)
        self.own = RowMaker(self.keeper, t0, (self.d.lanes["client"], self.d.lanes["server"]))

    def add(self, f: LinkedFrame) -> None:
        self.own.add(f)

    def finish(self, stall: Stall | None, execs: Iterable[Exec]) -> Diagram:
        self.own.close()
        d = self.d
        d.stall = stall
        own = self.keeper
        keepers = [own]
        if self.linked_ends is not None:
            for lk in self.links:
                k = RowKeeper(self.d.max_rows)
                maker = RowMaker(k, self.t0, self.linked_ends, side=lk.session_id,
                                 ref=f"{lk.transport} {lk.session_id[:8]}", linked=True)
                for f in lk.frames:
                    maker.add(f)
                maker.close()
                keepers.append(k)
        # the other side's messages by time among this session's (on a tie this session's come first);
        # a keeper's left-out rows sit where they were, as one row
        streams: list[list[tuple[int, int, Row]]] = []
        left = LeftOut()
        for n, k in enumerate(keepers):
            stream = [(r.ts_us, n, r) for r in k.head]
            if k.left_out.rows:
                gap_ts = k.tail[0].ts_us if k.tail else (k.head[-1].ts_us if k.head else 0)
                stream.append((gap_ts, n, Row(0, 0, 0, "", -1, "", OTHER_COLOUR, gap=True, ts_us=gap_ts)))
                for attr in ("rows", "messages"):
                    setattr(left, attr, getattr(left, attr) + getattr(k.left_out, attr))
                if n == 0:
                    left.first_seq, left.last_seq = k.left_out.first_seq, k.left_out.last_seq
                    left.first_ts, left.last_ts = k.left_out.first_ts, k.left_out.last_ts
            stream += [(r.ts_us, n, r) for r in k.tail]
            streams.append(stream)
        merged = [r for _ts, _n, r in heapq.merge(*streams, key=lambda t: (t[0], t[1]))]
        # one "left out" row however many keepers left rows out, and the merged rows bounded again
        rows = [r for r in merged if not r.gap]
        at = next((i for i, r in enumerate(merged) if r.gap), None)
        gap_at = None if at is None else sum(1 for r in merged[:at] if not r.gap)
        beats_cut = 0
        excess = len(rows) - d.max_rows
        if excess > 0:
            centre = gap_at if gap_at is not None else len(rows) // 2
            lo = min(max(0, centre - excess // 2), len(rows) - excess)
            for r in rows[lo:lo + excess]:
                left.take(r)
                beats_cut += r.beat
            rows = rows[:lo] + rows[lo + excess:]
            gap_at = lo
        placed = rows
        if gap_at is not None:
            placed = rows[:gap_at] + [Row(0, 0, 0, "", -1, "", OTHER_COLOUR, gap=True)] + rows[gap_at:]
            d.left_out = left
        d.heartbeat_runs = sum(k.beats for k in keepers)
        d.heartbeat_runs_left_out = sum(k.beats_left_out for k in keepers) + beats_cut
        self._place(d, placed, stall, execs)
        return d

    def _place(self, d: Diagram, placed: list[Row], stall: Stall | None, execs: Iterable[Exec]) -> None:
        y = TOP
        row_of_seq: dict[int, int] = {}
        gap_y: int | None = None
        for row in placed:
            row.y = y
            row.offset = f"{(row.ts_us - self.t0) / 1e6:+.3f}s"  # formatted for the rows drawn only
            if row.gap:
                gap_y = y
                row.height = 2
            elif stall is not None and not row.side and row.beat and row.seq == stall.run.first_seq:
                row.stall = True
                row.height = 2
            if not row.gap:
                room = abs(row.x2 - row.x1) - 2 * HEAD_ROOM
                shown = row.label + (f" · {row.ref}" if row.ref and not row.side else "")
                row.shown = fit(shown, room)
                if not row.side:
                    row_of_seq[row.seq] = y
            d.rows.append(row)
            y += ROW_H * row.height
        end_y = y
        if stall is not None:
            band = d.lanes["server"] - d.lanes["client"] + 80 - 16
            text = f"stall: no progress after seq {stall.after_seq} ({stall.after_kind})"
            if len(text) * BOLD_W > band:
                text = f"stall: no progress after seq {stall.after_seq}"
            d.stall_text = fit(text, band * CHAR_W / BOLD_W)
        shown_bars = 0
        for e in execs:
            last = e.close_seq or e.throw_seq or e.abort_seq
            y1 = row_of_seq.get(e.request_seq)
            y2 = row_of_seq.get(last) if last is not None else end_y
            if y1 is None and y2 is None:
                d.bars_left_out += 1
                continue
            if y1 is None:
                y1 = gap_y if gap_y is not None else TOP
            if y2 is None:
                y2 = gap_y if gap_y is not None and gap_y > y1 else end_y
            d.bars.append(ExecBar(d.exec_x0 + (shown_bars % 8) * EXEC_DX, y1, y2, f"exec {e.ref_id} {e.name}",
                                  last is not None, e.ending))
            shown_bars += 1
        d.height = end_y + ROW_H


def is_stall_finding(f: dict[str, Any], stall: Stall | None) -> bool:
    return stall is not None and f["first_seq"] is not None and f["last_seq"] is not None \
        and int(f["last_seq"]) >= stall.run.first_seq
