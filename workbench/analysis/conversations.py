"""The other sessions of a session's conversation, read once for a batch of sessions.

A rule looks past its own session in three ways: blob ids set in another session of the
conversation are no ``blob_miss`` (``known_blob_ids``); a checkpoint an earlier session received
means the next run_request should carry state (``prior_checkpoint``); a session recorded without
``conversation_id`` is matched through its run_request. Asked per session, each of these reads
every sibling again: an import of 6,000 sessions of one conversation did 6,000 × 6,000 reads. A
``Conversations`` reads the session → conversation map once and each conversation's blob ids and
checkpoints once; ``analyze`` and ``stored.refresh_findings`` share one for all their sessions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container

from google.protobuf.message import DecodeError

from workbench.protocol import kinds
from workbench.protocol.run_request import run_request_facts
from workbench.schema import pb
from workbench.store import analysis_reads as reads
from workbench.store.queries import Reader


class Conversations:
    """Sessions by conversation over one reader; valid while nothing writes frames or sessions."""

    def __init__(self, src: Reader) -> None:
        self.src = src
        self._members: dict[str, list[tuple[str, int | None]]] | None = None
        self._blob_ids: dict[str, dict[str, set[bytes]]] = {}   # conversation -> session -> ids it set
        self._counts: dict[str, Counter[bytes]] = {}              # conversation -> id -> sessions setting it
        self._checkpoints: dict[str, dict[str, int]] = {}
        # whether the database holds OpenAI sessions (bridge findings), read by the first session
        self.bridged: bool | None = None

    def members(self, conversation_id: str) -> list[tuple[str, int | None]]:
        """(session_id, start in epoch µs) of the conversation's sessions, in start order (unknown last)."""
        if self._members is None:
            found: dict[str, dict[str, int | None]] = {}
            for sid, conv, started in reads.session_conversations(self.src):
                if conv:
                    found.setdefault(conv, {})[sid] = started
            # Sessions whose recorder did not fill conversation_id: their run requests name it.
            for r in reads.unlabelled_run_requests(self.src).to_pylist():
                rr = run_request_facts(kinds.RUN_REQUEST, r["payload"])
                if rr is not None and rr.conversation_id:
                    found.setdefault(rr.conversation_id, {})[r["session_id"]] = r["started_at"]
            self._members = {conv: sorted(by.items(), key=lambda kv: (kv[1] is None, kv[1]))
                             for conv, by in found.items()}
        return self._members.get(conversation_id, [])

    def siblings(self, session_id: str, conversation_id: str) -> list[tuple[str, int | None]]:
        """The other sessions of the conversation, with their start time, in start order."""
        return [m for m in self.members(conversation_id) if m[0] != session_id]

    def known_blob_ids(self, conversation_id: str, session_id: str) -> Container[bytes]:
        """Blob ids the other sessions of the conversation set. Each session's ids are read once
        (the asking session's own only when a later session asks: the walk has them already)."""
        sets = self._blob_ids.setdefault(conversation_id, {})
        want = [s for s, _ in self.siblings(session_id, conversation_id) if s not in sets]
        if want:
            for sid in want:
                sets[sid] = set()
            for sid, payload in reads.session_payloads(self.src, want, kinds.KV_SET_BLOB_ARGS):
                try:
                    sets[sid].add(bytes(pb.AgentServerMessage.FromString(payload or b"")
                                        .kv_server_message.set_blob_args.blob_id))
                except DecodeError:
                    continue
            counts = self._counts[conversation_id] = Counter(b for ids in sets.values() for b in ids)
        else:
            counts = self._counts.setdefault(conversation_id, Counter(b for ids in sets.values() for b in ids))
        return _Others(counts, sets.get(session_id, set()))

    def prior_checkpoint(self, session_id: str, conversation_id: str, started: int | None) -> tuple[str, int] | None:
        """(session_id, seq) of the last checkpoint an earlier session of the conversation received:
        of the sessions that started before this one (or whose start is unknown), the latest one."""
        last = self._checkpoints.get(conversation_id)
        if last is None:
            sids = [s for s, _ in self.members(conversation_id)]
            last = self._checkpoints[conversation_id] = dict(
                reads.last_seq_of_kind(self.src, sids, kinds.CHECKPOINT)) if sids else {}
        earlier = [s for s, at in self.siblings(session_id, conversation_id)
                   if s in last and (started is None or at is None or at < started)]
        return (earlier[-1], last[earlier[-1]]) if earlier else None


class _Others(Container[bytes]):
    """Membership in "set by another session": set by more sessions than the asking one alone."""

    def __init__(self, counts: Counter[bytes], own: set[bytes]) -> None:
        self.counts = counts
        self.own = own

    def __contains__(self, blob_id: object) -> bool:
        n = self.counts.get(blob_id, 0) if isinstance(blob_id, bytes) else 0
        return n > (1 if blob_id in self.own else 0)
