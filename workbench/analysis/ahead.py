"""Findings of an import's sessions computed while the import still runs.

A packet capture writes most of its sessions while tshark still dissects the file
(``workbench.ingest.pcap_early``); their findings used to wait until the whole import was over,
then cost about seven queries per session, one session after another. A ``FindingsAhead`` analyses
the sessions handed to it (``add``) whenever the importer has time to spare (``work``: the reader
has caught up with tshark), and keeps each result with what it read of other sessions
(``analysis.inputs``) and a signature of the session itself (``session_signatures``).

At the end, ``stored.refresh_findings`` takes a result as it is only when nothing it depends on
changed after it was computed (``still_valid``): the session and the earlier session whose
checkpoint it saw are unchanged, every blob id it asked about is known (or not) as before, its
earlier checkpoint is the same, the later sessions' inputs a rule read are the same, and no OpenAI
session (whose bridge findings need the other side) is in the database. Any other session is
analysed again at the end, so the stored rows are those a refresh after the whole import stores.
Nothing is written before the end: an import that fails leaves no findings behind.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.analysis.bridge import any_bridge_sessions
from workbench.analysis.conversations import Conversations
from workbench.analysis.engine import LATER_LIMIT, analyze_session, prior_of
from workbench.analysis.inputs import Inputs
from workbench.analysis.model import AnalysisResult, Config
from workbench.store import analysis_reads as reads
from workbench.store.db import Store

log = logging.getLogger("workbench.analysis")


@dataclass
class _Done:
    result: AnalysisResult
    inputs: Inputs
    # the session and the one whose checkpoint it saw, as they were when it was analysed
    signatures: dict[str, tuple[Any, ...]] = field(default_factory=dict)


class FindingsAhead:
    """Sessions analysed ahead of the end of an import (see the module docstring)."""

    def __init__(self, store: Store, config: Config | None = None, *, budget_s: float | None = None,
                 batch: int = 1) -> None:
        self.store = store
        self.config = config
        self.budget_s = budget_s  # what ``work`` may spend in all (the import's findings budget)
        # sessions to wait for before working (``due``): each call of ``work`` reads the database's
        # conversations and the signatures once, a cost that one session at a time paid again and again
        self.batch = batch
        self.pending: list[str] = []
        self.done: dict[str, _Done] = {}
        self.spent = 0.0  # seconds spent analysing, counted against the import's budget at the end
        self.failed = False

    def add(self, session_ids: Iterable[str]) -> None:
        """Sessions written and committed, to analyse when there is time (``work``)."""
        self.pending.extend(s for s in session_ids if s not in self.done)

    def due(self) -> bool:
        """Whether enough sessions wait (``batch``) for ``work`` to be worth a call."""
        return len(self.pending) >= self.batch and not self.failed

    def work(self, budget_s: float) -> list[str]:
        """Analyse pending sessions for about ``budget_s`` (one session is never cut short); returns
        those analysed. Never raises: a failure is logged and the rest waits for the end."""
        if self.failed or not self.pending:
            return []
        if self.budget_s is not None and self.spent >= self.budget_s:
            return []
        start = time.monotonic()
        analysed: list[str] = []
        try:
            convs = Conversations(self.store)  # valid for this call: nothing writes meanwhile
            finished = set(reads.session_ids(self.store, finished=True, among=self.pending))
            while self.pending and (not analysed or time.monotonic() - start < budget_s):
                sid = self.pending.pop(0)
                if sid not in finished or sid in self.done:
                    continue
                inputs = Inputs()
                try:
                    result = analyze_session(self.store, sid, self.config, final=True, conversations=convs,
                                             inputs=inputs)
                except Exception as exc:  # analysed again at the end, where its failure is logged
                    log.debug("session %s: findings ahead of the import's end failed: %s", sid, exc)
                    continue
                self.done[sid] = _Done(result, inputs)
                analysed.append(sid)
            watched = {s for sid in analysed for s in self._watched(sid)}
            signatures = reads.session_signatures(self.store, sorted(watched))
            for sid in analysed:
                d = self.done[sid]
                d.signatures = {s: signatures.get(s, ()) for s in self._watched(sid)}
        except Exception as exc:
            log.warning("findings ahead of the import's end: %s; they are stored at the end", exc)
            self.failed = True
            self.done.clear()
        finally:
            self.spent += time.monotonic() - start
        return analysed

    def _watched(self, sid: str) -> list[str]:
        prior = self.done[sid].inputs.prior
        return [sid] if prior is None or prior[0] == sid else [sid, prior[0]]

    def still_valid(self, session_ids: Sequence[str], convs: Conversations) -> dict[str, AnalysisResult]:
        """The results of ``session_ids`` computed ahead that analysing them now would give again
        (``convs``: the database as it is now, shared with the sessions analysed again)."""
        try:
            return self._still_valid([s for s in session_ids if s in self.done], convs)
        except Exception as exc:  # they are analysed again: a failure here must not cost the findings
            log.warning("findings computed ahead not checked: %s; analysing those sessions again", exc)
            return {}

    def _still_valid(self, mine: list[str], convs: Conversations) -> dict[str, AnalysisResult]:
        if not mine or self.failed:
            return {}
        store = self.store
        if convs.bridged is None:
            convs.bridged = any_bridge_sessions(store)
        if convs.bridged:  # a bridge's findings need its other side: analysed again
            return {}
        now = reads.session_signatures(store, sorted({s for sid in mine for s in self.done[sid].signatures}))
        out: dict[str, AnalysisResult] = {}
        for sid in mine:
            d = self.done[sid]
            seen = d.inputs
            if seen.bridged or not d.signatures or any(now.get(s) != sig for s, sig in d.signatures.items()):
                continue
            if seen.conversation:
                known = convs.known_blob_ids(seen.conversation, sid)
                if any((b in known) != v for b, v in seen.asked_blobs.items()):
                    continue
                if prior_of(store, convs, sid, seen.conversation, Inputs(started=seen.started)) != seen.prior:
                    continue
                if seen.alone and convs.siblings(sid, seen.conversation):
                    continue  # analysed alone in its conversation; a later session (a retry?) came since
            if seen.later is not None and reads.later_client_inputs(store, sid, LATER_LIMIT) != seen.later:
                continue
            out[sid] = d.result
        return out
