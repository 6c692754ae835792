"""What the analysis of one session read of the other sessions of the database.

A session's findings depend on more than its own frames: blob ids its siblings set, the last
checkpoint of an earlier session and that session's first prompt, the run requests of sessions
that started later, and whether the database holds OpenAI sessions (``engine._analyze_session``).
An ``Inputs`` filled while a session is analysed keeps each of these answers, so a result computed
before the rest of an import was written can be checked against the database as it ends
(``ahead.FindingsAhead``): when every answer is still the same, and the session itself is too,
analysing it again would find exactly the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field


@dataclass
class Inputs:
    conversation: str | None = None
    started: int | None = None  # epoch µs (analysis_reads.started_at)
    # blob id -> whether another session of the conversation set it, for each id a rule asked about
    asked_blobs: dict[bytes, bool] = field(default_factory=dict)
    prior: tuple[str, int] | None = None
    prompt: str | None = None
    # the later sessions' client inputs, when a rule asked for them (None: never asked)
    later: list[tuple[str, int, bytes]] | None = None
    bridged: bool | None = None
    alone: bool = False  # the only session of its conversation when analysed

    def watch_blobs(self, known: Container[bytes]) -> Container[bytes]:
        return _Asked(known, self.asked_blobs)

    def watch_later(self, get: Callable[[], list[tuple[str, int, bytes]]]
                    ) -> Callable[[], list[tuple[str, int, bytes]]]:
        def watched() -> list[tuple[str, int, bytes]]:
            self.later = get()
            return self.later
        return watched


class _Asked(Container[bytes]):
    """A ``known_blob_ids`` container that notes each answer it gives."""

    def __init__(self, inner: Container[bytes], answers: dict[bytes, bool]) -> None:
        self.inner = inner
        self.answers = answers

    def __contains__(self, blob_id: object) -> bool:
        found = blob_id in self.inner
        if isinstance(blob_id, bytes):
            self.answers[blob_id] = found
        return found
