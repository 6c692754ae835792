"""Where protoc finds each well-known type (``google.protobuf.Struct`` → ``google/protobuf/struct.proto``).

Extracted schemas import these files instead of redefining the types: the bundles carry them only
because the protobuf-es runtime does.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

_MODULES = ("any", "api", "duration", "empty", "field_mask", "source_context", "struct", "timestamp", "type",
            "wrappers", "descriptor", "compiler.plugin")


@lru_cache(maxsize=1)
def well_known_files() -> dict[str, str]:
    out: dict[str, str] = {}
    for mod in _MODULES:
        try:
            fd = importlib.import_module(f"google.protobuf.{mod}_pb2").DESCRIPTOR
        except ImportError:  # pragma: no cover - every protobuf runtime ships these
            continue

        def walk(desc: object, scope: str) -> None:
            for name, m in desc.message_types_by_name.items() if hasattr(desc, "message_types_by_name") \
                    else ((n.name, n) for n in desc.nested_types):  # type: ignore[attr-defined]
                out[scope + name] = fd.name
                for e in m.enum_types:
                    out[scope + name + "." + e.name] = fd.name
                walk(m, scope + name + ".")

        walk(fd, fd.package + ".")
        for name in fd.enum_types_by_name:
            out[fd.package + "." + name] = fd.name
    return out
