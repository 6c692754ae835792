"""stream-json (``cli_ndjson``) sessions: assistant text as a consumer would rebuild it, errors, tools.

What the events mean is ``workbench.protocol.stream_json`` (the one model the importer uses too);
this module only adapts stored frames to it and picks the evidence.
"""

from __future__ import annotations

from workbench.analysis.rows import ToolCallRow
from workbench.jsontypes import JsonObject
from workbench.protocol.stream_json import (
    DELTA,
    FULL,
    assistant_form,
    call_id_of,
    is_error_result,
    message_text,
    naive_assistant_text,
    parse_event,
    reconstruct_assistant_text,
    tool_info,
)

_SEAM = 12


def _event(payload: bytes | None, decoded: str | None) -> JsonObject | None:
    """The stored event: its line as recorded, else the decoded JSON the importer kept."""
    return parse_event(payload) or parse_event(decoded)


def assistant_texts(events: list[tuple[int, str, bytes | None, str | None]]) -> tuple[str, str, list[int]]:
    """(correct text, naive text, seqs of the assistant events that repeat text: snapshots and full)."""
    parsed: list[JsonObject] = []
    repeats: list[int] = []
    first_delta: int | None = None
    for seq, kind, payload, decoded in events:
        if kind != "assistant":
            continue
        ev = _event(payload, decoded)
        if ev is None:
            continue
        parsed.append(ev)
        form = assistant_form(ev)
        if form == DELTA:
            if first_delta is None:
                first_delta = seq
        else:
            repeats.append(seq)
    good = reconstruct_assistant_text(parsed)
    naive = naive_assistant_text(parsed)
    ev_seqs = ([first_delta] if first_delta is not None else []) + repeats
    return good, naive, ev_seqs


def duplicated_final(events: list[tuple[int, str, bytes | None, str | None]]) -> tuple[int, str, str, str] | None:
    """The event whose text shows the duplication a naive consumer makes: (seq, its text, the
    correct text, the naive text), or None. The final text is the ``result`` event's ``result``
    (else the last full assistant message); it is duplicated when it equals the naive
    concatenation, or holds a seam of it (the end of the text so far glued to the start of a
    snapshot or full message that repeats it) that the correct text does not hold."""
    parsed: list[JsonObject] = []
    seams: list[str] = []
    so_far = ""
    final: tuple[int, str] | None = None
    for seq, kind, payload, decoded in events:
        ev = _event(payload, decoded)
        if ev is None:
            continue
        if kind.startswith("result") and isinstance(ev.get("result"), str):
            final = (seq, ev["result"])
            continue
        if kind != "assistant":
            continue
        parsed.append(ev)
        text = message_text(ev)
        form = assistant_form(ev)
        if form != DELTA and so_far and text:
            seams.append(so_far[-_SEAM:] + text[:_SEAM])
        if form == FULL:
            final = (seq, text) if final is None or final[0] < seq else final
        so_far += text
    if final is None or not parsed:
        return None
    good = reconstruct_assistant_text(parsed)
    naive = naive_assistant_text(parsed)
    seq, text = final
    if naive == good or text == good:
        return None
    if text == naive or any(s in text and s not in good for s in seams):
        return seq, text, good, naive
    return None


def error_results(events: list[tuple[int, str, bytes | None, str | None]]) -> list[tuple[int, JsonObject]]:
    """``result`` events that report an error (is_error or subtype error)."""
    out = []
    for seq, kind, payload, decoded in events:
        if not kind.startswith("result"):
            continue
        ev = _event(payload, decoded)
        if ev is not None and is_error_result(kind, ev):
            out.append((seq, ev))
    return out


def tool_rows(session_id: str, events: list[tuple[int, str, bytes | None, str | None]]) -> list[ToolCallRow]:
    """``tool_calls`` rows from stream-json tool_call/started|completed events (joined by call_id)."""
    calls: dict[str, ToolCallRow] = {}
    for seq, kind, payload, decoded in events:
        if not kind.startswith("tool_call"):
            continue
        ev = _event(payload, decoded)
        if ev is None:
            continue
        call_id = call_id_of(ev) or f"line:{seq}"
        info = tool_info(ev.get("tool_call")) or {}
        row = calls.get(call_id)
        if row is None:
            row = calls[call_id] = {
                "session_id": session_id, "call_id": call_id, "tool_name": info.get("name"), "exec_id": None,
                "model_call_id": ev.get("model_call_id"), "first_seq": seq, "last_seq": seq, "exec_seq": None,
                "result_seq": None, "args_streamed": None, "args_completion": None, "args_merged": info.get("args"),
                "args_naive": None, "result": None, "status": "started", "started_at": None, "ended_at": None}
        row["last_seq"] = seq
        if kind == "tool_call.completed":
            row["status"] = "completed" if not info.get("error") else "error"
            row["result_seq"] = seq
            row["result"] = info.get("result") if not info.get("error") else {"error": info.get("error")}
            row["args_completion"] = info.get("args")
            if row["args_merged"] is None:
                row["args_merged"] = info.get("args")
    return sorted(calls.values(), key=lambda r: r["first_seq"])
