"""Comparing two recorded sessions: what changed between a broken run and a fixed one.

The sessions are aligned by their message kind sequence (``difflib.SequenceMatcher`` over
``(direction, kind)`` tokens). Consecutive frames of one kind form one item first (a run of
heartbeats or text deltas is one step whose count may differ), and client keep-alives are left
out (they follow the clock, not the protocol) unless asked for. Aligned items are compared frame
by frame on their decoded trees, ignoring ids, hashes and times (``IGNORED_FIELD``); fields the
schema could not name (an unknown field number, a schemaless value: another build's schema) are
listed as unaligned instead of compared. Execs are paired by their order and name (the second
``shell`` exec of A with the second of B) and compared on how they were answered and closed;
tool calls likewise on their arguments. Timing differences count when the delay before an
aligned item differs by more than a threshold. Then the endings, the findings, and the stall.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Required, TypedDict, cast

from workbench.nesting import load_json
from workbench.protocol import kinds
from workbench.report.session import LoadedFrame, SessionView
from workbench.report.shape import Exec, StallDoc, execs, find_stall

# Names of fields that differ between any two runs: ids, content hashes, wall-clock times.
IGNORED_FIELD = re.compile(
    r"(^|_)(id|ids|uuid|hash|sha256|checksum|digest|nonce|timestamp|at|ms|time|seed)$", re.IGNORECASE)
# the same in camelCase (JSON inside fields: ``toolCallId``, ``createdAt``)
IGNORED_CAMEL = re.compile(r"[a-z0-9](Id|Ids|Uuid|Hash|Sha256|Checksum|Digest|Nonce|Timestamp|At|Ms|Time)$")
# Values that are ids or content hashes whatever their field is called: a UUID, a SHA-1/SHA-256 in hex.
IGNORED_VALUE = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{40}|[0-9a-f]{64})$",
                           re.IGNORECASE)
DEFAULT_TIMING_S = 0.5
MAX_FIELD_CHANGES = 20     # per frame pair: a rewritten message is one difference, not a thousand
_VALUE_CHARS = 120


@dataclass
class Item:
    """Consecutive frames of one direction and kind: one step of the conversation."""

    direction: str
    kind: str
    frames: list[LoadedFrame]

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
        return f"{arrow} {self.kind}" + (f" ×{n}" if n > 1 else "")


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
    frames of the item on each side when it has them; then what its type adds (see ``_add`` calls;
    a stall adds the keys of ``StallDoc``)."""

    type: Required[str]   # only_in_a, only_in_b, count, changed_fields, timing, exec, tool_call, ...
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

    @property
    def same(self) -> bool:
        return not self.differences


def items(frames: Sequence[LoadedFrame], opts: Options) -> list[Item]:
    out: list[Item] = []
    for f in frames:
        if not opts.client_heartbeats and kinds.is_client_heartbeat(f.kind):
            continue
        if out and out[-1].token == (f.direction, f.kind):
            out[-1].frames.append(f)
        else:
            out.append(Item(f.direction, f.kind, [f]))
    return out


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    # text from the wire never reaches a terminal raw: control characters as escapes
    text = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}"
                   for ch in text)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _embedded_json(value: str) -> Any:
    """A string holding a JSON object or array (a prompt blob, tool arguments), parsed; else None."""
    text = value.strip()
    if not (text[:1] in "{[" and text[-1:] in "}]"):
        return None
    try:
        parsed = load_json(text)
    except ValueError:  # not JSON, or nested past the limit every reader shares
        return None
    return parsed if isinstance(parsed, dict | list) else None


def _unalignable(part: str) -> bool:
    """A path part the schema did not name: a field number, or a marker of a schemaless value."""
    return part.isdigit() or (part.startswith("$") and part not in ("$text", "$value"))


