"""``pb`` with the class lookups cached: ``workbench.schema.pb`` resolves a name on every access
(~8 µs), and the client builds and parses several messages per frame on the hot path."""

from __future__ import annotations

from typing import Any

from workbench.schema import pb as _schema_pb


class _Classes:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        cls = _schema_pb.message(name)
        setattr(self, name, cls)
        return cls


pb = _Classes()
