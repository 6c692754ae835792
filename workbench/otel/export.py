"""``workbench export --otlp URL``: stored sessions as GenAI traces, one trace per session.

Sessions still open are skipped (a trace is sent whole, once its session ended); everything read
comes from the store, where the gate already redacted it, so ``--content`` sends nothing the
database does not hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from workbench.errors import CliError
from workbench.otel.sender import Sender
from workbench.otel.spans import session_spans
from workbench.store import otel_reads
from workbench.store.queries import Reader

_RELATIVE = re.compile(r"^(\d+)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: datetime | None = None) -> int:
    """``--since``: an ISO date or time (UTC unless it says otherwise) or an age (``30m``, ``24h``,
    ``7d``, ``2w``) → epoch µs. ``CliError`` naming the option otherwise."""
    m = _RELATIVE.match(text.strip())
    if m:
        start = (now or datetime.now(UTC)) - timedelta(seconds=int(m.group(1)) * _UNIT_S[m.group(2)])
    else:
        try:
            start = datetime.fromisoformat(text.strip())
        except ValueError:
            raise CliError(f"--since {text!r}: not a date, a time (2026-12-01T09:00) or an age (30m, 24h, 7d)") from None
        if start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
    return int(start.timestamp() * 1_000_000)


@dataclass
class Exported:
    sessions: list[str] = field(default_factory=list)
    spans: int = 0
    skipped_open: list[str] = field(default_factory=list)


def export_sessions(reader: Reader, session_ids: Sequence[str], sender: Sender, *, content: bool = False,
                    progress: Callable[[str, int], None] | None = None) -> Exported:
    """Send each session's trace (links to the other side of a bridge included). Stops at the first
    ``OtlpError``: what went before it is in ``Exported``."""
    from workbench.analysis.bridge_join import listing_links  # the bridge's links: only where there is one

    out = Exported()
    links = listing_links(reader, list(session_ids))
    open_ones = set(session_ids) - set(otel_reads.sessions_since(reader, None))
    for sid in session_ids:
        if sid in open_ones:
            out.skipped_open.append(sid)
            continue
        spans = session_spans(reader, sid, content=content, links=links.get(sid))
        out.spans += sender.send(spans)
        out.sessions.append(sid)
        if progress is not None:
            progress(sid, len(spans))
    return out
