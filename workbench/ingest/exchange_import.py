"""Importing recorded exchanges: decode each agent exchange, group them into sessions, write what is new.

The pipeline that flow files, HAR and packet captures share. Decoding one exchange is
``workbench.ingest.exchange``; grouping a stream with its BidiAppends and ordering its frames is
``workbench.ingest.runs``; writing only what the store does not hold yet is
``workbench.ingest.identity``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.decode.classify import Decoder
from workbench.ingest.exchange import Exchange, Part, decode_exchange, sane_time
from workbench.ingest.identity import PlanWriter, WriteOutcome
from workbench.ingest.progress import Progress
from workbench.ingest.runs import PlanBuilder
from workbench.protocol.status import STREAM_TRANSPORTS
from workbench.store.db import Store


@dataclass
class ExchangeImport:
    """The outcome, for the summary line and the per-flow messages."""

    session_ids: list[str] = field(default_factory=list)
    frames: int = 0
    result: WriteOutcome = field(default_factory=lambda: WriteOutcome())
    agent: int = 0
    skipped: int = 0
    streamed: int = 0
    mangled: int = 0
    orphans: int = 0

    def notes(self, other: int, unit: str, units: str) -> list[str]:
        """Parenthesised notes of the summary line ("2 flows without bodies: streamed")."""
        def n(k: int, one: str, many: str) -> str:
            return f"{k} {one if k == 1 else many}"

        out = []
        if self.streamed:
            out.append(f"{n(self.streamed, unit, units)} without bodies: streamed")
        if self.mangled:
            out.append(f"{n(self.mangled, 'body', 'bodies')} unusable")
        if self.orphans:
            out.append(f"{n(self.orphans, 'BidiAppend group', 'BidiAppend groups')} without a stream")
        if self.skipped or other:
            out.append(f"{n(self.skipped + other, unit, units)} not agent traffic, skipped")
        return out + self.result.notes()



class ExchangeImporter:
    """``write_exchanges`` in steps, for an import that meets its exchanges one at a time (a packet
    capture, while tshark reads it): ``decode`` each, ``write_now`` the plans of sessions already
    whole, ``finish`` with the rest. Every session goes through one ``PlanWriter``."""

    def __init__(self, store: Store, dec: Decoder, *, source: str, file_meta: dict[str, Any],
                 warn: Callable[[str], None], progress: Progress | None = None,
                 builder: type[PlanBuilder] | None = None, prefixes: tuple[str, str] | None = None) -> None:
        self.dec = dec
        self.file_meta = file_meta
        self.warn = warn
        self.progress = progress
        self.plan = (builder or PlanBuilder)(dec, source, file_meta)
        self.out = ExchangeImport()
        self.streams: list[Part] = []
        self.appends: list[Part] = []
        self.singles: list[Part] = []
        self._counting = False  # the progress line counts sessions from ``finish`` on
        self.writer = PlanWriter(store, warn=lambda msg: warn(f"{file_meta['file']}: {msg}"), progress=self._written,
                                 prefixes=prefixes)

    def _written(self, done: int, skipped: int) -> None:
        if self.progress is not None and self._counting:
            self.progress.note = f"{skipped} already imported" if skipped else ""
            self.progress.update(done)

    def decode(self, ex: Exchange) -> Part | None:
        """The decoded exchange (None, and counted, when it is not agent traffic)."""
        out = self.out
        route = ex.route
        if route is None:
            out.skipped += 1
            return None
        out.agent += 1
        ex.t_req_start, ex.t_req_end = sane_time(ex.t_req_start), sane_time(ex.t_req_end)
        ex.t_resp_start, ex.t_resp_end = sane_time(ex.t_resp_start), sane_time(ex.t_resp_end)
        part = decode_exchange(self.dec, ex, route)
        for side, why in (("request", ex.req_missing), ("response", ex.resp_missing)):
            if why == "streamed":
                out.streamed += 1
                self.warn(f"{self.file_meta['file']}: {ex.where()}: {side} body not recorded (streamed); "
                          f"session recorded as incomplete")
            elif why:
                out.mangled += 1
                self.warn(f"{self.file_meta['file']}: {ex.where()}: {side} body {why}")
        return part

    def forget(self, ex: Exchange) -> None:
        """Take back what ``decode`` counted for ``ex`` (decoded again later)."""
        self.out.agent -= 1
        self.out.streamed -= sum(1 for why in (ex.req_missing, ex.resp_missing) if why == "streamed")
        self.out.mangled -= sum(1 for why in (ex.req_missing, ex.resp_missing) if why and why != "streamed")

    def add(self, part: Part) -> None:
        """A decoded exchange whose session is written by ``finish``."""
        transport = part.route.transport
        if transport in STREAM_TRANSPORTS:
            self.streams.append(part)
        elif transport == "bidi_append":
            self.appends.append(part)
        else:
            self.singles.append(part)

    def finish(self) -> ExchangeImport:
        """Group what ``add`` got into sessions, write what is new, close the writer."""
        out = self.out
        by_rid: dict[str, Part] = {}
        for p in self.streams:
            # Appends are the write side of RunSSE/RunPoll only (an h2 Run carries its own requests).
            if p.route.transport != "run" and p.request_id and p.request_id not in by_rid:
                by_rid[p.request_id] = p
        joined: dict[int, list[Part]] = {id(p): [] for p in self.streams}
        orphan: dict[str, list[Part]] = {}
        for a in self.appends:
            owner = by_rid.get(a.request_id or "")
            if owner is not None:
                joined[id(owner)].append(a)
            else:
                orphan.setdefault(a.request_id or "?", []).append(a)

        plans = [self.plan.stream(p, joined[id(p)]) for p in self.streams]
        for rid, parts in orphan.items():
            plans.append(self.plan.orphan_appends(rid, parts))
            out.orphans += 1
        plans += [self.plan.single(p) for p in self.singles]
        if self.progress is not None:
            self.progress.total, self.progress.unit = self.writer.done + len(plans), "sessions"
            self._counting = True
        try:
            self.writer.write(plans)
            out.result = self.writer.close()
        finally:
            if self.progress is not None:
                self.progress.finish()
        out.session_ids = out.result.session_ids
        out.frames = out.result.frames
        return out


def write_exchanges(store: Store, dec: Decoder, exchanges: Sequence[Exchange], *, source: str,
                    file_meta: dict[str, Any], warn: Callable[[str], None],
                    progress: Progress | None = None, builder: type[PlanBuilder] | None = None) -> ExchangeImport:
    """Decode every agent exchange and write what is new of its session(s); others are counted only.

    ``progress`` (a terminal progress line) shows the decoding, then the sessions written and skipped.
    ``builder`` orders each session's frames (default: ``PlanBuilder``, causal order for files
    without per-frame timing; packet captures pass one that keeps wire order).
    """
    imp = ExchangeImporter(store, dec, source=source, file_meta=file_meta, warn=warn, progress=progress,
                           builder=builder)
    if progress is not None:
        progress.total, progress.unit = len(exchanges), "exchanges decoded"
    for i, ex in enumerate(exchanges):
        if progress is not None:
            progress.update(i + 1)
        part = imp.decode(ex)
        if part is not None:
            imp.add(part)
    return imp.finish()
