"""Tool-call reconstruction: one row per call id (and per exec no call claims).

A call is joined across partial_tool_call (args streamed as cumulative snapshots), tool_call_started,
tool_call_delta, tool_call_completed (args as the completion frame states them), the exec request
whose args carry the same ``tool_call_id`` (or, when they carry none, the latest started call still
without an exec), the client's result and its stream_close/throw. The args are rebuilt with the
client library's own functions, so "merged" is what a correct client would use and "naive" what a
client that concatenates snapshots would have built.
"""

from __future__ import annotations

import json
from typing import Any, cast

from google.protobuf.message import DecodeError

from workbench.analysis.facts import CLIENT_CLS, SERVER_CLS
from workbench.analysis.ndjson import tool_rows as ndjson_tool_rows
from workbench.analysis.records import CallState, ExecReq, SessionFacts
from workbench.analysis.rows import CallRecord, ToolCallRow
from workbench.decode.tree import message_to_tree
from workbench.jsontypes import JsonObject
from workbench.protocol.args import merge_mcp_args, naive_concat, parse_json
from workbench.store.db import us_to_time

_STR_LIMIT = 2000
# Keys that differ between identical calls and must not defeat tool-loop detection.
_VOLATILE = {"tool_call_id", "toolCallId", "timeout", "span_context"}


def tool_rows(facts: SessionFacts) -> list[CallRecord]:
    calls = list(facts.calls.values())
    by_id = {c.call_id: c for c in calls}
    exec_of: dict[str, ExecReq] = {}
    orphans: list[ExecReq] = []
    for req in facts.execs:
        if req.tool_call_id and req.tool_call_id in by_id and req.tool_call_id not in exec_of:
            exec_of[req.tool_call_id] = req
        else:
            orphans.append(req)
    # Execs without a usable tool_call_id: the latest started call (before the exec) still free.
    still: list[ExecReq] = []
    for req in orphans:
        if req.member in _NOT_TOOLS:
            still.append(req)
            continue
        best = None
        for c in calls:
            if c.call_id in exec_of or c.first_seq > req.seq:
                continue
            if best is None or c.first_seq > best.first_seq:
                best = c
        if best is not None and not req.tool_call_id:
            exec_of[best.call_id] = req
        else:
            still.append(req)
    rows = [_call_row(facts.session_id, c, exec_of.get(c.call_id)) for c in calls]
    rows += [_exec_only_row(facts.session_id, req) for req in still if req.member not in _NOT_TOOLS]
    if facts.ndjson:
        rows += [CallRecord(**r, _delta_seqs=[], _deltas=[], _started_seq=None, _completed_seq=r["result_seq"],
                            _close_seq=None, _exec_args=None, _case=None, _echo=[])
                 for r in ndjson_tool_rows(facts.session_id, facts.ndjson)]
    rows.sort(key=lambda r: r["first_seq"])
    return rows


# Exec requests that are plumbing, not a model's tool call.
_NOT_TOOLS = {"request_context_args"}


def _tool_call_of(payload: bytes | None) -> Any:
    if not payload:
        return None
    try:
        upd = SERVER_CLS.FromString(payload).interaction_update
    except DecodeError:
        return None
    member = upd.WhichOneof("message")
    inner = getattr(upd, member) if member else None
    if inner is None or not inner.HasField("tool_call"):
        return None
    return inner.tool_call


def _case_tree(tool_call: Any) -> tuple[str | None, JsonObject]:
    case = tool_call.WhichOneof("tool") if tool_call is not None else None
    if not case:
        return None, {}
    return case, message_to_tree(getattr(tool_call, case))


def _args_of(case: str | None, tree: JsonObject) -> Any:
    args = tree.get("args")
    if case == "mcp_tool_call" and isinstance(args, dict):
        return args.get("args", {})
    return args


def _mcp_name(tree: JsonObject) -> str | None:
    args = tree.get("args")
    if isinstance(args, dict):
        return args.get("tool_name") or args.get("name")
    return None


def exec_tree(req: ExecReq) -> tuple[JsonObject, Any]:
    """(args tree, result tree) of an exec request and the client's first answer."""
    args: JsonObject = {}
    try:
        msg = SERVER_CLS.FromString(req.payload).exec_server_message
        if req.member != "unknown":
            value = getattr(msg, req.member)
            args = message_to_tree(value) if hasattr(value, "DESCRIPTOR") else {"$bytes": len(value)}
    except (DecodeError, AttributeError):
        pass
    result: Any = None
    if req.result_payload:
        try:
            cm = CLIENT_CLS.FromString(req.result_payload).exec_client_message
            member = cm.WhichOneof("result")
            if member:
                value = getattr(cm, member)
                result = {member: message_to_tree(value) if hasattr(value, "DESCRIPTOR") else {"$bytes": len(value)}}
        except DecodeError:
            pass
    if req.throw_seq is not None:
        result = {"throw": req.throw_error or ""}
    return args, _clip_tree(result)


def _status(c: CallState | None, req: ExecReq | None) -> str:
    if c is not None and c.completed_seq is not None:
        return "completed"
    if req is not None:
        if req.throw_seq is not None:
            return "thrown"
        if req.abort_seq is not None:
            return "aborted"
        if req.result_seqs:
            return "executed" if req.close_seq is not None else "result_without_close"
        return "awaiting_result"
    if c is not None and c.started_seq is not None:
        return "started"
    return "streaming"


