"""Reading ``GetUsableModels`` answers (the overlay does not model the response message)."""

from __future__ import annotations

from workbench.wire.varint import top_level_fields


def model_ids(body: bytes) -> list[str]:
    """Model ids from a GetUsableModels answer, read schemalessly: each top-level length-delimited
    field 1 is a model whose own field 1 is its id."""
    ids: list[str] = []
    for num, value in top_level_fields(body):
        if num == 1 and isinstance(value, bytes):
            inner = [v for n, v in top_level_fields(value) if n == 1 and isinstance(v, bytes)]
            if inner:
                ids.append(inner[0].decode("utf-8", "replace"))
    return ids
