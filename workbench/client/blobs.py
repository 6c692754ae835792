"""The client's KV blob store: in memory, keyed by blob id (SHA-256 of the data, docs/protocol.md §5)."""

from __future__ import annotations

import hashlib


def blob_id(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


class BlobStore:
    """Blobs the server stored with ``set_blob`` and reads back with ``get_blob``.

    The server chooses the id; ``mismatched`` lists ids that are not the SHA-256 of their data,
    which is worth knowing when hunting blob misses (docs/protocol.md §7, blob_miss) but is not an error.
    """

    def __init__(self) -> None:
        self._blobs: dict[bytes, bytes] = {}
        self.mismatched: list[bytes] = []
        self.misses: list[bytes] = []

    def __len__(self) -> int:
        return len(self._blobs)

    def __contains__(self, key: object) -> bool:
        return key in self._blobs

    def put(self, data: bytes, key: bytes | None = None) -> bytes:
        computed = blob_id(data)
        key = computed if key is None else bytes(key)
        if key != computed:
            self.mismatched.append(key)
        self._blobs[key] = bytes(data)
        return key

    def get(self, key: bytes) -> bytes | None:
        data = self._blobs.get(bytes(key))
        if data is None:
            self.misses.append(bytes(key))
        return data

    def items(self) -> list[tuple[bytes, bytes]]:
        return list(self._blobs.items())
