"""Identity of stream-json lines: which stored import a file continues, and which lines it already holds.

A stream-json file only ever grows (the CLI appends events), so a file is recognised by its
beginning. Its *lineage* is named by a hash of its first line; each imported line is stored with
``source_key = ndjson:<lineage>:<line number>:<hash of the line>#0``. Importing a file again:

- the database holds a lineage whose lines agree with the file wherever both have a line (the same
  file, a grown copy, or an import that was killed part-way) → the file continues it, and only the
  lines the database lacks are written;
- a stored lineage with the same first line but different lines after it (``cursor-agent --resume``
  starts its output with the same ``system.init`` line) → a different recording: the lineage is
  named by the first two lines instead, then three, … until the name is free or agrees.

So the same file twice, a grown file and a re-run of a killed import each end with exactly the
lines of one clean import, while two recordings that merely start alike are both kept whole.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from workbench.store.db import Store
from workbench.store.queries import source_keys_with_prefix

HASH_HEX = 16


def line_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:HASH_HEX]


@dataclass
class FileLines:
    """Line numbers and hashes of a file's non-blank lines (compact: files can be large)."""

    numbers: array = field(default_factory=lambda: array("q"))
    hashes: list[str] = field(default_factory=list)

    @classmethod
    def read(cls, path: Path) -> FileLines:
        out = cls()
        with path.open("rb") as fh:
            for lineno, line in enumerate(fh, 1):
                raw = line[:-1] if line.endswith(b"\n") else line
                if not raw.rstrip(b"\r").strip():
                    continue
                out.numbers.append(lineno)
                out.hashes.append(line_hash(raw))
        return out


@dataclass
class Lineage:
    id: str
    stored: set[int]  # line numbers of this file the database already holds

    def key(self, lineno: int, raw: bytes) -> str:
        return f"ndjson:{self.id}:{lineno}:{line_hash(raw)}#0"

    @property
    def continues(self) -> bool:
        return bool(self.stored)


def _stored_lines(store: Store, lineage_id: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for key in source_keys_with_prefix(store, f"ndjson:{lineage_id}:"):
        parts = key.rsplit("#", 1)[0].split(":")
        if len(parts) == 4 and parts[2].isdigit():
            out[int(parts[2])] = parts[3]
    return out


def choose_lineage(store: Store, lines: FileLines) -> Lineage:
    """The lineage this file continues (or the free name it starts)."""
    prefix = hashlib.sha256()
    mine = dict(zip(lines.numbers, lines.hashes, strict=True))
    for h in lines.hashes:
        prefix.update(h.encode())
        candidate = prefix.hexdigest()[:12]
        stored = _stored_lines(store, candidate)
        if not stored:
            return Lineage(candidate, set())
        if all(mine.get(n, h2) == h2 for n, h2 in stored.items()):
            return Lineage(candidate, {n for n in stored if n in mine})
    # Only reachable for a file without lines, or a hash collision in every prefix.
    return Lineage(prefix.hexdigest()[:12] + "-" + hashlib.sha256(b"".join(
        h.encode() for h in lines.hashes)).hexdigest()[:8], set())