def flatten(tree: Any, opts: Options, prefix: str = "") -> Iterator[tuple[str, Any, bool]]:
    """(path, leaf value, unalignable) for every leaf of a decoded tree, ignored fields left out."""
    if isinstance(tree, dict):
        if not tree and prefix:
            yield prefix, {}, False
        for k, v in tree.items():
            key = str(k)
            if not opts.compare_ids and (IGNORED_FIELD.search(key) or IGNORED_CAMEL.search(key)):
                continue
            path = f"{prefix}.{key}" if prefix else key
            for p, leaf, odd in flatten(v, opts, path):
                yield p, leaf, odd or _unalignable(key)
    elif isinstance(tree, list):
        if not tree:
            yield prefix, [], False
        for i, v in enumerate(tree):
            yield from flatten(v, opts, f"{prefix}[{i}]")
    elif isinstance(tree, str) and not opts.compare_ids and IGNORED_VALUE.match(tree):
        return
    elif isinstance(tree, str) and (inner := _embedded_json(tree)) is not None:
        # JSON inside a field (KV prompt blobs, arguments): compared key by key, its ids ignored too
        yield from flatten(inner, opts, f"{prefix}{{json}}")
    else:
        yield prefix, tree, False


def compare_trees(fa: LoadedFrame, fb: LoadedFrame, opts: Options) -> tuple[list[FieldChange], list[FieldChange]]:
    """(changed fields, unaligned fields) between two frames of the same kind."""
    la = {p: (v, odd) for p, v, odd in flatten(fa.tree, opts)}
    lb = {p: (v, odd) for p, v, odd in flatten(fb.tree, opts)}
    mismatched = set(_mismatch_paths(fa)) | set(_mismatch_paths(fb))
    changed: list[FieldChange] = []
    unaligned: list[FieldChange] = []
    for path in sorted(la.keys() | lb.keys()):
        va, oa = la.get(path, (None, False))
        vb, ob = lb.get(path, (None, False))
        if path in la and path in lb and va == vb:
            continue
        row: FieldChange = {"a_seq": fa.seq, "b_seq": fb.seq, "kind": fa.kind, "path": path,
               "a": _short(va) if path in la else None, "b": _short(vb) if path in lb else None}
        if oa or ob or any(path.startswith(m) for m in mismatched):
            unaligned.append(row)
        else:
            changed.append(row)
    return changed, unaligned


def _mismatch_paths(f: LoadedFrame) -> list[str]:
    found = (f.meta or {}).get("schema_mismatch") or []
    return [str(m.get("path")) for m in found if isinstance(m, dict) and m.get("path")]


def _gap_us(frames: Sequence[LoadedFrame], f: LoadedFrame, index: dict[int, int]) -> int:
    i = index[f.seq]
    return f.ts_us - frames[i - 1].ts_us if i > 0 else 0


def diff_sessions(a: SessionView, b: SessionView, opts: Options | None = None) -> Diff:
    opts = opts or Options()
    d = Diff(a, b)
    ia, ib = items(a.frames, opts), items(b.frames, opts)
    pos_a = {f.seq: i for i, f in enumerate(a.frames)}
    pos_b = {f.seq: i for i, f in enumerate(b.frames)}
    sm = difflib.SequenceMatcher(None, [x.token for x in ia], [x.token for x in ib], autojunk=False)
    for tag, a1, a2, b1, b2 in sm.get_opcodes():
        if tag == "equal":
            for x, y in zip(ia[a1:a2], ib[b1:b2], strict=True):
                d.aligned_items += 1
                _compare_items(d, x, y, opts, pos_a, pos_b)
            continue
        for x in ia[a1:a2]:
            _add(d, "only_in_a", f"only in A: {x.label()} ({x.where(a.t0_us)})", x=x)
        for y in ib[b1:b2]:
            _add(d, "only_in_b", f"only in B: {y.label()} ({y.where(b.t0_us)})", y=y)
    _compare_execs(d, execs(a.frames), execs(b.frames))
    _compare_tools(d, a.tool_calls, b.tool_calls, opts)
    _compare_ending(d)
    _compare_findings(d)
    _compare_stalls(d)
    return d


def _add(d: Diff, kind: str, text: str, *, x: Item | None = None, y: Item | None = None, **extra: Any) -> None:
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
    # the first divergence: the earliest difference on the aligned message sequence
    if kind in ("only_in_a", "only_in_b", "changed_fields", "count", "timing") and d.first_divergence is None:
        d.first_divergence = row
    if kind in ("only_in_a", "only_in_b", "count") and d.first_sequence_divergence is None:
        d.first_sequence_divergence = row


