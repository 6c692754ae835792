"""What a lossy ``tool_call_completed`` changed in a call's args, in words.

The server's completion McpArgs may omit keys (oversized values) and carry structured values as
strings (``priority: 2`` becomes ``"2"``). ``args_diff`` compares the full args (streamed, exec or
merged) with the completion's and says which keys are gone and which values changed JSON type, so
``completion_args_lossy`` and ``workbench tools`` name the difference instead of printing both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_PREVIEW = 24


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _preview(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str, sort_keys=True)
    return text if len(text) <= _PREVIEW else text[: _PREVIEW - 1] + "…"


@dataclass
class ArgsDiff:
    """Keys the completion omitted, and (key, full value, completion value) whose JSON type changed."""

    omitted: list[str] = field(default_factory=list)
    changed: list[tuple[str, Any, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.omitted or self.changed)

    @property
    def downgraded(self) -> list[str]:
        """Keys whose structured value became a string (what a naive client would send back)."""
        return [k for k, full, lossy in self.changed if isinstance(lossy, str) and not isinstance(full, str)]

    def describe(self) -> str:
        """e.g. ``omitted keys: body; type changes: priority: 2 (number) → "2" (string)``."""
        bits = []
        if self.omitted:
            bits.append("omitted key" + ("s" if len(self.omitted) != 1 else "") + ": " + ", ".join(self.omitted))
        if self.changed:
            bits.append("type change" + ("s" if len(self.changed) != 1 else "") + ": " + ", ".join(
                f"{k}: {_preview(full)} ({json_type(full)}) → {_preview(lossy)} ({json_type(lossy)})"
                for k, full, lossy in self.changed))
        return "; ".join(bits)

    def as_dict(self) -> dict[str, Any]:
        return {"omitted_keys": self.omitted,
                "type_changes": [{"key": k, "from": json_type(full), "to": json_type(lossy)}
                                 for k, full, lossy in self.changed]}


def args_diff(full: Any, completion: Any) -> ArgsDiff:
    """How ``completion`` differs from ``full`` at the top level (both args objects); empty when
    either is not an object. Keys the completion adds are not a loss and are not listed."""
    if not isinstance(full, dict) or not isinstance(completion, dict):
        return ArgsDiff()
    omitted = [k for k in full if k not in completion]
    changed = [(k, full[k], completion[k]) for k in full
               if k in completion and json_type(full[k]) != json_type(completion[k])]
    return ArgsDiff(omitted, changed)
