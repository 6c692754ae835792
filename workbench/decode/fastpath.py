"""Byte-level fast paths of the classifier for the most frequent server frames.

Text/thinking deltas, partial tool calls, tool-call deltas and ``set_blob_args`` make up most of a
stream; reading their few varints by hand is several times faster than a protobuf parse.
``FastPaths.for_schema`` builds them for a schema after checking it still has the layouts they
hard-code (``layout_is``); the ``Decoder`` holds the result and calls it first on the hot path.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from workbench.decode import summary
from workbench.decode.frame import SERVER_MSG, Frame, new_frame
from workbench.schema.loader import Schema
from workbench.wire.varint import read_length_varint as _uvarint


def layout_is(schema: Schema, full_name: str, numbers: dict[int, str]) -> bool:
    """The byte-level fast paths hard-code these numbers; check the schema still has them.

    More fields are fine (ToolCallDelta has a fourth member now): every fast path rejects a tag
    it does not know, so such frames take the protobuf path.
    """
    try:
        desc = schema.descriptor(full_name)
    except KeyError:
        return False
    have = {f.number: f.name for f in desc.fields}
    return all(have.get(number) == name for number, name in numbers.items())


class FastPaths:
    """The byte-level classifiers ``Decoder.classify_agent`` tries before the protobuf path.

    Each accepts only the canonical shape of one frequent server frame,
    with every length accounted for and every string valid UTF-8, i.e. exactly the inputs on which
    the protobuf runtime would succeed with the same values; anything else returns None and takes
    the protobuf path (``Decoder._classify``). Tests compare both paths on valid, mutated and random
    input.
    """

    def __init__(self, text_members: dict[int, tuple[str, str]], partial_ok: bool, delta_ok: bool,
                 exec_server: tuple[Any, str, str] | None = None) -> None:
        # member number → (kind, summary prefix) of the InteractionUpdate text members, and whether
        # the PartialToolCall / ToolCallDelta layouts match the fast paths.
        self.text_members = text_members
        # the same by tag byte (one-byte tags of wire type 2, i.e. ``tag & 0x87 == 0x02``): one lookup
        self.text_tags = {number << 3 | 2: member for number, member in text_members.items() if number < 16}
        self.partial_ok = partial_ok
        self.delta_ok = delta_ok
        # AgentServerMessage's class, its oneof and ExecServerMessage's oneof (``exec_server``)
        self._exec = exec_server
        self._exec_kinds: dict[str, str] = {}

    @classmethod
    def for_schema(cls, schema: Schema) -> FastPaths | None:
        """The fast paths this schema allows; None when it is not the overlay's layout (user protos
        could have renumbered anything, or the KV layout every path shares has moved)."""
        if schema.user is not None or not (
                layout_is(schema, "agent.v1.SetBlobArgs", {1: "blob_id", 2: "blob_data"})
                and layout_is(schema, "agent.v1.KvServerMessage",
                              {1: "id", 2: "get_blob_args", 3: "set_blob_args", 4: "span_context"})):
            return None
        text_members: dict[int, tuple[str, str]] = {}
        server = schema.descriptor(SERVER_MSG)
        if "interaction_update" in server.fields_by_name and layout_is(schema, "agent.v1.TextDelta", {1: "text"}):
            upd = server.fields_by_name["interaction_update"].message_type
            for name, label in summary.TEXT_LABELS.items():
                fd = upd.fields_by_name.get(name)
                if fd is not None and fd.message_type is not None:
                    text_members[fd.number] = (f"interaction_update.{name}", label + " ")
        delta_ok = all(layout_is(schema, name, layout) for name, layout in (
            ("agent.v1.ToolCallDeltaUpdate", {1: "call_id", 2: "tool_call_delta", 3: "model_call_id"}),
            ("agent.v1.ToolCallDelta", {1: "shell_tool_call_delta", 2: "task_tool_call_delta",
                                        3: "edit_tool_call_delta"}),
            ("agent.v1.ShellToolCallDelta", {1: "stdout", 2: "stderr"}),
            ("agent.v1.ShellToolCallStdoutDelta", {1: "content"}),
            ("agent.v1.ShellToolCallStderrDelta", {1: "content"}),
            ("agent.v1.EditToolCallDelta", {1: "stream_content_delta"})))
        partial_ok = layout_is(schema, "agent.v1.PartialToolCall",
                               {1: "call_id", 2: "tool_call", 3: "args_text_delta", 4: "model_call_id"})
        exec_server = None
        top = server.fields_by_name.get("exec_server_message")
        if top is not None and top.number == 2 and top.containing_oneof is not None and top.message_type is not None:
            args = next((o.name for o in top.message_type.oneofs if not o.name.startswith("_")), None)
            if args is not None:
                exec_server = (schema.message_class(SERVER_MSG), top.containing_oneof.name, args)
        return cls(text_members, partial_ok, delta_ok, exec_server)

    def exec_server(self, p: bytes) -> Frame | None:
        """``12 …``: an ExecServerMessage (a tool the client is asked to run).

        Its fields vary too much for a byte-level reader, so the runtime parses it as on the
        protobuf path; only that path's dispatch (which cost a third of these frames' time) is
        skipped, the summary being the same function's. Anything but a parsed exec message with a
        member set (a parse error, another member last on the wire, no member) returns None and
        takes the protobuf path.
        """
        spec = self._exec
        if spec is None:
            return None
        try:
            msg = spec[0].FromString(p)
        except DecodeError:
            return None
        if msg.WhichOneof(spec[1]) != "exec_server_message":
            return None
        sub = msg.exec_server_message
        member = sub.WhichOneof(spec[2])
        if member is None:
            return None
        kind = self._exec_kinds.get(member)
        if kind is None:
            kind = self._exec_kinds[member] = f"exec_server_message.{member}"
        return new_frame(kind, _exec_args(sub, member), p, 0, SERVER_MSG, None, None, sub.id)

    def update(self, p: bytes, n: int) -> Frame | None:
        """``0a L1 <member tag> L2 <member>`` → text_delta / thinking_delta / partial_tool_call."""
        if 5 < n < 0x80 and p[1] == n - 2 and p[3] == n - 4 and p[4] == 0x0A and p[5] == n - 6:
            # ``0a L1 T L2 0a L3 text`` with every length one byte: the most frequent frame of all
            # (a short text delta), with the checks of the general path below folded into one test
            text_member = self.text_tags.get(p[2])
            if text_member is not None:
                try:
                    text = p[6:].decode("utf-8")
                except UnicodeDecodeError:
                    return None
                if len(text) <= _SHORT_TEXT and not ('"' in text or "\\" in text or "\n" in text or "\r" in text):
                    return new_frame(text_member[0], f'{text_member[1]}"{text}"', p, 0, SERVER_MSG)
                return new_frame(text_member[0], text_member[1] + _quote(text), p, 0, SERVER_MSG)
        ln = p[1]  # single-byte lengths inline: most frames are short
        if ln < 0x80:
            i = 2
        elif n > 2 and p[2] < 0x80:  # two bytes (a partial tool call's arguments) inline too
            ln, i = (ln & 0x7F) | p[2] << 7, 3
        else:
            ln, i = _uvarint(p, 1)
        if i + ln != n or i + 1 >= n:
            return None
        tag = p[i]
        ln = p[i + 1]
        if ln < 0x80:
            j = i + 2
        elif i + 2 < n and p[i + 2] < 0x80:
            ln, j = (ln & 0x7F) | p[i + 2] << 7, i + 3
        else:
            ln, j = _uvarint(p, i + 1)
        if j + ln != n:
            return None
        text_member = self.text_tags.get(tag)
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
                return new_frame(text_member[0], f'{text_member[1]}"{text}"', p, 0, SERVER_MSG)
            return new_frame(text_member[0], text_member[1] + _quote(text), p, 0, SERVER_MSG)
        if tag == 0x3A and self.partial_ok:
            # PartialToolCall: 1 call_id, 3 args_text_delta, 4 model_call_id, each at most once and
            # in that order (2 tool_call, a repeat or another order → protobuf path). Unrolled: a
            # loop over the three tags cost a third of this frame's time.
            call_id = delta = ""
            if j < n and p[j] == 0x0A:
                if j + 1 < n and p[j + 1] < 0x80:  # one-byte lengths inline (ids are short)
                    ln = p[j + 1]
                    k = j + 2
                else:
                    ln, k = _uvarint(p, j + 1)
                j = k + ln
                if j > n:
                    return None
                try:
                    call_id = p[k:j].decode("utf-8")
                except UnicodeDecodeError:
                    return None
            if j < n and p[j] == 0x1A:
                if j + 2 < n and (b := p[j + 1]) >= 0x80 and p[j + 2] < 0x80:
                    ln, k = (b & 0x7F) | p[j + 2] << 7, j + 3
                else:
                    ln, k = _uvarint(p, j + 1)
                j = k + ln
                if j > n:
                    return None
                try:
                    delta = p[k:j].decode("utf-8")
                except UnicodeDecodeError:
                    return None
            if j < n and p[j] == 0x22:
                if j + 1 < n and p[j + 1] < 0x80:
                    ln = p[j + 1]
                    k = j + 2
                else:
                    ln, k = _uvarint(p, j + 1)
                j = k + ln
                if j != n:
                    return None
                try:
                    p[k:j].decode("utf-8")
                except UnicodeDecodeError:
                    return None
            if j != n:
                return None
            qid = _QUOTED_IDS.get(call_id)
            if qid is None:
                qid = _quote_id(call_id)
            # summary.partial's quote(tail, 40) inlined: 40 characters at most, so only the escapes can apply;
            # an ellipsis says the text goes on before them
            tail = delta if len(delta) <= 40 else "…" + delta[-39:]
            if '"' in tail or "\\" in tail or "\n" in tail or "\r" in tail:
                tail = _quote(tail, 40)
            else:
                tail = f'"{tail}"'
            return new_frame("interaction_update.partial_tool_call",
                             f"partial {qid} args {len(delta)} chars {tail}",
                             p, 0, SERVER_MSG, None, None, None, call_id or None)
        if tag == 0x7A and self.delta_ok:
            return _fast_tool_delta(p, j, n)
        return None

    def set_blob(self, p: bytes, n: int) -> Frame | None:
        """``22 L1 [08 id] 1a L2 [0a L blob_id] [12 L blob_data]`` → kv_server_message.set_blob_args."""
        # The three lengths that span the blob take two bytes for most blobs (128 B … 16 KiB):
        # read inline like one-byte ones, the reader called only past that.
        b = p[1]
        if b < 0x80:
            ln, i = b, 2
        elif n > 2 and p[2] < 0x80:
            ln, i = (b & 0x7F) | p[2] << 7, 3
        else:
            ln, i = _uvarint(p, 1)
        if i + ln != n or i >= n:
            return None
        kv_id = 0
        if p[i] == 0x08:
            if i + 1 < n and p[i + 1] < 0x80:  # one-byte varints inline (small ids, a 32-byte blob id)
                kv_id = p[i + 1]
                i += 2
            else:
                kv_id, i = _uvarint(p, i + 1)
            if kv_id < 0 or kv_id > 0xFFFFFFFF or i >= n:
                return None
        if p[i] != 0x1A:
            return None
        if i + 2 < n and (b := p[i + 1]) >= 0x80 and p[i + 2] < 0x80:
            ln, i = (b & 0x7F) | p[i + 2] << 7, i + 3
        else:
            ln, i = _uvarint(p, i + 1)
        if i + ln != n:
            return None
        short = "∅"  # summary.short_id of the blob id, without copying the id
        if i < n and p[i] == 0x0A:
            if i + 1 < n and p[i + 1] < 0x80:
                ln = p[i + 1]
                k = i + 2
            else:
                ln, k = _uvarint(p, i + 1)
            i = k + ln
            if i > n:
                return None
            if ln:  # short_id: the id's first two bytes in hex, from a table (no slice, no hex())
                short = _HEX[p[k]] + _HEX[p[k + 1]] + "…" if ln > 1 else _HEX[p[k]] + "…"
        start = n
        if i + 2 < n and p[i] == 0x12:
            b = p[i + 1]
            if b < 0x80:
                ln, start = b, i + 2
            elif p[i + 2] < 0x80:
                ln, start = (b & 0x7F) | p[i + 2] << 7, i + 3
            else:
                ln, start = _uvarint(p, i + 1)
            if start + ln != n:
                return None
            i = n
        elif i < n and p[i] == 0x12:  # a tag and at most one more byte: no room for the length
            ln, start = _uvarint(p, i + 1)
            if start + ln != n:
                return None
            i = n
        if i != n:
            return None
        if start < n and p[start] in _JSON_FIRST:  # summary.sniff_blob's JSON case inlined (the usual blob)
            m = _ROLE_SEARCH(p, start, start + 512)
            if m is None:
                content = "json"
            else:  # "json/<role>" remembered by role (a handful of them)
                content = _JSON_ROLES.get(role := m.group(1)) or _json_role(role)
        else:
            ctype, role_str = summary.sniff_blob_at(p, start)
            content = ctype + "/" + role_str if role_str else ctype
        size = n - start
        return new_frame("kv_server_message.set_blob_args",
                         f"set_blob#{kv_id} {short} {f'{size} B' if size < 1024 else _human_size(size)} {content}",
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
    qid = _QUOTED_IDS.get(call_id)
    if qid is None:
        qid = _quote_id(call_id)
    return new_frame("interaction_update.tool_call_delta", f"tool_call_delta {qid} {inner}",
                 p, 0, SERVER_MSG, None, None, None, call_id or None)


def _json_role(role: bytes) -> str:
    """``"json/" + role`` as ``summary.sniff_blob`` names a JSON blob with that role, remembered."""
    if len(_JSON_ROLES) >= _QUOTED_IDS_MAX:
        _JSON_ROLES.clear()
    content = _JSON_ROLES[role] = "json/" + role.decode()
    return content


def _quote_id(call_id: str) -> str:
    """``quote(call_id, 24)``, remembered in ``_QUOTED_IDS``: a tool call's id recurs in every one
    of its deltas (tens to hundreds of frames), its quoting is then one lookup."""
    if len(_QUOTED_IDS) >= _QUOTED_IDS_MAX:
        _QUOTED_IDS.clear()
    q = _QUOTED_IDS[call_id] = _quote(call_id, 24)
    return q


_JSON_ROLES: dict[bytes, str] = {}
_HEX = tuple(f"{b:02x}" for b in range(256))
_QUOTED_IDS: dict[str, str] = {}
_QUOTED_IDS_MAX = 4096
_DELTA_TAGS = frozenset((0x0A, 0x12, 0x1A))
_quote = summary.quote
_exec_args = summary.TOP_SUMMARIES["exec_server_message"]
_human_size = summary.human_size
_ROLE_SEARCH = summary.ROLE.search
_JSON_FIRST = frozenset(b"{[")
_SHORT_TEXT = summary.MAX_TEXT