def _compare_items(d: Diff, x: Item, y: Item, opts: Options, pos_a: dict[int, int], pos_b: dict[int, int]) -> None:
    if len(x.frames) != len(y.frames):
        _add(d, "count", f"{x.label().split(' ×')[0]}: {len(x.frames)} in A ({x.where(d.a.t0_us)}), "
             f"{len(y.frames)} in B ({y.where(d.b.t0_us)})", x=x, y=y)
    for fa, fb in zip(x.frames, y.frames, strict=False):
        if kinds.is_heartbeat(fa.kind):
            continue  # empty messages: only their number and time say anything
        changed, unaligned = compare_trees(fa, fb, opts)
        d.unaligned.extend(unaligned)
        if changed:
            shown = changed[:MAX_FIELD_CHANGES]
            more = f" (+{len(changed) - len(shown)} more)" if len(changed) > len(shown) else ""
            lines = "; ".join(f"{c['path']}: {c['a']} → {c['b']}" for c in shown)
            _add(d, "changed_fields", f"{fa.kind} A seq {fa.seq} / B seq {fb.seq}: {lines}{more}",
                 x=Item(x.direction, x.kind, [fa]), y=Item(y.direction, y.kind, [fb]), fields=changed)
    ga = _gap_us(d.a.frames, x.frames[0], pos_a)
    gb = _gap_us(d.b.frames, y.frames[0], pos_b)
    if abs(ga - gb) / 1e6 > opts.timing_threshold_s:
        _add(d, "timing", f"{x.kind}: came {ga / 1e6:.3f} s after the previous frame in A (seq {x.frames[0].seq}), "
             f"{gb / 1e6:.3f} s in B (seq {y.frames[0].seq})", x=x, y=y, a_gap_s=ga / 1e6, b_gap_s=gb / 1e6)


def _pair_by_name(xs: Sequence[Any], ys: Sequence[Any], name: Any) -> Iterator[tuple[Any | None, Any | None, int]]:
    """Pair the n-th element named N in ``xs`` with the n-th named N in ``ys``; (x, y, n)."""
    seen: dict[str, int] = {}
    by_b: dict[tuple[str, int], Any] = {}
    for y in ys:
        k = name(y)
        by_b[(k, seen.get(k, 0))] = y
        seen[k] = seen.get(k, 0) + 1
    seen.clear()
    for x in xs:
        k = name(x)
        n = seen.get(k, 0)
        seen[k] = n + 1
        yield x, by_b.pop((k, n), None), n + 1
    for (_k, n), y in sorted(by_b.items(), key=lambda kv: kv[1].request_seq if isinstance(kv[1], Exec) else 0):
        yield None, y, n + 1


def _compare_execs(d: Diff, ea: list[Exec], eb: list[Exec]) -> None:
    for x, y, n in _pair_by_name(ea, eb, lambda e: e.name):
        if y is None:
            assert x is not None
            _add(d, "exec", f"exec {x.name} #{n}: only in A (exec {x.ref_id}, seq {x.request_seq})",
                 exec=x.name, a_seq=x.request_seq)
            continue
        if x is None:
            _add(d, "exec", f"exec {y.name} #{n}: only in B (exec {y.ref_id}, seq {y.request_seq})",
                 exec=y.name, b_seq=y.request_seq)
            continue
        head = f"exec {x.name} #{n} (A exec {x.ref_id} at seq {x.request_seq}, B exec {y.ref_id} at seq {y.request_seq})"
        ra, rb = [k for _, k in x.results], [k for _, k in y.results]
        if ra != rb:
            _add(d, "exec", f"{head}: answered with {ra or 'nothing'} in A, {rb or 'nothing'} in B",
                 exec=x.name, a_seq=x.request_seq, b_seq=y.request_seq)
        if x.ending != y.ending:
            if x.close_seq is not None and y.close_seq is None:
                what = f"stream_close only in A (seq {x.close_seq}); B: {y.ending}"
            elif y.close_seq is not None and x.close_seq is None:
                what = f"stream_close only in B (seq {y.close_seq}); A: {x.ending}"
            else:
                what = f"ended with {x.ending} in A, {y.ending} in B"
            _add(d, "exec", f"{head}: {what}", exec=x.name, a_seq=x.request_seq, b_seq=y.request_seq,
                 a_ending=x.ending, b_ending=y.ending,
                 missing=kinds.EXEC_STREAM_CLOSE if (x.close_seq is None) != (y.close_seq is None) else None)


