"""How deep nested input is read: one limit for protobuf messages and JSON documents.

Anything the wire carries can nest without end (``[[[[…`` in an OpenAI body, a message inside a
message inside …). Reading it with recursive code (``json.loads``, the walks of redaction and of the
views, ``json.dumps``) then dies with a ``RecursionError`` somewhere near the interpreter's own
limit, a different place in each reader. So every reader stops at one named depth instead:
``NESTING_LIMIT``, the protobuf runtime's own (upb refuses deeper messages; ``decode.lenient`` walks
the wire format to the same depth). A JSON document deeper than that is not parsed at all: its
reader gets ``TooDeep`` (a ``ValueError``, like any other JSON that does not parse) and keeps the
bytes with an error, as it keeps any body it cannot read. Legitimate documents are far shallower
(an OpenAI request with tool schemas nests about 10 levels).
"""

from __future__ import annotations

import json
from typing import Any

NESTING_LIMIT = 100


class TooDeep(ValueError):
    """A document nested deeper than ``NESTING_LIMIT`` (its message says so)."""


def too_deep_message(limit: int = NESTING_LIMIT) -> str:
    return f"JSON nested too deeply: deeper than {limit} levels (the nesting limit), not parsed"


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether a parsed value nests past ``limit`` (a walk with a stack of its own, not recursion)."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((v, depth + 1) for v in children if isinstance(v, dict | list))
    return False


def load_json(data: bytes | bytearray | str, limit: int = NESTING_LIMIT) -> Any:
    """``json.loads`` that never raises ``RecursionError`` and refuses documents nested past ``limit``.

    Raises ``ValueError`` for anything that is not JSON (``UnicodeDecodeError`` and
    ``json.JSONDecodeError`` are ValueErrors) and ``TooDeep`` for a document nested too deeply. A
    document with fewer brackets than the limit cannot be too deep: it is parsed and returned
    without the walk (nearly every OpenAI event).
    """
    if not isinstance(data, bytes | bytearray | str):
        raise TypeError(f"load_json expects bytes or str, not {type(data).__name__}")
    opens = data.count("[") + data.count("{") if isinstance(data, str) else data.count(b"[") + data.count(b"{")
    try:
        doc = json.loads(data)
    except RecursionError:  # the C scanner's own guard, near the interpreter's limit: clean to catch
        raise TooDeep(too_deep_message(limit)) from None
    if opens > limit and isinstance(doc, dict | list) and _deeper_than(doc, limit):
        raise TooDeep(too_deep_message(limit))
    return doc
