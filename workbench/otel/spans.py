"""A stored session as OpenTelemetry GenAI spans (docs/otel.md): plain data, no SDK.

One trace per session. The root span is the run (``invoke_agent``) or, for the OpenAI side of a
bridge, the request (``chat``); under a run, a ``chat`` span per model turn and an ``execute_tool``
span per tool call and per exec no tool call covers. Times are the frames' own; ids are derived
from the session id, so exporting twice gives the same trace. Findings become span events on the
span they are about; an error finding sets that span's status to error. Which attribute names are
used, and at which version of the conventions, is pinned here (``SCHEMA_URL``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from workbench.protocol import kinds
from workbench.protocol.routes import OPENAI_TRANSPORTS
from workbench.store import otel_reads as reads
from workbench.store.queries import Reader, session_findings

# The conventions at the version whose GenAI names these are: semantic-conventions v1.41.0, the last
# release that held the GenAI group before the separate semantic-conventions-genai repository
# (v0.1.0, "Development") took it over with the same names.
SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.0"
PROVIDER = "cursor"          # gen_ai.provider.name of the agent side
OPENAI_PROVIDER = "openai"   # of a bridge's OpenAI side (the API it speaks, not who serves it)
CONTENT_MAX = 64 * 1024      # the most characters of one content attribute (--content)
FINDING_EVENT = "workbench.finding"


@dataclass
class EventSpec:
    name: str
    time_us: int
    attributes: dict[str, Any]


@dataclass
class SpanSpec:
    """One span, as the exporter turns it into the SDK's ReadableSpan."""

    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    kind: str                       # client | internal | server
    start_us: int
    end_us: int
    attributes: dict[str, Any]
    events: list[EventSpec] = field(default_factory=list)
    links: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)  # (trace, span, attributes)
    error: str | None = None        # the status description when the span failed
    first_seq: int | None = None    # the frames it covers, to place findings
    last_seq: int | None = None


def trace_id_of(session_id: str) -> int:
    return int.from_bytes(hashlib.sha256(b"workbench-trace\0" + session_id.encode()).digest()[:16], "big") or 1


def span_id_of(session_id: str, role: str) -> int:
    digest = hashlib.sha256(b"workbench-span\0" + session_id.encode() + b"\0" + role.encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1


def _cut(text: str) -> str:
    return text if len(text) <= CONTENT_MAX else text[:CONTENT_MAX] + "…"


def session_spans(reader: Reader, session_id: str, *, content: bool = False,
                  links: list[dict[str, Any]] | None = None) -> list[SpanSpec]:
    """The spans of one stored session (root first); [] for an unknown session."""
    facts = reads.session_facts(reader, session_id)
    if facts is None:
        return []
    trace = trace_id_of(session_id)
    start = facts["start_us"] or facts["last_us"] or 0
    end = max(x for x in (facts["end_us"], facts["last_us"], start) if x is not None)
    openai = facts["transport"] in OPENAI_TRANSPORTS
    root = _openai_root(reader, facts, trace, start, end, content) if openai else \
        _run_root(reader, facts, trace, start, end, content)
    linked = []
    for link in links or []:
        other = str(link.get("session_id", ""))
        if other:
            role = str(link.get("role", ""))
            root.links.append((trace_id_of(other), span_id_of(other, "root"),
                               {"workbench.link.role": role, "workbench.session_id": other}))
            linked.append({"session_id": other, "role": role, "trace_id": f"{trace_id_of(other):032x}"})
    if linked:
        # the same as an attribute: some backends (Phoenix) keep no span links
        root.attributes["workbench.links"] = json.dumps(linked)
    spans = [root]
    if not openai:
        spans += _turn_spans(reader, session_id, trace, root, end)
        spans += _tool_spans(reader, session_id, trace, root, end, content)
    _attach_findings(reader, session_id, spans)
    return spans


def _common(facts: dict[str, Any]) -> dict[str, Any]:
    attrs = {"workbench.session_id": facts["session_id"], "workbench.transport": facts["transport"],
             "workbench.source": facts["source"], "workbench.status": facts["status"],
             "workbench.label": facts["label"], "workbench.client_version": facts["client_version"],
             "server.address": facts["host"], "http.response.status_code": facts["http_status"]}
    return {k: v for k, v in attrs.items() if v is not None}


def _run_root(reader: Reader, facts: dict[str, Any], trace: int, start: int, end: int, content: bool) -> SpanSpec:
    model = facts["model"]
    attrs: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", "gen_ai.provider.name": PROVIDER,
                             "gen_ai.agent.name": "cursor-agent", **_common(facts)}
    if model:
        attrs["gen_ai.request.model"] = model
    if facts["conversation_id"]:
        attrs["gen_ai.conversation.id"] = facts["conversation_id"]
    failed = facts["status"] in ("error", "aborted") or bool(facts["error"])
    if failed:
        attrs["error.type"] = str(facts["error"] or facts["status"])
    if content:
        prompt = _prompt(reader, facts["session_id"])
        if prompt:
            attrs["gen_ai.input.messages"] = json.dumps(
                [{"role": "user", "parts": [{"type": "text", "content": _cut(prompt)}]}])
    return SpanSpec(f"invoke_agent {model}" if model else "invoke_agent", trace, span_id_of(facts["session_id"], "root"),
                    None, "client", start, end, attrs, error=attrs.get("error.type"))


