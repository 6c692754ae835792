"""Byte-level fast paths of the classifier for the most frequent server frames.

Text/thinking deltas, partial tool calls, tool-call deltas and ``set_blob_args`` make up most of a
stream; reading their few varints by hand is several times faster than a protobuf parse. They are a
mixin of ``Decoder`` (not functions it calls) so the hot path keeps exactly one method call per frame.
``Decoder.__init__`` sets the tables they read after checking the schema still has the layout they
hard-code (``_layout_is``).
"""

from __future__ import annotations

from workbench.decode import summary
from workbench.decode.frame import SERVER_MSG, Frame
from workbench.wire.varint import read_length_varint as _uvarint


class FastPaths:
    """The byte-level classifiers ``Decoder.classify_agent`` tries before the protobuf path.

    Each accepts only the canonical shape of one frequent server frame,
    with every length accounted for and every string valid UTF-8, i.e. exactly the inputs on which
    the protobuf runtime would succeed with the same values; anything else returns None and takes
    the protobuf path (``_classify``). Tests compare both paths on valid, mutated and random input.
    """

    # Set by ``Decoder.__init__``: member number → (kind, summary prefix) of the InteractionUpdate
    # text members, and whether the PartialToolCall / ToolCallDelta layouts match the fast paths.
    _text_members: dict[int, tuple[str, str]]
    _partial_ok: bool
    _delta_ok: bool

    def _fast_update(self, p: bytes, n: int) -> Frame | None:
        """``0a L1 <member tag> L2 <member>`` → text_delta / thinking_delta / partial_tool_call."""
        ln = p[1]  # single-byte lengths inline: most frames are short
        if ln < 0x80:
            i = 2
        else:
            ln, i = _uvarint(p, 1)
        if i + ln != n or i + 1 >= n:
            return None
        tag = p[i]
        ln = p[i + 1]
        if ln < 0x80:
            j = i + 2
        else:
            ln, j = _uvarint(p, i + 1)
        if j + ln != n:
            return None
        text_member = self._text_members.get(tag >> 3) if tag & 0x87 == 0x02 else None
        if text_member is not None:
            if ln == 0:
                text = ""
            else:
                if p[j] != 0x0A or j + 1 >= n:
                    return None
                ln = p[j + 1]
                if ln < 0x80:
                    k = j + 2
                else:
                    ln, k = _uvarint(p, j + 1)
                if k + ln != n:
                    return None
                try:
                    text = p[k:].decode("utf-8")
                except UnicodeDecodeError:
                    return None
            # quote() inlined for the most frequent frame: short text that needs no escape
            if len(text) <= _SHORT_TEXT and not ('"' in text or "\\" in text or "\n" in text or "\r" in text):
                return Frame(text_member[0], f'{text_member[1]}"{text}"', p, 0, SERVER_MSG)
            return Frame(text_member[0], text_member[1] + _quote(text), p, 0, SERVER_MSG)
        if tag == 0x3A and self._partial_ok:
            # PartialToolCall: 1 call_id, 3 args_text_delta, 4 model_call_id (2 tool_call → slow path)
            call_id = delta = ""
            last = 0
            while j < n:
                t = p[j]
                if t not in _PARTIAL_TAGS or t <= last:
                    return None
                last = t
                if j + 1 < n and p[j + 1] < 0x80:
                    ln = p[j + 1]
                    k = j + 2
                else:
                    ln, k = _uvarint(p, j + 1)
                j = k + ln
                if j > n:
                    return None
                try:
                    value = p[k:j].decode("utf-8")
                except UnicodeDecodeError:
                    return None
                if t == 0x0A:
                    call_id = value
                elif t == 0x1A:
                    delta = value
            if j != n:
                return None
            return Frame("interaction_update.partial_tool_call",
                         f"partial {_quote(call_id, 24)} args {len(delta)} chars {_quote(delta[-40:], 40)}",
                         p, 0, SERVER_MSG, None, None, None, call_id or None)
        if tag == 0x7A and self._delta_ok:
            return _fast_tool_delta(p, j, n)
        return None

    def _fast_set_blob(self, p: bytes, n: int) -> Frame | None:
        """``22 L1 [08 id] 1a L2 [0a L blob_id] [12 L blob_data]`` → kv_server_message.set_blob_args."""
        ln, i = _uvarint(p, 1)
        if i + ln != n or i >= n:
            return None
        kv_id = 0
        if p[i] == 0x08:
            kv_id, i = _uvarint(p, i + 1)
            if kv_id < 0 or kv_id > 0xFFFFFFFF or i >= n:
                return None
        if p[i] != 0x1A:
            return None
        ln, i = _uvarint(p, i + 1)
        if i + ln != n:
            return None
        blob_id = b""
        if i < n and p[i] == 0x0A:
            ln, k = _uvarint(p, i + 1)
            i = k + ln
            if i > n:
                return None
            blob_id = p[k:i]
        start = n
        if i < n and p[i] == 0x12:
            ln, start = _uvarint(p, i + 1)
            if start + ln != n:
                return None
            i = n
        if i != n:
            return None
        # sniff_blob only ever looks at the first 4 KiB: no copy of the whole blob
        ctype, role = summary.sniff_blob(p[start : start + 4096])
        return Frame("kv_server_message.set_blob_args",
                     f"set_blob#{kv_id} {summary.short_id(blob_id)} {summary.human_size(n - start)} "
                     f"{ctype + '/' + role if role else ctype}",
                     p, 0, SERVER_MSG, None, None, kv_id)


