"""Which sessions have stored findings, and from which analysis.

A session with no ``findings`` rows is either clean or was never analysed; the ``meta`` table
tells them apart. Each analysed session gets a row ``('analysis:<session_id>', STAMP)`` where the
stamp names the analysis version, the workbench version, the database schema version and the
overlay the payloads were parsed with. A stamp that differs from today's (an upgrade, a new
overlay, a rule change) marks the stored findings stale: ``stored.refresh_findings`` recomputes them.

The stamp lives in ``meta`` rather than a table of its own so that no schema migration is needed:
the ``meta`` key ``analysis:<session_id>`` (read and written by ``store.analysis_reads``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import workbench
from workbench.store import analysis_reads as reads
from workbench.store.analysis_reads import Source
from workbench.store.schema import SCHEMA_VERSION

if TYPE_CHECKING:  # annotations only: `workbench sessions` reads stamps and loads no pyarrow
    from workbench.store.db import Store

# Bump when a rule changes what it finds for the same frames (stored findings are then stale).
# 2: notes (severity "note"); request_context_args judged as the service treats it.
# 3: retried_turn, client_cancelled, framing_lost and their notes (issue 33).
ANALYSIS_VERSION = 3
KEY_PREFIX = "analysis:"


@lru_cache(maxsize=1)
def analysis_stamp() -> str:
    """The identity of today's analysis: ``a2 wb0.1.0 db3 overlay:<hash12>`` (the overlay's .proto
    files hashed: the rules parse payloads with it)."""
    # deferred: `workbench sessions` imports this module for the stamp's key and computes the stamp
    # only when findings are stale-checked (the constants' module loads nothing, unlike the loader)
    from workbench.schema.builtin import BUILTIN_FILES, PROTO_ROOT

    digest = hashlib.sha256()
    for name in BUILTIN_FILES:
        try:
            digest.update((PROTO_ROOT / name).read_bytes())
        except OSError:
            digest.update(b"?")
    return f"a{ANALYSIS_VERSION} wb{workbench.__version__} db{SCHEMA_VERSION} overlay:{digest.hexdigest()[:12]}"


def mark_analysed(store: Store, session_ids: Sequence[str]) -> None:
    """Stamp sessions as analysed by today's analysis (after their rows were written)."""
    if not session_ids:
        return
    stamp = analysis_stamp()
    reads.write_stamp_values(store, KEY_PREFIX, [(sid, stamp) for sid in session_ids])


def stamps(src: Source, session_ids: Sequence[str] | None = None) -> dict[str, str]:
    """session_id → the stamp its stored findings carry (sessions never analysed are absent).
    ``src``: a reader or its ``query`` callable."""
    return reads.stamp_values(src, KEY_PREFIX, session_ids)


def analysis_state(stamp: str | None, status: Any = None) -> str:
    """``current`` | ``stale`` (an older analysis) | ``not analysed`` | ``open`` (still being captured)."""
    if stamp is None:
        return "open" if status == "open" else "not analysed"
    return "current" if stamp == analysis_stamp() else "stale"
