"""Decoded trees compared field by field, ids, hashes and times left out (``workbench diff``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from workbench.nesting import load_json
from workbench.report.session import LoadedFrame
from workbench.sessiondiff.model import FieldChange, Options

# Names of fields that differ between any two runs: ids, content hashes, wall-clock times.
IGNORED_FIELD = re.compile(
    r"(^|_)(id|ids|uuid|hash|sha256|checksum|digest|nonce|timestamp|at|ms|time|seed)$", re.IGNORECASE)
# the same in camelCase (JSON inside fields: ``toolCallId``, ``createdAt``)
IGNORED_CAMEL = re.compile(r"[a-z0-9](Id|Ids|Uuid|Hash|Sha256|Checksum|Digest|Nonce|Timestamp|At|Ms|Time)$")
# Values that are ids or content hashes whatever their field is called: a UUID, a SHA-1/SHA-256 in hex.
IGNORED_VALUE = re.compile(r"^(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{40}|[0-9a-f]{64})$",
                           re.IGNORECASE)
_VALUE_CHARS = 120
MAX_JSON_DEPTH = 64   # JSON inside a field nested deeper is compared as its text
# line breaks and tabs inside a value, written as the rest of the CLI writes them (other control
# characters are the printer's: workbench.textsafe, at the output)
_LAYOUT = str.maketrans({"\n": "\\n", "\r": "\\r", "\t": "\\t"})

def digest(f: LoadedFrame, opts: Options) -> int:
    """A frame's content, ids, hashes and times left out, as one number (equal frames, equal numbers)."""
    return hash(repr([(p, v) for p, v, _ in flatten(f.tree, opts)]))


def shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = text.translate(_LAYOUT)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _embedded_json(value: str) -> Any:
    """A string holding a JSON object or array (a prompt blob, tool arguments), parsed; else None."""
    text = value.strip()
    if not (text[:1] in "{[" and text[-1:] in "}]"):
        return None
    try:
        parsed = load_json(text)
    except ValueError:  # not JSON, or nested past the one limit (workbench.nesting)
        return None
    if not isinstance(parsed, dict | list) or _deeper_than(parsed, MAX_JSON_DEPTH):
        return None   # compared as the string it is: flatten walks by recursion
    return parsed


def _deeper_than(doc: Any, limit: int) -> bool:
    stack = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(v, dict):
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
    return False


def _unalignable(part: str) -> bool:
    """A path part the schema did not name: a field number, or a marker of a schemaless value."""
    return part.isdigit() or (part.startswith("$") and part not in ("$text", "$value"))


def flatten(tree: Any, opts: Options, prefix: str = "") -> Iterator[tuple[str, Any, bool]]:
    """(path, leaf value, unalignable) for every leaf of a decoded tree, ignored fields left out."""
    if isinstance(tree, dict):
        if not tree and prefix:
            yield prefix, {}, False
        for k, v in tree.items():
            key = str(k)
            if not opts.compare_ids and (IGNORED_FIELD.search(key) or IGNORED_CAMEL.search(key)):
                continue
            path = f"{prefix}.{key}" if prefix else key
            for p, leaf, odd in flatten(v, opts, path):
                yield p, leaf, odd or _unalignable(key)
    elif isinstance(tree, list):
        if not tree:
            yield prefix, [], False
        for i, v in enumerate(tree):
            yield from flatten(v, opts, f"{prefix}[{i}]")
    elif isinstance(tree, str) and not opts.compare_ids and IGNORED_VALUE.match(tree):
        return
    elif isinstance(tree, str) and (inner := _embedded_json(tree)) is not None:
        # JSON inside a field (KV prompt blobs, arguments): compared key by key, its ids ignored too
        yield from flatten(inner, opts, f"{prefix}{{json}}")
    else:
        yield prefix, tree, False


def compare_trees(fa: LoadedFrame, fb: LoadedFrame, opts: Options) -> tuple[list[FieldChange], list[FieldChange]]:
    """(changed fields, unaligned fields) between two frames of the same kind."""
    la = {p: (v, odd) for p, v, odd in flatten(fa.tree, opts)}
    lb = {p: (v, odd) for p, v, odd in flatten(fb.tree, opts)}
    mismatched = set(_mismatch_paths(fa)) | set(_mismatch_paths(fb))
    changed: list[FieldChange] = []
    unaligned: list[FieldChange] = []
    for path in sorted(la.keys() | lb.keys()):
        va, oa = la.get(path, (None, False))
        vb, ob = lb.get(path, (None, False))
        if path in la and path in lb and va == vb:
            continue
        row: FieldChange = {"a_seq": fa.seq, "b_seq": fb.seq, "kind": fa.kind, "path": path,
                            "a": shown(va) if path in la else None, "b": shown(vb) if path in lb else None}
        if oa or ob or any(path.startswith(m) for m in mismatched):
            unaligned.append(row)
        else:
            changed.append(row)
    return changed, unaligned


def _mismatch_paths(f: LoadedFrame) -> list[str]:
    found = (f.meta or {}).get("schema_mismatch") or []
    return [str(m.get("path")) for m in found if isinstance(m, dict) and m.get("path")]