def _one_string(p: bytes, i: int, end: int) -> bool:
    """``p[i:end]`` is empty or exactly one field 1 holding valid UTF-8 (a one-string message)."""
    if i == end:
        return True
    if p[i] != 0x0A:
        return False
    ln, k = _uvarint(p, i + 1)
    if k + ln != end:
        return False
    try:
        p[k:end].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _fast_tool_delta(p: bytes, j: int, n: int) -> Frame | None:
    """ToolCallDeltaUpdate at ``p[j:n]``: 1 call_id, 2 tool_call_delta (shell stdout/stderr or
    edit; a task delta nests a whole InteractionUpdate → protobuf path), 3 model_call_id."""
    call_id = ""
    inner = "?"
    last = 0
    while j < n:
        t = p[j]
        if t not in _DELTA_TAGS or t <= last:
            return None
        last = t
        ln, k = _uvarint(p, j + 1)
        j = k + ln
        if j > n:
            return None
        if t == 0x12:  # ToolCallDelta: empty, or exactly one shell/edit member
            if k < j:
                member = p[k]
                ln, m = _uvarint(p, k + 1)
                if m + ln != j:
                    return None
                if member == 0x0A:  # shell: empty, or exactly one stdout/stderr
                    if m < j:
                        if p[m] not in (0x0A, 0x12):
                            return None
                        ln, q = _uvarint(p, m + 1)
                        if q + ln != j or not _one_string(p, q, j):
                            return None
                    inner = "shell_tool_call_delta"
                elif member == 0x1A:
                    if not _one_string(p, m, j):
                        return None
                    inner = "edit_tool_call_delta"
                else:
                    return None
        else:
            try:
                value = p[k:j].decode("utf-8")
            except UnicodeDecodeError:
                return None
            if t == 0x0A:
                call_id = value
    if j != n:
        return None
    return Frame("interaction_update.tool_call_delta", f"tool_call_delta {_quote(call_id, 24)} {inner}",
                 p, 0, SERVER_MSG, None, None, None, call_id or None)


_PARTIAL_TAGS = frozenset((0x0A, 0x1A, 0x22))
_DELTA_TAGS = frozenset((0x0A, 0x12, 0x1A))
_quote = summary.quote
_SHORT_TEXT = summary.MAX_TEXT
