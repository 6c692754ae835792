"""Where protoc finds each well-known type (``google.protobuf.Struct`` → ``google/protobuf/struct.proto``).

Extracted schemas import these files instead of redefining the types: the bundles carry them only
because the protobuf-es runtime does.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import Any

_MODULES = ("any", "api", "duration", "empty", "field_mask", "source_context", "struct", "timestamp", "type",
            "wrappers", "descriptor", "compiler.plugin")


def _walk(messages: Any, scope: str, file_name: str, out: dict[str, str], enums: set[str]) -> None:
    for m in messages:
        out[scope + m.name] = file_name
        for e in m.enum_types:
            out[scope + m.name + "." + e.name] = file_name
            enums.add(scope + m.name + "." + e.name)
        _walk(m.nested_types, scope + m.name + ".", file_name, out, enums)


_ENUMS: set[str] = set()


def well_known_enums() -> set[str]:
    """Full names of the well-known enums (``google.protobuf.NullValue``, …)."""
    well_known_files()
    return _ENUMS


@lru_cache(maxsize=1)
def well_known_files() -> dict[str, str]:
    out: dict[str, str] = {}
    for mod in _MODULES:
        try:
            fd = importlib.import_module(f"google.protobuf.{mod}_pb2").DESCRIPTOR
        except ImportError:  # pragma: no cover - every protobuf runtime ships these
            continue
        _walk(fd.message_types_by_name.values(), fd.package + ".", fd.name, out, _ENUMS)
        for name in fd.enum_types_by_name:
            out[fd.package + "." + name] = fd.name
            _ENUMS.add(fd.package + "." + name)
    return out
