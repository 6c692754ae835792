"""Comparing two recorded sessions: what changed between a broken run and a fixed one.

Each session becomes a list of steps: consecutive frames of one direction and kind are one step
(a run of heartbeats or streamed deltas is one step whose count may differ), client keep-alives
left out (they follow the clock, not the protocol) unless asked for. The steps are aligned on the
session's structure first — turns, execs and tool calls — then within it (``align``: near-linear,
no quadratic matcher over whole sessions). Aligned steps are compared frame by frame on their
decoded trees, ignoring ids, hashes and times (``IGNORED_FIELD``), frames with the same bytes
without decoding them; a streamed step (text, thinking, tool-call arguments) is compared as the
text it streams, shown on a bounded window around its first difference (``streams``). Fields the
schema could not name (an unknown field number, a schemaless value: another build's schema) are
listed as unaligned instead of compared. A step found on both sides but at another place is one
"moved" difference, not a removal and an addition. Execs are paired by their order and name (the
second ``shell`` exec of A with the second of B) and compared on how they were answered and
closed; tool calls first by their arguments, then likewise by order. Timing differences count
when the delay before an aligned step differs by more than a threshold. Then the endings (an
OpenAI session's in its own terms: finish_reason, ``[DONE]``), the findings, and the stall.

The first divergence is the earliest *protocol* difference (``PROTOCOL``): message kinds and
structure, execs, tool calls, endings; a different prompt or answer text alone is content, shown
but not the first divergence.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Hashable, Sequence

from workbench.protocol import kinds
from workbench.redact import is_content_field
from workbench.report.session import LoadedFrame, SessionView
from workbench.sessiondiff import outcome, streams
from workbench.sessiondiff.align import align
from workbench.sessiondiff.model import (
    DEFAULT_TIMING_S,
    Diff,
    Difference,
    FieldChange,
    Item,
    Options,
    add,
    settle_first_divergence,
)
from workbench.sessiondiff.trees import compare_trees, digest, flatten, shown

__all__ = ["DEFAULT_TIMING_S", "Diff", "Difference", "FieldChange", "Item", "Options", "compare_trees",
           "diff_sessions", "flatten", "items"]

MAX_FIELD_CHANGES = 20     # per frame pair: a rewritten message is one difference, not a thousand
MAX_FRAME_ROWS = 20        # per step: frames listed with their changed fields, the rest counted
# Steps that carry the session's structure, anchors of the alignment: their kind and occurrence ...
_TURN_ANCHORS = frozenset({kinds.RUN_REQUEST, kinds.TURN_ENDED, kinds.END_STREAM, kinds.END_STREAM_ERROR,
                           kinds.OPENAI_REQUEST, kinds.OPENAI_FINISH, kinds.OPENAI_DONE})
# ... and, for execs and tool calls, what they run (ids left out), so an exec added before them
# does not shift them
_CALL_ANCHORS = frozenset({kinds.TOOL_CALL_STARTED, kinds.TOOL_CALL_COMPLETED})


@functools.cache
def _is_call(kind: str) -> bool:
    return kind in _CALL_ANCHORS or kinds.in_family(kind, kinds.EXEC_SERVER)


@functools.cache
def _kind_facts(kind: str) -> tuple[bool, bool, bool, bool]:
    """(client keep-alive, server heartbeat, streamed, exec or tool call) of a kind: a session has a
    few dozen kinds and up to millions of frames."""
    return (kinds.is_client_heartbeat(kind), kinds.is_server_heartbeat(kind), streams.is_streamed(kind),
            _is_call(kind))


def items(frames: Sequence[LoadedFrame], opts: Options) -> list[Item]:
    out: list[Item] = []
    held: list[LoadedFrame] = []   # server heartbeats after a streamed step, until it is known whether it goes on
    last: Item | None = None
    last_streamed = False
    for f in frames:
        keep_alive, beat, streamed, call = _kind_facts(f.kind)
        if keep_alive and not opts.client_heartbeats:
            continue
        if last_streamed and beat:
            held.append(f)
            continue
        if held:
            assert last is not None
            if last.kind == f.kind and last.direction == f.direction:
                last.beats.extend(held)   # heartbeats inside a stream: one streamed step, not many
            else:
                out.append(Item(held[0].direction, held[0].kind, held))
                last, last_streamed = out[-1], False
            held = []
        if last is not None and last.kind == f.kind and last.direction == f.direction and not call:
            last.frames.append(f)
        else:
            last = Item(f.direction, f.kind, [f])
            last_streamed = streamed
            out.append(last)
    if held:
        out.append(Item(held[0].direction, held[0].kind, held))
    seen: dict[Hashable, int] = {}
    for it in out:
        key: Hashable
        if it.kind in _TURN_ANCHORS:
            key = it.token
        elif _is_call(it.kind):
            key = (it.token, digest(it.frames[0], opts))
        else:
            continue
        n = seen.get(key, 0)
        seen[key] = n + 1
        it.anchor = (key, n)
    return out


_LEAF_NAME = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\W*$")


def _is_content_change(c: FieldChange) -> bool:
    """A changed text field (a prompt, an answer, a result): content, not protocol."""
    m = _LEAF_NAME.search(re.sub(r"\[\d+\]|\{json\}", "", c["path"]))
    name = m.group(1) if m else ""
    texts = all(v is None or not _looks_scalar(v) for v in (c["a"], c["b"]))
    return texts and is_content_field(name)


def _looks_scalar(shown: str) -> bool:
    """A shown value that is a number, a boolean or null (not text)."""
    return shown in ("true", "false", "null") or re.fullmatch(r"-?\d+(\.\d+)?", shown) is not None


def diff_sessions(a: SessionView, b: SessionView, opts: Options | None = None) -> Diff:
    opts = opts or Options()
    d = Diff(a, b)
    ia, ib = items(a.frames, opts), items(b.frames, opts)
    pos_a = {f.seq: i for i, f in enumerate(a.frames)}
    pos_b = {f.seq: i for i, f in enumerate(b.frames)}
    steps = {True: ia, False: ib}          # by "is side A", as align asks
    keys = {True: _part_keys(ia, opts, d), False: _part_keys(ib, opts, d)}

    def content(k: int, side_a: bool) -> Hashable | None:
        it = steps[side_a][k]
        return None if kinds.is_heartbeat(it.kind) else step_key(it, opts, d)

    al = align(ia, ib, part_starts(ia), part_starts(ib), lambda s, e, side_a: keys[side_a][0](s, e),
               lambda s, e, side_a: keys[side_a][1](s, e), content)
    d.work += al.work
    d.windowed_gaps = al.windowed_gaps
    moved = {ga[0]: (ga, gb) for ga, gb in al.moved}
    in_moved = {("a", i) for ga, _ in al.moved for i in ga} | {("b", j) for _, gb in al.moved for j in gb}
    last_a = -1.0                        # the A seq reached along the alignment (B-only steps sit after it)
    for i, j in al.ops:
        if i is not None and j is not None:
            d.aligned_items += 1
            last_a = ia[i].frames[0].seq
            _compare_items(d, ia[i], ib[j], opts, pos_a, pos_b)
        elif i is not None:
            last_a = ia[i].frames[0].seq
            if i in moved:
                _add_moved(d, ia, ib, moved[i], last_a)
            elif ("a", i) not in in_moved:
                x = ia[i]
                add(d, "only_in_a", f"only in A: {x.label()} ({x.where(a.t0_us)})", x=x, at=last_a)
        elif j is not None and ("b", j) not in in_moved:
            y = ib[j]
            add(d, "only_in_b", f"only in B: {y.label()} ({y.where(b.t0_us)})", y=y, at=last_a + 0.5)
    outcome.compare_execs(d)
    outcome.compare_tools(d, opts)
    outcome.compare_ending(d)
    outcome.compare_findings(d)
    outcome.compare_stalls(d)
    settle_first_divergence(d)
    return d


# a part of a session ends after these (an exec closed, a model step or a turn ended) ...
_PART_ENDS = frozenset({kinds.EXEC_STREAM_CLOSE, kinds.EXEC_THROW, kinds.EXEC_ABORT, kinds.STEP_COMPLETED,
                        kinds.TURN_ENDED, kinds.OPENAI_DONE})
# ... and begins with these (a turn)
_PART_STARTS = frozenset({kinds.RUN_REQUEST, kinds.OPENAI_REQUEST})


def part_starts(steps: list[Item]) -> list[int]:
    """Where each part of a session begins (``align``: parts are paired whole first)."""
    return [k for k, it in enumerate(steps)
            if k == 0 or it.kind in _PART_STARTS or steps[k - 1].kind in _PART_ENDS]


def step_key(it: Item, opts: Options, d: Diff) -> Hashable:
    """A step's content, ids left out (computed once): streamed steps by the text they add up to
    (their cutting differs between runs), heartbeats by their place only (their number follows the clock)."""
    if it.content is None:
        d.work += len(it.frames)
        if kinds.is_heartbeat(it.kind):
            it.content = it.token
        elif streams.is_streamed(it.kind):
            it.content = (it.token, hash(_stream_text(it, opts, d)))
        else:
            it.content = (it.token, len(it.frames), tuple(digest(f, opts) for f in it.frames))
    return it.content


def _part_keys(steps: list[Item], opts: Options, d: Diff) -> tuple[Callable[[int, int], Hashable],
                                                                  Callable[[int, int], Hashable]]:
    """The two keys of a part (first step, end): its bytes, then its content with ids left out.
    Heartbeats count by their place only (their number follows the clock), streamed steps by
    the text they add up to (their cutting differs between runs)."""

    def by_bytes(start: int, end: int) -> Hashable:
        key: list[Hashable] = []
        for it in steps[start:end]:
            d.work += len(it.frames)
            if kinds.is_heartbeat(it.kind):
                key.append(it.token)
            else:
                key.append((it.token, len(it.frames), hash(tuple(f.payload for f in it.frames))))
        return hash(tuple(key))

    def by_content(start: int, end: int) -> Hashable:
        return hash(tuple(step_key(it, opts, d) if not kinds.is_heartbeat(it.kind) else it.token
                          for it in steps[start:end]))

    return by_bytes, by_content


def _add_moved(d: Diff, ia: list[Item], ib: list[Item], group: tuple[list[int], list[int]], at: float) -> None:
    ga, gb = group
    xa, xb = ia[ga[0]], ib[gb[0]]
    first = Item(xa.direction, xa.kind, [*xa.frames, *ia[ga[-1]].frames])
    last = Item(xb.direction, xb.kind, [*xb.frames, *ib[gb[-1]].frames])
    labels = [ia[i].label() for i in ga if not kinds.is_heartbeat(ia[i].kind)] or [ia[i].label() for i in ga]
    shown = ", ".join(labels[:5]) + (f", … ({len(labels)} steps)" if len(labels) > 5 else "")
    add(d, "moved", f"moved: {shown} (A {first.where(d.a.t0_us)} → B {last.where(d.b.t0_us)})",
        x=first, y=last, at=at, steps=labels)


def _gap_us(frames: Sequence[LoadedFrame], f: LoadedFrame, index: dict[int, int]) -> int:
    i = index[f.seq]
    return f.ts_us - frames[i - 1].ts_us if i > 0 else 0


def _compare_items(d: Diff, x: Item, y: Item, opts: Options, pos_a: dict[int, int], pos_b: dict[int, int]) -> None:
    at = float(x.frames[0].seq)
    if len(x.frames) != len(y.frames):
        # a different number of heartbeats or deltas follows the clock and the chunking: not protocol
        noise = kinds.is_heartbeat(x.kind) or streams.is_streamed(x.kind)
        add(d, "count", f"{x.label().split(' ×')[0]}: {len(x.frames)} in A ({x.where(d.a.t0_us)}), "
            f"{len(y.frames)} in B ({y.where(d.b.t0_us)})", x=x, y=y, at=at, protocol=not noise)
    if not kinds.is_heartbeat(x.kind):   # empty messages: only their number and time say anything
        if streams.is_streamed(x.kind):
            _compare_stream(d, x, y, opts)
        else:
            _compare_frames(d, x, y, opts)
    ga = _gap_us(d.a.frames, x.frames[0], pos_a)
    gb = _gap_us(d.b.frames, y.frames[0], pos_b)
    if abs(ga - gb) / 1e6 > opts.timing_threshold_s:
        add(d, "timing", f"{x.kind}: came {ga / 1e6:.3f} s after the previous frame in A (seq {x.frames[0].seq}), "
            f"{gb / 1e6:.3f} s in B (seq {y.frames[0].seq})", x=x, y=y, at=at, protocol=False,
            a_gap_s=ga / 1e6, b_gap_s=gb / 1e6)


def _same_bytes(fa: LoadedFrame, fb: LoadedFrame) -> bool:
    """The same bytes decoded the same way: the same tree, not decoded (what makes a long session
    against itself, or against a replay of it, cost one bytes comparison a frame)."""
    return bool(fa.payload) and fa.payload == fb.payload and (fa.kind, fa.msg_type, fa.flags) == (
        fb.kind, fb.msg_type, fb.flags)


def _compare_frames(d: Diff, x: Item, y: Item, opts: Options) -> None:
    rows: list[Difference] = []
    for fa, fb in zip(x.frames, y.frames, strict=False):
        d.work += 1
        if _same_bytes(fa, fb):
            continue
        changed, unaligned = compare_trees(fa, fb, opts)
        d.unaligned.extend(unaligned)
        if not changed:
            continue
        if len(rows) == MAX_FRAME_ROWS:
            rows[-1]["more_frames"] = rows[-1].get("more_frames", 0) + 1
            continue
        shown = changed[:MAX_FIELD_CHANGES]
        more = f" (+{len(changed) - len(shown)} more)" if len(changed) > len(shown) else ""
        lines = "; ".join(f"{c['path']}: {c['a']} → {c['b']}" for c in shown)
        content = all(_is_content_change(c) for c in changed) and not _is_call(fa.kind)
        rows.append(add(d, "changed_fields", f"{fa.kind} A seq {fa.seq} / B seq {fb.seq}: {lines}{more}",
                        x=Item(x.direction, x.kind, [fa]), y=Item(y.direction, y.kind, [fb]), at=float(fa.seq),
                        protocol=not content, fields=changed))
    if rows and rows[-1].get("more_frames"):
        rows[-1]["text"] += f" (and {rows[-1]['more_frames']} more frames of this step differ)"


def _stream_text(it: Item, opts: Options, d: Diff) -> str:
    d.work += len(it.frames)
    return "".join(v if isinstance(v, str) else json.dumps(v, default=str)
                   for f in it.frames for _p, v, _o in flatten(f.tree, opts))


def _compare_stream(d: Diff, x: Item, y: Item, opts: Options) -> None:
    d.work += min(len(x.frames), len(y.frames))
    if len(x.frames) == len(y.frames) and all(_same_bytes(fa, fb) for fa, fb in zip(x.frames, y.frames, strict=True)):
        return
    ta, tb = _stream_text(x, opts, d), _stream_text(y, opts, d)
    if ta == tb:
        return
    at = streams.first_difference(ta, tb)
    d.work += at // 4096 + 1
    change: FieldChange = {"a_seq": x.frames[0].seq, "b_seq": y.frames[0].seq, "kind": x.kind,
                           "path": f"{x.kind} (streamed text)", "a": shown(streams.window(ta, at)),
                           "b": shown(streams.window(tb, at))}
    add(d, "changed_fields", f"{x.kind} ×{len(x.frames)} A seq {x.frames[0].seq} / ×{len(y.frames)} B seq "
        f"{y.frames[0].seq}: the streamed text differs from character {at}: {change['a']} → {change['b']}",
        x=x, y=y, at=float(x.frames[0].seq), protocol=x.kind in (kinds.PARTIAL_TOOL_CALL, kinds.OPENAI_TOOL_CALLS),
        fields=[change], offset=at, a_chars=len(ta), b_chars=len(tb))
