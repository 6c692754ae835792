"""How a session diff is shown: lines for a person, one JSON document for a script."""

from __future__ import annotations

import json
from typing import Any

from workbench.report.session import SessionView
from workbench.sessiondiff.align import WINDOW
from workbench.sessiondiff.compare import Diff

# the order a person reads them in: the conversation, then what it did, then how it ended
_SECTIONS = [("messages", ("only_in_a", "only_in_b", "moved", "count", "changed_fields", "timing")),
             ("execs", ("exec",)), ("tool calls", ("tool_call", "tool_args")), ("ending", ("ending",)),
             ("findings", ("finding",)), ("stall", ("stall",))]


def _side(v: SessionView) -> dict[str, Any]:
    f = v.facts
    return {"session_id": v.session_id, "where": v.where, "source": f.get("source"), "transport": f.get("transport"),
            "label": f.get("label"), "status": f.get("status"), "frames": len(v.frames),
            "duration_s": round(v.duration_s, 3)}


def as_json(d: Diff) -> dict[str, Any]:
    return {"same": d.same, "a": _side(d.a), "b": _side(d.b), "aligned_items": d.aligned_items,
            "first_divergence": d.first_divergence, "first_sequence_divergence": d.first_sequence_divergence,
            "differences": d.differences,
            "unaligned_fields": d.unaligned, "stall": d.stall, "windowed_gaps": d.windowed_gaps}


def dumps(d: Diff) -> str:
    return json.dumps(as_json(d), ensure_ascii=False, default=str)


def human(d: Diff) -> str:
    lines = []
    for name, v in (("A", d.a), ("B", d.b)):
        s = _side(v)
        label = f" “{s['label']}”" if s["label"] else ""
        lines.append(f"{name}: {s['session_id']}{label} ({s['source']}, {s['transport']}, {s['status']}, "
                     f"{s['frames']} frames, {s['duration_s']:.3f} s) in {s['where']}")
    if d.same:
        lines.append(f"same: {d.aligned_items} aligned steps, no difference (ids, hashes and times ignored)")
    else:
        fd = d.first_divergence
        if fd is not None:
            lines.append(f"first divergence: {fd['text']}")
        fs = d.first_sequence_divergence
        if fs is not None and fs is not fd:
            lines.append(f"first divergence in the message sequence: {fs['text']}")
        lines.append(f"{len(d.differences)} difference{'s' if len(d.differences) != 1 else ''} "
                     f"({d.aligned_items} steps aligned):")
        for title, types in _SECTIONS:
            rows = [r for r in d.differences if r["type"] in types]
            if rows:
                lines.append(f"  {title}:")
                lines.extend(f"    {r['text']}" for r in rows)
    if d.windowed_gaps:
        lines.append(f"{d.windowed_gaps} stretch{'es' if d.windowed_gaps != 1 else ''} too long to align exactly "
                     f"{'were' if d.windowed_gaps != 1 else 'was'} aligned in windows of {WINDOW} steps "
                     "(a step displaced further shows as removed and added)")
    for side in ("a", "b"):
        st = d.stall.get(side)
        if st is not None and not any(r["type"] == "stall" for r in d.differences):  # both stalled
            lines.append(f"stall in {side.upper()}: begins at seq {st['first_seq']} (+{st['start_offset_s']:.3f} s) "
                         f"after {st['after_kind']} (seq {st['after_seq']}); {st['heartbeats']} server heartbeats "
                         f"over {st['span_s']:.3f} s")
    if d.unaligned:
        lines.append(f"{len(d.unaligned)} field{'s' if len(d.unaligned) != 1 else ''} not aligned "
                     "(the schema names them on one side only, or not at all):")
        lines.extend(f"    {u['kind']} A seq {u['a_seq']} / B seq {u['b_seq']}: {u['path']}: {u['a']} | {u['b']}"
                     for u in d.unaligned[:50])
        if len(d.unaligned) > 50:
            lines.append(f"    … {len(d.unaligned) - 50} more (--json lists all)")
    return "\n".join(lines)