def _prompt(reader: Reader, session_id: str) -> str | None:
    from workbench.protocol.labels import prompt_of  # protobuf: only an export with --content reads prompts

    found = reads.run_request_payload(reader, session_id)
    return prompt_of(*found) if found else None


def _openai_root(reader: Reader, facts: dict[str, Any], trace: int, start: int, end: int, content: bool) -> SpanSpec:
    model = facts["model"]
    attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": OPENAI_PROVIDER,
                             **_common(facts)}
    body = reads.openai_request_body(reader, facts["session_id"])
    request: dict[str, Any] = {}
    if body:
        try:
            loaded = json.loads(body)
            request = loaded if isinstance(loaded, dict) else {}
        except (ValueError, RecursionError):
            request = {}
    model = model or request.get("model")
    if model:
        attrs["gen_ai.request.model"] = str(model)
    attrs["gen_ai.request.stream"] = bool(request.get("stream"))
    got = reads.openai_facts(reader, facts["session_id"])
    if got["first_chunk_us"] is not None:
        attrs["gen_ai.response.time_to_first_chunk"] = (got["first_chunk_us"] - start) / 1e6
    finish = [f for f in (got["finish"] or []) if f]
    if finish:
        attrs["gen_ai.response.finish_reasons"] = finish
    if got["input_tokens"] is not None:
        attrs["gen_ai.usage.input_tokens"] = int(got["input_tokens"])
    if got["output_tokens"] is not None:
        attrs["gen_ai.usage.output_tokens"] = int(got["output_tokens"])
    if content and isinstance(request.get("messages") or request.get("input"), list | str):
        attrs["gen_ai.input.messages"] = _cut(json.dumps(request.get("messages") or request.get("input")))
    failed = facts["status"] in ("error", "aborted") or bool(facts["error"]) or (facts["http_status"] or 0) >= 400
    if failed:
        attrs["error.type"] = str(facts["error"] or facts["http_status"] or facts["status"])
    return SpanSpec(f"chat {model}" if model else "chat", trace, span_id_of(facts["session_id"], "root"), None,
                    "server", start, end, attrs, error=attrs.get("error.type"))


def _turn_spans(reader: Reader, session_id: str, trace: int, root: SpanSpec, end: int) -> list[SpanSpec]:
    out = []
    model = root.attributes.get("gen_ai.request.model")
    for t in reads.model_turns(reader, session_id):
        answered = t["end_us"] is not None
        attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
                                 "gen_ai.request.stream": True, "workbench.turn": int(t["turn"]),
                                 "workbench.turn.chunks": int(t["chunks"]), "workbench.turn.answered": answered}
        if model:
            attrs["gen_ai.request.model"] = model
        if t["first_chunk_us"] is not None:
            attrs["gen_ai.response.time_to_first_chunk"] = (t["first_chunk_us"] - t["start_us"]) / 1e6
        finish = _finish_reason(t["finish"])
        if finish:
            attrs["gen_ai.response.finish_reasons"] = [finish]
        span_end = t["end_us"] if answered else end  # an unanswered turn lasts until the run ends: the stall
        out.append(SpanSpec(f"chat {model}" if model else "chat", trace, span_id_of(session_id, f"turn:{t['turn']}"),
                            root.span_id, "client", t["start_us"], max(span_end, t["start_us"]), attrs,
                            first_seq=t["first_seq"], last_seq=t["end_seq"] if answered else None))
    return out