def _call_row(session_id: str, c: CallState, req: ExecReq | None) -> CallRecord:
    completed_case, completed_tree = _case_tree(_tool_call_of(c.completed_payload))
    # The started frame matters only when the call never completed (or to name an MCP tool).
    started_case, started_tree = (_case_tree(_tool_call_of(c.started_payload))
                                  if completed_case is None or completed_case == "mcp_tool_call" and
                                  not _mcp_name(completed_tree) else (None, {}))
    case = completed_case or started_case or c.tool_case
    streamed = parse_json(c.args_text) if c.args_text else None
    if streamed is None and c.args_text:
        streamed = c.args_text  # kept as text: not (yet) valid JSON
    completion = _args_of(completed_case, completed_tree) if completed_case else None
    exec_args, result = exec_tree(req) if req is not None else ({}, None)
    if case == "mcp_tool_call" or (req is not None and req.member == "mcp_args"):
        base = streamed if isinstance(streamed, dict) else None
        if base is None and req is not None and req.member == "mcp_args":
            base = exec_args.get("args")
        merged: Any = merge_mcp_args(base, completion if isinstance(completion, dict) else None)
        name = _mcp_name(completed_tree) or _mcp_name(started_tree) or exec_args.get("tool_name") or exec_args.get("name")
    else:
        merged = completion if completion is not None else (
            _args_of(started_case, started_tree) if started_case else None)
        if merged is None:
            merged = streamed if streamed is not None else (exec_args or None)
        name = _tool_name(case) or (req.member.removesuffix("_args") if req else None)
    if result is None and completed_tree.get("result") is not None:
        result = _clip_tree(completed_tree.get("result"))
    ends = [s for s in (c.completed_seq, req.close_seq if req else None,
                        req.result_seqs[-1] if req and req.result_seqs else None) if s is not None]
    end_ts = c.last_ts
    if req is not None and req.result_ts is not None:
        end_ts = max(end_ts, req.result_ts)
    return {
        "session_id": session_id,
        "call_id": c.call_id,
        "tool_name": name,
        "exec_id": req.id if req else None,
        "model_call_id": c.model_call_id,
        "first_seq": min([c.first_seq] + ([req.seq] if req else [])),
        "last_seq": max([c.last_seq] + ends),
        "exec_seq": req.seq if req else None,
        "result_seq": (req.result_seqs[0] if req and req.result_seqs else None),
        "args_streamed": streamed,
        "args_completion": completion,
        "args_merged": merged,
        "args_naive": naive_concat(c.deltas) if c.deltas else None,
        "result": result,
        "status": _status(c, req),
        "started_at": us_to_time(c.first_ts),
        "ended_at": us_to_time(end_ts),
        # not columns: used by the rules and the CLI
        "_delta_seqs": list(c.delta_seqs),
        "_deltas": list(c.deltas),
        "_started_seq": c.started_seq,
        "_completed_seq": c.completed_seq,
        "_close_seq": req.close_seq if req else None,
        "_exec_args": exec_args if req else None,
        "_case": case,
        "_echo": list(req.echo_payloads) if req else [],
    }


def _exec_only_row(session_id: str, req: ExecReq) -> CallRecord:
    args, result = exec_tree(req)
    name = req.member.removesuffix("_args")
    if req.member == "mcp_args":
        name = args.get("tool_name") or args.get("name") or name
        shown: Any = args.get("args", {})
    else:
        shown = args
    ends = [s for s in ([req.close_seq] + req.result_seqs) if s is not None]
    return {
        "session_id": session_id,
        "call_id": req.tool_call_id or f"exec:{req.id}",
        "tool_name": name,
        "exec_id": req.id,
        "model_call_id": None,
        "first_seq": req.seq,
        "last_seq": max([req.seq] + ends),
        "exec_seq": req.seq,
        "result_seq": req.result_seqs[0] if req.result_seqs else None,
        "args_streamed": None,
        "args_completion": None,
        "args_merged": shown,
        "args_naive": None,
        "result": result,
        "status": _status(None, req),
        "started_at": us_to_time(req.ts),
        "ended_at": us_to_time(req.result_ts or req.ts),
        "_delta_seqs": [],
        "_deltas": [],
        "_started_seq": None,
        "_completed_seq": None,
        "_close_seq": req.close_seq,
        "_exec_args": args,
        "_case": None,
        "_echo": list(req.echo_payloads),
    }


def _tool_name(case: str | None) -> str | None:
    return case[: -len("_tool_call")] if case and case.endswith("_tool_call") else case


def canonical_args(row: ToolCallRow) -> str:
    """Args as compared by tool-loop detection: sorted keys, volatile ids dropped."""
    args = row.get("args_merged")
    if isinstance(args, dict):
        args = {k: v for k, v in args.items() if k not in _VOLATILE}
    return json.dumps(args, sort_keys=True, default=str)


def _clip_tree(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= _STR_LIMIT else value[: _STR_LIMIT - 1] + "…"
    if isinstance(value, dict):
        return {k: _clip_tree(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clip_tree(v) for v in value[:200]]
    return value


def public_row(row: CallRecord) -> ToolCallRow:
    """The stored columns of a call (what the rules read besides them left out)."""
    return cast(ToolCallRow, {k: v for k, v in row.items() if not k.startswith("_")})
