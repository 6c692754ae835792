"""What a capture writer is told when it starts (``WriterConfig``) and whom it tells around each
commit (``CommitListener``): shared by the writer (``writer.py``), the writer process
(``process.py``, ``child.py``) and the addon, without importing the writer itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from workbench.capture.sink import HOLD_BYTES, HOLD_FRAMES


@dataclass
class WriterConfig:
    db_path: str
    flush_interval: float = 0.25
    content: bool = False
    live: bool = True
    stats_path: str | None = None
    hold_frames: int = HOLD_FRAMES
    hold_bytes: int = HOLD_BYTES
    # New session ids derive from this and the flow (a UUID string) instead of being random, so a
    # writer process restarted to replay a batch names its sessions as the one that died did.
    session_ns: str | None = None


class CommitListener(Protocol):
    """Told around each commit which ``Batch`` (``mark``) the writer has handled up to (the
    writer process's confirmations, ``child.py``)."""

    def committing(self, mark: int) -> None: ...

    def committed(self, mark: int) -> None: ...
