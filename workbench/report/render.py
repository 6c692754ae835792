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
from workbench.report.build import ReportSession, Skipped
from workbench.report.diagram import colour, is_stall_finding
from workbench.report.session import SessionView
from workbench.textsafe import escape_display

MAX_TREE_TEXT = 2000      # characters of one string shown in a frame's tree
DEFAULT_MAX_FRAMES = 5000  # frames in the table (each with its tree), besides those the page links to


def _env() -> Environment:
    env = Environment(loader=PackageLoader("workbench.report", "templates"),
                      autoescape=select_autoescape(["html", "svg", "j2"], default=True),
                      trim_blocks=True, lstrip_blocks=True, finalize=_shown)
    env.filters["clip"] = clip
    env.filters["jsonish"] = jsonish
    env.tests["mapping"] = lambda v: isinstance(v, dict)
    env.tests["sequence"] = lambda v: isinstance(v, list | tuple)
    env.tests["skipped_row"] = lambda v: isinstance(v, Skipped)
    return env


def _shown(value: Any) -> Any:
    """Every ``{{ … }}`` of the page: autoescape keeps wire text from being markup; this shows its
    control, bidi and zero-width characters as visible escapes (``workbench.textsafe``), so that in
    labels and names U+202E cannot make one tool read as another. Its own lines stay."""
    if isinstance(value, str) and not hasattr(value, "__html__"):  # markup we built is left as it is
        return escape_display(value, layout=True)
    return value


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


def _facts(rs: ReportSession) -> list[tuple[str, Any]]:
    view = rs.view
    f = view.facts
    return [("session", view.session_id), ("label", f.get("label") or "—"), ("status", f.get("status")),
            ("source", f.get("source")), ("transport", f.get("transport")), ("model", f.get("model") or "—"),
            ("client version", f.get("client_version") or "—"), ("started", f.get("started_at")),
            ("duration", f"{view.duration_s:.3f} s"), ("frames", rs.frame_count),
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


def title(view: SessionView) -> str:
    """A session's name in the page's contents and headings: its label (or id) and its short id,
    transport and start, so two sessions with one label (two runs of a scenario) are told apart."""
    f = view.facts
    label = f.get("label") or view.session_id
    short = view.session_id[:8]
    return label if label == view.session_id else f"{label} · {short} ({f.get('transport') or '?'})"


def session_context(rs: ReportSession, index: int) -> dict[str, Any]:
    view = rs.view
    anchor = f"s{index}"
    diagram = rs.diagram
    for f in view.findings:
        f["stall"] = is_stall_finding(f, diagram.stall)
    tools = [{**c, "args_diff": args_difference(c.get("args_streamed"), c.get("args_completion"))}
             for c in view.tool_calls]
    evidence = {s for f in view.findings for s in f["evidence"]}
    return {"view": view, "anchor": anchor, "title": title(view), "facts": _facts(rs), "diagram": diagram,
            "timeline": rs.timeline, "findings": [f for f in view.findings if not f["is_note"]],
            "notes": [f for f in view.findings if f["is_note"]], "tools": tools, "blobs": view.blobs,
            "tools_left_out": rs.tools_left_out, "blobs_left_out": rs.blobs_left_out,
            "table": rs.table, "frame_count": rs.frame_count, "shown_frames": len(view.frames),
            "evidence": evidence, "t0": view.t0_us, "stall": diagram.stall, "max_rows": diagram.max_rows}


def render_report(sessions: Sequence[ReportSession]) -> str:
    env = _env()
    contexts = [session_context(rs, i) for i, rs in enumerate(sessions)]
    titles = [c["title"] for c in contexts]
    for c in contexts:  # still the same (one label, one transport, ids alike in 8 characters): the whole id
        if titles.count(c["title"]) > 1:
            c["title"] = f"{c['view'].facts.get('label') or ''} · {c['view'].session_id}".lstrip(" ·")
    return env.get_template("report.html.j2").render(
        sessions=contexts, version=__version__, colour=colour, is_heartbeat=kinds.is_heartbeat,
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))
