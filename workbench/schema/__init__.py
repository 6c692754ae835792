"""The schema overlay (our .proto files for agent.v1 and aiserver.v1) and user protos."""

from workbench.schema.loader import Schema, SchemaError, load_schema

__all__ = ["Schema", "SchemaError", "load_schema"]
