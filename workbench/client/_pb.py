"""``pb`` with the class lookups cached: ``workbench.schema.pb`` resolves a name on every access
(~8 µs), and the client builds and parses several messages per frame on the hot path."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.schema import pb as _schema_pb


class _Classes:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _schema_pb.message(name)
        setattr(self, name, cls)
        return cls


if TYPE_CHECKING:  # mypy sees the typed stub (workbench/schema/pb.pyi): field names are checked
    from workbench.schema import pb
else:
    pb = _Classes()
