"""Streamed steps compared as the text they stream, with bounded character-level work.

A model's answer comes as thousands of small deltas, cut differently on every run. Two such steps
are compared on the text their frames add up to (every leaf of every frame, in order, ids left
out): equal texts are one string comparison (C speed), whatever the number of frames. When they
differ, where they first differ is found by comparing blocks, and only a window of ``CONTEXT``
characters before it and ``SHOWN`` after it is shown on each side: no character-level alignment
of whole texts, so a 100 MB answer costs a linear scan, never a quadratic one.
"""

from __future__ import annotations

from workbench.protocol import kinds

CONTEXT = 20     # characters shown before the first difference
SHOWN = 60       # ... and from it on
_BLOCK = 4096

# kinds whose frames are pieces of one streamed text (delta runs)
_STREAMED = frozenset({kinds.TEXT_DELTA, kinds.THINKING_DELTA, kinds.TOKEN_DELTA, kinds.TOOL_CALL_DELTA,
                       kinds.PARTIAL_TOOL_CALL, kinds.SHELL_OUTPUT_DELTA, kinds.OPENAI_CONTENT,
                       kinds.OPENAI_TOOL_CALLS, kinds.OPENAI_REASONING})


def is_streamed(kind: str) -> bool:
    return kind in _STREAMED or kind.endswith("_delta")


def first_difference(a: str, b: str) -> int:
    """The length of the common prefix of ``a`` and ``b``: block comparisons, then one block by character."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i:i + _BLOCK] == b[i:i + _BLOCK]:
        i += _BLOCK
    i = min(i, n)
    end = min(i + _BLOCK, n)
    while i < end and a[i] == b[i]:
        i += 1
    return i


def window(text: str, at: int) -> str:
    """The part of ``text`` around ``at`` that is shown, with ``…`` where it was cut."""
    lo, hi = max(0, at - CONTEXT), min(len(text), at + SHOWN)
    return ("…" if lo else "") + text[lo:hi] + ("…" if hi < len(text) else "")
