"""stream-json (``cli_ndjson``) sessions: assistant text as a consumer would rebuild it.

The text logic itself lives in ``workbench.ingest.ndjson`` (one source for the importer and the
analysis); this module only adapts stored frames to it and picks the evidence.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.ingest.ndjson import assistant_form, naive_assistant_text, reconstruct_assistant_text

NdjsonEvent = tuple[int, str, "bytes | None", "str | None"]


def _event(payload: bytes | None, decoded: str | None) -> dict[str, Any] | None:
    for src in (payload, decoded):
        if not src:
            continue
        try:
            ev = json.loads(src)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(ev, dict):
            return ev
    return None


def assistant_texts(events: list[tuple[int, str, bytes | None, str | None]]) -> tuple[str, str, list[int]]:
    """(correct text, naive text, seqs of the assistant events that repeat text: snapshots and full)."""
    parsed: list[dict[str, Any]] = []
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
        if form == "delta":
            if first_delta is None:
                first_delta = seq
        else:
            repeats.append(seq)
    good = reconstruct_assistant_text(parsed)
    naive = naive_assistant_text(parsed)
    ev_seqs = ([first_delta] if first_delta is not None else []) + repeats
    return good, naive, ev_seqs


def error_results(events: list[tuple[int, str, bytes | None, str | None]]) -> list[tuple[int, dict[str, Any]]]:
    """``result`` events that report an error (is_error or subtype error)."""
    out = []
    for seq, kind, payload, decoded in events:
        if not kind.startswith("result"):
            continue
        ev = _event(payload, decoded)
        if ev is not None and (kind == "result.error" or ev.get("is_error")):
            out.append((seq, ev))
    return out
