"""JSON as parsed: the one name the package gives a value whose shape is the sender's, not ours.

Records the package defines itself (rows, findings, reports) have their own types; these aliases
are for what arrives or leaves as JSON and is passed on as it is: an OpenAI request or answer body,
a stream-json event, a decoded protobuf tree, a scenario step, a HAR entry, a fixture document.
"""

from __future__ import annotations

from typing import Any, TypeAlias

JsonObject: TypeAlias = dict[str, Any]  # a JSON object as parsed (json.loads) or about to be dumped
