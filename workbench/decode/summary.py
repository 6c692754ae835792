"""One-line human summaries of classified agent messages.

Summaries are computed on the capture path for every frame, so each function touches only the
fields it prints and never converts a whole message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

ROLE = re.compile(rb'"role"\s*:\s*"([A-Za-z_]+)"')
_ROLE = ROLE
MAX_TEXT = 60  # characters a quoted text keeps (the last one becomes "…" past it)
_MAX_TEXT = MAX_TEXT


def quote(text: str, limit: int = _MAX_TEXT) -> str:
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    # most text needs no escape: four scans cost half of four replacements (hot path)
    if "\\" in text or '"' in text or "\n" in text or "\r" in text:
        text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return f'"{text}"'


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return "%.1f KB" % (n / 1024)  # noqa: UP031 - twice as fast as the f-string on the hot path
    return "%.1f MB" % (n / 1024 / 1024)  # noqa: UP031


def short_id(blob_id: bytes) -> str:
    return blob_id[:2].hex() + "…" if blob_id else "∅"


def sniff_blob(data: bytes) -> tuple[str, str | None]:
    """(content type, JSON role) from the first bytes of a KV blob; no full parse."""
    head = data[:512].lstrip()
    if head[:1] in (b"{", b"["):
        m = _ROLE.search(head)
        return "json", (m.group(1).decode() if m else None)
    if not data:
        return "empty", None
    try:
        data[:4096].decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < 4090:  # a multibyte char cut at the window edge is still text
            return ("protobuf" if data[0] in _PROTO_FIRST else "binary"), None
    if data[0] in _PROTO_FIRST and any(b < 0x09 for b in data[:64]):
        return "protobuf", None
    return "text", None


def sniff_blob_at(p: bytes, start: int) -> tuple[str, str | None]:
    """``sniff_blob(p[start:start + 4096])`` without copying 4 KiB for a JSON blob (the usual kind),
    which needs only its first 512 bytes."""
    head = p[start : start + 512].lstrip()
    if head[:1] in (b"{", b"["):
        m = _ROLE.search(head)
        return "json", (m.group(1).decode() if m else None)
    return sniff_blob(p[start : start + 4096])


# Tag bytes of small field numbers with length-delimited or varint wire types: a plausible first
# byte of a serialized message.
_PROTO_FIRST = frozenset(
    [(n << 3) | wt for n in range(1, 16) for wt in (0, 2)] + [(n << 3 | 2) & 0xFF | 0x80 for n in range(16, 32)]
)


def _text(label: str) -> Callable[[Any], str]:
    def f(m: Any) -> str:
        return f"{label} {quote(m.text)}"

    return f


def _exec_args(m: Any, member: str) -> str:
    a = getattr(m, member)
    detail = ""
    if member in ("shell_args", "shell_stream_args"):
        detail = quote(a.command)
    elif member in ("read_args", "ls_args", "delete_args", "write_args"):
        detail = quote(a.path)
    elif member == "grep_args":
        detail = quote(a.pattern or a.glob)
    elif member == "mcp_args":
        detail = f"{a.name or a.tool_name} ({len(a.args)} args)"
    elif member == "fetch_args":
        detail = quote(a.url)
    return f"exec#{m.id} {member} {detail}".rstrip()


def _exec_result(m: Any, member: str) -> str:
    r = getattr(m, member)
    detail = ""
    which = _which(r)
    if which:
        detail = which
        if member == "shell_result" and which in ("success", "failure"):
            detail = f"{which} exit {getattr(r, which).exit_code}"
    return f"exec#{m.id} {member} {detail}".rstrip()


def _which(m: Any) -> str | None:
    desc = getattr(m, "DESCRIPTOR", None)
    if desc is None:  # an unmodelled member typed `bytes` in the overlay
        return None
    for oneof in desc.oneofs:
        if not oneof.name.startswith("_"):
            return m.WhichOneof(oneof.name)  # type: ignore[no-any-return]
    return None


def _partial(m: Any) -> str:
    delta = m.args_text_delta
    # the last 40 characters; an ellipsis says the text goes on before them (the report and the CLI show it)
    tail = delta if len(delta) <= 40 else "…" + delta[-39:]
    return f"partial {quote(m.call_id, 24)} args {len(delta)} chars {quote(tail, 40)}"


def _tool(label: str) -> Callable[[Any], str]:
    def f(m: Any) -> str:
        tool = _which(m.tool_call) if m.HasField("tool_call") else None
        return f"{label} {quote(m.call_id, 24)} {tool or '?'}"

    return f


def _tool_delta(m: Any) -> str:
    inner = _which(m.tool_call_delta) if m.HasField("tool_call_delta") else None
    return f"tool_call_delta {quote(m.call_id, 24)} {inner or '?'}"


def _set_blob(m: Any) -> str:
    a = m.set_blob_args
    data = a.blob_data  # each attribute read copies the bytes out of upb: read once
    ctype, role = sniff_blob(data)
    kind = f"{ctype}/{role}" if role else ctype
    return f"set_blob#{m.id} {short_id(a.blob_id)} {human_size(len(data))} {kind}"


def _get_blob(m: Any) -> str:
    return f"get_blob#{m.id} {short_id(m.get_blob_args.blob_id)}"


def _get_result(m: Any) -> str:
    r = m.get_blob_result
    if not r.HasField("blob_data"):
        return f"get_blob_result#{m.id} miss"
    return f"get_blob_result#{m.id} {human_size(len(r.blob_data))}"


def _set_result(m: Any) -> str:
    r = m.set_blob_result
    return f"set_blob_result#{m.id} " + (f"error {quote(r.error.message)}" if r.HasField("error") else "ok")


def _checkpoint(m: Any) -> str:
    parts = [f"checkpoint {len(m.turns)} turns"]
    if m.HasField("token_details"):
        parts.append(f"{m.token_details.used_tokens} tokens")
    return ", ".join(parts)


def _run_request(m: Any) -> str:
    model = ""
    if m.HasField("requested_model"):
        model = m.requested_model.model_id
    elif m.HasField("model_details"):
        model = m.model_details.model_id
    text = ""
    if m.HasField("action") and m.action.HasField("user_message_action"):
        text = m.action.user_message_action.user_message.text
    state = "state" if m.HasField("conversation_state") else "NO state"
    return f"run_request {quote(model, 30)} {state} {quote(text, 40)}"


def _control(member: str) -> Callable[[Any], str]:
    def f(m: Any) -> str:
        inner = getattr(m, member)
        extra = f" {quote(inner.error)}" if member == "throw" and inner.error else ""
        return f"{member} exec#{inner.id}{extra}"

    return f


# kind → summary(message of the level the function expects)
# Functions under "update" receive the InteractionUpdate member message; others the top-level
# member message (ExecServerMessage, KvServerMessage, …).
# InteractionUpdate members summarised as ``<label> "<text>"`` (the classifier has a byte-level
# fast path for exactly these).
TEXT_LABELS = {"text_delta": "text", "thinking_delta": "thinking"}

UPDATE_SUMMARIES: dict[str, Callable[[Any], str]] = {
    **{member: _text(label) for member, label in TEXT_LABELS.items()},
    "token_delta": lambda m: f"tokens {m.tokens}",
    "thinking_completed": lambda m: f"thinking done {m.thinking_duration_ms} ms",
    "partial_tool_call": _partial,
    "tool_call_started": _tool("tool_call_started"),
    "tool_call_completed": _tool("tool_call_completed"),
    "tool_call_delta": _tool_delta,
    "step_started": lambda m: f"step {m.step_id} started",
    "step_completed": lambda m: f"step {m.step_id} completed {m.step_duration_ms} ms",
    "heartbeat": lambda m: "heartbeat",
    "turn_ended": lambda m: "turn ended",
    "summary": lambda m: f"summary {quote(m.summary)}",
    "user_message_appended": lambda m: "user message appended",
}

TOP_SUMMARIES: dict[str, Callable[[Any, str], str]] = {
    "exec_server_message": _exec_args,
    "exec_client_message": _exec_result,
    "kv_server_message": lambda m, member: _set_blob(m) if member == "set_blob_args" else _get_blob(m),
    "kv_client_message": lambda m, member: _get_result(m) if member == "get_blob_result" else _set_result(m),
    "exec_client_control_message": lambda m, member: _control(member)(m),
    "exec_server_control_message": lambda m, member: _control(member)(m),
    "interaction_query": lambda m, member: f"query#{m.id} {member}",
    "interaction_response": lambda m, member: f"response#{m.id} {member}",
    "conversation_action": lambda m, member: f"action {member}",
}

PLAIN_SUMMARIES: dict[str, Callable[[Any], str]] = {
    "run_request": _run_request,
    "conversation_checkpoint_update": _checkpoint,
    "client_heartbeat": lambda m: "client heartbeat",
    "prewarm_request": lambda m: "prewarm",
}
