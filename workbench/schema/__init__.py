"""The schema overlay (our .proto files for agent.v1 and aiserver.v1) and user protos.

``Schema``, ``SchemaError`` and ``load_schema`` come from ``workbench.schema.loader``, loaded when one
of them is first asked for: the loader brings protobuf's descriptor modules, which a command that
only needs a constant of this package (``workbench sessions`` hashing the overlay's files for the
analysis stamp) must not pay for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.schema.loader import Schema, SchemaError, load_schema

__all__ = ["Schema", "SchemaError", "load_schema"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from workbench.schema import loader  # on first use (see the module doc)

        return getattr(loader, name)
    raise AttributeError(f"module 'workbench.schema' has no attribute {name!r}")
