"""Tool-call arguments: how a correct client rebuilds them, and McpArgs value encoding.

The server streams a tool call's arguments as ``PartialToolCall.args_text_delta``, which is
usually the *cumulative* JSON text so far rather than an increment (docs/protocol.md §5), and then
sends ``tool_call_completed`` whose ``McpArgs`` map can drop oversized keys or downgrade structured
values to strings (docs/protocol.md §7, completion_args_lossy). The rule: treat snapshots as snapshots,
then merge the completion map into the streamed args instead of letting it overwrite them.

One implementation for everyone: the client and the proxy rebuild args with it, analysis judges a
session by exactly this logic (and by what a naive client would have made of the same deltas:
``naive_concat``, ``naive_junctions``), the simulator streams snapshots like ``snapshots``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from google.protobuf import json_format, struct_pb2
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from workbench.jsontypes import JsonObject
from workbench.nesting import load_json


def accumulate_args_text(previous: str, delta: str) -> str:
    """One step of snapshot-aware accumulation.

    A delta that extends what we already have is a cumulative snapshot and replaces it; anything
    else is a genuine increment and is appended.
    """
    if not delta:
        return previous
    if delta.startswith(previous):
        return delta
    return previous + delta


def accumulate_all(deltas: Iterable[str]) -> str:
    """Fold a whole sequence of ``args_text_delta`` values with :func:`accumulate_args_text`."""
    text = ""
    for d in deltas:
        text = accumulate_args_text(text, d)
    return text


def naive_concat(deltas: Iterable[str]) -> str:
    """What buggy clients do: treat every snapshot as an increment (garbles cumulative streams)."""
    return "".join(deltas)


def naive_junctions(deltas: Sequence[str], width: int = 12) -> list[str]:
    """Text only ``naive_concat`` produces: where one snapshot is glued to the next that repeats it
    (its last ``width`` characters followed by the next one's first ``width``)."""
    out = []
    for prev, cur in zip(deltas, deltas[1:], strict=False):
        if prev and cur.startswith(prev):
            out.append(prev[-width:] + cur[:width])
    return out


def snapshots(text: str, n: int) -> list[str]:
    """``text`` streamed as ``n`` cumulative snapshots (each a longer prefix, the last the whole
    text), the way the service sends ``args_text_delta``."""
    n = max(1, n)
    cuts = sorted({max(1, len(text) * i // n) for i in range(1, n + 1)})
    return [text[:c] for c in cuts]


def parse_json(text: str | None) -> Any:
    """The JSON value of an args text (any JSON, not only an object), or None when it does not parse."""
    if not text:
        return None
    try:
        return load_json(text)
    except ValueError:  # not JSON, or nested past the limit every reader shares
        return None


def parse_args_text(text: str) -> JsonObject | None:
    """The streamed args as a dict, or None when the text is not a complete JSON object."""
    if not text.strip():
        return None
    try:
        doc = load_json(text)
    except ValueError:  # not JSON, or nested past the limit every reader shares
        return None
    return doc if isinstance(doc, dict) else None


def _is_structured(value: Any) -> bool:
    return not isinstance(value, str)


def merge_mcp_args(streamed: Mapping[str, Any] | None, completion: Mapping[str, Any] | None) -> JsonObject:
    """Merge the completion frame's McpArgs into the streamed args.

    - keys only the stream has are kept (the completion map omits oversized values);
    - keys only the completion has are added;
    - when both have a key, the completion wins, except that a streamed structured value (object,
      array, number, bool, null) beats a completion string: the completion downgrades values it
      could not re-encode to their raw string form.
    """
    streamed = streamed or {}
    completion = completion or {}
    out: JsonObject = {}
    for key, value in streamed.items():
        if key not in completion:
            out[key] = value
            continue
        other = completion[key]
        if _is_structured(value) and isinstance(other, str):
            out[key] = value
        else:
            out[key] = other
    for key, value in completion.items():
        if key not in out:
            out[key] = value
    return out


def map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """A JSON value (dicts, lists, scalars) with ``leaf`` applied to every scalar; keys and shape stay."""
    if isinstance(value, dict):
        return {k: map_leaves(v, leaf) for k, v in value.items()}
    if isinstance(value, list):
        return [map_leaves(v, leaf) for v in value]
    return leaf(value)


def _int_if_integral(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


def _plain_number(value: Any) -> Any:
    """google.protobuf.Value stores every number as a double; give integers back as ints."""
    return map_leaves(value, _int_if_integral)


def decode_value(data: bytes) -> Any:
    """One McpArgs map value: a serialized google.protobuf.Value, else UTF-8 text (docs/protocol.md §5)."""
    msg = struct_pb2.Value()
    try:
        msg.ParseFromString(data)
    except DecodeError:
        return data.decode("utf-8", "replace")
    if msg.WhichOneof("kind") is None or len(UnknownFieldSet(msg)):
        if not data:
            return None
        return data.decode("utf-8", "replace")
    return _plain_number(json_format.MessageToDict(msg))


def encode_value(value: Any) -> bytes:
    """The inverse of :func:`decode_value`: a JSON value as a serialized google.protobuf.Value."""
    msg = struct_pb2.Value()
    json_format.ParseDict(value, msg)
    return bytes(msg.SerializeToString())


def mcp_args_to_json(args: Mapping[str, bytes]) -> JsonObject:
    """Decode an ``McpArgs.args`` map (each value a serialized Value, fallback UTF-8)."""
    return {key: decode_value(bytes(raw)) for key, raw in args.items()}


def json_to_mcp_args(doc: Mapping[str, Any]) -> dict[str, bytes]:
    """Encode a JSON object as an ``McpArgs.args`` map."""
    return {key: encode_value(value) for key, value in doc.items()}