def _norm_args(text: Any, opts: Options) -> Any:
    if text is None:
        return None
    value = text
    if isinstance(text, str | bytes):  # stored rows keep JSON text; the analysis gives objects
        try:
            value = load_json(text)
        except ValueError:  # not JSON, or nested past the limit every reader shares
            return text
    return {p: v for p, v, _ in flatten(value, opts)} if isinstance(value, dict | list) else value


def _compare_tools(d: Diff, ta: list[dict[str, Any]], tb: list[dict[str, Any]], opts: Options) -> None:
    def name(c: dict[str, Any]) -> str:
        return str(c.get("tool_name") or "?")

    for x, y, n in _pair_by_name(ta, tb, name):
        if x is None or y is None:
            c = x or y
            assert c is not None
            side = "A" if x is not None else "B"
            _add(d, "tool_call", f"tool call {name(c)} #{n}: only in {side} ({c.get('call_id')})", tool=name(c))
            continue
        for key in ("args_merged", "args_streamed", "args_completion"):
            va, vb = _norm_args(x.get(key), opts), _norm_args(y.get(key), opts)
            if va != vb:
                _add(d, "tool_args", f"tool call {name(x)} #{n} {key}: {_short(x.get(key))} → {_short(y.get(key))}",
                     tool=name(x), field=key, a=x.get(key), b=y.get(key))
        if x.get("status") != y.get("status"):
            _add(d, "tool_call", f"tool call {name(x)} #{n} status: {x.get('status')} → {y.get('status')}",
                 tool=name(x), a=x.get("status"), b=y.get("status"))


def _ending(v: SessionView) -> tuple[str, str]:
    last = next((f.kind for f in reversed(v.frames) if not kinds.is_heartbeat(f.kind)), "no frame")
    return str(v.facts.get("status") or "?"), last


# the names the ending comparison gives the two kinds it looks for (text and JSON keys)
_END, _TURN = kinds.END_STREAM, kinds.member(kinds.TURN_ENDED)


def _compare_ending(d: Diff) -> None:
    (sa, la), (sb, lb) = _ending(d.a), _ending(d.b)
    if sa != sb:
        _add(d, "ending", f"status: {sa} in A, {sb} in B", a=sa, b=sb)
    ea = any(kinds.is_end_stream(f.kind) for f in d.a.frames)
    eb = any(kinds.is_end_stream(f.kind) for f in d.b.frames)
    turn_a = any(f.kind == kinds.TURN_ENDED for f in d.a.frames)
    turn_b = any(f.kind == kinds.TURN_ENDED for f in d.b.frames)
    if (ea, turn_a) != (eb, turn_b) or la != lb:
        def says(end: bool, turn: bool, last: str) -> str:
            return f"{'' if turn else 'no '}{_TURN}, {'' if end else 'no '}{_END}, last {last}"

        _add(d, "ending", f"ending: {says(ea, turn_a, la)} in A; {says(eb, turn_b, lb)} in B",
             a={_END: ea, _TURN: turn_a, "last_kind": la},
             b={_END: eb, _TURN: turn_b, "last_kind": lb})


def _compare_findings(d: Diff) -> None:
    def codes(v: SessionView) -> dict[str, str]:
        return {str(f["code"]): str(f["severity"]) for f in v.findings}

    ca, cb = codes(d.a), codes(d.b)
    for code in sorted(ca.keys() - cb.keys()):
        _add(d, "finding", f"finding only in A: {code} ({ca[code]})", code=code, side="a", severity=ca[code])
    for code in sorted(cb.keys() - ca.keys()):
        _add(d, "finding", f"finding only in B: {code} ({cb[code]})", code=code, side="b", severity=cb[code])


def _compare_stalls(d: Diff) -> None:
    sa, sb = find_stall(d.a.frames), find_stall(d.b.frames)
    d.stall = {"a": sa.as_dict() if sa else None, "b": sb.as_dict() if sb else None}
    for side, s, other in (("A", sa, sb), ("B", sb, sa)):
        if s is not None and other is None:
            _add(d, "stall", f"{side}: {s.describe()}", side=side.lower(), **s.as_dict())
