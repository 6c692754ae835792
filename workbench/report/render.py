"""The HTML report: one self-contained file (inline CSS, inline SVG, a few lines of inline script).

Rendered with Jinja2 from ``templates/``, autoescaped, so no text from the wire reaches the page
as markup. The page's Content-Security-Policy forbids every fetch (``default-src 'none'``), so it
opens from a mail attachment or an issue without touching the network.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from workbench import __version__
from workbench.analysis.bridge_join import JOINED
from workbench.nesting import load_json
from workbench.protocol import kinds
from workbench.report.diagram import colour, is_stall_finding, sequence_diagram, timeline
from workbench.report.session import SessionView

MAX_TREE_TEXT = 2000      # characters of one string shown in a frame's tree
DEFAULT_MAX_FRAMES = 5000  # frames in the table (each with its tree); the diagram and timeline show all


def _env() -> Environment:
    env = Environment(loader=PackageLoader("workbench.report", "templates"),
                      autoescape=select_autoescape(["html", "svg", "j2"], default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["clip"] = clip
    env.filters["jsonish"] = jsonish
    env.tests["mapping"] = lambda v: isinstance(v, dict)
    env.tests["sequence"] = lambda v: isinstance(v, list | tuple)
    return env


def clip(value: Any, limit: int = MAX_TREE_TEXT) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text) - limit} more characters)"


def jsonish(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def _args_obj(value: Any) -> Any:
    if isinstance(value, str | bytes):
        try:
            return load_json(value)
        except ValueError:  # not JSON, or nested past the limit every reader shares
            return value
    return value


def args_difference(streamed: Any, completion: Any) -> list[str]:
    """What the completion's arguments say differently from the streamed ones, key by key."""
    a, b = _args_obj(streamed), _args_obj(completion)
    if a is None or b is None:
        return [] if a is None and b is None else [f"only {'streamed' if b is None else 'completion'} arguments"]
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [] if a == b else ["the texts differ"]
    out = [f"{k}: only streamed" for k in a if k not in b]
    out += [f"{k}: only in the completion" for k in b if k not in a]
    out += [f"{k}: {clip(jsonish(a[k]), 60)} → {clip(jsonish(b[k]), 60)}" for k in a if k in b and a[k] != b[k]]
    return out


def _facts(view: SessionView) -> list[tuple[str, Any]]:
    f = view.facts
    return [("session", view.session_id), ("label", f.get("label") or "—"), ("status", f.get("status")),
            ("source", f.get("source")), ("transport", f.get("transport")), ("model", f.get("model") or "—"),
            ("client version", f.get("client_version") or "—"), ("started", f.get("started_at")),
            ("duration", f"{view.duration_s:.3f} s"), ("frames", len(view.frames)),
            ("error", f.get("error") or "—"),
            # the file's name only: a shared report need not tell where the sender keeps captures
            ("from", Path(view.where).name), ("redaction", view.redact)] + _link_facts(view)


def _link_facts(view: SessionView) -> list[tuple[str, Any]]:
    """One fact per linked session on the other side of a bridge: who, its role, how it was linked."""
    openai = view.facts.get("transport") in JOINED
    says = {  # the stored role is seen from the OpenAI side; said here from the reported session's
        ("caused", True): "this request caused that run", ("asked", True): "this request answers that run's tool call",
        ("caused", False): "that request caused this run", ("asked", False): "that request answers this run's tool call"}
    return [("bridge link", f"{lk.session_id} ({lk.transport}): {lk.role}, {says.get((lk.role, openai), lk.role)}; "
                            f"linked by {'+'.join(lk.by) or '?'}") for lk in view.links]


def session_context(view: SessionView, index: int, max_frames: int) -> dict[str, Any]:
    anchor = f"s{index}"
    diagram = sequence_diagram(view)
    tl = timeline(view, anchor)
    for f in view.findings:
        f["stall"] = is_stall_finding(f, diagram.stall)
    tools = [{**c, "args_diff": args_difference(c.get("args_streamed"), c.get("args_completion"))}
             for c in view.tool_calls]
    shown = view.frames[:max_frames]
    evidence = {s for f in view.findings for s in f["evidence"]}
    return {"view": view, "anchor": anchor, "facts": _facts(view), "diagram": diagram, "timeline": tl,
            "findings": [f for f in view.findings if not f["is_note"]],
            "notes": [f for f in view.findings if f["is_note"]], "tools": tools, "blobs": view.blobs,
            "frames": shown, "hidden_frames": len(view.frames) - len(shown), "evidence": evidence,
            "t0": view.t0_us, "stall": diagram.stall}


def render_report(views: Sequence[SessionView], *, max_frames: int = DEFAULT_MAX_FRAMES) -> str:
    env = _env()
    sessions = [session_context(v, i, max_frames) for i, v in enumerate(views)]
    return env.get_template("report.html.j2").render(
        sessions=sessions, version=__version__, colour=colour, is_heartbeat=kinds.is_heartbeat,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