def _finish_reason(kind: str | None) -> str | None:
    """What ended a model turn, in the conventions' words where one fits."""
    if kind is None:
        return None
    if kind == kinds.TURN_ENDED or kinds.is_end_stream(kind) and not kinds.is_end_stream_error(kind):
        return "stop"
    if kind.startswith(kinds.EXEC_SERVER + ".") or kind in (kinds.TOOL_CALL_STARTED, kinds.TOOL_CALL_COMPLETED):
        return "tool_call"
    if kinds.is_end_stream_error(kind) or kind == kinds.HTTP_ERROR:
        return "error"
    return kinds.member(kind) or kind


def _tool_spans(reader: Reader, session_id: str, trace: int, root: SpanSpec, end: int,
                content: bool) -> list[SpanSpec]:
    out = []
    covered: set[int] = set()
    for c in reads.tool_calls(reader, session_id, content=content):
        if c["exec_id"] is not None:
            covered.add(int(c["exec_id"]))
        start = c["start_us"] if c["start_us"] is not None else root.start_us
        attrs: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": c["tool_name"] or "",
                                 "gen_ai.tool.call.id": c["call_id"], "workbench.tool.status": c["status"] or ""}
        if c["exec_id"] is not None:
            attrs["workbench.exec_id"] = int(c["exec_id"])
        if content:
            for key, col in (("gen_ai.tool.call.arguments", "args"), ("gen_ai.tool.call.result", "result")):
                if c.get(col):
                    attrs[key] = _cut(str(c[col]))
        last = c["result_seq"] if c["result_seq"] is not None else c["last_seq"]
        out.append(SpanSpec(f"execute_tool {c['tool_name'] or ''}".rstrip(), trace,
                            span_id_of(session_id, f"tool:{c['call_id']}"), root.span_id, "internal", start,
                            max(start, c["end_us"] if c["end_us"] is not None else end), attrs,
                            first_seq=c["first_seq"], last_seq=last))
    for e in reads.execs(reader, session_id):
        if int(e["exec_id"]) in covered:
            continue
        tool = kinds.member(e["kind"]).removesuffix("_args") or e["kind"]
        attrs = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool,
                 "gen_ai.tool.call.id": f"exec:{e['exec_id']}", "workbench.exec_id": int(e["exec_id"]),
                 "workbench.exec.answered": e["end_us"] is not None}
        out.append(SpanSpec(f"execute_tool {tool}", trace, span_id_of(session_id, f"exec:{e['exec_id']}"),
                            root.span_id, "internal", e["start_us"],
                            max(e["start_us"], e["end_us"] if e["end_us"] is not None else end), attrs,
                            first_seq=e["seq"], last_seq=e["result_seq"]))
    return out


def _attach_findings(reader: Reader, session_id: str, spans: list[SpanSpec]) -> None:
    """Each finding as an event on the innermost span whose frames hold its first evidence frame
    (a tool call, then a model turn, then the run); an error finding sets that span's status."""
    found = session_findings(reader, session_id)
    times = reads.seq_times(reader, session_id, [int(f["first_seq"]) for f in found if f["first_seq"] is not None])
    root = spans[0]
    for f in found:
        seq = f["first_seq"]
        target = root
        if seq is not None:
            for span in sorted(spans[1:], key=lambda s: s.kind != "internal"):  # tool spans are innermost
                if span.first_seq is not None and span.first_seq <= seq and (span.last_seq is None or seq <= span.last_seq):
                    target = span
                    break
        attrs: dict[str, Any] = {"workbench.finding.code": f["code"], "workbench.finding.severity": f["severity"],
                                 "workbench.finding.message": f["message"] or ""}
        evidence = [int(x) for x in (f["evidence"] or []) if x is not None]
        if evidence:
            attrs["workbench.finding.evidence"] = evidence
        if f["suggested_fix"]:
            attrs["workbench.finding.fix"] = f["suggested_fix"]
        at = times.get(int(seq)) if seq is not None else None
        target.events.append(EventSpec(FINDING_EVENT, at if at is not None else target.start_us, attrs))
        if f["severity"] == "error" and target.error is None:
            target.error = f"{f['code']}: {f['message'] or ''}".strip()
