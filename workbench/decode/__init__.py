"""Decoding: classify frames (hot path) and build named trees (on demand).

The names load on first use: a light submodule (``decode.frame``: the frame record and its
constants, which the store and the command table use) must not pay for protobuf and the schema.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workbench.decode.classify import Decoder, Frame, StreamDecoder, default_decoder
    from workbench.decode.render import fields_of, frame_to_json

_WHERE = {"Decoder": "classify", "Frame": "classify", "StreamDecoder": "classify", "default_decoder": "classify",
          "fields_of": "render", "frame_to_json": "render"}

__all__ = ["Decoder", "Frame", "StreamDecoder", "default_decoder", "fields_of", "frame_to_json"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(f"workbench.decode.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'workbench.decode' has no attribute {name!r}")
