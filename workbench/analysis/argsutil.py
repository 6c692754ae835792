"""Tool-call argument helpers: re-exported from ``workbench.client.args``, their single source.

The analysis must judge a session by exactly the logic a correct client runs, so it never keeps
its own copy of the snapshot-aware accumulation or of the streamed/completion merge.
"""

from __future__ import annotations

import json
from typing import Any

from workbench.client.args import accumulate_args_text, mcp_args_to_json, merge_mcp_args, naive_concat


def parse_json(text: str | None) -> Any:
    """JSON of an args text, or None when it does not parse."""
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


__all__ = ["accumulate_args_text", "mcp_args_to_json", "merge_mcp_args", "naive_concat", "parse_json"]
