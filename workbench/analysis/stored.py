"""Findings stored when a session ends: the hook capture, import and the client's recorder call.

``refresh_findings(store_or_path, session_ids)`` runs the same analysis as ``workbench diagnose``
on finished sessions and replaces their ``blobs``, ``tool_calls`` and ``findings`` rows, stamping
them (``stamp``) so a later reader can tell "clean" from "never analysed" and recompute findings
an older analysis wrote (``refresh_stale``). It never raises: a capture or an import must not fail
because its diagnosis did; the failure is logged and the sessions stay "not analysed".

Callers: the import command once its batches are committed; the capture writer on its own thread
after it commits a session's end (never on the proxy's event loop); the client's ``--record``
when its recording closes; ``workbench sessions`` for sessions whose stamp is missing or stale.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from workbench.analysis.ahead import FindingsAhead
from workbench.analysis.conversations import Conversations
from workbench.analysis.engine import analyze_session, write_results
from workbench.analysis.model import AnalysisResult, Config
from workbench.analysis.stamp import analysis_stamp, stamps
from workbench.store import analysis_reads as reads
from workbench.store.db import Store
from workbench.store.live import sidecar_path
from workbench.store.schema import SCHEMA_VERSION, current_version

log = logging.getLogger("workbench.analysis")


def refresh_findings(store_or_path: Store | str | Path, session_ids: Sequence[str] | None = None,
                     config: Config | None = None, budget_s: float | None = None,
                     ahead: FindingsAhead | None = None) -> dict[str, AnalysisResult]:
    """Analyse finished sessions (all when None) and store their rows and stamps. Sessions still
    open are skipped (their findings are stored when they end). ``budget_s``: stop starting new
    sessions once that much time is spent (the others stay "not analysed", shown as such; one
    session is never cut short). ``ahead``: results computed while an import ran, taken as they are
    where still valid (``analysis.ahead``); the time they took counts against ``budget_s``.
    Returns what was stored; {} on failure (logged)."""
    own = not isinstance(store_or_path, Store)
    try:
        store = Store(str(store_or_path)) if own else store_or_path
    except Exception as exc:
        log.warning("findings not stored: %s", exc)
        return {}
    assert isinstance(store, Store)
    try:
        if session_ids is None:
            ids = reads.session_ids(store, finished=True)
        else:
            wanted = list(dict.fromkeys(session_ids))
            finished = set(reads.session_ids(store, finished=True, among=wanted))
            ids = [s for s in wanted if s in finished]
        results: dict[str, AnalysisResult] = {}
        convs = Conversations(store)  # the siblings of the sessions, read once for all of them
        spent = ahead.spent if ahead is not None else 0.0
        deadline = None if budget_s is None else time.monotonic() + budget_s - spent
        valid = ahead.still_valid(ids, convs) if ahead is not None and ahead.config is config else {}
        if ahead is not None:
            log.debug("findings: %d of %d sessions analysed ahead still valid", len(valid), len(ids))
        left = 0
        for sid in ids:
            if sid in valid:
                results[sid] = valid[sid]
                continue
            if left or (deadline is not None and time.monotonic() > deadline):
                left += 1
                continue
            try:
                results[sid] = analyze_session(store, sid, config, final=True, conversations=convs)
            except Exception as exc:  # one session the rules cannot read must not cost the others
                log.warning("session %s: findings not stored: %s", sid, exc)
        if left:
            log.info("findings of %d of %d sessions stored within %.0f s; the others are not analysed "
                     "(workbench diagnose --all stores them)", len(results), len(ids), budget_s)
        write_results(store, list(results.values()))
        return results
    except Exception as exc:
        log.warning("findings not stored: %s", exc)
        return {}
    finally:
        if own:
            store.close()


def stale_sessions(store: Store) -> list[str]:
    """Finished sessions whose findings were never stored or come from another analysis."""
    current = analysis_stamp()
    have = stamps(store)
    return [s for s in reads.session_ids(store, finished=True) if have.get(s) != current]


def refresh_stale(store: Store, config: Config | None = None) -> list[str]:
    """Recompute the findings of ``stale_sessions``; returns their ids."""
    ids = stale_sessions(store)
    if ids:
        refresh_findings(store, ids, config)
    return ids


@dataclass
class _HookState:
    """Per capture store: what each session looked like when its findings were stored (a session
    that changes afterwards, late frames after its end, is analysed again), since when a session has
    waited, and the commit count at the previous call (to tell a busy tick from an idle one)."""

    seen: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    waiting: dict[str, float] = field(default_factory=dict)
    committed: int = -1


_STATE: weakref.WeakKeyDictionary[Store, _HookState] = weakref.WeakKeyDictionary()
# At the capture's stop, the analysis waits at most this long; sessions left over stay "not
# analysed" until `workbench sessions` or `diagnose` stores their findings.
STOP_BUDGET_S = 20.0
# An import or a listing analyses for at most this long (an import of thousands of sessions of one
# conversation costs each session a look at all its siblings); the rest stay "not analysed".
IMPORT_BUDGET_S = 30.0
LISTING_BUDGET_S = 10.0
# The analysis is Python work on the writer thread, and the GIL is shared with the proxy's event
# loop: it runs on ticks that committed no frame (the capture is idle), for at most about
# TICK_BUDGET_S per tick (one session is never cut short). Under constant traffic a session that
# has waited MAX_WAIT_S is analysed anyway, one per tick.
TICK_BUDGET_S = 0.5
MAX_WAIT_S = 10.0


def refresh_ended(sink: Any, *, final: bool = False) -> list[str]:
    """The capture writer's hook, called on its own thread right after a commit: store the findings
    of the sessions of this capture that have ended (status no longer ``open``) since they were last
    analysed, when the capture is idle (see ``TICK_BUDGET_S``, ``MAX_WAIT_S``). ``sink`` is the
    capture's sink (``store``, ``recorder.sessions``, ``frames_committed``); in spool mode (no
    store) nothing is analysed. ``final``: the capture is stopping (bounded by ``STOP_BUDGET_S``)."""
    store = getattr(sink, "store", None)
    recorder = getattr(sink, "recorder", None)
    if not isinstance(store, Store) or recorder is None:
        return []
    state = _STATE.setdefault(store, _HookState())
    committed = int(getattr(sink, "frames_committed", 0))
    busy = committed != state.committed and not final
    state.committed = committed
    now = time.monotonic()
    due = []
    for sid, info in list(recorder.sessions.items()):
        if info.status == "open":
            continue
        sig = (info.status, info.error, info.frame_count, info.ended_at)
        if state.seen.get(sid) != sig:
            due.append((sid, sig, state.waiting.setdefault(sid, now)))
    if not due:
        return []
    if busy:
        due = [d for d in due if now - d[2] >= MAX_WAIT_S][:1]
    deadline = now + (STOP_BUDGET_S if final else TICK_BUDGET_S)
    done: list[str] = []
    for sid, sig, _since in due:
        if done and time.monotonic() > deadline:
            if final:
                log.warning("capture stopping: findings of %d session(s) not stored yet (workbench sessions or "
                            "diagnose stores them)", len(due) - len(done))
            break
        refresh_findings(store, [sid])
        state.seen[sid] = sig
        state.waiting.pop(sid, None)
        done.append(sid)
    return done


def refresh_listing(db_path: str, session_ids: Sequence[str]) -> list[str]:
    """For ``workbench sessions``: store the findings of finished sessions an upgrade made stale or
    nobody analysed, when the file can be written (no capture holds it) and is already at today's
    schema (a listing never migrates a file). Returns the sessions stored; [] when it could not."""
    if not session_ids or sidecar_path(db_path).exists():
        return []
    try:
        con = duckdb.connect(db_path, read_only=True)
        try:
            version = current_version(con)
        finally:
            con.close()
    except Exception:
        return []
    if version != SCHEMA_VERSION:
        return []
    try:
        store = Store(db_path)
    except Exception:  # another process holds the file: the listing says "not analysed" / "stale"
        return []
    try:
        return list(refresh_findings(store, session_ids, budget_s=LISTING_BUDGET_S))
    finally:
        store.close()
