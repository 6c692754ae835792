"""Generated message classes by short name: ``pb.AgentServerMessage(...)``.

Looks a name up in ``agent.v1`` first, then ``aiserver.v1``, then ``google.protobuf``; the built-in
overlay only (user ``--proto`` files do not change what code builds).
"""

from __future__ import annotations

from typing import Any

from workbench.schema.loader import load_schema

_PACKAGES = ("agent.v1.", "aiserver.v1.", "google.protobuf.")


def message(name: str) -> Any:
    schema = load_schema()
    for pkg in _PACKAGES:
        full = name if "." in name else pkg + name
        if schema.has(full):
            return schema.message_class(full)
    raise AttributeError(f"no message {name!r} in the overlay")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return message(name)
